"""Benchmark of the scheduling core (bai/node/scheduler/core.py) against a naive first-fit.

    .venv/bin/python bench/scheduler.py [--sessions 10000] [--agents 1000] [--seed 7] [--repeat 5]

A seeded random snapshot: pending sessions from 50 keypairs (cpu 0.5-4, mem 256m-8g, 10 % also
cuda.shares 0.1-1), agents with cpu 8-64, mem 32-512 GiB, 20 % with cuda.shares 2-8, partly
occupied so that a good share, not all, of the sessions fit; one scaling group. Each policy ×
agent selection is timed (best of --repeat), then the NAIVE baseline: sessions in queue order,
first fit scanning every agent, Decimal arithmetic, no predicates. Printed per line: name,
placements, seconds, placements/s, ratio to the naive baseline, target.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bai.node.scheduler.core import schedule  # noqa: E402
from bai.node.scheduler.snapshot import (  # noqa: E402
    AgentState,
    KernelRequest,
    KeypairState,
    PendingSession,
    ResourcePolicy,
    ScalingGroup,
    Snapshot,
)
from bench.figures import Figure, record  # noqa: E402

GiB = 1024**3
MiB = 1024**2
TARGETS = {"fifo": 100_000, "lifo": 100_000, "drf": 50_000}
RATIO_TARGET = 100.0  # multifactor with priorities and reservations, over the naive first-fit of the same run


def build(n_sessions: int, n_agents: int, seed: int) -> Snapshot:
    rnd = random.Random(seed)
    now = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    agents = []
    for n in range(n_agents):
        cpu = rnd.randint(8, 64)
        mem = rnd.randint(32, 512) * GiB
        capacity = {"cpu": Decimal(cpu), "mem": Decimal(mem)}
        busy = rnd.uniform(0.2, 0.8)
        occupied = {"cpu": Decimal(int(cpu * busy * 2)) / 2, "mem": Decimal(int(mem * busy) // MiB * MiB)}
        if rnd.random() < 0.2:
            shares = rnd.randint(2, 8)
            capacity["cuda.shares"] = Decimal(shares)
            occupied["cuda.shares"] = Decimal(int(shares * busy * 10)) / 10
        # what is occupied ends in two parts, within 1 to 8 hours (what backfill plans with)
        half = {
            k: (v / 2).quantize(Decimal("0.001")) if k != "mem" else Decimal(int(v) // 2) for k, v in occupied.items()
        }
        ends = tuple(
            (now + timedelta(hours=rnd.randint(1, 8)), half if part == 0 else {k: occupied[k] - half[k] for k in half})
            for part in range(2)
        )
        agents.append(AgentState(f"agent-{n:04d}", "default", capacity, occupied, ends=ends))
    unlimited = ResourcePolicy("default")
    small = ResourcePolicy("small", max_concurrent_sessions=150, total_resource_slots={"cpu": Decimal(400)})
    keys = [f"AKIA{n:016d}" for n in range(50)]
    keypairs = {}
    for n, key in enumerate(keys):
        policy = small if n % 10 == 0 else unlimited
        occupied = {"cpu": Decimal(rnd.randint(0, 60)), "mem": Decimal(rnd.randint(0, 200) * GiB)}
        keypairs[key] = KeypairState(key, policy, rnd.randint(0, 20), occupied)
    image_min = {"cpu": Decimal("0.5"), "mem": Decimal(256 * MiB)}
    pending = []
    for n in range(n_sessions):
        slots = {"cpu": Decimal(rnd.randint(1, 8)) / 2, "mem": Decimal(rnd.randint(1, 32) * 256 * MiB)}
        if rnd.random() < 0.1:
            slots["cuda.shares"] = Decimal(rnd.randint(1, 10)) / 10
        sid = f"sess-{n:05d}"
        pending.append(
            PendingSession(
                sid,
                f"s{n}",
                rnd.choice(keys),
                "batch" if rnd.random() < 0.3 else "interactive",
                "default",
                (KernelRequest(f"{sid}-k0", slots),),
                created_at=now - timedelta(seconds=n_sessions - n),
                image="python:3.11",
                image_min=image_min,
                priority=rnd.choice([0, 10, 10, 10, 10, 50, 100]),
                duration=rnd.choice([None, 600.0, 3600.0, 4 * 3600.0]),
            )
        )
    rnd.shuffle(pending)  # the core must not depend on the caller's order
    usage = {key: float(rnd.randint(0, 100) * 3600) for key in keys}  # (fair share: decayed slot-seconds)
    return Snapshot(now, pending, agents, keypairs, {}, {"default": ScalingGroup("default")}, usage=usage)


def naive(snapshot: Snapshot) -> int:
    """First fit, every agent scanned, Decimal arithmetic, queue order, no predicates."""
    free = [(a.id, {k: v - a.occupied.get(k, Decimal(0)) for k, v in a.capacity.items()}) for a in snapshot.agents]
    placed = 0
    for session in sorted(snapshot.pending, key=lambda s: (s.created_at, s.id)):
        request: dict[str, Decimal] = {}
        for kernel in session.kernels:
            for k, v in kernel.slots.items():
                request[k] = request.get(k, Decimal(0)) + v
        for _agent_id, room in free:
            if all(v <= room.get(k, Decimal(0)) for k, v in request.items() if v > 0):
                for k, v in request.items():
                    room[k] = room.get(k, Decimal(0)) - v
                placed += 1
                break
    return placed


def timed(fn, repeat: int) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--agents", type=int, default=1_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    began = time.perf_counter()
    snapshot = build(args.sessions, args.agents, args.seed)
    print(f"snapshot: {args.sessions} pending sessions, {args.agents} agents, 50 keypairs, 1 scaling group")

    naive_s, naive_placed = timed(lambda: naive(snapshot), 1)
    naive_rate = naive_placed / naive_s
    rows = []
    for policy in ("fifo", "lifo", "drf"):
        for selection in ("dispersed", "concentrated"):
            group = ScalingGroup("default", policy=policy, agent_selection=selection)
            snap = replace(snapshot, scaling_groups={"default": group})
            seconds, decisions = timed(lambda snap=snap: schedule(snap), args.repeat)
            assert len(decisions.placements) + len(decisions.pending) + len(decisions.cancels) == args.sessions
            rows.append((f"{policy}/{selection}", len(decisions.placements), seconds, TARGETS[policy]))
    for selection in ("dispersed", "concentrated"):
        group = ScalingGroup("default", policy="multifactor", agent_selection=selection)
        snap = replace(snapshot, scaling_groups={"default": group})
        seconds, decisions = timed(lambda snap=snap: schedule(snap), args.repeat)
        reserved = sum(1 for p in decisions.pending if p.reservation is not None)
        assert reserved == group.reservation_depth, reserved  # (the snapshot is busy enough to reserve)
        rows.append((f"multifactor+backfill/{selection}", len(decisions.placements), seconds, "ratio"))
    rows.append(("naive first-fit (Decimal)", naive_placed, naive_s, None))

    print(f"{'name':<36}{'placed':>8}{'seconds':>10}{'placed/s':>12}{'× naive':>9}   target")
    for name, placed, seconds, target in rows:
        rate = placed / seconds
        if target == "ratio":
            met = rate / naive_rate >= RATIO_TARGET
            print(
                f"{name:<36}{placed:>8}{seconds:>10.3f}{rate:>12,.0f}{rate / naive_rate:>9.1f}   "
                f"≥ {RATIO_TARGET:g}x naive {'ok' if met else 'MISSED'}"
            )
            record(
                Figure(
                    f"scheduler core {name} with priorities and reservations, {args.sessions // 1000}k pending x "
                    f"{args.agents} agents",
                    rate / naive_rate, "x", "naive first-fit", 1.0, f">= {RATIO_TARGET:g}x", met,
                )
            )  # fmt: skip
            continue
        verdict = "" if target is None else f"≥ {target:,}/s {'ok' if rate >= target else 'MISSED'}"
        print(f"{name:<36}{placed:>8}{seconds:>10.3f}{rate:>12,.0f}{rate / naive_rate:>9.1f}   {verdict}")
        if target is not None:
            record(
                Figure(
                    f"scheduler core {name}, {args.sessions // 1000}k pending x {args.agents} agents",
                    rate,
                    "/s",
                    "naive first-fit",
                    naive_rate,
                    f">= {target:,}/s",
                    rate >= target,
                )
            )
    print(f"(best of {args.repeat} runs; total bench time {time.perf_counter() - began:.1f} s, limit 60 s)")


if __name__ == "__main__":
    main()
