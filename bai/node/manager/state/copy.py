"""`bai db copy`: a SQLite node's whole state copied into an empty PostgreSQL database.

The source is read in one SQLite read transaction (a consistent snapshot, even while a node writes to it); the
destination is written in ONE PostgreSQL transaction (all or nothing): every table of the schema, its rows
streamed with COPY, SQLite's row ids kept where PostgreSQL has them as a column (`session_transitions`,
`scheduling_history`) and `kernel_logs.seq` kept, then every identity sequence set past what was copied. Both
sides are counted before the COMMIT; a table whose counts differ rolls the whole copy back.

This module speaks SQL of its own (raw sqlite3 and psycopg): it copies tables, not records.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bai.common.dburl import DatabaseLocation, redact
from bai.node.manager.state.team_records import DEFAULT_PROJECT_ID

BATCH = 5000  # rows read from SQLite at a time
# the rows a new database's schema makes itself (a default policy, domain, project): not counted as held, and
# replaced by the source's
SCHEMA_ROWS = {
    "resource_policies": "name <> 'default'",
    "domains": "name <> 'default'",
    "projects": f"id <> '{DEFAULT_PROJECT_ID}'",
    "user_resource_policies": "name <> 'default'",
    "project_resource_policies": "name <> 'default'",
}
FIRST_NAMED = ("sessions", "keypairs", "resource_policies", "vfolders", "agents")  # what a refusal names first
NUL_REPLACEMENT = "\ufffd"  # PostgreSQL's text cannot hold NUL: it becomes U+FFFD


class CopyError(Exception):
    """The copy cannot be made, or was rolled back: a one-line message, no password in it."""


@dataclass(frozen=True)
class TableCount:
    """One table of a copy: its rows in the source and, after the copy, in the destination."""

    name: str
    source: int
    destination: int


@dataclass(frozen=True)
class CopyReport:
    """What a copy did: each table's rows on both sides, the NUL characters replaced, how long it took."""

    tables: tuple[TableCount, ...]
    nul_replaced: int  # NUL characters in text replaced with U+FFFD
    seconds: float
    source_in_use: bool  # the source had another connection open (read in a snapshot all the same)

    @property
    def rows(self) -> int:
        return sum(t.destination for t in self.tables)


async def copy_state(
    src: DatabaseLocation,
    dst: DatabaseLocation,
    *,
    progress: Callable[[str], None],
    method: str = "copy",
) -> CopyReport:
    """Copy the SQLite state at `src` into the empty PostgreSQL database `dst` (see the module's doc).

    `src`'s schema is first brought to the latest version (`Database.open`; a newer bai's database is refused),
    `dst`'s is made (`PgDatabase.open_url`). Raises CopyError for a source that is no SQLite file or is missing,
    a destination that is not PostgreSQL or already holds state, a server that cannot be reached, or counts that
    differ after the copy (then nothing is left in the destination). `method`: "copy" (COPY FROM STDIN) or
    "executemany" (INSERTs in batches), the two ways measured; COPY is the faster."""
    from bai.node.manager.state.errors import DatabaseUnavailable
    from bai.node.manager.state.postgres.db import PgDatabase
    from bai.node.manager.state.sqlite.db import Database, SchemaTooNew

    if src.engine != "sqlite" or src.path is None:
        raise CopyError(f"the source {src.shown} is not a SQLite file: copy from a node's SQLite database")
    if dst.engine != "postgresql":
        raise CopyError(f"the destination {dst.shown} is not PostgreSQL: copy into a postgresql:// database")
    path = src.path
    if not path.is_file():
        raise CopyError(f"the source {src.shown} does not exist" if not path.exists() else f"{src.shown} is no file")
    in_use = _in_use(path)
    try:
        db = await Database.open(path)  # (its schema brought to the latest version)
        await db.close()
    except SchemaTooNew as e:
        raise CopyError(str(e)) from None
    except sqlite3.Error as e:
        raise CopyError(f"the source {src.shown} cannot be read as a bai database: {e}") from None
    try:
        pg = await PgDatabase.open_url(dst.dsn, dst.shown)  # (its schema made)
        await pg.close()
    except SchemaTooNew as e:
        raise CopyError(str(e)) from None
    except DatabaseUnavailable as e:
        raise CopyError(redact(str(e))) from None
    except Exception as e:  # noqa: BLE001 (the driver's own errors: one line, no password)
        raise CopyError(f"the destination {dst.shown}: {_line(e)}") from None
    if in_use:
        progress(f"{src.shown} is in use (a node has it open): reading it in one consistent snapshot")
    started = time.monotonic()
    tables, nuls = await asyncio.to_thread(_copy, path, dst, progress, method)
    return CopyReport(tables, nuls, time.monotonic() - started, in_use)


def _line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return redact(text[0] if text else type(e).__name__)


def _in_use(path: Path) -> bool:
    """Whether another process has the SQLite file open: its write-ahead log is there (the last connection
    to close a WAL database removes it)."""
    return Path(f"{path}-wal").exists()


def _copy(
    path: Path, dst: DatabaseLocation, progress: Callable[[str], None], method: str
) -> tuple[tuple[TableCount, ...], int]:
    import psycopg

    from bai.node.manager.state.postgres.db import CONNECT_TIMEOUT, WRITE_LOCK

    source = sqlite3.connect(path, isolation_level=None)
    try:
        source.execute("PRAGMA query_only=1")
        source.execute("BEGIN")  # one read transaction: every table as of one moment
        tables = [
            r[0]
            for r in source.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY rowid"
            )
        ]
        try:
            conn = psycopg.connect(dst.dsn, connect_timeout=CONNECT_TIMEOUT)
        except psycopg.Error as e:
            raise CopyError(f"the database {dst.shown} cannot be reached: {_line(e)}") from None
        try:
            with conn.transaction():
                # (managers' writes wait, but for creates, which take no lock: a manager started on the destination
                # meanwhile that creates a session makes the counts differ, and the copy rolls back)
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK,))
                columns = _destination_columns(conn)
                _refuse_unless_empty(conn, tables, columns, dst.shown)
                counts: list[TableCount] = []
                nuls = 0
                grown: dict[str, int] = {}  # kernel id -> bytes its log grew by (NUL -> U+FFFD)
                for table in tables:
                    if table not in columns:
                        raise CopyError(f"the destination {dst.shown} has no table {table}: is it of another bai?")
                    copied, replaced = _copy_table(source, conn, table, columns[table], method, grown)
                    nuls += replaced
                    progress(
                        f"{table}: {copied} row{'' if copied == 1 else 's'}"
                        + (f" ({replaced} NUL replaced)" if replaced else "")
                    )
                _grow_log_totals(conn, grown)
                _set_sequences(source, conn, tables)
                for table in tables:
                    have = int(source.execute(f'SELECT COUNT(*) FROM "{table}"').fetchone()[0])
                    got = int(conn.execute(f'SELECT COUNT(*) FROM "{table}"').fetchone()[0])  # type: ignore[index]
                    counts.append(TableCount(table, have, got))
                wrong = [c for c in counts if c.source != c.destination]
                if wrong:
                    raise CopyError(
                        "the counts differ after the copy ("
                        + ", ".join(
                            f"{c.name}: {c.source} in the source, {c.destination} in the destination" for c in wrong
                        )
                        + "): rolled back, nothing was written"
                    )
        except psycopg.Error as e:
            raise CopyError(
                f"the copy into {dst.shown} failed (rolled back, nothing was written): {_line(e)}"
            ) from None
        finally:
            conn.close()
    finally:
        source.close()
    return tuple(counts), nuls


def _destination_columns(conn: Any) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for table, column in conn.execute(
        "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = current_schema() "
        "ORDER BY table_name, ordinal_position"
    ):
        out.setdefault(str(table), []).append(str(column))
    return out


LIVE_MANAGER_SECONDS = 10.0  # a manager seen this recently serves the database (it renews every second)


def _refuse_unless_empty(conn: Any, tables: Sequence[str], columns: dict[str, list[str]], shown: str) -> None:
    """CopyError naming what the destination holds, unless it holds nothing but the schema's default policy."""
    held: list[str] = []
    for table in sorted(tables, key=lambda t: (t not in FIRST_NAMED, FIRST_NAMED.index(t) if t in FIRST_NAMED else 0)):
        if table not in columns:
            continue
        where = f" WHERE {SCHEMA_ROWS[table]}" if table in SCHEMA_ROWS else ""
        n = int(conn.execute(f'SELECT COUNT(*) FROM "{table}"{where}').fetchone()[0])
        if n:
            held.append(f"{n} {table}" + (" (besides 'default')" if where else ""))
    if held:
        raise CopyError(
            f"the destination {shown} already holds {', '.join(held)}; copy into an empty database "
            "(nothing was written)"
        )
    if "bai_managers" in columns:  # a manager that serves it now would not see the copy (its own state is loaded)
        live = conn.execute(
            "SELECT id, host FROM bai_managers WHERE last_seen > clock_timestamp() - make_interval(secs => %s) "
            "ORDER BY id",
            (LIVE_MANAGER_SECONDS,),
        ).fetchall()
        if live:
            named = ", ".join(f"{r[0]} on {r[1]}" for r in live)
            raise CopyError(
                f"a manager serves the destination {shown} now ({named}): stop it, copy, then start it "
                "(nothing was written)"
            )


def _copy_table(
    source: sqlite3.Connection, conn: Any, table: str, dst_columns: list[str], method: str, grown: dict[str, int]
) -> tuple[int, int]:
    """Copy one table's rows; (rows copied, NUL characters replaced)."""
    src_columns = [r[1] for r in source.execute(f'PRAGMA table_info("{table}")')]
    missing = [c for c in src_columns if c not in dst_columns]
    if missing:
        raise CopyError(f"the destination's table {table} lacks the column(s) {', '.join(missing)}")
    # SQLite's implicit row id, a column of its own in PostgreSQL (the order of transitions and history)
    with_rowid = "rowid" in dst_columns and "rowid" not in src_columns
    names = (["rowid"] if with_rowid else []) + src_columns
    select = ", ".join(["rowid"] if with_rowid else []) + (", " if with_rowid else "")
    select += ", ".join(f'"{c}"' for c in src_columns)
    if table in SCHEMA_ROWS:
        conn.execute(f'DELETE FROM "{table}"')  # (the schema's defaults: the source's replace them)
    cursor = source.execute(f'SELECT {select} FROM "{table}"')
    counter = [0, 0]  # rows, NULs
    sizes = _LogSizes(names, grown) if table == "kernel_logs" else None
    rows = _clean(cursor, counter, sizes)
    column_list = ", ".join(f'"{n}"' for n in names)
    if method == "copy":
        with conn.cursor() as cur, cur.copy(f'COPY "{table}" ({column_list}) FROM STDIN') as copy:
            for row in rows:
                copy.write_row(row)
    elif method == "executemany":
        marks = ", ".join(["%s"] * len(names))
        insert = f'INSERT INTO "{table}" ({column_list}) VALUES ({marks})'
        with conn.cursor() as cur:
            batch: list[tuple[Any, ...]] = []
            for row in rows:
                batch.append(row)
                if len(batch) >= BATCH:
                    cur.executemany(insert, batch)
                    batch = []
            if batch:
                cur.executemany(insert, batch)
    else:
        raise ValueError(f"no copy method {method!r}")
    return counter[0], counter[1]


class _LogSizes:
    """The byte counts of logs whose NULs became U+FFFD (1 byte in UTF-8 -> 3): each such `kernel_logs` row's
    `size`, and its kernel's total in `kernel_log_sizes`, made to count the bytes the destination holds (what
    keeping a log within log_max_bytes adds up)."""

    def __init__(self, names: list[str], grown: dict[str, int]) -> None:
        self.kernel = names.index("kernel_id")
        self.size = names.index("size")
        self.data = names.index("data")
        self.grown = grown  # kernel id -> bytes its rows grew by

    def fix(self, before: tuple[Any, ...], after: list[Any]) -> None:
        data = before[self.data]
        if type(data) is not str or "\x00" not in data:
            return
        grown = len(after[self.data].encode()) - len(data.encode())
        if after[self.size] is not None:
            after[self.size] = int(after[self.size]) + grown
        kernel = str(before[self.kernel])
        self.grown[kernel] = self.grown.get(kernel, 0) + grown


def _grow_log_totals(conn: Any, grown: dict[str, int]) -> None:
    """The kernels' totals in kernel_log_sizes grown as their rows were (after every table is in: the source
    may list kernel_log_sizes before or after kernel_logs)."""
    for kernel, n in sorted(grown.items()):
        conn.execute("UPDATE kernel_log_sizes SET bytes = bytes + %s WHERE kernel_id = %s", (n, kernel))


def _clean(cursor: sqlite3.Cursor, counter: list[int], sizes: _LogSizes | None) -> Iterator[tuple[Any, ...]]:
    """The rows, text holding NUL made PostgreSQL's (U+FFFD), counting rows and NULs in `counter`."""
    while True:
        batch = cursor.fetchmany(BATCH)
        if not batch:
            return
        counter[0] += len(batch)
        for row in batch:
            if any(type(v) is str and "\x00" in v for v in row):
                out = []
                for v in row:
                    if type(v) is str and "\x00" in v:
                        counter[1] += v.count("\x00")
                        v = v.replace("\x00", NUL_REPLACEMENT)
                    out.append(v)
                if sizes is not None:
                    sizes.fix(row, out)
                yield tuple(out)
            else:
                yield row


def _set_sequences(source: sqlite3.Connection, conn: Any, tables: Sequence[str]) -> None:
    """Every identity column's sequence past the greatest value copied (and, for an AUTOINCREMENT column, past
    the greatest SQLite ever gave: its numbers are never given twice), so new rows get numbers of their own."""
    issued: dict[str, int] = {}
    if source.execute("SELECT 1 FROM sqlite_master WHERE name = 'sqlite_sequence'").fetchone():
        issued = {str(name): int(seq) for name, seq in source.execute("SELECT name, seq FROM sqlite_sequence")}
    identities = conn.execute(
        "SELECT table_name, column_name FROM information_schema.columns "
        "WHERE table_schema = current_schema() AND is_identity = 'YES'"
    ).fetchall()
    for table, column in identities:
        if table not in tables:
            continue
        top = conn.execute(f'SELECT MAX("{column}") FROM "{table}"').fetchone()[0]
        high = max(int(top or 0), issued.get(table, 0))
        conn.execute(
            "SELECT setval(pg_get_serial_sequence(%s, %s), %s, %s)",
            (f'"{table}"', column, max(high, 1), high > 0),
        )
