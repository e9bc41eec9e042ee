"""Tests for bai/node/scheduler/fifo.py: FIFO placement with dispersed agent choice."""

from __future__ import annotations

from decimal import Decimal

from bai.common.status import StatusInfo
from bai.node.scheduler.fifo import AgentState, PendingSession, Placement, schedule

GiB = Decimal(1024**3)


def agent(agent_id: str, cpu: int | str, mem_gib: int = 8, **kw) -> AgentState:
    return AgentState(agent_id, {"cpu": Decimal(cpu), "mem": mem_gib * GiB}, {}, **kw)


def session(session_id: str, cpu: int | str = 1, mem_gib: int | str = 1, **kw) -> PendingSession:
    return PendingSession(session_id, {"cpu": Decimal(cpu), "mem": Decimal(mem_gib) * GiB}, (f"k-{session_id}",), **kw)


def test_places_in_queue_order() -> None:
    decisions = schedule([session("s1"), session("s2"), session("s3")], [agent("a1", 8)])
    assert [p.session_id for p in decisions.placements] == ["s1", "s2", "s3"]
    assert all(p.agent_id == "a1" for p in decisions.placements)
    assert decisions.unschedulable == []


def test_queue_order_decides_who_gets_scarce_room() -> None:
    decisions = schedule([session("first", 2), session("second", 2)], [agent("a1", 2)])
    assert decisions.placements == [Placement("first", "a1")]
    assert [u.session_id for u in decisions.unschedulable] == ["second"]


def test_dispersed_choice_picks_the_emptier_agent() -> None:
    busy = agent("a-busy", 8)
    busy.occupied = {"cpu": Decimal(6), "mem": 2 * GiB}
    idle = agent("z-idle", 8)
    decisions = schedule([session("s1")], [busy, idle])
    assert decisions.placements == [Placement("s1", "z-idle")]


def test_dispersed_choice_spreads_sessions() -> None:
    decisions = schedule([session("s1"), session("s2")], [agent("a1", 4), agent("a2", 4)])
    assert {p.agent_id for p in decisions.placements} == {"a1", "a2"}


def test_too_big_is_unschedulable_without_blocking_smaller_ones() -> None:
    agents = [agent("a1", 4, 4), agent("a2", 2, 4)]
    decisions = schedule([session("huge", 16, 2), session("small", 1, 1)], agents)
    assert [u.session_id for u in decisions.unschedulable] == ["huge"]
    info = decisions.unschedulable[0]
    assert info.status_info == StatusInfo.NO_AVAILABLE_INSTANCES == "no-available-instances"
    assert "cpu 16 requested, 4 free" in info.msg
    assert "a1" in info.msg
    assert "mem" not in info.msg  # mem fits, so it is not named as a shortfall
    assert [p.session_id for p in decisions.placements] == ["small"]


def test_memory_shortfall_is_named() -> None:
    decisions = schedule([session("s1", 1, 16)], [agent("a1", 4, 8)])
    assert "mem 16GiB requested, 8GiB free" in decisions.unschedulable[0].msg


def test_capacity_is_consumed_within_one_round() -> None:
    a1 = agent("a1", 2)
    decisions = schedule([session("s1"), session("s2"), session("s3")], [a1])
    assert [p.session_id for p in decisions.placements] == ["s1", "s2"]
    assert [u.session_id for u in decisions.unschedulable] == ["s3"]
    assert decisions.unschedulable[0].status_info == "no-available-instances"
    assert a1.occupied["cpu"] == 2
    assert a1.free["cpu"] == 0


def test_existing_occupation_is_respected() -> None:
    a1 = agent("a1", 4)
    a1.occupied = {"cpu": Decimal("3.5"), "mem": GiB}
    decisions = schedule([session("s1", 1)], [a1])
    assert decisions.placements == []
    assert "cpu 1 requested, 0.5 free" in decisions.unschedulable[0].msg


def test_no_agents_in_scaling_group() -> None:
    decisions = schedule([session("s1", scaling_group="gpu")], [agent("a1", 8)])
    assert decisions.placements == []
    [info] = decisions.unschedulable
    assert info.session_id == "s1"
    assert info.status_info == "no-available-instances"
    assert "'gpu'" in info.msg


def test_no_agents_at_all() -> None:
    decisions = schedule([session("s1")], [])
    assert decisions.placements == []
    assert "'default'" in decisions.unschedulable[0].msg


def test_scaling_groups_are_kept_apart() -> None:
    agents = [agent("cpu-node", 8), agent("gpu-node", 8, scaling_group="gpu")]
    decisions = schedule([session("s1", scaling_group="gpu"), session("s2")], agents)
    assert decisions.placements == [Placement("s1", "gpu-node"), Placement("s2", "cpu-node")]


def test_non_schedulable_agents_are_skipped() -> None:
    agents = [agent("draining", 64, 64, schedulable=False), agent("small", 2)]
    decisions = schedule([session("s1", 1)], agents)
    assert decisions.placements == [Placement("s1", "small")]


def test_only_non_schedulable_agents_means_unschedulable() -> None:
    decisions = schedule([session("s1")], [agent("draining", 64, schedulable=False)])
    assert decisions.placements == []
    assert decisions.unschedulable[0].status_info == "no-available-instances"


def test_multi_kernel_sessions_need_room_for_every_kernel() -> None:
    pending = PendingSession("s1", {"cpu": Decimal(2), "mem": GiB}, ("k1", "k2", "k3"))
    decisions = schedule([pending], [agent("a1", 4)])
    assert decisions.placements == []
    assert "cpu 6 requested, 4 free" in decisions.unschedulable[0].msg
