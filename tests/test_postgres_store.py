"""What is PostgreSQL's own in the state layer (the rest is tests/test_state_contract.py, on both engines): the
same tables and columns as SQLite's at the same version, a newer database refused before anything changes,
managers starting together making the schema once, a server that goes away and comes back, the lease, and a
node that names its database without its password."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bai.common.status import SessionStatus
from bai.node.manager.state import SchemaTooNew, Store
from bai.node.manager.state.errors import DatabaseUnavailable, NotLeading
from bai.node.manager.state.postgres import PgStore
from bai.node.manager.state.postgres.cluster_queries import ManagerInfo
from bai.node.manager.state.postgres.schema import LATEST
from bai.node.manager.state.records import NewKeypair
from tests import pgserver
from tests.pgserver import PostgresServer


def _columns_pg(url: str) -> dict[str, list[str]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema='public' "
            "ORDER BY table_name, ordinal_position"
        ).fetchall()
    out: dict[str, list[str]] = {}
    for table, column in rows:
        if table.startswith("bai_") or column == "rowid":
            continue  # (PostgreSQL's own: the managers, the lease, the version; SQLite's implicit row ids)
        out.setdefault(table, []).append(column)
    return out


async def test_a_new_database_has_sqlites_tables_and_columns_at_the_same_version(tmp_path: Path) -> None:
    url = pgserver.shared().new_database()
    store = await PgStore.open_url(url, "the test database")
    await store.close()
    lite = await Store.open(tmp_path / "bai.db")
    await lite.close()
    conn = sqlite3.connect(tmp_path / "bai.db")
    tables = [
        r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'")
    ]
    expected = {t: [r[1] for r in conn.execute(f"PRAGMA table_info({t})")] for t in tables}
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    assert _columns_pg(url) == expected
    with psycopg.connect(url) as pg:
        assert pg.execute("SELECT MAX(version) FROM bai_schema").fetchone()[0] == version == LATEST


async def test_a_database_of_a_newer_bai_is_refused_and_left_as_it_is() -> None:
    url = pgserver.shared().new_database()
    await (await PgStore.open_url(url, "db-x")).close()
    with psycopg.connect(url, autocommit=True) as pg:
        pg.execute("INSERT INTO bai_schema VALUES (%s, 'later')", (LATEST + 1,))
    with pytest.raises(SchemaTooNew) as caught:
        await PgStore.open_url(url, "db-x")
    assert f"schema version {LATEST + 1}" in str(caught.value) and "db-x" in str(caught.value)
    with psycopg.connect(url) as pg:
        assert pg.execute("SELECT COUNT(*) FROM bai_schema").fetchone()[0] == 2


async def test_managers_starting_together_make_the_schema_once() -> None:
    url = pgserver.shared().new_database()
    stores = await asyncio.gather(*(PgStore.open_url(url, "db") for _ in range(4)))
    for store in stores:
        await store.close()
    with psycopg.connect(url) as pg:
        assert pg.execute("SELECT COUNT(*) FROM bai_schema").fetchone()[0] == 1
        assert pg.execute("SELECT COUNT(*) FROM resource_policies").fetchone()[0] == 1


async def test_the_lease_is_held_by_one_manager_until_it_expires() -> None:
    url = pgserver.shared().new_database()
    a, b = await PgStore.open_url(url, "db"), await PgStore.open_url(url, "db")
    try:
        for store, name in ((a, "m-a"), (b, "m-b")):
            await store.announce_manager(ManagerInfo(name, "h", f"http://{name}", "tcp://x", 1, "0"))
        first = await a.renew_lease("m-a", ttl=0.5)
        assert first.mine and not (await b.renew_lease("m-b", ttl=0.5)).mine
        assert (await a.renew_lease("m-a", ttl=0.5)).since == first.since  # renewed, not taken again
        await asyncio.sleep(0.7)  # m-a stops renewing: the lease expires, m-b takes it
        taken = await b.renew_lease("m-b", ttl=5)
        assert taken.mine and taken.holder == "m-b"
        assert not (await a.renew_lease("m-a", ttl=5)).mine
        seen = {m.info.id: m.leader for m in await a.managers()}
        assert seen == {"m-a": False, "m-b": True}
    finally:
        await a.close()
        await b.close()


async def test_a_scheduling_round_of_a_manager_whose_lease_is_gone_is_refused_and_stores_nothing() -> None:
    """A leader frozen past its lease wakes believing it leads: the database, where the next leader's lease is,
    refuses its round (nothing scheduled), while the new leader's round is stored."""
    from datetime import UTC, datetime

    from tests.test_state_contract import SID1, create

    url = pgserver.shared().new_database()
    a, b = await PgStore.open_url(url, "db"), await PgStore.open_url(url, "db")
    a.db.fence_holder, b.db.fence_holder = "m-a", "m-b"
    try:
        await create(a)
        assert (await a.renew_lease("m-a", ttl=0.3)).mine
        await asyncio.sleep(0.5)  # m-a is frozen: its lease expires, m-b takes it
        assert (await b.renew_lease("m-b", ttl=5)).mine
        now = datetime.now(UTC)
        with pytest.raises(NotLeading, match="m-a"):
            await a.apply_round([(SID1, {f"{SID1}-main1": "agent-a"})], [], [], [], now)
        row = await b.get_session(SID1)
        assert row is not None and row.status == SessionStatus.PENDING  # nothing of m-a's round stored
        scheduled, _ = await b.apply_round([(SID1, {f"{SID1}-main1": "agent-b"})], [], [], [], now)
        assert [r.id for r in scheduled] == [SID1]
        assert [k.agent_id for k in await b.kernels_of(SID1)] == ["agent-b"]
    finally:
        await a.close()
        await b.close()


async def test_a_server_that_goes_away_is_named_and_the_store_recovers_when_it_returns() -> None:
    server = PostgresServer.start()
    try:
        store = await PgStore.open_url(server.new_database(), "postgresql://bai@db1/bai")
        await store.create_keypair(
            NewKeypair("AKTEST1", "s", "u@x", False, "default"), __import__("datetime").datetime(2030, 1, 1)
        )
        server.kill()
        with pytest.raises(DatabaseUnavailable) as caught:
            await store.list_sessions(None, None)
        assert "postgresql://bai@db1/bai" in str(caught.value)
        server.restart()
        assert await store.list_sessions(None, None) == []
        assert (await store.keypair("AKTEST1")) is not None
        await store.close()
    finally:
        server.stop()


def test_a_node_names_its_database_without_the_password_and_refuses_one_in_the_url(tmp_path: Path) -> None:
    server = pgserver.shared()
    result = subprocess.run(
        [sys.executable, "-m", "bai", "node", "--state-dir", str(tmp_path), "--database",
         f"postgresql://postgres:hunter2@127.0.0.1:{server.port}/postgres"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode != 0 and "hunter2" not in result.stdout + result.stderr
    assert "password_file" in result.stdout + result.stderr


def test_a_node_whose_database_is_down_answers_503_naming_it_and_recovers(tmp_path: Path) -> None:
    from tests.nodeproc import Node

    server = PostgresServer.start()
    node = Node(tmp_path / "node", "local", args=("--database", server.new_database()))
    try:
        node.start()
        node.cli("session", "ls", check=True)
        server.kill()
        down = node.cli("session", "ls", "-a")
        assert down.returncode != 0 and "cannot be reached" in down.stderr and f":{server.port}/" in down.stderr
        assert "Traceback" not in down.stderr
        server.restart()
        node.cli("session", "create", "python", "--name", "after-db", "--detach", check=True)
        assert any(s["name"] == "after-db" for s in node.json("session", "ls", "-a"))
    finally:
        node.stop()
        server.stop()


async def test_a_leader_busy_with_its_own_database_work_still_renews_its_lease(tmp_path: Path) -> None:
    """The lease is renewed over a connection of its own (bai/node/main.py start_leadership): a leader whose
    database queue is held up by its work (a burst of creates, a long transaction) keeps leading, and says who
    leads, instead of stepping down for a lease that only waited behind its own calls."""
    import threading
    import time

    from bai.node.main import start_leadership
    from tests.harness import Harness

    async with Harness(tmp_path, engine="postgresql") as h:
        leadership = await start_leadership(h.cfg, h.store, h.manager, "http://127.0.0.1:1", None)
        try:
            assert leadership.holds()
            release = threading.Event()
            held = h.store.db.run(lambda _conn: release.wait(10))  # the manager's own queue: busy
            try:
                began = time.monotonic()
                while time.monotonic() - began < leadership.ttl + 1:  # past the lease's whole length
                    await asyncio.sleep(0.5)
                    assert leadership.holds(), f"the leader stepped down after {time.monotonic() - began:.1f} s"
                seen = await asyncio.wait_for(leadership.managers(), 2)
                assert [m["leader"] for m in seen] == [True]
            finally:
                release.set()
                await held
        finally:
            await leadership.stop()


def _back_to_13(pg: Any) -> None:
    """A new database made as schema 13 had it: no index of live names, sessions numbered by the greatest + 1, no
    teams (schema 16)."""
    from bai.node.manager.state.sqlite.team_queries import TEAM_TABLE_NAMES

    for table in TEAM_TABLE_NAMES:
        pg.execute(f"DROP TABLE {table}")
    for table, column in (("keypairs", "user_uuid"), ("sessions", "domain_name"), ("sessions", "project_id")):
        pg.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    pg.execute("ALTER TABLE vfolders DROP COLUMN project_id")
    pg.execute("DROP INDEX sessions_live_name")
    pg.execute("ALTER TABLE sessions ALTER COLUMN seq DROP IDENTITY")
    pg.execute("DELETE FROM bai_schema WHERE version > 13")
    pg.execute("INSERT INTO bai_schema VALUES (13, '2026-01-01')")


async def test_a_create_checks_its_name_among_the_live_sessions_only_however_long_the_queue() -> None:
    """A database of schema 13 gets sessions_live_name (step 14); with 3000 live sessions of one owner, the
    plan PostgreSQL keeps for the create's name check (a generic one, as for a statement prepared early, when
    the table was small) reads that index, not every live session of the owner (each create slowed as the
    queue grew)."""
    from bai.node.manager.state.sqlite.session_queries import _LIVE

    url = pgserver.shared().new_database()
    store = await PgStore.open_url(url, "db")
    await store.close()
    with psycopg.connect(url, autocommit=True) as pg:
        _back_to_13(pg)
    store = await PgStore.open_url(url, "db")  # (upgraded)
    await store.close()
    with psycopg.connect(url, autocommit=True) as pg:
        assert pg.execute("SELECT MAX(version) FROM bai_schema").fetchone()[0] == LATEST
        pg.execute(  # (prepared early, on an empty table: the plan is kept as the queue grows)
            f"PREPARE live_named(text, text) AS SELECT * FROM sessions WHERE access_key=$1 AND name=$2 "
            f"AND status IN ({_LIVE})"
        )
        for _ in range(6):  # (after five, PostgreSQL keeps a generic plan)
            pg.execute("EXECUTE live_named('AK', 'n-7')")
        pg.execute(
            "INSERT INTO sessions(id, name, access_key, image, type, status, status_info, status_data, "
            "status_changed, requested_slots, environ, config, created_at, seq) "
            "SELECT 'id-' || i, 'n-' || i, 'AK', 'img', 'batch', 'PENDING', '', '{}', 't', '{}', '{}', '{}', 't', i "
            "FROM generate_series(1, 3000) AS i"
        )
        plan = "\n".join(r[0] for r in pg.execute("EXPLAIN EXECUTE live_named('AK', 'n-7')").fetchall())
    assert "sessions_live_name" in plan, plan


def test_the_idle_transaction_status_is_libpqs() -> None:
    from bai.node.manager.state.postgres import db

    assert db._IDLE == psycopg.pq.TransactionStatus.IDLE  # (read as an int on every statement)


async def test_one_statement_transactions_sent_together_each_get_their_own_answer() -> None:
    """PostgreSQL sends a group's one-statement transactions (creates, moves) together: one that fails (a taken
    key), one whose reading of its answer fails, and the others each get the answer they would have had alone,
    and only theirs is stored."""
    import threading

    from bai.node.manager.state.sqlite.db import OneStatement

    def insert(name: str, fail: bool = False) -> OneStatement:
        def finish(_conn: object, rows: list) -> str:
            if fail:
                raise RuntimeError(name)
            return str(rows[0][0])

        return OneStatement("INSERT INTO image_aliases VALUES (?, 'img') RETURNING alias", (name,), finish)

    store = await PgStore.open_url(pgserver.shared().new_database(), "db")
    try:
        gate = threading.Event()
        busy = store.db.run(lambda _conn: gate.wait(10))  # (the thread busy: what follows is taken at once)
        fns = [insert("a0"), insert("a1"), insert("a1"), insert("a3"), insert("a4", fail=True), insert("a5")]
        calls = [store.db.transaction(fn) for fn in fns]
        gate.set()
        await busy
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert results[:2] == ["a0", "a1"] and results[3] == "a3" and results[5] == "a5", results
        assert isinstance(results[2], sqlite3.IntegrityError) and isinstance(results[4], RuntimeError), results
        assert {a.alias for a in await store.image_aliases()} == {"a0", "a1", "a3", "a5"}
        assert await store.set_image_alias("after", "img")  # (the connection is not left in a transaction)
    finally:
        await store.close()


async def test_reads_queued_among_transactions_see_what_was_queued_before_them() -> None:
    """A read of one statement (Database.statement) queued among transactions goes in their transaction on
    PostgreSQL: it answers with what was queued before it, not after, and a read alone is answered too."""
    import threading

    store = await PgStore.open_url(pgserver.shared().new_database(), "db")

    def count() -> asyncio.Future[int]:
        return store.db.statement("SELECT COUNT(*) FROM image_aliases", (), lambda _conn, rows: int(rows[0][0]))

    def insert(name: str) -> asyncio.Future[None]:
        return store.db.transaction(lambda conn: conn.execute("INSERT INTO image_aliases VALUES (?, 'i')", (name,)))

    try:
        gate = threading.Event()
        busy = store.db.run(lambda _conn: gate.wait(10))
        calls = [count(), insert("x1"), count(), insert("x2"), insert("x1"), count(), insert("x3"), count()]
        gate.set()
        await busy
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert [results[i] for i in (0, 2, 5, 7)] == [0, 1, 2, 3], results
        assert isinstance(results[4], sqlite3.IntegrityError), results  # (a taken name: that one alone fails)
        assert await count() == 3
    finally:
        await store.close()


async def test_managers_creating_the_same_names_at_once_store_each_live_name_once_with_numbers_of_their_own() -> None:
    """Creates take no write lock (schema 15): two managers creating the same 40 names at the same moment (one
    and three kernels: both ways of creating) each answer with the one live session of that name, the same one,
    and every session has a number of its own."""
    import uuid

    from tests.test_state_contract import kernels_for, new_session

    url = pgserver.shared().new_database()
    a, b = await PgStore.open_url(url, "db"), await PgStore.open_url(url, "db")
    try:

        def attempt(store: Store, name: str, size: int) -> Any:
            sid = str(uuid.uuid4())
            return store.create_or_get_session(new_session(sid, name=name), kernels_for(sid, size))

        names = [f"n{i}" for i in range(40)]
        answers = await asyncio.gather(
            *(attempt(store, n, 1 + 2 * (i % 2)) for i, n in enumerate(names) for store in (a, b, a))
        )
        for i in range(len(names)):
            theirs = answers[3 * i : 3 * i + 3]
            assert len({row.id for row, _ in theirs}) == 1, theirs  # the one session of that name, to all three
            assert [made for _, made in theirs].count(True) == 1, theirs
        rows = await a.list_sessions(None, None)
        assert sorted(r.name for r in rows) == sorted(names)
        assert len({r.seq for r in rows}) == len(rows)
        assert [len(await b.kernels_of(r.id)) for r in rows] == [r.cluster_size for r in rows]
        made = await attempt(b, "later", 1)
        assert made[1] and made[0].seq > max(r.seq for r in rows)
    finally:
        await a.close()
        await b.close()


async def test_creates_go_on_while_another_manager_holds_the_write_lock() -> None:
    """Another manager's transaction holds the write lock (a long scheduling round): this one's creates are
    stored meanwhile, while a write that must be serialized (a policy) waits for the lock."""
    import uuid

    from bai.node.manager.state.postgres.db import WRITE_LOCK
    from tests.test_state_contract import kernels_for, new_session

    url = pgserver.shared().new_database()
    store = await PgStore.open_url(url, "db")
    try:
        with psycopg.connect(url) as other:
            other.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK,))  # (held until this transaction ends)
            sids = [str(uuid.uuid4()) for _ in range(5)]
            creates = [
                store.create_or_get_session(new_session(s, name=f"c{i}"), kernels_for(s)) for i, s in enumerate(sids)
            ]
            made = await asyncio.wait_for(asyncio.gather(*creates), 10)
            assert all(m for _, m in made)
            waiting = asyncio.ensure_future(store.set_image_alias("alias", "img"))
            await asyncio.sleep(0.5)
            assert not waiting.done()  # (serialized: behind the other manager's transaction)
            other.rollback()
            assert await asyncio.wait_for(waiting, 10)
        assert {r.name for r in await store.list_sessions(None, None)} == {f"c{i}" for i in range(5)}
    finally:
        await store.close()


async def test_schema_15_numbers_sessions_past_the_greatest_and_renames_a_live_twin() -> None:
    """A database of schema 14: the sequence that numbers new sessions starts past the greatest number stored,
    and a live session whose name an older live one of its owner has (nothing stopped it then) is renamed."""
    from tests.test_state_contract import SID1, SID2, SID3, create

    url = pgserver.shared().new_database()
    store = await PgStore.open_url(url, "db")
    try:
        for sid, name in ((SID1, "twin"), (SID2, "other")):
            await create(store, sid, name=name)
    finally:
        await store.close()
    with psycopg.connect(url, autocommit=True) as pg:
        _back_to_13(pg)
        pg.execute(
            "INSERT INTO sessions(id, name, access_key, image, type, status, status_info, status_data, "
            "status_changed, requested_slots, environ, config, created_at, seq) "
            "SELECT 'younger-twin', name, access_key, image, type, status, status_info, status_data, status_changed, "
            "requested_slots, environ, config, created_at, 70 FROM sessions WHERE id = %s",
            (SID1,),
        )
    store = await PgStore.open_url(url, "db")  # (steps 14 and 15)
    try:
        twin = await store.get_session("younger-twin")
        assert twin is not None and twin.name == "twin-younger-"
        first = await store.get_session(SID1)
        assert first is not None and first.name == "twin"
        await create(store, SID3, name="new")
        new = await store.get_session(SID3)
        assert new is not None and new.seq == 71
    finally:
        await store.close()


async def test_starts_sent_together_each_get_their_own_kernels_and_dotfiles() -> None:
    """Sessions going PREPARING at the same moment (one statement each, sent together): each answer has its own
    session, kernels and owner's dotfiles; one that is not SCHEDULED answers None and moves nothing."""
    import threading
    from datetime import UTC, datetime

    from bai.node.manager.state.records import Dotfile
    from tests.test_state_contract import SID1, SID2, SID3, create

    store = await PgStore.open_url(pgserver.shared().new_database(), "db")
    try:
        await create(store, SID1, size=2)
        await create(store, SID2, name="s2", owner="AK2")
        await create(store, SID3, name="s3")
        await store.put_dotfile("AK1", ".bashrc", "b", "644")
        now = datetime.now(UTC)
        placed = {f"{SID1}-main1": "a1", f"{SID1}-sub1": "a2"}
        await store.apply_round([(SID1, placed), (SID2, {f"{SID2}-main1": "a1"})], [], [], [], now)
        gate = threading.Event()
        busy = store.db.run(lambda _conn: gate.wait(10))  # (the thread busy: the three are taken at once)
        calls = [store.start_preparing(sid, now) for sid in (SID1, SID3, SID2)]
        gate.set()
        await busy
        first, third, second = await asyncio.gather(*calls)
        assert third is None  # (PENDING: not scheduled)
        assert first is not None and second is not None
        assert first[0].id == SID1 and [(k.id, k.agent_id) for k in first[1]] == list(placed.items())
        assert first[2] == [Dotfile(".bashrc", "b", "644")]
        assert second[0].id == SID2 and [k.id for k in second[1]] == [f"{SID2}-main1"] and second[2] == []
        assert [(await store.get_session(s)).status for s in (SID1, SID2, SID3)] == [
            "PREPARING",
            "PREPARING",
            "PENDING",
        ]
    finally:
        await store.close()
