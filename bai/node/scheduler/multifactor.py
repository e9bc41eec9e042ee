"""The multifactor policy's order (pure): each pending session's score from four factors, as Slurm's multifactor
priority, and the queue sorted by it (the weights: `snapshot.Weights`).

* priority: the session's priority over PRIORITY_MAX (Backend.AI's 0-100, default 10; its keypair's policy bounds
  what its owner may ask).
* fair share: 2^-(u/s), u the keypair's share of the decayed usage of the keypairs compared (those with usage or a
  pending session), s its share of the cluster (`Snapshot.shares`, 1 each by default, normalised over the same
  keypairs). Nothing used by anyone: 1 for all. A keypair that used exactly its share: 0.5; twice it: 0.25. Where
  projects have usage (`Snapshot.project_usage`) and there are two or more to compare, a session's factor is the
  geometric mean of its keypair's and its project's (the same formula among the projects compared, equal shares):
  2^-((u_k/s_k + u_p/s_p) / 2), so that a project whose members together used the cluster waits behind one that
  did not, whoever of them asks.
* age: the time the session has waited over `max_age`, at most 1.
* size: the largest share of the scaling group's capacity its request takes, over its slots (so, among otherwise
  equal sessions, the bigger one goes first: it is the one small sessions would otherwise keep waiting).

Ties (equal scores): the older session first, then the lower id, as FIFO.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import fields
from datetime import datetime
from itertools import islice
from math import isfinite, sqrt
from operator import attrgetter, eq

from .snapshot import PRIORITY_MAX, PRIORITY_MIN, Factors, PendingSession, Weights

__all__ = ["Scorer", "fair_share_factors", "session_fair_factors"]


def fair_share_factors(
    usage: Mapping[str, float], shares: Mapping[str, float], keypairs: Iterable[str]
) -> dict[str, float]:
    """Each compared keypair's fair-share factor (see the module's docstring)."""
    keys = sorted(set(usage) | set(keypairs))  # (sorted: the sums below add up in the same order in any process)
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


def session_fair_factors(
    usage: Mapping[str, float],
    shares: Mapping[str, float],
    project_usage: Mapping[str, float],
    sessions: Iterable[PendingSession],
) -> dict[tuple[str, str], float]:
    """The fair-share factor of each (access key, project id) of `sessions` (see the module's docstring)."""
    pairs = sorted(set(map(_key_and_project, sessions)))  # ((access key, project id); map: no Python-level loop)
    by_key = fair_share_factors(usage, shares, [k for k, _ in pairs])
    projects = {p for _, p in pairs} | set(project_usage)
    if len(projects) < 2 or not any(v > 0 for v in project_usage.values()):  # (one project: nothing to compare)
        return {(k, p): by_key[k] for k, p in pairs}
    by_project = fair_share_factors(project_usage, {}, [p for _, p in pairs])
    return {(k, p): sqrt(by_key[k] * by_project[p]) for k, p in pairs}


class Scorer:
    """Scores the sessions of one scaling group: `capacity` is the group's, per slot (the pool's ints); a session's
    request is given in the same ints."""

    def __init__(
        self,
        weights: Weights,
        now: datetime,
        fair: Mapping[tuple[str, str], float],  # by (access key, project id): `session_fair_factors`
        capacity: Mapping[int, int],
    ) -> None:
        self.weights = weights
        self.now = now
        self.fair = fair
        self.capacity = capacity
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

    def factors(self, session: PendingSession, request: Mapping[int, int]) -> Factors:
        return Factors(*self._parts(session, request))

    def _parts(self, session: PendingSession, request: Mapping[int, int]) -> tuple[float, float, float, float, float]:
        """The factors and the score, plainly (`order` works out the same floats faster)."""
        w = self.weights
        p = (min(max(session.priority, PRIORITY_MIN), PRIORITY_MAX) - PRIORITY_MIN) / (PRIORITY_MAX - PRIORITY_MIN)
        f = self.fair.get((session.access_key, session.project_id), 1.0)
        waited = (self.now - session.created_at).total_seconds()
        a = 0.0 if waited <= 0 or w.max_age <= 0 else min(waited / w.max_age, 1.0)
        s = self.size(request)
        return p, f, a, s, w.priority * p + w.fair_share * f + w.age * a + w.size * s

    def order(
        self, sessions: Sequence[PendingSession], requests: Sequence[Mapping[int, int]]
    ) -> tuple[list[int], Mapping[str, Factors]]:
        """The sessions' positions in `sessions` by score, highest first (ties: FIFO), and each one's factors by id
        (made when looked up). `requests[n]` is the request of `sessions[n]`.

        Each score is `_parts`'s, term by term in the same order (so the same float), but the priority and
        fair-share terms, alike for all the sessions of one keypair, project and priority, are worked out once for
        them, and the size once per request (prepared requests are shared). The order is that of one sort on
        (-score, created_at, id, position), got by a sort on -score alone (floats compare much faster than tuples),
        then, only where scores are equal, by the rest (`_break_ties`)."""
        w = self.weights
        wp, wf, wa, ws, max_age = w.priority, w.fair_share, w.age, w.size, w.max_age
        now, fair, sizes = self.now, self.fair, self._sizes
        aging = not max_age <= 0  # (a NaN max_age ages: to NaN, as `_parts`)
        heads: dict[tuple[int, str, str], float] = {}  # (priority, access key, project) -> wp * p + wf * f
        parts: dict[tuple[int, str, str], tuple[float, float]] = {}  # (priority, access key, project) -> (p, f)
        keys: list[float] = []  # per position: -score
        ages: list[float] = []  # per position: the age factor
        size_at: list[float] = []  # per position: the size factor
        for session, request in zip(sessions, requests):  # noqa: B905 (same lengths; strict=True is slower)
            pair = (session.priority, session.access_key, session.project_id)
            head = heads.get(pair)
            if head is None:
                p = (min(max(pair[0], PRIORITY_MIN), PRIORITY_MAX) - PRIORITY_MIN) / (PRIORITY_MAX - PRIORITY_MIN)
                f = fair.get((pair[1], pair[2]), 1.0)
                parts[pair] = p, f
                head = heads[pair] = wp * p + wf * f
            waited = (now - session.created_at).total_seconds()
            if waited <= 0 or not aging:
                a = 0.0
            else:
                a = waited / max_age
                if a > 1.0:  # (as min(a, 1.0))
                    a = 1.0
            s = sizes.get(id(request))
            if s is None:
                s = self.size(request)
            keys.append(-(head + wa * a + ws * s))
            ages.append(a)
            size_at.append(s)
        # by id, the position (of two sessions of one id, the last: as a dict built in the caller's order)
        by_id = dict(zip(map(_id, sessions), range(len(sessions))))  # noqa: B905 (one id per session)
        factors = _Lazy(sessions, by_id, parts, keys, ages, size_at)
        if (
            len(by_id) < len(keys)
            or not all(map(isfinite, (wp, wf, wa, ws)))
            or max_age != max_age
            or any(h != h for h in heads.values())
        ):  # an id twice, or odd weights or usage (a NaN score does not order): as `_parts` and stable sorts do
            return self._order_by_parts(sessions, by_id, keys), factors
        ordered = sorted(range(len(keys)), key=keys.__getitem__)
        _break_ties(ordered, keys, sessions)
        return ordered, factors

    @staticmethod
    def _order_by_parts(sessions: Sequence[PendingSession], by_id: dict[str, int], keys: list[float]) -> list[int]:
        """`order` the plain way: stable sorts on one key each, the last by each id's score (that of the last
        session of the id)."""
        ordered = sorted(range(len(sessions)), key=lambda n: sessions[n].id)
        ordered.sort(key=lambda n: sessions[n].created_at)
        ordered.sort(key=lambda n: keys[by_id[sessions[n].id]])  # (-score; stable: equal scores keep the FIFO order)
        return ordered


def _break_ties(ordered: list[int], keys: list[float], sessions: Sequence[PendingSession]) -> None:
    """`ordered` (positions sorted by `keys`, stably) as sorted by (key, created_at, id, position): each run of equal
    keys sorted by the rest. Scores seldom tie (the age differs by the second), so runs are looked for only when some
    neighbours are equal."""
    ranked = list(map(keys.__getitem__, ordered))
    if not any(map(eq, ranked, islice(ranked, 1, None))):
        return
    end = len(ranked)
    i = 0
    while i < end:
        j = i + 1
        while j < end and ranked[j] == ranked[i]:
            j += 1
        if j - i > 1:  # (the positions within the run ascend: the sort was stable)
            ordered[i:j] = sorted(ordered[i:j], key=lambda n: (sessions[n].created_at, sessions[n].id))
        i = j


_id = attrgetter("id")
_key_and_project = attrgetter("access_key", "project_id")


class _Lazy(dict[str, Factors]):
    """Factors by session id, each made the first time it is asked for (most sessions are placed: never asked), from
    what `Scorer.order` worked out: the same floats as `Scorer._parts` (the score: the sort key's, negated back)."""

    def __init__(
        self,
        sessions: Sequence[PendingSession],
        by_id: dict[str, int],
        parts: dict[tuple[int, str, str], tuple[float, float]],
        keys: list[float],
        ages: list[float],
        sizes: list[float],
    ) -> None:
        super().__init__()
        self.sessions = sessions
        self.by_id = by_id  # session id -> its position in `sessions` and in the lists below
        self.parts = parts  # (priority, access key, project id) -> (p, f)
        self.negated = keys  # per position: -score
        self.ages = ages
        self.sizes = sizes

    def get(self, key: str, default: Factors | None = None) -> Factors | None:  # type: ignore[override]
        found = super().get(key)
        if found is None:
            n = self.by_id.get(key)
            if n is None:
                return default
            session = self.sessions[n]
            p, f = self.parts[session.priority, session.access_key, session.project_id]
            a, s, score = self.ages[n], self.sizes[n], -self.negated[n]
            if _BY_SLOTS:  # Factors(p, f, a, s, score), without the frozen dataclass's __init__
                found = _new_object(Factors)
                _set_priority(found, p)
                _set_fair_share(found, f)
                _set_age(found, a)
                _set_size(found, s)
                _set_score(found, score)
            else:
                found = Factors(p, f, a, s, score)
            self[key] = found
        return found


# Factors are built through their slots' member descriptors: the frozen dataclass's __init__ sets each field with
# object.__setattr__, about twice as slow (a round makes one for every session left pending); only while these five
# are all its fields
_BY_SLOTS = tuple(field.name for field in fields(Factors)) == ("priority", "fair_share", "age", "size", "score")
_new_object = object.__new__
_set_priority: Callable[[Factors, float], None] = vars(Factors)["priority"].__set__
_set_fair_share: Callable[[Factors, float], None] = vars(Factors)["fair_share"].__set__
_set_age: Callable[[Factors, float], None] = vars(Factors)["age"].__set__
_set_size: Callable[[Factors, float], None] = vars(Factors)["size"].__set__
_set_score: Callable[[Factors, float], None] = vars(Factors)["score"].__set__
