"""The manager's state in SQLite (WAL). The only module that speaks SQL.

Each public method is one transaction in one thread hop (aiosqlite), as the field notes advise.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiosqlite

from bai.common.status import ACTIVE_STATUSES, SessionStatus, check_transition

SCHEMA = """
CREATE TABLE IF NOT EXISTS keypairs (
    access_key TEXT PRIMARY KEY,
    secret_key TEXT NOT NULL,
    user_id TEXT NOT NULL,
    is_admin INTEGER NOT NULL DEFAULT 0,
    is_active INTEGER NOT NULL DEFAULT 1,
    resource_policy TEXT NOT NULL DEFAULT 'default',
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS resource_policies (
    name TEXT PRIMARY KEY,
    max_concurrent_sessions INTEGER NOT NULL DEFAULT 0,
    total_resource_slots TEXT NOT NULL DEFAULT '{}',
    default_for_unspecified TEXT NOT NULL DEFAULT 'UNLIMITED',
    idle_timeout REAL NOT NULL DEFAULT 0,
    max_session_lifetime REAL NOT NULL DEFAULT 0,
    created_at TEXT NOT NULL,
    max_vfolder_count INTEGER NOT NULL DEFAULT 0,  -- 0 = unlimited
    max_vfolder_size INTEGER NOT NULL DEFAULT 0  -- bytes per folder; 0 = unlimited
);
INSERT OR IGNORE INTO resource_policies(name, created_at) VALUES ('default', '1970-01-01T00:00:00+00:00');
CREATE TABLE IF NOT EXISTS agents (
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
CREATE TABLE IF NOT EXISTS sessions (
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
CREATE INDEX IF NOT EXISTS sessions_status ON sessions(status, seq);
CREATE INDEX IF NOT EXISTS sessions_name ON sessions(access_key, name);
CREATE TABLE IF NOT EXISTS session_transitions (
    session_id TEXT NOT NULL,
    status TEXT NOT NULL,
    status_info TEXT NOT NULL,
    status_data TEXT NOT NULL,
    at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS transitions_session ON session_transitions(session_id);
CREATE TABLE IF NOT EXISTS kernels (
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
    terminated_at TEXT,
    devices TEXT NOT NULL DEFAULT '[]'  -- [[GPU UUID, share], ...] the kernel holds
);
CREATE INDEX IF NOT EXISTS kernels_session ON kernels(session_id);
CREATE INDEX IF NOT EXISTS kernels_status ON kernels(status, agent_id);
CREATE INDEX IF NOT EXISTS sessions_seq ON sessions(seq);
CREATE TABLE IF NOT EXISTS scheduling_history (
    session_id TEXT NOT NULL,
    first_at TEXT NOT NULL,
    last_at TEXT NOT NULL,
    rounds INTEGER NOT NULL,
    outcome TEXT NOT NULL,
    status_info TEXT NOT NULL,
    msg TEXT NOT NULL,
    agents TEXT NOT NULL,
    predicates TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS scheduling_history_session ON scheduling_history(session_id);
CREATE TABLE IF NOT EXISTS kernel_logs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    kernel_id TEXT NOT NULL,
    size INTEGER,  -- UTF-8 bytes of data (NULL in rows an older bai stored; ahead of data so reading it is cheap)
    data TEXT NOT NULL,
    ts TEXT  -- when the manager stored the chunk (ISO 8601, UTC)
);
CREATE INDEX IF NOT EXISTS kernel_logs_kernel ON kernel_logs(kernel_id, seq);
CREATE TABLE IF NOT EXISTS kernel_log_sizes (
    kernel_id TEXT PRIMARY KEY,
    bytes INTEGER NOT NULL,  -- UTF-8 bytes of output kept (the marker line not counted)
    dropped INTEGER NOT NULL DEFAULT 0,  -- bytes of older output dropped to stay within log_max_bytes
    marker_seq INTEGER,  -- the kernel_logs row that says so; it comes before every row kept
    purged_at TEXT  -- when the whole log was purged (log_retention after its session ended)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS kernel_log_sizes_kept ON kernel_log_sizes(kernel_id) WHERE purged_at IS NULL;
CREATE TABLE IF NOT EXISTS vfolders (
    id TEXT PRIMARY KEY,  -- hex; also the folder's directory name under its host's root
    name TEXT NOT NULL,
    host TEXT NOT NULL,
    owner TEXT NOT NULL,  -- access key
    usage_mode TEXT NOT NULL DEFAULT 'general',
    status TEXT NOT NULL DEFAULT 'ready',  -- ready | trashed
    created_at TEXT NOT NULL,
    trashed_at TEXT
);
CREATE UNIQUE INDEX IF NOT EXISTS vfolders_owner_name ON vfolders(owner, name) WHERE status = 'ready';
CREATE TABLE IF NOT EXISTS vfolder_shares (
    vfolder_id TEXT NOT NULL,
    access_key TEXT NOT NULL,
    permission TEXT NOT NULL,  -- ro | rw
    PRIMARY KEY (vfolder_id, access_key)
);
CREATE TABLE IF NOT EXISTS image_aliases (
    alias TEXT PRIMARY KEY,  -- set with `bai image alias`; they override [images.aliases]
    image TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS dotfiles (
    access_key TEXT NOT NULL,
    path TEXT NOT NULL,  -- relative to the kernel's home
    data TEXT NOT NULL,
    permission TEXT NOT NULL DEFAULT '644',
    PRIMARY KEY (access_key, path)
);
"""

_JSON_COLUMNS = {
    "status_data",
    "requested_slots",
    "environ",
    "config",
    "slots",
    "occupied_slots",
    "total_resource_slots",
    "devices",
}
POLICY_FIELDS = (
    "max_concurrent_sessions",
    "total_resource_slots",
    "default_for_unspecified",
    "idle_timeout",
    "max_session_lifetime",
    "max_vfolder_count",
    "max_vfolder_size",
)


def utcnow() -> str:
    return datetime.now(UTC).isoformat()


def _row(row: sqlite3.Row | None) -> dict[str, Any] | None:
    if row is None:
        return None
    out = dict(row)
    for key in _JSON_COLUMNS & out.keys():
        out[key] = json.loads(out[key])
    return out


def _transition(
    conn: sqlite3.Connection,
    session_id: str,
    target: SessionStatus,
    status_info: str,
    status_data: dict[str, Any] | None,
    allowed_from: Iterable[SessionStatus] | None,
    kernel_updates: dict[str, dict[str, Any]] | None,
    result: str | None,
) -> dict[str, Any] | None:
    """One session transition inside the caller's transaction (see Store.transition)."""
    row = conn.execute("SELECT status FROM sessions WHERE id=?", (session_id,)).fetchone()
    if row is None:
        return None
    current = SessionStatus(row[0])
    if allowed_from is not None and current not in set(allowed_from):
        return None
    if current == target:
        return None
    check_transition(current, target)
    now = utcnow()
    data = json.dumps(status_data or {})
    terminated = now if target in (SessionStatus.TERMINATED, SessionStatus.CANCELLED) else None
    conn.execute(
        "UPDATE sessions SET status=?, status_info=?, status_data=?, status_changed=?, "
        "terminated_at=COALESCE(?, terminated_at), result=COALESCE(?, result) WHERE id=?",
        (target.value, status_info, data, now, terminated, result, session_id),
    )
    conn.execute(
        "INSERT INTO session_transitions VALUES (?, ?, ?, ?, ?)",
        (session_id, target.value, status_info, data, now),
    )
    kernel_ids = [r[0] for r in conn.execute("SELECT id FROM kernels WHERE session_id=?", (session_id,))]
    for kid in kernel_ids:
        cols: dict[str, Any] = {"status": target.value, "status_info": status_info, "status_changed": now}
        if terminated:
            cols["terminated_at"] = terminated
        cols.update((kernel_updates or {}).get(kid, {}))
        sets = ", ".join(f"{c}=?" for c in cols)
        conn.execute(f"UPDATE kernels SET {sets} WHERE id=?", (*cols.values(), kid))
    return _row(conn.execute("SELECT * FROM sessions WHERE id=?", (session_id,)).fetchone())


LOG_MAX_BYTES = 16 * 2**20  # [manager] log_max_bytes
LOG_PAGE_BYTES = 2**20  # what one read of a log holds at most (whole chunks, at least one)
WAL_PAGES = 1000  # checkpoint the WAL at this many pages (SQLite's default), or a quarter of log_max_bytes


def human_bytes(n: int) -> str:
    if n < 1024:
        return f"{n} bytes"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if n < 1024 or unit == "GiB":
            break
    return f"{n:.1f} {unit}"


def drop_marker(dropped: int) -> str:
    """The line a log starts with once older output was dropped to keep it within log_max_bytes."""
    return f"[bai: {human_bytes(dropped)} of older output dropped]\n"


def _char_start(raw: bytes, i: int) -> int:
    """The first UTF-8 character start at or after byte i."""
    while i < len(raw) and 0x80 <= raw[i] < 0xC0:
        i += 1
    return i


def _log_rows(texts: list[str], max_bytes: int) -> tuple[list[tuple[int, str]], int]:
    """New output chunks as (size, text) rows of at most about max_bytes/8 each (so dropping whole rows
    keeps at least 7/8 of the bound), keeping only their last max_bytes; and how many bytes went."""
    row = max(256, max_bytes // 8)
    if all(t.isascii() and len(t) <= row for t in texts) and sum(map(len, texts)) <= max_bytes:
        return [(len(t), t) for t in texts if t], 0  # the usual case, without encoding
    rows: list[tuple[int, str]] = []
    budget, dropped = max_bytes, 0
    for text in reversed(texts):
        raw = text.encode("utf-8", "surrogatepass")
        keep = max(budget, 0)
        cut = _char_start(raw, len(raw) - keep) if len(raw) > keep else 0
        dropped += cut
        pieces, pos = [], cut
        while pos < len(raw):
            end = _char_start(raw, min(pos + row, len(raw)))
            pieces.append(
                (end - pos, raw[pos:end].decode("utf-8", "surrogatepass") if (pos, end) != (0, len(raw)) else text)
            )
            pos = end
        rows[:0] = pieces
        budget -= len(raw) - cut
    return rows, dropped


LogSize = tuple[int, int, int | None]  # a kernel_log_sizes row: bytes, dropped, marker_seq


def _append_log(
    conn: sqlite3.Connection, kernel_id: str, texts: list[str], max_bytes: int, now: str, state: LogSize | None = None
) -> LogSize:
    """Append a kernel's output and drop its oldest rows beyond max_bytes, in the caller's transaction
    (down to 15/16 of it, so that a kernel printing on and on drops rows now and then, not each time).

    The kernel's running total is in kernel_log_sizes; what was dropped is said by one marker row that
    stays first (it takes the seq of the last row dropped) and whose count grows. `state`: that row as
    the caller knows it (None: read it). Returns the row as it is now."""
    rows, dropped = _log_rows(texts, max_bytes)
    fresh = state is None  # no row yet, or one that says the log was purged
    if state is None:
        row = conn.execute(
            "SELECT bytes, dropped, marker_seq, purged_at FROM kernel_log_sizes WHERE kernel_id=?", (kernel_id,)
        ).fetchone()
        if row is not None and row[3] is None:
            state, fresh = (row[0], row[1], row[2]), False
    kept, total_dropped, marker = state if state is not None else (0, 0, None)
    excess = kept + sum(size for size, _ in rows) - max_bytes
    last = None
    if excess > 0:
        excess += max_bytes // 16  # go a little below the bound, so that not every append has to drop rows
        cursor = conn.execute(
            "SELECT seq, COALESCE(size, length(CAST(data AS BLOB))) FROM kernel_logs "
            "WHERE kernel_id=? AND seq>? ORDER BY seq",
            (kernel_id, marker or 0),
        )
        for seq, size in cursor:
            last, excess, kept, dropped = seq, excess - size, kept - size, dropped + size
            if excess <= 0:
                break
        else:
            kept = 0  # every row went (the total may have been off for rows an older bai stored)
        cursor.close()
        if last is not None:
            conn.execute(
                "DELETE FROM kernel_logs WHERE kernel_id=? AND seq>? AND seq<=?", (kernel_id, marker or 0, last)
            )
    if dropped:
        total_dropped += dropped
        line = drop_marker(total_dropped)
        size = len(line)
        if marker is not None:
            conn.execute(
                "UPDATE kernel_logs SET seq=?, data=?, size=?, ts=? WHERE seq=?",
                (last or marker, line, size, now, marker),
            )
            marker = last or marker
        elif last is not None:
            conn.execute(
                "INSERT INTO kernel_logs(seq, kernel_id, size, data, ts) VALUES (?, ?, ?, ?, ?)",
                (last, kernel_id, size, line, now),
            )
            marker = last
        else:  # nothing older to drop: only the head of this output went
            marker = conn.execute(
                "INSERT INTO kernel_logs(kernel_id, size, data, ts) VALUES (?, ?, ?, ?)", (kernel_id, size, line, now)
            ).lastrowid
    for size, data in rows:
        conn.execute(
            "INSERT INTO kernel_logs(kernel_id, size, data, ts) VALUES (?, ?, ?, ?)", (kernel_id, size, data, now)
        )
    new_state = (kept + sum(size for size, _ in rows), total_dropped, marker)
    if fresh:
        conn.execute(
            "INSERT INTO kernel_log_sizes(kernel_id, bytes, dropped, marker_seq) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(kernel_id) DO UPDATE SET bytes=excluded.bytes, dropped=excluded.dropped, "
            "marker_seq=excluded.marker_seq, purged_at=NULL",
            (kernel_id, *new_state),
        )
    else:
        conn.execute(
            "UPDATE kernel_log_sizes SET bytes=?, dropped=?, marker_seq=? WHERE kernel_id=?", (*new_state, kernel_id)
        )
    return new_state


def _log_page(
    conn: sqlite3.Connection, kernel_id: str, after_seq: int, limit: int, max_bytes: int | None
) -> tuple[list[tuple[int, str, str | None]], bool]:
    """Up to `limit` chunks and about `max_bytes` (whole chunks, at least one) after `after_seq`, and
    whether more follow."""
    cursor = conn.execute(
        "SELECT seq, data, ts, COALESCE(size, length(CAST(data AS BLOB))) FROM kernel_logs "
        "WHERE kernel_id=? AND seq>? ORDER BY seq LIMIT ?",
        (kernel_id, after_seq, limit + 1),
    )
    out: list[tuple[int, str, str | None]] = []
    used, more = 0, False
    for seq, data, ts, size in cursor:
        if len(out) >= limit or (out and max_bytes is not None and used + size > max_bytes):
            more = True
            break
        out.append((seq, data, ts))
        used += size
    cursor.close()
    return out, more


class Store:
    def __init__(self, db: aiosqlite.Connection, log_max_bytes: int = LOG_MAX_BYTES) -> None:
        self.db = db
        self.log_max_bytes = log_max_bytes  # per kernel (a session has one): older output is dropped
        self._log_sizes: dict[str, LogSize] = {}  # kernel_log_sizes rows as committed (this is the only writer)

    @classmethod
    async def open(cls, path: Path, log_max_bytes: int = LOG_MAX_BYTES) -> Store:
        path.parent.mkdir(parents=True, exist_ok=True)
        db = await aiosqlite.connect(path, isolation_level=None)
        db.row_factory = sqlite3.Row

        def init(conn: sqlite3.Connection) -> None:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if not tables:  # before the first table, or it takes a VACUUM: freed pages can leave the file
                conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA busy_timeout=5000")
            # the -wal file is disk too: checkpoint it at about a quarter of the log bound, and cut it back
            page = conn.execute("PRAGMA page_size").fetchone()[0]
            wal_pages = max(64, min(WAL_PAGES, log_max_bytes // 4 // page))
            conn.execute(f"PRAGMA wal_autocheckpoint={wal_pages}")
            conn.execute(f"PRAGMA journal_size_limit={wal_pages * page}")
            conn.executescript(SCHEMA)
            # state written by an older bai: add what this version keeps (no data is touched)
            log_columns = {r[1] for r in conn.execute("PRAGMA table_info(kernel_logs)")}
            if "ts" not in log_columns:
                conn.execute("ALTER TABLE kernel_logs ADD COLUMN ts TEXT")
            if "size" not in log_columns:
                conn.execute("ALTER TABLE kernel_logs ADD COLUMN size INTEGER")
            if "kernel_logs" in tables and "kernel_log_sizes" not in tables:
                conn.execute(
                    "INSERT INTO kernel_log_sizes(kernel_id, bytes) "
                    "SELECT kernel_id, SUM(length(CAST(data AS BLOB))) FROM kernel_logs GROUP BY kernel_id"
                )
            # logs over the bound (kept by an older bai, or before log_max_bytes was lowered): cut them now
            over = [
                r[0] for r in conn.execute("SELECT kernel_id FROM kernel_log_sizes WHERE bytes > ?", (log_max_bytes,))
            ]
            if over:
                conn.execute("BEGIN IMMEDIATE")
                for kernel_id in over:
                    _append_log(conn, kernel_id, [], log_max_bytes, utcnow())
                conn.execute("COMMIT")
            if tables and conn.execute("PRAGMA auto_vacuum").fetchone()[0] != 2:
                conn.execute("PRAGMA auto_vacuum=INCREMENTAL")  # a database made before bai kept logs bounded:
                conn.execute("VACUUM")  # once, so that purged logs give their space back from now on
            if "devices" not in {r[1] for r in conn.execute("PRAGMA table_info(kernels)")}:
                conn.execute("ALTER TABLE kernels ADD COLUMN devices TEXT NOT NULL DEFAULT '[]'")
            policy_columns = {r[1] for r in conn.execute("PRAGMA table_info(resource_policies)")}
            for column in ("max_vfolder_count", "max_vfolder_size"):
                if column not in policy_columns:
                    conn.execute(f"ALTER TABLE resource_policies ADD COLUMN {column} INTEGER NOT NULL DEFAULT 0")

        await db._execute(init, db._conn)  # one hop for all the set-up
        return cls(db, log_max_bytes)

    async def close(self) -> None:
        await self.db.close()

    async def _tx(self, fn) -> Any:
        """Run fn(conn) inside one BEGIN IMMEDIATE … COMMIT in the database thread.

        All or nothing: should fn or the COMMIT fail (a full disk: SQLITE_FULL), the transaction is
        rolled back and the error raised as it is. (SQLite may have rolled it back itself already, as it
        does on SQLITE_FULL: a second ROLLBACK would fail and hide the first error.)"""

        def run(conn: sqlite3.Connection) -> Any:
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = fn(conn)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            return result

        return await self.db._execute(run, self.db._conn)

    async def _read(self, fn) -> Any:
        return await self.db._execute(fn, self.db._conn)

    # -- keypairs -------------------------------------------------------------------------------

    async def ensure_admin_keypair(self, access_key: str, secret_key: str) -> tuple[str, str]:
        """Return the first admin keypair, creating one from the given keys if there is none."""

        def fn(conn: sqlite3.Connection) -> tuple[str, str]:
            row = conn.execute(
                "SELECT access_key, secret_key FROM keypairs WHERE is_admin=1 AND is_active=1 "
                "ORDER BY created_at LIMIT 1"
            ).fetchone()
            if row:
                return row[0], row[1]
            conn.execute(
                "INSERT INTO keypairs(access_key, secret_key, user_id, is_admin, created_at) "
                "VALUES (?, ?, 'admin', 1, ?)",
                (access_key, secret_key, utcnow()),
            )
            return access_key, secret_key

        return await self._tx(fn)

    async def keypairs(self, active_only: bool = True) -> dict[str, dict[str, Any]]:
        def fn(conn: sqlite3.Connection) -> dict[str, dict[str, Any]]:
            sql = "SELECT * FROM keypairs" + (" WHERE is_active=1" if active_only else "") + " ORDER BY created_at"
            return {r["access_key"]: dict(r) for r in conn.execute(sql).fetchall()}

        return await self._read(fn)

    async def create_keypair(self, keypair: dict[str, Any]) -> None:
        def fn(conn: sqlite3.Connection) -> None:
            if not conn.execute(
                "SELECT 1 FROM resource_policies WHERE name=?", (keypair["resource_policy"],)
            ).fetchone():
                raise KeyError(f"no resource policy {keypair['resource_policy']!r}")
            conn.execute(
                "INSERT INTO keypairs(access_key, secret_key, user_id, is_admin, resource_policy, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (
                    keypair["access_key"],
                    keypair["secret_key"],
                    keypair["user_id"],
                    int(keypair["is_admin"]),
                    keypair["resource_policy"],
                    utcnow(),
                ),
            )

        await self._tx(fn)

    async def update_keypair(self, access_key: str, **cols: Any) -> bool:
        """Change a keypair's resource_policy / is_active; False when there is no such keypair."""

        def fn(conn: sqlite3.Connection) -> bool:
            if (
                "resource_policy" in cols
                and not conn.execute(
                    "SELECT 1 FROM resource_policies WHERE name=?", (cols["resource_policy"],)
                ).fetchone()
            ):
                raise KeyError(f"no resource policy {cols['resource_policy']!r}")
            sets = ", ".join(f"{c}=?" for c in cols)
            return (
                conn.execute(f"UPDATE keypairs SET {sets} WHERE access_key=?", (*cols.values(), access_key)).rowcount
                > 0
            )

        return await self._tx(fn)

    # -- resource policies ------------------------------------------------------------------------

    async def policies(self) -> dict[str, dict[str, Any]]:
        def fn(conn: sqlite3.Connection) -> dict[str, dict[str, Any]]:
            rows = conn.execute("SELECT * FROM resource_policies ORDER BY name").fetchall()
            return {r["name"]: _row(r) for r in rows}

        return await self._read(fn)

    async def save_policy(self, name: str, fields: dict[str, Any], *, create: bool) -> bool:
        """Create a policy (False if the name is taken) or update one (False if there is none)."""

        def fn(conn: sqlite3.Connection) -> bool:
            values = {k: json.dumps(v) if k == "total_resource_slots" else v for k, v in fields.items()}
            exists = conn.execute("SELECT 1 FROM resource_policies WHERE name=?", (name,)).fetchone() is not None
            if create:
                if exists:
                    return False
                cols = ["name", "created_at", *values]
                conn.execute(
                    f"INSERT INTO resource_policies({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                    (name, utcnow(), *values.values()),
                )
                return True
            if not exists:
                return False
            if values:
                sets = ", ".join(f"{c}=?" for c in values)
                conn.execute(f"UPDATE resource_policies SET {sets} WHERE name=?", (*values.values(), name))
            return True

        return await self._tx(fn)

    # -- agents ---------------------------------------------------------------------------------

    async def upsert_agent(self, info: dict[str, Any]) -> None:
        def fn(conn: sqlite3.Connection) -> None:
            now = utcnow()
            conn.execute(
                "INSERT INTO agents(id, hostname, backend, version, scaling_group, status, slots, "
                "first_contact, last_seen) VALUES (?, ?, ?, ?, ?, 'ALIVE', ?, ?, ?) "
                "ON CONFLICT(id) DO UPDATE SET hostname=excluded.hostname, backend=excluded.backend, "
                "version=excluded.version, scaling_group=excluded.scaling_group, status='ALIVE', "
                "slots=excluded.slots, last_seen=excluded.last_seen",
                (
                    info["id"],
                    info["hostname"],
                    info["backend"],
                    info["version"],
                    info["scaling_group"],
                    json.dumps(info["slots"]),
                    now,
                    now,
                ),
            )

        await self._tx(fn)

    async def set_agent_status(self, agent_id: str, status: str) -> None:
        await self._tx(
            lambda conn: conn.execute(
                "UPDATE agents SET status=?, last_seen=? WHERE id=?", (status, utcnow(), agent_id)
            )
        )

    async def touch_agent(self, agent_id: str) -> None:
        await self._tx(
            lambda conn: conn.execute("UPDATE agents SET last_seen=?, status='ALIVE' WHERE id=?", (utcnow(), agent_id))
        )

    async def agents(self) -> list[dict[str, Any]]:
        def fn(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            return [_row(r) for r in conn.execute("SELECT * FROM agents ORDER BY id").fetchall()]

        return await self._read(fn)

    # -- sessions -------------------------------------------------------------------------------

    async def create_session(self, session: dict[str, Any], kernels: list[dict[str, Any]]) -> str | None:
        """Insert a PENDING session and its kernels; if the owner already has an active session of
        that name, insert nothing and return that session's id (names are unique among live ones)."""

        def fn(conn: sqlite3.Connection) -> str | None:
            live = ",".join(repr(s.value) for s in ACTIVE_STATUSES)
            taken = conn.execute(
                f"SELECT id FROM sessions WHERE access_key=? AND name=? AND status IN ({live})",
                (session["access_key"], session["name"]),
            ).fetchone()
            if taken is not None:
                return taken[0]
            seq = conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM sessions").fetchone()[0]
            now = session["created_at"]
            conn.execute(
                "INSERT INTO sessions(id, name, access_key, image, type, status, status_info, status_data, "
                "status_changed, requested_slots, environ, config, scaling_group, cluster_size, tag, "
                "created_at, seq) VALUES (?, ?, ?, ?, ?, 'PENDING', '', '{}', ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    session["id"],
                    session["name"],
                    session["access_key"],
                    session["image"],
                    session["type"],
                    now,
                    json.dumps(session["requested_slots"]),
                    json.dumps(session["environ"]),
                    json.dumps(session["config"]),
                    session["scaling_group"],
                    len(kernels),
                    session.get("tag"),
                    now,
                    seq,
                ),
            )
            conn.execute("INSERT INTO session_transitions VALUES (?, 'PENDING', '', '{}', ?)", (session["id"], now))
            conn.executemany(
                "INSERT INTO kernels(id, session_id, cluster_role, cluster_idx, image, status, "
                "status_changed, occupied_slots, created_at) VALUES (?, ?, ?, ?, ?, 'PENDING', ?, ?, ?)",
                [
                    (
                        k["id"],
                        session["id"],
                        k["cluster_role"],
                        k["cluster_idx"],
                        session["image"],
                        now,
                        json.dumps(k["slots"]),
                        now,
                    )
                    for k in kernels
                ],
            )

            return None

        return await self._tx(fn)

    async def transition(
        self,
        session_id: str,
        target: SessionStatus,
        status_info: str = "",
        status_data: dict[str, Any] | None = None,
        *,
        allowed_from: Iterable[SessionStatus] | None = None,
        kernel_updates: dict[str, dict[str, Any]] | None = None,
        result: str | None = None,
    ) -> dict[str, Any] | None:
        """Move a session to `target` in one transaction; return the updated row.

        Returns None (and changes nothing) when the session is not in `allowed_from`;
        raises IllegalTransition for a move the lifecycle forbids. Kernels listed in
        `kernel_updates` get their columns updated in the same transaction; the kernels'
        status follows the session's unless given.
        """
        return await self._tx(
            lambda conn: _transition(
                conn, session_id, target, status_info, status_data, allowed_from, kernel_updates, result
            )
        )

    async def apply_round(
        self,
        placements: list[tuple[str, dict[str, str]]],
        cancels: list[tuple[str, str, dict[str, Any]]],
        pending: list[tuple[str, str, dict[str, Any]]],
        history: list[dict[str, Any]],
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Apply one scheduling round in ONE transaction.

        placements: (session id, {kernel id: agent id}) → SCHEDULED; cancels: (id, status_info, data)
        → CANCELLED; pending: (id, status_info, data) recorded on sessions still PENDING; history:
        rows for `scheduling_history` (merged with the session's last row when nothing changed).
        Returns the rows that were scheduled and cancelled (sessions no longer PENDING are skipped).
        """

        def fn(conn: sqlite3.Connection) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
            scheduled, cancelled = [], []
            for session_id, agents in placements:
                updates = {kid: {"agent_id": agent} for kid, agent in agents.items()}
                row = _transition(
                    conn, session_id, SessionStatus.SCHEDULED, "scheduled", {}, [SessionStatus.PENDING], updates, None
                )
                if row is not None:
                    scheduled.append(row)
            for session_id, info, data in cancels:
                row = _transition(
                    conn, session_id, SessionStatus.CANCELLED, info, data, [SessionStatus.PENDING], None, None
                )
                if row is not None:
                    cancelled.append(row)
            conn.executemany(
                "UPDATE sessions SET status_info=?, status_data=? WHERE id=? AND status='PENDING'",
                [(info, json.dumps(data), sid) for sid, info, data in pending],
            )
            now = utcnow()
            for h in history:
                last = conn.execute(
                    "SELECT rowid, outcome, status_info, msg, agents FROM scheduling_history "
                    "WHERE session_id=? ORDER BY rowid DESC LIMIT 1",
                    (h["session_id"],),
                ).fetchone()
                same = last is not None and tuple(last[1:]) == (h["outcome"], h["status_info"], h["msg"], h["agents"])
                if same:
                    conn.execute(
                        "UPDATE scheduling_history SET last_at=?, rounds=rounds+1 WHERE rowid=?", (now, last[0])
                    )
                else:
                    conn.execute(
                        "INSERT INTO scheduling_history(session_id, first_at, last_at, rounds, outcome, status_info, "
                        "msg, agents, predicates) VALUES (?, ?, ?, 1, ?, ?, ?, ?, ?)",
                        (
                            h["session_id"],
                            now,
                            now,
                            h["outcome"],
                            h["status_info"],
                            h["msg"],
                            h["agents"],
                            json.dumps(h["predicates"]),
                        ),
                    )
            return scheduled, cancelled

        return await self._tx(fn)

    async def scheduling_history(self, session_id: str) -> list[dict[str, Any]]:
        def fn(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            rows = conn.execute(
                "SELECT first_at, last_at, rounds, outcome, status_info, msg, agents, predicates "
                "FROM scheduling_history WHERE session_id=? ORDER BY rowid",
                (session_id,),
            ).fetchall()
            return [{**dict(r), "predicates": json.loads(r["predicates"])} for r in rows]

        return await self._read(fn)

    async def update_kernel(self, kernel_id: str, **cols: Any) -> None:
        if not cols:
            return
        sets = ", ".join(f"{c}=?" for c in cols)
        await self._tx(lambda conn: conn.execute(f"UPDATE kernels SET {sets} WHERE id=?", (*cols.values(), kernel_id)))

    async def get_session(self, session_id: str) -> dict[str, Any] | None:
        return await self._read(
            lambda conn: _row(conn.execute("SELECT * FROM sessions WHERE id=?", (session_id,)).fetchone())
        )

    async def count_sessions_by_status(self) -> dict[str, int]:
        return await self._read(
            lambda conn: dict(conn.execute("SELECT status, COUNT(*) FROM sessions GROUP BY status").fetchall())
        )

    async def sessions_by_ids(self, session_ids: list[str]) -> list[dict[str, Any]]:
        """The sessions with these ids (those that exist), in one read."""

        def fn(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            out = []
            for start in range(0, len(session_ids), 500):  # stay under SQLite's parameter limit
                chunk = session_ids[start : start + 500]
                sql = f"SELECT * FROM sessions WHERE id IN ({','.join('?' * len(chunk))})"
                out.extend(_row(r) for r in conn.execute(sql, chunk).fetchall())
            return out

        return await self._read(fn)

    async def find_sessions(
        self, ref: str, access_key: str | None, *, active_only: bool, ids_of: str | None | bool = True
    ) -> list[dict[str, Any]]:
        """Sessions whose id (or id prefix of 8+ chars) or name matches `ref`, newest first.

        Names are looked up among `access_key`'s sessions (None: anyone's); ids among `ids_of`'s
        (True, the default: the same keypair as names; None: anyone's)."""
        id_owner = access_key if ids_of is True else ids_of

        def fn(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            # indexed look-ups (id, owner+name, id range for a prefix) rather than one OR that scans
            only_id_owner = " AND access_key = :ids" if id_owner is not None else ""
            matches = "SELECT rowid FROM sessions WHERE id = :ref" + only_id_owner
            if access_key is not None:
                matches += " UNION SELECT rowid FROM sessions WHERE access_key = :names AND name = :ref"
            else:
                matches += " UNION SELECT rowid FROM sessions WHERE name = :ref"
            if len(ref) >= 8:
                matches += " UNION SELECT rowid FROM sessions WHERE id >= :ref AND id < :ref || '~'" + only_id_owner
            sql = f"SELECT * FROM sessions WHERE rowid IN ({matches})"
            if active_only:
                sql += f" AND status IN ({','.join(repr(s.value) for s in ACTIVE_STATUSES)})"
            params = {"ref": ref, "names": access_key, "ids": id_owner}
            return [_row(r) for r in conn.execute(sql + " ORDER BY seq DESC", params).fetchall()]

        return await self._read(fn)

    async def list_sessions(
        self, access_key: str | None, statuses: Iterable[SessionStatus] | None, limit: int = -1, newest: bool = False
    ) -> list[dict[str, Any]]:
        """Sessions in queue order (`newest`: the latest first); `limit` -1 means all of them."""

        def fn(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            clauses, params = [], []
            if access_key is not None:
                clauses.append("access_key = ?")
                params.append(access_key)
            if statuses is not None:
                values = [s.value for s in statuses]
                clauses.append(f"status IN ({','.join('?' * len(values))})")
                params.extend(values)
            where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
            sql = f"SELECT * FROM sessions {where} ORDER BY seq {'DESC' if newest else ''} LIMIT ?"
            return [_row(r) for r in conn.execute(sql, (*params, limit)).fetchall()]

        return await self._read(fn)

    async def kernels_of(self, session_id: str) -> list[dict[str, Any]]:
        return (await self.kernels_of_many([session_id])).get(session_id, [])

    async def kernels_of_many(self, session_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
        """The kernels of several sessions in one read, keyed by session id."""

        def fn(conn: sqlite3.Connection) -> dict[str, list[dict[str, Any]]]:
            out: dict[str, list[dict[str, Any]]] = {}
            for start in range(0, len(session_ids), 500):  # stay under SQLite's parameter limit
                chunk = session_ids[start : start + 500]
                rows = conn.execute(
                    f"SELECT * FROM kernels WHERE session_id IN ({','.join('?' * len(chunk))}) "
                    "ORDER BY session_id, cluster_idx",
                    chunk,
                ).fetchall()
                for r in rows:
                    out.setdefault(r["session_id"], []).append(_row(r))
            return out

        return await self._read(fn)

    async def kernels_where(self, statuses: Iterable[str], agent_id: str | None = None) -> list[dict[str, Any]]:
        values = list(statuses)

        def fn(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            sql = f"SELECT * FROM kernels WHERE status IN ({','.join('?' * len(values))})"
            params: list[Any] = list(values)
            if agent_id is not None:
                sql += " AND agent_id = ?"
                params.append(agent_id)
            return [_row(r) for r in conn.execute(sql, params).fetchall()]

        return await self._read(fn)

    async def get_kernel(self, kernel_id: str) -> dict[str, Any] | None:
        return await self._read(
            lambda conn: _row(conn.execute("SELECT * FROM kernels WHERE id=?", (kernel_id,)).fetchone())
        )

    async def transitions_of(self, session_id: str) -> list[dict[str, Any]]:
        return await self._read(
            lambda conn: [
                _row(r)
                for r in conn.execute(
                    "SELECT status, status_info, status_data, at FROM session_transitions "
                    "WHERE session_id=? ORDER BY rowid",
                    (session_id,),
                ).fetchall()
            ]
        )

    async def record_run(self, session_id: str, kernel_id: str, exit_code: int, result: str) -> None:
        """Record the exit code (on the kernel) and result (on the session) of a run that finished;
        no status change. A later destroy keeps both (its transition leaves them as they are)."""

        def fn(conn: sqlite3.Connection) -> None:
            conn.execute("UPDATE kernels SET exit_code=? WHERE id=?", (exit_code, kernel_id))
            conn.execute("UPDATE sessions SET result=? WHERE id=?", (result, session_id))

        await self._tx(fn)

    # -- virtual folders ----------------------------------------------------------------------------

    async def create_vfolder(self, folder: dict[str, Any]) -> bool:
        """Insert a folder; False when its owner already has a ready folder of that name."""

        def fn(conn: sqlite3.Connection) -> bool:
            try:
                conn.execute(
                    "INSERT INTO vfolders(id, name, host, owner, usage_mode, status, created_at) "
                    "VALUES (?, ?, ?, ?, ?, 'ready', ?)",
                    (folder["id"], folder["name"], folder["host"], folder["owner"], folder["usage_mode"], utcnow()),
                )
            except sqlite3.IntegrityError:
                return False
            return True

        return await self._tx(fn)

    async def vfolders_of(self, access_key: str | None, status: str = "ready") -> list[dict[str, Any]]:
        """Folders a keypair owns (permission `wd`) or that are shared with it (`ro` / `rw`), by name;
        every folder (as its owner sees it) when `access_key` is None."""

        def fn(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            if access_key is None:
                sql = "SELECT *, 'wd' AS permission, 1 AS is_owner FROM vfolders WHERE status=? ORDER BY name, id"
                return [dict(r) for r in conn.execute(sql, (status,)).fetchall()]
            sql = (
                "SELECT v.*, 'wd' AS permission, 1 AS is_owner FROM vfolders v WHERE v.owner=? AND v.status=? "
                "UNION ALL SELECT v.*, s.permission AS permission, 0 AS is_owner FROM vfolders v "
                "JOIN vfolder_shares s ON s.vfolder_id = v.id WHERE s.access_key=? AND v.status=? "
                "ORDER BY is_owner DESC, name, id"
            )
            return [dict(r) for r in conn.execute(sql, (access_key, status, access_key, status)).fetchall()]

        return await self._read(fn)

    async def get_vfolder(self, folder_id: str) -> dict[str, Any] | None:
        return await self._read(
            lambda conn: _row(conn.execute("SELECT * FROM vfolders WHERE id=?", (folder_id,)).fetchone())
        )

    async def update_vfolder(self, folder_id: str, **cols: Any) -> bool:
        """Change a folder's name / status / trashed_at; False when the new name is taken."""

        def fn(conn: sqlite3.Connection) -> bool:
            sets = ", ".join(f"{c}=?" for c in cols)
            try:
                conn.execute(f"UPDATE vfolders SET {sets} WHERE id=?", (*cols.values(), folder_id))
            except sqlite3.IntegrityError:
                return False
            return True

        return await self._tx(fn)

    async def delete_vfolder(self, folder_id: str) -> None:
        def fn(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM vfolder_shares WHERE vfolder_id=?", (folder_id,))
            conn.execute("DELETE FROM vfolders WHERE id=?", (folder_id,))

        await self._tx(fn)

    async def count_vfolders(self, owner: str) -> int:
        return await self._read(
            lambda conn: conn.execute("SELECT COUNT(*) FROM vfolders WHERE owner=?", (owner,)).fetchone()[0]
        )

    async def share_vfolder(self, folder_id: str, access_key: str, permission: str | None) -> None:
        """Share with a keypair as `ro` / `rw`, or (permission None) stop sharing."""

        def fn(conn: sqlite3.Connection) -> None:
            if permission is None:
                conn.execute("DELETE FROM vfolder_shares WHERE vfolder_id=? AND access_key=?", (folder_id, access_key))
            else:
                conn.execute(
                    "INSERT INTO vfolder_shares(vfolder_id, access_key, permission) VALUES (?, ?, ?) "
                    "ON CONFLICT(vfolder_id, access_key) DO UPDATE SET permission=excluded.permission",
                    (folder_id, access_key, permission),
                )

        await self._tx(fn)

    async def shares_of(self, folder_id: str) -> dict[str, str]:
        def fn(conn: sqlite3.Connection) -> dict[str, str]:
            rows = conn.execute(
                "SELECT access_key, permission FROM vfolder_shares WHERE vfolder_id=? ORDER BY access_key",
                (folder_id,),
            ).fetchall()
            return {r[0]: r[1] for r in rows}

        return await self._read(fn)

    # -- image aliases ------------------------------------------------------------------------------

    async def image_aliases(self) -> dict[str, str]:
        return await self._read(lambda conn: dict(conn.execute("SELECT alias, image FROM image_aliases").fetchall()))

    async def set_image_alias(self, alias: str, image: str | None) -> bool:
        """Set an alias (image None: remove it); False when removing one that does not exist."""

        def fn(conn: sqlite3.Connection) -> bool:
            if image is None:
                return conn.execute("DELETE FROM image_aliases WHERE alias=?", (alias,)).rowcount > 0
            conn.execute(
                "INSERT INTO image_aliases(alias, image) VALUES (?, ?) "
                "ON CONFLICT(alias) DO UPDATE SET image=excluded.image",
                (alias, image),
            )
            return True

        return await self._tx(fn)

    # -- dotfiles -----------------------------------------------------------------------------------

    async def dotfiles(self, access_key: str) -> list[dict[str, Any]]:
        def fn(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            sql = "SELECT path, data, permission FROM dotfiles WHERE access_key=? ORDER BY path"
            return [dict(r) for r in conn.execute(sql, (access_key,)).fetchall()]

        return await self._read(fn)

    async def put_dotfile(self, access_key: str, path: str, data: str, permission: str) -> None:
        await self._tx(
            lambda conn: conn.execute(
                "INSERT INTO dotfiles(access_key, path, data, permission) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(access_key, path) DO UPDATE SET data=excluded.data, permission=excluded.permission",
                (access_key, path, data, permission),
            )
        )

    async def delete_dotfile(self, access_key: str, path: str) -> bool:
        return await self._tx(
            lambda conn: (
                conn.execute("DELETE FROM dotfiles WHERE access_key=? AND path=?", (access_key, path)).rowcount > 0
            )
        )

    # -- logs -----------------------------------------------------------------------------------

    async def append_logs(self, chunks: list[tuple[str, str]]) -> None:
        """Append (kernel_id, text) chunks in one transaction, each kernel's log kept within
        `log_max_bytes` (its oldest output dropped, one marker line first saying how much)."""
        now = utcnow()
        by_kernel: dict[str, list[str]] = {}
        for kid, text in chunks:
            by_kernel.setdefault(kid, []).append(text)

        def fn(conn: sqlite3.Connection) -> None:
            # the transaction by hand: the cache of kernel_log_sizes changes in this thread, once committed
            conn.execute("BEGIN IMMEDIATE")
            try:
                sizes = {
                    kid: _append_log(conn, kid, texts, self.log_max_bytes, now, self._log_sizes.get(kid))
                    for kid, texts in by_kernel.items()
                }
                conn.execute("COMMIT")
            except BaseException:
                for kid in by_kernel:
                    self._log_sizes.pop(kid, None)
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            self._log_sizes.update(sizes)

        await self._read(fn)

    async def read_logs(self, kernel_id: str, after_seq: int = 0, limit: int = 1000) -> list[tuple[int, str]]:
        return [(seq, data) for seq, data, _ in await self.read_log_chunks(kernel_id, after_seq, limit)]

    async def read_log_chunks(
        self, kernel_id: str, after_seq: int = 0, limit: int = 1000, max_bytes: int | None = LOG_PAGE_BYTES
    ) -> list[tuple[int, str, str | None]]:
        """(seq, text, stored-at) chunks of a kernel's log after `after_seq`, oldest first: at most `limit`
        of them and about `max_bytes` (whole chunks, at least one)."""
        return (await self.read_log_page(kernel_id, after_seq, max_bytes, limit))[0]

    async def read_log_page(
        self, kernel_id: str, after_seq: int = 0, max_bytes: int | None = LOG_PAGE_BYTES, limit: int = 100_000
    ) -> tuple[list[tuple[int, str, str | None]], bool]:
        """Chunks as `read_log_chunks` gives them, and whether more chunks follow."""
        return await self._read(lambda conn: _log_page(conn, kernel_id, after_seq, limit, max_bytes))

    async def read_log_tail(self, kernel_id: str, lines: int) -> tuple[list[tuple[int, str, str | None]], int]:
        """The chunks holding a kernel's last `lines` lines (the first one cut to where they start), and the
        seq of its newest chunk (0: none), from which to follow it."""

        def fn(conn: sqlite3.Connection) -> tuple[list[tuple[int, str, str | None]], int]:
            out: list[tuple[int, str, str | None]] = []
            newest, need = 0, lines
            cursor = conn.execute(
                "SELECT seq, data, ts FROM kernel_logs WHERE kernel_id=? ORDER BY seq DESC", (kernel_id,)
            )
            for seq, data, ts in cursor:
                if not newest:
                    newest = seq
                    need += data.endswith("\n")  # the newline that ends the last line starts no line
                if need <= 0:
                    break
                count = data.count("\n")
                if count >= need:
                    pos = len(data)
                    for _ in range(need):
                        pos = data.rindex("\n", 0, pos)
                    out.append((seq, data[pos + 1 :], ts))
                    break
                need -= count
                out.append((seq, data, ts))
            cursor.close()
            return [c for c in reversed(out) if c[1]], newest

        return await self._read(fn)

    async def log_state(self, kernel_id: str) -> dict[str, Any] | None:
        """{"bytes": kept, "dropped": bytes dropped, "purged_at": when purged or None}; None: no output yet."""
        row = await self._read(
            lambda conn: conn.execute(
                "SELECT bytes, dropped, purged_at FROM kernel_log_sizes WHERE kernel_id=?", (kernel_id,)
            ).fetchone()
        )
        return dict(row) if row is not None else None

    async def purge_logs(self, ended_before: str, batch: int = 50) -> list[str]:
        """Delete the logs of kernels whose session ended before `ended_before` (ISO 8601, UTC), `batch`
        kernels per transaction; the kernels purged. Their kernel_log_sizes rows stay, to say so."""
        purged: list[str] = []

        def fn(conn: sqlite3.Connection) -> list[str]:
            kernels = [
                r[0]
                for r in conn.execute(
                    "SELECT z.kernel_id FROM kernel_log_sizes z JOIN kernels k ON k.id = z.kernel_id "
                    "JOIN sessions s ON s.id = k.session_id "
                    "WHERE z.purged_at IS NULL AND s.terminated_at IS NOT NULL AND s.terminated_at < ? LIMIT ?",
                    (ended_before, batch),
                )
            ]
            now = utcnow()
            for kid in kernels:
                self._log_sizes.pop(kid, None)  # read again should it log once more
                conn.execute("DELETE FROM kernel_logs WHERE kernel_id=?", (kid,))
                conn.execute(
                    "UPDATE kernel_log_sizes SET bytes=0, dropped=0, marker_seq=NULL, purged_at=? WHERE kernel_id=?",
                    (now, kid),
                )
            return kernels

        while done := await self._tx(fn):
            purged.extend(done)
            if len(done) < batch:
                break
        return purged

    async def reclaim_space(self, min_free_pages: int = 0) -> dict[str, int]:
        """Give free pages back to the file system (incremental vacuum) when there are more than
        `min_free_pages`, and checkpoint the WAL, cutting the -wal file to nothing."""

        def fn(conn: sqlite3.Connection) -> dict[str, int]:
            free = conn.execute("PRAGMA freelist_count").fetchone()[0]
            if free > min_free_pages:
                conn.executescript("PRAGMA incremental_vacuum;")  # (execute() would free one page only)
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            return {"free_pages": free, "pages": conn.execute("PRAGMA page_count").fetchone()[0]}

        return await self._read(fn)

    async def log_tail_start(self, kernel_id: str, lines: int) -> int:
        """The `after_seq` from which reading a kernel's log yields about its last `lines` lines."""

        def fn(conn: sqlite3.Connection) -> int:
            seen = 0
            cursor = conn.execute("SELECT seq, data FROM kernel_logs WHERE kernel_id=? ORDER BY seq DESC", (kernel_id,))
            for seq, data in cursor:
                seen += data.count("\n")
                if seen > lines:
                    return seq
            return 0

        return await self._read(fn)

    async def set_pending_info(self, session_id: str, info: str, data: dict[str, Any]) -> None:
        """Record why a PENDING session is still pending (no status change, no transition row)."""
        await self.set_status_info(session_id, "PENDING", info, data)

    async def set_status_info(self, session_id: str, status: str, info: str, data: dict[str, Any]) -> dict | None:
        """Update the status info and data of a session still in `status` (no transition); its row, or None."""

        def fn(conn: sqlite3.Connection) -> dict[str, Any] | None:
            changed = conn.execute(
                "UPDATE sessions SET status_info=?, status_data=? WHERE id=? AND status=?",
                (info, json.dumps(data), session_id, status),
            ).rowcount
            if not changed:
                return None
            return _row(conn.execute("SELECT * FROM sessions WHERE id=?", (session_id,)).fetchone())

        return await self._tx(fn)

    async def add_hook_notes(self, session_id: str, notes: list[str]) -> None:
        """Remember what went wrong with hooks for a session (shown in its status_data["hooks"])."""

        def fn(conn: sqlite3.Connection) -> None:
            row = conn.execute("SELECT config FROM sessions WHERE id=?", (session_id,)).fetchone()
            if row is not None:
                config = json.loads(row[0])
                config["hook_notes"] = [*config.get("hook_notes", []), *notes]
                conn.execute("UPDATE sessions SET config=? WHERE id=?", (json.dumps(config), session_id))

        await self._tx(fn)
