"""A call that wakes the dispatcher, made before the dispatcher exists (services get it in their
constructors; the dispatcher binds it when it starts)."""

from __future__ import annotations

from collections.abc import Callable


class Wakeup:
    """Something changed that may let a pending session start: run a scheduling round soon."""

    def __init__(self) -> None:
        self._target: Callable[[], None] = lambda: None
        self.relays: list[Callable[[], None]] = []  # told too (the leader, when another manager runs the rounds)

    def bind(self, target: Callable[[], None]) -> None:
        self._target = target

    def __call__(self) -> None:
        self._target()
        for relay in self.relays:
            relay()

    def here(self) -> None:
        """Wake this manager's dispatcher only (a wake-up another manager relayed)."""
        self._target()
