"""What time it is, for services that decide by time (schedules, timeouts, idle sessions, grace periods,
retention) and for the times the state records: the system's clock, or one a test sets and advances.

The manager reads the wall clock only here: every stamp it stores and every time limit it judges comes
from the one `Clock` it was built with (`bai.node.manager.build.build_manager`). `sleep_until` waits
until the clock says a time has come: the system's clock sleeps, a `ManualClock` wakes its sleepers when
a test moves it past their time (so a grace period runs out when the test says so, not after real time).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from datetime import UTC, datetime, timedelta


class Clock:
    """The current time in UTC (the system's)."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    async def sleep_until(self, when: datetime) -> None:
        """Return once the clock says `when` has come (at once when it has)."""
        delay = (when - self.now()).total_seconds()
        while delay > 0:
            await asyncio.sleep(delay)
            delay = (when - self.now()).total_seconds()  # (a system clock set back meanwhile)


class ManualClock(Clock):
    """A clock that stands still until told to move (for tests and simulations). Its sleepers
    (`sleep_until`) wake when `advance` (or setting `current`) moves it to their time or past it."""

    def __init__(self, start: datetime | None = None) -> None:
        self._current = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._order = itertools.count()  # (ties between sleepers of one time: first come, first woken)
        self._sleepers: list[tuple[datetime, int, asyncio.Future[None]]] = []

    @property
    def current(self) -> datetime:
        return self._current

    @current.setter
    def current(self, when: datetime) -> None:
        self._current = when
        self._wake()

    def now(self) -> datetime:
        return self._current

    def advance(self, seconds: float) -> datetime:
        self.current = self._current + timedelta(seconds=seconds)
        return self._current

    async def sleep_until(self, when: datetime) -> None:
        if when <= self._current:
            return
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (when, next(self._order), woken))
        await woken  # (a sleeper cancelled meanwhile is dropped when its time comes)

    def _wake(self) -> None:
        sleepers = self._sleepers
        while sleepers and sleepers[0][0] <= self._current:
            _, _, woken = heapq.heappop(sleepers)
            if not woken.done():
                woken.set_result(None)
