"""Tests for bai/node/manager/store.py against a real SQLite file."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import AsyncIterator
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bai.common.status import IllegalTransition, SessionStatus
from bai.node.manager.store import Store

S = SessionStatus
SLOTS = {"cpu": "1", "mem": "1073741824"}


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "manager.db"


@pytest.fixture
async def store(db_path: Path) -> AsyncIterator[Store]:
    st = await Store.open(db_path)
    yield st
    await st.close()


async def make_session(
    store: Store,
    name: str = "mysess01",
    *,
    access_key: str = "AKIAEXAMPLE",
    session_id: str | None = None,
    kernels: int = 1,
) -> tuple[str, list[str]]:
    """Create a session the way Registry.create() does; return (session id, kernel ids)."""
    sid = session_id or str(uuid.uuid4())
    kernel_rows = [
        {"id": str(uuid.uuid4()), "cluster_role": "main" if i == 1 else "sub", "cluster_idx": i, "slots": SLOTS}
        for i in range(1, kernels + 1)
    ]
    session = {
        "id": sid,
        "name": name,
        "access_key": access_key,
        "image": "bai-python:3.11",
        "type": "interactive",
        "requested_slots": SLOTS,
        "environ": {"A": "1"},
        "config": {"startup_command": None, "network": None},
        "scaling_group": "default",
        "tag": "t1",
        "created_at": datetime.now(UTC).isoformat(),
    }
    await store.create_session(session, kernel_rows)
    return sid, [k["id"] for k in kernel_rows]


async def test_ensure_admin_keypair_creates_once(db_path: Path) -> None:
    store = await Store.open(db_path)
    try:
        first = await store.ensure_admin_keypair("AKIAFIRST", "secret-1")
        assert first == ("AKIAFIRST", "secret-1")
        assert await store.ensure_admin_keypair("AKIASECOND", "secret-2") == first
        keypairs = await store.keypairs()
        assert list(keypairs) == ["AKIAFIRST"]
        assert keypairs["AKIAFIRST"]["is_admin"] == 1
    finally:
        await store.close()

    reopened = await Store.open(db_path)
    try:
        assert await reopened.ensure_admin_keypair("AKIATHIRD", "secret-3") == first
        assert list(await reopened.keypairs()) == ["AKIAFIRST"]
    finally:
        await reopened.close()


async def test_create_and_get_session(store: Store) -> None:
    sid, kernel_ids = await make_session(store, kernels=2)
    row = await store.get_session(sid)
    assert row is not None
    assert row["id"] == sid
    assert row["name"] == "mysess01"
    assert row["status"] == "PENDING"
    assert row["status_info"] == ""
    assert row["status_data"] == {}
    assert row["requested_slots"] == SLOTS
    assert row["environ"] == {"A": "1"}
    assert row["config"] == {"startup_command": None, "network": None}
    assert row["cluster_size"] == 2
    assert row["tag"] == "t1"
    assert row["result"] == "UNDEFINED"
    assert row["terminated_at"] is None

    kernels = await store.kernels_of(sid)
    assert [k["id"] for k in kernels] == kernel_ids
    assert [k["cluster_role"] for k in kernels] == ["main", "sub"]
    assert all(k["status"] == "PENDING" and k["occupied_slots"] == SLOTS for k in kernels)
    assert all(k["image"] == "bai-python:3.11" and k["agent_id"] is None for k in kernels)

    transitions = await store.transitions_of(sid)
    assert [t["status"] for t in transitions] == ["PENDING"]


async def test_get_unknown_session_is_none(store: Store) -> None:
    assert await store.get_session(str(uuid.uuid4())) is None
    assert await store.kernels_of(str(uuid.uuid4())) == []


async def test_full_lifecycle_records_every_step(store: Store) -> None:
    sid, [kid] = await make_session(store)
    steps: list[tuple[SessionStatus, str, dict[str, Any]]] = [
        (S.SCHEDULED, "scheduled", {"agent": "a1"}),
        (S.PREPARING, "", {}),
        (S.RUNNING, "", {}),
        (S.TERMINATING, "user-requested", {}),
        (S.TERMINATED, "user-requested", {"exit_code": 0}),
    ]
    for target, info, data in steps:
        updates = {kid: {"agent_id": "a1"}} if target == S.SCHEDULED else None
        row = await store.transition(sid, target, info, data, kernel_updates=updates)
        assert row is not None
        assert row["status"] == target
        assert row["status_info"] == info
        assert row["status_data"] == data
        [kernel] = await store.kernels_of(sid)
        assert kernel["status"] == target
        assert kernel["status_info"] == info
        assert kernel["agent_id"] == "a1"

    transitions = await store.transitions_of(sid)
    assert [t["status"] for t in transitions] == ["PENDING", *(s for s, _, _ in steps)]
    assert [t["status_info"] for t in transitions[1:]] == [i for _, i, _ in steps]
    assert [t["status_data"] for t in transitions[1:]] == [d for _, _, d in steps]
    times = [datetime.fromisoformat(t["at"]) for t in transitions]
    assert all(t.tzinfo is not None for t in times)
    assert times == sorted(times)

    row = await store.get_session(sid)
    assert row is not None
    assert row["terminated_at"] is not None
    assert datetime.fromisoformat(row["terminated_at"]) >= times[-2]
    [kernel] = await store.kernels_of(sid)
    assert kernel["terminated_at"] is not None


async def test_terminated_at_only_set_at_the_end(store: Store) -> None:
    sid, _ = await make_session(store)
    row = await store.transition(sid, S.SCHEDULED, "scheduled")
    assert row is not None and row["terminated_at"] is None


async def test_transition_result_column(store: Store) -> None:
    sid, _ = await make_session(store)
    row = await store.transition(sid, S.CANCELLED, "user-requested", result="FAILURE")
    assert row is not None
    assert row["result"] == "FAILURE"
    assert row["terminated_at"] is not None


async def test_illegal_transition_raises_and_changes_nothing(store: Store) -> None:
    sid, _ = await make_session(store)
    before = await store.get_session(sid)
    with pytest.raises(IllegalTransition):
        await store.transition(sid, S.RUNNING, "nope")
    assert await store.get_session(sid) == before
    assert [t["status"] for t in await store.transitions_of(sid)] == ["PENDING"]
    [kernel] = await store.kernels_of(sid)
    assert kernel["status"] == "PENDING"


async def test_illegal_transition_from_dead_status(store: Store) -> None:
    sid, _ = await make_session(store)
    await store.transition(sid, S.CANCELLED, "user-requested")
    with pytest.raises(IllegalTransition):
        await store.transition(sid, S.SCHEDULED)
    row = await store.get_session(sid)
    assert row is not None and row["status"] == "CANCELLED"


async def test_allowed_from_mismatch_returns_none(store: Store) -> None:
    sid, _ = await make_session(store)
    before = await store.get_session(sid)
    assert await store.transition(sid, S.TERMINATED, "x", allowed_from=[S.RUNNING, S.ERROR]) is None
    assert await store.get_session(sid) == before
    assert len(await store.transitions_of(sid)) == 1
    # a matching allowed_from goes through
    row = await store.transition(sid, S.SCHEDULED, "scheduled", allowed_from=[S.PENDING])
    assert row is not None and row["status"] == "SCHEDULED"


async def test_transition_of_unknown_session_is_none(store: Store) -> None:
    assert await store.transition(str(uuid.uuid4()), S.SCHEDULED) is None


async def test_find_sessions(store: Store) -> None:
    sid, _ = await make_session(store, "alpha-1", session_id="3f2b1c9e-0000-4000-8000-000000000001")
    other, _ = await make_session(store, "beta-1", session_id="7a7a7a7a-0000-4000-8000-000000000002")

    assert [r["id"] for r in await store.find_sessions(sid, None, active_only=False)] == [sid]
    assert [r["id"] for r in await store.find_sessions("alpha-1", None, active_only=False)] == [sid]
    assert [r["id"] for r in await store.find_sessions("3f2b1c9e", None, active_only=False)] == [sid]
    assert [r["id"] for r in await store.find_sessions("3f2b1c9e-00", None, active_only=False)] == [sid]
    assert await store.find_sessions("3f2b1c9", None, active_only=False) == []  # 7 chars: no prefix match
    assert await store.find_sessions("gamma", None, active_only=False) == []
    assert [r["id"] for r in await store.find_sessions("beta-1", None, active_only=False)] == [other]


async def test_find_sessions_by_access_key(store: Store) -> None:
    mine, _ = await make_session(store, "shared", access_key="AKIAMINE")
    theirs, _ = await make_session(store, "shared", access_key="AKIATHEIRS")
    assert [r["id"] for r in await store.find_sessions("shared", "AKIAMINE", active_only=False)] == [mine]
    both = await store.find_sessions("shared", None, active_only=False)
    assert [r["id"] for r in both] == [theirs, mine]  # newest first


async def test_find_sessions_active_only_excludes_terminated(store: Store) -> None:
    old, _ = await make_session(store, "reused")
    await store.transition(old, S.TERMINATED, "user-requested")
    new, _ = await make_session(store, "reused")
    assert [r["id"] for r in await store.find_sessions("reused", None, active_only=True)] == [new]
    assert [r["id"] for r in await store.find_sessions("reused", None, active_only=False)] == [new, old]
    assert await store.find_sessions(old, None, active_only=True) == []


async def test_find_sessions_treats_wildcards_literally(store: Store) -> None:
    await make_session(store, "alpha-1")
    assert await store.find_sessions("________", None, active_only=False) == []


async def test_list_sessions_by_status(store: Store) -> None:
    a, _ = await make_session(store, "sess-a")
    b, _ = await make_session(store, "sess-b")
    c, _ = await make_session(store, "sess-c", access_key="AKIAOTHER")
    await store.transition(b, S.SCHEDULED, "scheduled")

    assert [r["id"] for r in await store.list_sessions(None, [S.PENDING])] == [a, c]
    assert [r["id"] for r in await store.list_sessions(None, [S.SCHEDULED])] == [b]
    assert [r["id"] for r in await store.list_sessions(None, [S.PENDING, S.SCHEDULED])] == [a, b, c]
    assert [r["id"] for r in await store.list_sessions(None, None)] == [a, b, c]
    assert [r["id"] for r in await store.list_sessions("AKIAOTHER", None)] == [c]
    assert await store.list_sessions(None, [S.RUNNING]) == []
    assert [r["id"] for r in await store.list_sessions(None, None, limit=2)] == [a, b]


async def test_logs_ordering_and_paging(store: Store) -> None:
    await store.append_logs([("k1", "one\n"), ("k2", "other\n"), ("k1", "two\n")])
    await store.append_logs([("k1", "three\n")])
    logs = await store.read_logs("k1")
    assert [text for _, text in logs] == ["one\n", "two\n", "three\n"]
    seqs = [seq for seq, _ in logs]
    assert seqs == sorted(seqs) and len(set(seqs)) == 3

    after_first = await store.read_logs("k1", after_seq=seqs[0])
    assert [text for _, text in after_first] == ["two\n", "three\n"]
    assert await store.read_logs("k1", after_seq=seqs[-1]) == []
    assert [text for _, text in await store.read_logs("k1", limit=1)] == ["one\n"]
    assert [text for _, text in await store.read_logs("k2")] == ["other\n"]
    assert await store.read_logs("k-none") == []


async def test_set_pending_info_only_touches_pending(store: Store) -> None:
    pending, _ = await make_session(store, "pending")
    running, _ = await make_session(store, "running")
    await store.transition(running, S.SCHEDULED, "scheduled")

    await store.set_pending_info(pending, "no-available-instances", {"msg": "cpu 8 requested, 4 free"})
    await store.set_pending_info(running, "no-available-instances", {"msg": "x"})

    row = await store.get_session(pending)
    assert row is not None
    assert row["status"] == "PENDING"
    assert row["status_info"] == "no-available-instances"
    assert row["status_data"] == {"msg": "cpu 8 requested, 4 free"}
    assert len(await store.transitions_of(pending)) == 1  # no transition row

    row = await store.get_session(running)
    assert row is not None
    assert row["status"] == "SCHEDULED"
    assert row["status_info"] == "scheduled"
    assert row["status_data"] == {}


async def test_data_survives_close_and_reopen(db_path: Path) -> None:
    store = await Store.open(db_path)
    try:
        sid, [kid] = await make_session(store)
        await store.transition(sid, S.SCHEDULED, "scheduled")
        await store.append_logs([(kid, "hello\n")])
        await store.upsert_agent(
            {
                "id": "a1",
                "hostname": "h",
                "backend": "local",
                "version": "0.1",
                "scaling_group": "default",
                "slots": SLOTS,
            }
        )
        assert (db_path.parent / (db_path.name + "-wal")).exists()  # WAL mode while open
    finally:
        await store.close()

    with closing(sqlite3.connect(db_path)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"

    reopened = await Store.open(db_path)
    try:
        row = await reopened.get_session(sid)
        assert row is not None and row["status"] == "SCHEDULED"
        assert [t["status"] for t in await reopened.transitions_of(sid)] == ["PENDING", "SCHEDULED"]
        assert [k["id"] for k in await reopened.kernels_of(sid)] == [kid]
        assert [text for _, text in await reopened.read_logs(kid)] == ["hello\n"]
        [agent] = await reopened.agents()
        assert agent["id"] == "a1" and agent["slots"] == SLOTS and agent["status"] == "ALIVE"
    finally:
        await reopened.close()
