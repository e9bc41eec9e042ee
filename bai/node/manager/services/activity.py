"""What the timers need to know of sessions in use: when each was last active, and which have code running."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from bai.common.clock import Clock
from bai.node.manager.services.runs import BusySessions


class Activity:
    """Each live session's last activity (runs, terminal keystrokes, app traffic: the idle timeout's clock)
    and the sessions with code running or waiting to run (never idle meanwhile)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._last: dict[str, datetime] = {}
        self._busy = BusySessions()

    def touch(self, session_id: str) -> None:
        """The session is in use now: not idle."""
        self._last[session_id] = self.clock.now()

    def run_began(self, session_id: str, run_id: str) -> None:
        """Code runs (or waits to run) in the session: it is not idle until the run ends."""
        self._busy.add(session_id, run_id)

    def run_ended(self, session_id: str, run_id: str) -> None:
        self._busy.discard(session_id, run_id)

    def runs_over(self, session_id: str) -> None:
        """Every run of the session is over (its kernel restarts)."""
        self._busy.clear(session_id)

    def forget(self, session_id: str) -> None:
        """The session ends: nothing of it is kept."""
        self._last.pop(session_id, None)
        self._busy.clear(session_id)

    @property
    def last(self) -> Mapping[str, datetime]:
        """Session id -> when it was last active (only those active since the manager started)."""
        return self._last

    @property
    def busy(self) -> BusySessions:
        """The sessions with code running or waiting to run now."""
        return self._busy
