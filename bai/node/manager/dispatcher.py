"""The dispatcher: wakes on events (coalesced) and on a slow tick, schedules, applies decisions."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from bai.common import slots as slotlib
from bai.common.status import SessionStatus, StatusInfo
from bai.node.manager.registry import Registry
from bai.node.scheduler.fifo import AgentState, PendingSession, schedule

log = logging.getLogger("bai.dispatcher")


class Dispatcher:
    def __init__(self, registry: Registry, tick: float = 5.0) -> None:
        self.registry = registry
        self.tick = tick
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        registry.wake_dispatcher = self.wake

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="dispatcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.tick)
            self._wake.clear()  # wakes arriving during the round trigger one more round
            try:
                await self.round()
            except Exception as e:  # the dispatcher keeps running
                log.exception("scheduling round failed")
                await self._record_error(e)

    async def round(self) -> None:
        store = self.registry.store
        pending_rows = await store.list_sessions(None, [SessionStatus.PENDING])
        if not pending_rows:
            return
        connected = self.registry.link.connected()
        occupied = await self.registry.occupied_by_agent()
        agents = [
            AgentState(
                id=a["id"],
                capacity=slotlib.from_wire(a["slots"]),
                occupied=occupied.get(a["id"], {}),
                scaling_group=a["scaling_group"],
            )
            for a in await store.agents()
            if a["status"] == "ALIVE" and a["id"] in connected
        ]
        pending = []
        for row in pending_rows:
            kernels = await store.kernels_of(row["id"])
            pending.append(
                PendingSession(
                    id=row["id"],
                    requested=slotlib.from_wire(kernels[0]["occupied_slots"]),
                    kernel_ids=tuple(k["id"] for k in kernels),
                    scaling_group=row["scaling_group"],
                )
            )
        decisions = schedule(pending, agents)
        retries = {r["id"]: (r["status_data"].get("scheduler") or {}).get("retries", 0) for r in pending_rows}
        for placement in decisions.placements:
            await self.registry.place(placement.session_id, placement.agent_id)
        for item in decisions.unschedulable:
            await self.registry.set_pending_reason(
                item.session_id, item.status_info, item.msg, retries[item.session_id] + 1
            )

    async def _record_error(self, exc: Exception) -> None:
        with contextlib.suppress(Exception):
            for row in await self.registry.store.list_sessions(None, [SessionStatus.PENDING]):
                await self.registry.store.set_pending_info(
                    row["id"],
                    StatusInfo.SCHEDULER_ERROR,
                    {"error": {"name": type(exc).__name__, "repr": str(exc)}},
                )
