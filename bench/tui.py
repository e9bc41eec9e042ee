"""The dashboard under load: first paint with 1,000 sessions and 100 agents, key latency while a kernel
prints 10,000 lines a second, and what an attached dashboard costs the manager's session throughput.

Prints, measured in one run:

1. time to first paint: from starting `Dashboard` (headless, 200×60) until its sessions table holds every
   session, against a manager with 100 simulated agents (agent hosts from bench/cluster.py) and 1,000
   sessions (950 running, 50 pending);
2. key-press-to-repaint latency (median, p95, max; target ≤ 200 ms) of `t`, `w` and `G` in the log
   view while a local-backend kernel prints about 10,000 lines a second, and how many lines a second
   reached the dashboard meanwhile;
3. throughput of short batch sessions on the 100-agent manager without and with a dashboard attached (a
   separate process, `bench/tui.py --attach`, following the stream headless), as a ratio.

    .venv/bin/python bench/tui.py [--sessions 1000] [--agents 100] [--batch 300]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from benchnode import start_node  # noqa: E402
from cluster import ACTIVE, Bench, BenchFailed  # noqa: E402

SPEW = (
    "python3 -c 'import sys,time\n"
    "i=0\n"
    "while True:\n"
    "    t=time.monotonic()\n"
    '    sys.stdout.write("".join(f"line {i+j} of a kernel that prints ten thousand lines a second\\n" '
    "for j in range(1000)))\n"
    "    sys.stdout.flush(); i+=1000\n"
    "    time.sleep(max(0, 0.1-(time.monotonic()-t)))'"
)


def client_for(env: dict[str, str], endpoint: str):
    import tomllib

    from bai.client.api import Client
    from bai.common.credentials import Credentials

    data = tomllib.loads((Path(env["XDG_CONFIG_HOME"]) / "bai" / "credentials.toml").read_text())
    return Client(Credentials(endpoint, data["access_key"], data["secret_key"]))


async def submit(client, count: int, prefix: str, concurrency: int = 32, **kw) -> None:
    index = 0

    async def worker() -> None:
        nonlocal index
        while index < count:
            i, index = index, index + 1
            await client.create_session("sim", name=f"{prefix}-{i:05d}", enqueue_only=True, **kw)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


def count_active(db: Path) -> int:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        marks = ",".join("?" * len(ACTIVE))
        return conn.execute(f"SELECT COUNT(*) FROM sessions WHERE status IN ({marks})", ACTIVE).fetchone()[0]


async def wait_active(db: Path, target: int, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while count_active(db) > target:
        if time.monotonic() > deadline:
            raise BenchFailed(f"sessions still active after {timeout:g} s")
        await asyncio.sleep(0.1)


async def first_paint(client, expected: int) -> float:
    from bai.tui.app import Dashboard

    started = time.perf_counter()
    app = Dashboard(client)
    async with app.run_test(size=(200, 60)) as pilot:
        while len(app.sessions_view.sync.keys) < expected:
            await pilot.pause(0.01)
        await _repainted(app)
        took = time.perf_counter() - started
        await pilot.press("q")
    return took


async def _repainted(app) -> None:
    done = asyncio.get_running_loop().create_future()
    app.call_after_refresh(lambda: done.done() or done.set_result(None))
    await done


async def key_latency(client, presses: int) -> tuple[list[float], float]:
    from bai.tui.app import Dashboard

    app = Dashboard(client)
    latencies: list[float] = []
    async with app.run_test(size=(200, 60)) as pilot:
        while not app.sessions_view.sync.keys:
            await pilot.pause(0.05)
        await pilot.press("l")
        buffer = app.logs_view.buffer
        while buffer.next_index < 20_000:
            await pilot.pause(0.05)
        first_lines, first_t = buffer.next_index, time.perf_counter()
        for i in range(presses):
            key = "twG"[i % 3]
            t0 = time.perf_counter()
            await pilot.press(key)
            await _repainted(app)
            latencies.append(time.perf_counter() - t0)
            await pilot.pause(0.1)
        rate = (buffer.next_index - first_lines) / (time.perf_counter() - first_t)
        await pilot.press("q")
    return latencies, rate


async def attach(endpoint: str, env_file: str) -> None:
    """--attach: a headless dashboard following the manager until this process is stopped."""
    from bai.tui.app import Dashboard

    env = dict(line.split("=", 1) for line in Path(env_file).read_text().splitlines())
    app = Dashboard(client_for(env, endpoint))
    async with app.run_test(size=(200, 60)) as pilot:
        print("attached", flush=True)
        while True:
            await pilot.pause(1.0)


async def throughput(bench: Bench, client, batch: int, tag: str) -> float:
    started = time.perf_counter()
    await submit(client, batch, f"tp-{tag}", type="batch", startup_command="true", resources={"cpu": "0.5"})
    await wait_active(bench.db, 0)
    return batch / (time.perf_counter() - started)


async def run(args: argparse.Namespace, tmp: Path) -> None:
    bench = Bench(argparse.Namespace(agents=args.agents, hosts=2, heartbeat=5.0, profile=None), tmp)
    spew_node = None
    attached = None
    try:
        bench.start_manager()
        endpoint = f"http://127.0.0.1:{bench.port}"
        client = client_for(bench.env, endpoint)
        counts = bench.start_hosts(bench.join_info())
        await bench.wait_joined(counts)
        await bench.wait_alive(client, args.agents)
        print(f"{args.agents} simulated agents joined", file=sys.stderr)

        # -- 3 first: throughput with an empty cluster, without and then with a dashboard ---------------
        without = await throughput(bench, client, args.batch, "a")
        env_file = tmp / "attach.env"
        env_file.write_text("\n".join(f"{k}={v}" for k, v in bench.env.items() if k.startswith(("XDG_", "BAI_"))))
        attached = subprocess.Popen(  # noqa: ASYNC220 - started once, outside any measured phase
            [sys.executable, __file__, "--attach", endpoint, "--env-file", str(env_file)],
            stdout=subprocess.PIPE,
            text=True,
            env=bench.env,
        )
        assert attached.stdout is not None
        if not attached.stdout.readline().startswith("attached"):
            raise BenchFailed("the attached dashboard did not start")
        await asyncio.sleep(1)
        with_tui = await throughput(bench, client, args.batch, "b")
        without_again = await throughput(bench, client, args.batch, "c")
        attached.send_signal(signal.SIGTERM)
        attached.wait(30)
        attached = None

        # -- 1: first paint with 1,000 sessions ------------------------------------------------------------
        pending = max(1, args.sessions // 20)
        if args.sessions > 1000:  # more than the default queue bound (max_pending_session_count) may wait
            from bench.cluster import unbounded_queue

            await unbounded_queue(client)
        await submit(client, args.sessions - pending, "paint-run", resources={"cpu": "0.5"})
        # waiting for a running one (more than any agent has is refused as unplaceable)
        await submit(client, pending, "paint-wait", resources={"cpu": "0.5"}, depends=["paint-run-00000"])
        while True:  # every fitting one placed and running
            items = await client.list_sessions(status="SCHEDULED,PREPARING")
            if not items:
                break
            await asyncio.sleep(0.5)
        print(f"{args.sessions} sessions in place", file=sys.stderr)
        paints = [await first_paint(client, args.sessions) for _ in range(3)]

        # -- 2: key latency while a kernel prints 10,000 lines a second -------------------------------------
        spew_node = start_node("", "local")
        spew_client = client_for(spew_node.env, f"http://127.0.0.1:{spew_node.port}")
        await spew_client.create_session(
            "python", name="spew", type="batch", startup_command=SPEW, resources={"cpu": "1"}
        )
        latencies, rate = await key_latency(spew_client, args.presses)

        q = statistics.quantiles(latencies, n=20)
        print(f"agents {args.agents}, sessions {args.sessions} ({pending} pending)")
        print(
            f"first paint (200x60, all {args.sessions} sessions in the table): "
            f"median {statistics.median(paints) * 1000:.0f} ms (runs: {', '.join(f'{p * 1000:.0f}' for p in paints)})"
        )
        print(
            f"key press to repaint in the log view at {rate:,.0f} lines/s received: "
            f"median {statistics.median(latencies) * 1000:.0f} ms, p95 {q[18] * 1000:.0f} ms, "
            f"max {max(latencies) * 1000:.0f} ms over {len(latencies)} presses (target <= 200 ms)"
        )
        print(
            f"batch throughput, {args.batch} sessions on {args.agents} agents: without dashboard "
            f"{without:.0f}/s and {without_again:.0f}/s, with one attached {with_tui:.0f}/s; "
            f"ratio with/without {with_tui / ((without + without_again) / 2):.2f}"
        )
    finally:
        if attached is not None:
            attached.kill()
        if spew_node is not None:
            spew_node.stop()
        bench.stop_all()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, default=100)
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=300, help="short batch sessions per throughput run")
    ap.add_argument("--presses", type=int, default=30)
    ap.add_argument("--attach", help=argparse.SUPPRESS)
    ap.add_argument("--env-file", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.attach:
        asyncio.run(attach(args.attach, args.env_file))
        return
    tmp = Path(tempfile.mkdtemp(prefix="bai-bench-tui-"))
    try:
        asyncio.run(run(args, tmp))
    except BenchFailed as e:
        raise SystemExit(f"bench/tui.py: {e}") from None
    finally:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
