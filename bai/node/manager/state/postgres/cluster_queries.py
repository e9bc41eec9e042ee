"""The managers of one PostgreSQL database: who they are, and the lease that makes one of them the leader.

Times are the database server's (clock_timestamp()), so that managers whose clocks disagree agree on who holds
the lease. The lease is one row: a manager holds it while it renews it before it expires; once it has expired
(its holder died or lost the database), the next manager to renew takes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bai.node.manager.state.postgres.db import WRITE_LOCK
from bai.node.manager.state.sqlite.db import Queries
from bai.node.manager.state.sqlite.team_queries import TEAM_TABLE_NAMES

CLUSTER_TABLES = (
    'CREATE TABLE IF NOT EXISTS bai_managers (id TEXT COLLATE "C" PRIMARY KEY, host TEXT NOT NULL, '
    "api TEXT NOT NULL, link TEXT NOT NULL, pid BIGINT NOT NULL, version TEXT NOT NULL, "
    "started_at TIMESTAMPTZ NOT NULL, last_seen TIMESTAMPTZ NOT NULL)",
    'CREATE TABLE IF NOT EXISTS bai_lease (name TEXT COLLATE "C" PRIMARY KEY, holder TEXT NOT NULL, '
    "since TIMESTAMPTZ NOT NULL, expires_at TIMESTAMPTZ NOT NULL)",
    # the tables each manager keeps a copy of in memory: a write tells every manager (services/cluster_events.py)
    "CREATE OR REPLACE FUNCTION bai_table_changed() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
    "PERFORM pg_notify('bai_events', json_build_object('m', '', 'h', 't', 't', TG_TABLE_NAME)::text); "
    "RETURN NULL; END $$",
    *(
        f"CREATE OR REPLACE TRIGGER bai_{table}_changed AFTER INSERT OR UPDATE OR DELETE ON {table} "
        "FOR EACH STATEMENT EXECUTE FUNCTION bai_table_changed()"
        for table in ("keypairs", "resource_policies", "dotfiles", "image_aliases", *TEAM_TABLE_NAMES)
    ),
)
LEASE = "leader"


@dataclass(frozen=True)
class ManagerInfo:
    """A manager as it announces itself."""

    id: str
    host: str
    api: str  # its API endpoint (http://HOST:PORT)
    link: str  # where agents dial it (tcp://HOST:PORT)
    pid: int
    version: str


@dataclass(frozen=True)
class ManagerSeen:
    """A manager as the database knows it: when it started, when it last renewed, whether it leads."""

    info: ManagerInfo
    started_at: str
    last_seen: str
    seen_ago: float  # seconds since last_seen, by the database's clock
    leader: bool
    leader_since: str | None


@dataclass(frozen=True)
class Lease:
    """Who holds the leader lease after a renewal (`mine`: this manager)."""

    holder: str
    since: str
    mine: bool


def _iso(value: Any) -> str:
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


# (parameters: the manager, the lease's name, its length in seconds) the lease as it is after the statement: taken
# or renewed by this manager, else as its holder left it. `locked` comes first: the INSERT reads its row from it.
_RENEW = (
    f"WITH locked AS (SELECT pg_advisory_xact_lock({WRITE_LOCK}) AS got), "
    "seen AS (UPDATE bai_managers SET last_seen=clock_timestamp() WHERE id=$1 AND EXISTS (SELECT 1 FROM locked) "
    "RETURNING 1), "
    "mine AS (INSERT INTO bai_lease SELECT $2, $1, clock_timestamp(), clock_timestamp() + make_interval(secs => $3) "
    "FROM locked ON CONFLICT(name) DO UPDATE SET holder=excluded.holder, expires_at=excluded.expires_at, "
    "since=CASE WHEN bai_lease.holder=excluded.holder THEN bai_lease.since ELSE excluded.since END "
    "WHERE bai_lease.holder=excluded.holder OR bai_lease.expires_at < clock_timestamp() RETURNING holder, since) "
    "SELECT holder, since, (SELECT COUNT(*) FROM seen) FROM mine UNION ALL "
    "SELECT holder, since, 0 FROM bai_lease WHERE name=$2 AND NOT EXISTS (SELECT 1 FROM mine)"
)


class Cluster(Queries):
    """The managers' table and the leader lease."""

    async def announce_manager(self, me: ManagerInfo) -> None:
        def fn(conn: Any) -> None:
            # an earlier run of this manager (the same API address) and managers gone for a day are forgotten
            conn.execute(
                "DELETE FROM bai_managers WHERE api=? OR last_seen < clock_timestamp() - interval '1 day'", (me.api,)
            )
            conn.execute(
                "INSERT INTO bai_managers VALUES (?, ?, ?, ?, ?, ?, clock_timestamp(), clock_timestamp())",
                (me.id, me.host, me.api, me.link, me.pid, me.version),
            )

        await self.db.transaction(fn)

    async def renew_lease(self, manager_id: str, ttl: float) -> Lease:
        """Renew this manager's lease, or take it when it has expired; who holds it now. One statement (its own
        transaction): the write lock every transaction takes first (so that the lease cannot change while a
        leader's transaction is under way, see PgDatabase.fence), then this manager seen, then the lease,
        held for one round trip only (the leader's writes wait for it)."""

        def fn(conn: Any) -> Lease:
            row = conn.execute(_RENEW, (manager_id, LEASE, float(ttl))).fetchone()
            if row is None:  # (another took it first, after this statement's snapshot: read it as it is now)
                row = conn.execute("SELECT holder, since FROM bai_lease WHERE name=?", (LEASE,)).fetchone()
            return Lease(row[0], _iso(row[1]), row[0] == manager_id)

        return await self.db.run(fn)

    async def release_lease(self, manager_id: str) -> None:
        """On a clean stop: let the lease go at once (the next manager takes it at its next renewal)."""

        def fn(conn: Any) -> None:
            conn.execute("DELETE FROM bai_lease WHERE name=? AND holder=?", (LEASE, manager_id))
            conn.execute("DELETE FROM bai_managers WHERE id=?", (manager_id,))

        await self.db.transaction(fn)

    async def managers(self) -> list[ManagerSeen]:
        def fn(conn: Any) -> list[ManagerSeen]:
            rows = conn.execute(
                "SELECT m.id, m.host, m.api, m.link, m.pid, m.version, m.started_at, m.last_seen, "
                "EXTRACT(EPOCH FROM clock_timestamp() - m.last_seen), "
                "l.holder IS NOT NULL AND l.expires_at >= clock_timestamp(), l.since "
                "FROM bai_managers m LEFT JOIN bai_lease l ON l.name=? AND l.holder=m.id ORDER BY m.started_at",
                (LEASE,),
            ).fetchall()
            return [
                ManagerSeen(
                    ManagerInfo(r[0], r[1], r[2], r[3], int(r[4]), r[5]),
                    _iso(r[6]),
                    _iso(r[7]),
                    float(r[8]),
                    bool(r[9]),
                    _iso(r[10]) if r[9] else None,
                )
                for r in rows
            ]

        return await self.db.run(fn)
