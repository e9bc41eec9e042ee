"""The multifactor policy (priority, fair share, age, size) and backfill with reservations, in the pure core, on
hand-built snapshots: who goes first and why, where a blocked session is reserved and by when, and which later
sessions may start without delaying it."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from decimal import Decimal

import pytest

from bai.node.scheduler.core import decisions_by_session, schedule
from bai.node.scheduler.multifactor import fair_share_factors
from bai.node.scheduler.snapshot import AgentState, Pending, Placement, Reservation, ScalingGroup, Snapshot, Weights
from tests.test_scheduler_core import NO_ROOM, NOW, agent, placed, sess, slots

HOUR = 3600.0
MF = {"default": ScalingGroup("default", policy="multifactor")}


def gpus(n: int, **kw) -> dict:
    return {"extra": {"cuda_device": n}, **kw}


def gpu_agent(agent_id: str, total: int = 8, used: int = 0, ends: tuple = (), **kw) -> AgentState:
    a = agent(agent_id, 64, "256g", cuda_device=total, used={"cuda.device": used} if used else None, **kw)
    a.ends = tuple((NOW + timedelta(seconds=t), slots(0, 0, cuda_device=n)) for t, n in ends)
    return a


def mf(pending, agents, **kw) -> Snapshot:
    groups = kw.pop("groups", MF)
    return Snapshot(NOW, list(pending), list(agents), scaling_groups=groups, **kw)


# -- the order ------------------------------------------------------------------------------------------------


def test_priority_goes_first_then_fair_share_then_age() -> None:
    one_core = [agent("a1", 1, "8g")]  # room for one session: the first in line takes it
    urgent = sess("urgent", t=300, priority=90)
    old = sess("old", t=0)
    decisions = schedule(mf([old, urgent], one_core))
    assert placed(decisions) == ["urgent"]
    # fair share: yesterday's heavy user waits behind today's light one, whatever their age
    heavy, light = sess("heavy", t=0, ak="AKheavy"), sess("light", t=600, ak="AKlight")
    decisions = schedule(mf([heavy, light], one_core, usage={"AKheavy": 9e6, "AKlight": 1e6}))
    assert placed(decisions) == ["light"]
    (waiting,) = decisions.pending
    assert waiting.factors is not None and waiting.factors.fair_share == pytest.approx(2 ** -(0.9 / 0.5))
    # age: a session waiting a day has the whole age factor; one just in, none
    fresh = sess("fresh", t=3600 + 0)
    stale = sess("stale", t=-86400 * 2)
    by = decisions_by_session(schedule(mf([fresh, stale, sess("x", t=0)], [agent("a1", 1, "8g")])))
    assert isinstance(by["stale"], Placement)
    assert by["fresh"].factors.age == 0.0  # type: ignore[union-attr]


def test_the_bigger_session_first_among_equals_and_factors_add_up() -> None:
    weights = Weights(priority=0, fair_share=0, age=0, size=100)
    groups = {"default": ScalingGroup("default", policy="multifactor", weights=weights)}
    small, big = sess("small", 1, "1g", t=0), sess("big", 4, "1g", t=10)
    decisions = schedule(mf([small, big], [agent("a1", 4, "8g")], groups=groups))
    assert placed(decisions) == ["big"]
    (left,) = decisions.pending
    assert left.factors is not None and left.factors.size == pytest.approx(1 / 4)
    assert left.factors.score == pytest.approx(100 * 0.25)


def test_fair_share_factors() -> None:
    assert fair_share_factors({}, {}, ["a", "b"]) == {"a": 1.0, "b": 1.0}  # nobody used anything
    f = fair_share_factors({"a": 50.0, "b": 50.0}, {}, ["a", "b"])
    assert f == {"a": 0.5, "b": 0.5}  # each used exactly its share
    f = fair_share_factors({"a": 100.0}, {}, ["a", "b"])
    assert f["a"] == 0.25 and f["b"] == 1.0  # a used the cluster, twice its share
    f = fair_share_factors({"a": 50.0, "b": 50.0}, {"a": 3.0}, ["a", "b"])
    assert f["a"] > f["b"]  # a larger share: the same usage weighs less


# -- backfill ---------------------------------------------------------------------------------------------------


def test_a_blocked_session_is_reserved_and_only_what_ends_before_it_backfills() -> None:
    # a1: 6 of 8 GPUs held until +1 h; the head wants all 8
    agents = [gpu_agent("a1", 8, used=6, ends=((HOUR, 6),))]
    head = sess("head", 1, "1g", t=0, priority=50, duration=2 * HOUR, **gpus(8))
    short = sess("short", 1, "1g", t=10, duration=HOUR / 2, **gpus(2))
    long_ = sess("long", 1, "1g", t=20, duration=2 * HOUR, **gpus(2))
    forever = sess("forever", 1, "1g", t=30, **gpus(2))
    decisions = schedule(mf([head, short, long_, forever], agents))
    assert placed(decisions) == ["short"]  # it ends (+30 min) before head can start (+1 h): it delays nothing
    by = decisions_by_session(decisions)
    reserved = by["head"]
    assert isinstance(reserved, Pending) and reserved.status_info == NO_ROOM
    assert reserved.reservation is not None and reserved.reservation.agents == ("a1",)
    assert reserved.reservation.starts_at == NOW + timedelta(hours=1)
    assert "reserved: starts by 2026-11-29 13:00 UTC on a1" in reserved.msg
    assert reserved.status_data(NOW)["scheduler"]["reservation"]["agents"] == ["a1"]
    # both would still hold GPUs at +1 h: they are reserved after head (from +1 h, for its 2 h), beside each other
    for late in ("long", "forever"):
        assert by[late].reservation == Reservation(NOW + timedelta(hours=3), ("a1",))  # type: ignore[union-attr]
    # the same where the agent says how much of each GPU is free (real NVIDIA agents do): the same backfill, and
    # the short session's GPUs packed onto free devices; a session of two kernels on one node backfills alike
    figures = [dataclasses.replace(agents[0], gpu_free=(Decimal(0),) * 6 + (Decimal(1),) * 2)]
    two = sess("two-kernels", 1, "1g", t=11, duration=HOUR / 2, kernels=2, **gpus(1))
    decisions = schedule(mf([head, short, long_, forever], figures))
    assert placed(decisions) == ["short"]
    decisions = schedule(mf([head, two, long_, forever], agents))
    assert placed(decisions) == ["two-kernels"]


def test_backfill_uses_other_agents_and_the_spare_room_of_a_reserved_one() -> None:
    # a1: 4 of 8 GPUs until +1 h; head wants 6 of it at +1 h: 2 GPUs stay spare even then (one reservation)
    agents = [gpu_agent("a1", 8, used=4, ends=((HOUR, 4),)), gpu_agent("a2", 2)]
    one = {"default": ScalingGroup("default", policy="multifactor", reservations=1)}
    head = sess("head", 1, "1g", t=0, priority=50, **gpus(6))
    spare = sess("spare", 1, "1g", t=10, **gpus(2))  # unknown length: fits the spare room of a1
    other = sess("other", 1, "1g", t=20, **gpus(2))  # unknown length: a2
    third = sess("third", 1, "1g", t=30, **gpus(2))  # no spare left anywhere
    decisions = schedule(mf([head, spare, other, third], agents, groups=one))
    by = decisions_by_session(decisions)
    assert set(placed(decisions)) == {"spare", "other"}
    assert by["third"].reservation is None and by["head"].reservation is not None  # type: ignore[union-attr]
    # one on a2, one in the 2 GPUs a1 has to spare even after head starts there
    assert sorted(a for p in decisions.placements for a in p.agent_ids) == ["a1", "a2"]


def test_sessions_of_unknown_length_keep_the_reserved_agent_for_the_blocked_one() -> None:
    agents = [gpu_agent("a1", 8, used=6), gpu_agent("a2", 8, used=7)]  # nothing known ends on either
    head = sess("head", 1, "1g", t=0, priority=50, **gpus(8))
    one = sess("one", 1, "1g", t=10, duration=60, **gpus(1))
    two = sess("two", 1, "1g", t=20, duration=60, **gpus(1))
    decisions = schedule(mf([head, one, two], agents))
    by = decisions_by_session(decisions)
    reservation = by["head"].reservation  # type: ignore[union-attr]
    # the agent with the most free now is kept for it: nothing starts there that would still run when it can start
    assert reservation is not None and reservation.starts_at is None and reservation.agents == ("a1",)
    assert "a1 kept for it until their running sessions (of unknown length) end" in by["head"].msg  # type: ignore[union-attr]
    assert placed(decisions) == ["one"] and decisions.placements[0].agent_ids == ("a2",)
    assert isinstance(by["two"], Pending)  # a2 is full now, and a1 is kept


def test_a_multi_node_session_is_reserved_over_several_agents() -> None:
    agents = [
        gpu_agent("a1", 8, used=8, ends=((HOUR, 8),)),
        gpu_agent("a2", 8, used=8, ends=((2 * HOUR, 8),)),
        gpu_agent("a3", 8, used=8),  # unknown
    ]
    head = sess("head", 1, "1g", t=0, priority=50, kernels=2, mode="multi-node", **gpus(8))
    decisions = schedule(mf([head], agents))
    (pending,) = decisions.pending
    assert pending.reservation is not None
    assert pending.reservation.agents == ("a1", "a2") and pending.reservation.starts_at == NOW + timedelta(hours=2)


def test_reservations_follow_the_depth_and_other_policies_have_none_by_default() -> None:
    agents = [gpu_agent("a1", 8, used=8, ends=((HOUR, 8),)), gpu_agent("a2", 8, used=8, ends=((2 * HOUR, 8),))]
    first = sess("first", 1, "1g", t=0, duration=3 * HOUR, **gpus(8))
    second = sess("second", 1, "1g", t=10, **gpus(8))
    one = {"default": ScalingGroup("default", policy="multifactor", reservations=1)}
    reserved = [p.session_id for p in schedule(mf([first, second], agents, groups=one)).pending if p.reservation]
    assert reserved == ["first"]
    # the default (4): second too, on a2 (free from +2 h) rather than after first on a1 (+4 h)
    pending = {p.session_id: p.reservation for p in schedule(mf([first, second], agents)).pending}
    assert pending["first"].agents == ("a1",) and pending["second"].agents == ("a2",)  # type: ignore[union-attr]
    assert pending["second"].starts_at == NOW + timedelta(hours=2)  # type: ignore[union-attr]
    # a1 and a2 both free at +1 h: first takes a1 for 3 h, second takes a2 at +1 h too
    same = [gpu_agent("a1", 8, used=8, ends=((HOUR, 8),)), gpu_agent("a2", 8, used=8, ends=((HOUR, 8),))]
    pending = {p.session_id: p.reservation for p in schedule(mf([first, second], same)).pending}
    assert pending["second"].agents == ("a2",) and pending["second"].starts_at == NOW + timedelta(hours=1)  # type: ignore[union-attr]
    # only a1 ever frees: second waits for first's 3 h there
    single = [gpu_agent("a1", 8, used=8, ends=((HOUR, 8),))]
    pending = {p.session_id: p.reservation for p in schedule(mf([first, second], single)).pending}
    assert pending["second"].starts_at == NOW + timedelta(hours=4)  # type: ignore[union-attr]
    fifo = {"default": ScalingGroup("default", policy="fifo")}
    assert all(p.reservation is None for p in schedule(mf([first, second], agents, groups=fifo)).pending)


def test_a_session_no_agent_could_ever_hold_gets_no_reservation() -> None:
    decisions = schedule(mf([sess("huge", 1, "1g", **gpus(16))], [gpu_agent("a1", 8)]))
    (pending,) = decisions.pending
    assert pending.reservation is None and pending.msg.startswith("needs cuda.device 16")


def test_fair_share_counts_the_project_too() -> None:
    one_core = [agent("a1", 1, "8g")]
    # two keypairs that used the same; one's project used the cluster, the other's nothing: the latter goes first
    heavy_team = sess("heavy-team", t=0, ak="AKa", project_id="pA")
    light_team = sess("light-team", t=600, ak="AKb", project_id="pB")
    usage = {"AKa": 5e5, "AKb": 5e5}
    decisions = schedule(mf([heavy_team, light_team], one_core, usage=usage, project_usage={"pA": 9e6}))
    assert placed(decisions) == ["light-team"]
    (waiting,) = decisions.pending
    assert waiting.factors is not None and waiting.factors.fair_share == pytest.approx((0.5 * 0.25) ** 0.5)
    # one project only: nothing to compare, the keypairs alone decide (the older first here)
    same = [sess("first", t=0, ak="AKa", project_id="pA"), sess("second", t=600, ak="AKb", project_id="pA")]
    decisions = schedule(mf(same, one_core, usage=usage, project_usage={"pA": 9e6}))
    assert placed(decisions) == ["first"] and decisions.pending[0].factors.fair_share == 0.5  # type: ignore[union-attr]
