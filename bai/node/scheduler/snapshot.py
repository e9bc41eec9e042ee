"""What the scheduling core reads (a `Snapshot`) and what it decides (`Decisions`).

Everything here is plain data: the caller builds a snapshot from its store, calls
`bai.node.scheduler.core.schedule(snapshot)`, and applies the decisions. Amounts are exact
`Decimal`s as in `bai.common.slots` (cpu in cores, anything named "*mem*" in bytes).

Datetimes must be timezone-aware (they are compared with each other and with `Snapshot.now`).

Building one from the store (what each field means):
* `PendingSession`: a PENDING session row; `kernels` = its kernel rows in cluster_idx order as
  `KernelRequest(kernel id, from_wire(occupied_slots), cluster_role)`; `retries` = its
  status_data.scheduler.retries (0 when absent). Fields after `kernels` are keyword-only.
* `AgentState`: every agent of interest; `schedulable=False` (or leave it out) unless it is
  ALIVE and connected. `capacity` = its available slots, `occupied` = the sum over its kernels
  in an occupying status (spec §3.1).
* `KeypairState`, keyed by access key, for the keypairs of the pending sessions (a missing one
  means no limits): `concurrent_sessions` = its sessions already SCHEDULED or further and not
  yet TERMINATED/CANCELLED; `occupied` = their requested slots, TERMINATING ones excluded.
* `DependencyState`, keyed by session id, for every id in any `depends_on` (a missing one
  cancels the dependent session).
* `ScalingGroup`, keyed by name; a session's group that is missing gets the defaults.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from bai.common.cluster import MULTI_NODE, SINGLE_NODE, kernel_name  # the cluster modes, defined once
from bai.common.slots import Slots
from bai.common.status import StatusInfo

__all__ = [
    "AgentState",
    "Cancel",
    "Decisions",
    "DependencyState",
    "Factors",
    "KernelRequest",
    "KeypairState",
    "MULTI_NODE",
    "Pending",
    "PendingSession",
    "Placement",
    "PredicateResult",
    "Preempt",
    "Reservation",
    "RunningSession",
    "ResourcePolicy",
    "SINGLE_NODE",
    "ScalingGroup",
    "Slots",
    "Snapshot",
    "Weights",
]

INTERACTIVE = "interactive"
BATCH = "batch"

FIFO = "fifo"
LIFO = "lifo"
DRF = "drf"
MULTIFACTOR = "multifactor"  # by a score of priority, fair share, age and size (`multifactor.py`), with backfill
POLICIES = (FIFO, LIFO, DRF, MULTIFACTOR)

# A session's priority: Backend.AI's range and default (a keypair's policy may bound it lower)
PRIORITY_MIN = 0
PRIORITY_MAX = 100
PRIORITY_DEFAULT = 10
# reservations of a multifactor scaling group (Slurm's backfill plans a start for far more: bf_max_job_test). A session
# beyond them has no protection, and small ones fill every gap before it: with 4, on bench/trace.py's trace at load
# 1.0, the heavy user's 4-GPU sessions stopped starting for their last 26 h while its 1-GPU ones waited under 1 h;
# with 16 the longest 4-GPU wait is 14.8 h, the heavy user's share at load 1.5 1.16x its fair share instead of
# 1.38x, utilisation 1 % lower; 64 evens the sizes' waits out further at 2-3x the core's time per round
DEFAULT_RESERVATIONS = 16

# preemption (per scaling group, off by default; Backend.AI's names): which running sessions go first among those of
# the same (lowest) priority
OLDEST = "oldest"
NEWEST = "newest"
PREEMPTION_ORDERS = (OLDEST, NEWEST)
PREEMPTIBLE_PRIORITY = 5  # Backend.AI's default: running sessions of at most this priority may be preempted

DISPERSED = "dispersed"
CONCENTRATED = "concentrated"
SELECTIONS = (DISPERSED, CONCENTRATED)

# Backend.AI's default `agent-selection-resource-priority` (spec §8.3).
DEFAULT_RESOURCE_PRIORITY: tuple[str, ...] = ("cuda", "rocm", "tpu", "cpu", "mem")

# Predicate names, in the order they are checked (spec §8.2 plus the two enqueue-time checks).
RESERVED_TIME = "reserved_time"
DEPENDENCIES = "dependencies"
ALLOWED_SESSION_TYPES = "allowed_session_types"
IMAGE_MIN_RESOURCES = "image_min_resources"
CONCURRENCY = "concurrency"
KEYPAIR_RESOURCE_LIMIT = "keypair_resource_limit"
SESSION_NETWORKS = "session_networks"  # a bai predicate: the networks of sessions of several kernels
USER_GROUP_RESOURCE_LIMIT = "user_group_resource_limit"  # Backend.AI's name: a project's (group's) cap
DOMAIN_RESOURCE_LIMIT = "domain_resource_limit"  # a domain's cap
PREDICATES: tuple[str, ...] = (
    RESERVED_TIME,
    DEPENDENCIES,
    ALLOWED_SESSION_TYPES,
    IMAGE_MIN_RESOURCES,
    CONCURRENCY,
    KEYPAIR_RESOURCE_LIMIT,
    USER_GROUP_RESOURCE_LIMIT,
    DOMAIN_RESOURCE_LIMIT,
    SESSION_NETWORKS,
)

# A session cancelled because something it depends on ended without success. Not a Backend.AI
# string: Backend.AI leaves such a session pending forever; we cancel it.
DEPENDENCY_FAILED = "dependency-failed"

# Session statuses after which a dependency can no longer succeed (unless it already has).
DEAD_DEPENDENCY_STATUSES = frozenset({"TERMINATED", "CANCELLED", "ERROR"})


# ----------------------------------------------------------------------------------------------
# Input


@dataclass(frozen=True, slots=True)
class Weights:
    """The multifactor policy's weights (as Slurm's PriorityWeight*), per scaling group: a session's score is

        priority × p + fair_share × f + age × a + size × s

    with every factor in [0, 1]: p its priority over PRIORITY_MAX; f 2^-(its keypair's share of the decayed usage
    over its share of the cluster), so that a keypair that used exactly its share has 0.5 and one that used nothing
    1; a its time waiting over `max_age` (seconds), at most 1; s its request's largest share of the scaling group's
    capacity (bigger sessions first among equals). The defaults make priority decide first, then fair share, then
    age: a week's wait is worth half the fair-share range (bench/trace.py: a shorter one let a heavy user's old
    sessions past the others' and cost fairness, without shortening the longest waits)."""

    priority: float = 10000.0
    fair_share: float = 1000.0
    age: float = 500.0
    size: float = 100.0
    max_age: float = 7 * 86400.0


@dataclass(frozen=True, slots=True)
class KernelRequest:
    """One kernel of a pending session: the slots it asks for."""

    kernel_id: str
    slots: Mapping[str, Decimal]  # normalised per-kernel request (spec §4)
    cluster_role: str = "main"
    cluster_idx: int = 1

    @property
    def name(self) -> str:
        """main1, sub1 …: how users know the kernel."""
        return kernel_name(self.cluster_role, self.cluster_idx)


@dataclass(frozen=True, slots=True)
class PendingSession:
    """A session waiting to be placed, as the scheduler sees it."""

    id: str
    name: str
    access_key: str
    session_type: str  # "interactive" | "batch"
    scaling_group: str
    kernels: tuple[KernelRequest, ...]
    _: KW_ONLY
    created_at: datetime  # tz-aware; queue order is (created_at, id)
    cluster_mode: str = SINGLE_NODE  # single-node: every kernel on ONE agent; multi-node: per kernel
    starts_at: datetime | None = None  # reserved start time
    depends_on: tuple[str, ...] = ()  # session ids
    image: str = ""
    image_min: Mapping[str, Decimal] = field(default_factory=dict)  # per kernel, from image labels
    retries: int = 0  # rounds this session has already been considered in
    vfolder_hosts: frozenset[str] = frozenset()  # hosts of the folders it mounts: its agent must see them
    project_id: str = ""  # the project it was created in (its cap: Snapshot.projects)
    domain_name: str = ""  # the project's domain (its cap: Snapshot.domains)
    priority: int = PRIORITY_DEFAULT  # PRIORITY_MIN..PRIORITY_MAX (the multifactor policy's priority factor)
    # seconds it runs at most once started (its declared limit or its policy's max lifetime): what backfill plans
    # with; None: unknown (it may run for ever)
    duration: float | None = None


@dataclass(slots=True)
class AgentState:
    """An agent as the scheduler sees it: capacity, what is occupied, GPUs, hosts, schedulability."""

    id: str
    scaling_group: str
    capacity: Slots  # available_slots
    occupied: Slots  # sum over kernels in an occupying status
    schedulable: bool = True  # ALIVE, connected and schedulable
    vfolder_hosts: frozenset[str] = frozenset()  # vfolder hosts it sees (at the manager's paths)
    gpu_free: tuple[Decimal, ...] = ()  # per GPU, what is left of it (1 = unused): fragmentation shows
    # its running sessions whose end is known (started + their duration): (when it ends at the latest, what it frees)
    ends: tuple[tuple[datetime, Slots], ...] = ()


@dataclass(frozen=True, slots=True)
class RunningSession:
    """A session holding slots that preemption may stop (only read for scaling groups with preemption on)."""

    id: str
    name: str
    access_key: str
    session_type: str  # "interactive" | "batch"
    scaling_group: str
    priority: int
    held: tuple[tuple[str, Slots], ...]  # (agent id, what its kernels hold there), one entry per agent
    _: KW_ONLY
    started_at: datetime  # tz-aware
    preemptible: bool = True  # its owner's choice (Backend.AI's is_preemptible, default true)
    # the pending session its preemption is under way for (a notice given, or its kernels being removed): it is
    # counted for that session at no cost and for no other
    preempting_for: str | None = None


@dataclass(frozen=True, slots=True)
class ResourcePolicy:
    """A keypair's limits: concurrent sessions, total slots, and the session networks it may hold."""

    name: str = "default"
    max_concurrent_sessions: int = 0  # 0 = unlimited
    # sessions of several kernels at once (each holds a Docker network, one of its daemon's address pools, on
    # every agent it runs on); 0 = unlimited
    max_session_networks: int = 0
    total_resource_slots: Mapping[str, Decimal] = field(default_factory=dict)  # per keypair
    default_for_unspecified: str = "UNLIMITED"  # slots missing above: "UNLIMITED" or "LIMITED" (= 0)


@dataclass(frozen=True, slots=True)
class KeypairState:
    """What a keypair holds now, and its policy."""

    access_key: str
    policy: ResourcePolicy
    concurrent_sessions: int = 0
    occupied: Mapping[str, Decimal] = field(default_factory=dict)  # over sessions occupying quota
    session_networks: int = 0  # its sessions of several kernels that hold (or are about to hold) networks


@dataclass(frozen=True, slots=True)
class ProjectState:
    """A project (or a domain) with a cap: what its sessions may hold together, and what they hold now."""

    id: str
    name: str
    cap: Mapping[str, Decimal]  # a slot not here: unlimited
    occupied: Mapping[str, Decimal] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DependencyState:
    """The state of a session another one depends on."""

    session_id: str
    name: str
    status: str  # e.g. "RUNNING", "TERMINATED", "CANCELLED", "ERROR"
    result: str  # "UNDEFINED" | "SUCCESS" | "FAILURE"


@dataclass(frozen=True, slots=True)
class ScalingGroup:
    """A group of agents with its scheduling policy, placement and allowed session types."""

    name: str
    policy: str = FIFO  # fifo | lifo | drf
    agent_selection: str = DISPERSED  # dispersed | concentrated
    allowed_session_types: frozenset[str] = frozenset({INTERACTIVE, BATCH})
    resource_priority: tuple[str, ...] = DEFAULT_RESOURCE_PRIORITY
    weights: Weights = Weights()  # multifactor
    # how many sessions that cannot start may hold a reservation, in queue order (backfill never delays them);
    # None: DEFAULT_RESERVATIONS under multifactor, 0 under the other policies
    reservations: int | None = None
    # preemption (Backend.AI's scaling-group options): when on, a session that finds no room may stop running
    # sessions of a lower priority that are preemptible, of at most `preemptible_priority`, that have run at least
    # `preemption_min_runtime` seconds; `preemption_order` breaks ties among equal priorities (oldest first or
    # newest first)
    preemption: bool = False
    preemptible_priority: int = PREEMPTIBLE_PRIORITY
    preemption_order: str = OLDEST
    preemption_min_runtime: float = 0.0

    @property
    def reservation_depth(self) -> int:
        if self.reservations is not None:
            return max(0, self.reservations)
        return DEFAULT_RESERVATIONS if self.policy == MULTIFACTOR else 0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one scheduling round decides from: pending sessions, agents, keypairs, groups, time."""

    now: datetime
    pending: Sequence[PendingSession]
    agents: Sequence[AgentState]
    keypairs: Mapping[str, KeypairState] = field(default_factory=dict)  # a missing key: no limits
    dependencies: Mapping[str, DependencyState] = field(default_factory=dict)  # by session id
    scaling_groups: Mapping[str, ScalingGroup] = field(default_factory=dict)  # missing: defaults
    projects: Mapping[str, ProjectState] = field(default_factory=dict)  # the projects with a cap, by id
    domains: Mapping[str, ProjectState] = field(default_factory=dict)  # the domains with a cap, by name
    # fair share (multifactor): each keypair's decayed usage (GPU-weighted slot-seconds) and its share of the cluster
    # (a keypair missing from `shares` has 1); those compared are the keypairs of `usage` and of pending sessions
    usage: Mapping[str, float] = field(default_factory=dict)
    shares: Mapping[str, float] = field(default_factory=dict)
    # each project's decayed usage, by project id: where any is above 0, a session's fair-share factor is the
    # geometric mean of its keypair's and its project's (multifactor.py)
    project_usage: Mapping[str, float] = field(default_factory=dict)
    # the sessions holding slots in scaling groups with preemption on (what preemption may stop)
    running: Sequence[RunningSession] = ()


# ----------------------------------------------------------------------------------------------
# Output


@dataclass(frozen=True, slots=True)
class Placement:
    """A decision: a session's kernels go to these agents."""

    session_id: str
    agents: Mapping[str, str]  # kernel_id -> agent_id, every kernel of the session

    @property
    def agent_ids(self) -> tuple[str, ...]:
        """The distinct agents used, in kernel order."""
        return tuple(dict.fromkeys(self.agents.values()))


@dataclass(frozen=True, slots=True)
class PredicateResult:
    """One check of a pending session, passed or failed with its message."""

    name: str
    passed: bool
    msg: str = ""


@dataclass(frozen=True, slots=True)
class Factors:
    """A session's multifactor score and its parts (each factor in [0, 1], before its weight)."""

    priority: float
    fair_share: float
    age: float
    size: float
    score: float

    def as_dict(self) -> dict[str, float]:
        return {
            "priority": round(self.priority, 4),
            "fair_share": round(self.fair_share, 4),
            "age": round(self.age, 4),
            "size": round(self.size, 4),
            "score": round(self.score, 2),
        }


@dataclass(frozen=True, slots=True)
class Reservation:
    """Where and by when a session that cannot start now will: the room of `agents` is kept for it from
    `starts_at` (None: once their running sessions of unknown length end), and backfill never delays it."""

    starts_at: datetime | None
    agents: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"starts_at": self.starts_at.isoformat() if self.starts_at else None, "agents": list(self.agents)}


@dataclass(frozen=True, slots=True)
class Pending:
    """A decision: the session keeps waiting, and why."""

    session_id: str
    status_info: str  # predicate-checks-failed | no-available-instances
    msg: str
    predicates: tuple[PredicateResult, ...]  # every predicate, in check order
    position: int  # 1-based, among the sessions left pending in the scaling group, policy order
    retries: int = 1  # the session's retries + 1
    factors: Factors | None = None  # its score's parts (multifactor)
    reservation: Reservation | None = None  # the room kept for it (a session first in line that cannot start)
    preempting: tuple[str, ...] = ()  # the running sessions stopped (or being stopped) to make room for it

    def status_data(self, last_try: datetime) -> dict[str, Any]:
        """Backend.AI's status_data for this pending reason (spec §3.3)."""
        data: dict[str, Any] = {"retries": self.retries, "last_try": last_try.isoformat()}
        if self.factors is not None:
            data["factors"] = self.factors.as_dict()
        if self.reservation is not None:
            data["reservation"] = self.reservation.as_dict()
        if self.preempting:
            data["preempting"] = list(self.preempting)
        if self.status_info == StatusInfo.PREDICATE_CHECKS_FAILED:
            data["failed_predicates"] = [{"name": p.name, "msg": p.msg} for p in self.predicates if not p.passed]
            data["passed_predicates"] = [{"name": p.name} for p in self.predicates if p.passed]
        else:
            data["msg"] = self.msg
        return {"scheduler": data}


@dataclass(frozen=True, slots=True)
class Cancel:
    """A decision: the session is cancelled, and why."""

    session_id: str
    status_info: str  # dependency-failed
    msg: str


@dataclass(frozen=True, slots=True)
class Preempt:
    """A decision: a running session is stopped to make room for a pending one (`by`), and why."""

    session_id: str
    by: str  # the pending session's id
    msg: str


@dataclass(slots=True)
class Decisions:
    """The outcome of one scheduling round: placements, cancellations, sessions left waiting, sessions preempted."""

    placements: list[Placement] = field(default_factory=list)
    pending: list[Pending] = field(default_factory=list)
    cancels: list[Cancel] = field(default_factory=list)
    preemptions: list[Preempt] = field(default_factory=list)
