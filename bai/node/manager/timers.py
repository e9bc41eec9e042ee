"""Time limits from resource policies: idle timeout and maximum session lifetime.

`expired()` is the pure decision; `Timers` runs it every second against the store and ends the
sessions it names (reasons `idle-timeout` and `idle-session-lifetime`, as Backend.AI's checkers).
Batch sessions are exempt from the idle timeout: they are busy by definition.

A slower loop purges the output of sessions that ended more than `[manager] log_retention` ago and
gives the space back to the file system (`log_settings` reads both log settings).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Mapping
from datetime import datetime, timedelta
from typing import Any

from bai.common.background import Background
from bai.common.clock import Clock
from bai.common.config import duration_seconds
from bai.common.status import SessionStatus, StatusInfo
from bai.node.manager.diskfull import FullDiskWarnings
from bai.node.manager.sessions import Sessions
from bai.node.manager.store import Store

log = logging.getLogger("bai.timers")
IDLE_TIMEOUT = StatusInfo.IDLE_TIMEOUT
LIFETIME = StatusInfo.SESSION_LIFETIME
MIN_LOG_BYTES = 64 * 1024
RECLAIM_FREE_PAGES = 256  # give free pages back to the file system once there are more than this many


def log_settings(cfg: Mapping[str, Any]) -> tuple[int, float]:
    """[manager] log_max_bytes and log_retention (seconds); ValueError with a sentence when wrong."""
    max_bytes = cfg["manager"]["log_max_bytes"]
    if max_bytes < MIN_LOG_BYTES:
        raise ValueError(f"[manager] log_max_bytes must be at least {MIN_LOG_BYTES} (64 KiB), got {max_bytes}")
    try:
        retention = duration_seconds(cfg["manager"]["log_retention"])
    except ValueError as e:
        raise ValueError(f"[manager] log_retention: {e}") from None
    return max_bytes, retention


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
    """Ends sessions past their policy's idle timeout or lifetime, and purges logs past their retention."""

    def __init__(
        self,
        store: Store,
        sessions: Sessions,
        interval: float = 1.0,
        log_retention: float | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.clock = clock or Clock()
        self.store = store
        self.sessions = sessions
        self.interval = interval
        self.log_retention = log_retention  # None: logs are kept (no purge loop)
        self.background = Background(log)
        self.full_disk = FullDiskWarnings(log)  # purging logs on a full disk: warned about once

    def start(self) -> None:
        self.background.spawn(self._loop(), "timers")
        if self.log_retention is not None:
            self.background.spawn(self._log_loop(), "log-retention")

    async def stop(self) -> None:
        await self.background.close()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.sweep(self.clock.now())
            except Exception:
                log.exception("checking session time limits failed")

    async def _log_loop(self) -> None:
        assert self.log_retention is not None
        interval = min(60.0, max(0.5, self.log_retention / 4))
        while True:
            await asyncio.sleep(interval)
            try:
                await self.sweep_logs(self.clock.now())
            except Exception as e:
                if not self.full_disk.failed("purging old logs", e):
                    log.exception("purging old logs failed")
            else:
                self.full_disk.ok("purging old logs")

    async def sweep_logs(self, now: datetime) -> list[str]:
        """Purge the logs of sessions that ended more than log_retention ago, give free pages back to the
        file system and cut the -wal file back; the kernels whose logs were purged."""
        store = self.store
        purged = await store.purge_logs((now - timedelta(seconds=self.log_retention or 0)).isoformat())
        if purged:
            log.info("purged the logs of %d ended kernel(s)", len(purged))
        await store.reclaim_space(0 if purged else RECLAIM_FREE_PAGES)
        return purged

    async def sweep(self, now: datetime) -> None:
        store = self.store
        running = await store.list_sessions(None, [SessionStatus.RUNNING])
        if not running:
            return
        policies = await store.policies()
        keypairs = await store.keypairs(active_only=False)
        policy_of = {ak: policies.get(kp["resource_policy"], {}) for ak, kp in keypairs.items()}
        for session_id, reason in expired(running, policy_of, self.sessions.activity, now, self.sessions.busy):
            row = await store.get_session(session_id)
            if row is not None and row["status"] == SessionStatus.RUNNING:
                log.info("ending session %s: %s", session_id, reason)
                self.sessions.spawn(self.sessions.destroy(row, forced=False, reason=reason), f"expire-{session_id}")
