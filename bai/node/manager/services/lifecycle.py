"""The session lifecycle: create (admission), the scheduler's rounds applied, start, destroy, forced ends,
stuck starts and destroys, and what agents report of kernels (reconcile, kernels that ended, logs, statistics,
pulls). What users do with running kernels is `kernel_ops.KernelOps`; the reads of the HTTP layer are
`session_reads.SessionReads`.

Every state change goes through `SessionState.transition` (one transaction that rejects illegal moves)
and is published on the EventHub only after it is committed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime
from typing import Any

import msgspec

from bai.common import slots as slotlib
from bai.common.background import Background
from bai.common.clock import Clock
from bai.common.cluster import SINGLE_NODE, cluster_environ, kernel_name_of, members, network_name
from bai.common.images import registry_of
from bai.common.problems import Problem
from bai.common.status import (
    ACTIVE_STATUSES,
    DEAD_STATUSES,
    FORCED_DESTROY,
    OCCUPYING_STATUSES,
    SESSION_EVENTS,
    SessionStatus,
    StatusInfo,
)
from bai.node.link.base import AgentUnavailable, ManagerLink, RemoteError
from bai.node.link.messages import (
    ClusterSpec,
    CreateKernel,
    Destroyed,
    DestroyKernel,
    DotfileSpec,
    Execute,
    Interrupt,
    KernelInfo,
    KernelPulling,
    KernelStats,
    KernelTerminated,
    MountSpec,
    call,
)
from bai.node.manager.domain_errors import Conflict, Forbidden, Invalid, KeepsChanging, SessionNotFound
from bai.node.manager.http.requests import CreateRequest
from bai.node.manager.rules.access import actor_of, check_scaling_group, project_for
from bai.node.manager.rules.admission import Admission, admit, check_policy
from bai.node.manager.rules.placeable import unplaceable, unplaceable_spread
from bai.node.manager.services.activity import Activity
from bai.node.manager.services.agent_registry import PULL_TIMEOUT, Agents
from bai.node.manager.services.cluster_keys import NoKeygen, cluster_dotfiles, new_keypair
from bai.node.manager.services.diskfull import FullDiskWarnings, is_disk_full, where_full
from bai.node.manager.services.hooks import Hooks, hook_view
from bai.node.manager.services.hubs import Hubs
from bai.node.manager.services.image_catalogue import Images
from bai.node.manager.services.kernel_logs import newest_seq
from bai.node.manager.services.metrics import ManagerMetrics
from bai.node.manager.services.queue_limit import QueueGate, check_pending_limit
from bai.node.manager.services.runs import RunHistory
from bai.node.manager.services.stats_book import StatsBook, last_stat, stored_stat, with_peaks
from bai.node.manager.services.vfolder_service import VFolders
from bai.node.manager.services.wakeup import Wakeup
from bai.node.manager.state import State
from bai.node.manager.state.records import (
    UNSET,
    Dotfile,
    Kernel,
    KernelChanges,
    NewKernel,
    NewSession,
    SchedulingAttempt,
    Session,
)

log = logging.getLogger("bai.manager")
S = SessionStatus
ACTIVE_VALUES = frozenset(s.value for s in ACTIVE_STATUSES)
STARTING = [S.PREPARING, S.PULLING]  # a kernel on its way: being created, or its image pulled first
HOOK_POINTS = {S.RUNNING: "after_start", S.TERMINATED: "after_termination", S.CANCELLED: "after_termination"}
# a session moving to one of these has its kernels' last statistics stored (last_stat), and forgotten
FINAL_STATS = DEAD_STATUSES | {S.ERROR}
# statuses a destroy ends only when forced (Backend.AI's; a 403 saying so otherwise)
FORCED_ONLY = frozenset({S.SCHEDULED, S.PREPARING, S.PULLING, S.TERMINATING, S.ERROR, S.PREEMPTED})
DESTROY_ATTEMPTS = 5  # a destroy follows a session that changes status meanwhile this many times
# kernels an agent still runs of sessions in these statuses are removed (see Sessions.remove_strays)
ENDED_KERNEL_VALUES = frozenset(s.value for s in DEAD_STATUSES | {S.ERROR})
MAX_STRAY_LOOKS = 10_000  # agents whose last heartbeat's kernels are remembered (then: forgotten, looked up again)
STARTING_OR_SCHEDULED = frozenset({S.SCHEDULED, *STARTING})
DISK_RETRY, DISK_RETRY_MAX = 0.5, 5.0  # seconds between tries of a write that must happen, on a full disk
FORCED_REMOVE_TIMEOUT = 15.0  # seconds a forced destroy waits for an agent to remove a kernel (then: when it is back)


BATCH_AGENT_POLL = 1.0  # seconds between asks for a batch command while its agent is away
# seconds a preempted batch command has to end after it is interrupted (SIGINT: it may save its work), before its
# kernel is removed (Slurm's KillWait is 30 s by default; a scheduler that waits for room waits less here)
PREEMPT_STOP_WAIT = 10.0
PREEMPTIBLE_STATUSES = (S.RUNNING, S.RUNNING_DEGRADED, S.RESTARTING)


def batch_run_id(session_id: str) -> str:
    """The run id of a batch session's command: the same whoever asks (a manager that restarted too)."""
    return f"batch-{session_id}"


def _some(ids: list[str], most: int = 8) -> str:
    """The first few of a list of ids, for a log line."""
    return ", ".join(ids[:most]) + (f" and {len(ids) - most} more" if len(ids) > most else "")


def _error_data(agent_id: str | None, exc: BaseException) -> dict[str, Any]:
    message = exc.message if isinstance(exc, RemoteError) else str(exc)
    name = exc.kind if isinstance(exc, RemoteError) else type(exc).__name__
    return {"error": {"src": "agent", "agent_id": agent_id, "name": name, "repr": message}}


class _Ids:
    """Random (version 4) UUIDs, drawn from the OS 64 at a time: one urandom call (which lets go of the GIL,
    a costly hand-over in a busy manager) instead of one per id."""

    def __init__(self, batch: int = 64) -> None:
        self.batch = batch
        self._pool: list[str] = []

    def __call__(self) -> str:
        if not self._pool:
            raw = os.urandom(16 * self.batch)
            self._pool = [str(uuid.UUID(bytes=raw[i : i + 16], version=4)) for i in range(0, len(raw), 16)]
        return self._pool.pop()


new_id = _Ids()


def new_session_rows(
    req: CreateRequest,
    access_key: str,
    now: datetime,
    depends_on: list[str] | None = None,
    mounts: list[dict[str, Any]] | None = None,
) -> tuple[NewSession, list[NewKernel]]:
    """The rows a new session is stored as (`SessionState.create_session`): the session and its kernels (main1, sub1 …,
    each asking for `req.resources`; the session asks for all of them together)."""
    size = req.cluster_size
    per_kernel = slotlib.to_wire(req.resources)
    kernels = [NewKernel(new_id(), m.role, m.idx, per_kernel) for m in members(size)]
    config = {**req.config, "depends_on": depends_on or [], "mounts": mounts or []}
    if not req.preemptible:
        config["preemptible"] = False
    if size > 1:
        config["cluster_mode"] = req.cluster_mode
    session = NewSession(
        id=new_id(),
        name=req.name,
        access_key=access_key,
        image=req.image,
        type=req.type,
        requested_slots=per_kernel if size == 1 else slotlib.to_wire(_times(req.resources, size)),
        environ=req.environ,
        config=config,
        scaling_group=req.scaling_group,
        created_at=now,
        tag=req.tag,
        domain_name=req.domain_name,
        project_id=req.project_id,
        priority=req.priority,
        time_limit=req.time_limit,
    )
    return session, kernels


def _times(slots: dict[str, Any], count: int) -> dict[str, Any]:
    return {name: amount * count for name, amount in slots.items()}


def _placed(kernels: list[Kernel], placed: dict[str, str]) -> list[Kernel]:
    """The kernels, each on its agent: the one stored, else the one the round placed it on."""
    return [k if k.agent_id else msgspec.structs.replace(k, agent_id=placed.get(k.id)) for k in kernels]


def cluster_mode_of(session: Session) -> str:
    return (session.config or {}).get("cluster_mode") or SINGLE_NODE


class SessionLifecycle:
    """The session lifecycle: create, start what the scheduler placed, destroy, and what agents report
    about their kernels."""

    def __init__(
        self,
        store: State,
        link: ManagerLink,
        agents: Agents,
        images: Images,
        hubs: Hubs,
        activity: Activity,
        runs: RunHistory,
        *,
        vfolders: VFolders | None = None,
        hooks: Hooks | None = None,
        admission: Admission | None = None,
        metrics: ManagerMetrics | None = None,
        wake: Wakeup | None = None,
        background: Background | None = None,
        start_timeout: float = 60.0,
        clock: Clock | None = None,
        stats: StatsBook | None = None,
    ) -> None:
        self.clock = clock or Clock()
        self.stats = stats or StatsBook()  # kernels' live statistics (what agents sample)
        self.store = store
        self.link = link
        self.agents = agents
        self.images = images
        self.events = hubs.events  # session lifecycle: (event name, session row)
        # what the dashboard follows besides sessions: agents joining, leaving, heartbeating (published by
        # Agents), ("pending_updated", {"ids": [...]}) after a scheduling round, ("run_finished", …)
        self.changes = hubs.changes
        self.logs = hubs.logs
        self.vfolders = vfolders
        self.hooks = hooks or Hooks([])
        self.admission = admission or Admission()  # networks and image registries sessions may ask for
        self.queue = QueueGate(store)  # each keypair's PENDING sessions, bounded by max_pending_session_count
        self.metrics = metrics or ManagerMetrics()
        self.wake = wake or Wakeup()
        self.background = background or Background(log)
        self.spawn = self.background.spawn
        self.start_timeout = start_timeout
        self.activity = activity  # forgotten when a session ends
        self.runs = runs  # each session's runs (the log view's separators): a batch session's, ended with it
        self.full_disk = FullDiskWarnings(log)  # background writes (kernel logs, ends of starts) on a full disk
        # requests some agent could hold, by (scaling group, slots), for the agents as of `_placeable_version`
        self._placeable: set[tuple[Any, ...]] = set()
        self._placeable_version = -1
        self._said_no_keygen = False
        self._ended_version = 0  # counts sessions that ended (ERROR, TERMINATED, CANCELLED): strays may be new
        self._stray_looks: dict[str, tuple[frozenset[str], int]] = {}  # agent -> (its kernels, _ended_version)
        self._removing: set[str] = set()  # kernels an agent is being told to remove (remove_strays)
        self.starting: set[str] = set()  # sessions whose start (or failed start's end) is under way
        self._batching: set[str] = set()  # batch sessions whose command is being followed (_follow_batch)
        self.ending: set[str] = set()  # sessions whose kernels are being removed (a destroy under way)
        self._said_stuck: set[str] = set()  # sessions stuck TERMINATING the log has named (end_stuck_destroy)
        # preempted batch sessions whose command was interrupted: (its exit code, why its run was lost) when it ends
        self._batch_exits: dict[str, asyncio.Future[tuple[int | None, str | None]]] = {}

    async def close(self) -> None:
        await self.background.close()

    def is_starting(self, session_id: str) -> bool:
        """Whether the session's start (or a failed start's end) is under way here."""
        return session_id in self.starting

    def is_ending(self, session_id: str) -> bool:
        """Whether a destroy of the session is removing its kernels now."""
        return session_id in self.ending

    # -- state changes ------------------------------------------------------------------------

    async def transition(
        self,
        session_id: str,
        target: SessionStatus,
        info: str = "",
        data: dict[str, Any] | None = None,
        *,
        allowed_from: Iterable[SessionStatus] | None = None,
        kernel_updates: dict[str, KernelChanges] | None = None,
        result: str | None = None,
    ) -> Session | None:
        final = target in FINAL_STATS and session_id in self.stats.sessions
        if final:  # the kernels' last samples are stored with the move (their last_stat)
            updates = dict(kernel_updates or {})
            for kernel_id, sample in self._finals(session_id).items():
                own = updates.get(kernel_id, KernelChanges())
                updates[kernel_id] = msgspec.structs.replace(own, last_stat=sample) if own.last_stat is UNSET else own
            kernel_updates = updates
        row = await self.store.transition(
            session_id,
            target,
            info,
            data,
            allowed_from=allowed_from,
            kernel_updates=kernel_updates,
            result=result,
            now=self.clock.now(),
        )
        if row is not None:
            if final:
                self.stats.forget(session_id)
            self._moved(session_id, target, row)
        return row

    def _finals(self, session_id: str) -> dict[str, dict[str, Any]]:
        """The last sample of each of the session's kernels the book has, with its peaks (what is stored)."""
        out = {}
        for kernel_id in self.stats.kernels_of(session_id):
            sample = self.stats.latest(kernel_id)
            if sample is not None:
                out[kernel_id] = with_peaks(sample, self.stats.peaks(kernel_id))
        return out

    def _moved(self, session_id: str, target: SessionStatus, row: Session) -> None:
        """A committed transition: its event, the dispatcher woken when slots are freed, hooks told."""
        self.events.publish(SESSION_EVENTS.get(target, f"session_{target.lower()}"), row)
        if target in FINAL_STATS:
            self._ended_version += 1
        if target in DEAD_STATUSES or target == S.TERMINATING:
            self.wake()
            self.activity.forget(session_id)
            self.runs.end_all(session_id, self.clock.now().isoformat())
        if self.hooks and target in HOOK_POINTS:
            self.spawn(self._notify_hooks(HOOK_POINTS[target], row), f"hooks-{session_id}")

    async def _notify_hooks(self, point: str, session: Session) -> None:
        notes = await self.hooks.notify(point, session)
        if notes:
            await self.store.add_hook_notes(session.id, notes)

    # -- create ---------------------------------------------------------------------------------

    def _reuse(self, row: Session, req: CreateRequest) -> tuple[Session, bool]:
        """Get-or-create: the live session of that name, if the request may reuse it."""
        if row.image != req.image or not req.reuse:
            raise Conflict(
                f"session {req.name!r} already exists",
                "The session already exists but you requested a different image.",
                row.id,
            )
        if req.group is not None and row.project_id != req.project_id:
            raise Conflict(
                f"session {req.name!r} already exists in another project: end it, or give another name",
                "The session already exists in another project.",
                row.id,
            )
        return row, False

    async def _unplaceable(self, req: CreateRequest) -> Problem | None:
        """Why no agent of the request's group could ever hold it (see placeable.py), or None. What the agents
        could hold is remembered until an agent joins, leaves or changes (the store's agents_version)."""
        version, agents = await self.store.agent_capacities()
        if version != self._placeable_version:
            self._placeable.clear()
            self._placeable_version = version
        size, mode = req.cluster_size, req.cluster_mode
        key = (req.scaling_group, tuple(sorted(req.resources.items())), size, mode)
        if key in self._placeable:
            return None
        gpus = self.agents.gpu_devices()
        rows = [msgspec.structs.asdict(a) for a in agents]  # (the rules read mappings; only when not known)
        if size > 1 and mode != SINGLE_NODE:
            problem = unplaceable_spread(req.resources, req.scaling_group, rows, gpus, size)
        else:  # every kernel on one agent
            problem = unplaceable(req.resources, req.scaling_group, rows, gpus, size)
        if problem is None and version == self.store.capacities_version():
            self._placeable.add(key)
        return problem

    async def _over_policy(self, access_key: str, req: CreateRequest) -> Problem | None:
        """Why the owner's resource policy could never let the request start (admission.check_policy), or
        None; the request's priority lowered to the policy's `max_priority`. The policy is the one the scheduler
        judges by: the keypair's, the default one for a keypair
        the store does not have (one read: policies change at any time)."""
        keypair = self.store.active_keypair(access_key) or await self.store.keypair(access_key)
        policy = await self.store.policy(keypair.resource_policy if keypair else "default")
        if policy is not None:  # (as Backend.AI: a priority above the policy's bound is lowered to it)
            req.priority = min(req.priority, policy.max_priority)
        return check_policy(policy, access_key, req)

    def _plain(self, req: CreateRequest) -> bool:
        """Whether creating `req` needs nothing but the stored sessions and what is in memory: no folders to
        mount, no sessions to depend on, no hooks to ask, an image available without asking the agents (see
        Images.check_available: a manager with no docker agent of its own, as a follower the agents do not dial,
        asks none either way)."""
        if req.mounts or req.depends or self.hooks:
            return False
        return self.images.available_unasked(req.image)

    async def create(self, access_key: str, req: CreateRequest, is_admin: bool = False) -> tuple[Session, bool]:
        self._place(access_key, req)
        groups: set[str] = set()
        if req.scaling_group not in self.admission.groups:  # a group only agents name
            groups = {a.scaling_group for a in (await self.store.agent_capacities())[1]}
        if problem := admit(self.admission, req, is_admin, groups):
            raise problem
        if problem := await self._over_policy(access_key, req):
            raise problem  # more than the owner's policy ever allows: not queued forever
        if self._plain(req) and await self._unplaceable(req) is None:
            # the common case in one transaction: the live session of that name (get-or-create) or the new one;
            # any check that fails takes the path below, where the live session of that name comes first
            session, kernels = new_session_rows(req, access_key, self.clock.now())
            try:
                row, created = await self.queue.insert(
                    access_key, lambda: self.store.create_or_get_session(session, kernels)
                )
            except Problem as p:  # a full queue: the path below answers (a live session of the name first)
                if p.slug != "quota-exceeded":
                    raise
            else:
                if not created:
                    return self._reuse(row, req)
                self._enqueued(row)
                return row, True
        existing = await self.store.find_sessions(req.name, access_key, active_only=True)
        existing = [r for r in existing if r.name == req.name]
        if existing:
            return self._reuse(existing[0], req)
        await check_pending_limit(self.store, access_key)  # a full queue is refused before the checks below
        await self.images.check_available(req.image)
        if problem := await self._unplaceable(req):
            raise problem  # no agent of the group could ever hold it: not queued forever
        mounts: list[dict[str, Any]] = []
        if req.mounts:
            if self.vfolders is None:
                raise Invalid("this manager serves no virtual folders")
            mounts = await self.vfolders.mounts_for(access_key, is_admin, req.mounts)
        depends_on = []
        for ref in req.depends:
            found = await self.store.find_sessions(ref, access_key, active_only=False)
            if not found:
                raise Invalid(f"cannot depend on {ref!r}: no such session")
            depends_on.append(found[0].id)
        session, kernels = new_session_rows(req, access_key, self.clock.now(), depends_on, mounts)
        session_id = session.id
        if self.hooks:
            reason, notes = await self.hooks.before_enqueue(hook_view(session))
            if reason is not None:
                raise Forbidden(reason, "Rejected by a hook.")
            session = msgspec.structs.replace(session, config={**session.config, "hook_notes": notes})
        taken = await self.queue.insert(access_key, lambda: self.store.create_session(session, kernels))
        if taken is not None:  # a concurrent request created it first
            same = await self.store.get_session(taken)
            assert same is not None
            return self._reuse(same, req)
        new = await self.store.get_session(session_id)
        assert new is not None
        self._enqueued(new)
        return new, True

    async def set_priority(self, session: Session, priority: int, is_admin: bool = False) -> Session:
        """A live session's scheduling priority (the multifactor policy orders by it), lowered to its owner's
        policy's max_priority unless an admin sets it (as Backend.AI does); the next round orders by it."""
        if SessionStatus(session.status) not in ACTIVE_STATUSES:
            raise Invalid(f"session {session.name} has ended: only a live session has a priority")
        if not is_admin:
            keypair = self.store.active_keypair(session.access_key) or await self.store.keypair(session.access_key)
            policy = await self.store.policy(keypair.resource_policy if keypair else "default")
            if policy is not None:
                priority = min(priority, policy.max_priority)
        if not await self.store.set_session_priority(session.id, priority):
            raise Invalid(f"session {session.name} has ended: only a live session has a priority")
        row = await self.store.get_session(session.id)
        assert row is not None
        self.wake()
        return row

    def _place(self, access_key: str, req: CreateRequest) -> None:
        """The project the session is created in (one its owner belongs to, of an active domain) and whether its
        scaling group is open there (`rules/access.py`): set on the request, or a Problem."""
        keypair = self.store.active_keypair(access_key)
        if keypair is None:
            raise Invalid(f"keypair {access_key} does not exist or is inactive")
        teams = self.store.teams()
        project = project_for(teams, actor_of(teams, keypair), req.domain, req.group)
        check_scaling_group(teams, req.scaling_group, project, access_key)
        req.domain_name, req.project_id = project.domain_name, project.id

    def _enqueued(self, row: Session) -> None:
        """A new session is stored: say so, and have the dispatcher look (one round for many arrivals)."""
        self.events.publish("session_enqueued", row)
        if self.hooks:
            self.spawn(self._notify_hooks("after_enqueue", row), f"hooks-{row.id}")
        self.wake()

    # -- scheduling results ---------------------------------------------------------------------

    async def apply_round(
        self,
        placements: list[tuple[str, dict[str, str]]],
        cancels: list[tuple[str, str, dict[str, Any]]],
        pending: list[tuple[str, str, dict[str, Any]]],
        history: list[SchedulingAttempt],
    ) -> None:
        """Commit a scheduling round, then publish its events and start the placed sessions."""
        now = self.clock.now()
        scheduled, cancelled = await self.store.apply_round(placements, cancels, pending, history, now)
        if pending:
            self.changes.publish("pending_updated", {"ids": [sid for sid, _, _ in pending]})
        agents = dict(placements)
        self.metrics.scheduled([(now - datetime.fromisoformat(r.created_at)).total_seconds() for r in scheduled])
        for row in cancelled:
            self.events.publish("session_cancelled", row)
            if self.hooks:
                self.spawn(self._notify_hooks("after_termination", row), f"hooks-{row.id}")
        for row in scheduled:
            self.events.publish("session_scheduled", row)
            self.spawn(self._start_session(row, agents[row.id]), f"start-{row.id}")

    async def _create_calls(
        self, session: Session, kernels: list[Kernel], dotfiles: list[Dotfile], pull: Any
    ) -> list[CreateKernel]:
        """What each kernel of a session is created with (in cluster order: main1 first). A session of several
        kernels adds, to each, its place in the cluster, the cluster's variables and the session's SSH keypair."""
        sid = session.id
        size = len(kernels)
        mode = cluster_mode_of(session)
        hosts = [kernel_name_of(k) for k in kernels]
        placed_on = [k.agent_id or "" for k in kernels]
        common = [DotfileSpec(d.path, d.data, d.permission) for d in dotfiles]
        if size > 1:
            common += cluster_dotfiles(hosts, await self._keypair())
        mounts = [
            MountSpec(str(self.vfolders.path_of(m)), m["target"], bool(m["read_only"]))
            for m in session.config.get("mounts") or []
            if self.vfolders is not None
        ]
        calls = []
        seen: dict[str | None, int] = {}  # agent -> kernels of the session placed there so far
        for rank, kernel in enumerate(kernels):
            local_rank = seen.get(kernel.agent_id, 0)
            seen[kernel.agent_id] = local_rank + 1
            environ = dict(session.environ)
            cluster = None
            if size > 1:
                environ.update(cluster_environ(size, mode, rank, local_rank))
                cluster = ClusterSpec(
                    size, mode, rank, local_rank, network_name(sid, placed_on[rank]), hosts, placed_on
                )
            calls.append(
                CreateKernel(
                    kernel_id=kernel.id,
                    session_id=sid,
                    session_name=session.name,
                    access_key=session.access_key,
                    image=session.image,
                    slots=kernel.occupied_slots,
                    environ=environ,
                    cluster_role=kernel.cluster_role,
                    cluster_idx=kernel.cluster_idx,
                    network=session.config.get("network"),
                    pull=pull,  # with the registry's credentials: never stored, never logged
                    mounts=mounts,
                    dotfiles=common,
                    cluster=cluster,
                )
            )
        return calls

    async def _keypair(self) -> tuple[str, str] | None:
        """A new SSH keypair for a session of several kernels; None (said once in the log) without ssh-keygen."""
        try:
            return await new_keypair()
        except NoKeygen as e:
            if not self._said_no_keygen:
                self._said_no_keygen = True
                log.warning("sessions of several kernels get no SSH keypair: %s", e)
            return None

    async def _start_session(self, session: Session, placed: dict[str, str]) -> None:
        """Start a scheduled session (`_start_kernels`). A start that cannot record its progress (the node's
        database on a full disk) fails cleanly: its kernels are removed (that needs no write) and the session
        is CANCELLED saying the disk is full, as soon as that can be written (see `_end_start`)."""
        sid = session.id
        self.starting.add(sid)
        try:
            await self._start_kernels(session, placed)
        except Exception as e:
            if not is_disk_full(e):
                raise
            log.warning(
                "session %s: its start could not be recorded (%s is on a full disk: %s); its kernels are removed "
                "and it is cancelled once that can be written",
                sid,
                where_full(e),
                e,
            )
            why = f"its start could not be recorded: {where_full(e)} is on a full disk; its kernels were removed"
            await self._end_start(session, placed, "DiskFull", why)
        finally:
            self.starting.discard(sid)

    async def end_stuck_start(self, session: Session, limit: float) -> None:
        """A session that stayed SCHEDULED, PREPARING or PULLING past `limit` seconds with no start under way
        (what started it is gone: an error, a write that failed): its kernels are removed, it is CANCELLED."""
        sid = session.id
        if sid in self.starting:
            return
        self.starting.add(sid)
        try:
            why = f"it stayed {session.status} for more than {limit:g} s and no start of it was under way"
            log.warning("session %s: %s: its kernels are removed, it is cancelled", sid, why)
            await self._end_start(session, {}, "StartTimeout", why)
        finally:
            self.starting.discard(sid)

    async def _end_start(self, session: Session, placed: dict[str, str], name: str, why: str) -> None:
        """End a start that failed outside the agents: the kernels are removed, then CANCELLED
        (`failed-to-start`, the error named `name`), written as soon as the disk lets it (`_write_end`)."""
        sid = session.id
        current = await self.store.get_session(sid)
        if current is None or S(current.status) not in STARTING_OR_SCHEDULED:
            return  # it ended (or started) otherwise meanwhile
        kernels = _placed(await self.store.kernels_of(sid), placed)
        agent_id = kernels[0].agent_id if kernels else None
        error = {"error": {"src": "manager", "agent_id": agent_id, "name": name, "repr": why}}

        async def remove() -> None:  # (again at each try: a kernel whose creation finished late goes too)
            await self._remove_kernels(kernels, StatusInfo.FAILED_TO_START, timeout=FORCED_REMOVE_TIMEOUT)

        await self._write_end(sid, S.CANCELLED, StatusInfo.FAILED_TO_START, error, STARTING_OR_SCHEDULED, remove)
        await remove()

    async def _write_end(
        self,
        sid: str,
        target: SessionStatus,
        info: str,
        data: dict[str, Any],
        allowed: Iterable[SessionStatus],
        before_each: Callable[[], Awaitable[None]],
    ) -> None:
        """A transition that must happen, after `before_each()`: on a full disk both are tried again (every
        DISK_RETRY s, doubling up to DISK_RETRY_MAX) until space is freed; warned about once."""
        delay = DISK_RETRY
        while True:
            await before_each()
            try:
                await self.transition(sid, target, info, data, allowed_from=allowed)
            except Exception as e:
                if not self.full_disk.failed("ending sessions whose start failed", e):
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, DISK_RETRY_MAX)
                continue
            self.full_disk.ok("ending sessions whose start failed")
            return

    async def _start_kernels(self, session: Session, placed: dict[str, str]) -> None:
        """Create every kernel of a scheduled session on its agent, all at once; RUNNING when all started. When
        one does not start, the session ends with that kernel's reason and the kernels that did are removed."""
        sid = session.id
        # with its kernels and dotfiles, in one transaction
        preparing = await self.store.start_preparing(sid, self.clock.now())
        if preparing is None:
            return
        row, kernels, dotfiles = preparing
        self._moved(sid, S.PREPARING, row)
        if not kernels:
            raise SessionNotFound(sid)
        kernels = _placed(kernels, placed)
        first_agent = kernels[0].agent_id
        try:
            pull = self.images.pull_grant(session.image)
        except Problem as p:  # the configuration changed since it was created: nothing is contacted
            error = {"error": {"src": "manager", "agent_id": first_agent, "name": p.title, "repr": p.msg}}
            await self.transition(sid, S.CANCELLED, StatusInfo.FAILED_TO_START, error, allowed_from=STARTING)
            return
        creates = await self._create_calls(session, kernels, dotfiles, pull)
        # an image from a registry may have to be pulled first: allow for that too
        limit = self.start_timeout + (PULL_TIMEOUT if registry_of(session.image) else 0)
        results = await asyncio.gather(
            *(call(self.link, k.agent_id or "", c, timeout=limit) for k, c in zip(kernels, creates, strict=True)),
            return_exceptions=True,
        )
        failed = [(k, r) for k, r in zip(kernels, results, strict=True) if isinstance(r, BaseException)]
        for _, r in failed:
            if not isinstance(r, TimeoutError | RemoteError | AgentUnavailable):
                log.error("session %s: creating a kernel failed unexpectedly", sid, exc_info=r)
        if failed:
            await self._not_started(session, kernels, failed)
            return
        started = await self.transition(
            sid,
            S.RUNNING,
            "",
            {},
            allowed_from=STARTING,
            kernel_updates={
                k.id: KernelChanges(container_id=r.container_id, devices=r.gpus, service_ports=r.service_ports)
                for k, r in zip(kernels, results, strict=True)
                if not isinstance(r, BaseException)  # all of them: a failure returned above
            },
        )
        if started is None:
            current = await self.store.get_session(sid)
            if current is not None and current.status == S.RUNNING:
                return  # adopted meanwhile (the agent re-registered with the kernel)
            await self._remove_kernels(kernels, StatusInfo.USER_REQUESTED)  # destroyed while preparing
            return
        if session.type == "batch":
            self.spawn(self._run_batch(started, kernels[0], kernels[0].agent_id or ""), f"batch-{sid}")

    async def _not_started(
        self, session: Session, kernels: list[Kernel], failed: list[tuple[Kernel, BaseException]]
    ) -> None:
        """Some kernels did not start: the session ends with the first one's reason (naming the kernel in a
        session of several), and every other kernel is removed (the agent of a kernel it refused to create has
        removed what it made already). A kernel that did not start in time: ERROR, then TERMINATED once removed;
        one an agent refused or could not be asked for: CANCELLED."""
        sid = session.id
        kernel, exc = failed[0]
        if isinstance(exc, TimeoutError):
            exc = TimeoutError(f"the kernel did not start within {self.start_timeout:g} s")
        error = _error_data(kernel.agent_id, exc)
        if len(kernels) > 1:
            name = kernel_name_of(kernel)
            error["error"]["repr"] = f"kernel {name} on agent {kernel.agent_id}: {error['error']['repr']}"
            error["error"]["kernel"] = name
        refused = {k.id for k, e in failed if isinstance(e, RemoteError)}
        leftovers = [k for k in kernels if k.id not in refused]
        if any(isinstance(e, TimeoutError) for _, e in failed):
            # PREPARING took too long: an ERROR with the reason, then clean up and free the slots
            # (a session destroyed meanwhile has its kernels removed all the same: what came up late goes too)
            errored = await self.transition(sid, S.ERROR, StatusInfo.FAILED_TO_START, error, allowed_from=STARTING)
            await self._remove_kernels(leftovers, StatusInfo.FAILED_TO_START)
            if errored:
                await self.transition(sid, S.TERMINATED, StatusInfo.FAILED_TO_START, error, allowed_from=[S.ERROR])
            return
        if leftovers:
            await self._remove_kernels(leftovers, StatusInfo.FAILED_TO_START)
        await self.transition(sid, S.CANCELLED, StatusInfo.FAILED_TO_START, error, allowed_from=STARTING)

    def resume_batch(self, session_id: str, kernel: Kernel, agent_id: str, fresh: bool = False) -> None:
        """A running batch session's kernel is on `agent_id` (an agent registered with it: after a restart of
        the manager, of the agent or of both): follow its command to its end unless that is followed already.
        The kernel's runner kept the command running under its run id (see runner.py's hello): the agent
        re-attaches to it, or says it no longer has it (the session then fails saying so). `fresh`: the kernel
        came up while the manager was away, so the command has not been started: it starts now."""
        if session_id in self._batching:
            return
        self._batching.add(session_id)
        self.spawn(self._resume_batch(session_id, kernel, agent_id, fresh), f"batch-{session_id}")

    async def _resume_batch(self, session_id: str, kernel: Kernel, agent_id: str, fresh: bool) -> None:
        try:
            session = await self.store.get_session(session_id)
            if session is None or session.status != S.RUNNING or session.type != "batch":
                return
            if not fresh:
                log.info("batch session %s: following its command again after a restart", session.name)
            await self._follow_batch(session, kernel, agent_id, resume=not fresh)
        finally:
            self._batching.discard(session_id)

    async def _run_batch(self, session: Session, kernel: Kernel, agent_id: str) -> None:
        """A batch session runs its startup command, then ends by itself with its exit code."""
        self._batching.add(session.id)
        try:
            await self._follow_batch(session, kernel, agent_id, resume=False)
        finally:
            self._batching.discard(session.id)

    async def _follow_batch(self, session: Session, kernel: Kernel, agent_id: str, resume: bool) -> None:
        """Start the batch command (unless `resume`: it runs already), follow it to its end and end the session
        with its exit code. While the kernel's agent is away (it restarts) the command goes on in the kernel:
        this waits for the agent to come back (the session ends otherwise: agent-lost); a run the agent no
        longer has (its kernel's runner was started afresh) ends the session as failed, saying so."""
        command = session.config["startup_command"]
        run_id = batch_run_id(session.id)  # the same after a restart: the kernel's runner knows it by it
        mode, code = ("continue", "") if resume else ("batch", command)
        exit_code = 1
        lost: str | None = None
        seen = 0  # the last answer heard (a resumed follower missed what the one before it heard: asked again)
        await self._run_started(session.id, kernel.id, run_id)
        while True:
            after = seen if mode == "continue" else None
            run = Execute(kernel.id, run_id, mode, code, {"exec": command}, flush_timeout=30.0, after=after)
            try:
                result = await call(self.link, agent_id, run, timeout=run.flush_timeout + 60)
            except (AgentUnavailable, TimeoutError):
                if not await self._still_running(session.id, kernel.id):
                    waiting = self._batch_exits.get(session.id)
                    if waiting is not None and not waiting.done():
                        waiting.set_result((None, "its agent did not answer"))
                    return  # ended meanwhile (destroyed, agent-lost, preempted): its end is said where it ended
                await asyncio.sleep(BATCH_AGENT_POLL)
                continue  # (the same call again: an agent that took the start already does not start it twice)
            except RemoteError as e:
                log.warning("batch session %s: %s", session.id, e)
                lost = f"the batch command's run was lost: {e.message}"
                break
            seen = max(seen, result.seq)
            if result.status == "finished":
                exit_code = result.exit_code if result.exit_code is not None else 1
                break
            mode, code = "continue", ""
        self.runs.end(session.id, run_id, exit_code, self.clock.now().isoformat())
        waiting = self._batch_exits.get(session.id)  # (preempted: the preemption notes how its command ended)
        if waiting is not None and not waiting.done():
            waiting.set_result((exit_code, lost))
        ok = exit_code == 0 and lost is None
        info = StatusInfo.TASK_DONE if ok else StatusInfo.TASK_FAILED
        data: dict[str, Any] = {"exitCode": exit_code}
        if lost is not None:
            data["msg"] = lost
        row = await self.transition(
            session.id,
            S.TERMINATING,
            info,
            data,
            allowed_from=[S.RUNNING],
            result="SUCCESS" if ok else "FAILURE",
            kernel_updates={kernel.id: KernelChanges(exit_code=exit_code)},
        )
        if row is not None:
            self.events.publish("session_success" if ok else "session_failure", row)
            await self._finish_destroy(row, info)

    # -- destroy ----------------------------------------------------------------------------------

    async def destroy(
        self, session: Session, forced: bool, wait: bool = True, reason: str | None = None
    ) -> dict[str, Any]:
        """End a session (Backend.AI's semantics, below). With wait=False a running one is TERMINATING on return
        and ends in the background.

        Not forced: PENDING → CANCELLED; RUNNING, RESTARTING, RUNNING_DEGRADED → TERMINATING → TERMINATED; any
        other live status is a 403 saying to use forced. Forced, every live status ends: SCHEDULED and PULLING
        → CANCELLED (what is being started is removed when it answers), PREPARING and the running ones →
        TERMINATING → TERMINATED, TERMINATING → TERMINATED, ERROR → TERMINATED; the kernels are removed from
        their agents first (an agent away removes them when it comes back: see `reconcile`). An ended session
        is a 403. A session that changes status meanwhile is destroyed from its new status."""
        info = reason or (StatusInfo.FORCE_TERMINATED if forced else StatusInfo.USER_REQUESTED)
        for _ in range(DESTROY_ATTEMPTS):
            stats = await self._destroy_from(session, forced, wait, info)
            if stats is not None:
                return stats
            fresh = await self.store.get_session(session.id)  # it moved meanwhile: again, from where it is
            if fresh is None:
                raise SessionNotFound(session.id)
            session = fresh
        raise KeepsChanging(
            f"session {session.name} changed status {DESTROY_ATTEMPTS} times while it was being destroyed "
            f"(it is {session.status} now): try again"
        )

    async def _destroy_from(self, session: Session, forced: bool, wait: bool, info: str) -> dict[str, Any] | None:
        """`destroy` from the session's status as read; None when it was no longer in it (nothing done)."""
        sid = session.id
        status = S(session.status)
        if status in DEAD_STATUSES:
            raise Forbidden(f"the session is already {status}")
        if status == S.PENDING:
            moved = await self.transition(sid, S.CANCELLED, info, {}, allowed_from=[S.PENDING])
            return None if moved is None else {}
        if status in FORCED_ONLY and not forced:
            why = f" ({session.status_info})" if session.status_info else ""
            raise Forbidden(
                f"the session is {status}{why}; wait, or destroy it with forced=true "
                "(`bai session destroy --force`, `backend.ai session rm -f`)"
            )
        kernels = await self.store.kernels_of(sid)
        if not kernels:
            raise SessionNotFound(sid)
        main = kernels[0]
        target = FORCED_DESTROY[status]
        if target == S.CANCELLED:
            # being started: the start removes what it made when it finds the session ended
            moved = await self.transition(sid, S.CANCELLED, info, {}, allowed_from=[status])
            return None if moved is None else {}
        if target == S.TERMINATED:  # TERMINATING, ERROR: no move before the kernels are removed
            row = session
        else:
            terminating = await self.transition(sid, S.TERMINATING, info, {}, allowed_from=[status])
            if terminating is None:
                return None
            row = terminating
        if status == S.ERROR:
            log.info("session %s (ERROR, %s) is destroyed by force: its kernels are removed", sid, session.status_info)
        finishing = self._finish_destroy(row, info, kernels, timeout=FORCED_REMOVE_TIMEOUT if forced else 60)
        if wait:
            final = await finishing
        else:
            self.spawn(finishing, f"destroy-{sid}")
            final = self._finals(sid).get(main.id)  # the latest: the end comes later
        # Backend.AI's answer: the main kernel's final statistics ({} when there are none)
        return last_stat(final, main.occupied_slots) or {}

    async def _finish_destroy(
        self, session: Session, info: str, kernels: list[Kernel] | None = None, timeout: float = 60
    ) -> dict[str, Any] | None:
        """Remove the session's kernels from their agents (all at once), then TERMINATED; the main kernel's final
        statistics (the agent's last sample of it, else the latest the manager has, else the one stored before)."""
        sid = session.id
        self.ending.add(sid)
        try:
            if kernels is None:
                kernels = await self.store.kernels_of(sid)
            await self._remove_kernels(kernels, info, timeout=timeout)
            main = kernels[0] if kernels else None
            final = (self._finals(sid).get(main.id) or stored_stat(main)) if main else None
            await self.transition(
                sid, S.TERMINATED, info, session.status_data, allowed_from=[S.TERMINATING, S.ERROR, S.PREEMPTED]
            )
            return final
        finally:
            self.ending.discard(sid)

    async def end_stuck_destroy(self, session: Session) -> None:
        """A session TERMINATING with no destroy under way (it failed: a write on a full disk, an error): its
        kernels are removed again and it ends TERMINATED with the reason it was being destroyed for."""
        if session.id in self.ending:
            return
        if session.id not in self._said_stuck:  # (once: on a full disk the timers try again every second)
            if len(self._said_stuck) >= MAX_STRAY_LOOKS:
                self._said_stuck.clear()
            self._said_stuck.add(session.id)
            log.warning("session %s stayed TERMINATING with no destroy under way: it is ended now", session.id)
        await self._finish_destroy(session, session.status_info or StatusInfo.USER_REQUESTED)
        self._said_stuck.discard(session.id)

    async def _remove_kernels(self, kernels: list[Kernel], reason: str, timeout: float = 30) -> None:
        """Have each kernel's agent remove it, all at once; their final statistics are kept in the book."""
        placed = [k for k in kernels if k.agent_id]
        done = await asyncio.gather(*(self._remove_kernel(k.agent_id or "", k.id, reason, timeout) for k in placed))
        for kernel, destroyed in zip(placed, done, strict=True):
            if destroyed is not None and destroyed.stats:
                self.stats.final(kernel.id, kernel.session_id, "", destroyed.stats)

    async def _remove_kernel(self, agent_id: str, kernel_id: str, reason: str, timeout: float = 30) -> Destroyed | None:
        """Have the agent remove a kernel (the answer: whether it had it, its final statistics); a failure is
        logged with what may be left behind, and answers None."""
        try:
            return await call(self.link, agent_id, DestroyKernel(kernel_id, reason), timeout=timeout)
        except (RemoteError, AgentUnavailable, TimeoutError) as e:
            log.warning(
                "could not remove kernel %s on agent %s (%s): it is removed when the agent is back or at its next "
                "heartbeat (the manager has it remove kernels of sessions that have ended)",
                kernel_id,
                agent_id,
                e,
            )
            return None

    # -- preemption ------------------------------------------------------------------------------------

    async def give_notice(self, session: Session, note: dict[str, Any]) -> Session | None:
        """Tell a running session that it will be preempted (`note`: by whom, why, and its "deadline"): status_info
        preempting and status_data["preemption"], no status change; its watchers get a session_preempting event.
        None when it is no longer in the status it was read in."""
        data = {**session.status_data, "preemption": note}
        row = await self.store.set_status_info(session.id, session.status, StatusInfo.PREEMPTING, data)
        if row is not None:
            log.info("session %s (%s) will be preempted at %s: %s", row.name, row.id, note.get("deadline"), note["msg"])
            self.events.publish("session_preempting", row)
        return row

    async def withdraw_notice(self, session: Session, why: str) -> Session | None:
        """A notice no longer needed (the session it made room for started elsewhere, or ended)."""
        data = {k: v for k, v in session.status_data.items() if k != "preemption"}
        row = await self.store.set_status_info(session.id, session.status, "", data)
        if row is not None:
            log.info("session %s (%s) is no longer to be preempted: %s", row.name, row.id, why)
            self.events.publish("session_preemption_withdrawn", row)
        return row

    async def preempt(self, session: Session, note: dict[str, Any]) -> Session | None:
        """Stop a running session to make room (preemption): PREEMPTED at once, then in the background a batch
        session's command is interrupted (SIGINT; PREEMPT_STOP_WAIT s to end), its kernels are removed, and a batch
        session waits again (PENDING: requeued, its exit noted) while any other ends (TERMINATED). `note` (by whom,
        why) is its status_data["preemption"] throughout, and in its history. None when it was not running."""
        row = await self.transition(
            session.id, S.PREEMPTED, StatusInfo.PREEMPTED, {"preemption": note}, allowed_from=PREEMPTIBLE_STATUSES
        )
        if row is None:
            return None
        log.info("session %s (%s) is preempted: %s", row.name, row.id, note.get("msg", ""))
        self.spawn(self.finish_preempt(row), f"preempt-{row.id}")
        return row

    async def finish_preempt(self, row: Session) -> None:
        """The rest of a preemption (see `preempt`); again for a session left PREEMPTED (a manager that stopped
        meanwhile: the timers find it)."""
        sid = row.id
        if sid in self.ending:
            return
        self.ending.add(sid)
        try:
            note = dict(row.status_data.get("preemption") or {})
            kernels = await self.store.kernels_of(sid)
            if row.type == "batch" and kernels and kernels[0].agent_id and sid in self._batching:
                exit_code, lost = await self._stop_batch(sid, kernels[0])
                note["exitCode"] = exit_code
                if lost:
                    note["exit"] = lost
            await self._remove_kernels(kernels, StatusInfo.PREEMPTED)
            now = self.clock.now()
            if row.started_at:
                note["ranSeconds"] = round((now - datetime.fromisoformat(row.started_at)).total_seconds(), 1)
            if row.type == "batch":
                note["requeued"] = True
                requeued = await self.store.requeue(sid, StatusInfo.PREEMPTED, {"preemption": note}, now)
                if requeued is not None:
                    self.stats.forget(sid)
                    self.activity.forget(sid)
                    self.runs.end_all(sid, now.isoformat())
                    self.events.publish("session_enqueued", requeued)
                    self.wake()
            else:
                await self.transition(
                    sid, S.TERMINATED, StatusInfo.PREEMPTED, {"preemption": note}, allowed_from=[S.PREEMPTED]
                )
        finally:
            self.ending.discard(sid)

    async def _stop_batch(self, session_id: str, kernel: Kernel) -> tuple[int | None, str | None]:
        """Interrupt a batch session's command and wait for it to end: its exit code (None: unknown) and, when
        its run did not end by itself, why."""
        waiting: asyncio.Future[tuple[int | None, str | None]] = asyncio.get_running_loop().create_future()
        self._batch_exits[session_id] = waiting
        try:
            try:
                await call(self.link, kernel.agent_id or "", Interrupt(kernel.id, batch_run_id(session_id)), timeout=5)
            except (RemoteError, AgentUnavailable, TimeoutError) as e:
                return None, f"its command could not be interrupted ({e}): its kernel was removed"
            try:
                return await asyncio.wait_for(asyncio.shield(waiting), PREEMPT_STOP_WAIT)
            except TimeoutError:
                return None, f"its command was still running {PREEMPT_STOP_WAIT:g} s after its interrupt"
        finally:
            self._batch_exits.pop(session_id, None)

    # -- a batch session's run ------------------------------------------------------------------------

    async def _still_running(self, session_id: str, kernel_id: str) -> bool:
        """The session is RUNNING with this kernel still in it (a batch command waiting for its agent)."""
        session = await self.store.get_session(session_id)
        kernel = await self.store.get_kernel(kernel_id)
        return session is not None and session.status == S.RUNNING and kernel is not None

    async def _run_started(self, session_id: str, kernel_id: str, run_id: str) -> None:
        """A run begins: numbered, placed in the kernel's log after what is stored of it now (before the
        kernel is told, so that all of its output comes after)."""
        after = await newest_seq(self.store, kernel_id)
        self.runs.start(session_id, kernel_id, run_id, after, self.clock.now().isoformat())

    # -- what agents tell us ----------------------------------------------------------------------

    async def reconcile(self, agent_id: str, kernels: list[KernelInfo], *, leave_starts: bool = False) -> list[str]:
        """An agent (re-)registered with `kernels` (kernel_id, container_id): sessions whose kernel it has
        run on (or start running), those whose kernel it lost end. Returns the kernels it has that we do
        not know or whose session has ended (ERROR, TERMINATED, CANCELLED), to destroy: a session in ERROR
        whose kernel comes back ends (TERMINATED, its reason kept) and its slots are free. `leave_starts`: a session
        whose start is under way here is left to that start (the agent may not have made its kernel yet: a
        new leader's view of an agent that did not restart); an agent that registers again lost them all."""
        theirs = {k.kernel_id for k in kernels}
        ours = await self.store.kernels_where([s.value for s in OCCUPYING_STATUSES], agent_id)
        containers = {k.kernel_id: k.container_id for k in kernels}
        errored: list[Kernel] = []
        for kernel in ours:
            status = S(kernel.status)
            if kernel.id in theirs:
                if status == S.ERROR:
                    errored.append(kernel)
                elif status == S.RUNNING and kernel.cluster_role == "main":
                    self.resume_batch(kernel.session_id, kernel, agent_id)  # (a batch session's: else nothing)
                elif status in (S.SCHEDULED, S.PREPARING, S.PULLING):
                    # it came up while the manager was away: the session runs
                    if status == S.SCHEDULED:
                        await self.transition(kernel.session_id, S.PREPARING)
                    moved = await self.transition(
                        kernel.session_id,
                        S.RUNNING,
                        kernel_updates={kernel.id: KernelChanges(container_id=containers.get(kernel.id))},
                    )
                    if moved is not None and kernel.cluster_role == "main":
                        self.resume_batch(kernel.session_id, kernel, agent_id, fresh=True)
                continue
            if status in (S.SCHEDULED, S.PREPARING, S.PULLING):
                if leave_starts and self.is_starting(kernel.session_id):
                    continue  # (a start of this manager's is under way: its own answer decides, not this list)
                await self.transition(
                    kernel.session_id,
                    S.CANCELLED,
                    StatusInfo.FAILED_TO_START,
                    {
                        "error": {
                            "src": "agent",
                            "agent_id": agent_id,
                            "name": "AgentRestarted",
                            "repr": f"agent {agent_id} restarted while the kernel was starting",
                        }
                    },
                )
            elif status == S.TERMINATING:
                await self.transition(kernel.session_id, S.TERMINATED, kernel.status_info or "user-requested")
            else:
                name = f"kernel {kernel_name_of(kernel)}" if await self._in_cluster(kernel) else "the kernel"
                await self.transition(
                    kernel.session_id,
                    S.TERMINATED,
                    StatusInfo.AGENT_TERMINATION,
                    {"msg": f"{name} was gone when agent {agent_id} restarted"},
                )
            self._remove_siblings(kernel, agent_id, StatusInfo.AGENT_TERMINATION)
        for kernel in errored:
            await self._end_errored(kernel, agent_id)
        live = {k.id for k in ours} - {k.id for k in errored}
        destroy = sorted(theirs - live)
        if destroy:
            await self._say_removing(agent_id, destroy, "came back with")
        return destroy

    async def _end_errored(self, kernel: Kernel, agent_id: str, how: str = "came back") -> None:
        """An agent came back with the kernel of a session in ERROR (e.g. agent-lost): the session ends (its
        reason kept), its kernels elsewhere are removed; the agent removes this one (its join answer)."""
        session = await self.store.get_session(kernel.session_id)
        if session is None:
            return
        data = dict(session.status_data or {})
        data["msg"] = (f"{data['msg']}; " if data.get("msg") else "") + (
            f"its kernel was removed when agent {agent_id} {how}"
        )
        await self.transition(session.id, S.TERMINATED, session.status_info, data, allowed_from=[S.ERROR])
        self._remove_siblings(kernel, agent_id, session.status_info or StatusInfo.AGENT_LOST)

    async def _say_removing(self, agent_id: str, kernel_ids: list[str], has: str) -> None:
        """One log line for the kernels an agent is told to remove: whose sessions ended, which are unknown."""
        owners = await self.store.kernel_owners(kernel_ids)
        ended = [k for k in kernel_ids if k in owners]
        unknown = [k for k in kernel_ids if k not in owners]
        parts = []
        if ended:
            parts.append(f"{len(ended)} kernel(s) of sessions that have ended ({_some(ended)})")
        if unknown:
            parts.append(f"{len(unknown)} kernel(s) the manager does not know ({_some(unknown)})")
        log.warning("agent %s %s %s: they are removed, their slots freed", agent_id, has, " and ".join(parts))

    async def remove_strays(self, agent_id: str, kernel_ids: Iterable[Any]) -> list[str]:
        """Kernels an agent reports running (its heartbeat) whose sessions have ended (ERROR, TERMINATED,
        CANCELLED: e.g. a removal that failed, a start that finished after its session was destroyed) are
        removed, said once in the log; a session in ERROR then ends (TERMINATED). Looked up only when the
        agent's kernels or the set of ended sessions changed since the last look. The kernels being removed."""
        ids = frozenset(k for k in kernel_ids if isinstance(k, str)) - self._removing
        if not ids:
            self._stray_looks.pop(agent_id, None)
            return []
        look = (ids, self._ended_version)
        if self._stray_looks.get(agent_id) == look:
            return []
        if len(self._stray_looks) >= MAX_STRAY_LOOKS:
            self._stray_looks.clear()
        self._stray_looks[agent_id] = look
        owners = await self.store.kernel_owners(sorted(ids))
        strays = sorted(k for k in ids if k in owners and owners[k][2] in ENDED_KERNEL_VALUES)
        if not strays:
            return []
        await self._say_removing(agent_id, strays, "still runs")
        self._removing.update(strays)
        self.spawn(self._remove_strays(agent_id, strays), f"strays-{agent_id}")
        return strays

    async def _remove_strays(self, agent_id: str, strays: list[str]) -> None:
        try:
            await asyncio.gather(*(self._remove_kernel(agent_id, k, StatusInfo.NOT_FOUND_IN_MANAGER) for k in strays))
            for kernel_id in strays:
                kernel = await self.store.get_kernel(kernel_id)
                if kernel is not None and kernel.status == S.ERROR:
                    await self._end_errored(kernel, agent_id, "still ran it")
        finally:
            self._removing.difference_update(strays)
            self._stray_looks.pop(agent_id, None)  # look again: what failed to go is found at the next heartbeat

    async def agent_lost(self, agent_id: str, grace: float) -> None:
        """An agent stayed away past its grace period: its sessions end in ERROR (`agent-lost`)."""
        for kernel in await self.store.kernels_where([s.value for s in OCCUPYING_STATUSES], agent_id):
            await self.transition(
                kernel.session_id,
                S.ERROR,
                StatusInfo.AGENT_LOST,
                {"msg": f"agent {agent_id} stopped heartbeating and did not come back within {grace:g} s"},
            )
            self._remove_siblings(kernel, agent_id, StatusInfo.AGENT_LOST)

    async def _in_cluster(self, kernel: Kernel) -> bool:
        session = await self.store.get_session(kernel.session_id)
        return session is not None and session.cluster_size > 1

    def _remove_siblings(self, kernel: Kernel, agent_id: str, reason: str) -> None:
        """A kernel of a session is gone with its agent: the session's kernels on other agents are removed too
        (in the background; nothing to do for a session of one kernel)."""

        async def remove() -> None:
            others = [
                k
                for k in await self.store.kernels_of(kernel.session_id)
                if k.id != kernel.id and k.agent_id and k.agent_id != agent_id
            ]
            if others:
                await self._remove_kernels(others, reason)

        self.spawn(remove(), f"siblings-{kernel.id}")

    async def kernel_logs(self, chunks: list[tuple[str, str]]) -> None:
        """Output of kernels (kernel id, text): kept as their sessions' logs, followers told."""
        chunks = [(kid, text) for kid, text in chunks if text]
        if chunks and await self.full_disk.attempt("kernel logs", self.store.append_logs(chunks, self.clock.now())):
            for kid in {kid for kid, _ in chunks}:
                self.logs.notify(kid)

    async def kernel_pulling(self, event: KernelPulling) -> None:
        """The agent pulls the kernel's image: PULLING, with how far it got in the status info."""
        done, total = int(event.done), int(event.total)
        so_far = f": {done / 2**20:.1f} of {total / 2**20:.1f} MiB" if total else ""
        data = {"msg": f"pulling {event.image}{so_far}", "pull": {"done": done, "total": total}}
        sid = event.session_id
        row = await self.store.set_status_info(sid, S.PULLING, "pulling-image", data)
        if row is not None:
            self.events.publish("session_pulling", row)
        else:
            await self.transition(sid, S.PULLING, "pulling-image", data, allowed_from=[S.PREPARING])

    async def kernel_stats(self, agent_id: str, event: KernelStats) -> None:
        """An agent's statistics samples, kept in the book; kernels it has not seen yet are looked up first
        (those of live sessions are learnt, others ignored from now on)."""
        samples = event.samples if isinstance(event.samples, dict) else {}
        samples = {k: v for k, v in samples.items() if isinstance(k, str)}
        unknown = self.stats.unknown(samples)
        if unknown:
            owners = await self.store.kernel_owners(unknown)
            for kernel_id in unknown:
                found = owners.get(kernel_id)
                if found is not None and found[2] in ACTIVE_VALUES:
                    self.stats.bind(kernel_id, found[0], found[1], agent_id)
                else:
                    self.stats.mark_ended(kernel_id)
        self.stats.record(agent_id, samples, event.node)

    async def kernel_terminated(self, event: KernelTerminated) -> None:
        """A kernel ended by itself: its session ends. In a session of several kernels the reason names that
        kernel, and the others are removed."""
        kernel = await self.store.get_kernel(event.kernel_id)
        if kernel is None:
            return
        if event.stats:  # its last sample: stored with the session's end below
            self.stats.final(kernel.id, kernel.session_id, "", event.stats)
        await self.store.update_kernel(kernel.id, KernelChanges(exit_code=event.exit_code))
        data: dict[str, Any] = {"exitCode": event.exit_code, **({"msg": event.msg} if event.msg else {})}
        siblings = []
        session = await self.store.get_session(kernel.session_id)
        if session is not None and session.cluster_size > 1:
            name = kernel_name_of(kernel)
            why = event.msg or f"it exited with code {event.exit_code}"
            data = {**data, "kernel": name, "msg": f"kernel {name} on agent {kernel.agent_id} ended: {why}"}
            siblings = [k for k in await self.store.kernels_of(kernel.session_id) if k.id != kernel.id]
        # msg: why, when the agent knows (e.g. out of memory, naming the limit)
        info = event.reason or StatusInfo.SELF_TERMINATED
        if siblings:  # the others go first, while the session is TERMINATING
            row = await self.transition(
                kernel.session_id,
                S.TERMINATING,
                info,
                data,
                allowed_from=[S.RUNNING, S.RUNNING_DEGRADED, S.RESTARTING],
            )
            if row is not None:
                await self._finish_destroy(row, info, siblings)
        else:
            await self.transition(
                kernel.session_id,
                S.TERMINATED,
                info,
                data,
                allowed_from=[S.RUNNING, S.RUNNING_DEGRADED, S.RESTARTING],
            )
        self.logs.notify(kernel.id)
