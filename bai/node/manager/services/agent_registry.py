"""The agents the manager knows: one record each (what the database row does not hold: backend, GPUs,
images, schedulability, the vfolder hosts it shares with us), their capacity, and the calls that go to
one agent about images.

The state keeps who registered and when they were last heard (`AgentState.upsert_agent`, `touch_agent`);
this service keeps what lives only while an agent is connected, and answers the capacity questions of
the dispatcher, the API and the dashboard.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgspec

from bai.common import slots as slotlib
from bai.common.clock import Clock
from bai.common.gpus import pack as gpu_pack
from bai.common.gpus import request_of as gpu_request
from bai.common.status import OCCUPYING_STATUSES
from bai.node.link.base import ManagerLink
from bai.node.link.messages import (
    GpuDevice,
    GpuLive,
    Heartbeat,
    ImageInfo,
    ListImages,
    PullImage,
    Registration,
    RegistryAuth,
    RemoveImage,
    call,
)
from bai.node.manager.services.diskfull import FullDiskWarnings
from bai.node.manager.services.hubs import EventHub
from bai.node.manager.services.wakeup import Wakeup
from bai.node.manager.state import Store
from bai.node.manager.state.protocols import AgentState
from bai.node.manager.state.records import Agent, NewAgent

log = logging.getLogger("bai.manager.agents")
PULL_TIMEOUT = 900.0  # seconds an image pull may take


@dataclass
class AgentRecord:
    """One connected (or once connected) agent, as it last described itself."""

    id: str
    backend: str = ""
    slots: dict[str, str] = field(default_factory=dict)  # its capacity, as registered (wire form)
    vfolder_hosts: frozenset[str] = frozenset()  # vfolder hosts it sees at the same paths as we do
    gpus: list[GpuDevice] = field(default_factory=list)  # its devices, as registered
    gpu_live: list[GpuLive] = field(default_factory=list)  # from its last heartbeat
    images: frozenset[str] = frozenset()  # image names it has
    schedulable: bool = True  # False while drained (its heartbeats say)
    warm: dict[str, int] = field(default_factory=dict)  # image -> warm kernels ready (its warm pool)


class Agents:
    """The manager's view of its agents (records, capacity, images) and their image calls."""

    def __init__(
        self,
        store: Store,
        link: ManagerLink,
        changes: EventHub[dict[str, Any]],
        wake: Wakeup,
        clock: Clock | None = None,
    ) -> None:
        self.store = store  # (the kernels' rows: what they occupy)
        self.state: AgentState = store
        self.clock = clock or Clock()
        self.link = link
        self.changes = changes
        self.wake = wake
        self.records: dict[str, AgentRecord] = {}
        self._image_labels: dict[str, dict[str, str]] = {}  # image name -> labels, from the agents
        self.known_slots: set[str] = {"cpu", "mem"}  # slot names some agent has offered
        self.full_disk = FullDiskWarnings(log)

    # -- what agents tell us --------------------------------------------------------------------------

    async def joined(self, agent_id: str, registration: Registration, our_hosts: Mapping[str, Path]) -> AgentRecord:
        """Record a (re-)registering agent; `our_hosts`: the manager's vfolder hosts and their paths."""
        agent = NewAgent(
            agent_id,
            registration.hostname,
            registration.backend,
            registration.version,
            registration.scaling_group,
            dict(registration.slots),
        )
        await self.state.upsert_agent(agent, self.clock.now())
        seen = registration.vfolder_hosts
        images = registration.images
        record = AgentRecord(
            id=agent_id,
            backend=registration.backend,
            slots=dict(registration.slots),
            vfolder_hosts=frozenset(h for h, path in our_hosts.items() if seen.get(h) == str(path)),
            gpus=list(registration.gpus),
            images=frozenset(i.name for i in images),
            schedulable=self.records[agent_id].schedulable if agent_id in self.records else True,
            warm=dict(registration.warm),
        )
        self.records[agent_id] = record
        self.known_slots.update(record.slots)
        for image in images:
            self.learn_labels(image.name, image.labels or {})
        self.changes.publish("agent_joined", {"id": agent_id})
        return record

    async def left(self, agent_id: str, reason: str) -> None:
        """The agent went away: `lost` (no heartbeat) or said goodbye."""
        await self.state.set_agent_status(agent_id, "LOST" if reason == "lost" else "TERMINATED", self.clock.now())
        self.changes.publish("agent_lost" if reason == "lost" else "agent_terminated", {"id": agent_id})
        self.wake()

    async def heartbeat(self, agent_id: str, beat: Heartbeat) -> None:
        await self.full_disk.attempt("heartbeats", self.state.touch_agent(agent_id, self.clock.now()))
        record = self.records.get(agent_id)
        if record is not None:
            if record.gpus and beat.gpus is not None:
                record.gpu_live = list(beat.gpus)
            if beat.warm is not None:
                record.warm = dict(beat.warm)
            schedulable = bool(beat.schedulable)
            if record.schedulable != schedulable:
                record.schedulable = schedulable
                log.warning("agent %s is %s", agent_id, "schedulable again" if schedulable else "drained")
                self.wake()
        self.changes.publish("agent_heartbeat", {"id": agent_id})

    # -- questions -------------------------------------------------------------------------------------

    def connected(self) -> set[str]:
        """Ids of the agents connected now."""
        return set(self.link.connected())

    def record(self, agent_id: str) -> AgentRecord:
        """The agent's record (an empty one for an agent not heard from since the manager started)."""
        return self.records.get(agent_id) or AgentRecord(agent_id)

    async def rows(self) -> list[Agent]:
        """Every agent that registered (id, hostname, backend, version, scaling_group, status, slots, …)."""
        return await self.state.agents()

    def docker_agents(self) -> list[str]:
        """Connected agents that run Docker kernels (those that hold images), sorted."""
        return sorted(a for a in self.connected() if self.record(a).backend == "docker")

    def only_docker_connected(self) -> bool:
        """Whether some agent is connected and every connected one runs Docker kernels (answered at the
        first agent that is not: each create asks, and a manager may have thousands)."""
        connected = self.link.connected()
        records = self.records
        for agent_id in connected:
            record = records.get(agent_id)
            if record is None or record.backend != "docker":
                return False
        return bool(connected)

    async def occupied_by_agent(self) -> dict[str, dict[str, Decimal]]:
        """What the kernels on each agent occupy."""
        occupied: dict[str, dict[str, Decimal]] = {}
        for k in await self.store.kernels_where([s.value for s in OCCUPYING_STATUSES]):
            if k.agent_id:
                occupied[k.agent_id] = slotlib.add(occupied.get(k.agent_id, {}), slotlib.from_wire(k.occupied_slots))
        return occupied

    def gpu_devices(self) -> dict[str, dict[str, Any]]:
        """Agent id -> {"devices": [...], "live": [...]} (plain values, as the agents sent them: what the API
        shows and the placement rules read), for agents with GPUs."""
        return {
            a: {"devices": msgspec.to_builtins(r.gpus), "live": msgspec.to_builtins(r.gpu_live)}
            for a, r in self.records.items()
            if r.gpus
        }

    async def gpu_free_by_agent(self) -> dict[str, tuple[Decimal, ...]]:
        """What each GPU of each agent has left (1 = unused), from the devices kernels hold; a kernel
        still starting (no devices recorded yet) is counted where it will most likely land."""
        gpus = {a: r.gpus for a, r in self.records.items() if r.gpus}
        if not gpus:
            return {}
        free = {a: [Decimal(1)] * len(devices) for a, devices in gpus.items()}
        index = {a: {d.uuid: i for i, d in enumerate(devices)} for a, devices in gpus.items()}
        starting = []
        for k in await self.store.kernels_where([s.value for s in OCCUPYING_STATUSES]):
            agent = k.agent_id
            if agent is None or agent not in free:
                continue
            if k.devices:
                for uuid, amount in k.devices:
                    if uuid in index[agent]:
                        free[agent][index[agent][uuid]] -= Decimal(amount)
            else:
                starting.append((agent, k))
        for agent, k in starting:
            taken = gpu_pack(free[agent], *gpu_request(slotlib.from_wire(k.occupied_slots)))
            for i, amount in taken or []:
                free[agent][i] -= amount
        return {a: tuple(f) for a, f in free.items()}

    # -- images ----------------------------------------------------------------------------------------

    async def pull_image(self, agent_id: str, image: str, auth: RegistryAuth | None) -> ImageInfo:
        """Have one agent pull `image` (`auth`: the registry's credentials, for this pull only)."""
        return await call(self.link, agent_id, PullImage(image, auth), timeout=PULL_TIMEOUT)

    async def remove_image(self, agent_id: str, image: str) -> None:
        await call(self.link, agent_id, RemoveImage(image), timeout=120)

    async def images_of(self, agent_id: str) -> list[ImageInfo]:
        """The images one agent has now."""
        return await call(self.link, agent_id, ListImages(), timeout=30)

    def learn_labels(self, image: str, labels: dict[str, str]) -> None:
        """Some agent has `image`, with these labels (a registration, a listing, a pull, a commit)."""
        self._image_labels[image] = labels

    def labels_of(self, image: str) -> dict[str, str] | None:
        """The labels of `image` if some agent has it (as far as the agents told), else None."""
        return self._image_labels.get(image)

    def known_images(self) -> list[str]:
        """The images some agent has (as far as the agents told), by name."""
        return sorted(self._image_labels)

    def forget_image(self, image: str) -> None:
        """No agent has `image` any more."""
        self._image_labels.pop(image, None)
