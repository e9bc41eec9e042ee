"""Teams: domains, projects and their members, users, scaling groups and their associations, users' and projects'
resource policies (the records of `state/team_records.py`, each stored in the table of its name).

They are read whole into memory (`TeamDirectory`) once at the start and again by each write of them, in the write's
own transaction (with the active keypairs, which follow their users and domains), so that every request's rules
read no database. Another manager's writes reach this one through the database (PostgreSQL: `load_teams`).

A write's changes come as the record's fields by name, validated by the service above (`services/teams.py`); here
only that each is a column is checked.
"""

from __future__ import annotations

import json
import sqlite3
import typing
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any, TypeVar

import msgspec

from bai.node.manager.state.records import Keypair, stamp
from bai.node.manager.state.sqlite.db import Queries
from bai.node.manager.state.sqlite.keypair_queries import read_keypairs
from bai.node.manager.state.team_records import (
    DEFAULT_DOMAIN,
    DEFAULT_PROJECT_ID,
    Association,
    Domain,
    Project,
    ProjectPolicy,
    ScalingGroup,
    TeamDirectory,
    User,
    UserChanges,
    UserPolicy,
)

R = TypeVar("R", bound=msgspec.Struct)
T = TypeVar("T")

TABLES: dict[type[Any], str] = {
    Domain: "domains",
    Project: "projects",
    User: "users",
    ScalingGroup: "scaling_groups",
    UserPolicy: "user_resource_policies",
    ProjectPolicy: "project_resource_policies",
}
KEYS: dict[type[Any], str] = {Domain: "name", Project: "id", User: "uuid", ScalingGroup: "name"}
LINK_KINDS = ("domain", "project", "keypair")
TEAM_TABLE_NAMES = (*TABLES.values(), "project_members", "scaling_group_links")  # what the directory is read from


def _columns(cls: type[Any]) -> tuple[str, ...]:
    return tuple(cls.__struct_fields__)


def _json_columns(cls: type[Any]) -> frozenset[str]:
    hints = typing.get_type_hints(cls)
    return frozenset(n for n in cls.__struct_fields__ if typing.get_origin(hints[n]) in (dict, list))


_JSON = {cls: _json_columns(cls) for cls in TABLES}


def _stored(cls: type[Any], name: str, value: Any) -> Any:
    """A field's value as its column holds it (JSON text for mappings and lists, 0 / 1 for booleans)."""
    if name in _JSON[cls]:
        return json.dumps(value)
    if isinstance(value, bool):
        return int(value)
    return value


def _read(conn: sqlite3.Connection, cls: type[R]) -> list[R]:
    cols = _columns(cls)
    rows = conn.execute(f"SELECT {', '.join(cols)} FROM {TABLES[cls]}").fetchall()
    json_cols = _JSON[cls]
    out = []
    for row in rows:
        fields = {c: (json.loads(v) if c in json_cols else v) for c, v in zip(cols, row, strict=True)}
        out.append(msgspec.convert(fields, cls, strict=False))
    return out


def _insert(conn: sqlite3.Connection, record: msgspec.Struct, **more: Any) -> bool:
    """Insert a record (and columns beyond its fields); False when its key (or a unique column) is taken."""
    cls = type(record)
    values = {n: _stored(cls, n, getattr(record, n)) for n in _columns(cls)} | more
    # (ON CONFLICT, not a caught IntegrityError: PostgreSQL aborts the whole transaction on one)
    cur = conn.execute(
        f"INSERT INTO {TABLES[cls]}({', '.join(values)}) VALUES ({', '.join('?' * len(values))}) "
        "ON CONFLICT DO NOTHING",
        tuple(values.values()),
    )
    return bool(cur.rowcount > 0)


# the unique values of a record besides its key: a change to one another record has is refused (checked first:
# PostgreSQL aborts the whole transaction on a conflict)
_UNIQUE: dict[type[Any], tuple[tuple[str, ...], ...]] = {
    Project: (("domain_name", "name"),),
    User: (("email",), ("username",)),
}


def _unique_taken(conn: sqlite3.Connection, cls: type[Any], key: str, changes: dict[str, Any]) -> bool:
    table, key_col = TABLES[cls], KEYS.get(cls, "name")
    for columns in _UNIQUE.get(cls, ()):
        if not set(columns) & set(changes):
            continue
        row = conn.execute(f"SELECT {', '.join(columns)} FROM {table} WHERE {key_col}=?", (key,)).fetchone()
        if row is None:
            return False
        values = [changes.get(c, row[i]) for i, c in enumerate(columns)]
        where = " AND ".join(f"{c}=?" for c in columns)
        if conn.execute(f"SELECT 1 FROM {table} WHERE {where} AND {key_col}<>?", (*values, key)).fetchone():
            return True
    return False


def _update(
    conn: sqlite3.Connection, cls: type[Any], key: str, changes: dict[str, Any], now: str | None
) -> bool | None:
    """Set fields of the record of that key (and modified_at, for records that have it); False: no such record; None:
    a unique value (a project's name in its domain, a user's email or username) is another's. Raises ValueError for a
    name that is not a field."""
    key_col = KEYS.get(cls, "name")
    unknown = set(changes) - set(_columns(cls)) - {"password"} | ({key_col} & set(changes))
    if unknown:
        raise ValueError(f"not fields of {cls.__name__} that a write changes: {sorted(unknown)}")
    if _unique_taken(conn, cls, key, changes):
        return None
    sets = {c: _stored(cls, c, v) if c != "password" else v for c, v in changes.items()}
    if now is not None and "modified_at" in _columns(cls):
        sets["modified_at"] = now
    if not sets:
        return conn.execute(f"SELECT 1 FROM {TABLES[cls]} WHERE {key_col}=?", (key,)).fetchone() is not None
    assignments = ", ".join(f"{c}=?" for c in sets)
    cur = conn.execute(f"UPDATE {TABLES[cls]} SET {assignments} WHERE {key_col}=?", (*sets.values(), key))
    return cur.rowcount > 0


def read_directory(conn: sqlite3.Connection) -> TeamDirectory:
    """Every team record, as one directory."""
    members: dict[str, set[str]] = {}
    for project_id, user in conn.execute("SELECT project_id, user_uuid FROM project_members").fetchall():
        members.setdefault(project_id, set()).add(user)
    links: dict[str, dict[str, set[str]]] = {}
    for group, kind, target in conn.execute("SELECT scaling_group, kind, target FROM scaling_group_links").fetchall():
        links.setdefault(group, {k: set() for k in LINK_KINDS})[kind].add(target)
    keypair_users = {
        r[0]: r[1] for r in conn.execute("SELECT access_key, user_uuid FROM keypairs WHERE user_uuid <> ''").fetchall()
    }
    return TeamDirectory(
        domains={d.name: d for d in _read(conn, Domain)},
        projects={p.id: p for p in _read(conn, Project)},
        users={u.uuid: u for u in _read(conn, User)},
        members={p: frozenset(users) for p, users in members.items()},
        keypair_users=keypair_users,
        scaling_groups={g.name: g for g in _read(conn, ScalingGroup)},
        associations={
            g: Association(frozenset(k["domain"]), frozenset(k["project"]), frozenset(k["keypair"]))
            for g, k in links.items()
        },
        user_policies={p.name: p for p in _read(conn, UserPolicy)},
        project_policies={p.name: p for p in _read(conn, ProjectPolicy)},
    )


def _live_sessions(conn: sqlite3.Connection, column: str, value: str) -> int:
    from bai.node.manager.state.sqlite.migrations import LIVE

    sql = f"SELECT COUNT(*) FROM sessions WHERE {column}=? AND status IN ({LIVE})"
    return int(conn.execute(sql, (value,)).fetchone()[0])


class Teams(Queries):
    """Domains, projects, users, scaling groups and policies of users and projects, kept in memory."""

    _teams: TeamDirectory = TeamDirectory()
    _active: dict[str, Keypair] = {}  # (Keypairs': the active keypairs, which follow their users)

    def teams(self) -> TeamDirectory:
        """Every team record as last read (this manager's writes read it again at once)."""
        return self._teams

    async def load_teams(self) -> None:
        """Read the directory and the active keypairs into memory (at the start, and when another manager wrote)."""
        self._teams, self._active = await self.db.run(lambda conn: (read_directory(conn), read_keypairs(conn, True)))

    async def _write_teams(self, fn: Callable[[sqlite3.Connection, str], T], now: datetime) -> T:
        """A transaction that changes teams: `fn(conn, now)`'s answer; the directory and the active keypairs in
        memory follow, in the order the writes committed."""
        at = stamp(now)

        def tx(conn: sqlite3.Connection) -> tuple[T, TeamDirectory, dict[str, Keypair]]:
            return fn(conn, at), read_directory(conn), read_keypairs(conn, True)

        answer, self._teams, self._active = await self.db.transaction(tx)
        return answer

    # -- records by kind ---------------------------------------------------------------------------------------

    async def create_team_record(self, record: msgspec.Struct, now: datetime) -> bool:
        """Store a new domain, project, scaling group or policy; False when one of that key (or a project of that
        name in its domain) exists."""
        return await self._write_teams(lambda conn, at: _insert(conn, record), now)

    async def update_team_record(self, cls: type[Any], key: str, changes: dict[str, Any], now: datetime) -> bool | None:
        """Change fields of a record; False: no such record; None: a unique value (a project's name in its domain, a
        user's email or username) is taken."""

        return await self._write_teams(lambda conn, at: _update(conn, cls, key, changes, at), now)

    async def delete_team_record(self, cls: type[Any], key: str, now: datetime) -> str | None:
        """Remove a record nothing refers to; None when done, else why not (what still refers to it)."""

        def fn(conn: sqlite3.Connection, at: str) -> str | None:
            table, key_col = TABLES[cls], KEYS.get(cls, "name")
            if conn.execute(f"SELECT 1 FROM {table} WHERE {key_col}=?", (key,)).fetchone() is None:
                return "not found"
            why = _still_used(conn, cls, key)
            if why is not None:
                return why
            conn.execute(f"DELETE FROM {table} WHERE {key_col}=?", (key,))
            if cls is Project:
                conn.execute("DELETE FROM project_members WHERE project_id=?", (key,))
                conn.execute("DELETE FROM scaling_group_links WHERE kind='project' AND target=?", (key,))
            elif cls is Domain:
                conn.execute("DELETE FROM scaling_group_links WHERE kind='domain' AND target=?", (key,))
            elif cls is ScalingGroup:
                conn.execute("DELETE FROM scaling_group_links WHERE scaling_group=?", (key,))
            return None

        return await self._write_teams(fn, now)

    # -- users ---------------------------------------------------------------------------------------------------

    async def create_user(self, user: User, password_hash: str | None, projects: Iterable[str], now: datetime) -> bool:
        """Store a new user, member of these projects; False when its email or username is taken."""
        joined = list(projects)

        def fn(conn: sqlite3.Connection, at: str) -> bool:
            if not _insert(conn, user, password=password_hash):
                return False
            conn.executemany(
                "INSERT INTO project_members(project_id, user_uuid) VALUES (?, ?) ON CONFLICT DO NOTHING",
                [(p, user.uuid) for p in joined],
            )
            return True

        return await self._write_teams(fn, now)

    async def update_user(self, uuid: str, changes: UserChanges, now: datetime) -> bool | None:
        """Change a user (its memberships replaced when `projects` is given); False: no such user; None: its new
        email or username is another's."""
        fields = {f: v for f in changes.__struct_fields__ if (v := getattr(changes, f)) is not msgspec.UNSET}
        projects = fields.pop("projects", None)

        def fn(conn: sqlite3.Connection, at: str) -> bool | None:
            done = _update(conn, User, uuid, fields, at)
            if not done:
                return done
            if projects is not None:
                conn.execute("DELETE FROM project_members WHERE user_uuid=?", (uuid,))
                conn.executemany(
                    "INSERT INTO project_members(project_id, user_uuid) VALUES (?, ?)", [(p, uuid) for p in projects]
                )
            return True

        return await self._write_teams(fn, now)

    async def purge_user(self, uuid: str, now: datetime) -> str | None:
        """Remove a user, its keypairs (and their dotfiles) and memberships; None when done, else why not (live
        sessions, folders it owns)."""

        def fn(conn: sqlite3.Connection, at: str) -> str | None:
            if conn.execute("SELECT 1 FROM users WHERE uuid=?", (uuid,)).fetchone() is None:
                return "not found"
            keys = [r[0] for r in conn.execute("SELECT access_key FROM keypairs WHERE user_uuid=?", (uuid,)).fetchall()]
            for key in keys:
                if (live := _live_sessions(conn, "access_key", key)) > 0:
                    return f"its keypair {key} has {live} live session(s): end them first"
                if conn.execute("SELECT 1 FROM vfolders WHERE owner=? AND status='ready'", (key,)).fetchone():
                    return f"its keypair {key} owns folders: delete them or give them to another user first"
            self.db.dotfile_owners = None
            for key in keys:
                conn.execute("DELETE FROM dotfiles WHERE access_key=?", (key,))
                conn.execute("DELETE FROM vfolder_shares WHERE access_key=?", (key,))
                conn.execute("DELETE FROM scaling_group_links WHERE kind='keypair' AND target=?", (key,))
            conn.execute("DELETE FROM keypairs WHERE user_uuid=?", (uuid,))
            conn.execute("DELETE FROM project_members WHERE user_uuid=?", (uuid,))
            conn.execute("DELETE FROM users WHERE uuid=?", (uuid,))
            return None

        return await self._write_teams(fn, now)

    async def password_hash(self, uuid: str) -> str | None:
        """A user's password hash (None: no such user, or no password)."""
        sql = "SELECT password FROM users WHERE uuid=?"
        row = await self.db.run(lambda conn: conn.execute(sql, (uuid,)).fetchone())
        return None if row is None or row[0] is None else str(row[0])

    async def set_members(self, project_id: str, add: Iterable[str], remove: Iterable[str], now: datetime) -> bool:
        """Add users to a project and remove others (uuids); False: no such project."""
        added, removed = list(add), list(remove)

        def fn(conn: sqlite3.Connection, at: str) -> bool:
            if conn.execute("SELECT 1 FROM projects WHERE id=?", (project_id,)).fetchone() is None:
                return False
            conn.executemany(
                "INSERT INTO project_members(project_id, user_uuid) VALUES (?, ?) ON CONFLICT DO NOTHING",
                [(project_id, u) for u in added],
            )
            conn.executemany(
                "DELETE FROM project_members WHERE project_id=? AND user_uuid=?", [(project_id, u) for u in removed]
            )
            conn.execute("UPDATE projects SET modified_at=? WHERE id=?", (at, project_id))
            return True

        return await self._write_teams(fn, now)

    async def link_scaling_group(self, group: str, kind: str, target: str, linked: bool, now: datetime) -> bool:
        """Associate a scaling group with a domain, project or keypair (or no longer); False when it was (or was
        not) already."""
        if kind not in LINK_KINDS:
            raise ValueError(f"a scaling group is associated with a domain, project or keypair, not {kind!r}")

        def fn(conn: sqlite3.Connection, at: str) -> bool:
            if linked:
                cur = conn.execute(
                    "INSERT INTO scaling_group_links(scaling_group, kind, target) VALUES (?, ?, ?) "
                    "ON CONFLICT DO NOTHING",
                    (group, kind, target),
                )
            else:
                cur = conn.execute(
                    "DELETE FROM scaling_group_links WHERE scaling_group=? AND kind=? AND target=?",
                    (group, kind, target),
                )
            return cur.rowcount > 0

        return await self._write_teams(fn, now)

    async def project_usage(self, statuses: Iterable[str]) -> dict[str, tuple[int, list[dict[str, str]]]]:
        """Per project: how many of its sessions are in these statuses, and their kernels' occupied slots (wire
        form, one mapping per kernel: summed by the caller with exact arithmetic)."""
        values = [getattr(s, "value", s) for s in statuses]
        marks = ",".join("?" * len(values))

        def fn(conn: sqlite3.Connection) -> dict[str, tuple[int, list[dict[str, str]]]]:
            out: dict[str, tuple[int, list[dict[str, str]]]] = {}
            for pid, n in conn.execute(
                f"SELECT project_id, COUNT(*) FROM sessions WHERE status IN ({marks}) GROUP BY project_id", values
            ).fetchall():
                out[pid] = (n, [])
            for pid, slots in conn.execute(
                f"SELECT s.project_id, k.occupied_slots FROM sessions s JOIN kernels k ON k.session_id = s.id "
                f"WHERE s.status IN ({marks})",
                values,
            ).fetchall():
                out.setdefault(pid, (0, []))[1].append(json.loads(slots) if isinstance(slots, str) else slots)
            return out

        return await self.db.run(fn)


def _still_used(conn: sqlite3.Connection, cls: type[Any], key: str) -> str | None:
    """What refers to a record (so that it cannot be removed), or None."""
    if cls is Domain:
        if key == DEFAULT_DOMAIN:
            return "the default domain stays"
        users = conn.execute("SELECT COUNT(*) FROM users WHERE domain_name=?", (key,)).fetchone()[0]
        projects = conn.execute("SELECT COUNT(*) FROM projects WHERE domain_name=?", (key,)).fetchone()[0]
        if users or projects:
            return f"domain {key} still has {users} user(s) and {projects} project(s)"
    elif cls is Project:
        if key == DEFAULT_PROJECT_ID:
            return "the default project stays"
        if (live := _live_sessions(conn, "project_id", key)) > 0:
            return f"the project has {live} live session(s): end them first"
        if conn.execute("SELECT 1 FROM vfolders WHERE project_id=? AND status='ready'", (key,)).fetchone():
            return "the project has folders: delete them first"
    elif cls in (UserPolicy, ProjectPolicy):
        if key == "default":
            return "the default policy stays"
        table = "users" if cls is UserPolicy else "projects"
        used = conn.execute(f"SELECT COUNT(*) FROM {table} WHERE resource_policy=?", (key,)).fetchone()[0]
        if used:
            return f"the policy is used by {used} {table[:-1]}(s)"
    return None
