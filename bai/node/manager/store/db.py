"""One small database object: a SQLite connection (WAL) of its own thread, transactions, the schema's version.

Every call is one hop to the database's thread: `run(fn)` calls fn(conn) there, `transaction(fn)` inside one
BEGIN IMMEDIATE … COMMIT. Calls run one after the other, in the order made (one thread, one queue), so a
transaction is never interleaved with another call. Only the standard library's sqlite3 is used.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from queue import SimpleQueue
from typing import Any, TypeVar

from bai.node.manager.store import schema

T = TypeVar("T")

WAL_PAGES = 1000  # checkpoint the WAL at this many pages at most (SQLite's default)

_JSON_COLUMNS = {
    "status_data",
    "requested_slots",
    "environ",
    "config",
    "slots",
    "occupied_slots",
    "total_resource_slots",
    "devices",
    "service_ports",
}


class SchemaTooNew(RuntimeError):
    """The database was written by a newer bai: its schema version is one this code does not know."""


def utcnow() -> str:
    return datetime.now(UTC).isoformat()


def decode_row(row: sqlite3.Row | None) -> dict[str, Any] | None:
    """A row as a dict, its JSON columns decoded."""
    if row is None:
        return None
    out = dict(row)
    for key in _JSON_COLUMNS & out.keys():
        out[key] = json.loads(out[key])
    return out


def in_transaction(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    """fn(conn) inside one BEGIN IMMEDIATE … COMMIT, in the database's thread.

    All or nothing: should fn or the COMMIT fail (a full disk: SQLITE_FULL), the transaction is rolled
    back and the error raised as it is. (SQLite may have rolled it back itself already, as it does on
    SQLITE_FULL: a second ROLLBACK would fail and hide the first error.)"""
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = fn(conn)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return result


_STOP = object()


def _set_result(future: asyncio.Future, result: Any) -> None:
    if not future.done():  # (the caller may have been cancelled meanwhile)
        future.set_result(result)


def _set_exception(future: asyncio.Future, exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


class Database:
    """A SQLite database file, open in a thread of its own."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._calls: SimpleQueue[tuple[asyncio.Future | None, Any, tuple[Any, ...]]] = SimpleQueue()
        self._connection: sqlite3.Connection | None = None  # used in the database's thread only
        self._open = False
        self._thread = threading.Thread(target=self._serve, name=f"sqlite {path.name}", daemon=True)

    @classmethod
    async def open(cls, path: Path, *, max_wal_bytes: int = WAL_PAGES * 4096) -> Database:
        """Open (or create) the database at `path`, set it up and bring its schema to the latest version.

        `max_wal_bytes`: checkpoint the write-ahead log at about this size (at least 64 pages, at most
        SQLite's default of 1000), and cut the -wal file back to it. Raises SchemaTooNew (before changing
        anything) for a database whose schema version is newer than this code knows."""
        path.parent.mkdir(parents=True, exist_ok=True)
        db = cls(path)
        db._thread.start()
        db._open = True
        try:
            await db.run(db._connect, max_wal_bytes)
        except BaseException:
            await db.close()
            raise
        return db

    def _connect(self, _unopened: None, max_wal_bytes: int) -> None:
        conn = self._connection = sqlite3.connect(self.path, isolation_level=None)  # transactions by hand
        conn.row_factory = sqlite3.Row
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > schema.LATEST:
            raise SchemaTooNew(
                f"the database {self.path} has schema version {version}, newer than this bai knows "
                f"(version {schema.LATEST}): a newer bai wrote it. Run that bai, or move the file away "
                "to start afresh."
            )
        if not _has_anything(conn):  # before the first table, or it takes a VACUUM: freed pages can leave the file
            conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=5000")
        # the -wal file is disk too: checkpoint it at about max_wal_bytes, and cut it back
        page = conn.execute("PRAGMA page_size").fetchone()[0]
        wal_pages = max(64, min(WAL_PAGES, max_wal_bytes // page))
        conn.execute(f"PRAGMA wal_autocheckpoint={wal_pages}")
        conn.execute(f"PRAGMA journal_size_limit={wal_pages * page}")
        migrate(conn)

    def _serve(self) -> None:
        """The database's thread: calls in the order queued, until close."""
        while True:
            future, fn, args = self._calls.get()
            try:
                result = fn(self._connection, *args)
            except BaseException as e:  # noqa: BLE001 (handed to the caller)
                if future is not None:
                    future.get_loop().call_soon_threadsafe(_set_exception, future, e)
                continue
            if future is not None:
                future.get_loop().call_soon_threadsafe(_set_result, future, None if result is _STOP else result)
            if result is _STOP:
                return

    def run(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """fn(conn, *args) in the database's thread, outside any transaction (reads, or work that makes its
        own with `in_transaction`); await it for the result."""
        if not self._open:
            raise sqlite3.ProgrammingError(f"the database {self.path} is closed")
        future = asyncio.get_running_loop().create_future()
        self._calls.put((future, fn, args))
        return future

    def transaction(self, fn: Callable[[sqlite3.Connection], T]) -> asyncio.Future[T]:
        """fn(conn) inside one BEGIN IMMEDIATE … COMMIT in the database's thread (see `in_transaction`)."""
        return self.run(in_transaction, fn)

    async def close(self) -> None:
        """Finish the calls queued, close the connection and end the thread."""
        if not self._open:
            return
        self._open = False

        def stop(conn: sqlite3.Connection | None) -> object:
            if conn is not None:
                self._connection = None
                conn.close()
            return _STOP

        future = asyncio.get_running_loop().create_future()
        self._calls.put((future, stop, ()))
        await future

    async def reclaim_space(self, min_free_pages: int = 0) -> dict[str, int]:
        """Give free pages back to the file system (incremental vacuum) when there are more than
        `min_free_pages`, and checkpoint the WAL, cutting the -wal file to nothing."""

        def fn(conn: sqlite3.Connection) -> dict[str, int]:
            free = conn.execute("PRAGMA freelist_count").fetchone()[0]
            if free > min_free_pages:
                conn.executescript("PRAGMA incremental_vacuum;")  # (execute() would free one page only)
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            return {"free_pages": free, "pages": conn.execute("PRAGMA page_count").fetchone()[0]}

        return await self.run(fn)


class Queries:
    """The queries of one domain (sessions, agents, …) over the database: each public method is one call,
    one transaction, in one hop to the database's thread."""

    def __init__(self, db: Database) -> None:
        self.db = db


def schema_version(conn: sqlite3.Connection) -> int:
    return conn.execute("PRAGMA user_version").fetchone()[0]


def migrate(conn: sqlite3.Connection) -> None:
    """Bring the schema to `schema.LATEST`, recording each version reached in PRAGMA user_version.

    A new database gets the whole schema at once. A database of a bai from before schemas had versions
    (user_version 0, tables in it) goes through every step from the first: those steps are written to
    leave alone what is there already. Each step is one transaction with its new version number, so a
    crash leaves a database at a version it fully has; opening it again goes on from there."""
    if schema_version(conn) == 0 and not _has_anything(conn):
        in_transaction(conn, _create)
    for step in schema.STEPS:
        if schema_version(conn) >= step.version:
            continue
        if step.before is not None:
            step.before(conn)  # outside any transaction (a VACUUM), and safe to repeat

        def apply(conn: sqlite3.Connection, step: schema.Step = step) -> None:
            if schema_version(conn) < step.version:  # (unless another process was faster)
                step.apply(conn)
                conn.execute(f"PRAGMA user_version={step.version}")

        in_transaction(conn, apply)


def _has_anything(conn: sqlite3.Connection) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchone() is not None


def _create(conn: sqlite3.Connection) -> None:
    """A new database: the whole schema, at the latest version."""
    if _has_anything(conn):  # another process was faster
        return
    for statement in schema.statements(schema.SCHEMA):
        conn.execute(statement)
    conn.execute(f"PRAGMA user_version={schema.LATEST}")
