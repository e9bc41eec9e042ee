"""Time limits from resource policies: idle timeout, maximum session lifetime, idle utilisation.

`expired()` is the pure decision; `Timers` runs it every second against the store and ends the
sessions it names (reasons `idle-timeout` and `idle-session-lifetime`, as Backend.AI's checkers).
Batch sessions are exempt from the idle timeout: they are busy by definition.

`underused()` is idle detection by utilisation (as Backend.AI's utilisation idle checker): a policy's
`idle_cpu_pct` (percent of the CPU the session was allocated) and `idle_gpu_pct` (percent, the mean over its
GPUs), each null for off, and `idle_window` (seconds): a running, non-batch session whose mean utilisation
over a full window stayed under every threshold that applies to it ends with `idle-utilization`. A session
younger than the window, or without samples over the whole of it, is never ended; batch sessions are exempt.

A slower loop purges the output of sessions that ended more than `[manager] log_retention` ago and
gives the space back to the file system (`log_settings` reads both log settings).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from datetime import datetime, timedelta
from typing import Any

import msgspec

from bai.common.background import Background
from bai.common.clock import Clock
from bai.common.config import duration_seconds
from bai.common.images import registry_of
from bai.common.problems import Problem
from bai.common.status import SessionStatus, StatusInfo
from bai.node.manager.services.activity import Activity
from bai.node.manager.services.agent_registry import PULL_TIMEOUT
from bai.node.manager.services.diskfull import FullDiskWarnings
from bai.node.manager.services.lifecycle import SessionLifecycle
from bai.node.manager.services.stats_book import StatsBook, Trail
from bai.node.manager.state import State
from bai.node.manager.state.records import Session

log = logging.getLogger("bai.timers")
IDLE_TIMEOUT = StatusInfo.IDLE_TIMEOUT
LIFETIME = StatusInfo.SESSION_LIFETIME
TIME_LIMIT = StatusInfo.TIME_LIMIT
IDLE_UTILIZATION = "idle-utilization"  # (Backend.AI's utilisation checker's word)
DEFAULT_IDLE_WINDOW = 600.0
# a window with a longer stretch without samples (an agent away) is not a full window: this many stat
# intervals, and at least MIN_GAP seconds
GAP_INTERVALS = 5
MIN_GAP = 60.0
MIN_LOG_BYTES = 64 * 1024
RECLAIM_FREE_PAGES = 256  # give free pages back to the file system once there are more than this many


STARTING_STATUSES = (SessionStatus.SCHEDULED, SessionStatus.PREPARING, SessionStatus.PULLING)
STUCK_GRACE = 30.0  # seconds past its start's own limits before a session stuck starting is ended
# seconds a session may stay TERMINATING with no destroy under way (a destroy's removals take at most 60 s)
TERMINATING_LIMIT = 60.0 + STUCK_GRACE


def start_limit(start_timeout: float, session: Session) -> float:
    """How long a session may stay starting: the preparing timeout (`start_timeout`), a pull's when its image
    comes from a registry, and STUCK_GRACE."""
    pull = PULL_TIMEOUT if registry_of(session.image) else 0.0
    return start_timeout + pull + STUCK_GRACE


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
    sessions: list[Session],
    policy_of: Mapping[str, Mapping[str, Any]],
    last_activity: Mapping[str, datetime],
    now: datetime,
    busy: Collection[str] = (),
) -> list[tuple[str, str]]:
    """(session id, reason) for every running session past its policy's limits.

    A session with code running (`busy`) is never idle."""
    out = []
    for s in sessions:
        if s.time_limit and s.started_at:  # its own declared limit, counted from its start
            if (now - datetime.fromisoformat(s.started_at)).total_seconds() > s.time_limit:
                out.append((s.id, TIME_LIMIT))
                continue
        policy = policy_of.get(s.access_key)
        if policy is None:
            continue
        lifetime = policy.get("max_session_lifetime") or 0
        idle = policy.get("idle_timeout") or 0
        age = (now - datetime.fromisoformat(s.created_at)).total_seconds()
        if lifetime and age > lifetime:
            out.append((s.id, LIFETIME))
            continue
        if idle and s.type != "batch" and s.id not in busy:
            since = last_activity.get(s.id) or datetime.fromisoformat(s.status_changed)
            if (now - since).total_seconds() > idle:
                out.append((s.id, IDLE_TIMEOUT))
    return out


def _cores(session: Session) -> float:
    try:
        return float((session.requested_slots or {}).get("cpu") or 0)
    except (TypeError, ValueError):
        return 0.0


def underused(
    sessions: list[Session],
    policy_of: Mapping[str, Mapping[str, Any]],
    trails_of: Callable[[str], list[Trail | None]],
    now: float,
    interval: float = 2.0,
) -> list[tuple[str, str, dict[str, Any]]]:
    """(session id, `idle-utilization`, status data) for every running session that stayed under its
    policy's utilisation thresholds over a full window (see the module docstring).

    `trails_of(session id)`: its kernels' utilisation trails; `now`: seconds since the epoch (the samples'
    clock); `interval`: the agents' stat interval (a stretch of more than GAP_INTERVALS of them, and more
    than MIN_GAP seconds, without a sample means the window is not full)."""
    max_gap = max(GAP_INTERVALS * interval, MIN_GAP)
    out = []
    for s in sessions:
        if s.type == "batch" or s.status != SessionStatus.RUNNING:
            continue
        policy = policy_of.get(s.access_key)
        if not policy:
            continue
        cpu_limit, gpu_limit = policy.get("idle_cpu_pct"), policy.get("idle_gpu_pct")
        if cpu_limit is None and gpu_limit is None:
            continue
        window = float(policy.get("idle_window") or DEFAULT_IDLE_WINDOW)
        start = now - window
        if datetime.fromisoformat(s.created_at).timestamp() > start:
            continue  # younger than the window
        trails = trails_of(s.id)
        if not trails or any(t is None or t.since > start or t.longest_gap(start, now) > max_gap for t in trails):
            continue  # no samples over the whole window
        cpu_sum, gpu_values, enough = 0.0, [], True
        for trail in trails:
            assert trail is not None
            cpu, _, gpu = trail.averages(start)
            if cpu is None:
                enough = False
                break
            cpu_sum += cpu
            if gpu is not None:
                gpu_values.append(gpu)
        if not enough:
            continue
        judged, idle, data = False, True, {"window": window}
        cores = _cores(s)
        if cpu_limit is not None and cores > 0:
            pct = cpu_sum / cores  # percent of one core over cores allocated: percent of the allocation
            judged, idle = True, idle and pct < cpu_limit
            data["cpuPct"] = round(pct, 2)
            data["cpuThreshold"] = cpu_limit
        if gpu_limit is not None and gpu_values:
            pct = sum(gpu_values) / len(gpu_values)
            judged, idle = True, idle and pct < gpu_limit
            data["gpuPct"] = round(pct, 2)
            data["gpuThreshold"] = gpu_limit
        if judged and idle:
            out.append((s.id, IDLE_UTILIZATION, data))
    return out


def utilization_window(policies: Mapping[str, Mapping[str, Any]]) -> float:
    """How much utilisation the book should keep: the longest idle_window of the policies that check it."""
    windows = [
        float(p.get("idle_window") or DEFAULT_IDLE_WINDOW)
        for p in policies.values()
        if p.get("idle_cpu_pct") is not None or p.get("idle_gpu_pct") is not None
    ]
    return max(windows, default=0.0)


class Timers:
    """Ends sessions past their policy's idle timeout or lifetime, and purges logs past their retention."""

    def __init__(
        self,
        store: State,
        lifecycle: SessionLifecycle,
        activity: Activity,
        background: Background,
        start_timeout: float = 60.0,
        interval: float = 1.0,
        log_retention: float | None = None,
        clock: Clock | None = None,
        stats: StatsBook | None = None,
    ) -> None:
        self.clock = clock or Clock()
        self.stats = stats or StatsBook()  # utilisation, for idle detection by it
        self.store = store
        self.lifecycle = lifecycle  # what ends the sessions the timers name
        self.activity = activity  # when each session was last active, which have code running
        self.spawn = background.spawn  # the ends the timers start (the manager's background: they outlive a sweep)
        self.start_timeout = start_timeout
        self.interval = interval
        self.log_retention = log_retention  # None: logs are kept (no purge loop)
        self.background = Background(log)
        self.full_disk = FullDiskWarnings(log)  # purging logs (and ending sessions) on a full disk: said once
        self.since = self.clock.now()  # stuck sessions are judged on what happened since
        # whether this manager may end sessions now (services/leadership.py: False once its lease may have expired)
        self.may_act: Callable[[], bool] = lambda: True

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
        purged = await store.purge_logs(now - timedelta(seconds=self.log_retention or 0), now)
        if purged:
            log.info("purged the logs of %d ended kernel(s)", len(purged))
        await store.reclaim_space(0 if purged else RECLAIM_FREE_PAGES)
        return purged

    async def sweep(self, now: datetime) -> None:
        if not self.may_act():
            return
        await self.sweep_starts(now)
        await self.sweep_terminating(now)
        await self.sweep_limits(now)

    async def sweep_terminating(self, now: datetime) -> list[str]:
        """Sessions TERMINATING longer than a destroy may take (TERMINATING_LIMIT) with no destroy of theirs
        under way (it failed, e.g. its last write on a full disk) are ended: kernels removed again, TERMINATED;
        sessions PREEMPTED that long have their preemption carried on (requeued or ended). The ids of those."""
        ended = []
        for row in await self.store.list_sessions(None, [SessionStatus.PREEMPTED]):
            # a preemption whose end is not under way here (a manager that stopped meanwhile): carried on
            if not self.lifecycle.is_ending(row.id) and self._age(row, now) > TERMINATING_LIMIT:
                ended.append(row.id)
                self.spawn(
                    self._quietly("ending preemptions left unfinished", self.lifecycle.finish_preempt(row)),
                    f"stuck-{row.id}",
                )
        for row in await self.store.list_sessions(None, [SessionStatus.TERMINATING]):
            if self.lifecycle.is_ending(row.id):
                continue
            if self._age(row, now) > TERMINATING_LIMIT:
                ended.append(row.id)
                self.spawn(
                    self._quietly("ending sessions stuck TERMINATING", self.lifecycle.end_stuck_destroy(row)),
                    f"stuck-{row.id}",
                )
        return ended

    def _age(self, session: Session, now: datetime) -> float:
        """Seconds a session has been in its status, as far as this manager saw: not before it started (a
        manager that was down does not judge what it did not watch; agents re-register first)."""
        since = max(datetime.fromisoformat(session.status_changed), self.since)
        return (now - since).total_seconds()

    async def _quietly(self, what: str, work: Awaitable[object]) -> None:
        """Work of the timers: on a full disk, warned about once (the next sweep tries again); a refusal
        (the session moved meanwhile) is no error."""
        try:
            await work
        except Problem as p:
            log.info("%s: %s", what, p.msg or p.title)
        except Exception as e:
            if not self.full_disk.failed(what, e):
                raise
        else:
            self.full_disk.ok(what)

    async def sweep_starts(self, now: datetime) -> list[str]:
        """Sessions SCHEDULED, PREPARING or PULLING longer than their start may take (the preparing timeout, a
        pull's too, and STUCK_GRACE) with no start of theirs under way are ended (kernels removed, CANCELLED):
        this timer needs no write to have worked (a start whose writes failed on a full disk ends here too,
        once the disk lets it). The ids of those it ends."""
        starting = await self.store.list_sessions(None, STARTING_STATUSES)
        ended = []
        for row in starting:
            if self.lifecycle.is_starting(row.id):
                continue  # under way: its own timeout ends it
            limit = start_limit(self.start_timeout, row)
            if self._age(row, now) > limit:
                ended.append(row.id)
                self.spawn(self.lifecycle.end_stuck_start(row, limit), f"stuck-{row.id}")
        return ended

    async def sweep_limits(self, now: datetime) -> None:
        store = self.store
        running = await store.list_sessions(None, [SessionStatus.RUNNING])
        if not running:
            return
        # (the rules read policies as mappings: the records' fields by name)
        policies = {name: msgspec.structs.asdict(p) for name, p in (await store.policies()).items()}
        keypairs = await store.keypairs(active_only=False)
        policy_of = {ak: policies.get(kp.resource_policy, {}) for ak, kp in keypairs.items()}
        ending = expired(running, policy_of, self.activity.last, now, self.activity.busy)
        self.stats.keep_utilization(utilization_window(policies))
        if self.stats.trail_seconds > 0:
            ended = {sid for sid, _ in ending}
            for session_id, reason, data in underused(
                running, policy_of, self.stats.trails_of, now.timestamp(), self.stats.interval
            ):
                if session_id not in ended:
                    log.info("ending session %s: %s (%s)", session_id, reason, data)
                    ending.append((session_id, reason))
        for session_id, reason in ending:
            row = await store.get_session(session_id)
            if row is not None and row.status == SessionStatus.RUNNING:
                log.info("ending session %s: %s", session_id, reason)
                destroying = self.lifecycle.destroy(row, forced=False, reason=reason)
                self.spawn(self._quietly("ending sessions past their limits", destroying), f"expire-{session_id}")
