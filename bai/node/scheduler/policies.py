"""In which order a scaling group's pending sessions are considered (spec §8.3).

* `fifo`: oldest first, by (created_at, id).
* `lifo`: newest first, the exact reverse.
* `drf`: Dominant Resource Fairness. A keypair's dominant share is the largest, over slots, of
  what it occupies divided by the scaling group's total capacity of that slot (slots the group
  has none of are ignored). The next session is the oldest pending one of the keypair with the
  lowest share (ties: the keypair whose oldest pending session is older, then the older id);
  when it is placed the keypair's share is recomputed with its request added. A heap of
  keypairs keeps each pick at O(log keypairs).

No policy stops at a session that cannot be placed: the next one is simply considered.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from operator import attrgetter

from .snapshot import DRF, FIFO, LIFO, PendingSession

__all__ = ["DrfQueue", "dominant_share", "fifo_order", "lifo_order", "queue_key"]


# (created_at, id): the queue order
queue_key: Callable[[PendingSession], tuple[datetime, str]] = attrgetter("created_at", "id")


def fifo_order(sessions: Iterable[PendingSession]) -> list[PendingSession]:
    return sorted(sessions, key=queue_key)


def lifo_order(sessions: Iterable[PendingSession]) -> list[PendingSession]:
    """The exact reverse of fifo_order (created_at ties: the higher id first)."""
    return sorted(sessions, key=queue_key, reverse=True)


def dominant_share(occupied: Mapping[int, int], capacity: Mapping[int, int]) -> float:
    """max over slots of occupied / capacity, ignoring slots without capacity."""
    share = 0.0
    for slot, amount in occupied.items():
        total = capacity.get(slot, 0)
        if total > 0:
            part = amount / total
            if part > share:
                share = part
    return share


class DrfQueue:
    """Hands out a scaling group's pending sessions in DRF order.

    Call `pop()` for the next session, then `done(session, request)` with the slots it was
    placed with ({slot: amount}), or with None when it stays pending or is cancelled.
    """

    def __init__(
        self,
        sessions: Iterable[PendingSession],
        capacity: Mapping[int, int],
        occupied_of: Callable[[str], Mapping[int, int]],
    ) -> None:
        self.capacity = capacity
        self._queues: dict[str, list[PendingSession]] = {}
        for session in fifo_order(sessions):
            self._queues.setdefault(session.access_key, []).append(session)
        self._next: dict[str, int] = {}
        self._occupied: dict[str, dict[int, int]] = {}
        self.shares: dict[str, float] = {}
        self._heap: list[tuple[float, datetime, str, str]] = []
        for access_key, queue in self._queues.items():
            occupied = dict(occupied_of(access_key))
            share = dominant_share(occupied, capacity)
            self._occupied[access_key] = occupied
            self.shares[access_key] = share
            self._next[access_key] = 0
            first = queue[0]
            self._heap.append((share, first.created_at, first.id, access_key))
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return sum(len(q) - self._next[k] for k, q in self._queues.items())

    def pop(self) -> PendingSession | None:
        if not self._heap:
            return None
        access_key = heapq.heappop(self._heap)[3]
        n = self._next[access_key]
        self._next[access_key] = n + 1
        return self._queues[access_key][n]

    def done(self, session: PendingSession, request: Mapping[int, int] | None) -> None:
        access_key = session.access_key
        share = self.shares[access_key]
        if request:
            occupied = self._occupied[access_key]
            for slot, amount in request.items():
                occupied[slot] = occupied.get(slot, 0) + amount
            share = dominant_share(occupied, self.capacity)
            self.shares[access_key] = share
        queue = self._queues[access_key]
        n = self._next[access_key]
        if n < len(queue):
            following = queue[n]
            heapq.heappush(self._heap, (share, following.created_at, following.id, access_key))


def check_policy(name: str) -> str:
    if name not in (FIFO, LIFO, DRF):
        raise ValueError(f"unknown scheduling policy {name!r} (use fifo, lifo or drf)")
    return name
