"""Fair-share usage (`fair_share_usage`: each keypair's and project's decayed usage, as of a time) and who waits
(`pending_by_owner`, what fair share compares): the same queries for SQLite and PostgreSQL."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping

from bai.node.manager.state.sqlite.db import Queries


class FairShareQueries(Queries):
    async def fair_share_usage(self) -> dict[str, tuple[float, str]]:
        """Every key's usage and the time it is as of (ISO 8601)."""

        def fn(conn: sqlite3.Connection) -> dict[str, tuple[float, str]]:
            rows = conn.execute("SELECT key, usage, as_of FROM fair_share_usage").fetchall()
            return {str(r[0]): (float(r[1]), str(r[2])) for r in rows}

        return await self.db.run(fn)

    async def save_fair_share_usage(self, rows: Mapping[str, tuple[float, str]]) -> None:
        """Store these keys' usage (as of their times), in one transaction."""

        def fn(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "INSERT INTO fair_share_usage(key, usage, as_of) VALUES (?, ?, ?) "
                "ON CONFLICT (key) DO UPDATE SET usage=excluded.usage, as_of=excluded.as_of",
                [(k, u, t) for k, (u, t) in rows.items()],
            )

        await self.db.transaction(fn)

    async def pending_by_owner(self) -> list[tuple[str, str, int]]:
        """How many sessions wait, per (access key, project id): one counting read."""

        def fn(conn: sqlite3.Connection) -> list[tuple[str, str, int]]:
            rows = conn.execute(
                "SELECT access_key, project_id, COUNT(*) FROM sessions WHERE status='PENDING' "
                "GROUP BY access_key, project_id"
            ).fetchall()
            return [(str(r[0]), str(r[1]), int(r[2])) for r in rows]

        return await self.db.run(fn)
