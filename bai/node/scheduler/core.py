"""The scheduling core: `schedule(snapshot) -> Decisions`. Pure: no I/O, no clock, no asyncio.

One round, per scaling group (groups in name order, keypair quotas shared between them):

1. The group's pending sessions are considered in policy order (`policies`: fifo, lifo, drf).
2. Each session runs every predicate (`predicates`), in this order, all of them, so users see
   every reason at once: reserved_time, dependencies, allowed_session_types,
   image_min_resources, concurrency, keypair_resource_limit.
   * Any failure: the session stays pending with status_info `predicate-checks-failed`, msg =
     the failing predicates' messages joined by "; ".
   * A dependency that ended (TERMINATED, CANCELLED, ERROR) without result SUCCESS, or one the
     snapshot does not know, CANCELS the session: `Cancel(status_info="dependency-failed",
     msg="session NAME (ID) ended without success: STATUS/RESULT")`. Backend.AI leaves such a
     session pending forever; we cancel it, because it can never start. "dependency-failed" is
     our own string, not one of Backend.AI's.
3. A session that passes is placed on an agent (`selection`): single-node sessions put all
   kernels on one agent (the request is the sum over kernels); multi-node sessions place each
   kernel on its own best agent, tentatively, and roll every reservation back when a later
   kernel finds no room. No agent: pending with `no-available-instances`, msg e.g.
   "no agent has room: best is a1 with cpu 1 free of 2 requested" (it waits for room), or
   "no schedulable agent in scaling group G"; a session that no agent could hold even when idle
   says so, naming the first slot too large (cpu, mem, then the others by name):
   "needs cpu 64; the largest agent has 2" ("the only agent" when there is one; per kernel for
   multi-node sessions, prefixed with the kernel). Creation refuses such requests already
   (bai/node/manager/rules/placeable.py); this happens when agents leave or shrink after it.
4. A session that is not placed never stops the sessions after it (Backend.AI stops the group at
   the first `no-available-instances`; we do not).

Every input session ends up in exactly one of `placements`, `pending`, `cancels`. `Pending.position`
is the 1-based place among the group's sessions left pending, in the order they were considered.
Agent room and keypair use are updated as the round goes; the caller's objects are not touched.
`scheduler-error` is never produced here: the caller catches exceptions (ValueError for an
unknown policy or selection strategy, TypeError for a non-Decimal amount).
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from decimal import Decimal
from operator import attrgetter

from bai.common.gpus import describe_shortage as gpu_shortage
from bai.common.gpus import pack as gpu_pack
from bai.common.gpus import request_of as gpu_request
from bai.common.slots import format_amount
from bai.common.status import StatusInfo

from . import predicates as preds
from .backfill import INFINITE, Backfill
from .multifactor import Scorer, session_fair_factors
from .policies import DrfQueue, check_policy, fifo_order, lifo_order
from .predicates import KeypairQuota, ProjectQuota
from .preemption import Plan, Preemption
from .selection import AgentPool, Prepared, Rescale, SlotTable
from .snapshot import (
    ALLOWED_SESSION_TYPES,
    CONCURRENCY,
    DEPENDENCIES,
    DEPENDENCY_FAILED,
    DOMAIN_RESOURCE_LIMIT,
    DRF,
    IMAGE_MIN_RESOURCES,
    KEYPAIR_RESOURCE_LIMIT,
    LIFO,
    MULTI_NODE,
    MULTIFACTOR,
    PREDICATES,
    RESERVED_TIME,
    SESSION_NETWORKS,
    USER_GROUP_RESOURCE_LIMIT,
    AgentState,
    Cancel,
    Decisions,
    Factors,
    KernelRequest,
    Pending,
    PendingSession,
    Placement,
    PredicateResult,
    Preempt,
    Reservation,
    ScalingGroup,
    Snapshot,
)

__all__ = ["decisions_by_session", "schedule"]

_PREDICATE_CHECKS_FAILED = StatusInfo.PREDICATE_CHECKS_FAILED
_NO_AVAILABLE_INSTANCES = StatusInfo.NO_AVAILABLE_INSTANCES
_PASSED = {name: PredicateResult(name, True) for name in PREDICATES}
_ALL_PASSED = tuple(_PASSED.values())
_ZERO = Decimal(0)
_scaling_group = attrgetter("scaling_group")

# Placements are built through their slots: the frozen dataclass's __init__ sets each field with
# object.__setattr__, which takes about twice as long, and a round makes thousands of them.
_new_object = object.__new__
# (the slots' member descriptors, read from the class's __dict__: `Placement.session_id` reads the same object)
_set_session_id: Callable[[Placement, str], None] = vars(Placement)["session_id"].__set__
_set_agents: Callable[[Placement, Mapping[str, str]], None] = vars(Placement)["agents"].__set__


def _new_pending(
    session_id: str,
    status_info: str,
    msg: str,
    predicates: tuple[PredicateResult, ...],
    position: int,
    retries: int,
    factors: Factors | None,
    reservation: Reservation | None,
    preempting: tuple[str, ...],
) -> Pending:
    """`Pending(...)` through its slots, as Placements are (about half the time; a round may leave thousands
    waiting); only while these are all its fields, in this order (`_PENDING_BY_SLOTS`)."""
    pending = _new_object(Pending)
    _pending_setters[0](pending, session_id)
    _pending_setters[1](pending, status_info)
    _pending_setters[2](pending, msg)
    _pending_setters[3](pending, predicates)
    _pending_setters[4](pending, position)
    _pending_setters[5](pending, retries)
    _pending_setters[6](pending, factors)
    _pending_setters[7](pending, reservation)
    _pending_setters[8](pending, preempting)
    return pending


_PENDING_FIELDS = (
    "session_id",
    "status_info",
    "msg",
    "predicates",
    "position",
    "retries",
    "factors",
    "reservation",
    "preempting",
)
_PENDING_BY_SLOTS = tuple(f.name for f in fields(Pending)) == _PENDING_FIELDS
_pending_setters: list[Callable[[Pending, object], None]] = (
    [vars(Pending)[name].__set__ for name in _PENDING_FIELDS] if _PENDING_BY_SLOTS else []
)


def schedule(snapshot: Snapshot) -> Decisions:
    """Decide, for every pending session of the snapshot, placement, pending reason or cancel.

    The cyclic garbage collector is paused while the round runs (and resumed, if it was on): a
    round allocates many small objects that live until it ends, and the collections they would
    trigger (walking the caller's whole heap, snapshot included) cost about 6 % of the round."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _schedule(snapshot)
    finally:
        if collecting:
            gc.enable()


def _schedule(snapshot: Snapshot) -> Decisions:
    digits: dict[str, int] = {}
    while True:
        try:
            return _Round(snapshot, SlotTable(digits)).run()
        except Rescale as more:  # an amount with more decimal places than the default scale
            if digits.get(more.name) == more.digits:
                raise ValueError(f"slot {more.name}: cannot represent its amounts exactly") from None
            digits[more.name] = more.digits


class _Round:
    def __init__(self, snapshot: Snapshot, table: SlotTable) -> None:
        self.snapshot = snapshot
        self.now = snapshot.now
        self.table = table
        self.quotas: dict[str, KeypairQuota] = {}
        self.project_quotas: dict[str, ProjectQuota] = {}
        self.by_project = bool(snapshot.projects)  # whether projects', domains' limits are checked at all
        self.by_domain = bool(snapshot.domains)
        self.domain_quotas: dict[str, ProjectQuota] = {}
        self.decisions = Decisions()
        # per group, filled while considering; turned into `Pending` with positions at the end
        self.left: list[
            tuple[PendingSession, str, str, tuple[PredicateResult, ...], Reservation | None, tuple[str, ...]]
        ] = []
        self.backfill: Backfill | None = None  # the group's reservations (policies with backfill)
        # the request being considered, set before anything that may call `no_room` (which reads it)
        self.current: tuple[Prepared, list[Prepared] | None] | None = None
        self.short = False  # select_for's agent is a backfill short fit (the caller does not reserve pool room)
        self._fair: dict[tuple[str, str], float] | None = None

    def quota(self, access_key: str) -> KeypairQuota:
        quota = self.quotas.get(access_key)
        if quota is None:
            quota = KeypairQuota(access_key, self.snapshot.keypairs.get(access_key), self.table)
            self.quotas[access_key] = quota
        return quota

    def project_quota(self, project_id: str) -> ProjectQuota:
        quota = self.project_quotas.get(project_id)
        if quota is None:
            quota = ProjectQuota(self.snapshot.projects.get(project_id), self.table)
            self.project_quotas[project_id] = quota
        return quota

    def domain_quota(self, domain: str) -> ProjectQuota:
        quota = self.domain_quotas.get(domain)
        if quota is None:
            quota = ProjectQuota(self.snapshot.domains.get(domain), self.table, "domain")
            self.domain_quotas[domain] = quota
        return quota

    def run(self) -> Decisions:
        pending = self.snapshot.pending
        names = set(map(_scaling_group, pending))
        sessions: dict[str, list[PendingSession]]
        if len(names) == 1:  # the usual case: one scaling group
            sessions = {names.pop(): list(pending)}
        else:
            sessions = {name: [] for name in names}
            for session in pending:
                sessions[session.scaling_group].append(session)
        agents: dict[str, list[AgentState]] = {}
        for agent in self.snapshot.agents:
            if agent.schedulable:
                agents.setdefault(agent.scaling_group, []).append(agent)
        for name in sorted(sessions):
            self.group(name, sessions[name], agents.get(name, []))
        return self.decisions

    def group(self, name: str, sessions: Sequence[PendingSession], agents: Sequence[AgentState]) -> None:
        group = self.snapshot.scaling_groups.get(name)
        self.known_group = group is not None
        if group is None:
            group = ScalingGroup(name)
        policy = check_policy(group.policy)
        self.sg = group
        self.allowed_types = group.allowed_session_types
        self.pool = AgentPool(name, agents, self.table, group.agent_selection, group.resource_priority)
        self.group_agents = agents
        self._largest: dict[str, Decimal] | None = None  # per slot, the most any agent has: see never_fits
        self.prepared = self.pool.prepared
        self.hosts_of = {a.id: a.vfolder_hosts for a in agents}
        self.gpu_free = {a.id: list(a.gpu_free) for a in agents}
        # by agent number: whether the agent has per-device GPU figures (then GPU requests are packed)
        self.has_gpu_figures = [bool(self.gpu_free[agent_id]) for agent_id in self.pool.ids]
        self.gpu_figures = any(self.has_gpu_figures)
        self.left = []
        depth = group.reservation_depth
        self.backfill = Backfill(self.pool, self.table, agents, self.now, depth) if depth and len(self.pool) else None
        self.preemption = None
        if group.preemption and self.snapshot.running and len(self.pool):
            self.preemption = Preemption(group, self.snapshot.running, self.pool, self.table, self.now) or None
        consider = self.consider
        factors: Mapping[str, Factors] = {}
        if policy == DRF:
            queue = DrfQueue(sessions, self.pool.capacity, lambda key: self.quota(key).occupied)
            while (session := queue.pop()) is not None:
                queue.done(session, consider(session))
        elif policy == MULTIFACTOR:
            scorer = Scorer(group.weights, self.now, self.fair(), self.pool.capacity)
            requests = self.prepare_all(sessions)
            ordered, factors = scorer.order(sessions, [request.slots for request in requests])
            for n in ordered:
                session = sessions[n]
                # (a session of several kernels: its per-kernel requests are prepared again, in `consider`)
                consider(session, requests[n] if len(session.kernels) == 1 else None)
        else:
            for session in lifo_order(sessions) if policy == LIFO else fifo_order(sessions):
                consider(session)
        out = self.decisions.pending
        pending = _new_pending if _PENDING_BY_SLOTS else Pending
        for position, (session, info, msg, results, reservation, preempting) in enumerate(self.left, 1):
            out.append(
                pending(
                    session.id,
                    info,
                    msg,
                    results,
                    position,
                    session.retries + 1,
                    factors.get(session.id),
                    reservation,
                    preempting,
                )
            )

    def fair(self) -> dict[tuple[str, str], float]:
        """The fair-share factor of each (keypair, project) waiting (once per round: usage is the cluster's, not a
        group's)."""
        if self._fair is None:
            snapshot = self.snapshot
            self._fair = session_fair_factors(snapshot.usage, snapshot.shares, snapshot.project_usage, snapshot.pending)
        return self._fair

    def prepare_all(self, sessions: Sequence[PendingSession]) -> list[Prepared]:
        """Each session's request, prepared (its kernels summed, for a session of several), in the sessions' order."""
        pool = self.pool
        cache = pool.prepared
        out: list[Prepared] = []
        append = out.append
        for session in sessions:
            kernels = session.kernels
            if len(kernels) == 1:
                slots = kernels[0].slots
                try:  # the pool's cache, looked up here: most requests repeat
                    append(cache.get(tuple(slots.items())) or pool.prepare(slots))
                except TypeError:  # an unhashable amount: prepare() says what is wrong with it
                    append(pool.prepare(slots))
            else:
                append(self.prepare_each(kernels)[1])
        return out

    def consider(self, session: PendingSession, prepared: Prepared | None = None) -> dict[int, int] | None:
        """Check and place one session; return what it was placed with, or None. `prepared`: its request, when it
        has one kernel and that was prepared already."""
        waiting = None
        if session.depends_on:
            cancel, waiting = preds.dependencies(session, self.snapshot.dependencies)
            if cancel is not None:
                self.decisions.cancels.append(Cancel(session.id, DEPENDENCY_FAILED, cancel))
                return None
        kernels = session.kernels
        if len(kernels) == 1:
            per_kernel = None
            if prepared is None:
                slots = kernels[0].slots
                try:  # the pool's cache, looked up here: most requests repeat
                    prepared = self.prepared.get(tuple(slots.items())) or self.pool.prepare(slots)
                except TypeError:  # an unhashable amount: prepare() says what is wrong with it
                    prepared = self.pool.prepare(slots)
        else:
            per_kernel, prepared = self.prepare_each(kernels)
        access_key = session.access_key
        quota = self.quotas.get(access_key) or self.quota(access_key)
        project = self.project_quota(session.project_id) if self.by_project else None
        domain = self.domain_quota(session.domain_name) if self.by_domain else None
        if (
            waiting is not None
            or (project is not None and project.limited)
            or (domain is not None and domain.limited)
            or session.starts_at is not None
            or session.session_type not in self.allowed_types
            or quota.checked
            or (per_kernel is not None and quota.max_networks > 0)  # several kernels: a network held
            or (
                session.image_min  # remembered per request (see `_meets_image_min`); looked up here for one kernel
                and not (per_kernel is None and prepared.meets.get(id(session.image_min)))
                and not _meets_image_min(session, (prepared,) if per_kernel is None else per_kernel)
            )
        ):  # some predicate may fail: evaluate them all
            failed = self.failed_predicates(session, quota, prepared, per_kernel, waiting, project, domain)
            if failed:
                results = tuple(
                    PredicateResult(name, False, failed[name]) if name in failed else _PASSED[name]
                    for name in PREDICATES
                )
                self.left.append((session, _PREDICATE_CHECKS_FAILED, "; ".join(failed.values()), results, None, ()))
                return None
        pool = self.pool
        total = prepared.slots
        backfill = self.backfill
        if per_kernel is None:
            if session.vfolder_hosts or self.gpu_figures or self.table.saw_infinity:
                self.current = (prepared, per_kernel)  # (for `no_room`)
                agent = self.select_for(session, prepared)  # may choose another agent than the policy's
                if agent is None:
                    return None
                if self.short:
                    self.short = False
                else:
                    pool.reserve(agent, total)
            else:  # the policy's choice stands: select and reserve in one step
                agent = pool.take(prepared)
                if agent is None:
                    end = INFINITE if session.duration is None else session.duration
                    if backfill is None or not backfill.holds or (agent := backfill.short_fit(total, end)) is None:
                        self.current = (prepared, per_kernel)  # (for `no_room`)
                        self.no_room(session, pool.explain(prepared))
                        return None
            if backfill is not None and (backfill.recording or agent in backfill.on):  # (else `placed` does nothing)
                backfill.placed(agent, total, INFINITE if session.duration is None else session.duration)
            mapping = {kernels[0].kernel_id: pool.ids[agent]}
        else:
            self.current = (prepared, per_kernel)  # (for `no_room`)
            placed = self.place_kernels(session, prepared, per_kernel)
            if placed is None:
                return None
            mapping = placed
            if backfill is not None:
                self.backfill_placed(session, per_kernel, mapping)
        quota.concurrent += 1
        if per_kernel is not None:
            quota.networks += 1
        quota.placed.append(total)  # summed into quota.occupied when that is next read
        if project is not None and project.limited:
            project.add(total)
        if domain is not None and domain.limited:
            domain.add(total)
        placement = _new_object(Placement)  # Placement(session.id, mapping), see `_set_session_id`
        _set_session_id(placement, session.id)
        _set_agents(placement, mapping)
        self.decisions.placements.append(placement)
        return total

    def backfill_placed(self, session: PendingSession, per_kernel: list[Prepared], mapping: Mapping[str, str]) -> None:
        """Tell backfill what a session of several kernels took of each agent, and until when."""
        assert self.backfill is not None
        number = self.pool.numbers
        taken: dict[int, dict[int, int]] = {}
        for kernel, request in zip(session.kernels, per_kernel, strict=True):
            mine = taken.setdefault(number[mapping[kernel.kernel_id]], {})
            for i, n in request.slots.items():
                mine[i] = mine.get(i, 0) + n
        end = INFINITE if session.duration is None else session.duration
        for agent, slots in taken.items():
            self.backfill.placed(agent, slots, end)

    def prepare_each(self, kernels: Sequence[KernelRequest]) -> tuple[list[Prepared], Prepared]:
        """Each kernel's request, and their sum (what a single-node session takes of one agent)."""
        pool = self.pool
        per_kernel = [pool.prepare(kernel.slots) for kernel in kernels]
        summed: dict[int, int] = {}
        for request in per_kernel:
            for i, n in request.slots.items():
                summed[i] = summed.get(i, 0) + n
        return per_kernel, pool.prepare_ints(summed)

    def failed_predicates(
        self,
        session: PendingSession,
        quota: KeypairQuota,
        prepared: Prepared,
        per_kernel: list[Prepared] | None,
        waiting: str | None,
        project: ProjectQuota | None = None,
        domain: ProjectQuota | None = None,
    ) -> dict[str, str] | None:
        """Every predicate, in order: {name: message} of those that fail, or None when all pass."""
        failed: dict[str, str] | None = None
        if session.starts_at is not None and (msg := preds.reserved_time(session, self.now)):
            failed = {RESERVED_TIME: msg}
        if waiting is not None:
            failed = failed or {}
            failed[DEPENDENCIES] = waiting
        if session.session_type not in self.allowed_types:
            failed = failed or {}
            failed[ALLOWED_SESSION_TYPES] = preds.allowed_session_types(session, self.sg) or ""
        if (
            session.image_min
            and not _meets_image_min(session, (prepared,) if per_kernel is None else per_kernel)
            and (msg := preds.image_min_resources(session))
        ):
            failed = failed or {}
            failed[IMAGE_MIN_RESOURCES] = msg
        if quota.max_concurrent > 0 and (msg := preds.concurrency(quota)):
            failed = failed or {}
            failed[CONCURRENCY] = msg
        if quota.limited and (msg := preds.keypair_resource_limit(quota, prepared.slots, self.table)):
            failed = failed or {}
            failed[KEYPAIR_RESOURCE_LIMIT] = msg
        if (
            project is not None
            and project.limited
            and (msg := preds.project_resource_limit(project, prepared.slots, self.table))
        ):
            failed = failed or {}
            failed[USER_GROUP_RESOURCE_LIMIT] = msg
        if (
            domain is not None
            and domain.limited
            and (msg := preds.project_resource_limit(domain, prepared.slots, self.table))
        ):
            failed = failed or {}
            failed[DOMAIN_RESOURCE_LIMIT] = msg
        if quota.max_networks > 0 and (msg := preds.session_networks(quota, session)):
            failed = failed or {}
            failed[SESSION_NETWORKS] = msg
        return failed

    def place_kernels(
        self, session: PendingSession, prepared: Prepared, per_kernel: list[Prepared]
    ) -> dict[str, str] | None:
        """Reserve room for a session of several kernels (or none): {kernel id: agent id}, or None."""
        kernels = session.kernels
        if not kernels:
            self.left.append((session, _NO_AVAILABLE_INSTANCES, "the session has no kernels", _ALL_PASSED, None, ()))
            return None
        if session.cluster_mode == MULTI_NODE:
            return self.place_each(session, per_kernel)
        pool = self.pool
        agent = self.select_for(session, prepared)  # (a short fit too: ends before the reservations there start)
        if agent is None:
            return None
        if self.short:
            self.short = False
        else:
            pool.reserve(agent, prepared.slots)
        agent_id = pool.ids[agent]
        return {kernel.kernel_id: agent_id for kernel in kernels}

    def place_each(self, session: PendingSession, per_kernel: list[Prepared]) -> dict[str, str] | None:
        """Multi-node: each kernel on its best agent; all or nothing."""
        pool = self.pool
        kernels = session.kernels
        taken: list[tuple[int, dict[int, int]]] = []
        for n, (kernel, prepared) in enumerate(zip(kernels, per_kernel, strict=True), 1):
            agent = pool.select(prepared)
            if agent is None:
                why = pool.explain(prepared)  # before the rollback: the state it failed in
                for held, reserved in reversed(taken):
                    pool.release(held, reserved)
                self.no_room(session, f"kernel {kernel.name} ({n} of {len(kernels)}): {why}")
                return None
            pool.reserve(agent, prepared.slots)
            taken.append((agent, prepared.slots))
        ids = pool.ids
        return {kernel.kernel_id: ids[agent] for kernel, (agent, _) in zip(kernels, taken, strict=True)}

    def select_for(self, session: PendingSession, prepared: Prepared) -> int | None:
        """The agent for a session placed whole on one agent, or None with the reason recorded.

        The policy's choice stands unless the session mounts folders of a host that agent does not see,
        or asks for GPUs its devices cannot hold (whole devices free, or one device with the share left);
        then the first agent where everything fits."""
        pool = self.pool
        agent = pool.select(prepared)
        if agent is None:
            short = self.short_fit_for(session, prepared)
            if short is not None:
                self.short = True  # (its room is not the pool's to reserve: backfill accounts it)
                return short
            self.no_room(session, pool.explain(prepared))
            return None
        if not session.vfolder_hosts and not self.has_gpu_figures[agent] and not self.table.saw_infinity:
            return agent  # nothing more to check: it sees every host asked for (none), no devices to pack
        return self.check_hosts_and_gpus(session, agent)

    def short_fit_for(self, session: PendingSession, prepared: Prepared) -> int | None:
        """An agent kept for reservations where the session fits now because it ends before they start (backfill),
        that sees its folders' hosts and whose GPUs can hold it (then packed); or None."""
        backfill = self.backfill
        if backfill is None or not backfill.holds:
            return None
        agent = backfill.short_fit(prepared.slots, INFINITE if session.duration is None else session.duration)
        if agent is None:
            return None
        agent_id = self.pool.ids[agent]
        if not session.vfolder_hosts <= self.hosts_of[agent_id]:
            return None
        free = self.gpu_free.get(agent_id)
        if free:
            whole, fraction = gpu_request(_summed(session))
            if whole > 0 or fraction > 0:
                packed = gpu_pack(free, whole, fraction)
                if packed is None:
                    return None
                for i, amount in packed:
                    free[i] -= amount
        return agent

    def check_hosts_and_gpus(self, session: PendingSession, agent: int) -> int | None:
        """`select_for` for a session that mounts folders, or for an agent with per-device GPU figures."""
        pool = self.pool
        need = _summed(session)
        whole, fraction = gpu_request(need)
        gpus = whole > 0 or fraction > 0

        def fits_gpus(agent_id: str) -> bool:
            # agents without per-device figures are held to the slot arithmetic alone
            free = self.gpu_free.get(agent_id)
            return not gpus or not free or gpu_pack(free, whole, fraction) is not None

        def sees(agent_id: str) -> bool:
            return session.vfolder_hosts <= self.hosts_of[agent_id]

        chosen = agent
        if not (sees(pool.ids[agent]) and fits_gpus(pool.ids[agent])):
            found: int | None = None
            for i, agent_id in enumerate(pool.ids):
                free = pool.free(i)
                if (
                    sees(agent_id)
                    and fits_gpus(agent_id)
                    and all(free.get(name, Decimal(0)) >= amount for name, amount in need.items() if amount)
                ):
                    found = i
                    break
            if found is None:
                self.no_room(session, self._why_not(session, whole, fraction, sees))
                return None
            chosen = found
        if gpus and self.gpu_free.get(pool.ids[chosen]):
            agent_id = pool.ids[chosen]
            for i, amount in gpu_pack(self.gpu_free[agent_id], whole, fraction) or []:
                self.gpu_free[agent_id][i] -= amount
        return chosen

    def _why_not(self, session: PendingSession, whole: int, fraction: Decimal, sees: Callable[[str], bool]) -> str:
        pool = self.pool
        if session.vfolder_hosts:
            hosts = ", ".join(sorted(session.vfolder_hosts))
            if not any(sees(a) for a in pool.ids):
                return f"no agent of scaling group {pool.group} sees vfolder host {hosts}"
            if not (whole or fraction):
                return f"no agent that sees vfolder host {hosts} has room"
        # the GPU shortage, shown on the agent with the most GPU room left
        best = max(pool.ids, key=lambda a: sum(self.gpu_free.get(a, [])), default=None)
        if best is None or not self.gpu_free.get(best):
            return f"no agent of scaling group {pool.group} has GPUs"
        return f"no agent's GPUs can hold it: best is {best}, {gpu_shortage(self.gpu_free[best], whole, fraction)}"

    def never_fits(self, session: PendingSession) -> str | None:
        """The reason "needs cpu 64; the largest agent has 2" when no agent of the group could hold the
        session even with nothing running (its kernels summed, or each kernel of a multi-node one)."""
        if not self.group_agents:
            return None
        largest = self._largest
        if largest is None:
            largest = self._largest = {}
            for agent in self.group_agents:
                for slot, amount in agent.capacity.items():
                    if amount > largest.get(slot, _ZERO):
                        largest[slot] = amount
        which = "the largest agent" if len(self.group_agents) > 1 else "the only agent"
        kernels = session.kernels
        multi = session.cluster_mode == MULTI_NODE and len(kernels) > 1
        requests = (
            [k.slots for k in kernels] if multi else [kernels[0].slots if len(kernels) == 1 else _summed(session)]
        )
        for n, slots in enumerate(requests):
            too_big = [
                name for name, amount in slots.items() if amount > largest.get(name, _ZERO) and largest.get(name)
            ]
            if too_big:
                name = min(too_big, key=lambda x: (x != "cpu", x != "mem", x))
                need, have = _shown(name, slots[name]), _shown(name, largest[name])
                where = f"kernel {kernels[n].name} ({n + 1} of {len(kernels)}) " if multi else ""
                return f"{where}needs {name} {need}; {which} has {have}"
        return None

    def no_room(self, session: PendingSession, msg: str) -> None:
        current = self.current
        # one kernel: whether it fits the largest agent is the same for every equal request (kept on the prepared
        # one); the message, which shows the session's own amounts, is made each time
        single = current is not None and current[1] is None and len(session.kernels) == 1
        if single and current is not None and current[0].within_largest:
            never = None
        else:
            never = self.never_fits(session) if session.kernels else None
            if single and never is None and current is not None:
                current[0].within_largest = True
        if never is not None:
            msg = never
        if not self.known_group and not len(self.pool):
            msg += " (the scaling group is not configured)"
        reservation = None
        backfill = self.backfill
        preempting: tuple[str, ...] = ()
        if never is None and self.preemption is not None and self.current is not None:
            prepared, per_kernel = self.current
            requests = [prepared.slots] if per_kernel is None else [p.slots for p in per_kernel]
            spread = per_kernel is not None and session.cluster_mode == MULTI_NODE
            plan = self.preemption.plan(session, requests, spread)
            if plan is not None:
                self.preempt(session, plan, requests if spread else [prepared.slots])
                preempting = tuple(v.id for v in plan.victims)
                agents = tuple(dict.fromkeys(self.pool.ids[a] for a in plan.agents))
                reservation = Reservation(None, agents)
                msg += "; " + preempting_text(plan, agents)
        if (
            never is None
            and not preempting
            and backfill is not None
            and backfill.wants_more
            and self.current is not None
        ):
            prepared, per_kernel = self.current
            requests = [prepared.slots] if per_kernel is None else [p.slots for p in per_kernel]
            spread = per_kernel is not None and session.cluster_mode == MULTI_NODE
            reservation = backfill.reserve(session.id, requests, spread, session.duration)
            if reservation is not None:
                msg += "; " + reserved_text(reservation)
        self.left.append((session, _NO_AVAILABLE_INSTANCES, msg, _ALL_PASSED, reservation, preempting))

    def preempt(self, session: PendingSession, plan: Plan, requests: Sequence[Mapping[int, int]]) -> None:
        """Stop the plan's new victims, and keep for `session` what is free already on its agents (later sessions
        of this round would take it, and the victims' room alone would not be enough when it comes back)."""
        for victim in plan.new:
            why = (
                f"preempted by {session.name} (priority {session.priority}) to make room: "
                f"it had priority {victim.priority}"
            )
            self.decisions.preemptions.append(Preempt(victim.id, session.id, why))
        pool = self.pool
        summed: dict[int, dict[int, int]] = {}
        for agent, request in zip(plan.agents, requests, strict=True):
            mine = summed.setdefault(agent, {})
            for i, n in request.items():
                mine[i] = mine.get(i, 0) + n
        for agent, request in summed.items():
            remaining = pool.remaining(agent)
            take = {i: min(n, remaining[i]) for i, n in request.items() if i < len(remaining) and remaining[i] > 0}
            if take:
                pool.reserve(agent, take)


def preempting_text(plan: Plan, agents: Sequence[str]) -> str:
    """`preempting low1, low2 on a1: starts once they have ended`."""
    names = ", ".join(v.name for v in plan.victims[:5]) + (
        f" and {len(plan.victims) - 5} more" if len(plan.victims) > 5 else ""
    )
    return f"preempting {names} on {', '.join(agents)}: starts once they have ended"


def reserved_text(reservation: Reservation) -> str:
    """`reserved: starts by 2026-12-07 14:20 UTC on a1, a2` (or, when no known end makes room, the agents kept)."""
    agents = ", ".join(reservation.agents)
    if reservation.starts_at is None:
        return f"reserved: {agents} kept for it until their running sessions (of unknown length) end"
    return f"reserved: starts by {reservation.starts_at:%Y-%m-%d %H:%M} UTC on {agents}"


def _meets_image_min(session: PendingSession, requests: Sequence[Prepared]) -> bool:
    """Whether every kernel asks for at least the image's minimum, remembered per distinct request.

    `requests` are the kernels' prepared requests: shared between equal requests, so the answer
    (the same for equal amounts) is kept on them, by the identity of the minimum, which every
    session holds for the whole round."""
    minimum = session.image_min
    key = id(minimum)
    for n, request in enumerate(requests):
        ok = request.meets.get(key)
        if ok is None:
            slots = session.kernels[n].slots
            ok = request.meets[key] = not any(slots.get(name, _ZERO) < least for name, least in minimum.items())
        if not ok:
            return False
    return True


def _shown(name: str, amount: Decimal) -> str:
    """An amount with its unit apart: 64 GiB, 512 MiB, 2 (as `format_amount`, spaced)."""
    text = format_amount(name, amount)
    if text.endswith("iB"):
        return f"{text[:-3]} {text[-3:]}"
    if text.endswith("B") and text[:-1].isdigit():
        return f"{text[:-1]} B"
    return text


def _summed(session: PendingSession) -> dict[str, Decimal]:
    need: dict[str, Decimal] = {}
    for kernel in session.kernels:
        for name, amount in kernel.slots.items():
            need[name] = need.get(name, Decimal(0)) + amount
    return need


def decisions_by_session(decisions: Decisions) -> Mapping[str, Placement | Pending | Cancel]:
    """Every decision keyed by session id (handy for callers and tests)."""
    out: dict[str, Placement | Pending | Cancel] = {}
    items: tuple[Placement | Pending | Cancel, ...] = (*decisions.placements, *decisions.pending, *decisions.cancels)
    for item in items:
        out[item.session_id] = item
    return out
