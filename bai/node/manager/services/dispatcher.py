"""The dispatcher: wakes on events (coalesced) and on a slow tick, builds a snapshot, asks the pure
scheduler for decisions, applies them in one transaction, then publishes events and starts kernels."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from bai.common import slots as slotlib
from bai.common.background import Background
from bai.common.clock import Clock
from bai.common.cluster import SINGLE_NODE
from bai.common.config import duration_seconds
from bai.common.diskspace import disk_full
from bai.common.status import OCCUPYING_STATUSES, SessionStatus, StatusInfo
from bai.node.manager.rules.access import project_cap
from bai.node.manager.services.agent_registry import Agents
from bai.node.manager.services.diskfull import FullDiskWarnings
from bai.node.manager.services.fair_share import FairShare
from bai.node.manager.services.lifecycle import SessionLifecycle
from bai.node.manager.services.preemptions import Preemptions, preempting_for
from bai.node.manager.services.scheduler_rounds import SchedulerRounds
from bai.node.manager.services.wakeup import Wakeup
from bai.node.manager.state import State
from bai.node.manager.state.errors import NotLeading
from bai.node.manager.state.records import Kernel, SchedulingAttempt, Session
from bai.node.manager.state.sqlite.keypair_queries import DEFAULT_SESSION_NETWORKS
from bai.node.manager.state.sqlite.session_queries import cluster_order
from bai.node.scheduler.core import schedule
from bai.node.scheduler.snapshot import (
    MULTIFACTOR,
    POLICIES,
    PREEMPTION_ORDERS,
    PRIORITY_MAX,
    PRIORITY_MIN,
    AgentState,
    DependencyState,
    KernelRequest,
    KeypairState,
    PendingSession,
    ProjectState,
    ResourcePolicy,
    RunningSession,
    ScalingGroup,
    Snapshot,
    Weights,
)

log = logging.getLogger("bai.dispatcher")
COALESCE = 0.002  # seconds to gather a burst of events into one round
# Under a stream of wake-ups (a burst of creates), a round waits after the last one PACE times as long as that
# one took (at most MAX_PACE s): rounds then use at most about a third of the event loop, and each takes in
# every arrival of its wait at once; an idle manager answers a wake-up after COALESCE only.
PACE = 2.0
MAX_PACE = 0.5
QUOTA_STATUSES = OCCUPYING_STATUSES - {SessionStatus.TERMINATING}  # what counts against a keypair
# what preemption may stop (and, PREEMPTED, what is being stopped for a pending session)
PREEMPTION_STATUSES = frozenset(
    {SessionStatus.RUNNING, SessionStatus.RUNNING_DEGRADED, SessionStatus.RESTARTING, SessionStatus.PREEMPTED}
)
MIN_LABEL = "ai.backend.resource.min."


def scaling_groups(cfg: dict[str, Any]) -> tuple[dict[str, ScalingGroup], dict[str, float]]:
    """The scaling groups of the configuration, and their pending timeouts (0 = none)."""
    groups, timeouts = {}, {}
    for name, opts in cfg.get("scaling_groups", {}).items():
        policy = opts.get("policy", "fifo")
        selection = opts.get("agent_selection", "dispersed")
        if policy not in POLICIES:
            raise ValueError(f"scaling group {name}: policy must be fifo, lifo, drf or multifactor, not {policy!r}")
        if selection not in ("dispersed", "concentrated"):
            raise ValueError(f"scaling group {name}: agent_selection must be dispersed or concentrated")
        weights = Weights()
        try:
            weights = Weights(
                priority=float(opts.get("weight_priority", weights.priority)),
                fair_share=float(opts.get("weight_fair_share", weights.fair_share)),
                age=float(opts.get("weight_age", weights.age)),
                size=float(opts.get("weight_size", weights.size)),
                max_age=duration_seconds(opts.get("max_age", weights.max_age)),
            )
        except ValueError as e:
            raise ValueError(f"scaling group {name}: max_age: {e}") from None
        if min(weights.priority, weights.fair_share, weights.age, weights.size) < 0:
            raise ValueError(f"scaling group {name}: the weights must be >= 0")
        reservations = int(opts.get("reservations", -1))
        preemption = opts.get("preemption", False)
        if not isinstance(preemption, bool):
            raise ValueError(f"scaling group {name}: preemption must be true or false")
        preemptible_priority = opts.get("preemptible_priority", 5)
        if (
            isinstance(preemptible_priority, bool)
            or not isinstance(preemptible_priority, int)
            or not PRIORITY_MIN <= preemptible_priority <= PRIORITY_MAX
        ):
            raise ValueError(f"scaling group {name}: preemptible_priority must be a whole number from 0 to 100")
        order = opts.get("preemption_order", "oldest")
        if order not in PREEMPTION_ORDERS:
            raise ValueError(f"scaling group {name}: preemption_order must be oldest or newest, not {order!r}")
        try:
            min_runtime = duration_seconds(opts.get("preemption_min_runtime", 0))
        except ValueError as e:
            raise ValueError(f"scaling group {name}: preemption_min_runtime: {e}") from None
        groups[name] = ScalingGroup(
            name=name,
            policy=policy,
            agent_selection=selection,
            allowed_session_types=frozenset(opts.get("allowed_session_types", ["interactive", "batch"])),
            weights=weights,
            reservations=None if reservations < 0 else reservations,
            preemption=preemption,
            preemptible_priority=preemptible_priority,
            preemption_order=order,
            preemption_min_runtime=min_runtime,
        )
        timeouts[name] = float(opts.get("pending_timeout", 0) or 0)
    return groups, timeouts


def preemption_graces(cfg: dict[str, Any]) -> dict[str, float]:
    """Per scaling group, the seconds an interactive session is told before it is preempted (`preemption_grace`,
    60 s when absent; 0: at once)."""
    graces = {}
    for name, opts in cfg.get("scaling_groups", {}).items():
        if "preemption_grace" in opts:
            try:
                graces[name] = duration_seconds(opts["preemption_grace"])
            except ValueError as e:
                raise ValueError(f"scaling group {name}: preemption_grace: {e}") from None
    return graces


def image_minimum(labels: dict[str, str]) -> dict[str, Decimal]:
    out = {}
    for key, value in labels.items():
        if key.startswith(MIN_LABEL):
            slot = key[len(MIN_LABEL) :]
            with contextlib.suppress(slotlib.SlotError):
                out[slot] = slotlib.parse_amount(slot, value)
    return out


class Dispatcher:
    """Runs scheduling rounds: a snapshot of pending sessions and agents, the pure scheduler's decisions,
    and their results handed to the sessions service."""

    def __init__(
        self,
        store: State,
        sessions: SessionLifecycle,
        agents: Agents,
        wake: Wakeup,
        groups: dict[str, ScalingGroup] | None = None,
        pending_timeouts: dict[str, float] | None = None,
        tick: float = 10.0,
        clock: Clock | None = None,
        fair_share: FairShare | None = None,
        preemptions: Preemptions | None = None,
        rounds: SchedulerRounds | None = None,
    ) -> None:
        self.clock = clock or Clock()
        self.rounds = rounds  # each round kept for replay (None: not kept)
        if rounds is not None:
            rounds.current = self.current_snapshot
        self.preemptions = preemptions or Preemptions(sessions)
        self._holding: list[Session] | None = None  # the sessions holding slots, as the last snapshot read them
        self.fair_share = fair_share  # (scaling groups of policy multifactor: their fair-share factor)
        self.store = store
        self.sessions = sessions
        self.agents = agents
        self.groups = groups or {"default": ScalingGroup("default")}
        self.pending_timeouts = pending_timeouts or {}
        self.tick = tick
        self._wake = asyncio.Event()
        self.background = Background(log)
        self.full_disk = FullDiskWarnings(log)  # rounds on a full disk: warned about once, tried again at the tick
        self._due: datetime | None = None  # the next time a pending session's situation changes by itself
        self._next_round = 0.0  # (loop time) not before: the pace under a stream of wake-ups
        # whether this manager may schedule now (services/leadership.py: False once its lease may have expired)
        self.may_act: Callable[[], bool] = lambda: True
        wake.bind(self.wake)

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> None:
        self.background.spawn(self._loop(), "dispatcher")

    async def stop(self) -> None:
        await self.background.close()

    async def _loop(self) -> None:
        while True:
            timeout = self.tick
            if self._due is not None:  # a reserved start time or a pending timeout comes first
                timeout = max(0.0, min(timeout, (self._due - self.clock.now()).total_seconds()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
            loop = asyncio.get_running_loop()
            await asyncio.sleep(max(COALESCE, self._next_round - loop.time()))
            self._wake.clear()  # wakes arriving during the round trigger one more round
            started = loop.time()
            try:
                await self.round()
            except Exception as e:  # the dispatcher keeps running
                if self.full_disk.failed("scheduling rounds", e):
                    pass  # said once; nothing was changed, and the next round (at the tick) tries again
                else:
                    log.exception("scheduling round failed")
                    await self._record_error(e)
            else:
                self.full_disk.ok("scheduling rounds")
            ended = loop.time()
            self._next_round = ended + min(MAX_PACE, PACE * (ended - started))

    async def snapshot(self, now: datetime) -> tuple[Snapshot, list[Session]]:
        store = self.store
        # fair share charges what sessions hold at every round (the tick's too), waiting sessions or not: a keypair
        # that holds the cluster while nobody waits is charged for it
        holding: list[Session] | None = None
        fair_usage: dict[str, float] = {}
        project_usage: dict[str, float] = {}
        preempting = any(g.preemption for g in self.groups.values())
        if preempting or (self.fair_share is not None and any(g.policy == MULTIFACTOR for g in self.groups.values())):
            holding = await store.list_sessions(None, QUOTA_STATUSES)
        if (
            holding is not None
            and self.fair_share is not None
            and any(g.policy == MULTIFACTOR for g in self.groups.values())
        ):
            advanced = await self.fair_share.advance(now, holding)
            fair_usage = self.fair_share.keypairs(advanced)
            project_usage = self.fair_share.projects(advanced)
        self._holding = holding
        pending_rows = await store.list_sessions(None, [SessionStatus.PENDING])
        if not pending_rows:
            return Snapshot(now, [], [], {}, {}, self.groups), []
        kernels: dict[str, list[Kernel]] = {}
        for k in await store.kernels_where([SessionStatus.PENDING.value]):
            kernels.setdefault(k.session_id, []).append(k)
        occupied = await self.agents.occupied_by_agent()
        gpu_free = await self.agents.gpu_free_by_agent()
        connected = self.agents.connected()
        agents = [
            AgentState(
                id=a.id,
                scaling_group=a.scaling_group,
                capacity=slotlib.from_wire(a.slots),
                occupied=occupied.get(a.id, {}),
                vfolder_hosts=self.agents.record(a.id).vfolder_hosts,
                schedulable=self.agents.record(a.id).schedulable,
                gpu_free=gpu_free.get(a.id, ()),
            )
            for a in (await store.agent_capacities())[1]
            if a.status == "ALIVE" and a.id in connected
        ]
        # what each keypair holds now
        usage: dict[str, tuple[int, dict[str, Decimal]]] = {}
        for access_key, requested, count in await store.usage_by_keypair(QUOTA_STATUSES):
            held, slots = usage.get(access_key, (0, {}))
            usage[access_key] = (held + count, slotlib.add(slots, _times(slotlib.from_wire(requested), count)))
        policies = await store.policies()
        networks: dict[str, int] = {}  # (only a session of several kernels is checked against them)
        if any(r.cluster_size > 1 for r in pending_rows):
            networks = await store.session_networks_by_keypair(OCCUPYING_STATUSES)
        keypair_rows = await store.keypairs(active_only=False)
        keypairs = {}
        for ak in {r.access_key for r in pending_rows}:
            kp = keypair_rows.get(ak)
            p = policies.get(kp.resource_policy if kp else "default")
            count, slots = usage.get(ak, (0, {}))
            keypairs[ak] = KeypairState(
                access_key=ak,
                policy=ResourcePolicy(
                    name=p.name if p else "default",
                    max_concurrent_sessions=p.max_concurrent_sessions if p else 0,
                    max_session_networks=p.max_session_networks if p else DEFAULT_SESSION_NETWORKS,
                    total_resource_slots=slotlib.from_wire(p.total_resource_slots if p else None),
                    default_for_unspecified=p.default_for_unspecified if p else "UNLIMITED",
                ),
                concurrent_sessions=count,
                occupied=slots,
                session_networks=networks.get(ak, 0),
            )
        dependencies = {}
        for dep_id in {d for r in pending_rows for d in r.config.get("depends_on", [])}:
            dep = await store.get_session(dep_id)
            if dep is not None:
                dependencies[dep_id] = DependencyState(dep_id, dep.name, dep.status, dep.result)
        pending = []
        for row in pending_rows:
            starts_at = row.config.get("starts_at")
            pending.append(
                PendingSession(
                    id=row.id,
                    name=row.name,
                    access_key=row.access_key,
                    session_type=row.type,
                    scaling_group=row.scaling_group,
                    kernels=tuple(
                        KernelRequest(k.id, slotlib.from_wire(k.occupied_slots), k.cluster_role, k.cluster_idx)
                        for k in sorted(kernels.get(row.id, []), key=cluster_order)
                    ),
                    cluster_mode=row.config.get("cluster_mode") or SINGLE_NODE,
                    created_at=datetime.fromisoformat(row.created_at),
                    starts_at=datetime.fromisoformat(starts_at) if starts_at else None,
                    depends_on=tuple(row.config.get("depends_on", [])),
                    image=row.image,
                    vfolder_hosts=frozenset(m["host"] for m in row.config.get("mounts") or []),
                    image_min=image_minimum(self.agents.labels_of(row.image) or {}),
                    retries=(row.status_data.get("scheduler") or {}).get("retries", 0),
                    project_id=row.project_id,
                    domain_name=row.domain_name,
                    priority=row.priority,
                    duration=_duration(row, policies.get(_policy_name(keypair_rows, row.access_key))),
                )
            )
        if any(
            self.groups.get(r.scaling_group, ScalingGroup(r.scaling_group)).policy == MULTIFACTOR for r in pending_rows
        ):
            if holding is None:
                holding = await store.list_sessions(None, QUOTA_STATUSES)
            agents = await self._latest_ends(agents, holding, policies, keypair_rows)
        running: list[RunningSession] = []
        if preempting and any(self.groups.get(r.scaling_group, ScalingGroup("")).preemption for r in pending_rows):
            running = await self._running(holding or [])
        projects, domains = await self._caps(
            {r.project_id for r in pending_rows}, {r.domain_name for r in pending_rows}
        )
        snapshot = Snapshot(
            now,
            pending,
            agents,
            keypairs,
            dependencies,
            self.groups,
            projects,
            domains,
            usage=fair_usage,
            project_usage=project_usage,
            running=running,
        )
        return snapshot, pending_rows

    async def _latest_ends(
        self, agents: list[AgentState], holding: list[Session], policies: dict[str, Any], keypair_rows: dict[str, Any]
    ) -> list[AgentState]:
        """The agents with when the sessions holding slots on them end at the latest, and what each frees (what
        the multifactor policy's reservations plan with)."""
        by_id = {r.id: r for r in holding}
        ends: dict[str, list[tuple[datetime, dict[str, Decimal]]]] = {}
        for kernel in await self.store.kernels_where([s.value for s in QUOTA_STATUSES]):
            row = by_id.get(kernel.session_id)
            if row is None or kernel.agent_id is None:
                continue
            end = _end(row, policies.get(_policy_name(keypair_rows, row.access_key)))
            if end is not None:
                ends.setdefault(kernel.agent_id, []).append((end, slotlib.from_wire(kernel.occupied_slots)))
        return [dataclasses.replace(a, ends=tuple(ends.get(a.id, ()))) for a in agents]

    async def _running(self, holding: list[Session]) -> list[RunningSession]:
        """The sessions preemption may stop in the scaling groups that have it (and those being stopped), with what
        their kernels hold on each agent."""
        rows = {
            r.id: r
            for r in holding
            if r.status in PREEMPTION_STATUSES and self.groups.get(r.scaling_group, ScalingGroup("")).preemption
        }
        if not rows:
            return []
        held: dict[str, dict[str, dict[str, Decimal]]] = {}
        for kernel in await self.store.kernels_where([s.value for s in PREEMPTION_STATUSES]):
            if kernel.session_id in rows and kernel.agent_id:
                on = held.setdefault(kernel.session_id, {})
                on[kernel.agent_id] = slotlib.add(on.get(kernel.agent_id, {}), slotlib.from_wire(kernel.occupied_slots))
        out = []
        for sid, row in rows.items():
            if sid not in held:
                continue
            out.append(
                RunningSession(
                    sid,
                    row.name,
                    row.access_key,
                    row.type,
                    row.scaling_group,
                    row.priority,
                    tuple(sorted(held[sid].items())),
                    started_at=datetime.fromisoformat(row.started_at or row.status_changed),
                    preemptible=row.config.get("preemptible", True) is not False,
                    # (PREEMPTED with no note: being stopped for nobody in particular; counted for no one)
                    preempting_for=preempting_for(row) or ("" if row.status == SessionStatus.PREEMPTED else None),
                )
            )
        return out

    async def _caps(
        self, project_ids: set[str], domains: set[str]
    ) -> tuple[dict[str, ProjectState], dict[str, ProjectState]]:
        """The projects and domains of pending sessions that have a cap, with what their sessions hold now (read
        only when one has a cap)."""
        teams = self.store.teams()
        caps = {}
        for pid in project_ids:
            project = teams.projects.get(pid)
            if project is not None and (cap := project_cap(teams, project)):
                caps[pid] = (project.name, cap)
        domain_caps = {
            d: slotlib.parse_slots(teams.domains[d].total_resource_slots)
            for d in domains
            if d in teams.domains and teams.domains[d].total_resource_slots
        }
        if not caps and not domain_caps:
            return {}, {}
        held: dict[str, dict[str, Decimal]] = {}  # by project id
        for pid, (_count, kernels) in (await self.store.project_usage(QUOTA_STATUSES)).items():
            for slots in kernels:
                held[pid] = slotlib.add(held.get(pid, {}), slotlib.from_wire(slots))
        projects = {pid: ProjectState(pid, name, cap, held.get(pid, {})) for pid, (name, cap) in caps.items()}
        by_domain: dict[str, dict[str, Decimal]] = {}
        for pid, amounts in held.items():
            owner = teams.projects.get(pid)
            if owner is not None and owner.domain_name in domain_caps:
                by_domain[owner.domain_name] = slotlib.add(by_domain.get(owner.domain_name, {}), amounts)
        domains_out = {d: ProjectState(d, d, cap, by_domain.get(d, {})) for d, cap in domain_caps.items()}
        return projects, domains_out

    def _next_due(self, snapshot: Snapshot, now: datetime) -> datetime | None:
        times = [p.starts_at for p in snapshot.pending if p.starts_at and p.starts_at > now]
        for p in snapshot.pending:
            limit = self.pending_timeouts.get(p.scaling_group, 0)
            if limit:
                times.append(p.created_at + timedelta(seconds=limit))
        return min(times) if times else None

    def _timed_out(self, rows: list[Session], now: datetime) -> list[tuple[str, str, dict[str, Any]]]:
        out = []
        for row in rows:
            limit = self.pending_timeouts.get(row.scaling_group, 0)
            waited = (now - datetime.fromisoformat(row.created_at)).total_seconds()
            if limit and waited > limit:
                out.append((row.id, StatusInfo.PENDING_TIMEOUT, {"msg": f"pending for more than {limit:g} s"}))
        return out

    async def round(self) -> None:
        if not self.may_act():
            return
        now = self.clock.now()
        snapshot, rows = await self.snapshot(now)
        self._due = self._next_due(snapshot, now)
        if not rows:
            await self._settle_notices(set(), now)
            return
        timed_out = self._timed_out(rows, now)
        if timed_out:
            gone = {sid for sid, _, _ in timed_out}
            snapshot = dataclasses.replace(snapshot, pending=[p for p in snapshot.pending if p.id not in gone])
        decisions = schedule(snapshot)
        number = await self._keep(snapshot, decisions, now)
        last_try = now.isoformat()
        retries = {p.id: p.retries + 1 for p in snapshot.pending}
        by_id = {r.id: r for r in rows}
        names = {r.id: r.name for r in snapshot.running}
        pending = []
        history = []
        for item in decisions.pending:
            failed = [{"name": r.name, "msg": r.msg} for r in item.predicates if not r.passed]
            data = {
                "scheduler": {
                    "retries": retries[item.session_id],
                    "last_try": last_try,
                    "msg": item.msg,
                    "position": item.position,
                    "failed_predicates": failed,
                    "passed_predicates": [{"name": r.name} for r in item.predicates if r.passed],
                }
            }
            if number is not None:
                data["scheduler"]["round"] = number
            if item.factors is not None:
                data["scheduler"]["factors"] = item.factors.as_dict()
            if item.reservation is not None:
                data["scheduler"]["reservation"] = item.reservation.as_dict()
            if item.preempting:
                data["scheduler"]["preempting"] = [names.get(v, v) for v in item.preempting]
            note = by_id[item.session_id].status_data.get("preemption")
            if note:  # (a requeued session: how it was preempted stays in sight while it waits)
                data["preemption"] = note
            pending.append((item.session_id, item.status_info, data))
            history.append(_history(item.session_id, "pending", item.status_info, item.msg, "", failed))
        cancels = [(c.session_id, c.status_info, {"msg": c.msg}) for c in decisions.cancels] + timed_out
        for sid, info, data in cancels:
            history.append(_history(sid, "cancelled", info, data["msg"], "", []))
        placements = [(p.session_id, dict(p.agents)) for p in decisions.placements]
        for sid, agents in placements:
            history.append(
                _history(sid, "scheduled", StatusInfo.SCHEDULED, "", ",".join(sorted(set(agents.values()))), [])
            )
        if not self.may_act():  # (it lost the lead while it read: another manager schedules these)
            return
        for p in decisions.preemptions:
            history.append(_history(p.session_id, "preempted", StatusInfo.PREEMPTED, p.msg, "", []))
        try:
            await self.sessions.apply_round(placements, cancels, pending, history)
        except NotLeading as e:  # (frozen past its lease: the database refused the round; the next leader's counts)
            log.warning("scheduling round not stored: %s", e)
            return
        if decisions.preemptions:
            running = {r.id: r for r in self._holding or []}
            await self.preemptions.apply(decisions.preemptions, running, by_id, now)
        await self._settle_notices({item.session_id for item in decisions.pending}, now)

    async def _keep(self, snapshot: Snapshot, decisions: Any, now: datetime) -> int | None:
        """Keep the round for replay (its number); a round that cannot be kept is still applied."""
        if self.rounds is None:
            return None
        try:
            return await self.rounds.record(snapshot, decisions, now)
        except Exception as e:  # (a lost database: the round matters more than its record)
            if disk_full(e):
                raise  # (the round's own writes would fail too: the loop says so once, and tries at the tick)
            log.warning("scheduling round not kept for replay: %s", e)
            return None

    async def current_snapshot(self) -> Snapshot:
        """The snapshot a round would take now (what a replay compares a past round with)."""
        snapshot, _ = await self.snapshot(self.clock.now())
        return snapshot

    async def _settle_notices(self, waiting: set[str], now: datetime) -> None:
        """The preemption notices given: withdrawn or carried out (see Preemptions.settle); the next deadline wakes
        a round."""
        if not self._holding or not any(g.preemption for g in self.groups.values()):
            return
        due = await self.preemptions.settle(self._holding, waiting, now)
        if due is not None and (self._due is None or due < self._due):
            self._due = due

    async def _record_error(self, exc: Exception) -> None:
        with contextlib.suppress(Exception):
            for row in await self.store.list_sessions(None, [SessionStatus.PENDING]):
                await self.store.set_pending_info(
                    row.id, StatusInfo.SCHEDULER_ERROR, {"error": {"name": type(exc).__name__, "repr": str(exc)}}
                )


def _policy_name(keypairs: dict[str, Any], access_key: str) -> str:
    keypair = keypairs.get(access_key)
    return (keypair.resource_policy if keypair else "") or "default"


def _duration(row: Session, policy: Any) -> float | None:
    """How long a session runs at most once it starts: its own time limit, its policy's lifetime (counted from its
    creation: at most that), the shorter; None when neither bounds it."""
    bounds = [b for b in (row.time_limit, getattr(policy, "max_session_lifetime", 0) or None) if b]
    return min(bounds) if bounds else None


def _end(row: Session, policy: Any) -> datetime | None:
    """When a session that holds slots ends at the latest: its start plus its time limit, its creation plus its
    policy's lifetime, the earlier; None when neither bounds it."""
    ends = []
    if row.time_limit and row.started_at:
        ends.append(datetime.fromisoformat(row.started_at) + timedelta(seconds=row.time_limit))
    lifetime = getattr(policy, "max_session_lifetime", 0) or 0
    if lifetime:
        ends.append(datetime.fromisoformat(row.created_at) + timedelta(seconds=lifetime))
    return min(ends) if ends else None


def _times(slots: dict[str, Decimal], count: int) -> dict[str, Decimal]:
    return {name: amount * count for name, amount in slots.items()}


def _history(session_id: str, outcome: str, info: str, msg: str, agents: str, failed: list[Any]) -> SchedulingAttempt:
    return SchedulingAttempt(session_id, outcome, info, msg, agents, failed)
