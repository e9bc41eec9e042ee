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
    terminated_at TEXT
);
CREATE INDEX IF NOT EXISTS kernels_session ON kernels(session_id);
CREATE TABLE IF NOT EXISTS kernel_logs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    kernel_id TEXT NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS kernel_logs_kernel ON kernel_logs(kernel_id, seq);
"""

_JSON_COLUMNS = {"status_data", "requested_slots", "environ", "config", "slots", "occupied_slots"}


def utcnow() -> str:
    return datetime.now(UTC).isoformat()


def _row(row: sqlite3.Row | None) -> dict[str, Any] | None:
    if row is None:
        return None
    out = dict(row)
    for key in _JSON_COLUMNS & out.keys():
        out[key] = json.loads(out[key])
    return out


class Store:
    def __init__(self, db: aiosqlite.Connection) -> None:
        self.db = db

    @classmethod
    async def open(cls, path: Path) -> Store:
        path.parent.mkdir(parents=True, exist_ok=True)
        db = await aiosqlite.connect(path, isolation_level=None)
        db.row_factory = sqlite3.Row

        def init(conn: sqlite3.Connection) -> None:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA busy_timeout=5000")
            conn.executescript(SCHEMA)

        await db._execute(init, db._conn)  # one hop for all the set-up
        return cls(db)

    async def close(self) -> None:
        await self.db.close()

    async def _tx(self, fn) -> Any:
        """Run fn(conn) inside one BEGIN IMMEDIATE … COMMIT in the database thread."""

        def run(conn: sqlite3.Connection) -> Any:
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = fn(conn)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
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

    async def keypairs(self) -> dict[str, dict[str, Any]]:
        def fn(conn: sqlite3.Connection) -> dict[str, dict[str, Any]]:
            rows = conn.execute("SELECT * FROM keypairs WHERE is_active=1").fetchall()
            return {r["access_key"]: dict(r) for r in rows}

        return await self._read(fn)

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

    async def agents(self) -> list[dict[str, Any]]:
        def fn(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            return [_row(r) for r in conn.execute("SELECT * FROM agents ORDER BY id").fetchall()]

        return await self._read(fn)

    # -- sessions -------------------------------------------------------------------------------

    async def create_session(self, session: dict[str, Any], kernels: list[dict[str, Any]]) -> None:
        def fn(conn: sqlite3.Connection) -> None:
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

        await self._tx(fn)

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
        allowed = set(allowed_from) if allowed_from is not None else None

        def fn(conn: sqlite3.Connection) -> dict[str, Any] | None:
            row = conn.execute("SELECT status FROM sessions WHERE id=?", (session_id,)).fetchone()
            if row is None:
                return None
            current = SessionStatus(row[0])
            if allowed is not None and current not in allowed:
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
                cols: dict[str, Any] = {
                    "status": target.value,
                    "status_info": status_info,
                    "status_changed": now,
                }
                if terminated:
                    cols["terminated_at"] = terminated
                cols.update((kernel_updates or {}).get(kid, {}))
                sets = ", ".join(f"{c}=?" for c in cols)
                conn.execute(f"UPDATE kernels SET {sets} WHERE id=?", (*cols.values(), kid))
            return _row(conn.execute("SELECT * FROM sessions WHERE id=?", (session_id,)).fetchone())

        return await self._tx(fn)

    async def update_kernel(self, kernel_id: str, **cols: Any) -> None:
        if not cols:
            return
        sets = ", ".join(f"{c}=?" for c in cols)
        await self._tx(lambda conn: conn.execute(f"UPDATE kernels SET {sets} WHERE id=?", (*cols.values(), kernel_id)))

    async def get_session(self, session_id: str) -> dict[str, Any] | None:
        return await self._read(
            lambda conn: _row(conn.execute("SELECT * FROM sessions WHERE id=?", (session_id,)).fetchone())
        )

    async def find_sessions(self, ref: str, access_key: str | None, *, active_only: bool) -> list[dict[str, Any]]:
        """Sessions whose id (or id prefix of 8+ chars) or name matches `ref`, newest first."""

        def fn(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            clauses = ["(id = ? OR name = ? OR (length(?) >= 8 AND substr(id, 1, length(?)) = ?))"]
            params: list[Any] = [ref, ref, ref, ref, ref]
            if access_key is not None:
                clauses.append("access_key = ?")
                params.append(access_key)
            if active_only:
                clauses.append(f"status IN ({','.join('?' * len(ACTIVE_STATUSES))})")
                params.extend(s.value for s in ACTIVE_STATUSES)
            sql = f"SELECT * FROM sessions WHERE {' AND '.join(clauses)} ORDER BY seq DESC"
            return [_row(r) for r in conn.execute(sql, params).fetchall()]

        return await self._read(fn)

    async def list_sessions(
        self, access_key: str | None, statuses: Iterable[SessionStatus] | None, limit: int = 1000
    ) -> list[dict[str, Any]]:
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
            sql = f"SELECT * FROM sessions {where} ORDER BY seq LIMIT ?"
            return [_row(r) for r in conn.execute(sql, (*params, limit)).fetchall()]

        return await self._read(fn)

    async def kernels_of(self, session_id: str) -> list[dict[str, Any]]:
        return await self._read(
            lambda conn: [
                _row(r)
                for r in conn.execute(
                    "SELECT * FROM kernels WHERE session_id=? ORDER BY cluster_idx", (session_id,)
                ).fetchall()
            ]
        )

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

    # -- logs -----------------------------------------------------------------------------------

    async def append_logs(self, chunks: list[tuple[str, str]]) -> None:
        """Append (kernel_id, text) chunks in one transaction."""
        await self._tx(lambda conn: conn.executemany("INSERT INTO kernel_logs(kernel_id, data) VALUES (?, ?)", chunks))

    async def read_logs(self, kernel_id: str, after_seq: int = 0, limit: int = 1000) -> list[tuple[int, str]]:
        return await self._read(
            lambda conn: [
                (r[0], r[1])
                for r in conn.execute(
                    "SELECT seq, data FROM kernel_logs WHERE kernel_id=? AND seq>? ORDER BY seq LIMIT ?",
                    (kernel_id, after_seq, limit),
                ).fetchall()
            ]
        )

    async def set_pending_info(self, session_id: str, info: str, data: dict[str, Any]) -> None:
        """Record why a PENDING session is still pending (no status change, no transition row)."""
        await self._tx(
            lambda conn: conn.execute(
                "UPDATE sessions SET status_info=?, status_data=? WHERE id=? AND status='PENDING'",
                (info, json.dumps(data), session_id),
            )
        )
