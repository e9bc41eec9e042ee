"""A queue of batch sessions on a small agent, and how fast the dispatcher reacts.

Prints, measured in one run on a node whose agent offers 2 cpu:
- wall time for 20 batch sessions running `true` (1 cpu each), submitted at once, until all ended (from
  the first submission to the last session's TERMINATED as the manager recorded it), against the same 20
  commands through `docker run --rm --network none IMAGE true`, two at a time as the agent's 2 cpus run them,
  measured in the same run before the node starts (Docker only; target <= 1.0x; Backend.AI took 101 s on this
  machine kind, as it schedules on a 10 s tick);
- the dispatcher's reaction: from a kernel's session reaching TERMINATED to the next pending session
  being SCHEDULED, median over several hand-overs (target <= 50 ms), read from the stored transitions.

The agent keeps `--warm N` kernels started ahead (`[agent.warm_pool] python = N`, default 20: one per
queued session, as a batch queue's node may well keep, where a workstation keeps 1), refilled two at a
time in the background; with a smaller pool the rest of the queue waits for refills (container starts).

With more than 1000 sessions (`--sessions`), the bench first sets the policy of its (admin) keypair to queue
any number (max_pending_session_count 0, through the admin API): a policy's default lets 1000 wait PENDING.

    .venv/bin/python bench/batch_queue.py [--sessions 20] [--warm 20] [--backend docker|local] [--image bai-python:3.11]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.benchnode import start_node  # noqa: E402
from bench.figures import Figure, record  # noqa: E402

QUEUE_DEFAULT = 1000  # sessions a keypair may have PENDING by its policy's default (max_pending_session_count)
TARGET = 1.0  # the queue through bai / the same commands through docker run, as many at a time
PARALLEL = 2  # the agent's cpus: sessions of 1 cpu at a time


def docker_baseline(image: str, count: int) -> float:
    """Seconds to run `true` `count` times with `docker run --rm`, PARALLEL at a time (until the last returned)."""

    def one(_: int) -> None:
        cmd = ["docker", "run", "--rm", "--network", "none", "--label", "bai.bench=1", image, "true"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed: {done.stderr}")

    start = time.perf_counter()
    with ThreadPoolExecutor(PARALLEL) as pool:
        list(pool.map(one, range(count)))
    return time.perf_counter() - start


def at(transitions: list[dict], status: str) -> datetime:
    return datetime.fromisoformat(next(t["at"] for t in transitions if t["status"] == status))


PHASES = (
    ("PENDING", "SCHEDULED", "queued (waiting for a slot)"),
    ("SCHEDULED", "PREPARING", "scheduled -> preparing"),
    ("PREPARING", "RUNNING", "kernel start (create -> RUNNING)"),
    ("RUNNING", "TERMINATING", "the command `true`"),
    ("TERMINATING", "TERMINATED", "kernel stop and removal"),
)


def phases(infos: list[dict]) -> dict[str, list[float]]:
    """Per session, the seconds between consecutive statuses (where both were recorded)."""
    out: dict[str, list[float]] = {label: [] for _, _, label in PHASES}
    for info in infos:
        seen = {t["status"]: datetime.fromisoformat(t["at"]) for t in info["transitions"]}
        for a, b, label in PHASES:
            if a in seen and b in seen:
                out[label].append((seen[b] - seen[a]).total_seconds())
    return out


async def run(env: dict[str, str], count: int) -> tuple[float, list[float], dict[str, list[float]]]:
    os.environ.update(env)
    from bai.client import Client
    from bai.common import credentials

    creds = credentials.load()
    assert creds is not None
    async with Client(creds) as c:
        if count > QUEUE_DEFAULT:
            from bench.cluster import unbounded_queue

            await unbounded_queue(c)
        start = datetime.now(UTC)
        ids = []
        for i in range(count):
            created = await c.create_session(
                "python",
                name=f"bq-{i:03d}",
                type="batch",
                startup_command="true",
                resources={"cpu": "1"},
                enqueue_only=True,
            )
            ids.append(created["sessionId"])
        # poll gently (the sessions' own timestamps give the figure): a tight poll of every session
        # would load the manager on this 2-core machine as much as the queue itself
        ended: dict[str, dict] = {}
        while len(ended) < len(ids):
            await asyncio.sleep(0.25)
            for sid in ids:
                if sid not in ended:
                    info = await c.get_session(sid)
                    if info["status"] in ("TERMINATED", "CANCELLED", "ERROR"):
                        ended[sid] = info
        infos = [ended[sid] for sid in ids]
        last = max(at(i["transitions"], i["status"]) for i in infos)
        wall = (last - start).total_seconds()
        bad = [i["name"] for i in infos if i["result"] != "SUCCESS"]
        if bad:
            raise SystemExit(f"sessions did not succeed: {bad}")
        # hand-overs: session k+2 was scheduled when session k ended (2 slots)
        ended = sorted(at(i["transitions"], "TERMINATED") for i in infos)
        scheduled = sorted(at(i["transitions"], "SCHEDULED") for i in infos)
        reactions = []
        for t_sched in scheduled[2:]:
            before = [t for t in ended if t <= t_sched]
            if before:
                reactions.append((t_sched - before[-1]).total_seconds())
        return wall, reactions, phases(infos)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=20)
    ap.add_argument("--backend", default="docker")
    ap.add_argument("--image", default="bai-python:3.11")
    ap.add_argument("--warm", type=int, default=20, help="warm kernels kept ready (docker)")
    args = ap.parse_args()
    base = docker_baseline(args.image, args.sessions) if args.backend == "docker" else None
    node = start_node(
        f'[images.aliases]\npython = "{args.image}"\n[agent]\ncpu = "2"\n[agent.warm_pool]\npython = {args.warm}\n'
        "[manager]\ntick = 10.0\n[link]\nheartbeat_interval = 0.5\n",
        args.backend,
    )
    if args.backend == "docker" and args.warm:
        from bench.session_latency import warm_ready

        warm_ready(node, args.image, args.warm, timeout=120)
    try:
        wall, reactions, spent = asyncio.run(run(node.env, args.sessions))
        name = f"{args.sessions} batch sessions, warm pool {args.warm}"
        warm = f", warm pool {args.warm}" if args.backend == "docker" else ""
        print(f"backend                                  {args.backend}, agent offers cpu 2, tick 10 s{warm}")
        print(f"{args.sessions} batch sessions `true`, 1 cpu each     {wall:.2f} s until all ended (Backend.AI: 101 s)")
        if base is not None:
            docker = f"docker run --rm, {PARALLEL} at a time"
            record(Figure(name, wall, "s", docker, base, f"<= {TARGET:g}x", wall <= TARGET * base))
            verdict = "MET" if wall <= TARGET * base else "MISSED"
            print(
                f"the same commands, {docker:<21}{base:.2f} s: {wall / base:.2f}x  (target <= {TARGET:g}x: {verdict})"
            )
        if reactions:
            print(
                f"session ended -> next SCHEDULED          median {statistics.median(reactions) * 1000:.1f} ms, "
                f"max {max(reactions) * 1000:.1f} ms over {len(reactions)} hand-overs  (target <= 50 ms)"
            )
        for label, values in spent.items():
            if values and not label.startswith("queued"):
                print(f"  {label:<39}median {statistics.median(values) * 1000:.1f} ms, max {max(values) * 1000:.1f} ms")
    finally:
        node.stop()


if __name__ == "__main__":
    main()
