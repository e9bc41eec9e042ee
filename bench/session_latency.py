"""Session latency and footprint of a combined node, against plain `docker run` measured in the same run.

Prints: median wall time of `bai session run python -c 'print(42)'` and of
`docker run --rm --network none IMAGE python3 -c 'print(42)'` (interleaved), their ratio, the session
create → RUNNING time from a warm kernel (the agent's warm pool, `[agent.warm_pool] python = 1`, the
workstation default) and cold (a second node with `python = 0`), the round trip of executing `print(1)`
in a running session, and the idle RSS of the `bai node` process. Each figure is a ratio to `docker run` measured
in the same run: `session run` (target <= 0.5x) and the warm create (<= 0.15x) to the docker runs interleaved with
the `session run`s, the cold create (<= 1.0x) to a docker run just before each; beside it, Docker's container
start alone (`docker run -d`, at the same moments), and what is left of the cold create: bai's own. Every run starts
on a settled machine: the warm pool full again (its refill takes a container start, in the background), no
container of a destroyed session or of a `docker run --rm` still being removed.

The CLI runs with bytecode as users have it (PYTHONDONTWRITEBYTECODE unset).

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
from bench.benchnode import BENCH_LABEL, start_node  # noqa: E402
from bench.figures import Figure, record  # noqa: E402


def timed(cmd: list[str], env: dict[str, str], expect: str) -> float:
    start = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - start
    if out.returncode != 0 or out.stdout.strip() != expect:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}): {out.stdout} {out.stderr}")
    return elapsed


def median_ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.1f} ms"


def verdict(value: float, target: float) -> str:
    return "MET" if value <= target else "MISSED"


def warm_ready(node, image: str, want: int, timeout: float = 30.0) -> None:
    """Until the node's agent reports `want` warm kernels of `image` (its status file, at every heartbeat)."""
    import json

    path = node.folder / "state" / "agent-status.json"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if (json.loads(path.read_text()).get("warm") or {}).get(image, 0) >= want:
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    raise SystemExit(f"the warm pool of {image} did not reach {want} in {timeout:g} s")


async def api_figures(
    env: dict[str, str], runs: int, between=lambda: None, exec_round_trips: bool = True
) -> tuple[list[float], list[float], list[float], list[float]]:
    """Creates' times; and in the first session, interleaved: a streaming execute's round trip on an open
    WebSocket, the same with its handshake, and Backend.AI's polling execute (a POST in query mode, then continue
    until finished) over the client's kept-alive HTTP connection."""
    os.environ.update(env)
    from bai.client import Client
    from bai.common import credentials

    creds = credentials.load()
    assert creds is not None
    create_times, exec_times, exec_with_connect, exec_polling = [], [], [], []
    async with Client(creds) as c:
        for i in range(runs):
            await asyncio.to_thread(between)
            start = time.perf_counter()
            created = await c.create_session("python", name=f"bench-{i}-{os.getpid()}")
            create_times.append(time.perf_counter() - start)
            assert created["status"] == "RUNNING", created
            if i == 0 and exec_round_trips:
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
                    t0 = time.perf_counter()
                    path = f"/session/{created['sessionId']}"
                    body = {"mode": "query", "code": "print(1)", "runId": None, "options": {}}
                    result = (await c.request("POST", path, json_body=body))["result"]
                    while result["status"] not in ("finished", "error"):
                        body = {"mode": "continue", "code": "", "runId": result["runId"], "options": {}}
                        result = (await c.request("POST", path, json_body=body))["result"]
                    assert result["status"] == "finished", result
                    exec_polling.append(time.perf_counter() - t0)
            await c.destroy_session(created["sessionId"])
    return create_times, exec_times, exec_with_connect, exec_polling


DOCKER_LABEL = "bai.bench.docker-run=1"  # the plain `docker run`s of the baseline (removed in the background)
RUN_TARGET = 0.5  # bai session run / docker run
COLD_TARGET = 1.0  # create -> RUNNING without a warm kernel / docker run's whole time
WARM_TARGET = 0.15  # create -> RUNNING from a warm kernel / docker run's whole time (about 50 ms at 350)


def containers(label: str) -> int:
    out = subprocess.run(["docker", "ps", "-aq", "--filter", f"label={label}"], capture_output=True, text=True)
    return len(out.stdout.split())


def settled(kernels: int, timeout: float = 60.0) -> None:
    """Until the node has `kernels` containers (its warm pool, full) and no `docker run` of the baseline is left
    (`--rm` removes it after the command returned): a fair pair, neither side timed over the other's clean-up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if containers(BENCH_LABEL) == kernels and containers(DOCKER_LABEL) == 0:
            return
        time.sleep(0.02)
    raise SystemExit(f"containers did not settle ({kernels} of the node's expected) in {timeout:g} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--image", default="bai-python:3.11")
    ap.add_argument("--backend", default="docker")
    args = ap.parse_args()

    config = f'[images.aliases]\npython = "{args.image}"\n[link]\nheartbeat_interval = 0.1\n'
    node = start_node(config + "[agent.warm_pool]\npython = 1\n", args.backend)
    env = dict(node.env)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # users have bytecode
    pooled = args.backend == "docker"

    def refilled() -> None:
        if pooled:
            warm_ready(node, args.image, 1)
            settled(1)

    bai_cmd = [sys.executable, "-m", "bai", "session", "run", "-q", "python", "-c", "print(42)"]
    docker_cmd = ["docker", "run", "--rm", "--network", "none", "--label", DOCKER_LABEL, args.image, "python3", "-c",
                  "print(42)"]  # fmt: skip
    try:
        proc = psutil.Process(node.proc.pid)
        time.sleep(1.0)
        rss_start = proc.memory_info().rss
        refilled()
        timed(bai_cmd, env, "42")  # warm-up of both paths (and the CLI's bytecode)
        refilled()
        timed(docker_cmd, env, "42")
        bai_times, docker_times = [], []
        for _ in range(args.runs):  # interleaved, so both see the same machine load
            refilled()
            bai_times.append(timed(bai_cmd, env, "42"))
            refilled()
            docker_times.append(timed(docker_cmd, env, "42"))
        warm_times, exec_times, exec_with_connect, exec_polling = asyncio.run(api_figures(env, args.runs, refilled))
        time.sleep(1.0)
        rss_idle = proc.memory_info().rss
    finally:
        node.stop()
    cold_node = start_node(config + "[agent.warm_pool]\npython = 0\n", args.backend)
    cold_docker_times: list[float] = []
    start_times: list[float] = []  # Docker's container start alone: `docker run -d` returns once it started
    start_cmd = ["docker", "run", "-d", "--network", "none", "--label", DOCKER_LABEL, args.image, "sleep", "60"]

    def docker_then_settled() -> None:  # docker runs before each cold create: the pairs of the same moment
        settled(0)
        cold_docker_times.append(timed(docker_cmd, env, "42"))
        settled(0)
        begin = time.perf_counter()
        started = subprocess.run(start_cmd, capture_output=True, text=True, env=env)
        start_times.append(time.perf_counter() - begin)
        if started.returncode != 0:
            raise SystemExit(f"{' '.join(start_cmd)} failed: {started.stderr}")
        subprocess.run(["docker", "rm", "-f", started.stdout.strip()], capture_output=True)
        settled(0)

    try:
        time.sleep(1.0)
        cold_times, _, _, _ = asyncio.run(
            api_figures(cold_node.env, args.runs, docker_then_settled if pooled else lambda: None, False)
        )
    finally:
        cold_node.stop()

    docker_ms = statistics.median(docker_times) * 1000
    run_ms = statistics.median(bai_times) * 1000
    warm_ms = statistics.median(warm_times) * 1000
    cold_ms = statistics.median(cold_times) * 1000
    cold_docker_ms = statistics.median(cold_docker_times) * 1000 if cold_docker_times else docker_ms
    run_ratio, warm_ratio, cold_ratio = run_ms / docker_ms, warm_ms / docker_ms, cold_ms / cold_docker_ms
    record(Figure("bai session run python -c, pool full", run_ms, "ms", "docker run", docker_ms,
                  f"<= {RUN_TARGET}x", run_ratio <= RUN_TARGET))  # fmt: skip
    record(Figure("create -> RUNNING, warm kernel", warm_ms, "ms", "docker run", docker_ms,
                  f"<= {WARM_TARGET}x", warm_ratio <= WARM_TARGET))  # fmt: skip
    record(Figure("create -> RUNNING, cold (pool 0)", cold_ms, "ms", "docker run, whole", cold_docker_ms,
                  f"<= {COLD_TARGET}x", cold_ratio <= COLD_TARGET))  # fmt: skip
    print(f"runs per figure                      {args.runs} (exec round trip: {len(exec_times)})")
    print(f"warm pool                            {args.image} x1 ([agent.warm_pool] python = 1, the default)")
    print(f"bai session run python -c print(42)  {run_ms:.1f} ms")
    print(f"docker run --rm --network none       {docker_ms:.1f} ms")
    print(f"ratio bai / docker run               {run_ratio:.2f}"
          f"  (target <= {RUN_TARGET}: {verdict(run_ratio, RUN_TARGET)})")  # fmt: skip
    print(f"create -> RUNNING, warm kernel       {warm_ms:.1f} ms = {warm_ratio:.2f}x docker run"
          f"  (target <= {WARM_TARGET}x: {verdict(warm_ratio, WARM_TARGET)})")  # fmt: skip
    print(f"create -> RUNNING, cold (pool 0)     {cold_ms:.1f} ms = {cold_ratio:.2f}x docker run of the same moments"
          f" ({cold_docker_ms:.1f} ms)  (target <= {COLD_TARGET}x: {verdict(cold_ratio, COLD_TARGET)})")  # fmt: skip
    if start_times:  # what of a cold create is bai's own: past Docker's start, the runner and the manager
        start_ms = statistics.median(start_times) * 1000
        print(f"  of which Docker's container start  {start_ms:.1f} ms (`docker run -d`, same moments); bai's own "
              f"{cold_ms - start_ms:.1f} ms (the runner's start, the manager's create and round)")  # fmt: skip
    print(f"exec round trip print(1)             {median_ms(exec_times)}  (target <= 4 ms; open WebSocket)")
    print(f"  including the WebSocket handshake  {median_ms(exec_with_connect)}")
    print(f"  Backend.AI's polling execute       {median_ms(exec_polling)}  (POST query, continue until finished)")
    print(
        f"bai node RSS at start / idle after   {rss_start / 2**20:.1f} MiB / {rss_idle / 2**20:.1f} MiB"
        "  (target <= 60 MiB)"
    )


if __name__ == "__main__":
    main()
