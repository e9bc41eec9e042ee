"""A keypair cannot flood the queue: its policy's `max_pending_session_count` bounds its PENDING sessions.

Each session that cannot be placed yet waits PENDING: a row in the store and an entry in every scheduling
round's snapshot. Without a bound one ordinary keypair could grow both without limit. At creation, before
the session row is stored, `check_pending_limit` refuses the next one with a 412 (quota-exceeded) naming
the limit, while the keypair already has that many waiting; nothing is stored. A session that starts (or is
cancelled, or ends) frees its place. 0 means unlimited (what a bench submitting thousands sets).

Backend.AI's keypair resource policies have the same field (`max_pending_session_count`; GraphQL shows null
for unlimited). The store keeps every keypair's limit in memory (read again after a change of keypairs or
policies): an unlimited keypair's check reads nothing, another's is one read in the store's thread, a count
of at most `limit` entries of the sessions_owner_status index, so a refused flood costs no more than that.

`check_pending_limit` alone is a check before the insert, two transactions: creations of one keypair in flight
at the same moment all pass a check that saw the queue below the limit, so a burst can overshoot it by its
size (once). `QueueGate.insert` is exact: it counts, besides the stored PENDING sessions, the keypair's
creations past the check whose insert has not returned, and reads again when one returned while it read (its
read may predate that insert). The store answers calls in the order made and each answer wakes its caller in
that order, so a creation whose insert a read saw has released its place before that read's caller looks.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from bai.common.problems import Problem

T = TypeVar("T")
SLUG = "quota-exceeded"
TITLE = "Too many sessions waiting."
READS = 3  # reads of the count while other creations of the keypair return meanwhile; then it counts them too


class PendingQueueStore(Protocol):
    async def pending_queue(self, access_key: str) -> tuple[str, int, int]: ...


@dataclass(frozen=True, slots=True)
class PendingQueue:
    """A keypair's queue as its policy bounds it."""

    access_key: str
    policy: str
    limit: int  # max_pending_session_count; 0 = unlimited
    pending: int  # its PENDING sessions (counted up to `limit`)

    @property
    def full(self) -> bool:
        return self.limit > 0 and self.pending >= self.limit

    def refusal(self) -> Problem:
        return Problem(
            SLUG,
            TITLE,
            f"keypair {self.access_key} already has {self.pending} sessions waiting (PENDING); the policy "
            f"{self.policy} allows {self.limit} (max_pending_session_count): wait for some to start or cancel them",
            data={"policy": self.policy, "max_pending_session_count": self.limit, "pending": self.pending},
        )


async def pending_queue(store: PendingQueueStore, access_key: str) -> PendingQueue:
    policy, limit, pending = await store.pending_queue(access_key)
    return PendingQueue(access_key, policy, limit, pending)


async def check_pending_limit(store: PendingQueueStore, access_key: str) -> None:
    """Raise the 412 when `access_key` may not queue one more session now (see the module docstring)."""
    queue = await pending_queue(store, access_key)
    if queue.full:
        raise queue.refusal()


@dataclass(slots=True)
class _InFlight:
    """A keypair's creations between the gate's check and the end of their insert."""

    reserved: int = 0  # past the check, insert not returned
    returned: int = 0  # inserts returned since this record was made (a read under way may predate them)
    reading: int = 0  # checks whose read is under way


class QueueGate:
    """`max_pending_session_count`, exact under concurrency: `insert` checks the keypair's queue and stores the
    session (`store_it`, the store's insert) holding a place in it; a full queue is the 412 of
    `check_pending_limit`, and `store_it` is not called. State: one small record per keypair with a creation
    under way, dropped when none is."""

    def __init__(self, store: PendingQueueStore) -> None:
        self.store = store
        self._in_flight: dict[str, _InFlight] = {}

    async def insert(self, access_key: str, store_it: Callable[[], Awaitable[T]]) -> T:
        flight = self._in_flight.setdefault(access_key, _InFlight())
        flight.reading += 1
        try:
            queue = await self._count(access_key, flight)
        except BaseException:  # (cancelled: the record goes with the last creation under way)
            flight.reading -= 1
            self._forget(access_key, flight)
            raise
        flight.reading -= 1
        if queue.full:
            self._forget(access_key, flight)
            raise queue.refusal()
        flight.reserved += 1
        try:
            return await store_it()
        finally:
            flight.reserved -= 1
            flight.returned += 1
            self._forget(access_key, flight)

    async def _count(self, access_key: str, flight: _InFlight) -> PendingQueue:
        """The queue with the creations in flight: exact when no insert returned during the read; after READS
        reads that raced with some, those are counted too (more than there are, never fewer)."""
        raced = 0
        for _ in range(READS):
            before = flight.returned
            queue = await pending_queue(self.store, access_key)
            raced = flight.returned - before
            if not raced:
                break
        waiting = queue.pending + flight.reserved + raced
        return PendingQueue(access_key, queue.policy, queue.limit, waiting if queue.limit else 0)

    def _forget(self, access_key: str, flight: _InFlight) -> None:
        if not flight.reserved and not flight.reading and self._in_flight.get(access_key) is flight:
            del self._in_flight[access_key]

    def in_flight(self) -> int:
        """Keypairs with a creation under way (what the gate holds in memory)."""
        return len(self._in_flight)
