"""Which manager of a database runs what must run once (scheduling rounds, timers, reconciling agents): the one
holding the leader lease, kept in the database (state/postgres/cluster_queries.py). Every manager renews its
claim each `renew` seconds; the holder keeps it, and once it stops renewing (it died, or lost the database)
the lease expires after `ttl` seconds and the next manager to renew takes it. A manager that cannot reach the
database steps down before its lease could have expired, so that two never lead at once.

With SQLite (one manager, no cluster state) this manager leads from the start, always.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from bai.common.background import cancel_and_wait
from bai.node.manager.state.postgres.cluster_queries import Lease, ManagerInfo, ManagerSeen

log = logging.getLogger("bai.manager")
RENEW = 1.0  # seconds between renewals
TTL = 5.0  # seconds a lease lasts without renewal


class ClusterState(Protocol):
    async def announce_manager(self, me: ManagerInfo) -> None: ...

    async def renew_lease(self, manager_id: str, ttl: float) -> Lease: ...

    async def release_lease(self, manager_id: str) -> None: ...

    async def managers(self) -> list[ManagerSeen]: ...


class Leadership:
    """This manager's part in the lease: it calls `lead()` when it takes the lead and `follow()` when it loses it."""

    def __init__(
        self,
        cluster: ClusterState | None,
        me: ManagerInfo,
        database: str,
        lead: Callable[[], Awaitable[None]],
        follow: Callable[[], Awaitable[None]],
        *,
        renew: float = RENEW,
        ttl: float = TTL,
        closing: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.cluster = cluster
        self._closing = closing  # (at the end of `stop`: the connection `cluster` has of its own)
        self.me = me
        self.database = database  # as shown (no password)
        self._lead = lead
        self._follow = follow
        self.renew = renew
        self.ttl = ttl
        self.leading = False
        self.leader: str | None = None  # who holds the lease, as last seen
        self.leader_since: str | None = None
        self.database_error: str | None = None  # why the last renewal failed (None: it did not)
        self._renewed = 0.0  # time.monotonic() of the last renewal that succeeded
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self.cluster is None:
            self.leading, self.leader = True, self.me.id
            await self._lead()
            return
        await self.cluster.announce_manager(self.me)
        await self._round()  # (leads at once when nobody else does)
        self._task = asyncio.create_task(self._loop(), name="leadership")

    def holds(self) -> bool:
        """Whether this manager may act as the leader now: it leads, and its last renewal is recent enough that
        its lease cannot have expired (a manager frozen past its lease, e.g. SIGSTOPped or starved, wakes with
        `leading` still set while another leads; it must not act before its next renewal tells it so)."""
        if not self.leading:
            return False
        return self.cluster is None or time.monotonic() - self._renewed < self.ttl - self.renew

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.renew)
            if self.leading and not self.holds():  # (it was frozen: another may lead now)
                log.warning("this manager (%s) did not renew its lease in time: it follows until it renews", self.me.id)
                self.leading = False
                self.leader = None  # (who leads is known again at the next renewal)
                await self._follow()
            try:
                await self._round()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 (the database is away: said, and tried again)
                log.warning("renewing the leader lease: %s", e)

    async def _round(self) -> None:
        assert self.cluster is not None
        try:
            async with asyncio.timeout(self.ttl / 2):  # (not wait_for: in 3.11 it may lose a cancellation)
                lease = await self.cluster.renew_lease(self.me.id, self.ttl)
        except Exception as e:  # noqa: BLE001 (the database cannot be reached, or too slowly)
            self.database_error = str(e) or type(e).__name__
            if self.leader == self.me.id and not self.holds():
                self.leader = None  # (its lease may have expired: it does not say it leads)
            if self.leading and time.monotonic() - self._renewed > self.ttl - 2 * self.renew:
                log.warning("stepping down as leader: the database %s does not answer (%s)", self.database, e)
                self.leading = False
                await self._follow()
            return
        self.database_error = None
        self._renewed = time.monotonic()
        self.leader, self.leader_since = lease.holder, lease.since
        if lease.mine and not self.leading:
            log.info("this manager (%s) leads the managers of %s", self.me.id, self.database)
            self.leading = True
            await self._lead()
        elif not lease.mine and self.leading:
            log.warning("manager %s took the lead: this one (%s) follows", lease.holder, self.me.id)
            self.leading = False
            await self._follow()

    async def managers(self) -> list[dict[str, Any]]:
        """Every manager of the database (this one alone with SQLite), as `GET /manager/status` shows them."""
        if self.cluster is None:
            return [self._item(self.me, True, None, 0.0, None, "")]
        return [
            self._item(m.info, m.leader, m.leader_since, m.seen_ago, m.started_at, m.last_seen)
            for m in await self.cluster.managers()
        ]

    def _item(
        self, info: ManagerInfo, leader: bool, since: str | None, ago: float, started: str | None, seen: str
    ) -> dict[str, Any]:
        return {
            "id": info.id,
            "host": info.host,
            "api": info.api,
            "link": info.link,
            "pid": info.pid,
            "version": info.version,
            "leader": leader,
            "leaderSince": since,
            "startedAt": started,
            "lastSeen": seen or None,
            "seenAgo": round(ago, 1),
            "alive": ago < self.ttl,  # (one that stopped renewing: dead, or cut off from the database)
            "self": info.id == self.me.id,
        }

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        if self.leading:
            self.leading = False
            await self._follow()
        if self.cluster is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.cluster.release_lease(self.me.id), 3)
        if self._closing is not None:
            await self._closing()
