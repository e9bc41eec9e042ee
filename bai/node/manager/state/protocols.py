"""What the services ask of the state, one Protocol per domain, whatever implementation is behind it (SQLite
today, `state.sqlite.Store`; PostgreSQL next). Reads return the frozen records of `state.records`; writes take
typed arguments and the time they stamp (`now`, from the caller's clock). A full disk is `errors.StorageFull`.

`tests/test_state_contract.py` runs the same tests over every implementation, through these protocols only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from bai.common.status import SessionStatus
from bai.node.manager.state.preset_records import ResourcePreset
from bai.node.manager.state.records import (
    Agent,
    AgentCapacity,
    Dotfile,
    FolderChanges,
    FolderShare,
    HistorySearch,
    ImageAlias,
    Invitation,
    Kernel,
    KernelChanges,
    Keypair,
    LogChunk,
    LogKept,
    LogPage,
    LogTail,
    NewAgent,
    NewKernel,
    NewKeypair,
    NewSession,
    NewVFolder,
    Policy,
    PolicyFields,
    SchedulerRound,
    SchedulingAttempt,
    SeenVFolder,
    Session,
    Transition,
    VFolder,
)
from bai.node.manager.state.team_records import TeamDirectory, User, UserChanges
from bai.node.manager.state.template_records import NewTemplate, StoredTemplate, TaskTemplate


class SessionReadState(Protocol):
    """The reads of sessions and kernels (what HTTP handlers may do: they never write)."""

    async def get_session(self, session_id: str) -> Session | None: ...

    async def list_sessions(
        self, access_key: str | None, statuses: Iterable[SessionStatus] | None, limit: int = -1, newest: bool = False
    ) -> list[Session]:
        """In queue order (`newest`: the latest first); `limit` -1: all."""
        ...

    async def find_sessions(
        self, ref: str, access_key: str | None, *, active_only: bool, ids_of: str | None | bool = True
    ) -> list[Session]:
        """Whose id (or an id prefix of 8+ characters) or name is `ref`, newest first; names among
        `access_key`'s sessions (None: anyone's), ids among `ids_of`'s (True: the same; None: anyone's)."""
        ...

    async def sessions_by_ids(self, session_ids: list[str]) -> list[Session]: ...

    async def sessions_overlapping(self, start: datetime, end: datetime) -> list[Session]:
        """The sessions that ran during [start, end): started before `end` and not ended before `start` (those
        still running too), in the order they started (usage reports)."""
        ...

    async def count_sessions_by_status(self) -> dict[str, int]: ...

    async def count_sessions_of(self, access_key: str, statuses: Iterable[SessionStatus]) -> int: ...

    async def kernels_of(self, session_id: str) -> list[Kernel]:
        """In cluster order: main1, sub1, sub2 …"""
        ...

    async def kernels_of_many(self, session_ids: list[str]) -> dict[str, list[Kernel]]: ...

    async def get_kernel(self, kernel_id: str) -> Kernel | None: ...

    async def transitions_of(self, session_id: str) -> list[Transition]: ...

    async def scheduling_history(self, session_id: str) -> list[SchedulingAttempt]: ...

    async def search_scheduling_history(
        self, search: HistorySearch, keep: Callable[[SchedulingAttempt], bool], offset: int, limit: int
    ) -> tuple[list[SchedulingAttempt], int]:
        """Every session's scheduling history as `search` selects and orders it, the rows `keep` accepts: those from
        `offset`, at most `limit`, and how many there are in all."""
        ...


class SessionState(SessionReadState, Protocol):
    """Sessions and their kernels: creation, transitions (one transaction each, checked against the lifecycle's
    legal moves), scheduling rounds and their history, and the reads above."""

    async def create_session(self, session: NewSession, kernels: list[NewKernel]) -> str | None:
        """Insert a PENDING session and its kernels; when its owner has a live session of that name, nothing,
        and that session's id."""
        ...

    async def create_or_get_session(self, session: NewSession, kernels: list[NewKernel]) -> tuple[Session, bool]:
        """(the new session, True), or (the owner's live session of that name, False) and nothing inserted."""
        ...

    async def transition(
        self,
        session_id: str,
        target: SessionStatus,
        status_info: str = "",
        status_data: dict[str, Any] | None = None,
        *,
        allowed_from: Iterable[SessionStatus] | None = None,
        kernel_updates: dict[str, KernelChanges] | None = None,
        result: str | None = None,
        now: datetime,
    ) -> Session | None:
        """Move a session (and its kernels, with their own changes) to `target` at `now`: the session as moved;
        None when it is not there, not in `allowed_from` or already at `target`; IllegalTransition for a move
        the lifecycle forbids."""
        ...

    async def start_preparing(
        self, session_id: str, now: datetime
    ) -> tuple[Session, list[Kernel], list[Dotfile]] | None:
        """SCHEDULED -> PREPARING and what its start needs (its kernels, its owner's dotfiles), in one
        transaction; None when it is no longer SCHEDULED."""
        ...

    async def apply_round(
        self,
        placements: list[tuple[str, dict[str, str]]],
        cancels: list[tuple[str, str, dict[str, Any]]],
        pending: list[tuple[str, str, dict[str, Any]]],
        history: list[SchedulingAttempt],
        now: datetime,
    ) -> tuple[list[Session], list[Session]]:
        """One scheduling round in one transaction: placements (session id, {kernel id: agent id}) ->
        SCHEDULED, cancels (id, info, data) -> CANCELLED, pending (id, info, data) recorded on sessions still
        PENDING, history merged; (the sessions scheduled, the sessions cancelled)."""
        ...

    async def update_kernel(self, kernel_id: str, changes: KernelChanges) -> None: ...

    async def usage_by_keypair(self, statuses: Iterable[SessionStatus]) -> list[tuple[str, dict[str, str], int]]:
        """(access key, requested slots, how many of its sessions in these statuses request exactly those)."""
        ...

    async def kernels_where(self, statuses: Iterable[str], agent_id: str | None = None) -> list[Kernel]: ...

    async def kernel_owners(self, kernel_ids: list[str]) -> dict[str, tuple[str, str, str]]:
        """Kernel id -> (its session's id, its owner's access key, its status), for those that exist."""
        ...

    async def set_session_priority(self, session_id: str, priority: int) -> bool: ...

    async def requeue(
        self, session_id: str, status_info: str, status_data: dict[str, Any], now: datetime
    ) -> Session | None:
        """A PREEMPTED session waits again (PENDING, its kernels as new); None when it is not PREEMPTED."""
        ...

    async def rename_session(self, session_id: str, access_key: str, name: str) -> bool:
        """False (and nothing changed) when the owner has another live session of that name."""
        ...

    async def record_run(self, session_id: str, kernel_id: str, exit_code: int, result: str) -> None: ...

    async def set_pending_info(self, session_id: str, info: str, data: dict[str, Any]) -> None: ...

    async def set_status_info(self, session_id: str, status: str, info: str, data: dict[str, Any]) -> Session | None:
        """The status info and data of a session still in `status` (no transition): the session, or None."""
        ...

    async def add_hook_notes(self, session_id: str, notes: list[str]) -> None: ...


class AgentState(Protocol):
    """The agents that registered: their rows, and the capacities placement reads (kept in memory)."""

    async def upsert_agent(self, agent: NewAgent, now: datetime) -> None: ...

    async def set_agent_status(self, agent_id: str, status: str, now: datetime) -> None: ...

    async def touch_agent(self, agent_id: str, now: datetime) -> None: ...

    async def agents(self) -> list[Agent]: ...

    async def agent_capacities(self) -> tuple[int, list[AgentCapacity]]:
        """(version, capacities by id): equal versions, equal capacities; the state keeps them in memory and
        changes the version on its own writes."""
        ...

    def capacities_version(self) -> int: ...


class AccountState(Protocol):
    """Keypairs, the resource policies they follow, and their dotfiles. The active keypairs are kept in
    memory by the state (changed on its own writes): `active_keypair` is what authentication asks."""

    async def ensure_admin_keypair(self, access_key: str, secret_key: str, now: datetime) -> tuple[str, str]: ...

    def active_keypair(self, access_key: str) -> Keypair | None: ...

    async def keypairs(self, active_only: bool = True) -> dict[str, Keypair]: ...

    async def keypair(self, access_key: str) -> Keypair | None: ...

    async def create_keypair(self, keypair: NewKeypair, now: datetime) -> None: ...

    async def update_keypair(
        self,
        access_key: str,
        *,
        resource_policy: str | None = None,
        is_active: bool | None = None,
        is_admin: bool | None = None,
    ) -> bool: ...

    async def delete_keypair(self, access_key: str) -> bool: ...

    async def policies(self) -> dict[str, Policy]: ...

    async def policy(self, name: str) -> Policy | None: ...

    async def save_policy(self, name: str, fields: PolicyFields, *, create: bool, now: datetime) -> bool: ...

    async def delete_policy(self, name: str) -> str | None: ...

    async def session_networks_by_keypair(self, statuses: Iterable[Any]) -> dict[str, int]: ...

    async def pending_queue(self, access_key: str) -> tuple[str, int, int]: ...

    async def dotfiles(self, access_key: str) -> list[Dotfile]: ...

    async def put_dotfile(self, access_key: str, path: str, data: str, permission: str) -> None: ...

    async def delete_dotfile(self, access_key: str, path: str) -> bool: ...


class TeamState(Protocol):
    """Domains, projects, users, scaling groups and their associations, users' and projects' policies: all of
    them in memory (`teams`), each write one transaction after which the copy in memory (and the active keypairs,
    which follow their users) is current."""

    def teams(self) -> TeamDirectory: ...

    async def load_teams(self) -> None: ...

    async def create_team_record(self, record: Any, now: datetime) -> bool: ...

    async def update_team_record(
        self, cls: type[Any], key: str, changes: dict[str, Any], now: datetime
    ) -> bool | None: ...

    async def delete_team_record(self, cls: type[Any], key: str, now: datetime) -> str | None: ...

    async def create_user(
        self, user: User, password_hash: str | None, projects: Iterable[str], now: datetime
    ) -> bool: ...

    async def update_user(self, uuid: str, changes: UserChanges, now: datetime) -> bool | None: ...

    async def purge_user(self, uuid: str, now: datetime) -> str | None: ...

    async def password_hash(self, uuid: str) -> str | None: ...

    async def set_members(self, project_id: str, add: Iterable[str], remove: Iterable[str], now: datetime) -> bool: ...

    async def link_scaling_group(self, group: str, kind: str, target: str, linked: bool, now: datetime) -> bool: ...

    async def project_usage(self, statuses: Iterable[str]) -> dict[str, tuple[int, list[dict[str, str]]]]: ...


class FolderState(Protocol):
    """Virtual folders' rows, their shares and invitations (their files are the folder hosts')."""

    async def create_vfolder(self, folder: NewVFolder, now: datetime) -> bool: ...

    async def vfolders_of(
        self, access_key: str | None, status: str = "ready", projects: Iterable[str] = ()
    ) -> list[SeenVFolder]: ...

    async def get_vfolder(self, folder_id: str) -> VFolder | None: ...

    async def update_vfolder(self, folder_id: str, changes: FolderChanges) -> bool: ...

    async def delete_vfolder(self, folder_id: str) -> None: ...

    async def count_vfolders(self, owner: str) -> int: ...

    async def share_vfolder(self, folder_id: str, access_key: str, permission: str | None) -> None: ...

    async def shares_of(self, folder_id: str) -> dict[str, str]: ...

    async def all_shares(self, folder_id: str | None = None) -> list[FolderShare]: ...

    async def invite(
        self, folder_id: str, inviter: str, invitees: list[str], permission: str, now: datetime
    ) -> list[str]: ...

    async def invitations(
        self, *, invitee: str | None = None, inviter: str | None = None, invitation_id: str | None = None
    ) -> list[Invitation]: ...

    async def close_invitation(self, invitation_id: str, state: str, now: datetime) -> Invitation | None: ...


class ImageState(Protocol):
    """Image aliases set with `bai image alias`."""

    async def image_aliases(self) -> list[ImageAlias]: ...

    async def set_image_alias(self, alias: str, image: str | None) -> bool: ...


class LogState(Protocol):
    """Kernels' output, each kernel's kept within a bound: appended, paged, tailed, purged."""

    async def append_logs(self, chunks: list[tuple[str, str]], now: datetime) -> None: ...

    async def cut_logs_to_bound(self, now: datetime) -> list[str]: ...

    async def read_logs(self, kernel_id: str, after_seq: int = 0, limit: int = 1000) -> list[tuple[int, str]]: ...

    async def read_log_chunks(
        self, kernel_id: str, after_seq: int = 0, limit: int = 1000, max_bytes: int | None = ...
    ) -> list[LogChunk]: ...

    async def read_log_page(
        self, kernel_id: str, after_seq: int = 0, max_bytes: int | None = ..., limit: int = 100_000
    ) -> LogPage: ...

    async def read_log_tail(self, kernel_id: str, lines: int, after_seq: int = 0) -> LogTail: ...

    async def log_seq_before(self, kernel_id: str, when: str) -> int: ...

    async def newest_log_seq(self, kernel_id: str) -> int: ...

    async def log_tail_start(self, kernel_id: str, lines: int) -> int: ...

    async def log_state(self, kernel_id: str) -> LogKept | None: ...

    async def purge_logs(self, ended_before: datetime, now: datetime, batch: int = 50) -> list[str]: ...


class TemplateState(Protocol):
    """Session templates (Backend.AI's task templates), by id."""

    async def create_templates(
        self, templates: Sequence[NewTemplate], now: datetime, limit: int
    ) -> list[str] | None: ...

    async def session_templates(self, user_uuid: str | None) -> list[StoredTemplate]: ...

    async def session_template(self, template_id: str) -> StoredTemplate | None: ...

    async def replace_session_template(
        self, template_id: str, name: str, template: TaskTemplate, group_id: str | None
    ) -> bool: ...

    async def delete_session_template(self, template_id: str) -> bool: ...


class PresetState(Protocol):
    """Resource presets, by name."""

    async def resource_presets(self) -> list[ResourcePreset]: ...

    async def create_resource_preset(self, preset: ResourcePreset) -> bool: ...

    async def replace_resource_preset(self, name: str, preset: ResourcePreset) -> bool: ...

    async def delete_resource_preset(self, name: str) -> bool: ...


class FairShareState(Protocol):
    """Each keypair's and project's decayed usage (fair share), as of a time."""

    async def fair_share_usage(self) -> dict[str, tuple[float, str]]: ...

    async def save_fair_share_usage(self, rows: Mapping[str, tuple[float, str]]) -> None: ...

    async def pending_by_owner(self) -> list[tuple[str, str, int]]:
        """How many sessions wait, per (access key, project id)."""
        ...


class RoundState(Protocol):
    """Scheduling rounds kept for replay."""

    async def add_scheduler_round(
        self, at: str, digest: str, snapshot: bytes, decisions: bytes, summary: dict[str, Any], keep: int
    ) -> int: ...

    async def fill_scheduler_round(self, number: int, digest: str, snapshot: bytes, decisions: bytes) -> None: ...

    async def scheduler_rounds(self, limit: int, before: int | None = None) -> list[SchedulerRound]: ...

    async def scheduler_round(self, number: int) -> SchedulerRound | None: ...


class State(
    SessionState,
    AgentState,
    AccountState,
    TeamState,
    FolderState,
    ImageState,
    TemplateState,
    PresetState,
    FairShareState,
    RoundState,
    LogState,
    Protocol,
):
    """The whole state, as the services that need several domains take it (whatever implementation: the
    services never name one), and its upkeep."""

    async def reclaim_space(self, min_free_pages: int = 0) -> dict[str, int]:
        """Give free space of the state's storage back to the file system where the implementation can."""
        ...

    async def close(self) -> None: ...
