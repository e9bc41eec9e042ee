"""The contract of the state layer's sessions and kernels, agents, accounts, folders, images and logs: the same
tests for every
implementation (SQLite today; PostgreSQL next), through the protocols and records of
`bai.node.manager.state` only: no SQL, nothing of an implementation's insides.

An implementation joins by adding a factory to IMPLEMENTATIONS (an async context manager giving its state).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import msgspec
import pytest

from bai.common.status import IllegalTransition, SessionStatus
from bai.node.manager.state import (
    AccountState,
    AgentState,
    FolderState,
    ImageState,
    LogState,
    SessionState,
    StorageFull,
)
from bai.node.manager.state import Store as SQLiteStore
from bai.node.manager.state.postgres import PgStore
from bai.node.manager.state.records import (
    Agent,
    AgentCapacity,
    Dotfile,
    FolderChanges,
    FolderShare,
    HistorySearch,
    ImageAlias,
    Kernel,
    KernelChanges,
    Keypair,
    LogChunk,
    LogKept,
    NewAgent,
    NewKernel,
    NewKeypair,
    NewSession,
    NewVFolder,
    Policy,
    PolicyFields,
    SchedulingAttempt,
    SeenVFolder,
    Session,
    Transition,
    VFolder,
    stamp,
)
from bai.node.manager.state.team_records import user_uuid
from tests import pgserver


class State(SessionState, AgentState, AccountState, FolderState, ImageState, LogState, Protocol):
    """Every domain of this contract (an implementation is all of them)."""


@asynccontextmanager
async def sqlite_state(tmp_path: Path) -> AsyncIterator[Any]:
    store = await SQLiteStore.open(tmp_path / "state.db", log_max_bytes=64 * 1024)
    try:
        yield store
    finally:
        await store.close()


@asynccontextmanager
async def postgres_state(tmp_path: Path) -> AsyncIterator[Any]:
    server = pgserver.shared()
    store = await PgStore.open_url(server.new_database(), "the test database", log_max_bytes=64 * 1024)
    try:
        yield store
    finally:
        await store.close()


IMPLEMENTATIONS: dict[str, Callable[[Path], AbstractAsyncContextManager[Any]]] = {
    "sqlite": sqlite_state,
    "postgresql": postgres_state,
}
T2020 = datetime(2020, 1, 1, 12, 0, tzinfo=UTC)
T2040 = datetime(2040, 6, 30, 23, 59, 59, 123456, tzinfo=UTC)
SLOTS = {"cpu": "4", "mem": "8589934592"}


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
async def state(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[State]:
    async with IMPLEMENTATIONS[request.param](tmp_path) as impl:
        yield impl


@pytest.fixture(params=[T2020, T2040], ids=["2020", "2040"])
def now(request: pytest.FixtureRequest) -> datetime:
    return request.param  # type: ignore[no-any-return]


def agent(agent_id: str = "a1", group: str = "default", slots: dict[str, str] | None = None) -> NewAgent:
    return NewAgent(agent_id, f"host-{agent_id}", "sim", "0.1", group, slots or SLOTS)


# -- sessions and kernels ---------------------------------------------------------------------------------

S = SessionStatus
SID1 = "3f2b1c9e-0000-4000-8000-000000000001"
SID2 = "7a7a7a7a-0000-4000-8000-000000000002"
SID3 = "3f2b1c9e-0000-4000-8000-000000000003"


def new_session(
    session_id: str = SID1,
    name: str = "sess-1",
    owner: str = "AK1",
    created_at: datetime = T2020,
    slots: dict[str, str] | None = None,
    **kw: Any,
) -> NewSession:
    config = {"mounts": [], "depends_on": [], "nested": {"a": [1, None]}}
    return NewSession(
        session_id, name, owner, "python:3.11", "INTERACTIVE", slots or SLOTS, {"A": "1"}, config, "default",
        created_at, **kw,
    )  # fmt: skip


def kernels_for(session_id: str, size: int = 1) -> list[NewKernel]:
    """main1, sub1 … as create gives them, here given last sub first (their order is the state's to keep)."""
    subs = [NewKernel(f"{session_id}-sub{i}", "sub", i, {"cpu": "1"}) for i in range(size - 1, 0, -1)]
    return [*subs, NewKernel(f"{session_id}-main1", "main", 1, SLOTS)]


async def create(state: State, session_id: str = SID1, size: int = 1, **kw: Any) -> Session:
    assert await state.create_session(new_session(session_id, **kw), kernels_for(session_id, size)) is None
    created = await state.get_session(session_id)
    assert created is not None
    return created


async def snapshot(state: State, session_id: str) -> tuple[Any, ...]:
    """All that is stored of a session: to see that a refused write changed nothing."""
    return (
        await state.get_session(session_id),
        await state.kernels_of(session_id),
        await state.transitions_of(session_id),
        await state.scheduling_history(session_id),
    )


async def test_a_session_is_created_pending_with_its_kernels_in_cluster_order(state: State, now: datetime) -> None:
    assert await state.get_session(SID1) is None and await state.kernels_of(SID1) == []
    assert await state.transitions_of(SID1) == [] and await state.scheduling_history(SID1) == []
    made = await create(state, size=3, created_at=now, tag="t1")
    assert isinstance(made, Session)
    assert made == Session(
        id=SID1,
        name="sess-1",
        access_key="AK1",
        image="python:3.11",
        type="INTERACTIVE",
        status="PENDING",
        status_info="",
        status_data={},
        status_changed=stamp(now),
        requested_slots=SLOTS,
        environ={"A": "1"},
        config={"mounts": [], "depends_on": [], "nested": {"a": [1, None]}},
        scaling_group="default",
        cluster_size=3,
        tag="t1",
        result="UNDEFINED",
        created_at=stamp(now),
        terminated_at=None,
        seq=made.seq,
    )
    kernels = await state.kernels_of(SID1)
    assert [k.id for k in kernels] == [f"{SID1}-main1", f"{SID1}-sub1", f"{SID1}-sub2"]
    main = kernels[0]
    assert isinstance(main, Kernel)
    assert main == Kernel(
        id=f"{SID1}-main1",
        session_id=SID1,
        cluster_role="main",
        cluster_idx=1,
        image="python:3.11",
        agent_id=None,
        container_id=None,
        status="PENDING",
        status_info="",
        status_changed=stamp(now),
        occupied_slots=SLOTS,
        exit_code=None,
        created_at=stamp(now),
        terminated_at=None,
        devices=[],
        service_ports=[],
        last_stat=None,
    )
    assert [(k.cluster_role, k.cluster_idx, k.occupied_slots) for k in kernels[1:]] == [
        ("sub", 1, {"cpu": "1"}),
        ("sub", 2, {"cpu": "1"}),
    ]
    assert await state.get_kernel(f"{SID1}-sub2") == kernels[2] and await state.get_kernel("nope") is None
    assert await state.transitions_of(SID1) == [Transition("PENDING", "", {}, stamp(now))]
    later = await create(state, SID2, name="sess-2", created_at=now)
    assert later.seq > made.seq and later.tag is None and later.cluster_size == 1  # last in the queue


async def test_names_are_unique_among_an_owners_live_sessions_only(state: State, now: datetime) -> None:
    first = await create(state, SID1, name="same")
    assert await state.create_session(new_session(SID2, "same"), kernels_for(SID2)) == SID1  # taken: nothing
    assert await state.get_session(SID2) is None and await state.kernels_of(SID2) == []
    again, created = await state.create_or_get_session(new_session(SID2, "same"), kernels_for(SID2))
    assert (again, created) == (first, False) and await state.get_session(SID2) is None
    theirs, created = await state.create_or_get_session(new_session(SID3, "same", "AK2"), kernels_for(SID3))
    assert created and theirs == await state.get_session(SID3) and theirs.access_key == "AK2"
    assert await state.transition(SID1, S.CANCELLED, "user-requested", now=now) is not None
    made, created = await state.create_or_get_session(new_session(SID2, "same", created_at=now), kernels_for(SID2))
    assert created and made == await state.get_session(SID2) and made.created_at == stamp(now)
    assert [k.id for k in await state.kernels_of(SID2)] == [f"{SID2}-main1"]


async def test_a_legal_transition_moves_the_session_and_its_kernels_at_the_time_given(
    state: State, now: datetime
) -> None:
    await create(state, size=2, created_at=now - timedelta(days=1))
    main, sub = f"{SID1}-main1", f"{SID1}-sub1"
    placed = {main: KernelChanges(agent_id="a1"), sub: KernelChanges(agent_id="a2")}  # (each its own)
    started = {main: KernelChanges(container_id="c1", service_ports=[{"name": "jupyter"}])}  # (one kernel's)
    exits = {main: KernelChanges(exit_code=0), sub: KernelChanges(exit_code=1)}
    steps: list[tuple[SessionStatus, str, dict[str, Any], dict[str, KernelChanges]]] = [
        (S.SCHEDULED, "scheduled", {"agents": ["a1", "a2"]}, placed),
        (S.PREPARING, "", {}, {}),
        (S.RUNNING, "", {}, started),
        (S.TERMINATING, "user-requested", {}, {}),
        (S.TERMINATED, "user-requested", {"exitCode": 0}, exits),
    ]
    for i, (target, info, data, updates) in enumerate(steps, start=1):
        at = now + timedelta(seconds=i)
        moved = await state.transition(SID1, target, info, data, kernel_updates=updates, now=at)
        assert moved is not None and moved == await state.get_session(SID1)
        assert (moved.status, moved.status_info, moved.status_data) == (target.value, info, data)
        assert moved.status_changed == stamp(at)
        assert moved.terminated_at == (stamp(at) if target == S.TERMINATED else None)
        # when it first ran: unset while it was queued, then kept (a restart's RUNNING does not move it)
        assert moved.started_at == (None if i < 3 else stamp(now + timedelta(seconds=3)))
        kernels = await state.kernels_of(SID1)
        assert [(k.status, k.status_info, k.status_changed) for k in kernels] == [(target.value, info, stamp(at))] * 2
        assert (await state.transitions_of(SID1))[-1] == Transition(target.value, info, data, stamp(at))
    end = stamp(now + timedelta(seconds=len(steps)))
    k_main, k_sub = await state.kernels_of(SID1)
    assert (k_main.agent_id, k_main.container_id, k_main.service_ports, k_main.exit_code) == (
        "a1",
        "c1",
        [{"name": "jupyter"}],
        0,
    )
    assert (k_sub.agent_id, k_sub.container_id, k_sub.service_ports, k_sub.exit_code) == ("a2", None, [], 1)
    assert k_main.terminated_at == k_sub.terminated_at == end
    assert [t.status for t in await state.transitions_of(SID1)] == ["PENDING", *(s.value for s, *_ in steps)]
    ended = await state.get_session(SID1)
    assert ended is not None and ended.result == "UNDEFINED"  # no result given: as it was


async def test_a_cancelled_session_ends_at_the_time_given_with_its_result(state: State, now: datetime) -> None:
    await create(state, size=2)
    cancelled = await state.transition(SID1, S.CANCELLED, "user-requested", result="FAILURE", now=now)
    assert cancelled is not None and (cancelled.status, cancelled.result) == ("CANCELLED", "FAILURE")
    assert cancelled.terminated_at == cancelled.status_changed == stamp(now)
    assert [(k.status, k.terminated_at) for k in await state.kernels_of(SID1)] == [("CANCELLED", stamp(now))] * 2


async def test_a_transition_that_may_not_happen_gives_none_and_changes_nothing(state: State, now: datetime) -> None:
    await create(state)
    before = await snapshot(state, SID1)
    refused = await state.transition(SID1, S.TERMINATED, "x", allowed_from=[S.RUNNING, S.ERROR], now=now)
    assert refused is None and await snapshot(state, SID1) == before  # not in allowed_from
    assert await state.transition("no-such-session", S.SCHEDULED, now=now) is None
    moved = await state.transition(
        SID1, S.SCHEDULED, "scheduled", allowed_from=(s for s in [S.PENDING]), now=now
    )  # any iterable
    assert moved is not None and moved.status == "SCHEDULED"
    before = await snapshot(state, SID1)
    assert await state.transition(SID1, S.SCHEDULED, "again", now=now + timedelta(seconds=1)) is None  # there already
    assert await snapshot(state, SID1) == before


async def test_an_illegal_transition_raises_and_changes_nothing(state: State, now: datetime) -> None:
    await create(state)
    before = await snapshot(state, SID1)
    with pytest.raises(IllegalTransition) as caught:
        await state.transition(SID1, S.RUNNING, "nope", now=now)
    assert caught.type is IllegalTransition and caught.type.__name__ == "IllegalTransition"
    assert (caught.value.current, caught.value.target) == (S.PENDING, S.RUNNING)
    with pytest.raises(IllegalTransition):  # allowed by the caller, forbidden by the lifecycle
        await state.transition(SID1, S.RUNNING, "nope", allowed_from=[S.PENDING], now=now)
    assert await snapshot(state, SID1) == before
    assert await state.transition(SID1, S.CANCELLED, "user-requested", now=now) is not None
    with pytest.raises(IllegalTransition):  # nothing leaves CANCELLED
        await state.transition(SID1, S.SCHEDULED, now=now)
    ended = await state.get_session(SID1)
    assert ended is not None and ended.status == "CANCELLED"


async def test_kernels_take_their_own_changes_in_and_out_of_transitions(state: State, now: datetime) -> None:
    await create(state, size=3)
    main, sub1, sub2 = (k.id for k in await state.kernels_of(SID1))
    changes = {
        sub1: KernelChanges(agent_id="a1", devices=[["GPU-1", 0.5]]),
        "other-kernel": KernelChanges(agent_id="x"),
    }
    assert await state.transition(SID1, S.SCHEDULED, "scheduled", kernel_updates=changes, now=now) is not None
    kernels = {k.id: k for k in await state.kernels_of(SID1)}
    assert (kernels[sub1].agent_id, kernels[sub1].devices) == ("a1", [["GPU-1", 0.5]])
    assert kernels[main].agent_id is None and kernels[sub2].agent_id is None and kernels[main].devices == []
    assert await state.get_kernel("other-kernel") is None  # not one of the session's: nothing
    await state.update_kernel(main, KernelChanges(exit_code=3))
    await state.update_kernel(main, KernelChanges(container_id="c1", last_stat={"cpu_util": {"current": "1.5"}}))
    await state.update_kernel(main, KernelChanges())  # nothing to change
    await state.update_kernel("no-such-kernel", KernelChanges(exit_code=1))
    k_main = await state.get_kernel(main)
    assert k_main is not None and (k_main.exit_code, k_main.container_id, k_main.status) == (3, "c1", "SCHEDULED")
    assert k_main.last_stat is not None and json.loads(k_main.last_stat) == {"cpu_util": {"current": "1.5"}}
    await state.update_kernel(main, KernelChanges(container_id=None, exit_code=None))
    k_main = await state.get_kernel(main)
    assert k_main is not None and (k_main.container_id, k_main.exit_code, k_main.agent_id) == (None, None, None)
    untouched = await state.get_kernel(sub2)
    assert untouched is not None and (untouched.exit_code, untouched.container_id) == (None, None)


async def test_starting_a_session_moves_it_preparing_with_its_kernels_and_its_owners_dotfiles(
    state: State, now: datetime
) -> None:
    await create(state, SID1, size=3)
    await create(state, SID2, name="sess-2", owner="AK2")
    assert await state.start_preparing(SID1, now) is None  # PENDING, not SCHEDULED
    await state.put_dotfile("AK1", ".zshrc", "z", "600")
    await state.put_dotfile("AK1", ".bashrc", "b", "644")
    agents = {f"{SID1}-main1": "a1", f"{SID1}-sub1": "a1", f"{SID1}-sub2": "a2"}
    await state.apply_round([(SID1, agents), (SID2, {f"{SID2}-main1": "a1"})], [], [], [], now)
    at = now + timedelta(seconds=1)
    started = await state.start_preparing(SID1, at)
    assert started is not None
    session, kernels, dotfiles = started
    assert session == await state.get_session(SID1)
    assert (session.status, session.status_changed) == ("PREPARING", stamp(at))
    assert [(k.id, k.status, k.agent_id) for k in kernels] == [
        (f"{SID1}-main1", "PREPARING", "a1"),
        (f"{SID1}-sub1", "PREPARING", "a1"),
        (f"{SID1}-sub2", "PREPARING", "a2"),
    ]
    assert kernels == await state.kernels_of(SID1)
    assert dotfiles == [Dotfile(".bashrc", "b", "644"), Dotfile(".zshrc", "z", "600")]
    assert (await state.transitions_of(SID1))[-1] == Transition("PREPARING", "", {}, stamp(at))
    assert await state.start_preparing(SID1, at) is None  # not SCHEDULED any more
    other = await state.start_preparing(SID2, at)
    assert other is not None and other[2] == []  # AK2 has no dotfiles
    assert await state.start_preparing("no-such-session", at) is None


async def test_a_round_of_one_kernel_sessions_moves_each_and_answers_each_as_stored(
    state: State, now: datetime
) -> None:
    """(PostgreSQL sends such a round's moves together: each answer must still be its own session's.)"""
    ids = [f"5e5e5e5e-0000-4000-8000-00000000010{i}" for i in range(5)]
    for i, sid in enumerate(ids):
        await create(state, sid, name=f"one-{i}")
    assert await state.transition(ids[3], S.CANCELLED, "user-requested", now=now) is not None  # not PENDING now
    placed = [(sid, {f"{sid}-main1": f"agent-{i}"}) for i, sid in enumerate(ids[:4])]
    scheduled, cancelled = await state.apply_round(placed, [(ids[4], "pending-timeout", {"waited": 9})], [], [], now)
    assert [r.id for r in scheduled] == ids[:3] and [r.id for r in cancelled] == [ids[4]]
    for row in scheduled + cancelled:
        assert row == await state.get_session(row.id)
    for i, sid in enumerate(ids[:3]):
        assert [(k.status, k.agent_id) for k in await state.kernels_of(sid)] == [("SCHEDULED", f"agent-{i}")]
        assert (await state.transitions_of(sid))[-1] == Transition("SCHEDULED", "scheduled", {}, stamp(now))
    assert [k.status for k in await state.kernels_of(ids[4])] == ["CANCELLED"]
    assert [k.agent_id for k in await state.kernels_of(ids[3])] == [None]  # (it was not placed)


async def test_a_round_places_cancels_and_records_why_sessions_wait(state: State, now: datetime) -> None:
    for sid, name in ((SID1, "placed"), (SID2, "cancelled"), (SID3, "waiting")):
        await create(state, sid, name=name, size=2 if sid == SID1 else 1)
    late = "5e5e5e5e-0000-4000-8000-000000000004"
    await create(state, late, name="late")
    assert await state.transition(late, S.SCHEDULED, "scheduled", now=now) is not None
    late_before = await snapshot(state, late)
    scheduled, cancelled = await state.apply_round(
        [(SID1, {f"{SID1}-main1": "a1", f"{SID1}-sub1": "a2"}), (late, {f"{late}-main1": "a9"})],
        [(SID2, "pending-timeout", {"waited": 60}), (late, "pending-timeout", {})],
        [(SID3, "no-available-instances", {"msg": "cpu 8 requested, 4 free"}), (late, "x", {"y": 1})],
        [],
        now,
    )
    assert scheduled == [await state.get_session(SID1)] and cancelled == [await state.get_session(SID2)]
    assert (scheduled[0].status, scheduled[0].status_info, scheduled[0].status_changed) == (
        "SCHEDULED",
        "scheduled",
        stamp(now),
    )
    assert [(k.status, k.agent_id) for k in await state.kernels_of(SID1)] == [("SCHEDULED", "a1"), ("SCHEDULED", "a2")]
    gone = cancelled[0]
    assert (gone.status, gone.status_info, gone.status_data, gone.terminated_at) == (
        "CANCELLED",
        "pending-timeout",
        {"waited": 60},
        stamp(now),
    )
    waiting = await state.get_session(SID3)
    assert waiting is not None
    assert (waiting.status, waiting.status_info, waiting.status_data) == (
        "PENDING",
        "no-available-instances",
        {"msg": "cpu 8 requested, 4 free"},
    )
    assert len(await state.transitions_of(SID3)) == 1  # pending info is no transition
    assert await snapshot(state, late) == late_before  # no longer PENDING: skipped in each part


async def test_a_rounds_history_is_merged_while_the_outcome_stays_and_added_when_it_changes(
    state: State, now: datetime
) -> None:
    await create(state, SID1)
    await create(state, SID2, name="sess-2")
    failed = [{"name": "concurrency", "msg": "too many"}]
    waits = SchedulingAttempt(SID1, "pending", "predicate-checks-failed", "too many", "", failed)
    times = [now + timedelta(minutes=i) for i in range(4)]
    await state.apply_round([], [], [], [waits, SchedulingAttempt(SID2, "pending", "", "", "", [])], times[0])
    await state.apply_round([], [], [], [waits], times[1])
    await state.apply_round([], [], [], [waits], times[2])
    placed = SchedulingAttempt(SID1, "scheduled", "scheduled", "", "a1", [])
    await state.apply_round([(SID1, {f"{SID1}-main1": "a1"})], [], [], [placed], times[3])
    first = await state.scheduling_history(SID1)
    assert [a.number for a in first] == sorted({a.number for a in first}) and first[0].number > 0  # rows' numbers
    assert unnumbered(first) == [
        SchedulingAttempt(
            SID1, "pending", "predicate-checks-failed", "too many", "", failed, stamp(times[0]), stamp(times[2]), 3
        ),
        SchedulingAttempt(SID1, "scheduled", "scheduled", "", "a1", [], stamp(times[3]), stamp(times[3]), 1),
    ]
    assert unnumbered(await state.scheduling_history(SID2)) == [
        SchedulingAttempt(SID2, "pending", "", "", "", [], stamp(times[0]), stamp(times[0]), 1)
    ]
    assert await state.scheduling_history(SID3) == []


def unnumbered(attempts: list[SchedulingAttempt]) -> list[SchedulingAttempt]:
    return [msgspec.structs.replace(a, number=0) for a in attempts]


async def test_who_waits_is_counted_per_keypair_and_project(state: Any, now: datetime) -> None:
    await create(state, SID1, owner="AK1", project_id="p1")
    await create(state, SID2, name="sess-2", owner="AK1", project_id="p1")
    await create(state, SID3, name="sess-3", owner="AK2", project_id="p2")
    await state.apply_round([(SID3, {f"{SID3}-main1": "a1"})], [], [], [], now)  # placed: no longer waits
    assert sorted(await state.pending_by_owner()) == [("AK1", "p1", 2)]


async def test_the_whole_scheduling_history_is_searched_by_outcome_session_order_and_page(
    state: State, now: datetime
) -> None:
    for sid, name in ((SID1, "sess-1"), (SID2, "sess-2"), (SID3, "sess-3")):
        await create(state, sid, name=name)
    times = [now + timedelta(minutes=i) for i in range(3)]
    failed = [{"name": "concurrency", "msg": "too many"}]
    waits = [
        SchedulingAttempt(sid, "pending", "no-available-instances", f"{sid} waits", "", failed) for sid in (SID1, SID2)
    ]
    await state.apply_round([], [], [], waits, times[0])
    await state.apply_round([], [], [], [waits[1]], times[1])  # (merged: SID2's row is updated at times[1])
    placed = SchedulingAttempt(SID1, "scheduled", "scheduled", "", "a1", [])
    await state.apply_round([(SID1, {f"{SID1}-main1": "a1"})], [], [], [placed], times[2])
    every = ["cancelled", "pending", "preempted", "scheduled"]

    async def search(keep: Any = None, offset: int = 0, limit: int = 10, **kw: Any) -> tuple[list[tuple], int]:
        found, total = await state.search_scheduling_history(
            HistorySearch(kw.pop("outcomes", every), **kw), keep or (lambda a: True), offset, limit
        )
        return [(a.session_id, a.outcome, a.rounds) for a in found], total

    newest = [(SID1, "scheduled", 1), (SID2, "pending", 2), (SID1, "pending", 1)]  # by first round, newest first
    assert await search() == (newest, 3)
    assert await search(descending=False) == ([newest[2], newest[1], newest[0]], 3)  # (ties: the older row first)
    assert await search(by="last_at") == ([newest[0], newest[1], newest[2]], 3)
    assert await search(outcomes=["pending"]) == ([newest[1], newest[2]], 2)
    assert await search(outcomes=[]) == ([], 0)
    assert await search(session_ids=[SID2]) == ([newest[1]], 1)
    assert await search(session_ids=[SID1, SID3], not_session_ids=[SID3]) == ([newest[0], newest[2]], 2)
    assert await search(not_session_ids=[SID1]) == ([newest[1]], 1)
    assert await search(offset=1, limit=1) == ([newest[1]], 3)  # the page, and how many there are in all
    assert await search(offset=5) == ([], 3)
    assert await search(keep=lambda a: "waits" in a.msg, limit=1) == ([newest[1]], 2)
    (row,), _ = await state.search_scheduling_history(HistorySearch(["pending"], [SID1]), lambda a: True, 0, 5)
    assert (row.predicates, row.status_info, row.msg, row.first_at) == (failed, "no-available-instances",
                                                                        f"{SID1} waits", stamp(times[0]))  # fmt: skip
    assert row.number > 0


async def test_sessions_are_found_by_id_id_prefix_or_name_under_the_owner_rules(state: State, now: datetime) -> None:
    await create(state, SID1, name="alpha", owner="AK1")
    await create(state, SID2, name="alpha", owner="AK2")
    await create(state, SID3, name="beta", owner="AK1")

    async def found(ref: str, access_key: str | None, active_only: bool = False, **kw: Any) -> list[str]:
        return [s.id for s in await state.find_sessions(ref, access_key, active_only=active_only, **kw)]

    assert await found(SID1, None) == [SID1]
    assert await found(SID1, "AK1") == [SID1]
    assert await found(SID1, "AK2") == []  # ids among the same keypair's by default
    assert await found(SID1, "AK2", ids_of=None) == [SID1]  # ids among anyone's
    assert await found(SID2, "AK1", ids_of="AK2") == [SID2]
    assert await found("alpha", "AK1") == [SID1]
    assert await found("alpha", None) == [SID2, SID1]  # anyone's names, newest first
    assert await found("alpha", "AK2", ids_of=None) == [SID2]
    assert await found("3f2b1c9e", None) == [SID3, SID1]  # an 8-character prefix, newest first
    assert await found("3f2b1c9e-0000-4000-8000-00000000000", "AK1") == [SID3, SID1]
    assert await found("3f2b1c9", None) == []  # 7 characters: no prefix
    assert await found("3f2b1c9e", "AK2") == []
    assert await found("gamma", None) == [] and await found("________", None) == [] and await found("%", None) == []
    assert await state.transition(SID1, S.TERMINATED, "user-requested", now=now) is not None
    assert await found("alpha", "AK1", active_only=True) == [] and await found(SID1, None, active_only=True) == []
    assert await found("3f2b1c9e", None, active_only=True) == [SID3]
    assert await found("alpha", "AK1") == [SID1]  # ended, but there


async def test_sessions_are_listed_in_queue_order(state: State, now: datetime) -> None:
    a, b, c = SID1, SID2, SID3
    await create(state, a, name="a")
    await create(state, b, name="b")
    await create(state, c, name="c", owner="AK2")
    assert await state.transition(b, S.SCHEDULED, "scheduled", now=now) is not None

    async def listed(access_key: str | None, statuses: list[SessionStatus] | None, **kw: Any) -> list[str]:
        return [s.id for s in await state.list_sessions(access_key, statuses, **kw)]

    assert await listed(None, None) == [a, b, c]
    assert await listed(None, None, newest=True) == [c, b, a]
    assert await listed(None, None, limit=2) == [a, b]
    assert await listed(None, None, limit=1, newest=True) == [c]
    assert await listed(None, [S.PENDING]) == [a, c] and await listed(None, [S.SCHEDULED]) == [b]
    assert await listed(None, [S.PENDING, S.SCHEDULED]) == [a, b, c] and await listed(None, [S.RUNNING]) == []
    assert await listed("AK1", None) == [a, b] and await listed("AK1", [S.PENDING]) == [a]
    assert await listed("AK3", None) == []
    assert (await state.list_sessions(None, None))[1] == await state.get_session(b)
    assert sorted(s.id for s in await state.sessions_by_ids([c, a, "nope"])) == [a, c]
    assert await state.sessions_by_ids([]) == []
    assert await state.count_sessions_by_status() == {"PENDING": 2, "SCHEDULED": 1}
    assert await state.count_sessions_of("AK1", [S.PENDING]) == 1
    assert await state.count_sessions_of("AK1", [S.PENDING, S.SCHEDULED]) == 2
    assert (
        await state.count_sessions_of("AK2", [S.SCHEDULED]) == 0
        and await state.count_sessions_of("AK3", [S.PENDING]) == 0
    )


async def test_kernels_are_read_by_session_by_status_and_agent_and_by_owner(state: State, now: datetime) -> None:
    await create(state, SID1, size=2, owner="AK1")
    await create(state, SID2, name="sess-2", owner="AK2")
    await create(state, SID3, name="sess-3", owner="AK1")
    many = await state.kernels_of_many([SID1, SID2, "nope"])
    assert set(many) == {SID1, SID2}
    assert many[SID1] == await state.kernels_of(SID1) and [k.id for k in many[SID2]] == [f"{SID2}-main1"]
    assert await state.kernels_of_many([]) == {}
    placed = [(SID1, {f"{SID1}-main1": "a1", f"{SID1}-sub1": "a2"}), (SID2, {f"{SID2}-main1": "a1"})]
    await state.apply_round(placed, [], [], [], now)
    assert sorted(k.id for k in await state.kernels_where(["SCHEDULED"])) == [
        f"{SID1}-main1",
        f"{SID1}-sub1",
        f"{SID2}-main1",
    ]
    assert sorted(k.id for k in await state.kernels_where(["SCHEDULED"], "a1")) == [f"{SID1}-main1", f"{SID2}-main1"]
    assert [k.id for k in await state.kernels_where(["PENDING", "RUNNING"])] == [f"{SID3}-main1"]
    assert await state.kernels_where(["SCHEDULED"], "a9") == [] and await state.kernels_where(["RUNNING"]) == []
    assert await state.kernel_owners([f"{SID1}-sub1", f"{SID3}-main1", "nope"]) == {
        f"{SID1}-sub1": (SID1, "AK1", "SCHEDULED"),
        f"{SID3}-main1": (SID3, "AK1", "PENDING"),
    }
    assert await state.kernel_owners([]) == {}


async def test_a_rename_is_refused_while_the_name_is_live_for_the_owner(state: State, now: datetime) -> None:
    await create(state, SID1, name="alpha")
    await create(state, SID2, name="beta")
    await create(state, SID3, name="gamma", owner="AK2")
    before = await snapshot(state, SID2)
    assert not await state.rename_session(SID2, "AK1", "alpha")
    assert await snapshot(state, SID2) == before
    assert await state.rename_session(SID2, "AK1", "beta")  # its own name
    assert await state.rename_session(SID2, "AK1", "gamma")  # another owner's name
    renamed = await state.get_session(SID2)
    assert renamed is not None and renamed.name == "gamma"
    assert await state.transition(SID1, S.TERMINATED, "user-requested", now=now) is not None
    assert await state.rename_session(SID2, "AK1", "alpha")  # no longer live
    assert [s.id for s in await state.find_sessions("alpha", "AK1", active_only=False)] == [SID2, SID1]


async def test_a_run_is_recorded_without_a_transition_and_kept_when_the_session_ends(
    state: State, now: datetime
) -> None:
    await create(state, size=2)
    main, sub = f"{SID1}-main1", f"{SID1}-sub1"
    before = await state.get_session(SID1)
    await state.record_run(SID1, main, 3, "FAILURE")
    after = await state.get_session(SID1)
    assert before is not None and after is not None and after.result == "FAILURE"
    assert (after.status, after.status_changed, after.status_info) == (before.status, before.status_changed, "")
    assert len(await state.transitions_of(SID1)) == 1
    assert [k.exit_code for k in await state.kernels_of(SID1)] == [3, None]
    assert await state.transition(SID1, S.TERMINATED, "task-failed", now=now) is not None
    ended = await state.get_session(SID1)
    k_main = await state.get_kernel(main)
    assert ended is not None and k_main is not None and (ended.result, k_main.exit_code) == ("FAILURE", 3)
    k_sub = await state.get_kernel(sub)
    assert k_sub is not None and k_sub.exit_code is None


async def test_status_info_is_set_only_in_the_status_named(state: State, now: datetime) -> None:
    await create(state, SID1)
    await create(state, SID2, name="sess-2")
    assert await state.transition(SID2, S.SCHEDULED, "scheduled", now=now) is not None
    changed = await state.set_status_info(SID2, "SCHEDULED", "waiting-for-pull", {"image": "python:3.11"})
    assert changed is not None and changed == await state.get_session(SID2)
    assert (changed.status, changed.status_info, changed.status_data) == (
        "SCHEDULED",
        "waiting-for-pull",
        {"image": "python:3.11"},
    )
    assert changed.status_changed == stamp(now) and len(await state.transitions_of(SID2)) == 2
    before = await snapshot(state, SID1)
    assert await state.set_status_info(SID1, "SCHEDULED", "x", {"y": 1}) is None  # PENDING: not in that status
    assert await state.set_status_info("no-such-session", "PENDING", "x", {}) is None
    assert await snapshot(state, SID1) == before
    await state.set_pending_info(SID2, "no-available-instances", {"msg": "x"})  # SCHEDULED: not pending
    assert await state.get_session(SID2) == changed
    await state.set_pending_info(SID1, "no-available-instances", {"msg": "cpu 8 requested, 4 free"})
    pending = await state.get_session(SID1)
    assert pending is not None
    assert (pending.status, pending.status_info, pending.status_data) == (
        "PENDING",
        "no-available-instances",
        {"msg": "cpu 8 requested, 4 free"},
    )
    assert len(await state.transitions_of(SID1)) == 1


async def test_hook_notes_are_added_to_the_sessions_config(state: State) -> None:
    await create(state)
    await state.add_hook_notes(SID1, ["hook a: timed out"])
    await state.add_hook_notes(SID1, ["hook b: 500", "hook c: refused"])
    await state.add_hook_notes("no-such-session", ["x"])  # nothing to add to: nothing happens
    noted = await state.get_session(SID1)
    assert noted is not None
    assert noted.config == {
        "mounts": [],
        "depends_on": [],
        "nested": {"a": [1, None]},
        "hook_notes": ["hook a: timed out", "hook b: 500", "hook c: refused"],
    }


async def test_usage_counts_each_keypairs_sessions_by_what_they_request(state: State, now: datetime) -> None:
    small = {"cpu": "1", "mem": "1073741824"}
    await create(state, SID1, name="one")
    await create(state, SID2, name="two")
    await create(state, SID3, name="three", slots=small)
    theirs = "5e5e5e5e-0000-4000-8000-000000000004"
    ended = "6d6d6d6d-0000-4000-8000-000000000005"
    await create(state, theirs, name="theirs", owner="AK2", slots=small)
    await create(state, ended, name="ended", owner="AK2")
    assert await state.transition(SID2, S.SCHEDULED, "scheduled", now=now) is not None
    assert await state.transition(ended, S.CANCELLED, "user-requested", now=now) is not None

    def usage(rows: list[tuple[str, dict[str, str], int]]) -> list[tuple[str, list[tuple[str, str]], int]]:
        return sorted((key, sorted(slots.items()), count) for key, slots, count in rows)

    assert usage(await state.usage_by_keypair([S.PENDING, S.SCHEDULED])) == usage(
        [("AK1", SLOTS, 2), ("AK1", small, 1), ("AK2", small, 1)]
    )
    assert usage(await state.usage_by_keypair([S.SCHEDULED])) == usage([("AK1", SLOTS, 1)])
    assert usage(await state.usage_by_keypair([S.CANCELLED])) == usage([("AK2", SLOTS, 1)])
    assert await state.usage_by_keypair([S.RUNNING]) == []


async def test_the_sessions_that_ran_in_a_period_are_those_started_before_its_end_and_not_ended_before_it(
    state: State, now: datetime
) -> None:
    async def run(session_id: str, name: str, start: datetime, end: datetime | None) -> None:
        await create(state, session_id, name=name, created_at=start - timedelta(minutes=5))
        for i, target in enumerate((S.SCHEDULED, S.PREPARING, S.RUNNING)):
            assert await state.transition(session_id, target, "", now=start - timedelta(seconds=2 - i)) is not None
        if end is not None:
            assert await state.transition(session_id, S.TERMINATING, "user-requested", now=end) is not None
            assert await state.transition(session_id, S.TERMINATED, "user-requested", now=end) is not None

    hour = timedelta(hours=1)
    await run(SID1, "before", now - 5 * hour, now - 3 * hour)  # ended before the period
    await run(SID2, "across", now - 2 * hour, now + hour)  # began before it, ended inside
    await run(SID3, "running", now + 30 * timedelta(minutes=1), None)  # began inside, still running
    late = "5e5e5e5e-0000-4000-8000-000000000004"
    await run(late, "after", now + 3 * hour, now + 4 * hour)  # began after it
    await create(state, "6d6d6d6d-0000-4000-8000-000000000005", name="queued", created_at=now)  # never ran
    found = await state.sessions_overlapping(now - hour, now + 2 * hour)
    assert [s.name for s in found] == ["across", "running"]
    # the bounds: [start, end), at the microsecond
    exact = await state.sessions_overlapping(now - 3 * hour, now - 3 * hour + timedelta(microseconds=1))
    assert [s.name for s in exact] == ["before"]
    assert [s.name for s in await state.sessions_overlapping(now + 4 * hour, now + 5 * hour)] == ["running", "after"]
    assert await state.sessions_overlapping(now - 10 * hour, now - 5 * hour - timedelta(seconds=2)) == []


async def test_the_logs_of_sessions_ended_before_a_time_are_purged(state: State, now: datetime) -> None:
    old, recent, live = SID1, SID2, SID3
    for sid, name in ((old, "old"), (recent, "recent"), (live, "live")):
        await create(state, sid, name=name, size=2 if sid == old else 1)
    await state.append_logs(
        [(f"{old}-main1", "a\n"), (f"{old}-sub1", "b\n"), (f"{recent}-main1", "c\n"), (f"{live}-main1", "d\n")], now
    )
    assert await state.transition(old, S.TERMINATED, "task-done", now=now) is not None
    assert await state.transition(recent, S.CANCELLED, "user-requested", now=now + timedelta(hours=1)) is not None
    at = now + timedelta(hours=2)
    purged = await state.purge_logs(now + timedelta(minutes=30), at, batch=1)  # batch 1: several batches
    assert sorted(purged) == [f"{old}-main1", f"{old}-sub1"]
    for kid in purged:
        assert await state.read_logs(kid) == []
        assert await state.log_state(kid) == LogKept(bytes=0, dropped=0, purged_at=stamp(at))
    assert [text for _, text in await state.read_logs(f"{recent}-main1")] == ["c\n"]  # ended after that time
    assert [text for _, text in await state.read_logs(f"{live}-main1")] == ["d\n"]  # not ended
    assert await state.purge_logs(now + timedelta(minutes=30), at) == []  # purged already
    assert await state.purge_logs(now + timedelta(hours=1), at) == []  # ended at that time: not before it
    assert await state.purge_logs(now + timedelta(hours=1, seconds=1), at) == [f"{recent}-main1"]


# -- agents -----------------------------------------------------------------------------------------------


async def test_an_agent_registers_and_is_stamped_with_the_time_given(state: State, now: datetime) -> None:
    assert await state.agents() == []
    await state.upsert_agent(agent("a2"), now)
    await state.upsert_agent(agent("a1"), now)
    a1 = (await state.agents())[0]
    assert isinstance(a1, Agent)
    assert a1 == Agent("a1", "host-a1", "sim", "0.1", "default", "ALIVE", SLOTS, stamp(now), stamp(now))
    assert [a.id for a in await state.agents()] == ["a1", "a2"]


async def test_registering_again_updates_it_and_keeps_its_first_contact(state: State) -> None:
    await state.upsert_agent(agent("a1"), T2020)
    await state.set_agent_status("a1", "LOST", T2020 + timedelta(seconds=5))
    await state.upsert_agent(agent("a1", "gpu", {"cpu": "2"}), T2040)
    [a1] = await state.agents()
    assert (a1.status, a1.scaling_group, a1.slots) == ("ALIVE", "gpu", {"cpu": "2"})
    assert (a1.first_contact, a1.last_seen) == (stamp(T2020), stamp(T2040))


async def test_status_and_heartbeats_stamp_last_seen(state: State) -> None:
    await state.upsert_agent(agent("a1"), T2020)
    await state.set_agent_status("a1", "LOST", T2020 + timedelta(minutes=1))
    [a1] = await state.agents()
    assert (a1.status, a1.last_seen) == ("LOST", stamp(T2020 + timedelta(minutes=1)))
    await state.touch_agent("a1", T2040)  # a heartbeat: ALIVE again
    [a1] = await state.agents()
    assert (a1.status, a1.last_seen) == ("ALIVE", stamp(T2040))
    await state.touch_agent("no-such-agent", T2040)  # nothing to touch: nothing happens
    assert [a.id for a in await state.agents()] == ["a1"]


async def test_capacities_follow_every_write_and_their_version_says_when(state: State) -> None:
    version, capacities = await state.agent_capacities()
    assert capacities == [] and version == state.capacities_version()
    await state.upsert_agent(agent("a1"), T2020)
    v1, capacities = await state.agent_capacities()
    assert v1 != version and capacities == [AgentCapacity("a1", "default", "ALIVE", SLOTS)]
    assert (await state.agent_capacities())[0] == v1  # no write: the same version
    await state.set_agent_status("a1", "TERMINATED", T2020)
    v2, capacities = await state.agent_capacities()
    assert v2 != v1 and [c.status for c in capacities] == ["TERMINATED"]
    await state.touch_agent("a1", T2020)
    v3, capacities = await state.agent_capacities()
    assert v3 != v2 and [c.status for c in capacities] == ["ALIVE"] and state.capacities_version() == v3


# -- accounts ---------------------------------------------------------------------------------------------


async def test_the_admin_keypair_is_made_once(state: State, now: datetime) -> None:
    assert await state.ensure_admin_keypair("AKADMIN", "secret", now) == ("AKADMIN", "secret")
    assert await state.ensure_admin_keypair("AKOTHER", "other", now) == ("AKADMIN", "secret")
    admin = state.active_keypair("AKADMIN")
    assert admin == Keypair("AKADMIN", "secret", "admin", True, True, "default", stamp(now), user_uuid("admin"))
    assert list(await state.keypairs()) == ["AKADMIN"]


async def test_a_keypair_round_trip_and_its_cache_follows_each_write(state: State, now: datetime) -> None:
    assert state.active_keypair("AK1") is None and await state.keypair("AK1") is None
    await state.create_keypair(NewKeypair("AK1", "s1", "alice", False, "default"), now)
    created = Keypair("AK1", "s1", "alice", False, True, "default", stamp(now), user_uuid("alice"))
    assert state.active_keypair("AK1") == created  # at once, from memory
    assert await state.keypair("AK1") == created
    assert (await state.keypairs())["AK1"] == created
    assert await state.save_policy("gold", PolicyFields(), create=True, now=now)
    assert await state.update_keypair("AK1", resource_policy="gold", is_admin=True)
    changed = state.active_keypair("AK1")
    assert changed is not None and (changed.resource_policy, changed.is_admin) == ("gold", True)
    assert await state.update_keypair("AK1", is_active=False)
    assert state.active_keypair("AK1") is None  # inactive: authentication knows it no more
    assert "AK1" not in await state.keypairs() and "AK1" in await state.keypairs(active_only=False)
    inactive = await state.keypair("AK1")
    assert inactive is not None and not inactive.is_active
    assert await state.update_keypair("AK1", is_active=True)
    assert state.active_keypair("AK1") is not None
    assert await state.delete_keypair("AK1")
    assert state.active_keypair("AK1") is None and await state.keypair("AK1") is None
    assert not await state.delete_keypair("AK1")
    assert not await state.update_keypair("AK1", is_active=True)


async def test_a_keypair_needs_an_existing_policy(state: State, now: datetime) -> None:
    with pytest.raises(KeyError):
        await state.create_keypair(NewKeypair("AK1", "s", "u", False, "nope"), now)
    assert await state.keypair("AK1") is None
    await state.create_keypair(NewKeypair("AK1", "s", "u"), now)
    with pytest.raises(KeyError):
        await state.update_keypair("AK1", resource_policy="nope")
    kp = state.active_keypair("AK1")
    assert kp is not None and kp.resource_policy == "default"


async def test_policies_round_trip_with_defaults_and_partial_updates(state: State, now: datetime) -> None:
    assert list(await state.policies()) == ["default"]
    fields = PolicyFields(max_concurrent_sessions=3, total_resource_slots={"cpu": "8"}, idle_cpu_pct=5.0)
    assert await state.save_policy("gold", fields, create=True, now=now)
    assert not await state.save_policy("gold", fields, create=True, now=now)  # taken
    gold = await state.policy("gold")
    assert isinstance(gold, Policy) and gold.created_at == stamp(now)
    assert (gold.max_concurrent_sessions, gold.total_resource_slots, gold.idle_cpu_pct) == (3, {"cpu": "8"}, 5.0)
    assert (gold.idle_window, gold.max_session_networks, gold.max_pending_session_count) == (600.0, 2, 1000)
    assert await state.save_policy("gold", PolicyFields(idle_cpu_pct=None, idle_window=90.0), create=False, now=now)
    gold = (await state.policies())["gold"]
    assert (gold.max_concurrent_sessions, gold.idle_cpu_pct, gold.idle_window) == (3, None, 90.0)
    assert not await state.save_policy("nope", PolicyFields(), create=False, now=now)
    assert await state.policy("nope") is None
    assert list(await state.policies()) == ["default", "gold"]


async def test_a_policy_in_use_stays(state: State, now: datetime) -> None:
    assert await state.save_policy("gold", PolicyFields(), create=True, now=now)
    await state.create_keypair(NewKeypair("AK1", "s", "u", False, "gold"), now)
    assert "used by 1" in (await state.delete_policy("gold") or "")
    assert await state.delete_keypair("AK1")
    assert await state.delete_policy("gold") is None
    assert "no resource policy" in (await state.delete_policy("gold") or "")


async def test_queue_limits_follow_policy_and_keypair_writes(state: State, now: datetime) -> None:
    assert await state.pending_queue("AKUNKNOWN") == ("default", 1000, 0)
    assert await state.save_policy("tight", PolicyFields(max_pending_session_count=3), create=True, now=now)
    await state.create_keypair(NewKeypair("AK1", "s", "u", False, "tight"), now)
    assert await state.pending_queue("AK1") == ("tight", 3, 0)
    assert await state.save_policy("tight", PolicyFields(max_pending_session_count=0), create=False, now=now)
    assert await state.pending_queue("AK1") == ("tight", 0, 0)  # 0: unlimited
    assert await state.update_keypair("AK1", resource_policy="default")
    assert await state.pending_queue("AK1") == ("default", 1000, 0)
    assert await state.session_networks_by_keypair(["RUNNING"]) == {}


async def test_dotfiles_round_trip(state: State) -> None:
    assert await state.dotfiles("AK1") == []
    await state.put_dotfile("AK1", ".bashrc", "export A=1\n", "644")
    await state.put_dotfile("AK1", ".profile", "x", "600")
    await state.put_dotfile("AK1", ".bashrc", "export A=2\n", "755")  # replaced
    assert await state.dotfiles("AK1") == [Dotfile(".bashrc", "export A=2\n", "755"), Dotfile(".profile", "x", "600")]
    assert await state.dotfiles("AK2") == []
    assert await state.delete_dotfile("AK1", ".profile")
    assert not await state.delete_dotfile("AK1", ".profile")
    assert [d.path for d in await state.dotfiles("AK1")] == [".bashrc"]


async def test_deleting_a_keypair_deletes_its_dotfiles(state: State, now: datetime) -> None:
    await state.create_keypair(NewKeypair("AK1", "s", "u"), now)
    await state.put_dotfile("AK1", ".bashrc", "x", "644")
    assert await state.delete_keypair("AK1")
    assert await state.dotfiles("AK1") == []


# -- folders ----------------------------------------------------------------------------------------------


def folder(folder_id: str = "f1", name: str = "data", owner: str = "AK1", **kw: Any) -> NewVFolder:
    return NewVFolder(folder_id, name, "local", owner, **kw)


async def test_a_folder_round_trip(state: State, now: datetime) -> None:
    assert await state.get_vfolder("f1") is None
    assert await state.create_vfolder(folder(mount_permission="ro", cloneable=True), now)
    made = VFolder("f1", "data", "local", "AK1", "general", "ready", stamp(now), None, "ro", True)
    assert await state.get_vfolder("f1") == made
    [seen] = await state.vfolders_of("AK1")
    assert isinstance(seen, SeenVFolder) and (seen.permission, seen.is_owner, seen.id) == ("wd", True, "f1")
    assert [f.id for f in await state.vfolders_of(None)] == ["f1"]
    assert await state.vfolders_of("AK2") == []
    assert await state.count_vfolders("AK1") == 1 and await state.count_vfolders("AK2") == 0
    await state.delete_vfolder("f1")
    assert await state.get_vfolder("f1") is None and await state.count_vfolders("AK1") == 0


async def test_an_owner_has_one_ready_folder_of_a_name(state: State, now: datetime) -> None:
    assert await state.create_vfolder(folder("f1", "data"), now)
    assert not await state.create_vfolder(folder("f2", "data"), now)
    assert await state.create_vfolder(folder("f3", "data", owner="AK2"), now)
    assert await state.create_vfolder(folder("f4", "other"), now)
    assert not await state.update_vfolder("f4", FolderChanges(name="data"))  # taken
    assert await state.update_vfolder("f1", FolderChanges(status="trashed", trashed_at=stamp(now)))
    trashed = await state.get_vfolder("f1")
    assert trashed is not None and (trashed.status, trashed.trashed_at) == ("trashed", stamp(now))
    assert [f.id for f in await state.vfolders_of("AK1", "trashed")] == ["f1"]
    assert await state.update_vfolder("f4", FolderChanges(name="data"))  # free now
    assert not await state.update_vfolder("f1", FolderChanges(status="ready", trashed_at=None))  # taken again


async def test_folder_updates_change_only_what_they_say(state: State, now: datetime) -> None:
    assert await state.create_vfolder(folder(), now)
    assert await state.update_vfolder("f1", FolderChanges(mount_permission="ro", cloneable=True))
    assert await state.update_vfolder("f1", FolderChanges(owner="AK2"))
    assert await state.update_vfolder("f1", FolderChanges())
    f1 = await state.get_vfolder("f1")
    assert f1 is not None and (f1.mount_permission, f1.cloneable, f1.owner, f1.name) == ("ro", True, "AK2", "data")


async def test_shares_round_trip(state: State, now: datetime) -> None:
    assert await state.create_vfolder(folder("f1", "data"), now)
    assert await state.create_vfolder(folder("f2", "alpha"), now)
    await state.share_vfolder("f1", "AK2", "ro")
    await state.share_vfolder("f1", "AK3", "ro")
    await state.share_vfolder("f1", "AK3", "rw")  # changed
    await state.share_vfolder("f2", "AK2", "rw")
    assert await state.shares_of("f1") == {"AK2": "ro", "AK3": "rw"}
    seen = await state.vfolders_of("AK2")
    assert [(f.id, f.permission, f.is_owner) for f in seen] == [("f2", "rw", False), ("f1", "ro", False)]
    assert await state.all_shares("f2") == [FolderShare("f2", "AK2", "rw", "alpha", "AK1", "ready")]
    assert [(s.vfolder_id, s.access_key) for s in await state.all_shares()] == [
        ("f2", "AK2"),
        ("f1", "AK2"),
        ("f1", "AK3"),
    ]
    await state.share_vfolder("f1", "AK2", None)
    assert await state.shares_of("f1") == {"AK3": "rw"}
    await state.delete_vfolder("f1")
    assert await state.shares_of("f1") == {} and [s.vfolder_id for s in await state.all_shares()] == ["f2"]


async def test_invitations_round_trip(state: State, now: datetime) -> None:
    assert await state.create_vfolder(folder(), now)
    assert await state.invite("f1", "AK1", ["AK2", "AK3"], "rw", now) == ["AK2", "AK3"]
    assert await state.invite("f1", "AK1", ["AK2"], "ro", now) == []  # one pending already
    [to_ak2] = await state.invitations(invitee="AK2")
    assert (to_ak2.inviter, to_ak2.permission, to_ak2.state, to_ak2.vfolder_name) == ("AK1", "rw", "pending", "data")
    assert to_ak2.created_at == to_ak2.modified_at == stamp(now)
    assert len(await state.invitations(inviter="AK1")) == 2
    assert await state.invitations(invitation_id=to_ak2.id) == [to_ak2]
    later = now + timedelta(hours=1)
    closed = await state.close_invitation(to_ak2.id, "accepted", later)
    assert closed is not None and closed.id == to_ak2.id
    assert await state.shares_of("f1") == {"AK2": "rw"}  # the share appears
    assert await state.close_invitation(to_ak2.id, "rejected", later) is None  # not pending any more
    assert await state.invitations(invitee="AK2") == []
    [to_ak3] = await state.invitations(invitee="AK3")
    assert await state.close_invitation(to_ak3.id, "canceled", later) is not None
    assert await state.shares_of("f1") == {"AK2": "rw"} and await state.invitations(inviter="AK1") == []
    assert await state.close_invitation("no-such-invitation", "accepted", later) is None


# -- images -----------------------------------------------------------------------------------------------


async def test_image_aliases_round_trip(state: State) -> None:
    assert await state.image_aliases() == []
    assert await state.set_image_alias("py", "python:3.11")
    assert await state.set_image_alias("a", "alpine")
    assert await state.set_image_alias("py", "python:3.12")  # changed
    assert await state.image_aliases() == [ImageAlias("a", "alpine"), ImageAlias("py", "python:3.12")]
    assert await state.set_image_alias("py", None)
    assert not await state.set_image_alias("py", None)
    assert await state.image_aliases() == [ImageAlias("a", "alpine")]


# -- logs -------------------------------------------------------------------------------------------------


async def test_logs_round_trip_stamped_with_the_time_given(state: State, now: datetime) -> None:
    assert await state.log_state("k1") is None and await state.newest_log_seq("k1") == 0
    await state.append_logs([("k1", "one\n"), ("k2", "other\n"), ("k1", "two\n")], now)
    await state.append_logs([("k1", "three\n")], now + timedelta(seconds=1))
    chunks = await state.read_log_chunks("k1")
    assert all(isinstance(c, LogChunk) for c in chunks)
    assert [(c.data, c.ts) for c in chunks] == [
        ("one\n", stamp(now)),
        ("two\n", stamp(now)),
        ("three\n", stamp(now + timedelta(seconds=1))),
    ]
    assert [text for _, text in await state.read_logs("k1")] == ["one\n", "two\n", "three\n"]
    assert await state.newest_log_seq("k1") == chunks[-1].seq
    assert await state.log_seq_before("k1", stamp(now + timedelta(seconds=1))) == chunks[1].seq
    assert await state.log_seq_before("k1", stamp(now)) == 0
    assert await state.log_state("k1") == LogKept(bytes=len("one\ntwo\nthree\n"), dropped=0, purged_at=None)
    page = await state.read_log_page("k1", chunks[0].seq, max_bytes=1)
    assert ([c.data for c in page.chunks], page.more) == (["two\n"], True)  # whole chunks, at least one
    tail = await state.read_log_tail("k1", 2)
    assert ([c.data for c in tail.chunks], tail.newest) == (["two\n", "three\n"], chunks[-1].seq)
    assert await state.log_tail_start("k1", 1) == chunks[1].seq
    assert [c.data for c in await state.read_log_chunks("k1", chunks[-1].seq)] == []


async def test_a_log_is_kept_within_its_bound_with_one_marker(state: State, now: datetime) -> None:
    line = "x" * 127 + "\n"
    for _ in range(4):
        await state.append_logs([("k", line * 256)], now)  # 32 KiB each: 128 KiB against a 64 KiB bound
    kept = await state.log_state("k")
    assert kept is not None and kept.bytes <= 64 * 1024 and kept.dropped == 4 * 256 * 128 - kept.bytes
    first = (await state.read_log_chunks("k"))[0]
    assert first.data.startswith("[bai: ") and first.ts == stamp(now)
    assert await state.cut_logs_to_bound(now) == []  # within the bound already


async def test_purging_without_ended_sessions_purges_nothing(state: State, now: datetime) -> None:
    await state.append_logs([("k", "hi\n")], now)
    assert await state.purge_logs(now + timedelta(days=365), now) == []
    assert [text for _, text in await state.read_logs("k")] == ["hi\n"]


async def test_storage_full_is_the_state_layers_own_error() -> None:
    assert issubclass(StorageFull, Exception) and StorageFull.where


# -- teams (schema 16) ------------------------------------------------------------------------------------


async def test_teams_round_trip_and_the_directory_follows_each_write(state: Any, now: datetime) -> None:
    """Domains, projects, users and members, scaling groups and their associations, a user's keypairs stopping
    with it and its domain: each write is in the directory at once, in both engines."""
    from bai.node.manager.state.team_records import DEFAULT_PROJECT_ID, Domain, Project, ScalingGroup, User, UserChanges

    at = stamp(now)
    assert await state.create_team_record(Domain("acme", "", True, {"cuda.device": "8"}, {}, [], at, at), now)
    assert not await state.create_team_record(Domain("acme", "", True, {}, {}, [], at, at), now)  # (taken)
    project = Project("p-1", "ml", "acme", "", True, {"cuda.device": "2"}, {}, "default", at, at)
    assert await state.create_team_record(project, now)
    assert not await state.create_team_record(Project("p-2", "ml", "acme", "", True, {}, {}, "default", at, at), now)
    user = User("u-1", "a@acme.example", "alice", "Alice", "", "user", "active", "", "acme", "default", False, at, at)
    assert await state.create_user(user, "scrypt$hash", ["p-1"], now)
    assert not await state.create_user(msgspec.structs.replace(user, uuid="u-2"), None, [], now)  # (same email)
    teams = state.teams()
    assert teams.domains["acme"].total_resource_slots == {"cuda.device": "8"}
    assert teams.projects["p-1"] == project and teams.users["u-1"] == user
    assert teams.members["p-1"] == frozenset({"u-1"}) and await state.password_hash("u-1") == "scrypt$hash"
    await state.create_keypair(NewKeypair("AK9", "s9", "a@acme.example"), now)  # (the user of that email)
    assert state.teams().keypair_users["AK9"] == "u-1" and state.active_keypair("AK9") is not None
    # a user's status and its domain's decide whether its keypairs sign
    assert await state.update_user("u-1", UserChanges(status="inactive"), now)
    assert state.active_keypair("AK9") is None and state.teams().users["u-1"].status == "inactive"
    assert await state.update_user("u-1", UserChanges(status="active", projects=[DEFAULT_PROJECT_ID]), now)
    assert state.active_keypair("AK9") is not None
    assert state.teams().members.get("p-1", frozenset()) == frozenset()
    assert await state.update_team_record(Domain, "acme", {"is_active": False}, now)
    assert state.active_keypair("AK9") is None
    assert await state.update_team_record(Domain, "acme", {"is_active": True}, now)
    assert await state.update_team_record(Project, "nope", {"description": "x"}, now) is False
    assert await state.set_members("p-1", ["u-1"], [], now) and state.teams().members["p-1"] == frozenset({"u-1"})
    # scaling groups and where they are open
    assert await state.create_team_record(ScalingGroup("gpu", "", True, True, at), now)
    assert await state.link_scaling_group("gpu", "project", "p-1", True, now)
    assert not await state.link_scaling_group("gpu", "project", "p-1", True, now)  # (already)
    assert state.teams().associations["gpu"].projects == frozenset({"p-1"})
    # what a project's sessions hold
    await state.create_session(
        new_session(project_id="p-1", domain_name="acme", owner="AK9"),
        [NewKernel("k1", "main", 1, {"cuda.device": "1"})],
    )
    usage = await state.project_usage(["PENDING"])
    assert usage["p-1"] == (1, [{"cuda.device": "1"}])
    assert "live session" in (await state.delete_team_record(Project, "p-1", now) or "")
    assert "still has" in (await state.delete_team_record(Domain, "acme", now) or "")
    assert "live session" in (await state.purge_user("u-1", now) or "")
    await state.transition(SID1, S.CANCELLED, now=now)
    assert await state.purge_user("u-1", now) is None
    assert "u-1" not in state.teams().users and await state.keypair("AK9") is None
    assert await state.delete_team_record(Project, "p-1", now) is None and "p-1" not in state.teams().projects
    assert await state.delete_team_record(Domain, "acme", now) is None
    assert await state.delete_team_record(ScalingGroup, "gpu", now) is None and not state.teams().associations


# -- session templates (schema 17) ------------------------------------------------------------------------


async def test_session_templates_round_trip_and_their_owners_bound(state: Any, now: datetime) -> None:
    """Stored together (or none over the owner's bound), listed by owner, read, replaced and deleted by id."""
    from bai.node.manager.rules.session_templates import check_template
    from bai.node.manager.state.template_records import NewTemplate

    raw = {"api_version": "6", "kind": "task_template", "metadata": {"name": "t"}, "spec": {"kernel": {"image": "py"}}}
    first = check_template(raw)
    news = [
        NewTemplate("a", first, "u-1", "AK1", "default", None),
        NewTemplate("b", first, "u-1", "AK1", "default", "g"),
    ]
    ids = await state.create_templates(news, now, 3)
    assert ids is not None and len(ids) == 2 and len(ids[0]) == 32
    assert await state.create_templates(news, now, 3) is None  # 4 > 3: nothing stored
    assert [t.name for t in await state.session_templates("u-1")] == ["a", "b"]
    assert await state.session_templates("u-2") == []
    assert len(await state.session_templates(None)) == 2
    got = await state.session_template(ids[1])
    assert got is not None and (got.group_id, got.type, got.template, got.created_at) == (
        "g",
        "task",
        first,
        stamp(now),
    )
    second = check_template({**raw, "spec": {"kernel": {"image": "other", "environ": {"A": "1"}}}})
    assert await state.replace_session_template(ids[0], "renamed", second, None)
    got = await state.session_template(ids[0])
    assert got is not None and (got.name, got.template.spec.kernel.environ) == ("renamed", {"A": "1"})
    assert not await state.replace_session_template("0" * 32, "x", second, None)
    assert await state.delete_session_template(ids[0]) and not await state.delete_session_template(ids[0])
    assert await state.session_template(ids[0]) is None


# -- resource presets (schema 18) ------------------------------------------------------------------------


async def test_resource_presets_round_trip(state: Any, now: datetime) -> None:
    """Made (not twice under one name), listed by name, replaced (renamed too, not onto another's name), deleted."""
    from bai.node.manager.state.preset_records import ResourcePreset

    small = ResourcePreset("small", {"cpu": "1", "mem": "1073741824"}, 67108864, None, stamp(now))
    gpu = ResourcePreset("gpu", {"cpu": "4", "cuda.device": "1"}, None, "gpus", stamp(now))
    assert await state.create_resource_preset(small) and await state.create_resource_preset(gpu)
    assert not await state.create_resource_preset(small)  # (its name is taken)
    assert await state.resource_presets() == [gpu, small]
    bigger = ResourcePreset("medium", {"cpu": "2"}, None, None, small.created_at)
    assert await state.replace_resource_preset("small", bigger)
    assert not await state.replace_resource_preset("medium", ResourcePreset("gpu", {"cpu": "2"}, None, None, ""))
    assert not await state.replace_resource_preset("small", bigger)  # (no longer there)
    assert await state.resource_presets() == [gpu, bigger]
    assert await state.delete_resource_preset("gpu") and not await state.delete_resource_preset("gpu")
    assert await state.resource_presets() == [bigger]
