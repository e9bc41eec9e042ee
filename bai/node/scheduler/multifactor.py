"""The multifactor policy's order (pure): each pending session's score from four factors, as Slurm's multifactor
priority, and the queue sorted by it (the weights: `snapshot.Weights`).

* priority: the session's priority over PRIORITY_MAX (Backend.AI's 0-100, default 10; its keypair's policy bounds
  what its owner may ask).
* fair share: 2^-(u/s), u the keypair's share of the decayed usage of the keypairs compared (those with usage or a
  pending session), s its share of the cluster (`Snapshot.shares`, 1 each by default, normalised over the same
  keypairs). Nothing used by anyone: 1 for all. A keypair that used exactly its share: 0.5; twice it: 0.25.
* age: the time the session has waited over `max_age`, at most 1.
* size: the largest share of the scaling group's capacity its request takes, over its slots (so, among otherwise
  equal sessions, the bigger one goes first: it is the one small sessions would otherwise keep waiting).

Ties (equal scores): the older session first, then the lower id, as FIFO.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime

from .snapshot import PRIORITY_MAX, PRIORITY_MIN, Factors, PendingSession, Weights

__all__ = ["Scorer", "fair_share_factors"]


def fair_share_factors(
    usage: Mapping[str, float], shares: Mapping[str, float], keypairs: Iterable[str]
) -> dict[str, float]:
    """Each compared keypair's fair-share factor (see the module's docstring)."""
    keys = set(usage) | set(keypairs)
    used = {k: max(0.0, float(usage.get(k, 0.0))) for k in keys}
    share = {k: max(0.0, float(shares.get(k, 1.0))) for k in keys}
    total_used, total_share = sum(used.values()), sum(share.values())
    if total_used <= 0:
        return dict.fromkeys(keys, 1.0)
    out = {}
    for k in keys:
        part = share[k] / total_share if total_share > 0 else 0.0
        out[k] = 0.0 if part <= 0 else 2.0 ** (-(used[k] / total_used) / part)
    return out


class Scorer:
    """Scores the sessions of one scaling group: `capacity` is the group's, per slot (the pool's ints), and `size_of`
    gives a session's request in the same ints."""

    def __init__(
        self,
        weights: Weights,
        now: datetime,
        fair: Mapping[str, float],
        capacity: Mapping[int, int],
        size_of: Callable[[PendingSession], Mapping[int, int]],
    ) -> None:
        self.weights = weights
        self.now = now
        self.fair = fair
        self.capacity = capacity
        self.size_of = size_of
        self._sizes: dict[int, float] = {}  # by the request's identity (prepared requests are shared)

    def size(self, request: Mapping[int, int]) -> float:
        key = id(request)
        size = self._sizes.get(key)
        if size is None:
            size = 0.0
            capacity = self.capacity
            for slot, amount in request.items():
                total = capacity.get(slot, 0)
                if total > 0 and amount / total > size:
                    size = amount / total
            self._sizes[key] = size = min(size, 1.0)
        return size

    def factors(self, session: PendingSession) -> Factors:
        return Factors(*self._parts(session))

    def _parts(self, session: PendingSession) -> tuple[float, float, float, float, float]:
        w = self.weights
        p = (min(max(session.priority, PRIORITY_MIN), PRIORITY_MAX) - PRIORITY_MIN) / (PRIORITY_MAX - PRIORITY_MIN)
        f = self.fair.get(session.access_key, 1.0)
        waited = (self.now - session.created_at).total_seconds()
        a = 0.0 if waited <= 0 or w.max_age <= 0 else min(waited / w.max_age, 1.0)
        s = self.size(self.size_of(session))
        return p, f, a, s, w.priority * p + w.fair_share * f + w.age * a + w.size * s

    def order(self, sessions: Sequence[PendingSession]) -> tuple[list[PendingSession], Mapping[str, Factors]]:
        """The sessions by score, highest first (ties: FIFO), and each one's factors by id (made when looked up)."""
        parts = {s.id: self._parts(s) for s in sessions}
        ordered = sorted(sessions, key=lambda s: s.id)
        ordered.sort(key=lambda s: s.created_at)
        ordered.sort(key=lambda s: -parts[s.id][4])  # (stable: equal scores keep the FIFO order)
        return ordered, _Lazy(parts)


class _Lazy(dict[str, Factors]):
    """Factors by session id, each made the first time it is asked for (most sessions are placed: never asked)."""

    def __init__(self, parts: dict[str, tuple[float, float, float, float, float]]) -> None:
        super().__init__()
        self.parts = parts

    def get(self, key: str, default: Factors | None = None) -> Factors | None:  # type: ignore[override]
        found = super().get(key)
        if found is None:
            raw = self.parts.get(key)
            if raw is None:
                return default
            found = self[key] = Factors(*raw)
        return found
