"""Resource presets' arithmetic (pure): what a keypair may still take and whether each preset fits now, as
Backend.AI's `POST /resource/check-presets` answers it.

What is left to a keypair is the smallest, slot by slot, of what its resource policy, its project's cap and its
domain's cap leave (each: the limit less what the sessions under it hold). A preset is allocatable when what is left
to the keypair covers it and one schedulable agent of the scaling groups considered (the preset's own, when it names
one) has it free. A slot with no limit is unlimited ("Infinity" on the wire); what is left is never below zero.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from bai.common import slots as slotlib
from bai.node.manager.state.preset_records import ResourcePreset

INFINITY = Decimal("Infinity")
ZERO = Decimal(0)
Slots = Mapping[str, Decimal]


@dataclass(frozen=True)
class Limit:
    """A cap, slot by slot; a slot it does not name is unlimited, or 0 where `others_unlimited` is False (a keypair
    policy's `default_for_unspecified` LIMITED)."""

    cap: Slots = field(default_factory=dict)
    others_unlimited: bool = True

    def of(self, slot: str) -> Decimal:
        if slot in self.cap:
            return self.cap[slot]
        return INFINITY if self.others_unlimited else ZERO


@dataclass(frozen=True)
class ScalingGroupFacts:
    """One scaling group: what each of its schedulable agents has free, and what the keypair's user holds in it."""

    free_per_agent: Sequence[Slots]
    using: Slots


@dataclass(frozen=True)
class CheckFacts:
    """What the answer is computed from (gathered by `services/resource_presets.py`)."""

    known: Sequence[str]  # the slot names agents offer (cpu, mem first)
    keypair: Limit
    keypair_using: Slots
    project: Limit
    project_using: Slots
    domain: Limit
    domain_using: Slots
    groups: Mapping[str, ScalingGroupFacts]  # the scaling groups considered, by name
    presets: Sequence[ResourcePreset]


def _all(known: Sequence[str], value: Any) -> dict[str, Decimal]:
    return {slot: value(slot) for slot in known}


def _left(limit: Decimal, using: Decimal) -> Decimal:
    return max(ZERO, limit - using)


def preset_slots(preset: ResourcePreset) -> dict[str, Decimal]:
    return slotlib.from_wire(preset.resource_slots)


def shown(preset: ResourcePreset) -> dict[str, Any]:
    """A preset as `GET /resource/presets` lists it."""
    return {
        "name": preset.name,
        "resource_slots": dict(preset.resource_slots),
        "shared_memory": None if preset.shared_memory is None else str(preset.shared_memory),
        "scaling_group_name": preset.scaling_group,
    }


def check(facts: CheckFacts) -> dict[str, Any]:
    """Backend.AI's answer: keypair_limits / _using / _remaining, group_limits / _using / _remaining (the project),
    scaling_group_remaining, scaling_groups {name: {using, remaining}} and presets [{…, allocatable}]."""
    known = facts.known
    limits = _all(known, facts.keypair.of)
    using = _all(known, lambda s: facts.keypair_using.get(s, ZERO))
    project_limits = _all(known, facts.project.of)
    project_using = _all(known, lambda s: facts.project_using.get(s, ZERO))
    remaining = {
        s: min(
            _left(limits[s], using[s]),
            _left(project_limits[s], project_using[s]),
            _left(facts.domain.of(s), facts.domain_using.get(s, ZERO)),
        )
        for s in known
    }
    per_group: dict[str, dict[str, dict[str, str]]] = {}
    total_free = dict.fromkeys(known, ZERO)
    for name, group in sorted(facts.groups.items()):
        free = dict.fromkeys(known, ZERO)
        for agent in group.free_per_agent:
            for s in known:
                free[s] += max(ZERO, agent.get(s, ZERO))
        for s in known:
            total_free[s] += free[s]
        per_group[name] = {
            "using": slotlib.to_wire(_all(known, lambda s, g=group: g.using.get(s, ZERO))),
            "remaining": slotlib.to_wire({s: min(free[s], remaining[s]) for s in known}),
        }
    presets = []
    for preset in facts.presets:
        wanted = preset_slots(preset)
        groups = [preset.scaling_group] if preset.scaling_group is not None else list(facts.groups)
        agents = [a for g in groups if g in facts.groups for a in facts.groups[g].free_per_agent]
        fits_left = slotlib.fits(wanted, remaining)
        allocatable = fits_left and any(slotlib.fits(wanted, agent) for agent in agents)
        presets.append({**shown(preset), "allocatable": allocatable})
    return {
        "keypair_limits": slotlib.to_wire(limits),
        "keypair_using": slotlib.to_wire(using),
        "keypair_remaining": slotlib.to_wire(remaining),
        "group_limits": slotlib.to_wire(project_limits),
        "group_using": slotlib.to_wire(project_using),
        "group_remaining": slotlib.to_wire({s: _left(project_limits[s], project_using[s]) for s in known}),
        "scaling_group_remaining": slotlib.to_wire({s: min(total_free[s], remaining[s]) for s in known}),
        "scaling_groups": per_group,
        "presets": presets,
    }
