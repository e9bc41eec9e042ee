"""Tests for bai/node/manager/state/ against a real SQLite file."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from msgspec import structs

from bai.common.status import IllegalTransition, SessionStatus
from bai.node.manager.http.requests import CreateRequest, parse_create
from bai.node.manager.services.lifecycle import new_session_rows
from bai.node.manager.state import SchemaTooNew, Store
from bai.node.manager.state.records import (
    KernelChanges,
    LogKept,
    NewAgent,
    NewKernel,
    NewSession,
    NewVFolder,
    PolicyFields,
    SchedulingAttempt,
)
from bai.node.manager.state.sqlite import migrations as schema

S = SessionStatus
SLOTS = {"cpu": "1", "mem": "1073741824"}

NOW = datetime(2026, 1, 1, tzinfo=UTC)  # when the writes of these tests are stamped


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "manager.db"


@pytest.fixture
async def store(db_path: Path) -> AsyncIterator[Store]:
    st = await Store.open(db_path)
    yield st
    await st.close()


def new_rows(req: CreateRequest, access_key: str) -> tuple[NewSession, list[NewKernel]]:
    """The records Sessions.create stores for a parsed request (new_session_rows)."""
    return new_session_rows(req, access_key, datetime.now(UTC))


def attempt(session_id: str, outcome: str, msg: str = "") -> SchedulingAttempt:
    """A scheduling round's history row for a session (no agents, no failed predicates)."""
    return SchedulingAttempt(session_id, outcome, "", msg, "", [])


async def make_session(
    store: Store,
    name: str = "mysess01",
    *,
    access_key: str = "AKIAEXAMPLE",
    session_id: str | None = None,
    kernels: int = 1,
) -> tuple[str, list[str]]:
    """Store a session as Sessions.create does (a parsed request, its rows); (session id, kernel ids).
    `kernels` > 1 adds sub kernels (as a cluster session would have)."""
    body = {"image": "bai-python:3.11", "name": name, "tag": "t1", "config": {"environ": {"A": "1"}}}
    req = parse_create(body, {"cpu", "mem"}, {"cpu": "1", "mem": "1g"}, {}, datetime.now(UTC))
    session, kernel_rows = new_rows(req, access_key)
    if session_id is not None:
        session = structs.replace(session, id=session_id)
    for i in range(2, kernels + 1):
        kernel_rows.append(structs.replace(kernel_rows[0], id=str(uuid.uuid4()), cluster_role="sub", cluster_idx=i))
    await store.create_session(session, kernel_rows)
    return session.id, [k.id for k in kernel_rows]


async def test_ensure_admin_keypair_creates_once(db_path: Path) -> None:
    store = await Store.open(db_path)
    try:
        first = await store.ensure_admin_keypair("AKIAFIRST", "secret-1", NOW)
        assert first == ("AKIAFIRST", "secret-1")
        assert await store.ensure_admin_keypair("AKIASECOND", "secret-2", NOW) == first
        keypairs = await store.keypairs()
        assert list(keypairs) == ["AKIAFIRST"]
        assert keypairs["AKIAFIRST"].is_admin
    finally:
        await store.close()

    reopened = await Store.open(db_path)
    try:
        assert await reopened.ensure_admin_keypair("AKIATHIRD", "secret-3", NOW) == first
        assert list(await reopened.keypairs()) == ["AKIAFIRST"]
    finally:
        await reopened.close()


async def test_create_and_get_session(store: Store) -> None:
    sid, kernel_ids = await make_session(store, kernels=2)
    row = await store.get_session(sid)
    assert row is not None
    assert row.id == sid
    assert row.name == "mysess01"
    assert row.status == "PENDING"
    assert row.status_info == ""
    assert row.status_data == {}
    assert row.requested_slots == SLOTS
    assert row.environ == {"A": "1"}
    assert row.config == {**row.config, "startup_command": None, "network": None, "depends_on": [], "mounts": []}
    assert row.cluster_size == 2
    assert row.tag == "t1"
    assert row.result == "UNDEFINED"
    assert row.terminated_at is None

    kernels = await store.kernels_of(sid)
    assert [k.id for k in kernels] == kernel_ids
    assert [k.cluster_role for k in kernels] == ["main", "sub"]
    assert all(k.status == "PENDING" and k.occupied_slots == SLOTS for k in kernels)
    assert all(k.image == "bai-python:3.11" and k.agent_id is None for k in kernels)

    transitions = await store.transitions_of(sid)
    assert [t.status for t in transitions] == ["PENDING"]


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
        updates = {kid: KernelChanges(agent_id="a1")} if target == S.SCHEDULED else None
        row = await store.transition(sid, target, info, data, kernel_updates=updates, now=datetime.now(UTC))
        assert row is not None
        assert row.status == target
        assert row.status_info == info
        assert row.status_data == data
        [kernel] = await store.kernels_of(sid)
        assert kernel.status == target
        assert kernel.status_info == info
        assert kernel.agent_id == "a1"

    transitions = await store.transitions_of(sid)
    assert [t.status for t in transitions] == ["PENDING", *(s for s, _, _ in steps)]
    assert [t.status_info for t in transitions[1:]] == [i for _, i, _ in steps]
    assert [t.status_data for t in transitions[1:]] == [d for _, _, d in steps]
    times = [datetime.fromisoformat(t.at) for t in transitions]
    assert all(t.tzinfo is not None for t in times)
    assert times == sorted(times)

    row = await store.get_session(sid)
    assert row is not None
    assert row.terminated_at is not None
    assert datetime.fromisoformat(row.terminated_at) >= times[-2]
    [kernel] = await store.kernels_of(sid)
    assert kernel.terminated_at is not None


async def test_terminated_at_only_set_at_the_end(store: Store) -> None:
    sid, _ = await make_session(store)
    row = await store.transition(sid, S.SCHEDULED, "scheduled", now=datetime.now(UTC))
    assert row is not None and row.terminated_at is None


async def test_transition_result_column(store: Store) -> None:
    sid, _ = await make_session(store)
    row = await store.transition(sid, S.CANCELLED, "user-requested", result="FAILURE", now=datetime.now(UTC))
    assert row is not None
    assert row.result == "FAILURE"
    assert row.terminated_at is not None


async def test_illegal_transition_raises_and_changes_nothing(store: Store) -> None:
    sid, _ = await make_session(store)
    before = await store.get_session(sid)
    with pytest.raises(IllegalTransition):
        await store.transition(sid, S.RUNNING, "nope", now=datetime.now(UTC))
    assert await store.get_session(sid) == before
    assert [t.status for t in await store.transitions_of(sid)] == ["PENDING"]
    [kernel] = await store.kernels_of(sid)
    assert kernel.status == "PENDING"


async def test_illegal_transition_from_dead_status(store: Store) -> None:
    sid, _ = await make_session(store)
    await store.transition(sid, S.CANCELLED, "user-requested", now=datetime.now(UTC))
    with pytest.raises(IllegalTransition):
        await store.transition(sid, S.SCHEDULED, now=datetime.now(UTC))
    row = await store.get_session(sid)
    assert row is not None and row.status == "CANCELLED"


async def test_allowed_from_mismatch_returns_none(store: Store) -> None:
    sid, _ = await make_session(store)
    before = await store.get_session(sid)
    assert (
        await store.transition(sid, S.TERMINATED, "x", allowed_from=[S.RUNNING, S.ERROR], now=datetime.now(UTC)) is None
    )
    assert await store.get_session(sid) == before
    assert len(await store.transitions_of(sid)) == 1
    # a matching allowed_from goes through
    row = await store.transition(sid, S.SCHEDULED, "scheduled", allowed_from=[S.PENDING], now=datetime.now(UTC))
    assert row is not None and row.status == "SCHEDULED"


async def test_transition_of_unknown_session_is_none(store: Store) -> None:
    assert await store.transition(str(uuid.uuid4()), S.SCHEDULED, now=datetime.now(UTC)) is None


async def test_a_transition_returns_the_row_as_stored(store: Store) -> None:
    sid, [kid] = await make_session(store)
    steps: list[tuple[SessionStatus, dict[str, Any]]] = [
        (S.SCHEDULED, {"kernel_updates": {kid: KernelChanges(agent_id="a1")}}),
        (S.PREPARING, {"allowed_from": [S.SCHEDULED]}),
        (S.RUNNING, {"allowed_from": [S.PREPARING], "kernel_updates": {kid: KernelChanges(container_id="c1")}}),
        (S.TERMINATING, {"result": "SUCCESS", "allowed_from": (s for s in [S.RUNNING])}),  # any iterable
        (S.TERMINATED, {}),
    ]
    for target, kw in steps:
        row = await store.transition(
            sid, target, "info", {"exitCode": 0, "nested": {"a": [1]}}, **kw, now=datetime.now(UTC)
        )
        assert row == await store.get_session(sid)
        assert row is not None and row.status == target.value and row.status_data["nested"] == {"a": [1]}
    assert row is not None and row.result == "SUCCESS" and row.terminated_at == row.status_changed
    [kernel] = await store.kernels_of(sid)
    assert (kernel.status, kernel.agent_id, kernel.container_id) == ("TERMINATED", "a1", "c1")
    assert kernel.terminated_at is not None
    assert [t.status for t in await store.transitions_of(sid)] == [
        "PENDING",
        "SCHEDULED",
        "PREPARING",
        "RUNNING",
        "TERMINATING",
        "TERMINATED",
    ]


async def test_a_transition_to_the_current_status_changes_nothing(store: Store) -> None:
    sid, _ = await make_session(store)
    await store.transition(sid, S.SCHEDULED, "scheduled", now=datetime.now(UTC))
    before = await store.get_session(sid)
    assert await store.transition(sid, S.SCHEDULED, "again", now=datetime.now(UTC)) is None
    assert await store.get_session(sid) == before
    assert len(await store.transitions_of(sid)) == 2


async def test_an_allowed_but_illegal_move_raises(store: Store) -> None:
    sid, _ = await make_session(store)
    before = await store.get_session(sid)
    with pytest.raises(IllegalTransition):  # PENDING is allowed by the caller, but PENDING -> RUNNING is not
        await store.transition(sid, S.RUNNING, "nope", allowed_from=[S.PENDING], now=datetime.now(UTC))
    assert await store.get_session(sid) == before


async def test_create_or_get_returns_the_stored_row_last_in_the_queue(store: Store) -> None:
    seqs = []
    for name in ("first-1", "second-1"):
        body = {"image": "bai-python:3.11", "name": name, "config": {"environ": {"A": "1"}}}
        req = parse_create(body, {"cpu", "mem"}, {"cpu": "1", "mem": "1g"}, {}, datetime.now(UTC))
        session, kernels = new_rows(req, "AKIAEXAMPLE")
        row, created = await store.create_or_get_session(session, kernels)
        assert created and row == await store.get_session(session.id)
        assert row.status == "PENDING" and row.config["depends_on"] == [] and row.environ == {"A": "1"}
        seqs.append(row.seq)
        again, created = await store.create_or_get_session(new_rows(req, "AKIAEXAMPLE")[0], kernels)
        assert not created and again == row
    assert seqs[1] > seqs[0]


async def test_a_round_merges_or_adds_each_sessions_scheduling_history(store: Store) -> None:
    """Each session's row is merged with its last one when nothing changed, else a row is added: for many
    sessions in one round, and for a session named twice in one round."""
    a, _ = await make_session(store, "hist-a")
    b, _ = await make_session(store, "hist-b")
    c, _ = await make_session(store, "hist-c")

    await store.apply_round([], [], [], [attempt(a, "wait"), attempt(b, "wait")], datetime.now(UTC))
    await store.apply_round(
        [], [], [], [attempt(a, "wait"), attempt(b, "wait", "other"), attempt(c, "wait")], datetime.now(UTC)
    )
    await store.apply_round([], [], [], [attempt(a, "wait"), attempt(c, "x"), attempt(c, "x")], datetime.now(UTC))
    history = {sid: await store.scheduling_history(sid) for sid in (a, b, c)}
    assert [(h.outcome, h.rounds) for h in history[a]] == [("wait", 3)]
    assert [(h.msg, h.rounds) for h in history[b]] == [("", 1), ("other", 1)]
    assert [(h.outcome, h.rounds) for h in history[c]] == [("wait", 1), ("x", 2)]


async def test_starting_a_session_reads_its_owners_dotfiles_as_they_are_now(store: Store) -> None:
    """start_preparing knows which keypairs have dotfiles without a read per session: each write of dotfiles
    (put, delete, a keypair's removal) is seen by the next start."""

    async def start(name: str) -> list[str]:
        sid, [kid] = await make_session(store, name)
        await store.apply_round([(sid, {kid: "a1"})], [], [], [], datetime.now(UTC))
        started = await store.start_preparing(sid, datetime.now(UTC))
        assert started is not None
        row, kernels, dotfiles = started
        assert row.status == "PREPARING" and [k.id for k in kernels] == [kid]
        assert kernels[0].status == "PREPARING" and kernels[0].agent_id == "a1"
        return [d.path for d in dotfiles]

    assert await start("dots-1") == []
    await store.put_dotfile("AKIAEXAMPLE", ".bashrc", "x", "644")
    await store.put_dotfile("AKIAOTHER", ".vimrc", "y", "644")
    assert await start("dots-2") == [".bashrc"]
    await store.put_dotfile("AKIAEXAMPLE", ".zshrc", "z", "644")
    assert await start("dots-3") == [".bashrc", ".zshrc"]
    assert await store.delete_dotfile("AKIAEXAMPLE", ".bashrc")
    assert await start("dots-4") == [".zshrc"]
    await store.delete_keypair("AKIAEXAMPLE")
    assert await start("dots-5") == []


async def test_find_sessions(store: Store) -> None:
    sid, _ = await make_session(store, "alpha-1", session_id="3f2b1c9e-0000-4000-8000-000000000001")
    other, _ = await make_session(store, "beta-1", session_id="7a7a7a7a-0000-4000-8000-000000000002")

    assert [r.id for r in await store.find_sessions(sid, None, active_only=False)] == [sid]
    assert [r.id for r in await store.find_sessions("alpha-1", None, active_only=False)] == [sid]
    assert [r.id for r in await store.find_sessions("3f2b1c9e", None, active_only=False)] == [sid]
    assert [r.id for r in await store.find_sessions("3f2b1c9e-00", None, active_only=False)] == [sid]
    assert await store.find_sessions("3f2b1c9", None, active_only=False) == []  # 7 chars: no prefix match
    assert await store.find_sessions("gamma", None, active_only=False) == []
    assert [r.id for r in await store.find_sessions("beta-1", None, active_only=False)] == [other]


async def test_find_sessions_by_access_key(store: Store) -> None:
    mine, _ = await make_session(store, "shared", access_key="AKIAMINE")
    theirs, _ = await make_session(store, "shared", access_key="AKIATHEIRS")
    assert [r.id for r in await store.find_sessions("shared", "AKIAMINE", active_only=False)] == [mine]
    both = await store.find_sessions("shared", None, active_only=False)
    assert [r.id for r in both] == [theirs, mine]  # newest first


async def test_find_sessions_active_only_excludes_terminated(store: Store) -> None:
    old, _ = await make_session(store, "reused")
    await store.transition(old, S.TERMINATED, "user-requested", now=datetime.now(UTC))
    new, _ = await make_session(store, "reused")
    assert [r.id for r in await store.find_sessions("reused", None, active_only=True)] == [new]
    assert [r.id for r in await store.find_sessions("reused", None, active_only=False)] == [new, old]
    assert await store.find_sessions(old, None, active_only=True) == []


async def test_find_sessions_treats_wildcards_literally(store: Store) -> None:
    await make_session(store, "alpha-1")
    assert await store.find_sessions("________", None, active_only=False) == []


async def test_list_sessions_by_status(store: Store) -> None:
    a, _ = await make_session(store, "sess-a")
    b, _ = await make_session(store, "sess-b")
    c, _ = await make_session(store, "sess-c", access_key="AKIAOTHER")
    await store.transition(b, S.SCHEDULED, "scheduled", now=datetime.now(UTC))

    assert [r.id for r in await store.list_sessions(None, [S.PENDING])] == [a, c]
    assert [r.id for r in await store.list_sessions(None, [S.SCHEDULED])] == [b]
    assert [r.id for r in await store.list_sessions(None, [S.PENDING, S.SCHEDULED])] == [a, b, c]
    assert [r.id for r in await store.list_sessions(None, None)] == [a, b, c]
    assert [r.id for r in await store.list_sessions("AKIAOTHER", None)] == [c]
    assert await store.list_sessions(None, [S.RUNNING]) == []
    assert [r.id for r in await store.list_sessions(None, None, limit=2)] == [a, b]


async def test_logs_ordering_and_paging(store: Store) -> None:
    await store.append_logs([("k1", "one\n"), ("k2", "other\n"), ("k1", "two\n")], NOW)
    await store.append_logs([("k1", "three\n")], NOW)
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
    await store.transition(running, S.SCHEDULED, "scheduled", now=datetime.now(UTC))

    await store.set_pending_info(pending, "no-available-instances", {"msg": "cpu 8 requested, 4 free"})
    await store.set_pending_info(running, "no-available-instances", {"msg": "x"})

    row = await store.get_session(pending)
    assert row is not None
    assert row.status == "PENDING"
    assert row.status_info == "no-available-instances"
    assert row.status_data == {"msg": "cpu 8 requested, 4 free"}
    assert len(await store.transitions_of(pending)) == 1  # no transition row

    row = await store.get_session(running)
    assert row is not None
    assert row.status == "SCHEDULED"
    assert row.status_info == "scheduled"
    assert row.status_data == {}


async def test_data_survives_close_and_reopen(db_path: Path) -> None:
    store = await Store.open(db_path)
    try:
        sid, [kid] = await make_session(store)
        await store.transition(sid, S.SCHEDULED, "scheduled", now=datetime.now(UTC))
        await store.append_logs([(kid, "hello\n")], NOW)
        await store.upsert_agent(NewAgent("a1", "h", "local", "0.1", "default", SLOTS), NOW)
        assert (db_path.parent / (db_path.name + "-wal")).exists()  # WAL mode while open
    finally:
        await store.close()

    with closing(sqlite3.connect(db_path)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"

    reopened = await Store.open(db_path)
    try:
        row = await reopened.get_session(sid)
        assert row is not None and row.status == "SCHEDULED"
        assert [t.status for t in await reopened.transitions_of(sid)] == ["PENDING", "SCHEDULED"]
        assert [k.id for k in await reopened.kernels_of(sid)] == [kid]
        assert [text for _, text in await reopened.read_logs(kid)] == ["hello\n"]
        [agent] = await reopened.agents()
        assert agent.id == "a1" and agent.slots == SLOTS and agent.status == "ALIVE"
    finally:
        await reopened.close()


# -- the schema's versions (PRAGMA user_version) ----------------------------------------------------------

# The schema of the first bai (commit cfc5b46), before schemas had versions: its databases have user_version 0.
FIRST_BAI_SCHEMA = """
CREATE TABLE keypairs (
    access_key TEXT PRIMARY KEY,
    secret_key TEXT NOT NULL,
    user_id TEXT NOT NULL,
    is_admin INTEGER NOT NULL DEFAULT 0,
    is_active INTEGER NOT NULL DEFAULT 1,
    resource_policy TEXT NOT NULL DEFAULT 'default',
    created_at TEXT NOT NULL
);
CREATE TABLE agents (
    id TEXT PRIMARY KEY,
    hostname TEXT NOT NULL,
    backend TEXT NOT NULL,
    version TEXT NOT NULL,
    scaling_group TEXT NOT NULL,
    status TEXT NOT NULL,
    slots TEXT NOT NULL,
    first_contact TEXT NOT NULL,
    last_seen TEXT NOT NULL
);
CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    access_key TEXT NOT NULL,
    image TEXT NOT NULL,
    type TEXT NOT NULL,
    status TEXT NOT NULL,
    status_info TEXT NOT NULL DEFAULT '',
    status_data TEXT NOT NULL DEFAULT '{}',
    status_changed TEXT NOT NULL,
    requested_slots TEXT NOT NULL,
    environ TEXT NOT NULL DEFAULT '{}',
    config TEXT NOT NULL DEFAULT '{}',
    scaling_group TEXT NOT NULL DEFAULT 'default',
    cluster_size INTEGER NOT NULL DEFAULT 1,
    tag TEXT,
    result TEXT NOT NULL DEFAULT 'UNDEFINED',
    created_at TEXT NOT NULL,
    terminated_at TEXT,
    seq INTEGER NOT NULL
);
CREATE INDEX sessions_status ON sessions(status, seq);
CREATE INDEX sessions_name ON sessions(access_key, name);
CREATE TABLE session_transitions (
    session_id TEXT NOT NULL,
    status TEXT NOT NULL,
    status_info TEXT NOT NULL,
    status_data TEXT NOT NULL,
    at TEXT NOT NULL
);
CREATE INDEX transitions_session ON session_transitions(session_id);
CREATE TABLE kernels (
    id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    cluster_role TEXT NOT NULL,
    cluster_idx INTEGER NOT NULL,
    image TEXT NOT NULL,
    agent_id TEXT,
    container_id TEXT,
    status TEXT NOT NULL,
    status_info TEXT NOT NULL DEFAULT '',
    status_changed TEXT NOT NULL,
    occupied_slots TEXT NOT NULL,
    exit_code INTEGER,
    created_at TEXT NOT NULL,
    terminated_at TEXT
);
CREATE INDEX kernels_session ON kernels(session_id);
CREATE TABLE kernel_logs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    kernel_id TEXT NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX kernel_logs_kernel ON kernel_logs(kernel_id, seq);
"""
OLD_SESSION = "0f0f0f0f-0000-4000-8000-000000000001"
OLD_KERNEL = "0f0f0f0f-0000-4000-8000-0000000000aa"
OLD_TIME = "2026-11-29T10:00:00+00:00"


def write_first_bai_database(path: Path) -> None:
    """A database as the first bai left it: WAL, no auto-vacuum, user_version 0, a keypair, an agent, a
    RUNNING session with its kernel, transitions and log."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.executescript(FIRST_BAI_SCHEMA)
        conn.execute("INSERT INTO keypairs VALUES ('AKIAOLD', 'old-secret', 'admin', 1, 1, 'default', ?)", (OLD_TIME,))
        conn.execute(
            "INSERT INTO agents VALUES ('a-old', 'host', 'docker', '0.1', 'default', 'ALIVE', ?, ?, ?)",
            (json.dumps(SLOTS), OLD_TIME, OLD_TIME),
        )
        conn.execute(
            "INSERT INTO sessions(id, name, access_key, image, type, status, status_changed, requested_slots, "
            "created_at, seq) VALUES (?, 'old-sess', 'AKIAOLD', 'bai-python:3.11', 'interactive', 'RUNNING', "
            "?, ?, ?, 1)",
            (OLD_SESSION, OLD_TIME, json.dumps(SLOTS), OLD_TIME),
        )
        for status in ("PENDING", "SCHEDULED", "PREPARING", "RUNNING"):
            conn.execute("INSERT INTO session_transitions VALUES (?, ?, '', '{}', ?)", (OLD_SESSION, status, OLD_TIME))
        conn.execute(
            "INSERT INTO kernels(id, session_id, cluster_role, cluster_idx, image, agent_id, status, status_changed, "
            "occupied_slots, created_at) VALUES (?, ?, 'main', 1, 'bai-python:3.11', 'a-old', 'RUNNING', ?, ?, ?)",
            (OLD_KERNEL, OLD_SESSION, OLD_TIME, json.dumps(SLOTS), OLD_TIME),
        )
        conn.executemany(
            "INSERT INTO kernel_logs(kernel_id, data) VALUES (?, ?)", [(OLD_KERNEL, "héllo\n"), (OLD_KERNEL, "bye\n")]
        )
        conn.commit()


def shape(path: Path) -> dict[str, Any]:
    """What a database's schema is, whatever the order of its columns: the columns of each table (name, type,
    not null, default, primary key), each index (table, unique, partial, columns), and the version."""
    with closing(sqlite3.connect(path)) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        out: dict[str, Any] = {
            "version": conn.execute("PRAGMA user_version").fetchone()[0],
            "auto_vacuum": conn.execute("PRAGMA auto_vacuum").fetchone()[0],
        }
        for table in tables:
            out[table] = {tuple(r[1:]) for r in conn.execute(f"PRAGMA table_info({table})")}
            for index in conn.execute(f"PRAGMA index_list({table})").fetchall():
                columns = [r[2] for r in conn.execute(f"PRAGMA index_info({index[1]})")]
                out[f"index {index[1]}"] = (table, index[2], index[4], columns)
        return out


def schema_sql(path: Path) -> list[tuple[str, str]]:
    with closing(sqlite3.connect(path)) as conn:
        return conn.execute("SELECT name, sql FROM sqlite_master ORDER BY name").fetchall()


async def test_a_new_database_has_the_latest_version(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    store = await Store.open(path)
    await store.close()
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == schema.LATEST
        assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # incremental
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        # the log chunk's size comes ahead of its data (reading it does not walk the data's overflow pages)
        columns = [r[1] for r in conn.execute("PRAGMA table_info(kernel_logs)")]
        assert columns.index("size") < columns.index("data")


async def test_a_database_of_the_first_bai_is_upgraded_and_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    write_first_bai_database(path)
    store = await Store.open(path)
    try:
        assert await store.ensure_admin_keypair("AKIANEW", "new", NOW) == ("AKIAOLD", "old-secret")
        row = await store.get_session(OLD_SESSION)
        assert row is not None and row.name == "old-sess" and row.status == "RUNNING"
        assert row.requested_slots == SLOTS and row.status_data == {}
        assert [t.status for t in await store.transitions_of(OLD_SESSION)] == [
            "PENDING",
            "SCHEDULED",
            "PREPARING",
            "RUNNING",
        ]
        [kernel] = await store.kernels_of(OLD_SESSION)
        assert kernel.id == OLD_KERNEL and kernel.agent_id == "a-old" and kernel.devices == []
        [agent] = await store.agents()
        assert agent.id == "a-old" and agent.slots == SLOTS
        # the log, and its running total counted from what was stored
        assert [c[1:] for c in await store.read_log_chunks(OLD_KERNEL)] == [("héllo\n", None), ("bye\n", None)]
        assert await store.log_state(OLD_KERNEL) == LogKept(bytes=11, dropped=0, purged_at=None)
        await store.append_logs([(OLD_KERNEL, "more\n")], NOW)
        assert [text for _, text in await store.read_logs(OLD_KERNEL)] == ["héllo\n", "bye\n", "more\n"]
        # what later versions added works on it
        policies = await store.policies()
        assert policies["default"].max_vfolder_count == 0
        await store.update_kernel(OLD_KERNEL, KernelChanges(devices=[["GPU-1", 1]]))
        changed = await store.get_kernel(OLD_KERNEL)
        assert changed is not None and changed.devices == [["GPU-1", 1]]
        folder = NewVFolder("f1", "data", "local", "AKIAOLD", "general")
        assert await store.create_vfolder(folder, NOW)
        assert await store.set_image_alias("py", "bai-python:3.11")
        await store.put_dotfile("AKIAOLD", ".bashrc", "x", "644")
        await store.apply_round([], [], [], [attempt(OLD_SESSION, "x")], datetime.now(UTC))
        assert len(await store.scheduling_history(OLD_SESSION)) == 1
    finally:
        await store.close()
    # the same tables, columns and indexes as a new database has (the order of columns aside)
    await (await Store.open(tmp_path / "new.db")).close()
    assert shape(path) == shape(tmp_path / "new.db")


@pytest.mark.parametrize("version", range(1, schema.LATEST))
async def test_a_database_at_any_earlier_version_is_upgraded(tmp_path: Path, version: int) -> None:
    """One that went through the steps up to `version` (and then, say, stopped), recorded or not (a bai from
    before versions: user_version 0)."""
    for recorded in (True, False):
        path = tmp_path / f"v{version}-{recorded}.db"
        with closing(sqlite3.connect(path, isolation_level=None)) as conn:
            for step in schema.STEPS[:version]:
                if step.before:
                    step.before(conn)
                step.apply(conn)
            conn.execute(f"PRAGMA user_version={version if recorded else 0}")
        store = await Store.open(path)
        try:
            sid, [kid] = await make_session(store)
            await store.append_logs([(kid, "hi\n")], NOW)
            assert await store.read_logs(kid) != []
        finally:
            await store.close()
        await (await Store.open(tmp_path / "new.db")).close()
        assert shape(path) == shape(tmp_path / "new.db")


async def test_schema_12_bounds_every_existing_policys_queue_and_indexes_sessions_by_owner(tmp_path: Path) -> None:
    """A database of schema 11 with policies and sessions: each policy, the default and the operator's own, gets
    max_pending_session_count 1000 (0 stays the operator's way to say unlimited), and the count of a
    keypair's PENDING sessions reads the new index."""
    path = tmp_path / "v11.db"
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        for step in schema.STEPS[:11]:
            if step.before:
                step.before(conn)
            step.apply(conn)
        conn.execute("INSERT INTO resource_policies(name, created_at) VALUES ('gold', '2020-01-01T00:00:00+00:00')")
        conn.execute("PRAGMA user_version=11")
    store = await Store.open(path)
    try:
        sid, _ = await make_session(store)
        policies = await store.policies()
        assert {n: p.max_pending_session_count for n, p in policies.items()} == {"default": 1000, "gold": 1000}
        session = await store.get_session(sid)
        assert session is not None
        owner = session.access_key
        assert await store.pending_queue(owner) == ("default", 1000, 1)
        assert await store.count_sessions_of(owner, [SessionStatus.PENDING]) == 1
        assert await store.save_policy("gold", PolicyFields(max_pending_session_count=0), create=False, now=NOW)
        assert (await store.policies())["gold"].max_pending_session_count == 0
    finally:
        await store.close()
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == schema.LATEST
        plan = conn.execute(
            "EXPLAIN QUERY PLAN SELECT COUNT(*) FROM sessions WHERE access_key = 'x' AND status = 'PENDING'"
        ).fetchall()
        assert "sessions_owner_status" in str(plan)


async def test_a_database_from_just_before_versions_is_only_stamped(tmp_path: Path) -> None:
    """The last bai without versions made the whole schema as it is now: opening it changes no table."""
    path = tmp_path / "bai.db"
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.executescript(schema.SCHEMA)
    before = schema_sql(path)
    store = await Store.open(path)
    await store.close()
    assert schema_sql(path) == before
    assert shape(path)["version"] == schema.LATEST


async def test_opening_again_changes_nothing(db_path: Path, tmp_path: Path) -> None:
    for path in (db_path, tmp_path / "old.db"):
        if path != db_path:
            write_first_bai_database(path)
        for _ in range(3):
            store = await Store.open(path)
            await store.ensure_admin_keypair("AKIAFIRST", "secret", NOW)
            await store.close()
            if _ == 0:
                first = (schema_sql(path), shape(path))
            assert (schema_sql(path), shape(path)) == first
            with closing(sqlite3.connect(path)) as conn:
                assert conn.execute("SELECT COUNT(*) FROM keypairs").fetchone()[0] == 1
                assert conn.execute("SELECT COUNT(*) FROM resource_policies").fetchone()[0] == 1


async def test_a_database_of_a_newer_bai_is_refused(db_path: Path) -> None:
    store = await Store.open(db_path)
    await store.ensure_admin_keypair("AKIAFIRST", "secret", NOW)
    await store.close()
    newer = schema.LATEST + 1
    with closing(sqlite3.connect(db_path)) as conn:
        conn.execute(f"PRAGMA user_version={newer}")
    before = db_path.read_bytes()
    with pytest.raises(SchemaTooNew) as caught:
        await Store.open(db_path)
    message = str(caught.value)
    assert str(db_path) in message and f"version {newer}" in message and f"version {schema.LATEST}" in message
    assert "newer bai" in message
    assert db_path.read_bytes() == before  # not touched
    with closing(sqlite3.connect(db_path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == newer


async def test_a_closed_database_refuses_calls(store: Store) -> None:
    await store.close()
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        await store.get_session("x")
    await store.close()  # twice is fine


async def test_calls_run_one_at_a_time_in_order(store: Store) -> None:
    """Transactions on the database's one thread do not interleave, and run in the order made."""
    order: list[int] = []

    def step(i: int) -> Callable[[sqlite3.Connection], int]:
        def fn(conn: sqlite3.Connection) -> int:
            order.append(i)
            conn.execute("INSERT INTO image_aliases VALUES (?, 'img')", (f"a{i}",))
            return i

        return fn

    assert await asyncio.gather(*(store.db.transaction(step(i)) for i in range(50))) == list(range(50))
    assert order == list(range(50))
    assert len(await store.image_aliases()) == 50


async def test_a_failed_transaction_changes_nothing(store: Store) -> None:
    def fn(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO image_aliases VALUES ('a', 'img')")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await store.db.transaction(fn)
    assert await store.image_aliases() == []
    assert await store.set_image_alias("b", "img")  # the connection is not left in a transaction


def test_the_live_name_index_lists_the_live_statuses() -> None:
    """sessions_live_name's condition (a migration's, written out) is the live statuses of the lifecycle: a status
    added to it needs a step that makes the index again."""
    from bai.common.status import ACTIVE_STATUSES

    listed = {s.strip().strip("'") for s in schema.LIVE.split(",")}
    assert listed == {s.value for s in ACTIVE_STATUSES}


async def test_the_live_name_check_of_a_create_reads_the_live_sessions_index(store: Store) -> None:
    await make_session(store)
    from bai.node.manager.state.sqlite.session_queries import _LIVE

    def plan(conn: sqlite3.Connection) -> str:
        sql = f"EXPLAIN QUERY PLAN SELECT * FROM sessions WHERE access_key=? AND name=? AND status IN ({_LIVE})"
        return " ".join(str(tuple(r)) for r in conn.execute(sql, ("AK", "n")).fetchall())

    assert "sessions_live_name" in await store.db.run(plan)
