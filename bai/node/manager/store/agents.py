"""Agents: registration, status, heartbeats."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from bai.node.manager.store.db import Queries, decode_row, utcnow


class Agents(Queries):
    """The agents that registered, with their slots, status and last heartbeat."""

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

        await self.db.transaction(fn)

    async def set_agent_status(self, agent_id: str, status: str) -> None:
        await self.db.transaction(
            lambda conn: conn.execute(
                "UPDATE agents SET status=?, last_seen=? WHERE id=?", (status, utcnow(), agent_id)
            )
        )

    async def touch_agent(self, agent_id: str) -> None:
        await self.db.transaction(
            lambda conn: conn.execute("UPDATE agents SET last_seen=?, status='ALIVE' WHERE id=?", (utcnow(), agent_id))
        )

    async def agents(self) -> list[dict[str, Any]]:
        def fn(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            return [decode_row(r) for r in conn.execute("SELECT * FROM agents ORDER BY id").fetchall()]

        return await self.db.run(fn)
