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
   "no agent has room: best is a1 with cpu 1 free of 2 requested", or
   "no schedulable agent in scaling group G".
4. A session that is not placed never stops the sessions after it (Backend.AI stops the group at
   the first `no-available-instances`; we do not).

Every input session ends up in exactly one of `placements`, `pending`, `cancels`. `Pending.position`
is the 1-based place among the group's sessions left pending, in the order they were considered.
Agent room and keypair use are updated as the round goes; the caller's objects are not touched.
`scheduler-error` is never produced here: the caller catches exceptions (ValueError for an
unknown policy or selection strategy, TypeError for a non-Decimal amount).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal

from bai.common.gpus import describe_shortage as gpu_shortage
from bai.common.gpus import pack as gpu_pack
from bai.common.gpus import request_of as gpu_request
from bai.common.status import StatusInfo

from . import predicates as preds
from .policies import DrfQueue, check_policy, fifo_order, lifo_order
from .predicates import KeypairQuota
from .selection import AgentPool, Prepared, Rescale, SlotTable
from .snapshot import (
    ALLOWED_SESSION_TYPES,
    CONCURRENCY,
    DEPENDENCIES,
    DEPENDENCY_FAILED,
    DRF,
    IMAGE_MIN_RESOURCES,
    KEYPAIR_RESOURCE_LIMIT,
    LIFO,
    MULTI_NODE,
    PREDICATES,
    RESERVED_TIME,
    AgentState,
    Cancel,
    Decisions,
    Pending,
    PendingSession,
    Placement,
    PredicateResult,
    ScalingGroup,
    Snapshot,
)

__all__ = ["decisions_by_session", "schedule"]

_PREDICATE_CHECKS_FAILED = StatusInfo.PREDICATE_CHECKS_FAILED
_NO_AVAILABLE_INSTANCES = StatusInfo.NO_AVAILABLE_INSTANCES
_PASSED = {name: PredicateResult(name, True) for name in PREDICATES}
_ALL_PASSED = tuple(_PASSED.values())


def schedule(snapshot: Snapshot) -> Decisions:
    """Decide, for every pending session of the snapshot, placement, pending reason or cancel."""
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
        self.decisions = Decisions()
        # per group, filled while considering; turned into `Pending` with positions at the end
        self.left: list[tuple[PendingSession, str, str, tuple[PredicateResult, ...]]] = []

    def quota(self, access_key: str) -> KeypairQuota:
        quota = self.quotas.get(access_key)
        if quota is None:
            quota = KeypairQuota(access_key, self.snapshot.keypairs.get(access_key), self.table)
            self.quotas[access_key] = quota
        return quota

    def run(self) -> Decisions:
        sessions: dict[str, list[PendingSession]] = {}
        for session in self.snapshot.pending:
            group = sessions.get(session.scaling_group)
            if group is None:
                sessions[session.scaling_group] = [session]
            else:
                group.append(session)
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
        self.hosts_of = {a.id: a.vfolder_hosts for a in agents}
        self.gpu_free = {a.id: list(a.gpu_free) for a in agents}
        self.left = []
        consider = self.consider
        if policy == DRF:
            queue = DrfQueue(sessions, self.pool.capacity, lambda key: self.quota(key).occupied)
            while (session := queue.pop()) is not None:
                queue.done(session, consider(session))
        else:
            for session in lifo_order(sessions) if policy == LIFO else fifo_order(sessions):
                consider(session)
        out = self.decisions.pending
        for position, (session, info, msg, results) in enumerate(self.left, 1):
            out.append(Pending(session.id, info, msg, results, position, session.retries + 1))

    def consider(self, session: PendingSession) -> dict[int, int] | None:
        """Check and place one session; return what it was placed with, or None."""
        waiting = None
        if session.depends_on:
            cancel, waiting = preds.dependencies(session, self.snapshot.dependencies)
            if cancel is not None:
                self.decisions.cancels.append(Cancel(session.id, DEPENDENCY_FAILED, cancel))
                return None
        pool = self.pool
        kernels = session.kernels
        per_kernel: list[Prepared] | None = None
        if len(kernels) == 1:
            prepared = pool.prepare(kernels[0].slots)
        else:
            per_kernel = [pool.prepare(kernel.slots) for kernel in kernels]
            summed: dict[int, int] = {}
            for request, _, _ in per_kernel:
                for i, n in request.items():
                    summed[i] = summed.get(i, 0) + n
            prepared = pool.prepare_ints(summed)
        total = prepared[0]
        access_key = session.access_key
        quota = self.quotas.get(access_key) or self.quota(access_key)

        # -- predicates: all of them, in order
        failed: dict[str, str] | None = None
        if session.starts_at is not None and (msg := preds.reserved_time(session, self.now)):
            failed = {RESERVED_TIME: msg}
        if waiting is not None:
            failed = failed or {}
            failed[DEPENDENCIES] = waiting
        if session.session_type not in self.allowed_types:
            failed = failed or {}
            failed[ALLOWED_SESSION_TYPES] = preds.allowed_session_types(session, self.sg) or ""
        if session.image_min and (msg := preds.image_min_resources(session)):
            failed = failed or {}
            failed[IMAGE_MIN_RESOURCES] = msg
        if quota.max_concurrent > 0 and (msg := preds.concurrency(quota)):
            failed = failed or {}
            failed[CONCURRENCY] = msg
        if quota.limited and (msg := preds.keypair_resource_limit(quota, total, self.table)):
            failed = failed or {}
            failed[KEYPAIR_RESOURCE_LIMIT] = msg
        if failed:
            results = tuple(
                PredicateResult(name, False, failed[name]) if name in failed else _PASSED[name] for name in PREDICATES
            )
            self.left.append((session, _PREDICATE_CHECKS_FAILED, "; ".join(failed.values()), results))
            return None

        # -- placement
        if per_kernel is None:
            agent = self.select_for(session, prepared)
            if agent is None:
                return None
            pool.reserve(agent, total)
            mapping = {kernels[0].kernel_id: pool.ids[agent]}
        elif not kernels:
            self.left.append((session, _NO_AVAILABLE_INSTANCES, "the session has no kernels", _ALL_PASSED))
            return None
        elif session.cluster_mode == MULTI_NODE:
            mapping = self.place_each(session, per_kernel)
            if mapping is None:
                return None
        else:
            agent = self.select_for(session, prepared)
            if agent is None:
                return None
            pool.reserve(agent, total)
            agent_id = pool.ids[agent]
            mapping = {kernel.kernel_id: agent_id for kernel in kernels}
        quota.concurrent += 1
        occupied = quota.occupied
        for i, n in total.items():
            occupied[i] = occupied.get(i, 0) + n
        self.decisions.placements.append(Placement(session.id, mapping))
        return total

    def place_each(self, session: PendingSession, per_kernel: list[Prepared]) -> dict[str, str] | None:
        """Multi-node: each kernel on its best agent; all or nothing."""
        pool = self.pool
        kernels = session.kernels
        taken: list[tuple[int, dict[int, int]]] = []
        for n, (kernel, (request, shape, amounts)) in enumerate(zip(kernels, per_kernel, strict=True), 1):
            agent = pool.select(shape, amounts)
            if agent is None:
                why = pool.explain(shape, amounts)  # before the rollback: the state it failed in
                for held, reserved in reversed(taken):
                    pool.release(held, reserved)
                self.no_room(session, f"kernel {kernel.kernel_id} ({n} of {len(kernels)}): {why}")
                return None
            pool.reserve(agent, request)
            taken.append((agent, request))
        ids = pool.ids
        return {kernel.kernel_id: ids[agent] for kernel, (agent, _) in zip(kernels, taken, strict=True)}

    def select_for(self, session: PendingSession, prepared: Prepared) -> int | None:
        """The agent for a session placed whole on one agent, or None with the reason recorded.

        The policy's choice stands unless the session mounts folders of a host that agent does not see,
        or asks for GPUs its devices cannot hold (whole devices free, or one device with the share left);
        then the first agent where everything fits."""
        pool = self.pool
        agent = pool.select(prepared[1], prepared[2])
        if agent is None:
            self.no_room(session, pool.explain(prepared[1], prepared[2]))
            return None
        need = _summed(session)
        whole, fraction = gpu_request(need)
        gpus = whole > 0 or fraction > 0

        def fits_gpus(agent_id: str) -> bool:
            # agents without per-device figures are held to the slot arithmetic alone
            free = self.gpu_free.get(agent_id)
            return not gpus or not free or gpu_pack(free, whole, fraction) is not None

        def sees(agent_id: str) -> bool:
            return session.vfolder_hosts <= self.hosts_of[agent_id]

        chosen: int | None = agent
        if not (sees(pool.ids[agent]) and fits_gpus(pool.ids[agent])):
            chosen = None
            for i, agent_id in enumerate(pool.ids):
                free = pool.free(i)
                if (
                    sees(agent_id)
                    and fits_gpus(agent_id)
                    and all(free.get(name, Decimal(0)) >= amount for name, amount in need.items() if amount)
                ):
                    chosen = i
                    break
            if chosen is None:
                self.no_room(session, self._why_not(session, whole, fraction, sees))
                return None
        if gpus and self.gpu_free.get(pool.ids[chosen]):
            agent_id = pool.ids[chosen]
            for i, amount in gpu_pack(self.gpu_free[agent_id], whole, fraction) or []:
                self.gpu_free[agent_id][i] -= amount
        return chosen

    def _why_not(self, session: PendingSession, whole: int, fraction: Decimal, sees) -> str:
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

    def no_room(self, session: PendingSession, msg: str) -> None:
        if not self.known_group and not len(self.pool):
            msg += " (the scaling group is not configured)"
        self.left.append((session, _NO_AVAILABLE_INSTANCES, msg, _ALL_PASSED))


def _summed(session: PendingSession) -> dict[str, Decimal]:
    need: dict[str, Decimal] = {}
    for kernel in session.kernels:
        for name, amount in kernel.slots.items():
            need[name] = need.get(name, Decimal(0)) + amount
    return need


def decisions_by_session(decisions: Decisions) -> Mapping[str, Placement | Pending | Cancel]:
    """Every decision keyed by session id (handy for callers and tests)."""
    out: dict[str, Placement | Pending | Cancel] = {}
    for item in (*decisions.placements, *decisions.pending, *decisions.cancels):
        out[item.session_id] = item
    return out
