"""A queue of batch sessions on a small agent, and how fast the dispatcher reacts.

Prints, measured in one run on a node whose agent offers 2 cpu:
- wall time for 20 batch sessions running `true` (1 cpu each), submitted at once, until all ended
  (Backend.AI 23.09: 96 s on this machine kind, as it schedules on a 10 s tick; target <= 5 s);
- the dispatcher's reaction: from a kernel's session reaching TERMINATED to the next pending session
  being SCHEDULED, median over several hand-overs (target <= 50 ms), read from the stored transitions.

    .venv/bin/python bench/batch_queue.py [--sessions 20] [--backend docker|local] [--image bai-python:3.11]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.benchnode import start_node  # noqa: E402


def at(transitions: list[dict], status: str) -> datetime:
    return datetime.fromisoformat(next(t["at"] for t in transitions if t["status"] == status))


async def run(env: dict[str, str], count: int) -> tuple[float, list[float]]:
    os.environ.update(env)
    from bai.client import Client
    from bai.common import credentials

    creds = credentials.load()
    assert creds is not None
    async with Client(creds) as c:
        start = time.perf_counter()
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
        while True:
            infos = [await c.get_session(sid) for sid in ids]
            if all(i["status"] in ("TERMINATED", "CANCELLED", "ERROR") for i in infos):
                break
            await asyncio.sleep(0.05)
        wall = time.perf_counter() - start
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
        return wall, reactions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=20)
    ap.add_argument("--backend", default="docker")
    ap.add_argument("--image", default="bai-python:3.11")
    args = ap.parse_args()
    node = start_node(
        f'[images.aliases]\npython = "{args.image}"\n[agent]\ncpu = "2"\n[manager]\ntick = 10.0\n', args.backend
    )
    try:
        wall, reactions = asyncio.run(run(node.env, args.sessions))
        print(f"backend                                  {args.backend}, agent offers cpu 2, tick 10 s")
        print(
            f"{args.sessions} batch sessions `true`, 1 cpu each     {wall:.2f} s until all ended"
            "  (target <= 5 s; Backend.AI 23.09: 96 s)"
        )
        if reactions:
            print(
                f"session ended -> next SCHEDULED          median {statistics.median(reactions) * 1000:.1f} ms, "
                f"max {max(reactions) * 1000:.1f} ms over {len(reactions)} hand-overs  (target <= 50 ms)"
            )
    finally:
        node.stop()


if __name__ == "__main__":
    main()
