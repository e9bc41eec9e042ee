"""A shared GPU cluster over days, under three policies, in one run: the same synthetic trace of sessions given to
the scheduling core (bai/node/scheduler/core.py) by a discrete-event simulation with its own clock.

    .venv/bin/python bench/trace.py [--sessions 5000] [--agents 32] [--seed 7] [--load 1.5]

The trace: 32 agents of 8 GPUs (and room enough of everything else), 5 users of different appetites. One user
submits 10 times as many sessions as each of the others, all small (1, 2 or 4 GPUs); the others ask for 1-32 GPUs
(40 % 1, 25 % 2, 15 % 4, 10 % 8, 6 % 16, 4 % 32; more than 8 GPUs is a multi-node session of 8-GPU kernels).
Durations log-normal (median 1 h, sigma 1, 5 min to 48 h); each session declares a limit of 1-2x its real duration
(what backfill plans with). Arrivals are Poisson over a window sized so that `--load` times the cluster's GPU-hours
are asked for in it.

The policies, each on the same trace:
* strict FIFO: oldest first, and nothing starts while the oldest waiting session cannot (Backend.AI's FIFO);
* FIFO with skipping: oldest first, later sessions start where they fit (bai's `fifo` until now);
* backfill: `multifactor` (priority, fair share with a 12 h half-life, age, size) with reservations for the first
  sessions in line that cannot start (4 by default); later ones start only where they do not delay them.

A round runs when something arrived or ended and some waiting session could fit some agent. Printed: each
policy's GPU utilisation over the window, the longest wait of the 32-GPU sessions (those still waiting at the end
count from their arrival to the end), the heavy user's share of GPU-hours in the window's last half, and the
figures against their targets. Beside them, for reading other traces (`--load`, `--seed`, `--agents`): each size's
longest wait under each policy (is a size starved, or is the cluster merely overloaded?), and per user under
backfill what it asked of the last half (its sessions' GPU-hours there had each started on arrival), its max-min
fair share of that (water-filling: a user asking less than an equal part gets what it asks, the others split the
rest), what it got and its waits. The issue's figure divides by an equal fifth; where the light users ask less than
their fifth (`--load 1.0`), no scheduler that leaves no GPU idle can hold the heavy user to 1.5x of it, and the
heavy user's share against its max-min fair share says whether it got more than its due.
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bai.node.scheduler.core import schedule  # noqa: E402
from bai.node.scheduler.snapshot import (  # noqa: E402
    AgentState,
    KernelRequest,
    PendingSession,
    ScalingGroup,
    Snapshot,
)
from bench.figures import Figure, record  # noqa: E402

GPU = "cuda.device"
GPUS_PER_AGENT = 8
T0 = datetime(2026, 12, 1, tzinfo=UTC)
SIZES = [(1, 0.40), (2, 0.25), (4, 0.15), (8, 0.10), (16, 0.06), (32, 0.04)]
# the users: how many sessions each submits (relative), and their appetites (sizes): one submits 10 times as many
# sessions as any other, all small; the others ask for every size
USERS = {"heavy": 10, "u1": 1, "u2": 1, "u3": 1, "u4": 1}
APPETITES = {"heavy": [(1, 0.5), (2, 0.3), (4, 0.2)]}
HALF_LIFE = 12 * 3600.0
POLICIES = ("strict-fifo", "fifo", "backfill")


@dataclass
class Job:
    id: str
    user: str
    gpus: int
    arrival: float  # seconds from T0
    runs: float  # its real duration
    declared: float  # its declared limit (>= runs)
    start: float | None = None

    def kernels(self) -> tuple[KernelRequest, ...]:
        n = max(1, self.gpus // GPUS_PER_AGENT) if self.gpus > GPUS_PER_AGENT else 1
        each = self.gpus // n
        slots = {"cpu": Decimal(each), "mem": Decimal(each) * 2**30, GPU: Decimal(each)}
        return tuple(KernelRequest(f"{self.id}-k{k}", slots, "main" if k == 0 else "sub", max(k, 1)) for k in range(n))


def make_trace(n: int, agents: int, seed: int, load: float) -> tuple[list[Job], float]:
    """The sessions, in arrival order, and the window's length (seconds)."""
    rnd = random.Random(seed)
    users = list(USERS)
    user_weights = [USERS[u] for u in users]
    jobs = []
    for k in range(n):
        user = rnd.choices(users, user_weights)[0]
        sizes = APPETITES.get(user, SIZES)
        gpus = rnd.choices([s for s, _ in sizes], [w for _, w in sizes])[0]
        runs = min(48 * 3600.0, max(300.0, 3600.0 * math.exp(rnd.gauss(0.0, 1.0))))
        declared = min(72 * 3600.0, runs * rnd.uniform(1.0, 2.0))
        jobs.append(Job(f"j{k:05d}", user, gpus, 0.0, runs, declared))
    asked = sum(j.gpus * j.runs for j in jobs)
    window = asked / (agents * GPUS_PER_AGENT * load)
    t = 0.0
    for job in jobs:
        t += rnd.expovariate(n / window)
        job.arrival = min(t, window)
    return jobs, window


@dataclass
class Outcome:
    policy: str
    used_gpu_seconds: float = 0.0  # within the window
    all_late: float = 0.0
    largest_wait: float = 0.0  # the longest wait of a 32-GPU session (censored at the window's end)
    started: int = 0
    rounds: int = 0
    core_seconds: float = 0.0
    waits: dict[int, list[float]] = field(default_factory=dict)  # size -> waits (censored at the window's end)
    user_waits: dict[str, list[float]] = field(default_factory=dict)  # user -> waits (censored likewise)
    never_started: dict[str, int] = field(default_factory=dict)  # user -> sessions still waiting at the end
    user_late: dict[str, float] = field(default_factory=dict)  # user -> GPU-seconds in the window's last half

    @property
    def heavy_late(self) -> float:
        """The heavy user's GPU-seconds in the window's last half."""
        return self.user_late.get("heavy", 0.0)

    def account(self, job: Job, start: float, end: float, window: float) -> None:
        """Count the GPU-seconds a session held between `start` and `end` that fall in the window (and its last
        half: all users', the heavy user's)."""
        begin, stop = max(start, 0.0), min(end, window)
        if stop > begin:
            self.used_gpu_seconds += job.gpus * (stop - begin)
            late_begin = max(begin, window / 2)
            if stop > late_begin:
                self.all_late += job.gpus * (stop - late_begin)
                self.user_late[job.user] = self.user_late.get(job.user, 0.0) + job.gpus * (stop - late_begin)


def could_start(free: Mapping[str, int], waiting: Iterable[Job]) -> bool:
    """Whether some waiting session could fit some agent's free GPUs (when a round is worth running)."""
    most = max(free.values())
    return any(min(j.gpus, GPUS_PER_AGENT) <= most for j in waiting)


def simulate(policy: str, jobs: list[Job], n_agents: int, window: float, group: ScalingGroup | None = None) -> Outcome:
    jobs = [replace(j, start=None) for j in jobs]
    by_id = {j.id: j for j in jobs}
    free = {f"a{n:02d}": GPUS_PER_AGENT for n in range(n_agents)}
    running: dict[str, tuple[Job, dict[str, int]]] = {}  # id -> (job, agent -> GPUs)
    usage: dict[str, float] = dict.fromkeys(USERS, 0.0)
    usage_at = 0.0
    if group is None:
        group = ScalingGroup("default", policy="multifactor" if policy == "backfill" else "fifo")
    out = Outcome(policy)
    events: list[tuple[float, int, str]] = [(j.arrival, 1, j.id) for j in jobs]  # (time, 0 end / 1 arrival, id)
    heapq.heapify(events)
    waiting: dict[str, Job] = {}
    capacity = {"cpu": Decimal(64), "mem": Decimal(512 * 2**30), GPU: Decimal(GPUS_PER_AGENT)}

    def decay_to(t: float) -> None:
        nonlocal usage_at
        if t <= usage_at:
            return
        factor = 2 ** (-(t - usage_at) / HALF_LIFE)
        held: dict[str, int] = {}
        for job, where in running.values():
            held[job.user] = held.get(job.user, 0) + sum(where.values())
        for user in usage:
            # (what was held through the step, decayed from its middle: close enough for a bench)
            step = t - usage_at
            usage[user] = usage[user] * factor + held.get(user, 0) * step * 2 ** (-step / 2 / HALF_LIFE)
        usage_at = t

    def round_at(t: float) -> None:
        now = T0 + timedelta(seconds=t)
        agents = []
        for agent_id, left in free.items():
            ends = tuple(
                (T0 + timedelta(seconds=job.start + job.declared), {GPU: Decimal(where[agent_id])})
                for job, where in running.values()
                if agent_id in where and job.start is not None
            )
            occupied = {GPU: Decimal(GPUS_PER_AGENT - left)}
            agents.append(AgentState(agent_id, "default", capacity, occupied, ends=ends))
        pending = [
            PendingSession(
                j.id, j.id, j.user, "batch", "default", j.kernels(), created_at=T0 + timedelta(seconds=j.arrival),
                cluster_mode="multi-node" if j.gpus > GPUS_PER_AGENT else "single-node", duration=j.declared,
            )
            for j in waiting.values()
        ]  # fmt: skip
        decay_to(t)
        snapshot = Snapshot(now, pending, agents, scaling_groups={"default": group}, usage=dict(usage))
        began = time.perf_counter()
        decisions = schedule(snapshot)
        out.core_seconds += time.perf_counter() - began
        out.rounds += 1
        placed = {p.session_id: p for p in decisions.placements}
        if policy == "strict-fifo":  # nothing after the first that cannot start
            order = sorted(waiting.values(), key=lambda j: (j.arrival, j.id))
            allowed = set()
            for j in order:
                if j.id not in placed:
                    break
                allowed.add(j.id)
            placed = {k: v for k, v in placed.items() if k in allowed}
        for sid, placement in placed.items():
            job = waiting.pop(sid)
            job.start = t
            where: dict[str, int] = {}
            for kernel in job.kernels():
                agent_id = placement.agents[kernel.kernel_id]
                where[agent_id] = where.get(agent_id, 0) + int(kernel.slots[GPU])
            for agent_id, n in where.items():
                free[agent_id] -= n
                assert free[agent_id] >= 0, (agent_id, sid)
            running[sid] = (job, where)
            out.waits.setdefault(job.gpus, []).append(t - job.arrival)
            out.user_waits.setdefault(job.user, []).append(t - job.arrival)
            out.started += 1
            heapq.heappush(events, (t + job.runs, 0, sid))

    while events:
        t = events[0][0]
        if t > window:
            break
        changed = False
        while events and events[0][0] == t:
            _, kind, sid = heapq.heappop(events)
            if kind == 1:
                waiting[sid] = by_id[sid]
            else:
                decay_to(t)
                job, where = running.pop(sid)
                assert job.start is not None
                out.account(job, job.start, t, window)
                for agent_id, n in where.items():
                    free[agent_id] += n
            changed = True
        if changed and waiting and could_start(free, waiting.values()):
            round_at(t)
    for job, _ in running.values():  # still running at the window's end
        assert job.start is not None
        out.account(job, job.start, window, window)
    for job in waiting.values():  # never started: their waits count until the window's end
        out.waits.setdefault(job.gpus, []).append(window - job.arrival)
        out.user_waits.setdefault(job.user, []).append(window - job.arrival)
        out.never_started[job.user] = out.never_started.get(job.user, 0) + 1
    largest = max(s for s, _ in SIZES)
    out.largest_wait = max(out.waits.get(largest, []), default=0.0)
    return out


def late_demand(jobs: Iterable[Job], window: float) -> dict[str, float]:
    """Each user's GPU-seconds in the window's last half were each session started on arrival: what they ask of
    that half, whatever the policy."""
    demand = dict.fromkeys(USERS, 0.0)
    for job in jobs:
        begin, stop = max(job.arrival, window / 2), min(job.arrival + job.runs, window)
        if stop > begin:
            demand[job.user] += job.gpus * (stop - begin)
    return demand


def asked_in_window(jobs: Iterable[Job], window: float) -> float:
    """The GPU-seconds within the window were each session started on arrival: no policy can use more (nor more
    than the cluster has), so under a light load what is asked bounds utilisation, not the scheduler."""
    return sum(job.gpus * max(0.0, min(job.runs, window - job.arrival)) for job in jobs)


def max_min_shares(demand: Mapping[str, float], capacity: float) -> dict[str, float]:
    """Max-min fair shares (water-filling) of `capacity` among users asking `demand`: a user asking less than an
    equal part gets what it asks, the rest is split equally among the others. Fractions of what is handed out."""
    given: dict[str, float] = {}
    left = capacity
    order = sorted(demand, key=lambda u: demand[u])
    for k, user in enumerate(order):
        given[user] = min(demand[user], left / (len(order) - k))
        left -= given[user]
    total = sum(given.values())
    return {u: (g / total if total else 0.0) for u, g in given.items()}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=5000)
    parser.add_argument("--agents", type=int, default=32)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--load", type=float, default=1.5, help="GPU-hours asked for over what the window has")
    parser.add_argument("--reservations", type=int, default=None, help="backfill: reservations (default: the policy's)")
    parser.add_argument("--weights", default="", help="backfill: weights, e.g. age=1000,fair_share=2000,max_age=43200")
    args = parser.parse_args()
    began = time.perf_counter()
    jobs, window = make_trace(args.sessions, args.agents, args.seed, args.load)
    print(
        f"trace: {len(jobs)} sessions over {window / 3600:.1f} h on {args.agents} agents x {GPUS_PER_AGENT} GPUs, "
        f"{args.load:g}x the GPU-hours of the window asked for; users {USERS}"
    )
    from bai.node.scheduler.snapshot import Weights

    weights = Weights(**{k: float(v) for k, v in (kv.split("=") for kv in args.weights.split(",") if kv)})
    backfill = ScalingGroup("default", policy="multifactor", weights=weights, reservations=args.reservations)
    results: dict[str, Outcome] = {}
    for policy in POLICIES:
        group = backfill if policy == "backfill" else None
        results[policy] = r = simulate(policy, jobs, args.agents, window, group)
        used = r.used_gpu_seconds / (args.agents * GPUS_PER_AGENT * window)
        share = r.heavy_late / r.all_late if r.all_late else 0.0
        print(
            f"{policy:<12} utilisation {used:6.1%}  started {r.started:5d}  longest 32-GPU wait "
            f"{r.largest_wait / 3600:7.1f} h  heavy user's share (last half) {share:6.1%}  "
            f"rounds {r.rounds}  core {r.core_seconds:.1f} s"
        )
    total = float(args.agents * GPUS_PER_AGENT * window)

    def util(p: str) -> float:
        return results[p].used_gpu_seconds / total

    ceiling = min(asked_in_window(jobs, window) / total, 1.0)
    print(
        f"{'asked':<12} utilisation {ceiling:6.1%}  were every session started on arrival (at most the cluster): "
        f"{ceiling / util('strict-fifo'):.2f}x strict FIFO, the most any policy could reach"
    )
    fair = 1 / len(USERS)
    bf = results["backfill"]
    heavy_share = bf.heavy_late / bf.all_late if bf.all_late else 0.0
    print("\nlongest wait by size (h; sessions never started count until the window's end):")
    sizes = [s for s, _ in SIZES]
    print(f"{'':<12} " + " ".join(f"{s:>3} GPU" for s in sizes))
    for policy, r in results.items():
        print(f"{policy:<12} " + " ".join(f"{max(r.waits.get(s, [0.0])) / 3600:7.1f}" for s in sizes))
    demand = late_demand(jobs, window)
    shares = max_min_shares(demand, total / 2)
    asked = sum(demand.values())
    print(
        "\nbackfill, by user (last half: GPU-hours asked were each session started on arrival, shares of what ran; "
        "waits in h):"
    )
    print(f"{'user':<6} {'sessions':>8} {'asked':>7} {'max-min':>8} {'got':>7} {'mean wait':>10} {'p90 wait':>9} "
          f"{'longest':>8} {'never started':>14}")  # fmt: skip
    for user in USERS:
        waits = bf.user_waits.get(user, [])
        got = bf.user_late.get(user, 0.0) / bf.all_late if bf.all_late else 0.0
        print(
            f"{user:<6} {len(waits):>8} {demand[user] / asked:>7.1%} {shares[user]:>8.1%} {got:>7.1%} "
            f"{sum(waits) / len(waits) / 3600 if waits else 0.0:>10.2f} {percentile(waits, 0.9) / 3600:>9.2f} "
            f"{max(waits, default=0.0) / 3600:>8.1f} {bf.never_started.get(user, 0):>14}"
        )
    print(
        f"the heavy user's share (last half) against its max-min fair share given what each user asked: "
        f"{heavy_share / shares['heavy']:.2f}x (the figure below divides by an equal fifth)\n"
        if shares["heavy"]
        else ""
    )
    figures = [
        Figure("GPU utilisation, backfill", util("backfill"), "x", "strict FIFO", util("strict-fifo"), ">= 1.15x",
               util("backfill") >= 1.15 * util("strict-fifo")),
        Figure("longest wait of the 32-GPU sessions, backfill", bf.largest_wait / 3600, "h", "FIFO with skipping",
               results["fifo"].largest_wait / 3600, "<= 0.5x", bf.largest_wait <= 0.5 * results["fifo"].largest_wait),
        Figure("the heavy user's share of GPU-hours (last half), backfill", heavy_share / fair, "x", "its fair share",
               1.0, "<= 1.5x", heavy_share <= 1.5 * fair),
    ]  # fmt: skip
    for f in figures:
        record(f)
        ratio = f.ratio if f.ratio is not None else f.value
        print(f"{f.name}: {ratio:.2f}x {f.baseline} (target {f.target}) {'ok' if f.met else 'MISSED'}")
    print(f"(total bench time {time.perf_counter() - began:.0f} s)")


if __name__ == "__main__":
    main()
