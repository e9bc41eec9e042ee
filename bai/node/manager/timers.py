"""Time limits from resource policies: idle timeout and maximum session lifetime.

`expired()` is the pure decision; `Timers` runs it every second against the store and ends the
sessions it names (reasons `idle-timeout` and `idle-session-lifetime`, as Backend.AI's checkers).
Batch sessions are exempt from the idle timeout: they are busy by definition.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Mapping
from datetime import UTC, datetime
from typing import Any

from bai.common.background import Background
from bai.common.status import SessionStatus, StatusInfo

log = logging.getLogger("bai.timers")
IDLE_TIMEOUT = StatusInfo.IDLE_TIMEOUT
LIFETIME = StatusInfo.SESSION_LIFETIME


def expired(
    sessions: list[dict[str, Any]],
    policy_of: Mapping[str, Mapping[str, Any]],
    last_activity: Mapping[str, datetime],
    now: datetime,
    busy: Collection[str] = (),
) -> list[tuple[str, str]]:
    """(session id, reason) for every running session past its policy's limits.

    A session with code running (`busy`) is never idle."""
    out = []
    for s in sessions:
        policy = policy_of.get(s["access_key"])
        if policy is None:
            continue
        lifetime = policy.get("max_session_lifetime") or 0
        idle = policy.get("idle_timeout") or 0
        age = (now - datetime.fromisoformat(s["created_at"])).total_seconds()
        if lifetime and age > lifetime:
            out.append((s["id"], LIFETIME))
            continue
        if idle and s["type"] != "batch" and s["id"] not in busy:
            since = last_activity.get(s["id"]) or datetime.fromisoformat(s["status_changed"])
            if (now - since).total_seconds() > idle:
                out.append((s["id"], IDLE_TIMEOUT))
    return out


class Timers:
    def __init__(self, registry, interval: float = 1.0) -> None:
        self.registry = registry
        self.interval = interval
        self.background = Background(log)

    def start(self) -> None:
        self.background.spawn(self._loop(), "timers")

    async def stop(self) -> None:
        await self.background.close()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.sweep(datetime.now(UTC))
            except Exception:
                log.exception("checking session time limits failed")

    async def sweep(self, now: datetime) -> None:
        store = self.registry.store
        running = await store.list_sessions(None, [SessionStatus.RUNNING])
        if not running:
            return
        policies = await store.policies()
        keypairs = await store.keypairs(active_only=False)
        policy_of = {ak: policies.get(kp["resource_policy"], {}) for ak, kp in keypairs.items()}
        for session_id, reason in expired(running, policy_of, self.registry.activity, now, self.registry.busy):
            row = await store.get_session(session_id)
            if row is not None and row["status"] == SessionStatus.RUNNING:
                log.info("ending session %s: %s", session_id, reason)
                self.registry.spawn(self.registry.destroy(row, forced=False, reason=reason), f"expire-{session_id}")
