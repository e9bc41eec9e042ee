"""Resource presets (Backend.AI's): named resource slots that sessions are created with, listed to everyone, made,
changed and removed by superadmins, and checked against what is free now (`POST /resource/check-presets`; the
arithmetic is `rules/presets.py`).

Every input is read here, in one way for REST, GraphQL and the CLI: a name (1-64 characters of letters, digits and
`.-_`), slots as a policy's are (known slot names only: what some agent offers), shared memory a size, a scaling
group one that exists. Anything else is a 400 that names it; nothing is stored then.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from decimal import Decimal
from typing import Any, Protocol

from bai.common import slots as slotlib
from bai.common.clock import Clock
from bai.common.problems import Problem, invalid
from bai.node.manager.rules import access
from bai.node.manager.rules import presets as rules
from bai.node.manager.rules.access import Actor
from bai.node.manager.services.accounts import Accounts
from bai.node.manager.services.agent_registry import Agents
from bai.node.manager.services.dispatcher import QUOTA_STATUSES  # (what counts against a keypair, as scheduled)
from bai.node.manager.services.teams import Teams, forbidden, slot_amounts
from bai.node.manager.state.preset_records import ResourcePreset
from bai.node.manager.state.protocols import PresetState, SessionReadState
from bai.node.manager.state.records import Agent, stamp

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
MAX_PRESETS = 1000  # presets there may be (each check reads them all)
FIELDS = ("name", "resource_slots", "shared_memory", "scaling_group_name", "scaling_group")


def not_found(name: str) -> Problem:
    return Problem("object-not-found", "No such resource preset.", f"there is no resource preset {name!r}", None, 404)


class PresetsState(PresetState, SessionReadState, Protocol):
    """What presets read and write: the presets, and the sessions that hold slots now."""

    async def project_usage(self, statuses: Iterable[str]) -> dict[str, tuple[int, list[dict[str, str]]]]: ...


class ResourcePresets:
    def __init__(
        self,
        state: PresetsState,
        accounts: Accounts,
        teams: Teams,
        agents: Agents,
        config_groups: Collection[str],
        clock: Clock,
    ) -> None:
        self.state = state
        self.accounts = accounts
        self.teams = teams
        self.agents = agents
        self.config_groups = config_groups  # the scaling groups of the configuration
        self.clock = clock

    async def _agents_and_groups(self) -> tuple[list[Agent], list[str]]:
        """The agents' rows, and every scaling group: stored, the configuration's and those agents registered with."""
        rows = await self.agents.rows()
        return rows, self.teams.scaling_group_names({*self.config_groups, *(a.scaling_group for a in rows)})

    # -- reading what a client gives ------------------------------------------------------------------------

    def known_slots(self) -> list[str]:
        """The slot names some agent offers, cpu and mem first."""
        return ["cpu", "mem", *sorted(self.agents.known_slots - {"cpu", "mem"})]

    def _name(self, value: Any, what: str = "name") -> str:
        if not isinstance(value, str) or not NAME.fullmatch(value):
            raise invalid(f"{what} must be 1-64 letters, digits, '.', '-' or '_', starting with a letter or digit")
        return value

    def _slots(self, value: Any) -> dict[str, str]:
        slots = slot_amounts(value, "resource_slots")
        known = set(self.known_slots())
        unknown = sorted(set(slots) - known)
        if unknown:
            raise invalid(f"resource_slots: unknown slot {unknown[0]!r} (known: {', '.join(sorted(known))})")
        if not any(Decimal(v) > 0 for v in slots.values()):
            raise invalid('resource_slots must give some slot an amount ({"cpu": "1", "mem": "1g"})')
        if any(Decimal(v).is_infinite() for v in slots.values()):
            raise invalid("resource_slots: a preset's amounts are finite")
        return slots

    def _shared_memory(self, value: Any) -> int | None:
        if value is None or value == "":
            return None
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise invalid('shared_memory must be a size ("64m", "1g" or bytes)')
        try:
            amount = slotlib.parse_bytes(value)
        except slotlib.SlotError as e:
            raise invalid(f"shared_memory: {e}") from None
        if amount.is_infinite() or amount >= 2**62:
            raise invalid("shared_memory is too large")
        return int(amount)

    async def _scaling_group(self, value: Any) -> str | None:
        if value is None or value == "":
            return None
        name = self._name(value, "scaling_group_name")
        if name not in (await self._agents_and_groups())[1]:
            raise invalid(f"scaling_group_name: there is no scaling group {name!r}")
        return name

    def _props(self, props: Any) -> dict[str, Any]:
        if not isinstance(props, dict):
            raise invalid("the preset's properties must be an object")
        unknown = sorted(str(k)[:40] for k in props if k not in FIELDS)
        if unknown:
            raise invalid(f"a resource preset has no field {unknown[0]!r} (fields: {', '.join(FIELDS)})")
        return props

    # -- the presets ----------------------------------------------------------------------------------------

    async def list(self) -> list[ResourcePreset]:
        return await self.state.resource_presets()

    async def get(self, name: Any) -> ResourcePreset:
        name = self._name(name)
        found = next((p for p in await self.list() if p.name == name), None)
        if found is None:
            raise not_found(name)
        return found

    def _superadmin(self, actor: Actor) -> None:
        if not actor.is_superadmin:
            raise forbidden("only superadmins make, change and remove resource presets")

    async def create(self, actor: Actor, name: Any, props: Any) -> ResourcePreset:
        self._superadmin(actor)
        props = self._props(props)
        preset = ResourcePreset(
            name=self._name(name),
            resource_slots=self._slots(props.get("resource_slots")),
            shared_memory=self._shared_memory(props.get("shared_memory")),
            scaling_group=await self._scaling_group(props.get("scaling_group_name", props.get("scaling_group"))),
            created_at=stamp(self.clock.now()),
        )
        if len(await self.list()) >= MAX_PRESETS:
            raise invalid(f"there are {MAX_PRESETS} resource presets already: remove one first")
        if not await self.state.create_resource_preset(preset):
            raise Problem("conflict", "Conflict.", f"there is a resource preset {preset.name!r} already", None, 409)
        return preset

    async def modify(self, actor: Actor, name: Any, props: Any) -> ResourcePreset:
        self._superadmin(actor)
        props = self._props(props)
        old = await self.get(name)
        fields: dict[str, Any] = {}
        if props.get("name") not in (None, ""):
            fields["name"] = self._name(props["name"])
        if props.get("resource_slots") not in (None, ""):
            fields["resource_slots"] = self._slots(props["resource_slots"])
        if "shared_memory" in props:
            fields["shared_memory"] = self._shared_memory(props["shared_memory"])
        for key in ("scaling_group_name", "scaling_group"):
            if key in props:
                fields["scaling_group"] = await self._scaling_group(props[key])
        new = ResourcePreset(**{**{f: getattr(old, f) for f in old.__struct_fields__}, **fields})
        if not await self.state.replace_resource_preset(old.name, new):
            if new.name != old.name:
                raise Problem("conflict", "Conflict.", f"there is a resource preset {new.name!r} already", None, 409)
            raise not_found(old.name)
        return new

    async def delete(self, actor: Actor, name: Any) -> ResourcePreset:
        self._superadmin(actor)
        old = await self.get(name)
        if not await self.state.delete_resource_preset(old.name):
            raise not_found(old.name)
        return old

    # -- whether they fit now -------------------------------------------------------------------------------

    async def check(self, actor: Actor, group: Any = None, scaling_group: Any = None) -> dict[str, Any]:
        """Backend.AI's check-presets answer for the actor's keypair in a project (`group`: a name or id; its default
        project when None) and one scaling group (None: every one open to it there)."""
        if group is not None and not isinstance(group, str):
            raise invalid("group must be a project's name or id")
        if scaling_group is not None and not isinstance(scaling_group, str):
            raise invalid("scaling_group must be a scaling group's name")
        directory = self.teams.directory
        project = access.project_for(directory, actor, None, group or None)
        rows, names = await self._agents_and_groups()
        open_groups = access.usable_scaling_groups(directory, names, project.domain_name, project.id, actor.access_key)
        if scaling_group:
            if scaling_group not in open_groups:
                raise invalid(f"scaling_group: {scaling_group[:80]!r} is not a scaling group open to you here")
            open_groups = [scaling_group]
        keypair = await self.accounts.keypair(actor.access_key)
        policy = await self.accounts.policy((keypair.resource_policy if keypair else "") or "default")
        held = await self.state.list_sessions(actor.access_key, QUOTA_STATUSES)
        using: dict[str, Decimal] = {}
        using_in: dict[str, dict[str, Decimal]] = {}
        for session in held:
            slots = slotlib.from_wire(session.requested_slots)
            using = slotlib.add(using, slots)
            using_in[session.scaling_group] = slotlib.add(using_in.get(session.scaling_group, {}), slots)
        project_using: dict[str, Decimal] = {}
        domain_using: dict[str, Decimal] = {}
        for pid, (_count, kernels) in (await self.state.project_usage(QUOTA_STATUSES)).items():
            owner = directory.projects.get(pid)
            for kernel_slots in kernels:
                amounts = slotlib.from_wire(kernel_slots)
                if pid == project.id:
                    project_using = slotlib.add(project_using, amounts)
                if owner is not None and owner.domain_name == project.domain_name:
                    domain_using = slotlib.add(domain_using, amounts)
        domain = directory.domains.get(project.domain_name)
        occupied = await self.agents.occupied_by_agent()
        connected = self.agents.connected()
        free: dict[str, list[dict[str, Decimal]]] = {g: [] for g in open_groups}
        for a in rows:
            usable = a.id in connected and a.status == "ALIVE" and self.agents.record(a.id).schedulable
            if usable and a.scaling_group in free:
                free[a.scaling_group].append(slotlib.sub(slotlib.from_wire(a.slots), occupied.get(a.id, {})))
        facts = rules.CheckFacts(
            known=self.known_slots(),
            keypair=rules.Limit(
                slotlib.from_wire(policy.total_resource_slots if policy else None),
                ((policy.default_for_unspecified if policy else "") or "UNLIMITED") == "UNLIMITED",
            ),
            keypair_using=using,
            project=rules.Limit(access.project_cap(directory, project)),
            project_using=project_using,
            domain=rules.Limit(
                slotlib.parse_slots(domain.total_resource_slots) if domain and domain.total_resource_slots else {}
            ),
            domain_using=domain_using,
            groups={g: rules.ScalingGroupFacts(free[g], using_in.get(g, {})) for g in open_groups},
            presets=[p for p in await self.list() if p.scaling_group is None or p.scaling_group in open_groups],
        )
        return rules.check(facts)
