"""Usage reports: what sessions held and used over a period, per project, user or keypair (`rules/usage.py` does the
arithmetic; this gathers the facts and says who may see what).

Figures are computed when asked, from the state (sessions that ran in the period, their kernels' slots and final
statistics) and, for kernels still running, their latest live sample (the `StatsBook`). Nothing is kept apart for
usage, so there is nothing to recalculate.

Who sees what: a user its own keypairs' sessions (every keypair of its user); a domain admin its domain's; a
superadmin everyone's. Backend.AI's per-project reports (usage per month / period) are for superadmins and domain
admins (their domain's projects).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from bai.common.clock import Clock
from bai.node.manager.rules import usage as rules
from bai.node.manager.rules.access import Actor
from bai.node.manager.rules.usage import Bucket, KernelFacts, KernelUsage, Period, Totals
from bai.node.manager.services.stats_book import StatsBook, stored_stat
from bai.node.manager.services.teams import Teams
from bai.node.manager.state.protocols import SessionReadState
from bai.node.manager.state.records import Kernel, Session
from bai.node.manager.state.team_records import Project, TeamDirectory, User

By = Literal["keypair", "user", "project"]
BY: tuple[By, ...] = ("keypair", "user", "project")


@dataclass(frozen=True)
class UsageRow:
    """One row of bai's own report: a keypair's, a user's or a project's usage in a period."""

    key: str  # the access key, user uuid or project id
    name: str  # the keypair's user's email, the user's email, the project's name ("" when unknown)
    domain: str
    sessions: int
    kernels: int
    hours: float  # kernel-hours in the period
    cpu_core_hours: float  # allocated
    mem_gib_hours: float  # allocated
    gpu_hours: float  # allocated (devices or shares)
    cpu_used_seconds: float  # used (the part of each run inside the period)
    mem_peak_bytes: int  # the most one kernel used
    io_read_bytes: int
    io_write_bytes: int


@dataclass(frozen=True)
class ProjectKernels:
    """The kernels of one project that ran in a period (Backend.AI's per-group report)."""

    project_id: str
    project: Project | None
    domain_name: str
    kernels: list[KernelUsage]


def _when(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


def _mounts(session: Session) -> tuple[str, ...]:
    """The folders the session mounted, as `host:name` (Backend.AI's `nfs`: the storage behind them)."""
    mounts = session.config.get("mounts") if isinstance(session.config, dict) else None
    if not isinstance(mounts, list):
        return ()
    names = {f"{m.get('host', '')}:{m.get('name', '')}" for m in mounts if isinstance(m, dict) and m.get("name")}
    return tuple(sorted(names))


class Usage:
    """Usage over periods, for the caller's scope (see the module docstring)."""

    def __init__(
        self,
        state: SessionReadState,
        teams: Teams,
        stats: StatsBook,
        clock: Clock,
        gpu_devices: Callable[[], Mapping[str, Mapping[str, Any]]] | None = None,
    ) -> None:
        self.state = state
        self.teams = teams
        self.stats = stats
        self.clock = clock
        self.gpu_devices = gpu_devices  # (Agents.gpu_devices: agent id -> {"devices": [...]})

    def _gpus(self) -> dict[str, tuple[str, int]]:
        """Device uuid -> (model, memory bytes), of the GPUs the agents registered."""
        out: dict[str, tuple[str, int]] = {}
        for agent in (self.gpu_devices() if self.gpu_devices is not None else {}).values():
            for d in agent.get("devices") or []:
                if isinstance(d, Mapping) and isinstance(d.get("uuid"), str):
                    out[d["uuid"]] = (str(d.get("name") or ""), int(d.get("memory_total") or 0))
        return out

    # -- who sees what ------------------------------------------------------------------------------------------

    def _visible(self, actor: Actor, everyone: bool) -> Callable[[Session], bool]:
        """Which sessions the actor's report covers: `everyone` (admins: all they manage), else its user's own."""
        directory = self.teams.directory
        if everyone:
            if actor.is_superadmin:
                return lambda s: True
            if actor.is_domain_admin:
                return lambda s: s.domain_name == actor.domain
            raise rules.forbidden("only admins see everyone's usage (a domain admin its domain's)")
        own = frozenset(directory.keys_of(actor.user.uuid)) if actor.user is not None else frozenset()
        own |= {actor.access_key}
        return lambda s: s.access_key in own

    def check_admin(self, actor: Actor, what: str) -> None:
        if not (actor.is_superadmin or actor.is_domain_admin):
            raise rules.forbidden(
                f"{what} is for admins (a domain admin sees its domain's projects); see GET /bai/usage"
            )

    # -- the facts ------------------------------------------------------------------------------------------------

    async def kernels_in(self, period: Period, keep: Callable[[Session], bool] = lambda s: True) -> list[KernelUsage]:
        """The usage of every kernel that ran in the period, of the sessions `keep` keeps, in the order they
        started."""
        now = self.clock.now()
        sessions = [s for s in await self.state.sessions_overlapping(period.start, period.end) if keep(s)]
        kernels = await self.state.kernels_of_many([s.id for s in sessions]) if sessions else {}
        gpus = self._gpus()
        out: list[KernelUsage] = []
        for s in sessions:
            for k in kernels.get(s.id, []):
                found = rules.kernel_usage(self._facts(s, k), period, now, gpus)
                if found is not None:
                    out.append(found)
        return out

    def _facts(self, s: Session, k: Kernel) -> KernelFacts:
        sample = stored_stat(k) if k.last_stat else None
        if sample is None:
            sample = self.stats.latest(k.id)  # (a running kernel: its live figures)
        return KernelFacts(
            kernel_id=k.id,
            session_id=s.id,
            session_name=s.name,
            access_key=s.access_key,
            project_id=s.project_id,
            domain_name=s.domain_name,
            image=k.image or s.image,
            agent_id=k.agent_id,
            container_id=k.container_id,
            status=k.status,
            status_info=k.status_info,
            status_changed=k.status_changed,
            cluster_role=f"{k.cluster_role}{k.cluster_idx}",
            cluster_size=s.cluster_size,
            created_at=datetime.fromisoformat(k.created_at),
            started_at=_when(s.started_at),
            terminated_at=_when(k.terminated_at or s.terminated_at),
            slots=k.occupied_slots,
            sample=sample,
            mounts=_mounts(s),
            devices=tuple((str(d[0]), str(d[1])) for d in k.devices if isinstance(d, list | tuple) and len(d) >= 2),
        )

    # -- the reports ----------------------------------------------------------------------------------------------

    async def per_project(
        self, actor: Actor, period: Period, project_ids: Iterable[str] | None
    ) -> list[ProjectKernels]:
        """Backend.AI's usage per month / period: the kernels that ran in the period per project (`project_ids`:
        only those; None or empty: every project the actor manages). Admins only."""
        self.check_admin(actor, "usage per project")
        directory = self.teams.directory
        wanted = set(project_ids or ())
        for pid in wanted:
            project = directory.projects.get(pid)
            if project is not None and not actor.may_manage(project.domain_name):
                raise rules.forbidden(f"project {pid} is of domain {project.domain_name}, which you do not manage")
        scope = self._visible(actor, everyone=True)

        def keep(s: Session) -> bool:
            return scope(s) and (not wanted or s.project_id in wanted)

        groups: dict[str, ProjectKernels] = {}
        for u in await self.kernels_in(period, keep):
            pid = u.facts.project_id
            if pid not in groups:
                groups[pid] = ProjectKernels(pid, directory.projects.get(pid), u.facts.domain_name, [])
            groups[pid].kernels.append(u)
        return list(groups.values())

    async def buckets(self, actor: Actor, everyone: bool) -> list[Bucket]:
        """Backend.AI's monthly stats: 15-minute windows over the last 30 days (`everyone`: admins')."""
        now = self.clock.now()
        period = rules.last_days(now, rules.BUCKET_SECONDS * rules.BUCKETS // 86400)
        return rules.buckets(await self.kernels_in(period, self._visible(actor, everyone)), now)

    async def rows(self, actor: Actor, period: Period, by: By, everyone: bool) -> list[UsageRow]:
        """bai's report: the period's usage summed per keypair, user or project, the largest allocation first."""
        directory = self.teams.directory
        usages = await self.kernels_in(period, self._visible(actor, everyone))
        if by == "keypair":
            sums = rules.totals_by(usages, lambda u: u.facts.access_key)
        elif by == "user":
            sums = rules.totals_by(usages, lambda u: _user_key(directory, u.facts.access_key))
        else:
            sums = rules.totals_by(usages, lambda u: u.facts.project_id)
        out = [_row(directory, by, key, t) for key, t in sums.items()]
        return sorted(out, key=lambda r: (-r.cpu_core_hours, -r.hours, r.name, r.key))

    def user_of(self, access_key: str) -> User | None:
        return self.teams.directory.user_of(access_key)


def _user_key(directory: TeamDirectory, access_key: str) -> str:
    user = directory.user_of(access_key)
    return user.uuid if user is not None else f"keypair:{access_key}"


def _row(directory: TeamDirectory, by: By, key: str, t: Totals) -> UsageRow:
    name, domain = "", ""
    if by == "project":
        project = directory.projects.get(key)
        if project is not None:
            name, domain = project.name, project.domain_name
    else:
        user = directory.users.get(key) if by == "user" else directory.user_of(key)
        if user is not None:
            name, domain = user.email, user.domain_name
    hour = 3600.0
    return UsageRow(
        key=key,
        name=name,
        domain=domain,
        sessions=len(t.sessions),
        kernels=t.kernels,
        hours=round(t.seconds / hour, 4),
        cpu_core_hours=round(t.cpu_seconds / hour, 4),
        mem_gib_hours=round(t.mem_byte_seconds / (1 << 30) / hour, 4),
        gpu_hours=round(t.gpu_seconds / hour, 4),
        cpu_used_seconds=round(t.cpu_used_ms / 1000, 3),
        mem_peak_bytes=t.mem_max_used,
        io_read_bytes=t.io_read,
        io_write_bytes=t.io_write,
    )
