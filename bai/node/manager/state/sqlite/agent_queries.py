"""Agents: registration, status, heartbeats."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from typing import Any

from bai.node.manager.state.sqlite.db import Queries, decode_row, utcnow

PLACEMENT_COLUMNS = ("id", "scaling_group", "status", "slots")


class Agents(Queries):
    """The agents that registered, with their slots, status and last heartbeat.

    `agent_capacities()` answers from memory: the agents' ids, scaling groups, statuses and slots change only
    through this class's writes, each of which counts in `agents_version` once committed."""

    agents_version = 0  # counts the committed changes of an agent's scaling group, status or slots
    _capacities: tuple[int, list[dict[str, Any]]] | None = None  # (the version they are of, the rows)
    _capacities_read: tuple[int, asyncio.Future[list[dict[str, Any]]]] | None = None  # a read under way

    def _agents_changed(self) -> None:
        self.agents_version += 1
        self._capacities = None

    async def agent_capacities(self) -> tuple[int, list[dict[str, Any]]]:
        """(agents_version, every agent's id, scaling_group, status and slots (wire form), by id): what
        placement decisions need, kept in memory between changes. The rows are shared: do not change them."""
        cached = self._capacities
        if cached is not None and cached[0] == self.agents_version:
            return cached
        version = self.agents_version
        reading = self._capacities_read
        if reading is None or reading[0] != version:  # one read for every caller of this version

            def fn(conn: sqlite3.Connection) -> list[dict[str, Any]]:
                cols = ", ".join(PLACEMENT_COLUMNS)
                return [decode_row(r) for r in conn.execute(f"SELECT {cols} FROM agents ORDER BY id").fetchall()]

            reading = self._capacities_read = (version, self.db.run(fn))
        try:
            rows = await asyncio.shield(reading[1])
        finally:
            if self._capacities_read is reading and reading[1].done():
                self._capacities_read = None
        if self.agents_version == version:  # nothing changed while it was read
            self._capacities = (version, rows)
        return version, rows

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

        try:
            await self.db.transaction(fn)
        finally:  # (a failed write changed nothing; counting it anyway is only a re-read)
            self._agents_changed()

    async def set_agent_status(self, agent_id: str, status: str) -> None:
        try:
            await self.db.transaction(
                lambda conn: conn.execute(
                    "UPDATE agents SET status=?, last_seen=? WHERE id=?", (status, utcnow(), agent_id)
                )
            )
        finally:
            self._agents_changed()

    async def touch_agent(self, agent_id: str) -> None:
        def fn(conn: sqlite3.Connection) -> bool:
            """Whether the agent's status changed (to ALIVE)."""
            now = utcnow()
            if conn.execute("UPDATE agents SET last_seen=? WHERE id=? AND status='ALIVE'", (now, agent_id)).rowcount:
                return False
            return (
                conn.execute("UPDATE agents SET last_seen=?, status='ALIVE' WHERE id=?", (now, agent_id)).rowcount > 0
            )

        if await self.db.transaction(fn):
            self._agents_changed()

    async def agents(self) -> list[dict[str, Any]]:
        def fn(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            return [decode_row(r) for r in conn.execute("SELECT * FROM agents ORDER BY id").fetchall()]

        return await self.db.run(fn)
