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

import math
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from .selection import AgentPool, SlotTable
from .snapshot import AgentState, Reservation

__all__ = ["Backfill", "INFINITE"]

INFINITE = math.inf  # the end of a session of unknown duration


class Hold:
    """One reservation: from `start` (seconds from now) on, `need[agent]` of each of its agents; `spare[agent]` is
    what that agent has beyond it at `start` (less what later sessions took that outlast `start`)."""

    __slots__ = ("session_id", "start", "need", "spare")

    def __init__(self, session_id: str, start: float, need: dict[int, dict[int, int]]) -> None:
        self.session_id = session_id
        self.start = start
        self.need = need
        self.spare: dict[int, list[int]] = {}


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
        number = pool.numbers
        self.ends: list[list[tuple[float, dict[int, int]]]] = [[] for _ in pool.ids]
        for agent in agents:
            n = number.get(agent.id)
            if n is None:
                continue
            for when, slots in agent.ends:
                self.ends[n].append((max(0.0, (when - now).total_seconds()), table.convert(slots, True)))
        self.holds: list[Hold] = []
        self.on: dict[int, list[Hold]] = {}  # agent -> its holds
        self.actual: dict[int, list[int]] = {}  # agent -> what it has free now (agents of holds: the pool has less)

    @property
    def wants_more(self) -> bool:
        return len(self.holds) < self.depth

    # -- sessions placed now -----------------------------------------------------------------------------------

    def placed(self, agent: int, slots: Mapping[int, int], end: float) -> None:
        """A session took `slots` of `agent` until `end` (the pool's room already moved, or not: see `short_fit`)."""
        if end < INFINITE:
            self.ends[agent].append((end, dict(slots)))
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
        if end == INFINITE:
            return None
        for agent, holds in self.on.items():
            if all(end <= hold.start for hold in holds) and _fits(self.actual[agent], slots):
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
        """What each agent has free now, less what the reservations already made need (conservatively: as if
        they held it from now on)."""
        free = [self.actual[n][:] if n in self.actual else self.pool.remaining(n) for n in range(len(self.pool.ids))]
        for hold in self.holds:
            for agent, need in hold.need.items():
                row = free[agent]
                for i, n in need.items():
                    row[i] -= n
        return free

    def reserve(self, session_id: str, kernels: Sequence[Mapping[int, int]], spread: bool) -> Reservation | None:
        """Make a reservation for a session that cannot start now (its kernels' requests; `spread`: each kernel on
        any agent, else all on one): the earliest time and agents, kept from then on. None when no agent of the
        group could ever hold it."""
        if not self.wants_more or not kernels or not self.pool.ids:
            return None
        free = self._free_now()
        events = sorted((t, agent, slots) for agent, ends in enumerate(self.ends) for t, slots in ends)
        place = self._spread if spread else self._one_agent
        start: float | None = None
        need = place(free, kernels)
        if need is not None:
            start = 0.0
        else:
            for t, agent, slots in events:
                row = free[agent]
                for i, n in slots.items():
                    row[i] += n
                need = place(free, kernels)
                if need is not None:
                    start = t
                    break
        if need is None:  # no known end makes room: keep the agents that could hold it, once theirs end
            need = self._drain(kernels, spread)
            if need is None:
                return None
        hold = Hold(session_id, 0.0 if start is None else start, need)
        now_free = self._free_now() if start is None else free
        for agent, request in need.items():
            if agent not in self.actual:
                self.actual[agent] = self.pool.remaining(agent)
            at_start = now_free[agent]
            hold.spare[agent] = [at_start[i] - request.get(i, 0) for i in range(len(at_start))]
            self.on.setdefault(agent, []).append(hold)
        self.holds.append(hold)
        for agent in need:
            self._sync(agent)
        when = None if start is None else self.now + timedelta(seconds=start)
        return Reservation(when, tuple(self.pool.ids[agent] for agent in sorted(need)))

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
        ended (their capacity), preferring those with the most free now."""
        capacity = [self.pool.capacity_of(n) for n in range(len(self.pool.ids))]
        free = self._free_now()
        order = sorted(range(len(capacity)), key=lambda n: -sum(free[n]))
        ranked = [capacity[n] for n in order]
        need = (self._spread if spread else self._one_agent)(ranked, kernels)
        if need is None:
            return None
        return {order[agent]: request for agent, request in need.items()}
