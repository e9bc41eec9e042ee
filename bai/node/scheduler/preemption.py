"""Preemption: which running sessions a session that finds no room may stop. Pure: no I/O, no clock.

Backend.AI's rules (its preemption design), per scaling group with `preemption` on:

* A running session is a candidate for a pending session S when it is preemptible (its owner's choice, on by
  default), its priority is at most the group's `preemptible_priority` and strictly lower than S's (equal
  priorities never preempt each other), and it has run `preemption_min_runtime` seconds at least.
* Only whole satisfaction: victims are chosen only when stopping them makes S fit; otherwise nobody is stopped.
* Per agent, candidates are taken lowest priority first, ties by start (`preemption_order`: oldest or newest
  first), until S fits; then those not needed after all are handed back (highest priority first). The agent with
  the fewest victims wins, then the fewest of several kernels (stopping one stops all its kernels), then the
  lowest priorities. A session of several kernels on several agents (multi-node) is planned kernel by kernel,
  each kernel on what is free or freed so far.
* A victim already being stopped for S counts for S at no cost (the next rounds find the same plan and stop
  nobody more) and for no other session; a victim chosen in a round is not counted for a second session.
* Only the front of the queue preempts: the first PREEMPTION_DEPTH (4) blocked sessions of a round, in queue
  order, that have someone to stop (and those whose stops are under way).

Preemption never helps a session its own limits hold back: the predicates (its keypair's, project's or domain's
caps) fail before room is looked for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from .selection import AgentPool, SlotTable
from .snapshot import NEWEST, PRIORITY_MAX, PendingSession, RunningSession, ScalingGroup

__all__ = ["PREEMPTION_DEPTH", "Plan", "Preemption"]

# how many blocked sessions of a round, in queue order, may look for sessions to stop (those whose stops are under
# way always keep their plan): the front of the queue, as Backend.AI's design has it; a round of a long queue of
# high-priority sessions does not look at every agent for each
PREEMPTION_DEPTH = 4


@dataclass(frozen=True, slots=True)
class Plan:
    """What stopping makes a pending session fit: every victim (those under way included), those new this round,
    and the agents its kernels would go to."""

    victims: tuple[RunningSession, ...]
    new: tuple[RunningSession, ...]
    agents: tuple[int, ...]  # agent numbers, in kernel order (one per kernel; repeated for one agent)


class Preemption:
    """The candidates of one scaling group for one round, and who has been claimed so far."""

    def __init__(
        self, group: ScalingGroup, running: Sequence[RunningSession], pool: AgentPool, table: SlotTable, now: datetime
    ) -> None:
        self.group = group
        self.pool = pool
        newest = group.preemption_order == NEWEST
        self.on: dict[int, list[RunningSession]] = {}  # agent number -> the candidates holding slots there
        self.held: dict[str, dict[int, dict[int, int]]] = {}  # session id -> agent number -> what it holds there
        self.claimed: dict[str, str] = {}  # victim id -> the pending session it is stopped for
        self._lowest: int | None = None
        self.tries = 0  # sessions that looked for sessions to stop this round (see PREEMPTION_DEPTH)
        numbers = pool.numbers
        for r in running:
            if r.scaling_group != group.name:
                continue
            if r.preempting_for is not None:
                self.claimed[r.id] = r.preempting_for
            elif not (
                r.preemptible
                and r.priority <= group.preemptible_priority
                and (now - r.started_at).total_seconds() >= group.preemption_min_runtime
            ):
                continue
            held: dict[int, dict[int, int]] = {}
            for agent_id, slots in r.held:
                agent = numbers.get(agent_id)
                if agent is not None:
                    mine = held.setdefault(agent, {})
                    for i, n in table.convert(slots, positive_only=True).items():
                        mine[i] = mine.get(i, 0) + n
            if not held:
                continue
            self.held[r.id] = held
            for agent in held:
                self.on.setdefault(agent, []).append(r)
        sign = -1 if newest else 1

        def order(r: RunningSession) -> tuple[int, float, str]:
            return (r.priority, sign * r.started_at.timestamp(), r.id)

        for victims in self.on.values():
            victims.sort(key=order)

    def __bool__(self) -> bool:
        return bool(self.held)

    def plan(self, session: PendingSession, requests: Sequence[Mapping[int, int]], spread: bool) -> Plan | None:
        """The victims that make `session` fit (its kernels' requests, `spread` over agents for multi-node, else
        summed on one agent), claimed for it; None (nothing claimed) when no choice makes it fit."""
        if not spread:
            summed: dict[int, int] = {}
            for request in requests:
                for i, n in request.items():
                    summed[i] = summed.get(i, 0) + n
            requests = [summed]
        if self._lowest is None:  # the lowest priority of those not claimed yet (recounted after each claim)
            self._lowest = min(
                (r.priority for victims in self.on.values() for r in victims if r.id not in self.claimed),
                default=PRIORITY_MAX + 1,
            )
        under_way = session.id in self.claimed.values()
        if not under_way:
            if session.priority <= self._lowest:
                return None  # nobody it may stop
            if self.tries >= PREEMPTION_DEPTH:
                return None  # (the front of the queue only)
            self.tries += 1
        free: dict[int, list[int]] = {}

        def room_of(agent: int) -> list[int]:
            room = free.get(agent)
            if room is None:
                room = free[agent] = list(self.pool.remaining(agent))
            return room

        chosen: dict[str, RunningSession] = {}
        agents: list[int] = []
        for request in requests:
            best: tuple[tuple[int, int, int, int], int, list[RunningSession]] | None = None
            # where it would fit without stopping anyone (a kernel of a multi-node session: where stops of its
            # other kernels made room, or room there was) and where candidates are
            where = sorted({*free, *self.on} if not spread else range(len(self.pool)))
            for agent in where:
                room = room_of(agent)
                if _fits(room, request):
                    cost = (0, 0, 0, agent)
                    victims: list[RunningSession] = []
                else:
                    found = self._victims(session, agent, room, request, chosen)
                    if found is None:
                        continue
                    victims = found
                    new = [v for v in victims if self.claimed.get(v.id) != session.id]
                    cost = (len(new), sum(len(self.held[v.id]) > 1 for v in new), sum(v.priority for v in new), agent)
                if best is None or cost < best[0]:
                    best = (cost, agent, victims)
                    if cost[0] == 0 and not victims:
                        break
            if best is None:
                return None
            _, agent, victims = best
            for victim in victims:  # all of its kernels stop: their room comes back wherever they are
                chosen[victim.id] = victim
                for at, slots in self.held[victim.id].items():
                    _add(room_of(at), slots)
            room = room_of(agent)
            for i, n in request.items():
                room[i] -= n
            agents.append(agent)
        if not chosen:
            return None  # (it fits without stopping anyone: not a case for preemption)
        for victim_id in chosen:
            self.claimed[victim_id] = session.id
        self._lowest = None
        victims_all = tuple(chosen.values())
        new_ones = tuple(v for v in victims_all if v.preempting_for != session.id)
        return Plan(victims_all, new_ones, tuple(agents))

    def _victims(
        self,
        session: PendingSession,
        agent: int,
        room: list[int],
        request: Mapping[int, int],
        chosen: Mapping[str, RunningSession],
    ) -> list[RunningSession] | None:
        """The fewest candidates on `agent` whose stop makes `request` fit there (those under way for `session`
        first), or None."""
        held = self.held
        free = list(room)
        taken: list[RunningSession] = []
        candidates = [
            r
            for r in self.on.get(agent, ())
            if r.id not in chosen
            and (
                self.claimed.get(r.id) == session.id
                or (r.id not in self.claimed and r.preempting_for is None and r.priority < session.priority)
            )
        ]
        candidates.sort(key=lambda r: self.claimed.get(r.id) != session.id)  # (stable: the order above kept)
        for r in candidates:
            taken.append(r)
            _add(free, held[r.id][agent])
            if _fits(free, request):
                break
        else:
            return None
        # hand back those not needed after all: the highest priority first (those under way for it are kept)
        for r in sorted(taken[:-1], key=lambda r: -r.priority):
            if self.claimed.get(r.id) == session.id:
                continue
            without = list(free)
            for i, n in held[r.id][agent].items():
                if i < len(without):
                    without[i] -= n
            if _fits(without, request):
                taken.remove(r)
                free = without
        return taken


def _fits(free: Sequence[int], request: Mapping[int, int]) -> bool:
    width = len(free)
    for i, n in request.items():
        if n > 0 and (i >= width or free[i] < n):
            return False
    return True


def _add(free: list[int], slots: Mapping[int, int]) -> None:
    width = len(free)
    for i, n in slots.items():
        if i < width:  # (a slot no agent of the group has: nothing to fit in it)
            free[i] += n
