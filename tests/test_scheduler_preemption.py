"""Preemption in the pure core, on hand-built snapshots: which running sessions a blocked session of a higher
priority stops (and which never), whole satisfaction only, the same plan again in the next rounds while the stop
is under way, and what a waiting session is told."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from bai.node.scheduler.core import decisions_by_session, schedule
from bai.node.scheduler.preemption import PREEMPTION_DEPTH
from bai.node.scheduler.snapshot import (
    KeypairState,
    Pending,
    Placement,
    ResourcePolicy,
    RunningSession,
    ScalingGroup,
    Snapshot,
)
from tests.test_scheduler_backfill import gpu_agent, gpus
from tests.test_scheduler_core import NO_ROOM, NOW, PENDING_FAILED, placed, sess, slots

ON = {"default": ScalingGroup("default", policy="multifactor", preemption=True)}


def running(
    sid: str,
    gpus_on: dict[str, int],
    *,
    priority: int = 1,
    started: float = 3600,
    kind: str = "batch",
    preemptible: bool = True,
    ak: str = "AKlow",
    preempting_for: str | None = None,
) -> RunningSession:
    """A running session holding `gpus_on` {agent: GPUs} (and one core there), started `started` s ago."""
    return RunningSession(
        sid,
        f"name-{sid}",
        ak,
        kind,
        "default",
        priority,
        tuple((a, slots(1, "1g", cuda_device=n)) for a, n in gpus_on.items()),
        started_at=NOW - timedelta(seconds=started),
        preemptible=preemptible,
        preempting_for=preempting_for,
    )


def busy(agent_id: str, held: list[RunningSession], total: int = 8):
    used = sum(dict(r.held).get(agent_id, {}).get("cuda.device", 0) for r in held)
    return gpu_agent(agent_id, total, int(used))


def big(sid: str = "urgent", n: int = 8, priority: int = 50, **kw):
    return sess(sid, 1, "1g", extra=gpus(n)["extra"], priority=priority, **kw)


def rnd(pending, agents, run, groups=ON, **kw) -> Snapshot:
    return Snapshot(NOW, list(pending), list(agents), scaling_groups=groups, running=list(run), **kw)


def preempted(decisions) -> list[str]:
    return [p.session_id for p in decisions.preemptions]


def test_off_by_default_and_who_may_be_stopped() -> None:
    low = [running("low1", {"a1": 4}, priority=1), running("low2", {"a1": 4}, priority=3)]
    agents = [busy("a1", low)]
    # off (the default): the urgent session waits like any other
    groups = {"default": ScalingGroup("default", policy="multifactor")}
    decisions = schedule(rnd([big()], agents, low, groups=groups))
    assert preempted(decisions) == [] and decisions.pending[0].status_info == NO_ROOM
    # on: both must stop for 8 GPUs; the waiting session says so and keeps a1
    decisions = schedule(rnd([big()], agents, low))
    assert sorted(preempted(decisions)) == ["low1", "low2"]
    (waiting,) = decisions.pending
    assert waiting.preempting == ("low1", "low2")
    assert "preempting name-low1, name-low2 on a1: starts once they have ended" in waiting.msg
    assert waiting.reservation is not None and waiting.reservation.agents == ("a1",)
    assert "preempted by name-urgent (priority 50)" in decisions.preemptions[0].msg
    # never: equal priority, above preemptible_priority (5), not preemptible, too young for the minimum runtime
    for never in (
        running("x", {"a1": 8}, priority=50),
        running("x", {"a1": 8}, priority=6),
        running("x", {"a1": 8}, preemptible=False),
        running("x", {"a1": 8}, started=30),
    ):
        groups = {"default": replace(ON["default"], preemption_min_runtime=60.0)}
        decisions = schedule(rnd([big()], [busy("a1", [never])], [never], groups=groups))
        assert preempted(decisions) == [], never


def test_only_whole_satisfaction_and_the_fewest_victims() -> None:
    # a1: one 6-GPU low session, 2 GPUs held by a session that may not be stopped: 8 never fit there
    keep = running("keep", {"a1": 2}, preemptible=False)
    six = running("six", {"a1": 6})
    decisions = schedule(rnd([big()], [busy("a1", [keep, six])], [keep, six]))
    assert preempted(decisions) == []  # stopping `six` alone would not make room: nobody is stopped
    # a1 needs three stops, a2 one: a2 is chosen, and on it the lowest priority that suffices
    on_a1 = [running(f"s{n}", {"a1": 2}) for n in range(4)]
    on_a2 = [running("one", {"a2": 6}, priority=4), running("tiny", {"a2": 2}, priority=0)]
    agents = [busy("a1", on_a1), busy("a2", on_a2)]
    decisions = schedule(rnd([big(n=6)], agents, on_a1 + on_a2))
    assert preempted(decisions) == ["one"]  # `tiny` (priority 0) was tried first and handed back: not needed
    # among equal priorities, the oldest first (Backend.AI's default order), or the newest
    pair = [running("old", {"a1": 4}, started=7200), running("new", {"a1": 4}, started=60)]
    agents = [gpu_agent("a1", 8, 8)]
    assert preempted(schedule(rnd([big(n=4)], agents, pair))) == ["old"]
    newest = {"default": replace(ON["default"], preemption_order="newest")}
    assert preempted(schedule(rnd([big(n=4)], agents, pair, groups=newest))) == ["new"]


def test_the_next_rounds_keep_the_plan_and_stop_nobody_more() -> None:
    low = [running("low1", {"a1": 4}), running("low2", {"a1": 4})]
    agents = [busy("a1", low)]
    first = schedule(rnd([big()], agents, low))
    assert sorted(preempted(first)) == ["low1", "low2"]
    # the next round: both being stopped for it (and another low session elsewhere): nothing new is stopped
    under_way = [replace(r, preempting_for="urgent") for r in low]
    other = running("other", {"a2": 8})
    again = schedule(rnd([big()], [*agents, busy("a2", [other])], [*under_way, other]))
    assert preempted(again) == []
    (waiting,) = again.pending
    assert waiting.preempting == ("low1", "low2")
    # once they have ended, it starts there
    done = schedule(rnd([big()], [gpu_agent("a1", 8, 0), busy("a2", [other])], [other]))
    assert placed(done) == ["urgent"]
    # sessions being stopped for another session are not counted for this one
    elsewhere = [replace(r, preempting_for="someone-else") for r in low]
    assert preempted(schedule(rnd([big()], agents, elsewhere))) == []


def test_one_victim_for_one_session_and_the_free_room_kept() -> None:
    # a1: 4 GPUs free, 4 held by a low session; two urgent sessions of 8: the first stops it, the second finds
    # nobody left to stop; a small session after them does not take the 4 free GPUs the first one needs
    low = [running("low", {"a1": 4})]
    agents = [busy("a1", low)]
    small = sess("small", 1, "1g", extra=gpus(4)["extra"], priority=10, t=900)
    decisions = schedule(rnd([big("u1", t=0), big("u2", t=10), small], agents, low))
    assert preempted(decisions) == ["low"]
    by = decisions_by_session(decisions)
    assert isinstance(by["u1"], Pending) and by["u1"].preempting == ("low",)
    assert isinstance(by["u2"], Pending) and by["u2"].preempting == ()
    assert isinstance(by["small"], Pending)  # a1's free GPUs are kept for u1


def test_never_for_the_sessions_own_limits() -> None:
    low = [running("low", {"a1": 8})]
    limited = KeypairState(
        "AKIA1", ResourcePolicy("tight", total_resource_slots=slots(64, "256g", cuda_device=4)), 0, {}
    )
    decisions = schedule(rnd([big()], [busy("a1", low)], low, keypairs={"AKIA1": limited}))
    assert preempted(decisions) == []
    (waiting,) = decisions.pending
    assert waiting.status_info == PENDING_FAILED and "keypair_resource_limit" in [
        p.name for p in waiting.predicates if not p.passed
    ]


def test_a_multi_node_session_and_a_multi_node_victim() -> None:
    # two kernels of 8 GPUs on two agents; a1 is held by a low session of two kernels (a1 and a3), a2 is free
    gang = running("gang", {"a1": 8, "a3": 8})
    agents = [gpu_agent("a1", 8, 8), gpu_agent("a2", 8, 0), gpu_agent("a3", 8, 8)]
    urgent = sess("urgent", 1, "1g", extra=gpus(8)["extra"], priority=50, kernels=2, mode="multi-node")
    decisions = schedule(rnd([urgent], agents, [gang]))
    assert preempted(decisions) == ["gang"]
    (waiting,) = decisions.pending
    assert waiting.reservation is not None and set(waiting.reservation.agents) <= {"a1", "a2", "a3"}
    # with room for both kernels, nobody is stopped and it starts
    decisions = schedule(rnd([urgent], [gpu_agent("a1", 8, 0), gpu_agent("a2", 8, 0)], []))
    assert isinstance(decisions_by_session(decisions)["urgent"], Placement)


# -- properties over random clusters (single-node sessions of GPUs) --------------------------------------------


_running = st.lists(
    st.tuples(st.integers(0, 2), st.integers(1, 4), st.integers(0, 8), st.booleans()),  # agent, GPUs, priority, ok
    max_size=8,
)


@settings(max_examples=150, deadline=None)
@given(_running, st.integers(1, 8), st.integers(1, 12))
def test_victims_make_room_are_all_needed_and_are_never_protected(held, need, priority) -> None:
    group = ON["default"]
    run, used = [], {f"a{n}": 0 for n in range(3)}
    for n, (a, g, p, ok) in enumerate(held):
        if used[f"a{a}"] + g > 8:
            continue
        used[f"a{a}"] += g
        run.append(running(f"r{n}", {f"a{a}": g}, priority=p, preemptible=ok))
    agents = [gpu_agent(a, 8, u) for a, u in used.items()]
    decisions = schedule(rnd([big(n=need, priority=priority)], agents, run))
    chosen = {p.session_id for p in decisions.preemptions}
    by_id = {r.id: r for r in run}
    fits_now = any(8 - u >= need for u in used.values())
    if fits_now:
        assert placed(decisions) == ["urgent"] and not chosen
        return
    eligible = [r for r in run if r.preemptible and r.priority < priority and r.priority <= group.preemptible_priority]
    could = any(
        8 - used[a] + sum(dict(r.held)[a]["cuda.device"] for r in eligible if a in dict(r.held)) >= need for a in used
    )
    assert bool(chosen) == could  # whole satisfaction: stops exactly when stopping can make room
    if not chosen:
        return
    victims = [by_id[v] for v in chosen]
    assert all(v in eligible for v in victims)
    (agent_id,) = {a for v in victims for a, _ in v.held}  # all on the one agent it will start on
    freed = sum(dict(v.held)[agent_id]["cuda.device"] for v in victims)
    assert 8 - used[agent_id] + freed >= need  # it fits once they have ended
    for v in victims:  # and each one is needed
        assert 8 - used[agent_id] + freed - dict(v.held)[agent_id]["cuda.device"] < need


# -- a reference: the documented rules read literally, on full clusters of several waiting sessions --------------


def reference_preemptions(snapshot: Snapshot, group: ScalingGroup, order: dict[str, int]) -> dict[str, tuple[str, ...]]:
    """{pending id: the running sessions stopped for it}, every agent full (nothing starts), sessions considered
    in queue order (`order`: each one's place; the multifactor order has a reference of its own)."""
    agents = sorted(a.id for a in snapshot.agents)
    free = {a.id: a.capacity.get("cuda.device", 0) - a.occupied.get("cuda.device", 0) for a in snapshot.agents}
    claimed: set[str] = set()
    out: dict[str, tuple[str, ...]] = {}
    tries = 0  # the front of the queue only: PREEMPTION_DEPTH sessions with someone to stop
    eligible = [r for r in snapshot.running if r.preemptible and r.priority <= group.preemptible_priority]
    for s in sorted(snapshot.pending, key=lambda p: order[p.id]):
        if not any(r.priority < s.priority for r in eligible if r.id not in claimed):
            continue
        if tries == PREEMPTION_DEPTH:
            break
        tries += 1
        need = sum(k.slots.get("cuda.device", 0) for k in s.kernels)
        best = None
        for a in agents:
            on = [
                r
                for r in snapshot.running
                if any(where == a for where, _ in r.held)
                and r.id not in claimed
                and r.preemptible
                and r.priority < s.priority
                and r.priority <= group.preemptible_priority
            ]
            on.sort(key=lambda r: (r.priority, r.started_at, r.id))
            room, taken = free[a], []
            for r in on:
                taken.append(r)
                room += dict(r.held)[a]["cuda.device"]
                if room >= need:
                    break
            if room < need:
                continue
            for r in sorted(taken[:-1], key=lambda r: -r.priority):
                if room - dict(r.held)[a]["cuda.device"] >= need:
                    taken.remove(r)
                    room -= dict(r.held)[a]["cuda.device"]
            cost = (len(taken), sum(len(r.held) > 1 for r in taken), sum(r.priority for r in taken), agents.index(a))
            if best is None or cost < best[0]:
                best = (cost, tuple(r.id for r in taken))
        if best is not None:
            claimed.update(best[1])
            out[s.id] = best[1]
    return out


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 4), st.integers(0, 7), st.booleans()), min_size=4, max_size=14
    ),
    st.lists(st.tuples(st.integers(1, 8), st.integers(0, 30)), min_size=1, max_size=7),
)
def test_the_core_stops_whom_the_reference_stops(held, waiting) -> None:
    group = ON["default"]
    run, used = [], {f"a{n}": 0 for n in range(4)}
    for n, (a, g, p, ok) in enumerate(held):
        if used[f"a{a}"] + g <= 8:
            used[f"a{a}"] += g
            run.append(running(f"r{n}", {f"a{a}": g}, priority=p, preemptible=ok, started=600 + 60 * n))
    # what nobody holds is held by sessions that may not be stopped: every agent full
    run += [running(f"keep-{a}", {a: 8 - u}, preemptible=False) for a, u in used.items() if u < 8]
    agents = [gpu_agent(a, 8, 8) for a in used]
    pending = [big(f"w{n}", n=g, priority=p, t=n) for n, (g, p) in enumerate(waiting)]
    snapshot = rnd(pending, agents, run)
    decisions = schedule(snapshot)
    assert placed(decisions) == []
    got = {w.session_id: w.preempting for w in decisions.pending if w.preempting}
    order = {w.session_id: w.position for w in decisions.pending}
    assert got == reference_preemptions(snapshot, group, order)
