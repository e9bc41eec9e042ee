"""Backfill with reservations (pure): the first sessions in line that cannot start now get a reservation, and later
sessions start only where they do not delay it (as Slurm's backfill, or EASY backfill with `depth` reservations).

Times are seconds from the round's `now`. A running session ends at the latest at its start plus its duration
(`AgentState.ends`; one of unknown duration never ends as far as this knows), and a session placed in this round at
`now` plus its own.

* A **reservation** for a blocked session is the earliest time at which, with the known ends, its request fits: one
  agent for a single-node session, its kernels over agents for a multi-node one. Other reservations are counted as
  taken (from now on: conservative). Where no known end ever makes room (sessions of unknown length hold it), the
  best agents are kept for it from now on: nothing that would outlast them starts there (a drain).
* **Backfill**: a later session may start now on a reserved agent only if it ends before the reservation starts, or
  if it leaves what the reservation needs at its start. The pool (`AgentPool`) is kept at the room such sessions may
  use (the least of what is free now and what is spare at each reservation's start); sessions that end before a
  reservation starts may also use what is free now beyond that (`short_fit`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from operator import itemgetter

from .selection import AgentPool, SlotTable
from .snapshot import AgentState, Reservation

__all__ = ["Backfill", "INFINITE"]

INFINITE = math.inf  # the end of a session of unknown duration
_first = itemgetter(0)
# (agent, what it frees at that time, or None where only a reservation ends)
_Event = tuple[int, Mapping[int, int] | None]


class Hold:
    """One reservation: from `start` until `until` (seconds from now; `until` INFINITE for a session of unknown
    duration), `need[agent]` of each of its agents; `spare[agent]` is what that agent has beyond it at `start` (less
    what later sessions took that outlast `start`)."""

    __slots__ = ("session_id", "start", "until", "need", "spare")

    def __init__(self, session_id: str, start: float, until: float, need: dict[int, dict[int, int]]) -> None:
        self.session_id = session_id
        self.start = start
        self.until = until
        self.need = need
        self.spare: dict[int, list[int]] = {}

    def overlaps(self, t: float, duration: float) -> bool:
        """Whether it holds its agents at some time of [t, t + duration)."""
        return self.start < t + duration and self.until > t


def _copies(free: Sequence[int], request: Mapping[int, int]) -> int:
    """How many times `request` fits in `free`."""
    width = len(free)
    most = -1
    for i, n in request.items():
        if n <= 0:
            continue
        if i >= width:
            return 0
        k = free[i] // n
        if most < 0 or k < most:
            most = k
    return max(most, 0)


def _fits(free: Sequence[int], request: Mapping[int, int]) -> bool:
    width = len(free)
    for i, n in request.items():
        if i >= width or free[i] < n:
            return False
    return True


class Backfill:
    """The reservations of one scaling group's round, over its `AgentPool` (agents numbered as the pool does)."""

    def __init__(
        self, pool: AgentPool, table: SlotTable, agents: Sequence[AgentState], now: datetime, depth: int
    ) -> None:
        self.pool = pool
        self.now = now
        self.depth = depth
        self._agents = agents
        self._table = table
        # the known ends: the running sessions' (by time, made when a reservation first needs them), and those of
        # sessions placed in this round (by their end: the durations sessions declare repeat)
        self._running: dict[float, list[_Event]] | None = None  # by time, in the agents' order, then the ends'
        self._running_times: list[float] = []  # its keys, in order
        self._placed: dict[float, list[_Event]] = {}
        self.holds: list[Hold] = []
        self.latest_start = -1.0  # the latest start of a hold: a session that ends after it can't short-fit
        self.on: dict[int, list[Hold]] = {}  # agent -> its holds
        self.first_start: dict[int, float] = {}  # agent -> when its first hold starts
        self.actual: dict[int, list[int]] = {}  # agent -> what it has free now (agents of holds: the pool has less)
        # whether `placed` records the ends of the sessions placed now (only while more reservations may be made:
        # only `reserve` reads them); with no holds on its agent either, `placed` has nothing to do
        self.recording = depth > 0

    @property
    def wants_more(self) -> bool:
        return len(self.holds) < self.depth

    # -- sessions placed now -----------------------------------------------------------------------------------

    def placed(self, agent: int, slots: Mapping[int, int], end: float) -> None:
        """A session took `slots` of `agent` until `end` (the pool's room already moved, or not: see `short_fit`).

        `slots` is kept as it is (not copied): the caller must not change it afterwards (prepared requests never
        change). Its end is only kept while reservations may still be made: only `reserve` reads it."""
        if end < INFINITE and self.recording:
            ended = self._placed.get(end)
            if ended is None:
                self._placed[end] = [(agent, slots)]
            else:
                ended.append((agent, slots))
        holds = self.on.get(agent)
        if holds:
            free = self.actual[agent]
            for i, n in slots.items():
                free[i] -= n
            for hold in holds:
                if end > hold.start:  # still running when the reservation starts: it takes from the spare room
                    spare = hold.spare[agent]
                    for i, n in slots.items():
                        spare[i] -= n
            self._sync(agent)

    def short_fit(self, slots: Mapping[int, int], end: float) -> int | None:
        """An agent with a reservation where a session ending by `end` fits in what is free now, because it ends
        before every reservation of that agent starts (the pool does not offer that room)."""
        if end > self.latest_start:  # (INFINITE too) it would still run when every reservation starts
            return None
        for agent, first in self.first_start.items():
            if end <= first and _fits(self.actual[agent], slots):
                return agent
        return None

    def _sync(self, agent: int) -> None:
        """The pool's room for the agent: what later sessions that outlast its reservations' starts may take."""
        free = self.actual[agent]
        target = list(free)
        for hold in self.on[agent]:
            for i, n in enumerate(hold.spare[agent]):
                if n < target[i]:
                    target[i] = n
        self.pool.set_remaining(agent, [n if n > 0 else 0 for n in target])

    # -- reservations ------------------------------------------------------------------------------------------

    def _free_now(self) -> list[list[int]]:
        """What each agent has free now (the reservations' agents: what is free, not what the pool offers)."""
        rows = self.pool.remaining_all()
        for n, row in self.actual.items():
            rows[n] = row[:]
        return rows

    def _usable(self, free: list[int], agent: int, t: float, duration: float) -> list[int]:
        """`free` less what the reservations of `agent` that overlap [t, t + duration) need."""
        holds = self.on.get(agent)
        if not holds:
            return free
        row = free[:]
        for hold in holds:
            if hold.overlaps(t, duration):
                for i, n in hold.need[agent].items():
                    row[i] -= n
        return row

    def reserve(
        self, session_id: str, kernels: Sequence[Mapping[int, int]], spread: bool, duration: float | None
    ) -> Reservation | None:
        """Make a reservation for a session that cannot start now (its kernels' requests; `spread`: each kernel on
        any agent, else all on one; `duration`: how long it runs at most, None: unknown): the earliest time and
        agents, kept from then on. None when no agent of the group could ever hold it."""
        if not self.wants_more or not kernels or not self.pool.ids:
            return None
        length = INFINITE if duration is None else duration
        free = self._free_now()
        start, need = self._earliest(free, kernels, spread, length)
        if need is None:  # no known end makes room: keep the agents that could hold it, once theirs end
            need = self._drain(kernels, spread)
            if need is None:
                return None
            start, free = None, self._free_now()  # (the sweep moved `free` past every known end)
        begins = 0.0 if start is None else start
        hold = Hold(session_id, begins, begins + length, need)
        for agent, request in need.items():
            if agent not in self.actual:
                self.actual[agent] = self.pool.remaining(agent)
            at_start = self._usable(free[agent], agent, begins, length)
            hold.spare[agent] = [at_start[i] - request.get(i, 0) for i in range(len(at_start))]
            self.on.setdefault(agent, []).append(hold)
            self.first_start[agent] = min(self.first_start.get(agent, INFINITE), hold.start)
        self.holds.append(hold)
        self.recording = len(self.holds) < self.depth
        self.latest_start = max(self.latest_start, hold.start)
        for agent in need:
            self._sync(agent)
        when = None if start is None else self.now + timedelta(seconds=start)
        return Reservation(when, tuple(self.pool.ids[agent] for agent in sorted(need)))

    def _moments(self) -> Iterator[tuple[float, list[_Event]]]:
        """The known ends in time order, those of one moment together: (t, [(agent, what it frees or None)]), None
        where a reservation ends (nothing is freed, but what the agent may hold changes). In one moment: the running
        sessions' ends (in the agents' order), then this round's (in the order they were placed), then the
        reservations'. The lists are not to be changed."""
        running = self._running
        if running is None:
            number = self.pool.numbers
            now = self.now
            convert = self._table.convert
            found: list[tuple[float, int, dict[int, int]]] = []
            width = len(self.pool.capacity_of(0)) if len(self.pool) else 0  # (the slots the agents' rows have)
            # what each agent holds, as the pool converted it (agent ids unique: the pool's agent n is this one)
            occupied = self.pool.occupied_of if len(number) == len(self._agents) else None
            for agent in self._agents:
                n = number.get(agent.id)
                if n is not None and agent.ends:
                    held = convert(agent.occupied, True) if occupied is None else occupied(n)
                    for when, slots in agent.ends:
                        # (no more than the agent holds, in slots its row has: an agent that shrank since its
                        # kernels started has no room to give back beyond what it has; held <= 0: nothing)
                        freed: dict[int, int] = {}
                        for i, k in convert(slots, True).items():
                            if i < width:
                                have = held.get(i, 0)
                                if have < k:
                                    k = have
                                if k > 0:
                                    freed[i] = k
                        found.append((max(0.0, (when - now).total_seconds()), n, freed))
            found.sort(key=_first)
            running = self._running = {}
            for t, n, freed in found:
                at = running.get(t)
                if at is None:
                    running[t] = [(n, freed)]
                else:
                    at.append((n, freed))
            self._running_times = list(running)
        times = self._running_times
        placed = self._placed
        ends = sorted(placed)
        holds: dict[float, list[_Event]] = {}
        for until, kept in sorted(
            ((h.until, kept) for h in self.holds if h.until < INFINITE for kept in h.need), key=_first
        ):
            holds.setdefault(until, []).append((kept, None))
        hold_times = list(holds)
        r = p = h = 0
        n_running, n_ends, n_holds = len(times), len(ends), len(hold_times)
        while r < n_running or p < n_ends or h < n_holds:
            t = INFINITE
            if r < n_running:
                t = times[r]
            if p < n_ends and ends[p] < t:
                t = ends[p]
            if h < n_holds and hold_times[h] < t:
                t = hold_times[h]
            parts = []
            if r < n_running and times[r] == t:
                parts.append(running[times[r]])
                r += 1
            if p < n_ends and ends[p] == t:
                parts.append(placed[ends[p]])
                p += 1
            if h < n_holds and hold_times[h] == t:
                parts.append(holds[hold_times[h]])
                h += 1
            yield t, parts[0] if len(parts) == 1 else [event for part in parts for event in part]

    def _earliest(
        self, free: list[list[int]], kernels: Sequence[Mapping[int, int]], spread: bool, length: float
    ) -> tuple[float | None, dict[int, dict[int, int]] | None]:
        """Sweep the known ends in time order, `free` growing with each (and left as it is at the start found):
        the first time the request fits for `length` without touching another reservation, and where (one agent:
        the lowest-numbered that fits then). (None, None): never, as far as the known ends go."""
        usable = self._usable
        moments = self._moments()
        first = next(moments, None)
        if first is not None and first[0] <= 0.0:  # what ends now (or should have): free at the start already
            for agent, slots in first[1]:
                if slots is not None:
                    row = free[agent]
                    for i, n in slots.items():
                        row[i] += n
            later: Iterator[tuple[float, list[_Event]]] = moments
        else:
            later = itertools.chain([first] if first is not None else [], moments)
        if not spread:
            total: dict[int, int] = {}
            for request in kernels:
                for i, n in request.items():
                    total[i] = total.get(i, 0) + n
            width = len(free[0]) if free else 0
            if any(i >= width for i in total):  # a slot no agent has: never fits
                asked: list[tuple[int, int]] | None = None
            else:
                asked = list(total.items())
            on = self.on
            if asked is not None:
                for agent, row in enumerate(free):  # (as _fits(usable(row, agent, 0.0, length), total))
                    if agent in on:
                        row = usable(row, agent, 0.0, length)
                    for i, n in asked:
                        if row[i] < n:
                            break
                    else:
                        return 0.0, {agent: total}
            for t, changes in later:  # only agents that got room back can newly fit
                if asked is None:
                    for agent, slots in changes:
                        if slots is not None:
                            row = free[agent]
                            for i, n in slots.items():
                                row[i] += n
                    continue
                # agent by agent (the lowest-numbered first): its room grows by what it gets back, then is tried;
                # once one fits, the others' rows are not needed any more (only that agent's row is read after)
                freed: dict[int, list[Mapping[int, int] | None]] = {}
                for agent, slots in changes:
                    got = freed.get(agent)
                    if got is None:
                        freed[agent] = [slots]
                    else:
                        got.append(slots)
                for agent in sorted(freed):
                    row = free[agent]
                    for slots in freed[agent]:
                        if slots is not None:
                            for i, n in slots.items():
                                row[i] += n
                    if agent in on:
                        row = usable(row, agent, t, length)
                    for i, n in asked:
                        if row[i] < n:
                            break
                    else:
                        return t, {agent: total}
            return None, None

        def fitted(t: float) -> dict[int, dict[int, int]] | None:
            return self._spread([usable(row, agent, t, length) for agent, row in enumerate(free)], kernels)

        need = fitted(0.0)
        if need is not None:
            return 0.0, need
        same = all(request == kernels[0] for request in kernels)
        kernel, wanted = kernels[0], len(kernels)
        # kernels alike (the usual multi-node session): count how many each agent could hold, and try a placement
        # only when the count reaches them (a reservation's start may have lowered another agent's since)
        held = [_copies(usable(row, agent, 0.0, length), kernel) for agent, row in enumerate(free)] if same else []
        have = sum(held)
        for t, changes in later:
            for agent, slots in changes:
                if slots is not None:
                    row = free[agent]
                    for i, n in slots.items():
                        row[i] += n
            if same:
                for agent in {agent for agent, _ in changes}:
                    more = _copies(usable(free[agent], agent, t, length), kernel)
                    have += more - held[agent]
                    held[agent] = more
                if have < wanted:
                    continue
            need = fitted(t)
            if need is not None:
                return t, need
        return None, None

    def _one_agent(
        self, free: list[list[int]], kernels: Sequence[Mapping[int, int]]
    ) -> dict[int, dict[int, int]] | None:
        total: dict[int, int] = {}
        for request in kernels:
            for i, n in request.items():
                total[i] = total.get(i, 0) + n
        for agent, row in enumerate(free):
            if _fits(row, total):
                return {agent: total}
        return None

    def _spread(self, free: list[list[int]], kernels: Sequence[Mapping[int, int]]) -> dict[int, dict[int, int]] | None:
        """Each kernel on the first agent with room (the biggest kernels first), or None."""
        left = [row[:] for row in free]
        need: dict[int, dict[int, int]] = {}
        for request in sorted(kernels, key=lambda r: sorted(r.values(), reverse=True), reverse=True):
            for agent, row in enumerate(left):
                if _fits(row, request):
                    for i, n in request.items():
                        row[i] -= n
                    mine = need.setdefault(agent, {})
                    for i, n in request.items():
                        mine[i] = mine.get(i, 0) + n
                    break
            else:
                return None
        return need

    def _drain(self, kernels: Sequence[Mapping[int, int]], spread: bool) -> dict[int, dict[int, int]] | None:
        """The agents to keep for a session no known end makes room for: where it fits once everything on them has
        ended (their capacity, less what other reservations need), preferring the agents with the most free now of
        what it asks for, slot by slot in the resource priority order (then the lowest-numbered)."""
        free = self._free_now()
        total: dict[int, int] = {}
        for request in kernels:
            for i, n in request.items():
                total[i] = total.get(i, 0) + n
        shape = self.pool.shape_of(total)
        capacity = [self._usable(self.pool.capacity_of(n), n, 0.0, INFINITE) for n in range(len(self.pool.ids))]
        width = len(capacity[0]) if capacity else 0
        order = sorted(range(len(capacity)), key=lambda n: tuple(-free[n][i] if i < width else 0 for i in shape))
        ranked = [capacity[n] for n in order]
        need = (self._spread if spread else self._one_agent)(ranked, kernels)
        if need is None:
            return None
        return {order[agent]: request for agent, request in need.items()}
