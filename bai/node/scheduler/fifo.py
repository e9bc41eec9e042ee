"""First-in first-out scheduling with dispersed agent choice: pure, no I/O, no clock.

A session that cannot be placed gets its reason and never blocks the sessions behind it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal

from bai.common import slots as slotlib
from bai.common.status import StatusInfo


@dataclass(frozen=True)
class PendingSession:
    id: str
    requested: dict[str, Decimal]  # per kernel
    kernel_ids: tuple[str, ...]
    scaling_group: str = "default"


@dataclass
class AgentState:
    id: str
    capacity: dict[str, Decimal]
    occupied: dict[str, Decimal]
    scaling_group: str = "default"
    schedulable: bool = True

    @property
    def free(self) -> dict[str, Decimal]:
        return slotlib.sub(self.capacity, self.occupied)


@dataclass(frozen=True)
class Placement:
    session_id: str
    agent_id: str  # single-node: every kernel of the session on this agent


@dataclass(frozen=True)
class Unschedulable:
    session_id: str
    status_info: str
    msg: str


@dataclass
class Decisions:
    placements: list[Placement] = field(default_factory=list)
    unschedulable: list[Unschedulable] = field(default_factory=list)


def _pick_agent(request: dict[str, Decimal], agents: list[AgentState]) -> AgentState | None:
    """Dispersed: among agents that fit, the one with the most free room (cpu, then mem)."""
    best, best_key = None, None
    for agent in agents:
        free = agent.free
        if not slotlib.fits(request, free):
            continue
        key = (free.get("cpu", Decimal(0)), free.get("mem", Decimal(0)), agent.id)
        if best_key is None or key > best_key:
            best, best_key = agent, key
    return best


def schedule(pending: list[PendingSession], agents: list[AgentState]) -> Decisions:
    """Place pending sessions in queue order; explain every session left pending."""
    decisions = Decisions()
    for session in pending:
        candidates = [a for a in agents if a.schedulable and a.scaling_group == session.scaling_group]
        total = {k: v * len(session.kernel_ids) for k, v in session.requested.items()}
        if not candidates:
            decisions.unschedulable.append(
                Unschedulable(
                    session.id,
                    StatusInfo.NO_AVAILABLE_INSTANCES,
                    f"no agent is alive in scaling group {session.scaling_group!r}",
                )
            )
            continue
        agent = _pick_agent(total, candidates)
        if agent is None:
            roomiest = max(candidates, key=lambda a: (a.free.get("cpu", 0), a.free.get("mem", 0)))
            detail = "; ".join(slotlib.shortfall(total, roomiest.free))
            decisions.unschedulable.append(
                Unschedulable(
                    session.id,
                    StatusInfo.NO_AVAILABLE_INSTANCES,
                    f"no agent has room for the session (best: {roomiest.id}: {detail})",
                )
            )
            continue
        agent.occupied = slotlib.add(agent.occupied, total)
        decisions.placements.append(Placement(session.id, agent.id))
    return decisions
