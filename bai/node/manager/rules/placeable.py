"""Whether a session could ever be placed: refused at creation, not left PENDING forever (pure, no I/O).

A request can be placed some day when one agent of its scaling group could hold it with nothing else
running there: every requested slot (times the kernels that share the agent) at most the agent's
total (available) slots, and, where the manager knows the agent's GPUs, the GPU request packs onto
its devices when all of them are free. Agents count while ALIVE, drained ones too (they may be made
schedulable again); LOST and TERMINATED ones do not. A group without any such agent refuses nothing:
agents may join it later, and the session waits with its reason as any other.

What the agents hold now does not matter here: a request that fits a busy agent waits its turn.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from bai.common import slots as slotlib
from bai.common.gpus import pack as gpu_pack
from bai.common.gpus import request_of as gpu_request
from bai.common.problems import Problem

SLUG = "generic-bad-request"
TITLE = "No agent can ever hold the requested resources."
COUNTED_STATUSES = frozenset({"ALIVE"})  # drained agents are ALIVE (not schedulable, for now)


def _fmt(slots: Mapping[str, Decimal]) -> str:
    shown = [f"{name}={slotlib.format_amount(name, v)}" for name, v in sorted(slots.items()) if v]
    return ", ".join(shown) or "no slots"


def _need(request: Mapping[str, Decimal], kernels: int) -> dict[str, Decimal]:
    return {name: amount * kernels for name, amount in request.items() if amount > 0}


def gpus_fit(request: Mapping[str, Decimal], devices: int, kernels: int = 1) -> bool:
    """Whether `kernels` kernels of `request` pack onto `devices` unused GPUs."""
    whole, fraction = gpu_request(dict(request))
    if not whole and not fraction:
        return True
    free = [Decimal(1)] * devices
    for _ in range(kernels):
        taken = gpu_pack(free, whole, fraction)
        if taken is None:
            return False
        for i, amount in taken:
            free[i] -= amount
    return True


def fits_ever(
    request: Mapping[str, Decimal], capacity: Mapping[str, Decimal], devices: int | None = None, kernels: int = 1
) -> bool:
    """Whether an agent of this total capacity (and `devices` GPUs, when known) could hold the request."""
    need = _need(request, kernels)
    if not slotlib.fits(need, capacity):
        return False
    return devices is None or devices <= 0 or gpus_fit(request, devices, kernels)


def _closeness(need: Mapping[str, Decimal], capacity: Mapping[str, Decimal]) -> tuple[int, Decimal, Decimal]:
    """How near an agent comes to holding `need`: slots that fit, then the share of each it has."""
    fitting = sum(1 for name, amount in need.items() if amount <= capacity.get(name, Decimal(0)))
    share = Decimal(0)
    for name, amount in need.items():
        have = capacity.get(name, Decimal(0))
        share += Decimal(1) if have >= amount or have.is_infinite() else have / amount
    total = sum((v for v in capacity.values() if v.is_finite()), Decimal(0))
    return fitting, share, total


def unplaceable(
    request: Mapping[str, Decimal],
    scaling_group: str,
    agents: Iterable[Mapping[str, Any]],
    gpus: Mapping[str, Mapping[str, Any]] | None = None,
    kernels: int = 1,
) -> Problem | None:
    """None when some agent of the group could ever hold the request (or the group has no agent yet),
    else a 400 naming the slots no agent has enough of and the largest agent's slots.

    `request`: one kernel's slots; `kernels`: how many such kernels must share one agent.
    `agents`: rows as the store keeps them (`id`, `scaling_group`, `status`, `slots` in wire form).
    `gpus`: agent id -> {"devices": [...]} for agents whose GPUs the manager knows (the registry's
    agent_gpus); a request for GPUs must pack onto those devices."""
    gpus = gpus or {}
    members = [
        (str(a["id"]), slotlib.from_wire(a.get("slots")))
        for a in agents
        if a.get("scaling_group") == scaling_group and a.get("status") in COUNTED_STATUSES
    ]
    if not members:
        return None

    def devices(agent_id: str) -> int | None:
        known = gpus.get(agent_id)
        return len(known.get("devices") or ()) if known else None

    if any(fits_ever(request, capacity, devices(agent_id), kernels) for agent_id, capacity in members):
        return None
    need = _need(request, kernels)
    best_id, best = max(sorted(members, key=lambda m: m[0]), key=lambda m: _closeness(need, m[1]))  # ties: lowest id
    short = {name: amount for name, amount in need.items() if amount > best.get(name, Decimal(0))}
    per = f" ({kernels} kernels on one agent)" if kernels > 1 else ""
    if short:
        what = _fmt(short)
    else:  # every slot fits, but the GPUs do not pack (whole devices plus a fraction, say)
        gpu_slots = {k: v for k, v in need.items() if k.startswith("cuda.")}
        what = f"{_fmt(gpu_slots)} on {devices(best_id)} GPU(s)"
    largest = "the largest" if len(members) > 1 else "its only agent"
    return Problem(
        SLUG,
        TITLE,
        f"no agent in scaling group {scaling_group} can ever hold {what}{per}: "
        f"{largest}, {best_id}, has {_fmt(best)} in all",
        {
            "scaling_group": scaling_group,
            "requested": slotlib.to_wire(need),
            "short": sorted(short),
            "largest_agent": {"id": best_id, "slots": slotlib.to_wire(best)},
        },
    )


def unplaceable_spread(
    request: Mapping[str, Decimal],
    scaling_group: str,
    agents: Iterable[Mapping[str, Any]],
    gpus: Mapping[str, Mapping[str, Any]] | None = None,
    kernels: int = 2,
) -> Problem | None:
    """A multi-node session of `kernels` kernels of `request` each: None when the group's agents, all empty,
    could hold them together (each kernel on some agent, several on one agent where it has room), else a 400
    naming how many kernels they could hold and each agent's share. A group without agents refuses nothing."""
    agents = list(agents)
    one = unplaceable(request, scaling_group, agents, gpus, 1)
    if one is not None:
        return one  # not even one kernel fits anywhere: that reason says why
    gpus = gpus or {}
    held: list[tuple[str, int]] = []
    for a in agents:
        if a.get("scaling_group") != scaling_group or a.get("status") not in COUNTED_STATUSES:
            continue
        capacity = slotlib.from_wire(a.get("slots"))
        known = gpus.get(str(a["id"]))
        devices = len(known.get("devices") or ()) if known else None
        n = 0
        while n < kernels and fits_ever(request, capacity, devices, n + 1):
            n += 1
        held.append((str(a["id"]), n))
    if not held or sum(n for _, n in held) >= kernels:
        return None
    total = sum(n for _, n in held)
    shares = ", ".join(f"{agent_id}: {n}" for agent_id, n in sorted(held))
    return Problem(
        SLUG,
        TITLE,
        f"a multi-node session of {kernels} kernels of {_fmt(request)} each needs room for {kernels} kernels; "
        f"the agents of scaling group {scaling_group} can hold {total} at most ({shares})",
        {
            "scaling_group": scaling_group,
            "requested": slotlib.to_wire(_need(request, 1)),
            "kernels": kernels,
            "holdable": {agent_id: n for agent_id, n in held},
        },
    )
