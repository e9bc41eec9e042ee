"""How sessions and agents look on the API: one representation for every endpoint that shows them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import Any

import msgspec

from bai.common import service_ports as apps
from bai.common import slots as slotlib
from bai.common.cluster import SINGLE_NODE, kernel_name_of
from bai.common.present import reason
from bai.common.stats import usage_of
from bai.common.status import ACTIVE_STATUSES, OCCUPYING_STATUSES, SessionStatus
from bai.node.manager.services import Services
from bai.node.manager.services.agent_registry import Agents
from bai.node.manager.services.stats_book import StatsBook, last_stat, live_stat, stored_stat
from bai.node.manager.state.records import Kernel, Session, Transition
from bai.node.manager.state.team_records import Project


def _age_ms(created: str, now: datetime) -> int:
    return int((now - datetime.fromisoformat(created)).total_seconds() * 1000)


def _json(value: Any) -> str:
    return json.dumps(value)


def _json_or_none(value: dict[str, Any] | None) -> str | None:
    """A JSON string of an object, or None (never the string "null": the official client fails on it)."""
    return json.dumps(value) if value else None


# what the scheduler keeps in a pending session's status data for itself, and that changes every round
SCHEDULER_BOOKKEEPING = ("retries", "last_try", "passed_predicates")


@dataclass
class ApiDetail:
    """What `GET /session/{ref}` adds to a session's JSON (read from the store by `session_json`)."""

    transitions: list[Transition]
    queue_position: int | None  # only shown while the session is pending


@dataclass
class SessionView:
    """A session as every view shows it: its row and kernels (as the store returns them), the facts
    derived from them, once, and the renderings: `to_api` (the REST API's JSON, camelCase),
    `to_graphql` (Backend.AI's GraphQL `ComputeSession`, snake_case) and `to_dashboard` (the
    dashboard stream's small row). Facts are derived when a rendering first needs them."""

    row: Session
    kernels: list[Kernel]
    stats: StatsBook | None = None  # live statistics (None: only what the store keeps)
    projects: Mapping[str, Project] | None = None  # the directory's projects, by id (its project's name)

    # -- derived facts --------------------------------------------------------------------------------

    @cached_property
    def main(self) -> Kernel | None:
        """The main kernel (the first one if none says it is)."""
        return next((k for k in self.kernels if k.cluster_role == "main"), self.kernels[0] if self.kernels else None)

    @property
    def status(self) -> SessionStatus:
        return SessionStatus(self.row.status)

    @property
    def project(self) -> str:
        """The name of the project it was created in (its id when the project is gone)."""
        found = (self.projects or {}).get(self.row.project_id)
        return found.name if found is not None else ("default" if self.projects is None else self.row.project_id)

    @property
    def agent(self) -> str | None:
        return self.main.agent_id if self.main else None

    @property
    def container_id(self) -> str | None:
        return self.main.container_id if self.main else None

    @property
    def kernel_exit_code(self) -> int | None:
        """The main kernel's exit code (None while it runs, or without a kernel)."""
        return self.main.exit_code if self.main else None

    @property
    def exit_code(self) -> int | None:
        """The exit code: the main kernel's, else the one the session's status data reports."""
        code = self.kernel_exit_code
        return self.quiet_status_data.get("exitCode") if code is None else code

    @property
    def occupying(self) -> dict[str, str]:
        """The slots the session holds on agents: its requested slots while placed, else none."""
        return self.row.requested_slots if self.status in OCCUPYING_STATUSES else {}

    @property
    def status_data(self) -> dict[str, Any]:
        """The status data, with the hooks' notes (as `hooks`) when there are any."""
        notes = self.row.config.get("hook_notes")
        return {**self.row.status_data, "hooks": notes} if notes else self.row.status_data

    @cached_property
    def scheduler(self) -> dict[str, Any]:
        """The scheduler's word on a pending session, without its bookkeeping."""
        scheduler = dict((self.row.status_data or {}).get("scheduler") or {})
        for key in SCHEDULER_BOOKKEEPING:
            scheduler.pop(key, None)
        return scheduler

    @cached_property
    def quiet_status_data(self) -> dict[str, Any]:
        """The status data without what changes every scheduling round."""
        data = dict(self.row.status_data or {})
        if self.scheduler:
            data["scheduler"] = self.scheduler
        return data

    @property
    def queue_position(self) -> int | None:
        """Where the scheduler last put a pending session in its queue (None once it is not pending)."""
        return self.scheduler.get("position") if self.row.status == SessionStatus.PENDING else None

    @property
    def reason(self) -> str:
        """Why the session is pending, or why it ended, in words."""
        return reason({"statusInfo": self.row.status_info, "statusData": self.quiet_status_data})

    @property
    def mounts(self) -> list[dict[str, Any]]:
        return [
            {"name": m["name"], "id": m["id"], "target": m["target"], "readOnly": m["read_only"]}
            for m in self.row.config.get("mounts") or []
        ]

    @cached_property
    def service_ports(self) -> list[dict[str, Any]]:
        """The apps of its main kernel, as Backend.AI's `servicePorts` (plus where they are published)."""
        if self.main is None:
            return []
        return [
            {**apps.to_api(sp), "host_ports": list(sp.host_ports)} for sp in apps.loads(self.main.service_ports or [])
        ]

    @property
    def cluster_mode(self) -> str:
        """single-node | multi-node (bai/common/cluster.py; sessions made before clusters: single-node)."""
        return self.row.config.get("cluster_mode") or SINGLE_NODE

    @property
    def depends_on(self) -> list[str]:
        depends_on: list[str] = self.row.config.get("depends_on", [])
        return depends_on

    def live_sample(self, kernel: Kernel) -> dict[str, Any] | None:
        """The kernel's latest statistics sample while it lives (None before the first)."""
        return self.stats.latest(kernel.id) if self.stats is not None else None

    def sample_of(self, kernel: Kernel) -> dict[str, Any] | None:
        """The kernel's latest sample: the live one, else the final one stored as it ended."""
        return self.live_sample(kernel) or stored_stat(kernel)

    @cached_property
    def usage(self) -> dict[str, Any] | None:
        """bai's `usage` of the session: its kernels' latest figures summed (None before any sample)."""
        return usage_of([self.sample_of(k) or {} for k in self.kernels])

    def live_stat(self, kernel: Kernel) -> dict[str, Any] | None:
        """Backend.AI's `live_stat` of a live kernel (None once it ended, or before its first sample)."""
        sample = self.live_sample(kernel)
        if sample is None or self.stats is None:
            return None
        return live_stat(sample, kernel.occupied_slots, self.stats.peaks(kernel.id))

    def last_stat(self, kernel: Kernel) -> dict[str, Any] | None:
        """Backend.AI's `last_stat` of an ended kernel (None while it lives, or without a sample)."""
        return last_stat(stored_stat(kernel), kernel.occupied_slots)

    # -- renderings -----------------------------------------------------------------------------------

    def to_api(self, now: datetime, detail: ApiDetail | None = None) -> dict[str, Any]:
        """`GET /session` (each item) and, with `detail`, `GET /session/{ref}`; its `age` as of `now`."""
        row = self.row
        occupying = self.occupying
        out: dict[str, Any] = {
            "id": row.id,
            "sessionId": row.id,
            "name": row.name,
            "sessionName": row.name,
            "accessKey": row.access_key,
            "image": row.image,
            "lang": row.image,
            "type": row.type.upper(),
            "status": row.status,
            "statusInfo": row.status_info,
            "statusData": self.status_data,
            "startsAt": row.config.get("starts_at"),
            "dependsOn": self.depends_on,
            "statusChanged": row.status_changed,
            "result": row.result,
            "creationTime": row.created_at,
            "startedAt": row.started_at,
            "terminationTime": row.terminated_at,
            "priority": row.priority,
            "timeLimit": row.time_limit,
            "preemptible": row.config.get("preemptible", True) is not False,
            "age": _age_ms(row.created_at, now),
            "scalingGroup": row.scaling_group,
            "domain": row.domain_name,
            "project": self.project,
            "projectId": row.project_id,
            "requestedSlots": row.requested_slots,
            "occupyingSlots": occupying,
            "occupiedSlots": occupying,
            "environ": row.environ,
            "tag": row.tag,
            "mounts": self.mounts,
            "network": row.config.get("network"),  # null: the agent's own (none unless configured)
            "agent": self.agent,
            "containerId": self.container_id,
            "exitCode": self.kernel_exit_code,
            "servicePorts": self.service_ports,
            "usage": self.usage,
            "clusterSize": row.cluster_size,
            "clusterMode": self.cluster_mode,
            "kernels": [
                {
                    "id": k.id,
                    "name": kernel_name_of(k),  # main1, sub1 …: also its hostname
                    "clusterRole": k.cluster_role,
                    "clusterIdx": k.cluster_idx,
                    "clusterHostname": kernel_name_of(k),
                    "agent": k.agent_id,
                    "containerId": k.container_id,
                    "status": k.status,
                    "exitCode": k.exit_code,
                    "devices": [{"uuid": u, "share": str(a)} for u, a in k.devices or []],
                    "usage": usage_of([self.sample_of(k) or {}]),
                }
                for k in self.kernels
            ],
        }
        if detail is not None:
            main = self.main
            # Backend.AI's lastStat (the main kernel's): its final statistics once it ended, else the live ones
            out["lastStat"] = (self.last_stat(main) or self.live_stat(main)) if main is not None else None
            out["transitions"] = [msgspec.structs.asdict(t) for t in detail.transitions]
            if row.status == SessionStatus.PENDING:
                out["queuePosition"] = detail.queue_position
        return out

    def to_graphql(self, dependencies: list[dict[str, Any]]) -> dict[str, Any]:
        """Backend.AI's `ComputeSession` (every field bai answers; the query picks). `dependencies`:
        the sessions it depends on that still exist, as {id, name, status}."""
        row = self.row
        # as before the projection was shared: here a pending session "occupies" what it requested
        occupying = row.requested_slots if self.status in ACTIVE_STATUSES else {}
        kernels = [self.graphql_kernel(k) for k in self.kernels]
        return {
            "id": row.id,
            "session_id": row.id,
            "name": row.name,
            "access_key": row.access_key,
            "user_id": row.access_key,
            "domain_name": row.domain_name,
            "group_name": self.project,
            "group_id": row.project_id,
            "main_kernel_id": self.main.id if self.main else None,
            "image": row.image,
            "architecture": "x86_64",
            "type": row.type.upper(),
            "session_type": row.type.upper(),
            "cluster_mode": self.cluster_mode.upper().replace("-", "_"),  # Backend.AI's enum names
            "cluster_size": row.cluster_size,
            "tag": row.tag,
            "status": row.status,
            "status_info": row.status_info,
            "status_data": _json(row.status_data),
            "status_changed": row.status_changed,
            "result": row.result,
            "created_at": row.created_at,
            "started_at": row.started_at,
            "terminated_at": row.terminated_at,
            "starts_at": row.config.get("starts_at"),
            "startup_command": row.config.get("startup_command"),
            "scaling_group": row.scaling_group,
            "occupying_slots": _json(occupying),
            "occupied_slots": _json(occupying),
            "requested_slots": _json(row.requested_slots),
            "idle_checks": _json({}),
            "service_ports": _json(self.service_ports),
            "agent_ids": [k.agent_id for k in self.kernels if k.agent_id],
            "containers": kernels,
            "kernels": [dict(k) for k in kernels],
            "dependencies": dependencies,
        }

    def graphql_kernel(self, k: Kernel) -> dict[str, Any]:
        """One of its kernels as Backend.AI's `ComputeContainer`."""
        return {
            "id": k.id,
            "cluster_role": k.cluster_role,
            "cluster_idx": k.cluster_idx,
            "cluster_hostname": kernel_name_of(k),
            "session_id": self.row.id,
            "image": k.image,
            "registry": "local",
            "architecture": "x86_64",
            "status": k.status,
            "status_info": k.status_info,
            "status_data": _json(self.row.status_data),
            "status_changed": k.status_changed,
            "created_at": k.created_at,
            "terminated_at": k.terminated_at,
            "agent": k.agent_id,
            "container_id": k.container_id,
            "resource_opts": _json({}),
            "occupied_slots": _json(k.occupied_slots),
            "occupied_shares": _json({}),
            "preopen_ports": [],
            "service_ports": _json([apps.to_api(sp) for sp in apps.loads(k.service_ports or [])]),
            "live_stat": _json_or_none(self.live_stat(k)),
            "last_stat": _json_or_none(self.last_stat(k)),
            "exit_code": k.exit_code,
        }

    def to_dashboard(self) -> dict[str, Any]:
        """What the dashboard shows of a session: small, and free of fields that change every round."""
        row = self.row
        return {
            "id": row.id,
            "name": row.name,
            "accessKey": row.access_key,
            "image": row.image,
            "type": row.type.upper(),
            "status": row.status,
            "statusInfo": row.status_info,
            "statusData": self.quiet_status_data,
            "reason": self.reason,
            "queuePosition": self.queue_position,
            "agent": self.agent,
            "kernels": [k.id for k in self.kernels],
            "requestedSlots": row.requested_slots,
            "scalingGroup": row.scaling_group,
            "project": self.project,
            "projectId": row.project_id,  # (names are unique within a domain only)
            "domain": row.domain_name,
            "creationTime": row.created_at,
            "startedAt": row.started_at,
            "statusChanged": row.status_changed,
            "terminationTime": row.terminated_at,
            "priority": row.priority,
            "timeLimit": row.time_limit,
            "preemptible": row.config.get("preemptible", True) is not False,
            "exitCode": self.exit_code,
            "result": row.result,
            "servicePorts": [
                {"name": sp["name"], "protocol": sp["protocol"], "ports": sp["ports"]} for sp in self.service_ports
            ],
            "usage": self.usage,
        }


async def session_view(services: Services, row: Session, kernels: list[Kernel] | None = None) -> SessionView:
    """The session's view; its kernels are read unless given (a list reads them all at once)."""
    kernels = await services.state.kernels_of(row.id) if kernels is None else kernels
    return SessionView(row, kernels, services.stats, services.teams.directory.projects)


async def session_json(
    services: Services, row: Session, *, detail: bool = False, kernels: list[Kernel] | None = None
) -> dict[str, Any]:
    """The session as the API shows it; `detail`: as `GET /session/{ref}` (transitions, queue position)."""
    view = await session_view(services, row, kernels)
    now = services.clock.now()
    if not detail:
        return view.to_api(now)
    position = None
    if row.status == SessionStatus.PENDING:
        # the scheduler's own order (per policy) once it has looked; until then, arrival order
        position = view.queue_position
        if position is None:
            pending = await services.state.list_sessions(None, [SessionStatus.PENDING])
            position = next((i for i, r in enumerate(pending, 1) if r.id == row.id), None)
    return view.to_api(now, ApiDetail(await services.state.transitions_of(row.id), position))


async def session_graphql(services: Services, row: Session, kernels: list[Kernel] | None = None) -> dict[str, Any]:
    """The session as Backend.AI's GraphQL `ComputeSession` (reads the sessions it depends on)."""
    view = await session_view(services, row, kernels)
    dependencies = []
    for dep_id in view.depends_on:
        dep = await services.state.get_session(dep_id)
        if dep is not None:
            dependencies.append({"id": dep.id, "name": dep.name, "status": dep.status})
    return view.to_graphql(dependencies)


async def agent_items(agents: Agents, stats: StatsBook | None = None) -> list[dict[str, Any]]:
    """Every agent the manager knows, with its capacity, what its kernels occupy (two reads) and, from
    `stats`, what its host and kernels use now (`usage`; None before its first sample)."""
    occupied = await agents.occupied_by_agent()
    connected = agents.connected()
    gpus = agents.gpu_devices()
    usages = stats.agent_usages() if stats is not None else {}
    items = []
    for a in await agents.rows():
        items.append(
            {
                "id": a.id,
                "hostname": a.hostname,
                "backend": a.backend,
                "version": a.version,
                "scalingGroup": a.scaling_group,
                "status": a.status if a.id in connected or a.status != "ALIVE" else "LOST",
                "availableSlots": dict(a.slots),
                "occupiedSlots": slotlib.to_wire(occupied.get(a.id, {})),
                "firstContact": a.first_contact,
                "lastSeen": a.last_seen,
                "schedulable": agents.record(a.id).schedulable,
                "gpus": _gpus(gpus.get(a.id)),
                # image -> warm kernels ready (kernels started ahead of their sessions), while connected
                "warm": dict(agents.record(a.id).warm) if a.id in connected else {},
                "usage": usages.get(a.id),
            }
        )
    return items


def _gpus(info: dict[str, Any] | None) -> list[dict[str, Any]]:
    """An agent's GPUs: what they are, and (from its last heartbeat) how busy and how much is held."""
    if not info:
        return []
    live = {g["uuid"]: g for g in info.get("live") or []}
    out = []
    for d in info["devices"]:
        now = live.get(d["uuid"], {})
        out.append(
            {
                **d,
                "utilization": now.get("utilization"),
                "memory_used": now.get("memory_used"),
                "allocated": now.get("allocated", "0"),
            }
        )
    return out
