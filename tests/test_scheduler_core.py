"""Tests for the pure scheduling core, bai/node/scheduler/core.py, on hand-built snapshots."""

from __future__ import annotations

import copy
import dataclasses
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from bai.common.slots import parse_slots
from bai.common.status import StatusInfo
from bai.node.scheduler.core import decisions_by_session, schedule
from bai.node.scheduler.predicates import format_duration
from bai.node.scheduler.snapshot import (
    DEPENDENCY_FAILED,
    PREDICATES,
    AgentState,
    Cancel,
    Decisions,
    DependencyState,
    KernelRequest,
    KeypairState,
    Pending,
    PendingSession,
    Placement,
    ProjectState,
    ResourcePolicy,
    ScalingGroup,
    Snapshot,
)

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
T0 = NOW - timedelta(hours=1)
GiB = 1024**3
PENDING_FAILED = StatusInfo.PREDICATE_CHECKS_FAILED
NO_ROOM = StatusInfo.NO_AVAILABLE_INSTANCES


def slots(cpu: object = 1, mem: object = "1g", **extra: object) -> dict[str, Decimal]:
    raw = {"cpu": cpu, "mem": mem, **{k.replace("_", "."): v for k, v in extra.items()}}
    return parse_slots({k: v for k, v in raw.items() if v is not None})


def agent(agent_id: str, cpu: object = 8, mem: object = "8g", *, used: dict | None = None, group="default", **extra):
    return AgentState(agent_id, group, slots(cpu, mem, **extra), parse_slots(used or {}))


def sess(
    sid: str,
    cpu: object = 1,
    mem: object = "1g",
    *,
    t: float = 0,
    ak: str = "AKIA1",
    group: str = "default",
    kind: str = "interactive",
    kernels: int = 1,
    mode: str = "single-node",
    extra: dict | None = None,
    **kw,
) -> PendingSession:
    request = slots(cpu, mem, **(extra or {}))
    reqs = tuple(KernelRequest(f"{sid}-k{n}", request, "main" if n == 0 else "sub", max(n, 1)) for n in range(kernels))
    return PendingSession(
        sid, f"name-{sid}", ak, kind, group, reqs, created_at=T0 + timedelta(seconds=t), cluster_mode=mode, **kw
    )


def snap(pending, agents, *, keypairs=None, deps=None, groups=None, policy="fifo", selection="dispersed") -> Snapshot:
    if groups is None:
        groups = {"default": ScalingGroup("default", policy=policy, agent_selection=selection)}
    return Snapshot(NOW, list(pending), list(agents), keypairs or {}, deps or {}, groups)


def placed(decisions: Decisions) -> list[str]:
    return [p.session_id for p in decisions.placements]


def where(decisions: Decisions) -> dict[str, str]:
    """session id -> its agent (single-node placements)."""
    out = {}
    for p in decisions.placements:
        (agent_id,) = set(p.agents.values())
        out[p.session_id] = agent_id
    return out


def pending_of(decisions: Decisions, sid: str) -> Pending:
    item = decisions_by_session(decisions)[sid]
    assert isinstance(item, Pending), item
    return item


def failed_names(item: Pending) -> list[str]:
    return [p.name for p in item.predicates if not p.passed]


def keypair(ak="AKIA1", *, concurrent=0, used=None, **policy) -> KeypairState:
    return KeypairState(ak, ResourcePolicy(**policy), concurrent, parse_slots(used or {}))


# ----------------------------------------------------------------------------------------------
# Order


def test_fifo_considers_oldest_first_whatever_the_input_order() -> None:
    sessions = [sess("new", 2, t=3), sess("old", 2, t=1), sess("mid", 2, t=2)]
    d = schedule(snap(sessions, [agent("a1", 4)]))
    assert placed(d) == ["old", "mid"]
    assert [(p.session_id, p.position) for p in d.pending] == [("new", 1)]


def test_fifo_breaks_created_at_ties_by_id() -> None:
    d = schedule(snap([sess("b", 2), sess("a", 2), sess("c", 2)], [agent("a1", 4)]))
    assert placed(d) == ["a", "b"]


def test_lifo_considers_newest_first() -> None:
    sessions = [sess("old", 2, t=1), sess("mid", 2, t=2), sess("new", 2, t=3)]
    d = schedule(snap(sessions, [agent("a1", 4)], policy="lifo"))
    assert placed(d) == ["new", "mid"]
    assert [p.session_id for p in d.pending] == ["old"]


def test_drf_order_computed_by_hand_for_three_keypairs() -> None:
    # Group capacity: cpu 20, mem 20g (two agents). Initial dominant shares:
    #   A: cpu 2/20 = .10   B: mem 3g/20g = .15   C: 0
    # A's sessions: cpu 2 mem 1g (+.10 cpu); B's: cpu 1 mem 2g (+.10 mem); C's: cpu 4 mem 1g (+.20 cpu)
    # picks: C(0) c1 -> C .20; A(.10) a1 -> A .20; B(.15) b1 -> B .25; A .20 = C .20, A's oldest
    # pending (a2, t=4) is older than C's (c2, t=6) -> a2, A .30; C(.20) c2 -> C .40; B(.25) b2 ->
    # B .35; A(.30) a3 -> A .40.
    keypairs = {
        "A": keypair("A", used={"cpu": 2}),
        "B": keypair("B", used={"mem": "3g"}),
        "C": keypair("C"),
    }
    sessions = [
        sess("a1", 2, "1g", t=1, ak="A"),
        sess("b1", 1, "2g", t=2, ak="B"),
        sess("c1", 4, "1g", t=3, ak="C"),
        sess("a2", 2, "1g", t=4, ak="A"),
        sess("b2", 1, "2g", t=5, ak="B"),
        sess("c2", 4, "1g", t=6, ak="C"),
        sess("a3", 2, "1g", t=7, ak="A"),
    ]
    agents = [agent("x1", 10, "10g"), agent("x2", 10, "10g")]
    d = schedule(snap(sessions, agents, keypairs=keypairs, policy="drf"))
    assert placed(d) == ["c1", "a1", "b1", "a2", "c2", "b2", "a3"]
    fifo = schedule(snap(sessions, agents, keypairs=keypairs, policy="fifo"))
    assert placed(fifo) == ["a1", "b1", "c1", "a2", "b2", "c2", "a3"]


def test_drf_a_keypair_that_cannot_place_does_not_stall_the_others() -> None:
    keypairs = {"A": keypair("A"), "B": keypair("B", used={"cpu": 1})}
    sessions = [sess("a-huge", 100, t=1, ak="A"), sess("a2", 1, t=2, ak="A"), sess("b1", 1, t=3, ak="B")]
    d = schedule(snap(sessions, [agent("x", 10)], keypairs=keypairs, policy="drf"))
    # A (share 0) goes first: a-huge fails and leaves A's share alone, so a2 is next, then b1
    assert placed(d) == ["a2", "b1"]
    assert [(p.session_id, p.status_info, p.position) for p in d.pending] == [("a-huge", NO_ROOM, 1)]


# ----------------------------------------------------------------------------------------------
# Agent choice


def three_agents() -> list[AgentState]:
    return [
        agent("a1", 8, "8g", used={"cpu": 6, "mem": "6g"}),  # 2 cpu, 2g free
        agent("a2", 8, "8g", used={"cpu": 3, "mem": "3g"}),  # 5 cpu, 5g free
        agent("a3", 8, "8g"),  # 8 cpu, 8g free
    ]


def test_dispersed_spreads_to_the_agent_with_most_room() -> None:
    sessions = [sess("s1", 2, t=1), sess("s2", 2, t=2), sess("s3", 2, t=3)]
    d = schedule(snap(sessions, three_agents(), selection="dispersed"))
    # s1: a3 (8) -> 6 left; s2: a3 (6 > 5) -> 4; s3: a2 (5 > 4)
    assert where(d) == {"s1": "a3", "s2": "a3", "s3": "a2"}


def test_concentrated_packs_the_fullest_agent_that_fits() -> None:
    sessions = [sess("s1", 2, t=1), sess("s2", 3, t=2), sess("s3", 1, t=3)]
    d = schedule(snap(sessions, three_agents(), selection="concentrated"))
    # s1: a1 (2 free, exact); s2: a2 (5, a1 is full); s3: a2 (2 left, less than a3's 8)
    assert where(d) == {"s1": "a1", "s2": "a2", "s3": "a2"}


def test_ties_go_to_the_lowest_agent_id() -> None:
    agents = [agent("b", 4), agent("a", 4), agent("c", 4)]
    for selection in ("dispersed", "concentrated"):
        d = schedule(snap([sess("s1", 1)], agents, selection=selection))
        assert where(d) == {"s1": "a"}


def test_second_slot_breaks_ties_on_the_first() -> None:
    agents = [agent("a1", 8, "4g"), agent("a2", 8, "6g")]
    assert where(schedule(snap([sess("s", 1)], agents, selection="dispersed"))) == {"s": "a2"}
    assert where(schedule(snap([sess("s", 1)], agents, selection="concentrated"))) == {"s": "a1"}


def test_cpu_only_session_avoids_the_gpu_agent_while_another_fits() -> None:
    agents = [agent("gpu", 64, "256g", cuda_shares=4), agent("cpu", 4, "8g")]
    sessions = [
        sess("c1", 2, t=1),
        sess("c2", 2, t=2),
        sess("c3", 2, t=3),
        sess("g1", 1, extra={"cuda_shares": 1}, t=4),
    ]
    d = schedule(snap(sessions, agents))
    # dispersed would prefer the roomier GPU host, but it has an extra slot type (cuda.shares)
    assert where(d) == {"c1": "cpu", "c2": "cpu", "c3": "gpu", "g1": "gpu"}


def test_device_slots_come_first_in_the_priority_order() -> None:
    agents = [agent("g1", 64, "64g", cuda_shares=2), agent("g2", 8, "8g", cuda_shares=4)]
    d = schedule(snap([sess("s", 1, extra={"cuda_shares": "0.5"})], agents))
    assert where(d) == {"s": "g2"}  # more cuda.shares left beats more cpu


def test_no_head_of_line_blocking() -> None:
    sessions = [sess("huge", 100, t=0)] + [sess(f"small{n}", 1, t=n + 1) for n in range(5)]
    d = schedule(snap(sessions, [agent("a1", 8)]))
    assert placed(d) == [f"small{n}" for n in range(5)]
    huge = pending_of(d, "huge")
    assert huge.status_info == NO_ROOM
    assert huge.msg == "needs cpu 100; the only agent has 8"  # more than the agent has at all
    assert all(p.passed for p in huge.predicates) and [p.name for p in huge.predicates] == list(PREDICATES)


def test_no_room_message_lists_every_short_slot() -> None:
    d = schedule(snap([sess("s", 4, "16g")], [agent("a1", 4, "16g", used={"cpu": "2", "mem": "13g"})]))
    assert pending_of(d, "s").msg == (
        "no agent has room: best is a1 with cpu 2 free of 4 requested, mem 3GiB free of 16GiB requested"
    )


def test_a_session_no_agent_could_ever_hold_names_the_first_slot_too_large() -> None:
    agents = [agent("a1", 2, "4g"), agent("a2", 2, "8g", used={"cpu": "1"})]
    d = schedule(snap([sess("s", 64, "1g")], agents))
    assert pending_of(d, "s").status_info == NO_ROOM  # the decision is as before: only the words changed
    assert pending_of(d, "s").msg == "needs cpu 64; the largest agent has 2"
    d = schedule(snap([sess("s", 2, "64g")], agents))
    assert pending_of(d, "s").msg == "needs mem 64 GiB; the largest agent has 8 GiB"
    d = schedule(snap([sess("s", 64, "64g")], agents[:1]))
    assert pending_of(d, "s").msg == "needs cpu 64; the only agent has 2"  # cpu first
    # one that fits an idle agent but not now still waits, saying for what
    d = schedule(snap([sess("s", 2, "1g")], agents[1:]))
    assert pending_of(d, "s").msg == "no agent has room: best is a2 with cpu 1 free of 2 requested"
    # a multi-node session: the kernel that no agent can hold
    big = sess("m", 1, "1g", kernels=2, mode="multi-node")
    big = dataclasses.replace(big, kernels=(big.kernels[0], dataclasses.replace(big.kernels[1], slots=slots(3, "1g"))))
    d = schedule(snap([big], agents))
    assert pending_of(d, "m").msg == "kernel sub1 (2 of 2) needs cpu 3; the largest agent has 2"


@pytest.mark.parametrize("selection", ["dispersed", "concentrated"])
def test_no_room_names_the_roomiest_agent_lowest_id_first(selection: str) -> None:
    agents = [
        agent("b", 16, used={"cpu": "12"}),
        agent("a", 16, used={"cpu": "12"}),
        agent("c", 16, used={"cpu": "14"}),
        agent("g", 16, "8g", used={"cpu": "10"}, cuda_shares=1),
    ]
    d = schedule(snap([sess("s", 10)], agents, selection=selection))
    assert pending_of(d, "s").msg == "no agent has room: best is g with cpu 6 free of 10 requested"
    d = schedule(snap([sess("s", 10)], agents[:3], selection=selection))
    assert pending_of(d, "s").msg == "no agent has room: best is a with cpu 4 free of 10 requested"


def test_no_agent_in_the_scaling_group() -> None:
    groups = {"default": ScalingGroup("default"), "gpu": ScalingGroup("gpu")}
    agents = [agent("a1"), agent("a2", group="other")]
    d = schedule(snap([sess("s1", group="gpu"), sess("s2", group="nowhere")], agents, groups=groups))
    assert pending_of(d, "s1").msg == "no schedulable agent in scaling group gpu"
    assert pending_of(d, "s2").msg == (
        "no schedulable agent in scaling group nowhere (the scaling group is not configured)"
    )
    assert pending_of(d, "s2").status_info == NO_ROOM


def test_unschedulable_agents_are_not_used() -> None:
    off = agent("a0", 64)
    off.schedulable = False
    d = schedule(snap([sess("s1", 2), sess("s2", 2)], [off, agent("a1", 2)]))
    assert where(d) == {"s1": "a1"}
    assert pending_of(d, "s2").msg == "no agent has room: best is a1 with cpu 0 free of 2 requested"


def test_a_slot_no_agent_offers() -> None:
    d = schedule(snap([sess("s", 1, extra={"cuda_device": 1})], [agent("a1")]))
    assert pending_of(d, "s").msg == "no agent in scaling group default has cuda.device"


def test_unknown_scaling_group_with_agents_uses_defaults() -> None:
    d = schedule(snap([sess("s", 1, group="edge")], [agent("e1", group="edge")], groups={}))
    assert where(d) == {"s": "e1"}


def test_amounts_finer_than_milli_units_stay_exact() -> None:
    request = {"cpu": Decimal("0.0004"), "mem": Decimal(1024)}
    sessions = [
        PendingSession(
            f"s{n}", "x", "AKIA1", "batch", "default", (KernelRequest("k", request),), created_at=T0 + timedelta(n)
        )
        for n in range(3)
    ]
    d = schedule(snap(sessions, [agent("a1", "0.001", "1g")]))
    assert placed(d) == ["s0", "s1"]
    assert pending_of(d, "s2").msg == "no agent has room: best is a1 with cpu 0.0002 free of 0.0004 requested"


# ----------------------------------------------------------------------------------------------
# Predicates


def test_reserved_time_in_the_future_waits_and_in_the_past_passes() -> None:
    later = sess("later", starts_at=NOW + timedelta(minutes=5, seconds=3))
    past = sess("past", starts_at=NOW - timedelta(seconds=1), t=1)
    d = schedule(snap([later, past], [agent("a1")]))
    assert placed(d) == ["past"]
    item = pending_of(d, "later")
    assert item.status_info == PENDING_FAILED
    assert item.msg == "starts at 2026-11-29T12:05:03+00:00 (in 5m 3s)"
    assert failed_names(item) == ["reserved_time"]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.2, "1s"), (59, "59s"), (303, "5m 3s"), (3605, "1h 0m 5s"), (2 * 86400 + 7200, "2d 2h 0m 0s")],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def deps_snapshot(dep: DependencyState | None, dep_id: str = "dep-1") -> Snapshot:
    return snap([sess("s", depends_on=(dep_id,))], [agent("a1")], deps={dep.session_id: dep} if dep is not None else {})


def test_dependency_with_success_lets_the_session_start() -> None:
    d = schedule(deps_snapshot(DependencyState("dep-1", "build", "TERMINATED", "SUCCESS")))
    assert placed(d) == ["s"]


def test_dependency_still_running_keeps_the_session_waiting() -> None:
    d = schedule(deps_snapshot(DependencyState("dep-1", "build", "RUNNING", "UNDEFINED")))
    item = pending_of(d, "s")
    assert item.status_info == PENDING_FAILED
    assert item.msg == "waiting for session build (RUNNING)"
    assert failed_names(item) == ["dependencies"]


@pytest.mark.parametrize(("status", "result"), [("TERMINATED", "FAILURE"), ("CANCELLED", "UNDEFINED"), ("ERROR", "")])
def test_dependency_that_ended_without_success_cancels_the_session(status: str, result: str) -> None:
    d = schedule(deps_snapshot(DependencyState("dep-1", "build", status, result)))
    assert d.placements == [] and d.pending == []
    assert d.cancels == [
        Cancel("s", DEPENDENCY_FAILED, f"session build (dep-1) ended without success: {status}/{result}")
    ]


def test_unknown_dependency_cancels_the_session() -> None:
    d = schedule(deps_snapshot(None, "ghost"))
    assert d.cancels == [Cancel("s", "dependency-failed", "depends on session ghost, which does not exist")]


def test_dependency_cancel_wins_over_other_failures_and_waits_are_listed_together() -> None:
    deps = {
        "d1": DependencyState("d1", "one", "RUNNING", "UNDEFINED"),
        "d2": DependencyState("d2", "two", "PENDING", "UNDEFINED"),
        "d3": DependencyState("d3", "three", "ERROR", "FAILURE"),
    }
    sessions = [
        sess("waits", depends_on=("d1", "d2")),
        sess("dies", depends_on=("d1", "d3"), starts_at=NOW + timedelta(1)),
    ]
    d = schedule(snap(sessions, [agent("a1")], deps=deps))
    assert pending_of(d, "waits").msg == "waiting for session one (RUNNING), session two (PENDING)"
    assert [c.session_id for c in d.cancels] == ["dies"]
    assert pending_of(d, "waits").position == 1


def test_scaling_group_allowed_session_types() -> None:
    groups = {"default": ScalingGroup("default", allowed_session_types=frozenset({"interactive"}))}
    d = schedule(snap([sess("b", kind="batch"), sess("i", kind="interactive")], [agent("a1")], groups=groups))
    assert placed(d) == ["i"]
    item = pending_of(d, "b")
    assert item.msg == "scaling group default does not allow batch sessions"
    assert failed_names(item) == ["allowed_session_types"]


def test_image_minimum_resources() -> None:
    minimum = slots(1, "1g")
    small = sess("small", 1, "512m", image="python:3.11", image_min=minimum)
    both = sess("both", "0.5", "512m", image="python:3.11", image_min=minimum, t=1)
    ok = sess("ok", 1, "1g", image="python:3.11", image_min=minimum, t=2)
    d = schedule(snap([small, both, ok], [agent("a1")]))
    assert placed(d) == ["ok"]
    assert pending_of(d, "small").msg == "image python:3.11 needs at least mem 1GiB per kernel, requested 512MiB"
    assert pending_of(d, "both").msg == (
        "image python:3.11 needs at least cpu 1, mem 1GiB per kernel, requested cpu 0.5, mem 512MiB"
    )
    assert failed_names(pending_of(d, "small")) == ["image_min_resources"]


def test_concurrency_counts_sessions_placed_earlier_in_the_round() -> None:
    keypairs = {"AKIA1": keypair(concurrent=1, max_concurrent_sessions=3)}
    sessions = [sess(f"s{n}", t=n) for n in range(4)]
    d = schedule(snap(sessions, [agent("a1")], keypairs=keypairs))
    assert placed(d) == ["s0", "s1"]
    for position, sid in enumerate(["s2", "s3"], 1):
        item = pending_of(d, sid)
        assert item.msg == "keypair AKIA1 has 3/3 concurrent sessions"
        assert failed_names(item) == ["concurrency"]
        assert item.position == position


def test_concurrency_zero_is_unlimited_and_other_keypairs_are_not_counted() -> None:
    keypairs = {"AKIA1": keypair(concurrent=50), "AKIA2": keypair("AKIA2", max_concurrent_sessions=1)}
    sessions = [sess("a", t=1), sess("b", ak="AKIA2", t=2), sess("c", ak="AKIA2", t=3), sess("d", t=4)]
    d = schedule(snap(sessions, [agent("a1")], keypairs=keypairs))
    assert placed(d) == ["a", "b", "d"]
    assert pending_of(d, "c").msg == "keypair AKIA2 has 1/1 concurrent sessions"


def test_keypair_resource_limit_counts_this_round() -> None:
    keypairs = {"AKIA1": keypair(used={"cpu": 1}, name="P", total_resource_slots=slots(4, "100g"))}
    d = schedule(snap([sess("s1", 2, t=1), sess("s2", 2, t=2), sess("s3", 1, t=3)], [agent("a1")], keypairs=keypairs))
    assert placed(d) == ["s1", "s3"]
    item = pending_of(d, "s2")
    assert item.msg == "keypair AKIA1 would use cpu 5 of its 4 (policy P)"
    assert failed_names(item) == ["keypair_resource_limit"]


def test_keypair_resource_limit_unspecified_slots_limited_or_unlimited() -> None:
    gpu = sess("g", 1, extra={"cuda_shares": 1})
    agents = [agent("a1", cuda_shares=4)]
    limited = {"AKIA1": keypair(name="P", total_resource_slots=slots(4, "8g"), default_for_unspecified="LIMITED")}
    d = schedule(snap([gpu], agents, keypairs=limited))
    assert pending_of(d, "g").msg == "keypair AKIA1 would use cuda.shares 1 of its 0 (policy P)"
    unlimited = {"AKIA1": keypair(name="P", total_resource_slots=slots(4, "8g"), default_for_unspecified="UNLIMITED")}
    assert placed(schedule(snap([gpu], agents, keypairs=unlimited))) == ["g"]


def test_keypair_resource_limit_infinity_is_unlimited_and_lists_all_short_slots() -> None:
    policy = {"name": "P", "total_resource_slots": {"cpu": Decimal("Infinity"), "mem": Decimal(2 * GiB)}}
    d = schedule(snap([sess("s", 100, "4g")], [agent("a1", 128, "8g")], keypairs={"AKIA1": keypair(**policy)}))
    assert pending_of(d, "s").msg == "keypair AKIA1 would use mem 4GiB of its 2GiB (policy P)"
    policy["total_resource_slots"] = {"cpu": Decimal(1), "mem": Decimal(2 * GiB)}
    d = schedule(snap([sess("s", 100, "4g")], [agent("a1", 128, "8g")], keypairs={"AKIA1": keypair(**policy)}))
    assert pending_of(d, "s").msg == "keypair AKIA1 would use cpu 100 of its 1, mem 4GiB of its 2GiB (policy P)"


def test_every_failing_predicate_is_reported() -> None:
    groups = {"default": ScalingGroup("default", allowed_session_types=frozenset({"interactive"}))}
    keypairs = {
        "AKIA1": keypair(
            concurrent=3, used={"cpu": 3}, name="P", max_concurrent_sessions=3, total_resource_slots=slots(4, None)
        )
    }
    deps = {"d1": DependencyState("d1", "build", "RUNNING", "UNDEFINED")}
    bad = sess(
        "bad",
        2,
        "512m",
        kind="batch",
        starts_at=NOW + timedelta(minutes=5, seconds=3),
        depends_on=("d1",),
        image="py",
        image_min=slots(1, "1g"),
    )
    bad = dataclasses.replace(bad, project_id="p-ml", domain_name="acme")
    snapshot = snap([bad], [agent("a1")], keypairs=keypairs, deps=deps, groups=groups)
    caps = {
        "projects": {"p-ml": ProjectState("p-ml", "ml", {"cpu": Decimal(3)}, {"cpu": Decimal(2)})},
        "domains": {"acme": ProjectState("acme", "acme", {"cpu": Decimal(1)})},
    }
    d = schedule(dataclasses.replace(snapshot, **caps))
    item = pending_of(d, "bad")
    assert item.status_info == PENDING_FAILED
    # every one but session_networks (a session of one kernel holds no network: tested in test_owner_limits.py)
    assert failed_names(item) == [p for p in PREDICATES if p != "session_networks"]
    assert item.msg.split("; ") == [
        "starts at 2026-11-29T12:05:03+00:00 (in 5m 3s)",
        "waiting for session build (RUNNING)",
        "scaling group default does not allow batch sessions",
        "image py needs at least mem 1GiB per kernel, requested 512MiB",
        "keypair AKIA1 has 3/3 concurrent sessions",
        "keypair AKIA1 would use cpu 5 of its 4 (policy P)",
        "project ml has 2/3 CPU cores (asks 2 more)",
        "domain acme has 0/1 CPU cores (asks 2 more)",
    ]
    assert [p.msg for p in item.predicates if not p.passed] == item.msg.split("; ")
    data = item.status_data(NOW)["scheduler"]
    assert data["retries"] == 1 and data["last_try"] == NOW.isoformat()
    assert [p["name"] for p in data["failed_predicates"]] == failed_names(item)
    assert data["passed_predicates"] == [{"name": "session_networks"}]


def test_status_data_for_no_available_instances() -> None:
    d = schedule(snap([sess("s", 100, retries=4)], [agent("a1")]))
    data = pending_of(d, "s").status_data(NOW)
    assert data == {"scheduler": {"retries": 5, "last_try": NOW.isoformat(), "msg": pending_of(d, "s").msg}}


def test_passing_predicates_and_placement_leave_quota_for_later_groups() -> None:
    # keypair quotas are shared by scaling groups: a session placed in "a" counts in "b"
    groups = {"a": ScalingGroup("a"), "b": ScalingGroup("b")}
    keypairs = {"AKIA1": keypair(max_concurrent_sessions=1)}
    agents = [agent("x", group="a"), agent("y", group="b")]
    d = schedule(
        snap([sess("in-b", group="b"), sess("in-a", group="a", t=1)], agents, keypairs=keypairs, groups=groups)
    )
    assert placed(d) == ["in-a"]
    assert pending_of(d, "in-b").msg == "keypair AKIA1 has 1/1 concurrent sessions"


# ----------------------------------------------------------------------------------------------
# Multi-kernel sessions


def test_single_node_puts_every_kernel_on_one_agent() -> None:
    d = schedule(snap([sess("s", 3, kernels=3)], [agent("a1", 4), agent("a2", 16)]))
    assert d.placements == [Placement("s", {"s-k0": "a2", "s-k1": "a2", "s-k2": "a2"})]


def test_single_node_stays_pending_when_only_the_sum_over_agents_would_fit() -> None:
    d = schedule(snap([sess("s", 3, kernels=2)], [agent("a1", 4), agent("a2", 4)]))
    item = pending_of(d, "s")
    assert item.status_info == NO_ROOM
    assert item.msg == "needs cpu 6; the largest agent has 4"  # the kernels' sum, on one agent


def test_multi_node_spreads_kernels_when_needed() -> None:
    d = schedule(snap([sess("s", 3, kernels=2, mode="multi-node")], [agent("a1", 4), agent("a2", 4)]))
    assert d.placements == [Placement("s", {"s-k0": "a1", "s-k1": "a2"})]
    assert d.placements[0].agent_ids == ("a1", "a2")


def test_multi_node_may_put_kernels_together() -> None:
    d = schedule(snap([sess("s", 1, kernels=3, mode="multi-node")], [agent("a1", 8), agent("a2", 4)]))
    # dispersed: a1 (8) -> 7 -> 6, then a1 6 > a2 4 still
    assert d.placements == [Placement("s", {"s-k0": "a1", "s-k1": "a1", "s-k2": "a1"})]


def test_multi_node_is_all_or_nothing() -> None:
    agents = [agent("a1", 4), agent("a2", 4)]
    sessions = [sess("three", 3, kernels=3, mode="multi-node", t=1), sess("w1", 4, t=2), sess("w2", 4, t=3)]
    d = schedule(snap(sessions, agents))
    item = pending_of(d, "three")
    assert item.msg == "kernel sub2 (3 of 3): no agent has room: best is a1 with cpu 1 free of 3 requested"
    # the two tentative reservations were rolled back: both whole agents are still free
    assert where(d) == {"w1": "a1", "w2": "a2"}


def test_multi_node_rollback_then_same_request_fits_again_after_nothing_changed() -> None:
    agents = [agent("a1", 4), agent("a2", 4)]
    sessions = [sess("big", 3, kernels=3, mode="multi-node", t=1), sess("two", 3, kernels=2, mode="multi-node", t=2)]
    d = schedule(snap(sessions, agents))
    assert placed(d) == ["two"]


def test_a_session_without_kernels_is_left_pending() -> None:
    empty = PendingSession("e", "e", "AKIA1", "interactive", "default", (), created_at=T0)
    d = schedule(snap([empty], [agent("a1")]))
    assert pending_of(d, "e").msg == "the session has no kernels"


# ----------------------------------------------------------------------------------------------
# Bookkeeping


def test_positions_follow_the_policy_order_per_scaling_group() -> None:
    groups = {"a": ScalingGroup("a"), "b": ScalingGroup("b", policy="lifo")}
    agents = [agent("x", 2, group="a"), agent("y", 2, group="b")]
    sessions = [sess(f"{g}{n}", 2, group=g, t=n) for g in "ab" for n in range(4)]
    d = schedule(snap(sessions, agents, groups=groups))
    assert placed(d) == ["a0", "b3"]
    assert [(p.session_id, p.position) for p in d.pending] == [
        ("a1", 1),
        ("a2", 2),
        ("a3", 3),
        ("b2", 1),
        ("b1", 2),
        ("b0", 3),
    ]


def test_callers_agent_objects_are_not_mutated() -> None:
    agents = three_agents()
    before = copy.deepcopy(agents)
    d = schedule(snap([sess(f"s{n}", 1, t=n) for n in range(6)], agents))
    assert len(d.placements) == 6
    assert agents == before
    # and a second round from the same snapshot decides the same
    assert schedule(snap([sess(f"s{n}", 1, t=n) for n in range(6)], agents)) == d


def test_unknown_policy_or_selection_raises() -> None:
    with pytest.raises(ValueError, match="policy"):
        schedule(snap([sess("s")], [agent("a1")], policy="mof"))
    with pytest.raises(ValueError, match="strategy"):
        schedule(snap([sess("s")], [agent("a1")], selection="legacy"))


def test_empty_snapshot() -> None:
    assert schedule(snap([], [agent("a1")])) == Decisions()


def test_a_dependency_that_succeeded_but_is_still_terminating_is_waited_for() -> None:
    d = schedule(deps_snapshot(DependencyState("dep-1", "build", "TERMINATING", "SUCCESS")))
    assert not d.placements and not d.cancels
    [pending] = d.pending
    assert "waiting for session build (TERMINATING)" in pending.msg


def test_sessions_mounting_folders_go_only_to_agents_that_see_their_host() -> None:
    import dataclasses

    blind = dataclasses.replace(agent("a-blind", cpu=16), vfolder_hosts=frozenset())
    seeing = dataclasses.replace(agent("b-sees", cpu=2), vfolder_hosts=frozenset({"local"}))
    # dispersed would pick the emptier blind agent; the folder's host decides
    mounting = sess("m", 1, vfolder_hosts=frozenset({"local"}))
    plain = sess("p", 1, t=1)
    d = schedule(snap([mounting, plain], [blind, seeing]))
    assert where(d) == {"m": "b-sees", "p": "a-blind"}
    # no agent with room sees the host: pending, and the reason says so
    too_big = sess("big", 4, vfolder_hosts=frozenset({"local"}))
    d = schedule(snap([too_big], [blind, seeing]))
    assert pending_of(d, "big").msg == "no agent that sees vfolder host local has room"
    other = sess("o", 1, vfolder_hosts=frozenset({"nfs"}))
    d = schedule(snap([other], [blind, seeing]))
    assert pending_of(d, "o").msg == "no agent of scaling group default sees vfolder host nfs"


@pytest.mark.parametrize("collecting", [True, False])
def test_the_garbage_collector_is_left_as_it_was(collecting: bool) -> None:
    import gc

    was = gc.isenabled()
    try:
        gc.enable() if collecting else gc.disable()
        schedule(snap([sess("s1")], [agent("a1")]))
        assert gc.isenabled() is collecting
        with pytest.raises(ValueError):
            schedule(snap([sess("s1")], [agent("a1")], policy="nope"))
        assert gc.isenabled() is collecting
    finally:
        gc.enable() if was else gc.disable()
