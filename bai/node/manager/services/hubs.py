"""In-memory publication of committed state changes: session events and new log lines."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast

from bai.node.manager.state.records import Session

T = TypeVar("T")
# A stored log chunk: a row whose first item is its seq.
ChunkT = TypeVar("ChunkT", bound=tuple[Any, ...])

# Events a subscriber may have waiting: one that reads slower than the node publishes (an event stream
# whose client stopped reading) is dropped past this instead of holding a copy of every later event.
MAX_BACKLOG = 10_000


class Lagged(Exception):
    """The subscriber fell MAX_BACKLOG events behind and was dropped: what it would read next is
    incomplete, so it should say so to its client and end (or subscribe again and re-read)."""


class Subscription(asyncio.Queue[tuple[str, T]]):
    """A subscriber's events (name, what changed), at most `maxsize` waiting; `get` raises Lagged once one was
    dropped."""

    lagged = False

    async def get(self) -> tuple[str, T]:
        if not self.lagged:
            event = await super().get()
            if not self.lagged:
                return event
        raise Lagged(f"fell {self.maxsize} events behind")


class EventHub(Generic[T]):
    """Fan-out of (event name, what changed) to subscribers; only committed changes are published."""

    def __init__(self, backlog: int = MAX_BACKLOG) -> None:
        self.backlog = backlog
        self._subscribers: set[Subscription[T]] = set()
        # told of every event published here (the other managers of the database: services/cluster_events.py)
        self.relays: list[Callable[[str, T], None]] = []

    @property
    def watched(self) -> bool:
        """Whether anybody here subscribes now (what another manager relays is read only then)."""
        return bool(self._subscribers)

    def publish(self, name: str, what: T) -> None:
        self.publish_here(name, what)
        for relay in self.relays:
            relay(name, what)

    def publish_here(self, name: str, what: T) -> None:
        """Publish to this manager's subscribers only (an event another manager relayed)."""
        for q in list(self._subscribers):
            try:
                q.put_nowait((name, what))
            except asyncio.QueueFull:
                q.lagged = True  # its waiting events go with it; a waiting get() is woken to raise
                self._subscribers.discard(q)
                while not q.empty():
                    q.get_nowait()
                q.put_nowait(("lagged", cast(T, None)))  # (wakes a waiting get, which raises Lagged)

    @contextlib.contextmanager
    def subscribe(self) -> Iterator[Subscription[T]]:
        q: Subscription[T] = Subscription(self.backlog)
        self._subscribers.add(q)
        try:
            yield q
        finally:
            self._subscribers.discard(q)


class SessionEvents(EventHub[Session]):
    """The sessions' lifecycle events: (event name, the session as the change left it)."""

    async def wait_for(
        self,
        session_id: str,
        current: Callable[[], Awaitable[Session | None]],
        done: Callable[[Session], bool],
        timeout: float | None,
    ) -> Session | None:
        """Wait until the session satisfies `done`; `current()` reads it once subscribed (no race), and
        again whenever this waiter fell behind the events."""
        try:
            async with asyncio.timeout(timeout):
                while True:
                    with self.subscribe() as q:
                        row = await current()
                        if row is None or done(row):
                            return row
                        with contextlib.suppress(Lagged):
                            while True:
                                _, session = await q.get()
                                if session.id == session_id and done(session):
                                    return session
        except TimeoutError:
            return None


class LogHub:
    """Wakes followers of a kernel's log when new lines are stored."""

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}
        self.relays: list[Callable[[str], None]] = []  # (as EventHub's)

    def notify(self, kernel_id: str) -> None:
        self.notify_here(kernel_id)
        for relay in self.relays:
            relay(kernel_id)

    def notify_here(self, kernel_id: str) -> None:
        event = self._events.pop(kernel_id, None)
        if event is not None:
            event.set()

    async def wait(self, kernel_id: str, timeout: float) -> None:
        event = self._events.setdefault(kernel_id, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)

    async def follow(
        self,
        read: Callable[[str, int], Awaitable[list[ChunkT]]],
        kernel_id: str,
        is_over: Callable[[], Awaitable[bool]],
        after: int = 0,
    ) -> AsyncIterator[list[ChunkT]]:
        """Yield batches of stored chunks after chunk `after` (rows of `read(kernel_id, after)`, each
        starting with its seq), then new ones as they are stored, until `is_over()` says the kernel is
        gone and everything stored was yielded."""
        last = after
        while True:
            chunks = await read(kernel_id, last)
            if chunks:
                last = chunks[-1][0]
                yield chunks
                continue
            if await is_over():
                # the last reads: chunks stored between the read and the check
                while chunks := await read(kernel_id, last):
                    last = chunks[-1][0]
                    yield chunks
                return
            await self.wait(kernel_id, 1.0)


@dataclass
class Hubs:
    """The manager's publications: session lifecycle events, other changes the dashboard follows
    (agents, pending reasons, finished runs), and new kernel output."""

    events: SessionEvents = field(default_factory=SessionEvents)
    changes: EventHub[dict[str, Any]] = field(default_factory=EventHub)
    logs: LogHub = field(default_factory=LogHub)
