"""What time it is, for services that decide by time (schedules, timeouts, idle sessions): the system's
clock, or one a test sets and advances."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


class Clock:
    """The current time in UTC (the system's)."""

    def now(self) -> datetime:
        return datetime.now(UTC)


class ManualClock(Clock):
    """A clock that stands still until told to move (for tests and simulations)."""

    def __init__(self, start: datetime | None = None) -> None:
        self.current = start or datetime(2026, 1, 1, tzinfo=UTC)

    def now(self) -> datetime:
        return self.current

    def advance(self, seconds: float) -> datetime:
        self.current += timedelta(seconds=seconds)
        return self.current
