"""The PostgreSQL database object: the same one-thread design as SQLite's (`sqlite.db.Database`: every call one
hop to the database's thread, consecutive transactions committed together), over a psycopg 3 connection.

The queries are written once, in the dialect both engines share (`sqlite/*_queries.py`); `Connection` here
gives them what they use of sqlite3's connection (`execute`, `executemany`, `in_transaction`, rows read by
index or by name) and translates the little that differs: `?` / `:name` parameters (numbered, `$1`), `BEGIN
IMMEDIATE`, the JSON array function, a byte length. Errors come out as the state layer's (`StorageFull` for a full disk,
`DatabaseUnavailable` for a server that cannot be reached) or as sqlite3's IntegrityError, so the queries'
own handling of a conflict is the same for both. Where PostgreSQL does in one statement what SQLite does in
several (a data-modifying WITH: a session's transition, its record and its kernels), a query asks
`writable_ctes` (True here) and sends that one: each statement is a round trip to the server.

Several managers share one database: every transaction takes one advisory lock first (`WRITE_LOCK`), so that
writes are serialized across them as SQLite serializes them in one file; reads take no lock (each statement
sees what was committed before it). Creates are the exception, for they are what many clients send through
every manager at once: a transaction of creates only (`OneStatement.serialized` False, `BEGIN_UNSERIALIZED`)
takes no lock, and runs beside the other managers' transactions. What the lock kept true of them the schema
keeps itself (schema 15): a live name is unique in its index (a second insert of one waits for the first to
commit, then inserts nothing and reads the first), and a session's number comes from a sequence. A create in a
transaction with other writes takes the lock with them, as before.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from bai.node.manager.state.errors import DatabaseUnavailable, NotLeading, StorageFull
from bai.node.manager.state.sqlite.db import BEGIN_SERIALIZED, BEGIN_UNSERIALIZED, Database
from bai.node.manager.state.sqlite.migrations import NEXT_SESSION_NUMBER, SESSION_NUMBERS

WRITE_LOCK = 0x6261690001  # the advisory lock every transaction takes ("bai" 1)
CONNECT_TIMEOUT = 5  # seconds to reach the server
_BEGIN = f"BEGIN; SELECT pg_advisory_xact_lock({WRITE_LOCK})"
_IDLE = 0  # libpq's PQTRANS_IDLE (psycopg.pq.TransactionStatus.IDLE): no transaction open
PREPARED_MAX = 1024  # statements kept prepared by the connection (psycopg's default of 100 is too few)


class Row(tuple[Any, ...]):
    """A row read by index or by column name, as sqlite3.Row (one subclass per shape of result)."""

    _index: dict[str, int] = {}
    _keys: list[str] = []

    def __getitem__(self, key: Any) -> Any:
        if type(key) is str:
            return tuple.__getitem__(self, self._index[key])
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return self._keys


_row_types: dict[tuple[bytes, ...], type[Row]] = {}
_TUPLES_OK = 2  # (libpq's PGRES_TUPLES_OK: a result with rows)


def _row_type(names: tuple[bytes, ...]) -> type[Row]:
    known = _row_types.get(names)
    if known is None:
        if len(_row_types) > 1024:
            _row_types.clear()
        keys = [n.decode() for n in names]
        known = _row_types[names] = type("Row", (Row,), {"_index": {n: i for i, n in enumerate(keys)}, "_keys": keys})
    return known


def _has_rows(cursor: Any) -> bool:
    """Whether the statement's result has rows to read (a SELECT, or RETURNING), from libpq's result itself
    (psycopg's `description` makes a Column object per column each time it is read)."""
    res = cursor.pgresult
    return res is not None and res.status == _TUPLES_OK


def _row_factory(cursor: Any) -> Any:
    res = cursor.pgresult
    if res is None or res.status != _TUPLES_OK:
        return tuple
    fname = res.fname
    return _row_type(tuple(fname(i) for i in range(res.nfields)))


_TOKENS = re.compile(r"'(?:[^']|'')*'|\"[^\"]*\"|\?|:[A-Za-z_]\w*|%")
_REWRITES = (
    (re.compile(r"length\(CAST\((\w+) AS BLOB\)\)"), r"octet_length(\1)"),
    (re.compile(r"json_each\(\?\)"), "json_array_elements_text(?::json)"),
    # a new session's number: the sequence's next (managers creating at once each get their own), not the greatest
    # + 1 that SQLite's one writer takes
    (re.compile(re.escape(NEXT_SESSION_NUMBER)), f"nextval('{SESSION_NUMBERS}')"),
)
_translated: dict[str, tuple[str, tuple[str, ...] | None]] = {}


def translate(sql: str) -> tuple[str, tuple[str, ...] | None]:
    """A statement of the shared dialect as PostgreSQL's: (the statement with numbered parameters ($1, $2, …),
    the names of its `:name` parameters in the order of their numbers, or None for `?` ones). Numbered here,
    the statement goes to the server as it is (psycopg's raw cursor: no parsing of `%s` placeholders on every
    call, whose cache holds 128 statements)."""
    known = _translated.get(sql)
    if known is not None:
        return known
    out = sql
    for pattern, replacement in _REWRITES:
        out = pattern.sub(replacement, out)
    numbers: dict[str, int] = {}
    count = 0

    def token(m: re.Match[str]) -> str:
        nonlocal count
        text = m.group(0)
        if text == "?":
            count += 1
            return f"${count}"
        if text.startswith(":"):
            if m.start() > 0 and out[m.start() - 1] == ":":  # a ::cast
                return text
            name = text[1:]
            if name not in numbers:
                numbers[name] = len(numbers) + 1
            return f"${numbers[name]}"
        return text  # a quoted literal or name, or a %, as it is

    text = _TOKENS.sub(token, out)
    known = (text, tuple(numbers) if numbers else None)
    if len(_translated) > 4096:
        _translated.clear()
    _translated[sql] = known
    return known


def _value(v: Any) -> Any:
    if type(v) is bool:
        return int(v)  # (SQLite has no booleans: the columns are integers)
    if type(v) is str and "\x00" in v:
        return v.replace("\x00", "\ufffd")  # (PostgreSQL's text cannot hold NUL)
    return v


_PLAIN = frozenset({int, float, type(None), bytes})


def _params(params: Any, names: tuple[str, ...] | None = None) -> Any:
    if isinstance(params, Mapping):
        return [_value(params[k]) for k in names or ()]
    plain = _PLAIN
    return [v if type(v) in plain or (type(v) is str and "\x00" not in v) else _value(v) for v in params]


class Cursor:
    """What a statement gives back: its rows and how many it changed (sqlite3's cursor, as the queries use it)."""

    __slots__ = ("_cursor",)

    def __init__(self, cursor: Any) -> None:
        self._cursor = cursor

    def fetchone(self) -> Any:
        return self._cursor.fetchone() if _has_rows(self._cursor) else None

    def fetchall(self) -> list[Any]:
        return self._cursor.fetchall() if _has_rows(self._cursor) else []

    def __iter__(self) -> Iterator[Any]:
        return iter(self._cursor) if _has_rows(self._cursor) else iter(())

    def close(self) -> None:
        self._cursor.close()

    @property
    def rowcount(self) -> int:
        return int(self._cursor.rowcount)


class Connection:
    """A psycopg connection as the shared queries use sqlite3's (see the module's doc), reconnecting between
    transactions when the server went away and came back."""

    writable_ctes = True  # (a statement may change several tables in its WITH: see session_queries._transition)
    unserialized_writes = True  # (a transaction of creates only takes no write lock: see the module's doc)

    def __init__(self, dsn: str, shown: str) -> None:
        self.dsn = dsn
        self.shown = shown
        self._conn: Any = None
        self._connect()

    def _connect(self) -> None:
        import psycopg

        try:
            self._conn = psycopg.connect(
                self.dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT, row_factory=_row_factory,
                cursor_factory=psycopg.RawCursor,
            )  # fmt: skip
        except psycopg.OperationalError as e:
            raise DatabaseUnavailable(self.shown, e) from None
        self._conn.prepare_threshold = 2  # statements run twice are prepared (the server keeps their plans)
        self._conn.prepared_max = PREPARED_MAX

    @property
    def in_transaction(self) -> bool:
        if self._conn is None or self._conn.closed:
            return False
        # (libpq's own status, an int: psycopg's `info.transaction_status` makes an enum each time, on every statement)
        return bool(self._conn.pgconn.transaction_status != _IDLE)

    def _ready(self) -> Any:
        """The connection, made again when it was lost outside a transaction."""
        if self._conn is None or self._conn.closed or self._conn.broken:
            if self._conn is not None and not self._conn.closed:
                self._conn.close()
            self._conn = None
            self._connect()
        return self._conn

    def execute(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> Cursor:
        if sql == BEGIN_SERIALIZED:
            conn = self._ready()
            return self._run(conn, _BEGIN, None)  # (one round trip: two statements, no parameters)
        if sql == BEGIN_UNSERIALIZED:
            return self._run(self._ready(), "BEGIN", None)
        text, names = translate(sql)
        conn = self._conn if self.in_transaction else self._ready()
        return self._run(conn, text, _params(params, names))

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> Cursor:
        text, names = translate(sql)
        conn = self._conn if self.in_transaction else self._ready()
        rows = list(rows)
        if len(rows) == 1:  # (the usual case, one kernel: psycopg's executemany goes through a pipeline)
            return self._run(conn, text, _params(rows[0], names))
        cursor = conn.cursor()
        try:
            cursor.executemany(text, [_params(r, names) for r in rows])
        except Exception as e:  # noqa: BLE001 (translated)
            raise self._error(e) from e
        return Cursor(cursor)

    def pipeline(self) -> Any:
        """Inside a transaction: statements sent without waiting for each one's answer, until a result is read
        (psycopg's pipeline mode); a failed one fails the transaction, as it would alone."""
        return self._conn.pipeline()

    def _run(self, conn: Any, text: str, params: Any) -> Cursor:
        try:
            return Cursor(conn.execute(text, params))
        except Exception as e:  # noqa: BLE001 (translated)
            raise self._error(e) from e

    def _error(self, e: Exception) -> Exception:
        import psycopg

        if isinstance(e, psycopg.errors.IntegrityError):
            return sqlite3.IntegrityError(str(e))
        if getattr(e, "sqlstate", None) in ("53100", "53400"):  # disk_full, configuration_limit_exceeded
            full = StorageFull(f"{StorageFull.where} ({self.shown}) is on a full disk: {e}")
            full.__cause__ = e
            return full
        if isinstance(e, psycopg.OperationalError) and (self._conn is None or self._conn.broken or self._conn.closed):
            return DatabaseUnavailable(self.shown, e)
        return e

    def close(self) -> None:
        if self._conn is not None and not self._conn.closed:
            self._conn.close()


class PgDatabase(Database):
    """A PostgreSQL database, served by a thread of its own as `Database` serves a SQLite file."""

    one_statement_writes = True

    def __init__(self, dsn: str, shown: str) -> None:
        from pathlib import Path

        super().__init__(Path("postgresql"), thread_name=f"postgresql {shown}")
        self.dsn = dsn
        self.shown = shown

    @classmethod
    async def open_url(cls, dsn: str, shown: str) -> PgDatabase:
        """Connect, and bring the schema to the latest version (SchemaTooNew, before changing anything, for a
        database of a newer bai; DatabaseUnavailable when the server cannot be reached)."""
        db = cls(dsn, shown)
        return await db._started(db._connect_pg)

    @classmethod
    async def open_beside(cls, other: PgDatabase, purpose: str) -> PgDatabase:
        """Another connection to `other`'s database, with a thread of its own, for calls that must not wait
        behind `other`'s queue (the leader lease: a leader busy with its own work still renews it in time).
        The schema is `other`'s already."""
        db = cls(other.dsn, other.shown)
        db._thread.name = f"postgresql {purpose} {other.shown}"
        db.fence_holder = None  # (its calls are not the leader's writes)
        return await db._started(db._connect_only)

    async def _started(self, connect: Callable[[None], None]) -> PgDatabase:
        """This database's thread started, and `connect` run there (the thread ended again if it fails)."""
        self._thread.start()
        self._open = True
        try:
            await self.run(connect)
        except BaseException:
            await self.close()
            raise
        return self

    def _connect_only(self, _unopened: None) -> None:
        self._connection = Connection(self.dsn, self.shown)

    def _connect_pg(self, _unopened: None) -> None:
        from bai.node.manager.state.postgres import schema

        conn = Connection(self.dsn, self.shown)
        self._connection = conn
        schema.migrate(conn, self.shown)

    def fence(self, conn: Any) -> None:
        """Raise NotLeading unless `fence_holder` holds the leader lease now (the database's clock). A fenced
        transaction has taken the write lock first (creates alone are never fenced), and the lease is renewed or
        taken over in transactions too, so the answer holds until this one commits."""
        if self.fence_holder is None:
            return
        from bai.node.manager.state.postgres.cluster_queries import LEASE

        held = conn.execute(
            "SELECT 1 FROM bai_lease WHERE name=? AND holder=? AND expires_at > clock_timestamp()",
            (LEASE, self.fence_holder),
        ).fetchone()
        if held is None:
            raise NotLeading(f"this manager ({self.fence_holder}) no longer holds the leader lease in {self.shown}")

    async def reclaim_space(self, min_free_pages: int = 0) -> dict[str, int]:
        """Nothing to do: PostgreSQL's autovacuum gives space back to the database itself."""
        return {}
