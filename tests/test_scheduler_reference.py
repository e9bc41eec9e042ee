"""The fast scheduling core against a slow, obviously-correct reference, on random snapshots.

The reference follows the rules literally: Decimal arithmetic, every agent scanned and sorted by
the full preference key, DRF shares recomputed as exact fractions at every pick. Outcomes must
match exactly: placements (order and kernel -> agent), pending (status_info, position), cancels.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction

import pytest

from bai.common.status import StatusInfo
from bai.node.scheduler.core import schedule
from bai.node.scheduler.snapshot import (
    DEFAULT_RESOURCE_PRIORITY,
    AgentState,
    DependencyState,
    KernelRequest,
    KeypairState,
    PendingSession,
    ResourcePolicy,
    ScalingGroup,
    Snapshot,
)

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
GiB = 1024**3
MiB = 1024**2
ZERO = Decimal(0)


# ----------------------------------------------------------------------------------------------
# Random snapshots


def random_snapshot(seed: int, policy: str, selection: str, n_sessions: int = 160, n_agents: int = 30) -> Snapshot:
    rnd = random.Random(seed)

    def amount(low: int, high: int, step: str) -> Decimal:
        return Decimal(rnd.randint(low, high)) * Decimal(step)

    groups = {
        "g1": ScalingGroup("g1", policy=policy, agent_selection=selection),
        "g2": ScalingGroup("g2", policy=policy, agent_selection=selection, allowed_session_types=frozenset({"batch"})),
    }
    agents = []
    for n in range(n_agents):
        capacity = {"cpu": amount(1, 32, "0.5"), "mem": amount(1, 64, "0.5") * GiB}
        if rnd.random() < 0.3:
            capacity["cuda.shares"] = amount(1, 40, "0.1")
        if rnd.random() < 0.1:
            capacity["cuda.device"] = Decimal(rnd.randint(1, 2))
        busy = Decimal(rnd.randint(0, 8)) / 10
        occupied = {k: (v * busy).quantize(Decimal("0.1")) for k, v in capacity.items() if rnd.random() < 0.7}
        if "mem" in occupied:
            occupied["mem"] = occupied["mem"].to_integral_value()
        group = "g1" if n % 3 else "g2"
        agents.append(AgentState(f"agent-{rnd.randint(0, 99):02d}-{n}", group, capacity, occupied, rnd.random() > 0.1))
    keys = [f"AK{n}" for n in range(6)]
    keypairs = {}
    for n, key in enumerate(keys):
        if n == 5:
            continue  # a keypair the snapshot does not know: no limits
        limits: dict[str, Decimal] = {}
        if n in (1, 2):
            limits = {"cpu": amount(10, 40, "1"), "mem": amount(20, 80, "1") * GiB}
        if n == 3:
            limits = {"cuda.shares": Decimal(2)}
        policy_ = ResourcePolicy(
            f"p{n}",
            max_concurrent_sessions=rnd.choice([0, 0, 5, 12]),
            total_resource_slots=limits,
            default_for_unspecified="LIMITED" if n == 2 else "UNLIMITED",
        )
        used = {"cpu": amount(0, 8, "0.5"), "mem": amount(0, 8, "1") * GiB}
        keypairs[key] = KeypairState(key, policy_, rnd.randint(0, 4), used)
    deps = {}
    for n, (status, result) in enumerate(
        [
            ("RUNNING", "UNDEFINED"),
            ("TERMINATED", "SUCCESS"),
            ("TERMINATED", "FAILURE"),
            ("PENDING", "UNDEFINED"),
            ("TERMINATING", "SUCCESS"),
        ]
    ):
        deps[f"dep{n}"] = DependencyState(f"dep{n}", f"d{n}", status, result)
    pending = []
    for n in range(n_sessions):
        kernels = []
        count = rnd.choice([1, 1, 1, 2, 3])
        for k in range(count):
            request = {"cpu": amount(1, 16, "0.25"), "mem": amount(1, 24, "256") * MiB}
            if rnd.random() < 0.05:
                del request["mem"]
            if rnd.random() < 0.2:
                request["cuda.shares"] = amount(1, 15, "0.1")
            if rnd.random() < 0.03:
                request["cuda.device"] = Decimal(1)
            if rnd.random() < 0.02:
                request["tpu.device"] = Decimal(1)
            kernels.append(KernelRequest(f"s{n}-k{k}", request))
        depends_on: tuple[str, ...] = ()
        if rnd.random() < 0.1:
            depends_on = (rnd.choice([*deps, "ghost"]),)
        pending.append(
            PendingSession(
                f"s{n:03d}",
                f"name{n}",
                rnd.choice(keys),
                rnd.choice(["interactive", "batch"]),
                rnd.choice(["g1", "g1", "g2", "g3"]),
                tuple(kernels),
                created_at=NOW - timedelta(seconds=rnd.randint(0, 500)),  # ties happen: id decides
                cluster_mode=rnd.choice(["single-node", "multi-node"]),
                starts_at=NOW + timedelta(seconds=rnd.randint(-60, 60)) if rnd.random() < 0.1 else None,
                depends_on=depends_on,
                image="img",
                image_min={"cpu": Decimal("0.5")} if rnd.random() < 0.5 else {},
            )
        )
    return Snapshot(NOW, pending, agents, keypairs, deps, groups)


# ----------------------------------------------------------------------------------------------
# The reference


def prio(name: str) -> tuple[int, str]:
    device = name.split(".")[0]
    order = list(DEFAULT_RESOURCE_PRIORITY)
    return (order.index(device) if device in order else len(order)), name


def total_of(session: PendingSession) -> dict[str, Decimal]:
    out: dict[str, Decimal] = {}
    for kernel in session.kernels:
        for k, v in kernel.slots.items():
            out[k] = out.get(k, ZERO) + v
    return out


def checked(
    snapshot: Snapshot,
    session: PendingSession,
    group: ScalingGroup,
    concurrent: Mapping[str, int],
    used: Mapping[str, Mapping[str, Decimal]],
) -> str | None:
    """The predicates, literally: "cancel" (a dependency that can no longer succeed), predicate-checks-failed, or
    None when they all pass."""
    waiting = False
    for dep in session.depends_on:
        state = snapshot.dependencies.get(dep)
        if state is None or (state.result != "SUCCESS" and state.status in ("TERMINATED", "CANCELLED", "ERROR")):
            return "cancel"
        if state.result != "SUCCESS" or state.status != "TERMINATED":
            waiting = True
    key = session.access_key
    policy = snapshot.keypairs[key].policy if key in snapshot.keypairs else ResourcePolicy()
    failed = waiting or (session.starts_at is not None and session.starts_at > snapshot.now)
    failed |= session.session_type not in group.allowed_session_types
    failed |= any(k.slots.get(s, ZERO) < m for k in session.kernels for s, m in session.image_min.items())
    failed |= 0 < policy.max_concurrent_sessions <= concurrent.get(key, 0)
    for slot, amount in total_of(session).items():
        if amount <= 0:
            continue
        limit = policy.total_resource_slots.get(
            slot, ZERO if policy.default_for_unspecified == "LIMITED" else Decimal("Infinity")
        )
        failed |= used.get(key, {}).get(slot, ZERO) + amount > limit
    return StatusInfo.PREDICATE_CHECKS_FAILED if failed else None


def starting_state(snapshot: Snapshot) -> tuple[dict, dict, dict, dict]:
    """What a round starts from: each schedulable agent's free room, each agent's slot kinds, each keypair's
    concurrent sessions and what it holds."""
    free = {
        a.id: {k: a.capacity.get(k, ZERO) - a.occupied.get(k, ZERO) for k in a.capacity.keys() | a.occupied.keys()}
        for a in snapshot.agents
        if a.schedulable
    }
    kinds = {a.id: {k for k, v in a.capacity.items() if v > 0} for a in snapshot.agents}
    concurrent = {k: s.concurrent_sessions for k, s in snapshot.keypairs.items()}
    used = {k: dict(s.occupied) for k, s in snapshot.keypairs.items()}
    return free, kinds, concurrent, used


def reference(snapshot: Snapshot) -> tuple[list, list, list]:
    free, kinds, concurrent, used = starting_state(snapshot)
    placements: list = []
    pending: list = []
    cancels: list = []

    def best(group_agents: list[AgentState], request: Mapping[str, Decimal], dispersed: bool) -> str | None:
        shape = sorted((k for k, v in request.items() if v > 0), key=prio)
        fits = [a.id for a in group_agents if all(free[a.id].get(k, ZERO) >= request[k] for k in shape)]
        if not fits:
            return None
        sign = -1 if dispersed else 1
        return min(
            fits,
            key=lambda a: (len(kinds[a] - set(shape)), [sign * free[a].get(k, ZERO) for k in shape], a),
        )

    def consider(session: PendingSession, group: ScalingGroup, group_agents: list[AgentState]) -> str:
        verdict = checked(snapshot, session, group, concurrent, used)
        if verdict == "cancel":
            cancels.append(session.id)
            return "cancel"
        if verdict is not None:
            return verdict
        key = session.access_key
        total = total_of(session)
        dispersed = group.agent_selection == "dispersed"
        mapping = {}
        if session.cluster_mode == "multi-node":
            taken = []
            for kernel in session.kernels:
                chosen = best(group_agents, kernel.slots, dispersed)
                if chosen is None:
                    for agent_id, request in taken:
                        for k, v in request.items():
                            free[agent_id][k] += v
                    return StatusInfo.NO_AVAILABLE_INSTANCES
                for k, v in kernel.slots.items():
                    free[chosen][k] = free[chosen].get(k, ZERO) - v
                taken.append((chosen, kernel.slots))
                mapping[kernel.kernel_id] = chosen
        else:
            chosen = best(group_agents, total, dispersed)
            if chosen is None:
                return StatusInfo.NO_AVAILABLE_INSTANCES
            for k, v in total.items():
                free[chosen][k] = free[chosen].get(k, ZERO) - v
            mapping = {kernel.kernel_id: chosen for kernel in session.kernels}
        concurrent[key] = concurrent.get(key, 0) + 1
        mine = used.setdefault(key, {})
        for k, v in total.items():
            if v > 0:
                mine[k] = mine.get(k, ZERO) + v
        placements.append((session.id, mapping))
        return "placed"

    for name in sorted({s.scaling_group for s in snapshot.pending}):
        group = snapshot.scaling_groups.get(name, ScalingGroup(name))
        group_agents = [a for a in snapshot.agents if a.schedulable and a.scaling_group == name]
        sessions = sorted((s for s in snapshot.pending if s.scaling_group == name), key=lambda s: (s.created_at, s.id))
        left = []
        if group.policy in ("fifo", "lifo"):
            for session in sessions if group.policy == "fifo" else reversed(sessions):
                outcome = consider(session, group, group_agents)
                if outcome not in ("placed", "cancel"):
                    left.append((session.id, outcome))
        else:
            capacity: dict[str, Decimal] = {}
            for a in group_agents:
                for k, v in a.capacity.items():
                    capacity[k] = capacity.get(k, ZERO) + v

            def share(key: str, capacity: dict[str, Decimal] = capacity) -> Fraction:
                return max(
                    (
                        Fraction(v) / Fraction(capacity[k])
                        for k, v in used.get(key, {}).items()
                        if capacity.get(k, 0) > 0
                    ),
                    default=Fraction(0),
                )

            while sessions:
                oldest: dict[str, PendingSession] = {}
                for s in sessions:
                    oldest.setdefault(s.access_key, s)
                key = min(oldest, key=lambda k: (share(k), oldest[k].created_at, oldest[k].id))
                session = oldest[key]
                sessions.remove(session)
                outcome = consider(session, group, group_agents)
                if outcome not in ("placed", "cancel"):
                    left.append((session.id, outcome))
        pending.extend((sid, info, n) for n, (sid, info) in enumerate(left, 1))
    return placements, pending, cancels


@pytest.mark.parametrize("policy", ["fifo", "lifo", "drf"])
@pytest.mark.parametrize("selection", ["dispersed", "concentrated"])
@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_matches_the_reference(policy: str, selection: str, seed: int) -> None:
    snapshot = random_snapshot(seed, policy, selection)
    decisions = schedule(snapshot)
    placements, pending, cancels = reference(snapshot)
    assert [(p.session_id, dict(p.agents)) for p in decisions.placements] == placements
    assert [(p.session_id, p.status_info, p.position) for p in decisions.pending] == pending
    assert [c.session_id for c in decisions.cancels] == cancels
    # the random snapshot exercises every outcome
    assert placements and cancels
    assert {info for _, info, _ in pending} == {StatusInfo.PREDICATE_CHECKS_FAILED, StatusInfo.NO_AVAILABLE_INSTANCES}


def test_every_session_appears_exactly_once_and_agents_are_not_overcommitted() -> None:
    snapshot = random_snapshot(20261129, "fifo", "dispersed", n_sessions=600, n_agents=60)
    decisions = schedule(snapshot)
    seen = [p.session_id for p in decisions.placements]
    seen += [p.session_id for p in decisions.pending]
    seen += [c.session_id for c in decisions.cancels]
    assert sorted(seen) == sorted(s.id for s in snapshot.pending)
    by_id = {s.id: s for s in snapshot.pending}
    agents = {a.id: a for a in snapshot.agents}
    load: dict[str, dict[str, Decimal]] = {}
    for placement in decisions.placements:
        session = by_id[placement.session_id]
        assert set(placement.agents) == {k.kernel_id for k in session.kernels}
        for kernel in session.kernels:
            agent = agents[placement.agents[kernel.kernel_id]]
            assert agent.schedulable and agent.scaling_group == session.scaling_group
            mine = load.setdefault(agent.id, dict(agent.occupied))
            for k, v in kernel.slots.items():
                mine[k] = mine.get(k, ZERO) + v
                if v > 0:
                    assert mine[k] <= agent.capacity.get(k, ZERO), (agent.id, k)
    # positions are 1..n per scaling group
    positions: dict[str, list[int]] = {}
    for item in decisions.pending:
        positions.setdefault(by_id[item.session_id].scaling_group, []).append(item.position)
    assert all(p == list(range(1, len(p) + 1)) for p in positions.values())


# ----------------------------------------------------------------------------------------------
# The multifactor policy with backfill: its reference recomputes everything from scratch, in Decimals, at every
# step: the score of each session, each agent's room at every known end, every reservation's overlap.

INF_T = float("inf")


def random_multifactor_snapshot(seed: int, selection: str, depth: int) -> Snapshot:
    """A snapshot with priorities, durations, running sessions' ends and usage, under the multifactor policy."""
    import dataclasses

    base = random_snapshot(seed, "fifo", selection, n_sessions=120, n_agents=20)
    rnd = random.Random(seed * 31 + depth)
    group = ScalingGroup("g1", policy="multifactor", agent_selection=selection, reservations=depth)
    groups = {"g1": group, "g2": dataclasses.replace(group, name="g2", allowed_session_types=frozenset({"batch"}))}
    agents = []
    for a in base.agents:
        ends = []
        for slot, amount in a.occupied.items():  # what is held ends in one to three parts, some at unknown times
            left = amount
            for _ in range(rnd.randint(1, 3)):
                part = (left * Decimal(rnd.randint(3, 10)) / 10).quantize(Decimal("0.1"))
                if slot == "mem":
                    part = part.to_integral_value()
                if part <= 0 or rnd.random() < 0.3:
                    continue
                ends.append((NOW + timedelta(seconds=rnd.choice([0, 600, 1800, 3600, 3600, 7200])), {slot: part}))
                left -= part
        agents.append(dataclasses.replace(a, ends=tuple(ends)))
    pending = [
        dataclasses.replace(
            s,
            priority=rnd.choice([0, 10, 10, 10, 50, 100]),
            duration=rnd.choice([None, 300.0, 1800.0, 3600.0, 7200.0]),
            project_id=rnd.choice(["p1", "p2", "p3"]),
        )
        for s in base.pending
    ]
    usage = {f"AK{n}": float(rnd.randint(0, 5) * 1000) for n in range(6)}
    # projects' usage in every other snapshot (then a session's factor is its keypair's and its project's)
    projects = {f"p{n}": float(rnd.randint(0, 5) * 3000) for n in range(1, 4)} if seed % 2 else {}
    return dataclasses.replace(
        base, pending=pending, agents=agents, scaling_groups=groups, usage=usage, project_usage=projects
    )


def reference_multifactor(snapshot: Snapshot) -> tuple[list, list, list]:
    """Placements, (pending id, status_info, position, reservation) and cancels, by the rules as written."""
    now = snapshot.now
    free, kinds, concurrent, used = starting_state(snapshot)
    keys = {s.access_key for s in snapshot.pending} | set(snapshot.usage)
    total_usage = sum(max(0.0, snapshot.usage.get(k, 0.0)) for k in keys)
    total_share = float(len(keys))
    placements: list = []
    pending: list = []
    cancels: list = []

    projects = {s.project_id for s in snapshot.pending} | set(snapshot.project_usage)
    total_project_usage = sum(max(0.0, snapshot.project_usage.get(p, 0.0)) for p in projects)

    def fair(session: PendingSession) -> float:
        own = 1.0
        if total_usage > 0:
            own = 2.0 ** (-(max(0.0, snapshot.usage.get(session.access_key, 0.0)) / total_usage) / (1.0 / total_share))
        if len(projects) < 2 or total_project_usage <= 0:
            return own
        used = max(0.0, snapshot.project_usage.get(session.project_id, 0.0)) / total_project_usage
        return math.sqrt(own * 2.0 ** (-used / (1.0 / len(projects))))  # its keypair's and its project's

    def fits(room: Mapping[str, Decimal], request: Mapping[str, Decimal]) -> bool:
        return all(room.get(k, ZERO) >= v for k, v in request.items() if v > 0)

    def minus(a: Mapping[str, Decimal], b: Mapping[str, Decimal]) -> dict[str, Decimal]:
        return {k: a.get(k, ZERO) - b.get(k, ZERO) for k in a.keys() | b.keys()}

    def plus(a: Mapping[str, Decimal], b: Mapping[str, Decimal]) -> dict[str, Decimal]:
        return {k: a.get(k, ZERO) + b.get(k, ZERO) for k in a.keys() | b.keys()}

    def one_group(name: str) -> None:
        group = snapshot.scaling_groups.get(name, ScalingGroup(name))
        group_agents = sorted(
            (a for a in snapshot.agents if a.schedulable and a.scaling_group == name), key=lambda a: a.id
        )
        ids = [a.id for a in group_agents]
        capacity: dict[str, Decimal] = {}
        for a in group_agents:
            capacity = plus(capacity, a.capacity)
        ends = {a.id: [(max(0.0, (t - now).total_seconds()), dict(s)) for t, s in a.ends] for a in group_agents}
        holds: list[dict] = []  # {start, until, need: {agent: slots}, spare: {agent: slots}}
        first_hold: dict[str, float] = {}  # agent -> its first hold's start (in the order agents got one)
        dispersed = group.agent_selection == "dispersed"
        w = group.weights

        def score(s: PendingSession) -> float:
            total = total_of(s)
            size = max(
                (
                    float(Fraction(v) / Fraction(capacity[k]))
                    for k, v in total.items()
                    if v > 0 and capacity.get(k, 0) > 0
                ),
                default=0.0,
            )
            waited = (now - s.created_at).total_seconds()
            age = 0.0 if waited <= 0 else min(waited / w.max_age, 1.0)
            p = s.priority / 100
            return w.priority * p + w.fair_share * fair(s) + w.age * age + w.size * min(size, 1.0)

        def long_view(agent_id: str) -> dict[str, Decimal]:
            room = dict(free[agent_id])
            for h in holds:
                if agent_id in h["spare"]:
                    room = {k: min(v, h["spare"][agent_id].get(k, ZERO)) for k, v in room.items()}
            return {k: max(v, ZERO) for k, v in room.items()}

        def best(view: Mapping[str, Mapping[str, Decimal]], request: Mapping[str, Decimal]) -> str | None:
            shape = sorted((k for k, v in request.items() if v > 0), key=prio)
            ok = [a for a in ids if all(view[a].get(k, ZERO) >= request[k] for k in shape)]
            if not ok:
                return None
            sign = -1 if dispersed else 1
            return min(ok, key=lambda a: (len(kinds[a] - set(shape)), [sign * view[a].get(k, ZERO) for k in shape], a))

        def took(agent_id: str, request: Mapping[str, Decimal], end: float) -> None:
            free[agent_id] = minus(free[agent_id], request)
            for h in holds:
                if agent_id in h["spare"] and end > h["start"]:
                    h["spare"][agent_id] = minus(h["spare"][agent_id], request)
            if end < INF_T:
                ends[agent_id].append((end, dict(request)))

        def spread(rooms: Mapping[str, Mapping[str, Decimal]], kernels: list) -> dict[str, dict] | None:
            left = {a: dict(rooms[a]) for a in ids}
            need: dict[str, dict] = {}
            for request in sorted(kernels, key=lambda r: sorted(r.values(), reverse=True), reverse=True):
                for a in ids:
                    if fits(left[a], request):
                        left[a] = minus(left[a], request)
                        need[a] = plus(need.get(a, {}), request)
                        break
                else:
                    return None
            return need

        def usable(agent_id: str, t: float, length: float) -> dict[str, Decimal]:
            room = dict(free[agent_id])
            for te, slots in ends[agent_id]:
                if te <= t:
                    room = plus(room, slots)
            for h in holds:
                if agent_id in h["need"] and h["start"] < t + length and h["until"] > t:
                    room = minus(room, h["need"][agent_id])
            return room

        def reserve(session: PendingSession) -> tuple | None:
            length = INF_T if session.duration is None else session.duration
            multi = session.cluster_mode == "multi-node" and len(session.kernels) > 1
            kernels = [{k: v for k, v in kernel.slots.items() if v > 0} for kernel in session.kernels]
            total = {k: v for k, v in total_of(session).items() if v > 0}
            times = sorted(
                {0.0} | {t for a in ids for t, _ in ends[a]} | {h["until"] for h in holds if h["until"] < INF_T}
            )
            found = None
            for t in times:
                rooms = {a: usable(a, t, length) for a in ids}
                if multi:
                    need = spread(rooms, kernels)
                else:
                    first = next((a for a in ids if fits(rooms[a], total)), None)
                    need = None if first is None else {first: total}
                if need is not None:
                    found = (t, need)
                    break
            if found is None:  # drain: by capacity less every reservation, the agents with the most free first
                shape = sorted(total, key=prio)
                order = sorted(ids, key=lambda a: ([-free[a].get(k, ZERO) for k in shape], ids.index(a)))
                caps = {}
                for a in group_agents:
                    room = dict(a.capacity)
                    for h in holds:
                        if a.id in h["need"]:
                            room = minus(room, h["need"][a.id])
                    caps[a.id] = room
                if multi:
                    left = {a: dict(caps[a]) for a in order}
                    need = {}
                    for request in sorted(kernels, key=lambda r: sorted(r.values(), reverse=True), reverse=True):
                        for a in order:
                            if fits(left[a], request):
                                left[a] = minus(left[a], request)
                                need[a] = plus(need.get(a, {}), request)
                                break
                        else:
                            return None
                else:
                    first = next((a for a in order if fits(caps[a], total)), None)
                    if first is None:
                        return None
                    need = {first: total}
                start = 0.0
                starts_at = None
            else:
                start, need = found
                starts_at = now + timedelta(seconds=start)
            hold = {"start": start, "until": start + length, "need": need, "spare": {}}
            for a, request in need.items():
                hold["spare"][a] = minus(usable(a, start, length) if found else minus_holds(a, length), request)
            holds.append(hold)
            for a in need:
                first_hold.setdefault(a, start)
                first_hold[a] = min(first_hold[a], start)
            return (starts_at, tuple(sorted(need, key=ids.index)))

        def minus_holds(agent_id: str, length: float) -> dict[str, Decimal]:
            room = dict(free[agent_id])
            for h in holds:
                if agent_id in h["need"] and h["start"] < length and h["until"] > 0:
                    room = minus(room, h["need"][agent_id])
            return room

        def never_fits(session: PendingSession) -> bool:
            largest: dict[str, Decimal] = {}
            for a in group_agents:
                for k, v in a.capacity.items():
                    largest[k] = max(largest.get(k, ZERO), v)
            multi = session.cluster_mode == "multi-node" and len(session.kernels) > 1
            requests = [k.slots for k in session.kernels] if multi else [total_of(session)]
            return any(v > largest.get(k, ZERO) and largest.get(k) for r in requests for k, v in r.items())

        mine = [s for s in snapshot.pending if s.scaling_group == name]
        if group.policy == "multifactor":
            sessions = sorted(mine, key=lambda s: (-score(s), s.created_at, s.id))
        else:  # (a scaling group not configured: FIFO)
            sessions = sorted(mine, key=lambda s: (s.created_at, s.id))
        left = []
        for session in sessions:
            verdict = checked(snapshot, session, group, concurrent, used)
            if verdict == "cancel":
                cancels.append(session.id)
                continue
            if verdict is not None:
                left.append((session.id, verdict, None))
                continue
            key = session.access_key
            total = total_of(session)
            end = INF_T if session.duration is None else session.duration
            mapping: dict[str, str] = {}
            placed_ok = False
            if session.cluster_mode == "multi-node" and len(session.kernels) > 1:
                view = {a: long_view(a) for a in ids}
                taken = []
                for kernel in session.kernels:
                    chosen = best(view, kernel.slots)
                    if chosen is None:
                        break
                    view[chosen] = minus(view[chosen], {k: v for k, v in kernel.slots.items() if v > 0})
                    taken.append((chosen, kernel))
                else:
                    placed_ok = True
                    per_agent: dict[str, dict] = {}
                    for chosen, kernel in taken:
                        mapping[kernel.kernel_id] = chosen
                        per_agent[chosen] = plus(
                            per_agent.get(chosen, {}), {k: v for k, v in kernel.slots.items() if v > 0}
                        )
                    for chosen, request in per_agent.items():
                        took(chosen, request, end)
            else:
                request = {k: v for k, v in total.items() if v > 0}
                chosen = best({a: long_view(a) for a in ids}, request)
                if chosen is None and holds and end < INF_T:
                    chosen = next((a for a in first_hold if end <= first_hold[a] and fits(free[a], request)), None)
                if chosen is not None:
                    placed_ok = True
                    mapping = {kernel.kernel_id: chosen for kernel in session.kernels}
                    took(chosen, request, end)
            if placed_ok:
                concurrent[key] = concurrent.get(key, 0) + 1
                mine = used.setdefault(key, {})
                for k, v in total.items():
                    if v > 0:
                        mine[k] = mine.get(k, ZERO) + v
                placements.append((session.id, mapping))
                continue
            reservation = None
            if len(holds) < group.reservation_depth and ids and not never_fits(session):
                reservation = reserve(session)
            left.append((session.id, StatusInfo.NO_AVAILABLE_INSTANCES, reservation))
        pending.extend((sid, info, n, res) for n, (sid, info, res) in enumerate(left, 1))

    for name in sorted({s.scaling_group for s in snapshot.pending}):
        one_group(name)
    return placements, pending, cancels


@pytest.mark.parametrize("selection", ["dispersed", "concentrated"])
@pytest.mark.parametrize("depth", [1, 4])
@pytest.mark.parametrize("seed", [1, 2, 3, 12, 28, 34])  # (12, 28, 34 once differed: see the commit)
def test_multifactor_with_backfill_matches_the_reference(selection: str, depth: int, seed: int) -> None:
    snapshot = random_multifactor_snapshot(seed, selection, depth)
    decisions = schedule(snapshot)
    placements, pending, cancels = reference_multifactor(snapshot)
    assert [(p.session_id, dict(p.agents)) for p in decisions.placements] == placements
    got = [
        (
            p.session_id,
            p.status_info,
            p.position,
            (p.reservation.starts_at, p.reservation.agents) if p.reservation else None,
        )
        for p in decisions.pending
    ]
    assert got == pending
    assert [c.session_id for c in decisions.cancels] == cancels
    # the snapshot exercises reservations, with a known start and without
    reserved = [r for *_, r in pending if r is not None]
    assert reserved and len(reserved) <= depth * 2  # (two scaling groups)
