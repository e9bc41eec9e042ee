"""Session latency and footprint of a combined node, against plain `docker run` measured in the same run.

Prints: median wall time of `bai session run python -c 'print(42)'` and of
`docker run --rm --network none IMAGE python3 -c 'print(42)'`, their ratio, the session
create → RUNNING time, the round trip of executing `print(1)` in a running session, and the
idle RSS of the `bai node` process.

    .venv/bin/python bench/session_latency.py [--runs 10] [--image bai-python:3.11] [--backend docker]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.benchnode import start_node  # noqa: E402


def timed(cmd: list[str], env: dict[str, str], expect: str) -> float:
    start = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - start
    if out.returncode != 0 or out.stdout.strip() != expect:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}): {out.stdout} {out.stderr}")
    return elapsed


def median_ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.1f} ms"


async def api_figures(env: dict[str, str], runs: int) -> tuple[list[float], list[float], list[float]]:
    os.environ.update(env)
    from bai.client import Client
    from bai.common import credentials

    creds = credentials.load()
    assert creds is not None
    create_times, exec_times, exec_with_connect = [], [], []
    async with Client(creds) as c:
        for i in range(runs):
            start = time.perf_counter()
            created = await c.create_session("python", name=f"bench-{i}-{os.getpid()}")
            create_times.append(time.perf_counter() - start)
            assert created["status"] == "RUNNING", created
            if i == 0:
                for _ in range(50):
                    connect = time.perf_counter()
                    async with c.execute(created["sessionId"]) as stream:
                        t0 = time.perf_counter()
                        await stream.start("query", "print(1)")
                        async for frame in stream.frames():
                            if frame["status"] == "finished":
                                break
                        done = time.perf_counter()
                        exec_times.append(done - t0)
                        exec_with_connect.append(done - connect)
            await c.destroy_session(created["sessionId"])
    return create_times, exec_times, exec_with_connect


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--image", default="bai-python:3.11")
    ap.add_argument("--backend", default="docker")
    args = ap.parse_args()

    node = start_node(f'[images.aliases]\npython = "{args.image}"\n', args.backend)
    env = node.env
    try:
        proc = psutil.Process(node.proc.pid)
        time.sleep(1.0)
        rss_start = proc.memory_info().rss

        bai_cmd = [sys.executable, "-m", "bai", "session", "run", "-q", "python", "-c", "print(42)"]
        docker_cmd = ["docker", "run", "--rm", "--network", "none", args.image, "python3", "-c", "print(42)"]
        timed(bai_cmd, env, "42")  # warm-up of both paths
        timed(docker_cmd, env, "42")
        bai_times, docker_times = [], []
        for _ in range(args.runs):  # interleaved, so both see the same machine load
            bai_times.append(timed(bai_cmd, env, "42"))
            docker_times.append(timed(docker_cmd, env, "42"))
        create_times, exec_times, exec_with_connect = asyncio.run(api_figures(env, args.runs))
        time.sleep(1.0)
        rss_idle = proc.memory_info().rss

        ratio = statistics.median(bai_times) / statistics.median(docker_times)
        print(f"runs per figure                      {args.runs} (exec round trip: {len(exec_times)})")
        print(f"bai session run python -c print(42)  {median_ms(bai_times)}")
        print(f"docker run --rm --network none       {median_ms(docker_times)}")
        print(f"ratio bai / docker run               {ratio:.2f}  (target <= 2.0)")
        print(f"session create -> RUNNING            {median_ms(create_times)}  (target <= 300 ms)")
        print(f"exec round trip print(1)             {median_ms(exec_times)}  (target <= 4 ms; open WebSocket)")
        print(f"  including the WebSocket handshake  {median_ms(exec_with_connect)}")
        print(
            f"bai node RSS at start / idle after   {rss_start / 2**20:.1f} MiB / {rss_idle / 2**20:.1f} MiB"
            "  (target <= 60 MiB)"
        )
    finally:
        node.stop()


if __name__ == "__main__":
    main()
