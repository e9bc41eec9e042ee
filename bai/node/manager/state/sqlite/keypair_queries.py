"""Keypairs, resource policies and dotfiles (what a keypair owns)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bai.node.manager.state.errors import UnknownPolicy
from bai.node.manager.state.records import Dotfile, Keypair, NewKeypair, Policy, PolicyFields, changed_fields, stamp
from bai.node.manager.state.sqlite.db import Queries, load_json
from bai.node.manager.state.team_records import DEFAULT_DOMAIN, DEFAULT_PROJECT_ID, TeamDirectory, free_email, user_uuid

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
    "max_priority",
)
DEFAULT_SESSION_NETWORKS = 2  # resource_policies.max_session_networks of a policy that does not say
DEFAULT_PENDING_SESSIONS = 1000  # resource_policies.max_pending_session_count of a policy that does not say
KEYPAIR_COLUMNS = "access_key, secret_key, user_id, is_admin, is_active, resource_policy, created_at, user_uuid"
POLICY_COLUMNS = "name, " + ", ".join(POLICY_FIELDS) + ", created_at"


def _keypair(r: sqlite3.Row) -> Keypair:
    return Keypair(r[0], r[1], r[2], bool(r[3]), bool(r[4]), r[5], r[6], r[7])


def _policy(r: sqlite3.Row) -> Policy:
    fields = dict(zip(POLICY_FIELDS, r[1:-1], strict=True))
    fields["total_resource_slots"] = load_json(fields["total_resource_slots"])
    return Policy(name=r[0], created_at=r[-1], **fields)


# the keypairs that sign requests: active ones of active users of active domains (a keypair of no user: bai's
# before users, until schema 16 gave each one)
_SIGNING = (
    "SELECT k.access_key, k.secret_key, k.user_id, k.is_admin, k.is_active, k.resource_policy, k.created_at, "
    "k.user_uuid FROM keypairs k LEFT JOIN users u ON u.uuid = k.user_uuid "
    "LEFT JOIN domains d ON d.name = u.domain_name "
    "WHERE k.is_active=1 AND (u.uuid IS NULL OR (u.status='active' AND COALESCE(d.is_active, 1)=1)) "
    "ORDER BY k.created_at"
)


def read_keypairs(conn: sqlite3.Connection, active_only: bool) -> dict[str, Keypair]:
    """Access key -> keypair, oldest first: all of them, or (`active_only`) those that may sign requests (active, of
    an active user of an active domain)."""
    if active_only:
        return {r[0]: _keypair(r) for r in conn.execute(_SIGNING).fetchall()}
    sql = f"SELECT {KEYPAIR_COLUMNS} FROM keypairs ORDER BY created_at"
    return {r[0]: _keypair(r) for r in conn.execute(sql).fetchall()}


_read_keypairs = read_keypairs


def _check_policy(conn: sqlite3.Connection, name: str) -> None:
    if not conn.execute("SELECT 1 FROM resource_policies WHERE name=?", (name,)).fetchone():
        raise UnknownPolicy(name)


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """Every keypair's policy and its max_pending_session_count; `default`: the default policy's, for a keypair
    the store does not have."""

    by_key: dict[str, tuple[str, int]]
    default: tuple[str, int]

    def of(self, access_key: str) -> tuple[str, int]:
        return self.by_key.get(access_key, self.default)


def user_for_keypair(conn: sqlite3.Connection, user_id: str, is_admin: bool, now: str) -> str:
    """The uuid of the user a new keypair of `user_id` belongs to: the user of that username or email, else a
    new one of the default domain and project (a superadmin for an admin keypair), as bai made users before it had
    them (`migrations.users_of_keypairs`)."""
    row = conn.execute(
        "SELECT uuid FROM users WHERE username=? OR email=? ORDER BY username=? DESC LIMIT 1",
        (user_id, user_id, user_id),
    ).fetchone()
    if row is not None:
        return str(row[0])
    uid = user_uuid(user_id)
    email = free_email(
        user_id, lambda e: conn.execute("SELECT 1 FROM users WHERE email=?", (e,)).fetchone() is not None
    )
    n = 1
    while conn.execute("SELECT 1 FROM users WHERE uuid=?", (uid,)).fetchone() is not None:
        uid = user_uuid(f"{user_id}#{n}")
        n += 1
    conn.execute(
        "INSERT INTO users(uuid, email, username, role, domain_name, created_at, modified_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        (uid, email, user_id, "superadmin" if is_admin else "user", DEFAULT_DOMAIN, now, now),
    )
    conn.execute("INSERT INTO project_members(project_id, user_uuid) VALUES (?, ?)", (DEFAULT_PROJECT_ID, uid))
    return uid


class Keypairs(Queries):
    """Keypairs, the resource policies they follow, and their dotfiles."""

    # access key -> (policy, max_pending_session_count), kept in memory; None: to be read (see pending_queue)
    _queue_limits: QueueLimits | None = None
    _queue_limits_version = 0
    _policies: dict[str, Policy | None] = {}  # name -> policy read (see `policy`); replaced, not changed
    _teams: TeamDirectory = TeamDirectory()  # (Teams': every team record, which keypairs' writes may add users to)
    _active: dict[str, Keypair] = {}  # the active keypairs, by access key (see load_keypairs); replaced, not changed

    async def ensure_admin_keypair(self, access_key: str, secret_key: str, now: datetime) -> tuple[str, str]:
        """Return the first admin keypair, creating one from the given keys (created `now`) if there is none."""
        at = stamp(now)

        def fn(conn: sqlite3.Connection) -> tuple[tuple[str, str], dict[str, Keypair]]:
            row = conn.execute(
                "SELECT access_key, secret_key FROM keypairs WHERE is_admin=1 AND is_active=1 "
                "ORDER BY created_at LIMIT 1"
            ).fetchone()
            if row:
                return (row[0], row[1]), _read_keypairs(conn, True)
            user = user_for_keypair(conn, "admin", True, at)
            conn.execute(
                "INSERT INTO keypairs(access_key, secret_key, user_id, is_admin, created_at, user_uuid) "
                "VALUES (?, ?, 'admin', 1, ?, ?)",
                (access_key, secret_key, at, user),
            )
            return (access_key, secret_key), _read_keypairs(conn, True)

        found: tuple[str, str] = await self._write_keypairs(fn)
        return found

    async def _write_keypairs(self, fn: Any) -> Any:
        """A transaction that changes keypairs (or what they follow) and returns (its answer, the active
        keypairs as it leaves them): the copy kept in memory follows, in the order the writes committed."""
        from bai.node.manager.state.sqlite.team_queries import read_directory  # (which reads keypairs' users)

        self._limits_changed()

        def tx(conn: sqlite3.Connection) -> tuple[Any, dict[str, Keypair], TeamDirectory]:
            answer, active = fn(conn)
            return answer, active, read_directory(conn)

        answer, self._active, self._teams = await self.db.transaction(tx)
        return answer

    async def load_keypairs(self) -> None:
        """Read the active keypairs into memory (once, at the start): `active_keypair` answers from there."""
        self._active = await self.db.run(lambda conn: _read_keypairs(conn, True))

    def active_keypair(self, access_key: str) -> Keypair | None:
        """The active keypair of this access key (None: none, or inactive), from memory: what authentication
        asks on every request. Kept current by this class's own writes."""
        return self._active.get(access_key)

    async def keypairs(self, active_only: bool = True) -> dict[str, Keypair]:
        """Access key -> keypair (active ones only, unless told), oldest first."""
        if active_only:
            return dict(self._active)
        return await self.db.run(lambda conn: _read_keypairs(conn, False))

    async def keypair(self, access_key: str) -> Keypair | None:
        """One keypair, active or not; None: no such keypair."""
        sql = f"SELECT {KEYPAIR_COLUMNS} FROM keypairs WHERE access_key=?"
        row = await self.db.run(lambda conn: conn.execute(sql, (access_key,)).fetchone())
        return _keypair(row) if row is not None else None

    async def create_keypair(self, keypair: NewKeypair, now: datetime) -> None:
        """Store a new keypair (active, created `now`); UnknownPolicy when its policy does not exist."""
        at = stamp(now)

        def fn(conn: sqlite3.Connection) -> tuple[None, dict[str, Keypair]]:
            _check_policy(conn, keypair.resource_policy)
            user = keypair.user_uuid or user_for_keypair(conn, keypair.user_id, keypair.is_admin, at)
            conn.execute(
                "INSERT INTO keypairs(access_key, secret_key, user_id, is_admin, resource_policy, created_at, "
                "user_uuid) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (keypair.access_key, keypair.secret_key, keypair.user_id, int(keypair.is_admin),
                 keypair.resource_policy, at, user),
            )  # fmt: skip
            return None, _read_keypairs(conn, True)

        await self._write_keypairs(fn)

    async def update_keypair(
        self,
        access_key: str,
        *,
        resource_policy: str | None = None,
        is_active: bool | None = None,
        is_admin: bool | None = None,
    ) -> bool:
        """Change a keypair's resource_policy / is_active / is_admin (None: left as it is); False when there is
        no such keypair; UnknownPolicy when the policy does not exist."""
        cols: dict[str, Any] = {}
        if resource_policy is not None:
            cols["resource_policy"] = resource_policy
        if is_active is not None:
            cols["is_active"] = int(is_active)
        if is_admin is not None:
            cols["is_admin"] = int(is_admin)

        def fn(conn: sqlite3.Connection) -> tuple[bool, dict[str, Keypair]]:
            if resource_policy is not None:
                _check_policy(conn, resource_policy)
            if not cols:
                found = conn.execute("SELECT 1 FROM keypairs WHERE access_key=?", (access_key,)).fetchone()
                return found is not None, _read_keypairs(conn, True)
            sets = ", ".join(f"{c}=?" for c in cols)
            found = conn.execute(f"UPDATE keypairs SET {sets} WHERE access_key=?", (*cols.values(), access_key))
            return found.rowcount > 0, _read_keypairs(conn, True)

        return bool(await self._write_keypairs(fn))

    async def delete_keypair(self, access_key: str) -> bool:
        """Remove a keypair and its dotfiles; False when there is no such keypair."""

        def fn(conn: sqlite3.Connection) -> tuple[bool, dict[str, Keypair]]:
            self.db.dotfile_owners = None
            conn.execute("DELETE FROM dotfiles WHERE access_key=?", (access_key,))
            gone = conn.execute("DELETE FROM keypairs WHERE access_key=?", (access_key,)).rowcount > 0
            return gone, _read_keypairs(conn, True)

        return bool(await self._write_keypairs(fn))

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

    async def policies(self) -> dict[str, Policy]:
        """Name -> resource policy, by name."""

        def fn(conn: sqlite3.Connection) -> dict[str, Policy]:
            rows = conn.execute(f"SELECT {POLICY_COLUMNS} FROM resource_policies ORDER BY name").fetchall()
            return {r[0]: _policy(r) for r in rows}

        return await self.db.run(fn)

    async def policy(self, name: str) -> Policy | None:
        """One resource policy (None: no such policy), from memory once read: every create asks it. What is
        kept is dropped whenever keypairs or policies change (`_limits_changed`: this store's writes, and
        another manager's, told through the database)."""
        if name in self._policies:
            return self._policies[name]
        version = self._queue_limits_version
        sql = f"SELECT {POLICY_COLUMNS} FROM resource_policies WHERE name=?"
        row = await self.db.run(lambda conn: conn.execute(sql, (name,)).fetchone())
        policy = _policy(row) if row is not None else None
        if version == self._queue_limits_version:  # no change meanwhile: what was read is still true
            kept = self._policies if len(self._policies) < 1024 else {}
            self._policies = {**kept, name: policy}  # (replaced, not changed: the class's empty one stays empty)
        return policy

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
            sql = (
                "SELECT COUNT(*) FROM (SELECT 1 FROM sessions WHERE access_key = ? AND status = 'PENDING' LIMIT ?) "
                "AS queued"
            )
            return int(conn.execute(sql, (access_key, limit)).fetchone()[0])

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
        self._policies = {}
        self._queue_limits_version += 1

    async def save_policy(self, name: str, fields: PolicyFields, *, create: bool, now: datetime) -> bool:
        """Create a policy (created `now`; False if the name is taken) or update one (False if there is none)."""
        self._limits_changed()
        at = stamp(now)

        def fn(conn: sqlite3.Connection) -> bool:
            values = {k: json.dumps(v) if k == "total_resource_slots" else v for k, v in changed_fields(fields).items()}
            exists = conn.execute("SELECT 1 FROM resource_policies WHERE name=?", (name,)).fetchone() is not None
            if create:
                if exists:
                    return False
                cols = ["name", "created_at", *values]
                conn.execute(
                    f"INSERT INTO resource_policies({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                    (name, at, *values.values()),
                )
                return True
            if not exists:
                return False
            if values:
                sets = ", ".join(f"{c}=?" for c in values)
                conn.execute(f"UPDATE resource_policies SET {sets} WHERE name=?", (*values.values(), name))
            return True

        return await self.db.transaction(fn)

    async def dotfiles(self, access_key: str) -> list[Dotfile]:
        """A keypair's dotfiles, by path."""

        def fn(conn: sqlite3.Connection) -> list[Dotfile]:
            sql = "SELECT path, data, permission FROM dotfiles WHERE access_key=? ORDER BY path"
            return [Dotfile(r[0], r[1], r[2]) for r in conn.execute(sql, (access_key,)).fetchall()]

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
