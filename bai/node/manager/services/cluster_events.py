"""What the managers of one database tell each other, so that a change one of them makes reaches the others'
event streams, dashboards, waiting clients and caches within a second: session events, dashboard changes,
new log lines, scheduling wake-ups, and the tables whose copies they keep in memory.

Out: every event published on this manager's hubs is sent (a short JSON payload naming what changed, never the
record itself); in: the record is read from the shared database and published here, to this manager's own
subscribers only. Carried by PostgreSQL's NOTIFY (state/postgres/notify.py); SQLite (one manager) has none.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from bai.node.manager.services.hubs import Hubs
from bai.node.manager.services.wakeup import Wakeup
from bai.node.manager.state.records import Session

log = logging.getLogger("bai.manager")
MAX_IDS = 200  # ids named in one dashboard change (more: the change names none, and readers read afresh)


class ClusterEvents:
    """Relays this manager's hubs to the other managers, and theirs to this one's."""

    def __init__(
        self,
        manager_id: str,
        hubs: Hubs,
        wake: Wakeup,
        get_session: Callable[[str], Awaitable[Session | None]],
        send: Callable[[str], None],
        caches: dict[str, Callable[[], Awaitable[None]]],
    ) -> None:
        self.manager_id = manager_id
        self.hubs = hubs
        self.wake = wake
        self.get_session = get_session
        self.send = send
        self.caches = caches  # table name -> what reloads this manager's copy of it
        self.received_count = 0
        self._tasks: set[asyncio.Task[Any]] = set()

    def attach(self) -> None:
        """Relay from now on what this manager's hubs publish."""
        self.hubs.events.relays.append(lambda name, row: self._out({"h": "e", "n": name, "id": row.id}))
        self.hubs.changes.relays.append(self._change_out)
        self.hubs.logs.relays.append(lambda kernel_id: self._out({"h": "l", "id": kernel_id}))
        self.wake.relays.append(lambda: self._out({"h": "w"}))

    def table_changed(self, table: str) -> None:
        """A table whose copies the managers keep in memory was written here: the others reload theirs."""
        self._out({"h": "t", "t": table})

    def _change_out(self, name: str, what: dict[str, Any]) -> None:
        ids = what.get("ids") if isinstance(what, dict) else None
        if isinstance(ids, list) and len(ids) > MAX_IDS:
            what = {**what, "ids": None}
        self._out({"h": "c", "n": name, "w": what})

    def _out(self, message: dict[str, Any]) -> None:
        try:
            self.send(json.dumps({"m": self.manager_id, **message}, separators=(",", ":"), default=str))
        except (TypeError, ValueError):  # (nothing of a change is worth failing its publication)
            log.debug("a change could not be told to the other managers: %r", message)

    def received(self, payloads: list[str]) -> None:
        """Notifications from the database (the others', and this manager's own, which are skipped)."""
        for payload in payloads:
            try:
                message = json.loads(payload)
            except ValueError:
                continue
            if not isinstance(message, dict) or message.get("m") == self.manager_id:
                continue
            self.received_count += 1
            kind = message.get("h")
            if kind == "c" and isinstance(message.get("w"), dict):
                self.hubs.changes.publish_here(str(message.get("n")), message["w"])
            elif kind == "l" and isinstance(message.get("id"), str):
                self.hubs.logs.notify_here(message["id"])
            elif kind == "w":
                self.wake.here()
            elif kind == "e" and isinstance(message.get("id"), str) and self.hubs.events.watched:
                # (read only while somebody here watches the events: a follower is told of every move the leader
                # makes, and each read waits in its database's queue with the creates it serves)
                self._spawn(self._session_event(str(message.get("n")), message["id"]))
            elif kind == "t" and message.get("t") in self.caches:
                self._spawn(self.caches[message["t"]]())

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("a change another manager told of could not be read: %s", task.exception())

    async def _session_event(self, name: str, session_id: str) -> None:
        row = await self.get_session(session_id)
        if row is not None:
            self.hubs.events.publish_here(name, row)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
