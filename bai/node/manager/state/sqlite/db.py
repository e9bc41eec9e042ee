"""One small database object: a SQLite connection (WAL) of its own thread, transactions, the schema's version.

Every call is one hop to the database's thread: `run(fn)` calls fn(conn) there, `transaction(fn)` inside one
BEGIN IMMEDIATE … COMMIT. Calls run one after the other, in the order made (one thread, one queue), so a
transaction is never interleaved with another call. Only the standard library's sqlite3 is used.

Group commit: transactions queued one after the other while the thread was busy run in ONE BEGIN … COMMIT
(no savepoints: they cost two statements each). Each caller is answered only after that COMMIT (its changes
are as durable as with a transaction of its own); a transaction that raises fails alone (the group is rolled
back, those before it run again together, those after it go on: see `_group_transactions`); should the COMMIT
itself fail (a full disk), every transaction of the group runs again on its own, so each gets the answer it
would have had alone. The answers of a group reach the event loop in one wake-up.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from queue import SimpleQueue
from typing import Any, TypeVar

from bai.node.manager.state.errors import StorageFull
from bai.node.manager.state.sqlite import migrations as schema

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


_scan_json = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # json.loads without its Python layers (the C scanner itself)


_FLAT = frozenset({str, int, float, bool, type(None)})
_flat_values: dict[str, dict[str, Any] | list[Any]] = {}  # text -> its value, for flat ones that recur
MAX_FLAT = 4096


def load_json(text: str) -> Any:
    """json.loads, faster for what the store writes (json.dumps output: no surrounding blanks), and for the
    values that recur (the same slots on every kernel): a flat object or array (of strings, numbers, …) is
    parsed once, and each caller gets a copy of its own."""
    if text == "{}":
        return {}
    known = _flat_values.get(text)
    if known is not None:
        return known.copy()
    try:
        value, end = _scan_json(text, 0)
    except StopIteration:  # (not JSON, or starting with a blank: json.loads says which)
        return json.loads(text)
    if end != len(text):  # (something after the value: json.loads says whether that is allowed)
        return json.loads(text)
    kind = type(value)
    if (kind is dict and all(type(v) in _FLAT for v in value.values())) or (
        kind is list and all(type(v) in _FLAT for v in value)
    ):
        if len(_flat_values) >= MAX_FLAT:
            _flat_values.clear()
        _flat_values[text] = value
        return value.copy()
    return value


_json_at: dict[tuple[str, ...], tuple[tuple[int, str], ...]] = {}  # a row's columns -> where its JSON ones are


def decode(row: sqlite3.Row) -> dict[str, Any]:
    """A row that is there, as a dict, its JSON columns decoded."""
    out = decode_row(row)
    assert out is not None
    return out


def decode_row(row: sqlite3.Row | None) -> dict[str, Any] | None:
    """A row as a dict, its JSON columns decoded."""
    if row is None:
        return None
    keys = row.keys()
    shape = tuple(keys)
    where = _json_at.get(shape)
    if where is None:
        if len(_json_at) >= MAX_FLAT:
            _json_at.clear()
        where = _json_at[shape] = tuple((i, key) for i, key in enumerate(keys) if key in _JSON_COLUMNS)
    out = dict(zip(keys, row, strict=True))
    known = _flat_values.get
    for i, key in where:
        out[key] = _json_value(row[i], known)
    return out


def decode_mapping(row: dict[str, Any]) -> dict[str, Any]:
    """A row given as a mapping of its columns (PostgreSQL's json_agg of rows), its JSON columns decoded."""
    known = _flat_values.get
    return {k: _json_value(v, known) if k in _JSON_COLUMNS else v for k, v in row.items()}


def _json_value(value: Any, known: Callable[[str], Any]) -> Any:
    if type(value) is str:
        flat = known(value)  # (load_json's first look, without its call: most values are known ones)
        return flat.copy() if flat is not None else load_json(value)
    return json.loads(value)


BEGIN_SERIALIZED = "BEGIN IMMEDIATE"  # a write transaction: SQLite's write lock; on PostgreSQL, the managers' one
BEGIN_UNSERIALIZED = "BEGIN CONCURRENTLY"  # (PostgreSQL: a transaction of `serialized` False statements only)


def _begin_of(conn: Any, fns: Sequence[Any]) -> str:
    """How a transaction of `fns` begins: serialized with every other writer's, unless it is all statements that
    need not be (OneStatement.serialized False) on a server several managers share (its connection says so)."""
    if getattr(conn, "unserialized_writes", False) and all(
        type(fn) is OneStatement and not fn.serialized for fn in fns
    ):
        return BEGIN_UNSERIALIZED
    return BEGIN_SERIALIZED


def in_transaction(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    """fn(conn) inside one BEGIN IMMEDIATE … COMMIT, in the database's thread.

    All or nothing: should fn or the COMMIT fail (a full disk: SQLITE_FULL), the transaction is rolled
    back and the error raised as it is. (SQLite may have rolled it back itself already, as it does on
    SQLITE_FULL: a second ROLLBACK would fail and hide the first error.)"""
    conn.execute(_begin_of(conn, (fn,)))
    try:
        result = fn(conn)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return result


_STOP = object()
STATEMENT_CACHE = 1024  # prepared statements kept by the connection (sqlite3's default of 128 is too few)
MAX_GROUP = 256  # calls taken from the queue at once (transactions committed together, answers sent together)

Call = tuple["asyncio.Future[Any] | None", Any, tuple[Any, ...]]
Answer = tuple["asyncio.Future[Any]", bool, Any]  # (future, failed, result or exception)


def sqlite_full(e: BaseException) -> bool:
    """Whether an error is SQLite's SQLITE_FULL ("database or disk is full")."""
    if not isinstance(e, sqlite3.Error):
        return False
    code = getattr(e, "sqlite_errorcode", None)  # Python 3.11+
    if isinstance(code, int):
        return code & 0xFF == sqlite3.SQLITE_FULL
    return "database or disk is full" in str(e)


def storage_error(e: BaseException) -> BaseException:
    """The error a caller gets: the state layer's StorageFull (raised from SQLite's) for a full disk, else e."""
    if sqlite_full(e):
        full = StorageFull(f"{StorageFull.where} is on a full disk: {e}")
        full.__cause__ = e
        return full
    return e


def _answer(answers: list[Answer]) -> None:
    """In the event loop: hand each caller its result or exception (a full disk as StorageFull)."""
    for future, failed, value in answers:
        if future.done():  # (the caller may have been cancelled meanwhile)
            continue
        if failed:
            future.set_exception(storage_error(value))
        else:
            future.set_result(value)


def _is_transaction(call: Call) -> bool:
    return call[1] is in_transaction and len(call[2]) == 1


def _one_alone(conn: Any, one: OneStatement) -> Any:
    """A statement (Database.statement) with no transaction beside it to go with: as it is, outside any."""
    return one(conn)


def _is_one(call: Call) -> bool:
    return call[1] is _one_alone


def _alone(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], Any]) -> tuple[bool, Any]:
    """fn in a transaction of its own: (failed, result or exception)."""
    try:
        return False, in_transaction(conn, fn)
    except BaseException as e:  # noqa: BLE001 (handed to its caller)
        return True, e


class OneStatement:
    """A transaction of one statement whose answer only `finish(conn, rows)` reads (it may run more statements,
    as a fallback: after the group's statements sent with this one, see below). Called as any transaction's fn
    (`Database.transaction`); where the connection has a `pipeline` (PostgreSQL), consecutive ones of a group
    are sent together: one round trip for all of them instead of one each.

    `serialized` False: the statement keeps what it must true by itself (a unique index, a sequence), so that a
    transaction of such statements only needs no other manager's writes to wait for on a server several share
    (`BEGIN_UNSERIALIZED`; SQLite's one writer serializes everything anyway)."""

    __slots__ = ("sql", "params", "finish", "serialized")

    def __init__(
        self, sql: str, params: Sequence[Any], finish: Callable[[Any, list[Any]], Any], *, serialized: bool = True
    ) -> None:
        self.sql, self.params, self.finish, self.serialized = sql, params, finish, serialized

    def __call__(self, conn: Any) -> Any:
        return self.finish(conn, conn.execute(self.sql, self.params).fetchall())


class _PipelineFailed(Exception):
    """A statement sent with others failed: the group runs again, each on its own, to say which."""


def _pipelined(conn: Any, run: list[OneStatement]) -> list[Any]:
    """The statements of `run` sent together (inside the group's transaction); the rows of each."""
    try:
        with conn.pipeline() as sent:
            cursors = [conn.execute(f.sql, f.params) for f in run]
            sent.sync()  # (every answer read: each cursor has its rows)
        return [c.fetchall() for c in cursors]
    except Exception as e:  # noqa: BLE001 (which one failed is found by running them again, one by one)
        raise _PipelineFailed() from e


def _group_transactions(
    conn: sqlite3.Connection, fns: list[Callable[[sqlite3.Connection], Any]], pipelined: bool | None = None
) -> list[tuple[bool, Any]]:
    """Run fns in ONE transaction; [(failed, result or exception)] for each, once committed.

    No savepoint per fn (two statements each): should one raise, the transaction is rolled back, the fns
    before it run again together (on the same state, so to the same outcome), the one that raised fails
    (nothing of it stored, as alone, for it ran on the state it would have had alone), and those after it
    go on in a group of their own. Should the transaction as a whole be lost (a fn that ended it, SQLite
    rolling back by itself as on SQLITE_FULL, a failed COMMIT), every fn not yet committed runs again on
    its own, so each gets the answer it would have had alone.

    `pipelined` (default: whether the connection has a `pipeline`): consecutive OneStatements are sent together,
    then each one's `finish` reads its rows, in order. Should one of them fail, the transaction is rolled back
    and the group runs again without that, so that the one that failed is known."""
    if pipelined is None:
        pipelined = getattr(conn, "pipeline", None) is not None
    outcomes: list[tuple[bool, Any]] = []
    i, n = 0, len(fns)
    while i < n:
        results: list[Any] = []
        error: BaseException | None = None
        lost = False
        try:
            todo = fns[i:] if i else fns
            conn.execute(_begin_of(conn, todo))
            j = 0
            while j < len(todo):
                fn = todo[j]
                run: list[OneStatement] = []
                if pipelined:
                    while j + len(run) < len(todo) and isinstance(todo[j + len(run)], OneStatement):
                        run.append(todo[j + len(run)])  # type: ignore[arg-type]
                if len(run) > 1:
                    try:
                        answers = _pipelined(conn, run)
                    except _PipelineFailed:
                        if conn.in_transaction:
                            conn.execute("ROLLBACK")
                        return outcomes + _group_transactions(conn, fns[i:], pipelined=False)
                    for f, rows in zip(run, answers, strict=True):
                        try:
                            results.append(f.finish(conn, rows))
                        except BaseException as e:  # noqa: BLE001 (handed to its caller)
                            error = e
                            break
                    if error is not None:
                        lost = not conn.in_transaction
                        break
                    j += len(run)
                    continue
                try:
                    result = fn(conn)
                except BaseException as e:  # noqa: BLE001 (handed to its caller)
                    error = e
                    lost = not conn.in_transaction  # (SQLite rolled it all back itself)
                    break
                if not conn.in_transaction:  # fn ended the shared transaction
                    lost = True
                    break
                results.append(result)
                j += 1
            else:
                conn.execute("COMMIT")
                outcomes.extend((False, r) for r in results)
                return outcomes
        except Exception:  # noqa: BLE001 (BEGIN or COMMIT failed)
            lost = True
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        if lost:
            outcomes.extend(_alone(conn, fn) for fn in fns[i:])
            return outcomes
        k = i + len(results)  # the fn that raised
        before = _group_transactions(conn, fns[i:k], pipelined) if k - i > 1 else [_alone(conn, f) for f in fns[i:k]]
        outcomes.extend(before)
        outcomes.append((True, error))
        i = k + 1
    return outcomes


class Database:
    """A SQLite database file, open in a thread of its own."""

    # whether a transition or a create may be one statement (OneStatement) sent with others: a server's round
    # trips (PostgreSQL's data-modifying WITH and pipeline); SQLite's statements cost no round trip
    one_statement_writes = False

    def __init__(self, path: Path, *, thread_name: str = "") -> None:
        self.path = path
        self.shown = str(path)  # how messages name the database
        self._calls: SimpleQueue[Call] = SimpleQueue()
        self._connection: Any = None  # (a sqlite3.Connection here) used in the database's thread only
        self._open = False
        self._thread = threading.Thread(target=self._serve, name=thread_name or f"sqlite {path.name}", daemon=True)
        # the keypairs that have dotfiles, read when first needed; None again (read afresh) whenever a transaction
        # writes dotfiles, before it writes them (so a rolled-back write leaves it unknown). Database thread only.
        self.dotfile_owners: set[str] | None = None
        # several managers of one database: the manager whose lease fences the leader's writes (see `fence`)
        self.fence_holder: str | None = None

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
        conn = self._connection = sqlite3.connect(
            self.path, isolation_level=None, cached_statements=STATEMENT_CACHE
        )  # transactions by hand
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
        """The database's thread: calls in the order queued, until close. What is queued is taken at once
        (up to MAX_GROUP calls): consecutive transactions are committed together (see the module's doc)."""
        calls: SimpleQueue[Call] = self._calls
        while True:
            batch = [calls.get()]
            while len(batch) < MAX_GROUP and not calls.empty():
                batch.append(calls.get())
            if not self._serve_batch(batch):
                return

    def _serve_batch(self, batch: list[Call]) -> bool:
        """Run a batch of calls in order, answering each run of transactions (or of other calls) together;
        False once the stop call has run."""
        i = 0
        while i < len(batch):
            # a run of transactions (with the statements queued among them, which go in their transaction), or
            # of other calls (statements with no transaction beside them among those)
            j = i + 1
            grouped = _is_transaction(batch[i]) or _is_one(batch[i])
            while j < len(batch) and (_is_transaction(batch[j]) or _is_one(batch[j])) == grouped:
                j += 1
            if grouped and not any(_is_transaction(c) for c in batch[i:j]):
                grouped = False
            answers: list[Answer] = []
            if grouped and j - i > 1:
                self._run_group(batch[i:j], answers)
            else:
                for future, fn, args in batch[i:j]:
                    try:
                        result = fn(self._connection, *args)
                    except BaseException as e:  # noqa: BLE001 (handed to the caller)
                        if future is not None:
                            answers.append((future, True, e))
                        continue
                    if future is not None:
                        answers.append((future, False, None if result is _STOP else result))
                    if result is _STOP:
                        self._send(answers)
                        for future, _, _ in batch[j:]:  # (none: nothing is queued after the stop call)
                            if future is not None:
                                answers.append((future, True, sqlite3.ProgrammingError("the database is closed")))
                        return False
            self._send(answers)
            i = j
        return True

    def _run_group(self, group: list[Call], answers: list[Answer]) -> None:
        assert self._connection is not None  # (open: the stop call has not run)
        outcomes = _group_transactions(self._connection, [args[0] for _, _, args in group])
        for (future, _, _), (failed, value) in zip(group, outcomes, strict=True):
            if future is not None:
                answers.append((future, failed, value))

    @staticmethod
    def _send(answers: list[Answer]) -> None:
        """Answer the callers: one wake-up of each event loop for all of them."""
        loops: dict[asyncio.AbstractEventLoop, list[Answer]] = {}
        for answer in answers:
            loops.setdefault(answer[0].get_loop(), []).append(answer)
        for loop, theirs in loops.items():
            try:
                loop.call_soon_threadsafe(_answer, theirs)
            except RuntimeError:  # that loop is closed: nobody waits for these answers any more
                pass

    def run(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """fn(conn, *args) in the database's thread, outside any transaction (reads, or work that makes its
        own with `in_transaction`); await it for the result."""
        if not self._open:
            raise sqlite3.ProgrammingError(f"the database {self.shown} is closed")
        future = asyncio.get_running_loop().create_future()
        self._calls.put((future, fn, args))
        return future

    def statement(self, sql: str, params: Sequence[Any], finish: Callable[[Any, list[Any]], T]) -> asyncio.Future[T]:
        """One statement outside any transaction of the caller's (a read seeing what was queued before it),
        `finish(conn, rows)` its answer. On a server (`one_statement_writes`), queued among
        transactions taken together, it goes in their transaction (sent with them: no round trip or commit of
        its own, and the group is not split in two); alone, as `run`."""
        if self.one_statement_writes:
            return self.run(_one_alone, OneStatement(sql, params, finish, serialized=False))  # (a read)
        return self.run(lambda conn: finish(conn, conn.execute(sql, params).fetchall()))

    def fence(self, conn: sqlite3.Connection) -> None:
        """Inside a transaction that only the leader may commit: raise NotLeading unless this manager still holds
        the leader lease. Nothing to check for a SQLite file (one manager)."""

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
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


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
