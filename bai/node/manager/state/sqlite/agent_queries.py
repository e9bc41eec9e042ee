"""Agents: registration, status, heartbeats."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from datetime import datetime

from bai.node.manager.state.records import Agent, AgentCapacity, NewAgent, stamp
from bai.node.manager.state.sqlite.db import Queries, load_json

AGENT_COLUMNS = "id, hostname, backend, version, scaling_group, status, slots, first_contact, last_seen"
PLACEMENT_COLUMNS = "id, scaling_group, status, slots"


def _agent(row: sqlite3.Row) -> Agent:
    return Agent(row[0], row[1], row[2], row[3], row[4], row[5], load_json(row[6]), row[7], row[8])


class Agents(Queries):
    """The agents that registered, with their slots, status and last heartbeat.

    `agent_capacities()` answers from memory: the agents' ids, scaling groups, statuses and slots change only
    through this class's writes, each of which counts in `agents_version` once committed."""

    agents_version = 0  # counts the committed changes of an agent's scaling group, status or slots
    _capacities: tuple[int, list[AgentCapacity]] | None = None  # (the version they are of, the records)
    _capacities_read: tuple[int, asyncio.Future[list[AgentCapacity]]] | None = None  # a read under way

    def _agents_changed(self) -> None:
        self.agents_version += 1
        self._capacities = None

    async def agent_capacities(self) -> tuple[int, list[AgentCapacity]]:
        """(agents_version, every agent's id, scaling_group, status and slots (wire form), by id): what
        placement decisions need, kept in memory between changes (the version says which: equal versions,
        equal capacities). The list is shared: do not change it."""
        cached = self._capacities
        if cached is not None and cached[0] == self.agents_version:
            return cached
        version = self.agents_version
        reading = self._capacities_read
        if reading is None or reading[0] != version:  # one read for every caller of this version

            def fn(conn: sqlite3.Connection) -> list[AgentCapacity]:
                rows = conn.execute(f"SELECT {PLACEMENT_COLUMNS} FROM agents ORDER BY id").fetchall()
                return [AgentCapacity(r[0], r[1], r[2], load_json(r[3])) for r in rows]

            reading = self._capacities_read = (version, self.db.run(fn))
        try:
            rows = await asyncio.shield(reading[1])
        finally:
            if self._capacities_read is reading and reading[1].done():
                self._capacities_read = None
        if self.agents_version == version:  # nothing changed while it was read
            self._capacities = (version, rows)
        return version, rows

    def capacities_version(self) -> int:
        """The version of the agents' capacities now (it changes with every write of an agent)."""
        return self.agents_version

    async def upsert_agent(self, agent: NewAgent, now: datetime) -> None:
        """Store an agent's registration (ALIVE, last seen `now`; first contact `now` for a new one)."""
        at = stamp(now)

        def fn(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO agents(id, hostname, backend, version, scaling_group, status, slots, "
                "first_contact, last_seen) VALUES (?, ?, ?, ?, ?, 'ALIVE', ?, ?, ?) "
                "ON CONFLICT(id) DO UPDATE SET hostname=excluded.hostname, backend=excluded.backend, "
                "version=excluded.version, scaling_group=excluded.scaling_group, status='ALIVE', "
                "slots=excluded.slots, last_seen=excluded.last_seen",
                (agent.id, agent.hostname, agent.backend, agent.version, agent.scaling_group,
                 json.dumps(agent.slots), at, at),
            )  # fmt: skip

        try:
            await self.db.transaction(fn)
        finally:  # (a failed write changed nothing; counting it anyway is only a re-read)
            self._agents_changed()

    async def set_agent_status(self, agent_id: str, status: str, now: datetime) -> None:
        at = stamp(now)

        def fn(conn: sqlite3.Connection) -> None:
            conn.execute("UPDATE agents SET status=?, last_seen=? WHERE id=?", (status, at, agent_id))

        try:
            await self.db.transaction(fn)
        finally:
            self._agents_changed()

    async def touch_agent(self, agent_id: str, now: datetime) -> None:
        """A heartbeat: last seen `now`, and ALIVE again if it was not."""
        at = stamp(now)

        def fn(conn: sqlite3.Connection) -> bool:
            """Whether the agent's status changed (to ALIVE)."""
            if conn.execute("UPDATE agents SET last_seen=? WHERE id=? AND status='ALIVE'", (at, agent_id)).rowcount:
                return False
            return conn.execute("UPDATE agents SET last_seen=?, status='ALIVE' WHERE id=?", (at, agent_id)).rowcount > 0

        if await self.db.transaction(fn):
            self._agents_changed()

    async def agents(self) -> list[Agent]:
        def fn(conn: sqlite3.Connection) -> list[Agent]:
            return [_agent(r) for r in conn.execute(f"SELECT {AGENT_COLUMNS} FROM agents ORDER BY id").fetchall()]

        return await self.db.run(fn)
