"""The records the state layer reads and writes for sessions and kernels, agents, accounts, folders, images and
logs: frozen and typed.

Records are msgspec `Struct(frozen=True)`s, chosen by measurement (`bench/records.py`, ratios of one run on the
2-core machine CI uses, 10,000 keypair rows of 7 columns from sqlite3): building them from sqlite3 rows takes
0.19× the time of today's `dict(row)` (2.8 ms against 15.0 ms), where `@dataclass(frozen=True, slots=True)` takes
1.53× (22.9 ms); reading three fields takes 0.52× a dict's look-ups for both (0.71 ms against 1.36 ms). msgspec is
the faster and types as well (mypy sees a Struct's fields as a dataclass's).

Log chunks, pages and tails are `NamedTuple`s: typed and immutable, and unpacked as the tuples they were
(`for seq, text, ts in chunks`), so that reading a log stays as cheap as it was.

Times are the ISO 8601 strings (UTC) stored and shown today: the API shows them as they are. Writes take the time
they stamp (`now`) from their callers, as a datetime; the state layer formats it (`stamp`).

`UNSET` marks a field a partial write (`PolicyFields`, `FolderChanges`) leaves as it is.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

import msgspec
from msgspec import UNSET, UnsetType

from bai.node.manager.state.team_records import DEFAULT_PROJECT_ID

__all__ = [
    "UNSET",
    "Agent",
    "AgentCapacity",
    "Dotfile",
    "FolderChanges",
    "FolderShare",
    "ImageAlias",
    "Invitation",
    "Kernel",
    "KernelChanges",
    "Keypair",
    "LogChunk",
    "LogPage",
    "LogKept",
    "LogTail",
    "NewAgent",
    "NewKeypair",
    "NewKernel",
    "NewSession",
    "NewVFolder",
    "Policy",
    "PolicyFields",
    "SchedulingAttempt",
    "SeenVFolder",
    "Session",
    "Transition",
    "UnsetType",
    "VFolder",
    "changed_fields",
    "new_policy",
    "stamp",
]


def stamp(now: datetime) -> str:
    """How a time is stored and shown: ISO 8601, as `datetime.isoformat` writes it (UTC)."""
    return now.isoformat()


# -- sessions and kernels ----------------------------------------------------------------------------------


class Session(msgspec.Struct, frozen=True):
    """A session: who owns it, what it asked for, where it is in its lifecycle (`bai.common.status`) and why.

    `status_data` is what the status says in detail (the scheduler's reason, an exit code, hook notes: the API
    shows it as it is); `config` what the session was created with beyond its columns (mounts, dependencies,
    bootstrap, ...), as the create request gave it."""

    id: str
    name: str
    access_key: str
    image: str
    type: str  # INTERACTIVE | BATCH | INFERENCE
    status: str  # a SessionStatus value
    status_info: str
    status_data: dict[str, Any]
    status_changed: str
    requested_slots: dict[str, str]  # wire form, per kernel
    environ: dict[str, str]
    config: dict[str, Any]
    scaling_group: str
    cluster_size: int
    tag: str | None
    result: str  # UNDEFINED | SUCCESS | FAILURE
    created_at: str
    terminated_at: str | None
    seq: int  # its place in the queue
    started_at: str | None = None  # when it first became RUNNING (None: it never ran)
    domain_name: str = "default"  # the domain and project it was created in (team_records)
    project_id: str = DEFAULT_PROJECT_ID
    priority: int = 10  # 0-100: the multifactor scheduling policy's priority factor
    time_limit: float | None = None  # seconds it may run once started, as it declared (None: none of its own)


class Kernel(msgspec.Struct, frozen=True):
    """One container of a session: its place in the cluster (main1, sub1 …), where it runs and what it holds."""

    id: str
    session_id: str
    cluster_role: str  # main | sub
    cluster_idx: int
    image: str
    agent_id: str | None
    container_id: str | None
    status: str
    status_info: str
    status_changed: str
    occupied_slots: dict[str, str]
    exit_code: int | None
    created_at: str
    terminated_at: str | None
    devices: list[list[Any]]  # [[GPU UUID, share], ...]
    service_ports: list[dict[str, Any]]  # its apps: {name, protocol, container_ports, host_ports}
    last_stat: str | None  # its final statistics sample (JSON, bai/common/stats.py); None: none


class NewSession(msgspec.Struct, frozen=True):
    """A session to create (PENDING, last in the queue; stamped with `created_at`)."""

    id: str
    name: str
    access_key: str
    image: str
    type: str
    requested_slots: dict[str, str]
    environ: dict[str, str]
    config: dict[str, Any]
    scaling_group: str
    created_at: datetime
    tag: str | None = None
    domain_name: str = "default"
    project_id: str = DEFAULT_PROJECT_ID
    priority: int = 10
    time_limit: float | None = None


class NewKernel(msgspec.Struct, frozen=True):
    """A kernel of a session to create: its id, its place in the cluster and the slots it takes."""

    id: str
    cluster_role: str
    cluster_idx: int
    slots: dict[str, str]


class KernelChanges(msgspec.Struct, frozen=True):
    """What a transition (or a report) changes of one kernel beyond the status it follows; UNSET: as it is."""

    agent_id: str | UnsetType = UNSET
    container_id: str | None | UnsetType = UNSET
    exit_code: int | None | UnsetType = UNSET
    devices: list[list[Any]] | UnsetType = UNSET
    service_ports: list[dict[str, Any]] | UnsetType = UNSET
    last_stat: dict[str, Any] | UnsetType = UNSET


class Transition(msgspec.Struct, frozen=True):
    """A status a session entered, why and when."""

    status: str
    status_info: str
    status_data: dict[str, Any]
    at: str


class SchedulerRound(msgspec.Struct, frozen=True):
    """A scheduling round kept for replay: its number, time, the digest of its snapshot, what it decided in short,
    and (when read whole) its snapshot and decisions as bai.node.scheduler.record encodes them."""

    number: int
    at: str
    digest: str
    summary: dict[str, Any]  # {"pending": n, "placed": n, "cancelled": n, "preempted": n, "waiting": n}
    snapshot: bytes = b""
    decisions: bytes = b""


class SchedulingAttempt(msgspec.Struct, frozen=True):
    """What scheduling rounds made of a session: one row per outcome, merged over rounds while it is the same
    (first and last round's time, how many)."""

    session_id: str
    outcome: str  # pending | scheduled | cancelled | preempted
    status_info: str
    msg: str
    agents: str  # the agents it was placed on, comma-separated ("" when not placed)
    predicates: list[dict[str, Any]]  # the checks that failed
    first_at: str = ""
    last_at: str = ""
    rounds: int = 1
    number: int = 0  # the row's number in the history (read back; 0 before it is written)


class HistorySearch(msgspec.Struct, frozen=True):
    """Which rows of the scheduling history a search reads, and in which order (the string filters and the page are
    applied by the caller's `keep` and the query's offset and limit)."""

    outcomes: list[str]  # the outcomes wanted (none: no row)
    session_ids: list[str] | None = None  # only these sessions' rows (None: every session's)
    not_session_ids: list[str] = []  # none of these sessions' rows
    by: str = "first_at"  # first_at | last_at
    descending: bool = True


# -- agents -------------------------------------------------------------------------------------------------


class Agent(msgspec.Struct, frozen=True):
    """An agent that registered: who it is, its capacity (wire form: slot -> amount), status and times."""

    id: str
    hostname: str
    backend: str
    version: str
    scaling_group: str
    status: str  # ALIVE | LOST | TERMINATED
    slots: dict[str, str]
    first_contact: str
    last_seen: str


class AgentCapacity(msgspec.Struct, frozen=True):
    """What placement needs of an agent: its id, scaling group, status and capacity (wire form)."""

    id: str
    scaling_group: str
    status: str
    slots: dict[str, str]


class NewAgent(msgspec.Struct, frozen=True):
    """An agent's registration, as stored (it is ALIVE once stored)."""

    id: str
    hostname: str
    backend: str
    version: str
    scaling_group: str
    slots: dict[str, str]


# -- accounts -----------------------------------------------------------------------------------------------


class Keypair(msgspec.Struct, frozen=True):
    """A keypair: who signs requests, whether an admin, the resource policy it follows."""

    access_key: str
    secret_key: str
    user_id: str
    is_admin: bool
    is_active: bool
    resource_policy: str
    created_at: str
    user_uuid: str = ""  # its user (team_records.User); "": none (not since schema 16)


class NewKeypair(msgspec.Struct, frozen=True):
    """A keypair to create (active; stamped with the caller's `now`)."""

    access_key: str
    secret_key: str
    user_id: str
    is_admin: bool = False
    resource_policy: str = "default"
    user_uuid: str = ""  # its user; "": the user of that user id (username or email), made if there is none


class Policy(msgspec.Struct, frozen=True):
    """A resource policy: how much a keypair following it may hold and for how long (0: unlimited)."""

    name: str
    max_concurrent_sessions: int
    total_resource_slots: dict[str, str]  # wire form: slot -> amount
    default_for_unspecified: str  # LIMITED | UNLIMITED
    idle_timeout: float
    max_session_lifetime: float
    max_vfolder_count: int
    max_vfolder_size: int  # bytes per folder
    idle_cpu_pct: float | None  # None: not checked
    idle_gpu_pct: float | None
    idle_window: float
    max_session_networks: int
    max_pending_session_count: int
    created_at: str
    max_priority: int = 100  # the highest priority its keypairs' sessions may have


def new_policy(name: str, created_at: str = "", **fields: Any) -> Policy:
    """A policy with the schema's defaults for the fields not given (what a new policy stores)."""
    defaults: dict[str, Any] = {
        "max_concurrent_sessions": 0,
        "total_resource_slots": {},
        "default_for_unspecified": "UNLIMITED",
        "idle_timeout": 0.0,
        "max_session_lifetime": 0.0,
        "max_vfolder_count": 0,
        "max_vfolder_size": 0,
        "idle_cpu_pct": None,
        "idle_gpu_pct": None,
        "idle_window": 600.0,
        "max_session_networks": 2,
        "max_pending_session_count": 1000,
        "max_priority": 100,
    }
    return Policy(name=name, created_at=created_at, **{**defaults, **fields})


class PolicyFields(msgspec.Struct, frozen=True):
    """The fields of a policy a write sets (UNSET: left as they are, or the default for a new policy)."""

    max_concurrent_sessions: int | UnsetType = UNSET
    total_resource_slots: dict[str, str] | UnsetType = UNSET
    default_for_unspecified: str | UnsetType = UNSET
    idle_timeout: float | UnsetType = UNSET
    max_session_lifetime: float | UnsetType = UNSET
    max_vfolder_count: int | UnsetType = UNSET
    max_vfolder_size: int | UnsetType = UNSET
    idle_cpu_pct: float | None | UnsetType = UNSET
    idle_gpu_pct: float | None | UnsetType = UNSET
    idle_window: float | UnsetType = UNSET
    max_session_networks: int | UnsetType = UNSET
    max_pending_session_count: int | UnsetType = UNSET
    max_priority: int | UnsetType = UNSET


class Dotfile(msgspec.Struct, frozen=True):
    """A file put in the home of each new kernel of a keypair."""

    path: str  # relative to the kernel's home
    data: str
    permission: str  # octal, as text: "644"


# -- folders ------------------------------------------------------------------------------------------------


class VFolder(msgspec.Struct, frozen=True):
    """A virtual folder's row (its files live on its host, in the directory named by its id)."""

    id: str
    name: str
    host: str
    owner: str  # access key
    usage_mode: str
    status: str  # ready | trashed
    created_at: str
    trashed_at: str | None
    mount_permission: str  # ro | rw | wd: Backend.AI's innate permission
    cloneable: bool
    project_id: str | None = None  # None: a user's folder; else the project's (its owner "project:<id>")


class SeenVFolder(VFolder, frozen=True):
    """A folder as a keypair sees it: `permission` wd for its owner, the share's (ro / rw) for others."""

    permission: str = "wd"
    is_owner: bool = True


class NewVFolder(msgspec.Struct, frozen=True):
    """A folder to create (ready; stamped with the caller's `now`)."""

    id: str
    name: str
    host: str
    owner: str
    usage_mode: str = "general"
    mount_permission: str = "rw"
    cloneable: bool = False
    project_id: str | None = None


class FolderChanges(msgspec.Struct, frozen=True):
    """What a folder update changes (UNSET: left as it is)."""

    name: str | UnsetType = UNSET
    owner: str | UnsetType = UNSET
    status: str | UnsetType = UNSET
    trashed_at: str | None | UnsetType = UNSET
    mount_permission: str | UnsetType = UNSET
    cloneable: bool | UnsetType = UNSET


class FolderShare(msgspec.Struct, frozen=True):
    """A folder shared with a keypair, with the folder's name, owner and status."""

    vfolder_id: str
    access_key: str
    permission: str  # ro | rw
    name: str
    owner: str
    status: str


class Invitation(msgspec.Struct, frozen=True):
    """An invitation to share a folder (a share once the invitee accepts)."""

    id: str
    vfolder_id: str
    inviter: str  # access keys
    invitee: str
    permission: str  # ro | rw
    state: str  # pending | accepted | rejected | canceled
    created_at: str
    modified_at: str
    vfolder_name: str


# -- images -------------------------------------------------------------------------------------------------


class ImageAlias(msgspec.Struct, frozen=True):
    """An alias set with `bai image alias` (it overrides [images.aliases])."""

    alias: str
    image: str


# -- logs ---------------------------------------------------------------------------------------------------


class LogChunk(NamedTuple):
    """A piece of a kernel's output as stored."""

    seq: int
    data: str
    ts: str | None  # when stored (None: by an older bai)


class LogPage(NamedTuple):
    """Chunks of a log, and whether more follow."""

    chunks: list[LogChunk]
    more: bool


class LogTail(NamedTuple):
    """The chunks of a log's last lines, and the seq of its newest chunk (from which to follow it)."""

    chunks: list[LogChunk]
    newest: int


class LogKept(msgspec.Struct, frozen=True):
    """What is kept of a kernel's log."""

    bytes: int  # UTF-8 bytes kept
    dropped: int  # bytes of older output dropped
    purged_at: str | None  # when the whole log was purged (None: it was not)


def changed_fields(changes: msgspec.Struct) -> dict[str, Any]:
    """The fields a partial write sets (those not UNSET), by name."""
    return {f: v for f in changes.__struct_fields__ if (v := getattr(changes, f)) is not UNSET}
