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

from .snapshot import DRF, FIFO, LIFO, MULTIFACTOR, PendingSession

__all__ = ["DrfQueue", "dominant_share", "fifo_order", "lifo_order", "queue_key"]


# (created_at, id): the queue order
queue_key: Callable[[PendingSession], tuple[datetime, str]] = attrgetter("created_at", "id")
_id = attrgetter("id")
_created_at = attrgetter("created_at")


def fifo_order(sessions: Iterable[PendingSession]) -> list[PendingSession]:
    """Sorted by `queue_key`. Two stable sorts on single keys (id, then created_at) give the same
    order as one sort on the pair, without comparing tuples: about twice as fast."""
    ordered = sorted(sessions, key=_id)
    ordered.sort(key=_created_at)
    return ordered


def lifo_order(sessions: Iterable[PendingSession]) -> list[PendingSession]:
    """The exact reverse of fifo_order (created_at ties: the higher id first)."""
    ordered = sorted(sessions, key=_id, reverse=True)
    ordered.sort(key=_created_at, reverse=True)
    return ordered


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


class _Keypair:
    """One keypair's part of a `DrfQueue`: its pending sessions in queue order, how many were
    handed out, what it occupies and its dominant share."""

    __slots__ = ("access_key", "queue", "next", "occupied", "share")

    def __init__(self, access_key: str, queue: list[PendingSession], occupied: dict[int, int], share: float) -> None:
        self.access_key = access_key
        self.queue = queue
        self.next = 0
        self.occupied = occupied
        self.share = share


class DrfQueue:
    """Hands out a scaling group's pending sessions in DRF order.

    Call `pop()` for the next session, then `done(session, request)` with the slots it was
    placed with ({slot: amount > 0}), or with None when it stays pending or is cancelled.

    The heap holds one entry per keypair with sessions left, (share, created_at, id, access key,
    its `_Keypair`): no two entries share an access key, so the last item is never compared.
    """

    def __init__(
        self,
        sessions: Iterable[PendingSession],
        capacity: Mapping[int, int],
        occupied_of: Callable[[str], Mapping[int, int]],
    ) -> None:
        self.capacity = capacity
        queues: dict[str, list[PendingSession]] = {}
        for session in fifo_order(sessions):
            queues.setdefault(session.access_key, []).append(session)
        self._keypairs: dict[str, _Keypair] = {}
        self._heap: list[tuple[float, datetime, str, str, _Keypair]] = []
        for access_key, queue in queues.items():
            occupied = dict(occupied_of(access_key))
            keypair = _Keypair(access_key, queue, occupied, dominant_share(occupied, capacity))
            self._keypairs[access_key] = keypair
            first = queue[0]
            self._heap.append((keypair.share, first.created_at, first.id, access_key, keypair))
        heapq.heapify(self._heap)

    @property
    def shares(self) -> dict[str, float]:
        """Each keypair's dominant share now."""
        return {access_key: keypair.share for access_key, keypair in self._keypairs.items()}

    def __len__(self) -> int:
        return sum(len(k.queue) - k.next for k in self._keypairs.values())

    def pop(self) -> PendingSession | None:
        if not self._heap:
            return None
        keypair = heapq.heappop(self._heap)[4]
        n = keypair.next
        keypair.next = n + 1
        return keypair.queue[n]

    def done(self, session: PendingSession, request: Mapping[int, int] | None) -> None:
        keypair = self._keypairs[session.access_key]
        share = keypair.share
        if request:
            # Only the requested slots grow (amounts > 0), and a part never shrinks as its
            # slot grows, so the new share is the old one or a new part: the same float that
            # dominant_share(occupied, capacity) would compute, without going over every slot.
            occupied = keypair.occupied
            capacity = self.capacity
            for slot, amount in request.items():
                occupied[slot] = total = occupied.get(slot, 0) + amount
                available = capacity.get(slot, 0)
                if available > 0 and total / available > share:
                    share = total / available
            keypair.share = share
        queue = keypair.queue
        n = keypair.next
        if n < len(queue):
            following = queue[n]
            heapq.heappush(self._heap, (share, following.created_at, following.id, keypair.access_key, keypair))


def check_policy(name: str) -> str:
    if name not in (FIFO, LIFO, DRF, MULTIFACTOR):
        raise ValueError(f"unknown scheduling policy {name!r} (use fifo, lifo, drf or multifactor)")
    return name
