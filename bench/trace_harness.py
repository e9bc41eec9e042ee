"""The trace of bench/trace.py through the in-process harness (tests/harness.py): the manager's real services as
`bai node` wires them (the store in SQLite, lifecycle, the dispatcher's real round, fair share), simulated agents
with fake NVIDIA GPUs, and a ManualClock, for the same trace under each policy, in one run.

    .venv/bin/python bench/trace_harness.py [--sessions 5000] [--agents 32] [--seed 7] [--load 1.5] [--jobs N]

The trace is bench/trace.py's `make_trace`: the same sessions, users, sizes, durations and declared limits. Each
user is a keypair (of a policy that limits nothing: no pending cap, no cap on session networks, as the pure
simulation has none); each session an interactive one of its size (more than 8 GPUs: `clusterSize` kernels of 8
GPUs, `clusterMode` multi-node) with `timeLimit` its declared limit; each agent 64 cores, 512 GiB and 8 fake GPUs
(`cuda.device`). A discrete-event loop in simulated time moves the ManualClock to each arrival or end, destroys the
sessions whose real duration is over (DELETE's semantics: it returns once they are TERMINATED, their slots free),
creates those that arrive, then runs one dispatcher round under the condition bench/trace.py runs one (something
arrived or ended and some waiting session could fit some agent) and waits, on the session events, for the sessions
it placed to be RUNNING; their start is their `started_at` (the clock's time then: the event's, give or take the
millisecond each create moves the clock).

Policies through the harness: `fifo` (bai's FIFO with skipping) and `multifactor` (backfill with reservations, fair
share with a 12 h half-life). Strict FIFO (Backend.AI's) is no policy of bai's, so it comes from the pure simulation
(bench.trace.simulate) of the same trace in the same run, as do the pure simulation's figures for the two others,
printed beside the harness's. The five runs are processes of their own (`--jobs`, default: the CPUs).

Size: the default is bench/trace.py's 5000 sessions (57 h). A dispatcher round through the harness stores the
scheduler's note on every waiting session and reads every pending and holding session and kernel, so its cost grows
with the queue, and the run's with the square of the sessions: on a 2-core machine 5000 sessions take about 9
minutes (2026-12-07, 16 reservations: the multifactor replay 538 s, FIFO 237 s, side by side; 17 minutes earlier that
day, with 4 reservations and a slower core), 2500 about 5. The manager keeps no
replay records here (`scheduler_rounds_kept = 0`): they change no decision, and each costs a snapshot's encoding.
With fewer sessions the window is shorter (2500: 28 h), which the fair-share figure depends on: over 28 h the heavy
user's share is 1.84x its fair share through the harness, 2.2x in the pure simulation.

Where the harness and the pure simulation differ: with `fifo` they agree to the session. With `multifactor` the
harness started fewer sessions, for two reasons. (1) Its agents report per-device GPU figures (`AgentState.gpu_free`),
and with them the core never tried backfill's short fit (a session that ends before a reservation starts): this
bench found that bug, fixed in bai/node/scheduler/core.py (`select_for` -> `short_fit_for`). (2) Fair share is charged
at rounds only: a session that ends between two rounds is not charged for its time since the last one (a node's
dispatcher also runs a round at its 10 s tick, which bounds that; the harness runs none between events), where the
pure simulation charges every session up to its end. That moves the fair-share factors by about 0.1 %, enough to
swap two sessions of nearly equal score, after which the runs drift apart a little: of 5000 sessions on 32 agents,
3535 start through the harness and 3544 in the pure simulation (2026-12-07), the heavy user's share 22.1 % and
23.1 %.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import logging
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from datetime import datetime
from decimal import Decimal
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bai.common.status import DEAD_STATUSES, SessionStatus  # noqa: E402
from bai.node.manager.services.hubs import Subscription  # noqa: E402
from bai.node.manager.state.records import Session  # noqa: E402
from bench.figures import Figure, record  # noqa: E402
from bench.trace import GPU, GPUS_PER_AGENT, SIZES, T0, USERS, Job, Outcome, could_start, make_trace, simulate  # noqa: E402
from tests.harness import Harness  # noqa: E402

HALF_LIFE = "12h"
WAIT = 60.0  # seconds (real) a placed session may take to run, a destroyed one to end: only bounds a bug
HARNESS_POLICIES = {"fifo": "fifo", "backfill": "multifactor"}  # bench/trace.py's name -> bai's policy
TASKS = [("harness", "backfill"), ("harness", "fifo"), ("pure", "strict-fifo"), ("pure", "backfill"), ("pure", "fifo")]
DEFAULT_SESSIONS = 5000  # bench/trace.py's trace (about 9 minutes on 2 cores: see the docstring)


def session_shape(job: Job) -> dict[str, object]:
    """The create body's keywords for a job (as bench.trace.Job.kernels splits it)."""
    n = max(1, job.gpus // GPUS_PER_AGENT) if job.gpus > GPUS_PER_AGENT else 1
    each = job.gpus // n
    shape: dict[str, object] = {"cpu": each, "mem": f"{each}g", "resources": {GPU: str(each)}}
    if n > 1:
        shape |= {"clusterSize": n, "clusterMode": "multi-node"}
    return shape


class Watch:
    """The session events of the whole replay, as one subscriber reads them (no polling): each session's latest
    row by id, and the ids of those a round placed."""

    def __init__(self, queue: Subscription[Session]) -> None:
        self.queue = queue
        self.rows: dict[str, Session] = {}
        self.scheduled: list[str] = []

    def _take(self, name: str, row: Session) -> None:
        self.rows[row.id] = row
        if name == "session_scheduled":
            self.scheduled.append(row.id)

    def drain(self) -> None:
        if self.queue.lagged:
            raise RuntimeError("fell behind the session events")
        while not self.queue.empty():
            self._take(*self.queue.get_nowait())

    async def until(self, ids: list[str], status: SessionStatus) -> None:
        """Return once every session of `ids` is in `status`; fail if one ends (or nothing comes) first."""
        async with asyncio.timeout(WAIT):
            while True:
                self.drain()
                left = [i for i in ids if self.rows[i].status != status]
                if not left:
                    return
                dead = [self.rows[i] for i in left if SessionStatus(self.rows[i].status) in DEAD_STATUSES]
                if dead:
                    row = dead[0]
                    raise RuntimeError(f"session {row.name} is {row.status} ({row.status_info}), not {status}")
                self._take(*await self.queue.get())


async def replay(policy: str, jobs: list[Job], n_agents: int, window: float, base: Path) -> Outcome:
    """The trace through the harness under bai's `policy`; the figures as bench.trace.simulate's."""
    config = {
        "scaling_groups": {"default": {"policy": policy}},
        # (no replay records: they change no decision, and cost each round a snapshot's encoding)
        "manager": {"fair_share_half_life": HALF_LIFE, "scheduler_rounds_kept": 0},
    }
    out = Outcome(policy)
    by_id = {j.id: j for j in jobs}
    async with Harness(base, config=config, start=T0) as h:
        for n in range(n_agents):
            await h.add_agent(f"a{n:02d}", cpu=64, mem="512g", gpus=GPUS_PER_AGENT)
        await h.policy("bench", max_pending_session_count=0, max_session_networks=0, max_concurrent_sessions=0)
        keys = {u: await h.keypair(f"{u}@example.com", "bench") for u in USERS}
        free = {f"a{n:02d}": GPUS_PER_AGENT for n in range(n_agents)}
        waiting: dict[str, Job] = {}  # by session id
        running: dict[str, tuple[Job, float, dict[str, int]]] = {}  # session id -> (job, start, agent -> GPUs)
        events: list[tuple[float, int, str]] = [(j.arrival, 1, j.id) for j in jobs]  # (time, 0 end/1 arrival, id)
        heapq.heapify(events)

        async def end(sid: str) -> None:  # as DELETE /session/{id}: returns once it is TERMINATED
            await h.lifecycle.destroy(watch.rows[sid], False)

        with h.hubs.events.subscribe() as queue:
            watch = Watch(queue)
            while events and events[0][0] <= window:
                t = events[0][0]
                ahead = t - (h.clock.now() - T0).total_seconds()
                if ahead > 0:
                    h.advance(ahead)
                ending, arriving = [], []
                while events and events[0][0] == t:
                    _, kind, ref = heapq.heappop(events)
                    (arriving if kind == 1 else ending).append(ref)
                if ending:
                    await asyncio.gather(*(end(sid) for sid in ending))
                    await watch.until(ending, SessionStatus.TERMINATED)
                for sid in ending:
                    job, start, where = running.pop(sid)
                    out.account(job, start, t, window)
                    for agent_id, n in where.items():
                        free[agent_id] += n
                for job_id in arriving:  # (in arrival order: the queue's order follows creation)
                    job = by_id[job_id]
                    row = await h.create(job.id, **session_shape(job), owner=keys[job.user], timeLimit=job.declared)
                    waiting[row.id] = job
                if not (waiting and could_start(free, waiting.values())):
                    continue
                watch.drain()
                watch.scheduled.clear()
                await h.schedule()
                out.rounds += 1
                watch.drain()
                placed = list(watch.scheduled)
                if not placed:
                    continue
                await watch.until(placed, SessionStatus.RUNNING)
                kernels = await h.store.kernels_of_many(placed)
                for sid in placed:
                    job = waiting.pop(sid)
                    started_at = watch.rows[sid].started_at
                    assert started_at is not None
                    start = (datetime.fromisoformat(started_at) - T0).total_seconds()  # the clock's: about t
                    where: dict[str, int] = {}
                    for kernel in kernels[sid]:
                        assert kernel.agent_id is not None
                        gpus = int(Decimal(kernel.occupied_slots[GPU]))
                        where[kernel.agent_id] = where.get(kernel.agent_id, 0) + gpus
                    for agent_id, n in where.items():
                        free[agent_id] -= n
                        assert free[agent_id] >= 0, (agent_id, job.id)
                    running[sid] = (job, start, where)
                    out.waits.setdefault(job.gpus, []).append(start - job.arrival)
                    out.started += 1
                    heapq.heappush(events, (start + job.runs, 0, sid))
        for job, start, _ in running.values():  # still running at the window's end
            out.account(job, start, window, window)
    largest = max(s for s, _ in SIZES)
    waits = list(out.waits.get(largest, []))
    waits += [window - j.arrival for j in waiting.values() if j.gpus == largest]
    out.largest_wait = max(waits, default=0.0)
    return out


def run_one(kind: str, policy: str, sessions: int, agents: int, seed: int, load: float) -> tuple[Outcome, float]:
    """One policy on the trace (made afresh: the same for the same arguments), in the pure simulation or through
    the harness; with the seconds it took."""
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger().setLevel(logging.WARNING)
    jobs, window = make_trace(sessions, agents, seed, load)
    started = time.perf_counter()
    if kind == "pure":
        out = simulate(policy, jobs, agents, window)
    else:
        with tempfile.TemporaryDirectory(prefix="bai-trace-") as tmp:
            out = asyncio.run(replay(HARNESS_POLICIES[policy], jobs, agents, window, Path(tmp)))
    return out, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=DEFAULT_SESSIONS)
    parser.add_argument("--agents", type=int, default=32)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--load", type=float, default=1.5, help="GPU-hours asked for over what the window has")
    parser.add_argument("--jobs", type=int, default=min(len(TASKS), os.cpu_count() or 1), help="processes")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger().setLevel(logging.WARNING)
    began = time.perf_counter()
    jobs, window = make_trace(args.sessions, args.agents, args.seed, args.load)
    print(
        f"trace: {len(jobs)} sessions over {window / 3600:.1f} h on {args.agents} agents x {GPUS_PER_AGENT} GPUs, "
        f"{args.load:g}x the GPU-hours of the window asked for; users {USERS}"
    )
    if args.sessions != 5000:
        print(
            f"({args.sessions} sessions, not bench/trace.py's 5000: a harness round's cost grows with the queue, "
            "and 5000 take far more than 10 minutes on 2 cores; see the docstring)"
        )
    total = args.agents * GPUS_PER_AGENT * window
    results: dict[tuple[str, str], tuple[Outcome, float]] = {}
    shape = (args.sessions, args.agents, args.seed, args.load)
    # each a process of its own (the harness's rounds and the pure simulation are CPU-bound): longest first
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {pool.submit(run_one, kind, policy, *shape): (kind, policy) for kind, policy in TASKS}
        for future in as_completed(futures):
            results[futures[future]] = future.result()
    pure = {p: results["pure", p][0] for k, p in TASKS if k == "pure"}
    harness = {p: results["harness", p][0] for k, p in TASKS if k == "harness"}
    seconds = {f"{k} {p}": results[k, p][1] for k, p in TASKS}

    def util(r: Outcome) -> float:
        return r.used_gpu_seconds / total

    def share(r: Outcome) -> float:
        return r.heavy_late / r.all_late if r.all_late else 0.0

    print(f"{'':<22} {'utilisation':>11} {'started':>8} {'longest 32-GPU wait':>20} {'heavy share':>12} {'rounds':>7}")
    rows = [("strict-fifo", "pure", pure["strict-fifo"])]
    for policy in HARNESS_POLICIES:
        rows += [(policy, "harness", harness[policy]), (policy, "pure", pure[policy])]
    for policy, where, r in rows:
        label = f"{policy} ({where})"
        print(
            f"{label:<22} {util(r):11.1%} {r.started:8d} {r.largest_wait / 3600:18.1f} h "
            f"{share(r):12.1%} {r.rounds:7d}   ({seconds[f'{where} {policy}']:.0f} s)"
        )
    for policy in HARNESS_POLICIES:
        a, b = harness[policy], pure[policy]
        print(
            f"{policy}: harness - pure: utilisation {util(a) - util(b):+.2%}, started {a.started - b.started:+d}, "
            f"longest 32-GPU wait {(a.largest_wait - b.largest_wait) / 3600:+.1f} h, heavy share "
            f"{share(a) - share(b):+.2%}"
        )
    fair = 1 / len(USERS)
    bf, ff, strict = harness["backfill"], harness["fifo"], pure["strict-fifo"]
    figures = [
        Figure("GPU utilisation, backfill (harness)", util(bf), "x", "strict FIFO (pure simulation)", util(strict),
               ">= 1.15x", util(bf) >= 1.15 * util(strict)),
        Figure("longest wait of the 32-GPU sessions, backfill (harness)", bf.largest_wait / 3600, "h",
               "FIFO with skipping (harness)", ff.largest_wait / 3600, "<= 0.5x",
               bf.largest_wait <= 0.5 * ff.largest_wait),
        Figure("the heavy user's share of GPU-hours (last half), backfill (harness)", share(bf) / fair, "x",
               "its fair share", 1.0, "<= 1.5x", share(bf) <= 1.5 * fair),
    ]  # fmt: skip
    for f in figures:
        record(f)
        ratio = f.ratio if f.ratio is not None else f.value
        print(f"{f.name}: {ratio:.2f}x {f.baseline} (target {f.target}) {'ok' if f.met else 'MISSED'}")
    print(f"(total bench time {time.perf_counter() - began:.0f} s)")


if __name__ == "__main__":
    main()
