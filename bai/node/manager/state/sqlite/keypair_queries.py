"""Keypairs, resource policies and dotfiles (what a keypair owns)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from bai.node.manager.state.sqlite.db import Queries, decode_row, utcnow

POLICY_FIELDS = (
    "max_concurrent_sessions",
    "total_resource_slots",
    "default_for_unspecified",
    "idle_timeout",
    "max_session_lifetime",
    "max_vfolder_count",
    "max_vfolder_size",
    "idle_cpu_pct",
    "idle_gpu_pct",
    "idle_window",
    "max_session_networks",
    "max_pending_session_count",
)
DEFAULT_SESSION_NETWORKS = 2  # resource_policies.max_session_networks of a policy that does not say
DEFAULT_PENDING_SESSIONS = 1000  # resource_policies.max_pending_session_count of a policy that does not say


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """Every keypair's policy and its max_pending_session_count; `default`: the default policy's, for a keypair
    the store does not have."""

    by_key: dict[str, tuple[str, int]]
    default: tuple[str, int]

    def of(self, access_key: str) -> tuple[str, int]:
        return self.by_key.get(access_key, self.default)


class Keypairs(Queries):
    """Keypairs, the resource policies they follow, and their dotfiles."""

    # access key -> (policy, max_pending_session_count), kept in memory; None: to be read (see pending_queue)
    _queue_limits: QueueLimits | None = None
    _queue_limits_version = 0

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

        return await self.db.transaction(fn)

    async def keypairs(self, active_only: bool = True) -> dict[str, dict[str, Any]]:
        def fn(conn: sqlite3.Connection) -> dict[str, dict[str, Any]]:
            sql = "SELECT * FROM keypairs" + (" WHERE is_active=1" if active_only else "") + " ORDER BY created_at"
            return {r["access_key"]: dict(r) for r in conn.execute(sql).fetchall()}

        return await self.db.run(fn)

    async def create_keypair(self, keypair: dict[str, Any]) -> None:
        self._limits_changed()

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

        await self.db.transaction(fn)

    async def update_keypair(self, access_key: str, **cols: Any) -> bool:
        """Change a keypair's resource_policy / is_active; False when there is no such keypair."""
        self._limits_changed()

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

        return await self.db.transaction(fn)

    async def delete_keypair(self, access_key: str) -> bool:
        """Remove a keypair and its dotfiles; False when there is no such keypair."""
        self._limits_changed()

        def fn(conn: sqlite3.Connection) -> bool:
            self.db.dotfile_owners = None
            conn.execute("DELETE FROM dotfiles WHERE access_key=?", (access_key,))
            return conn.execute("DELETE FROM keypairs WHERE access_key=?", (access_key,)).rowcount > 0

        return await self.db.transaction(fn)

    async def delete_policy(self, name: str) -> str | None:
        """Remove a resource policy no keypair follows; None when done, else why not."""
        self._limits_changed()

        def fn(conn: sqlite3.Connection) -> str | None:
            if not conn.execute("SELECT 1 FROM resource_policies WHERE name=?", (name,)).fetchone():
                return f"no resource policy {name!r}"
            users = conn.execute("SELECT COUNT(*) FROM keypairs WHERE resource_policy=?", (name,)).fetchone()[0]
            if users:
                return f"resource policy {name!r} is used by {users} keypair(s)"
            conn.execute("DELETE FROM resource_policies WHERE name=?", (name,))
            return None

        return await self.db.transaction(fn)

    async def policies(self) -> dict[str, dict[str, Any]]:
        def fn(conn: sqlite3.Connection) -> dict[str, dict[str, Any]]:
            rows = conn.execute("SELECT * FROM resource_policies ORDER BY name").fetchall()
            return {r["name"]: decode_row(r) for r in rows}

        return await self.db.run(fn)

    async def session_networks_by_keypair(self, statuses: Iterable[Any]) -> dict[str, int]:
        """Per keypair, its sessions of several kernels in these statuses (each holds a session network on
        every agent it runs on): what `max_session_networks` counts. One indexed read."""
        values = [getattr(s, "value", s) for s in statuses]

        def fn(conn: sqlite3.Connection) -> dict[str, int]:
            rows = conn.execute(
                f"SELECT access_key, COUNT(*) FROM sessions WHERE status IN ({','.join('?' * len(values))}) "
                "AND cluster_size > 1 GROUP BY access_key",
                values,
            ).fetchall()
            return {r[0]: r[1] for r in rows}

        return await self.db.run(fn)

    async def pending_queue(self, access_key: str) -> tuple[str, int, int]:
        """(the keypair's policy, its max_pending_session_count (0: unlimited), how many of the keypair's
        sessions are PENDING, counted only up to that limit). The limits are kept in memory (read again after
        any change of keypairs or policies), so an unlimited keypair costs no read and another one read: a
        count of at most `limit` entries of the sessions_owner_status index. An unknown keypair follows the
        default policy."""
        limits = self._queue_limits or await self._read_queue_limits()
        name, limit = limits.of(access_key)
        if not limit:
            return name, 0, 0

        def count(conn: sqlite3.Connection) -> int:
            sql = "SELECT COUNT(*) FROM (SELECT 1 FROM sessions WHERE access_key = ? AND status = 'PENDING' LIMIT ?)"
            return conn.execute(sql, (access_key, limit)).fetchone()[0]

        return name, limit, await self.db.run(count)

    async def _read_queue_limits(self) -> QueueLimits:
        version = self._queue_limits_version

        def fn(conn: sqlite3.Connection) -> QueueLimits:
            rows = conn.execute(
                "SELECT k.access_key, p.name, p.max_pending_session_count FROM keypairs k "
                "JOIN resource_policies p ON p.name = k.resource_policy"
            ).fetchall()
            default = conn.execute(
                "SELECT max_pending_session_count FROM resource_policies WHERE name = 'default'"
            ).fetchone()
            fallback = ("default", default[0] if default else DEFAULT_PENDING_SESSIONS)
            return QueueLimits({r[0]: (r[1], r[2]) for r in rows}, fallback)

        limits = await self.db.run(fn)
        if version == self._queue_limits_version:  # no change meanwhile: what was read is still true
            self._queue_limits = limits
        return limits

    def _limits_changed(self) -> None:
        """Keypairs or policies change: the queue limits kept in memory are read again when next needed."""
        self._queue_limits = None
        self._queue_limits_version += 1

    async def save_policy(self, name: str, fields: dict[str, Any], *, create: bool) -> bool:
        """Create a policy (False if the name is taken) or update one (False if there is none)."""
        self._limits_changed()

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

        return await self.db.transaction(fn)

    async def dotfiles(self, access_key: str) -> list[dict[str, Any]]:
        def fn(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            sql = "SELECT path, data, permission FROM dotfiles WHERE access_key=? ORDER BY path"
            return [dict(r) for r in conn.execute(sql, (access_key,)).fetchall()]

        return await self.db.run(fn)

    async def put_dotfile(self, access_key: str, path: str, data: str, permission: str) -> None:
        def fn(conn: sqlite3.Connection) -> None:
            self.db.dotfile_owners = None
            conn.execute(
                "INSERT INTO dotfiles(access_key, path, data, permission) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(access_key, path) DO UPDATE SET data=excluded.data, permission=excluded.permission",
                (access_key, path, data, permission),
            )

        await self.db.transaction(fn)

    async def delete_dotfile(self, access_key: str, path: str) -> bool:
        def fn(conn: sqlite3.Connection) -> bool:
            self.db.dotfile_owners = None
            return conn.execute("DELETE FROM dotfiles WHERE access_key=? AND path=?", (access_key, path)).rowcount > 0

        return await self.db.transaction(fn)
