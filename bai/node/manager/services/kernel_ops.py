"""Operations on a session's kernels: execute and interrupt code, terminals, files (upload, list, download),
restart, commit, rename.

Each checks the session's status first (NotRunning: a 409 saying the status and what to do), and asks the
kernel's agent through `_ask`, where a link error becomes a domain error: a kernel not placed yet is
NotRunning, an agent away or silent is KernelUnreachable (503), a refusal of the agent is Invalid (400).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from bai.common.clock import Clock
from bai.common.cluster import kernel_name_of
from bai.common.names import name_problem
from bai.common.status import ACTIVE_STATUSES, SessionStatus
from bai.node.link.base import AgentUnavailable, ManagerLink, RemoteError
from bai.node.link.messages import (
    Call,
    CommitKernel,
    DownloadFiles,
    Execute,
    Interrupt,
    ListFiles,
    OpenTerminal,
    RestartKernel,
    UploadFiles,
    call,
)
from bai.node.link.streams import LinkStream
from bai.node.manager.domain_errors import (
    Conflict,
    DomainError,
    Failed,
    Invalid,
    KernelUnreachable,
    NotRunning,
    SessionNotFound,
)
from bai.node.manager.services.activity import Activity
from bai.node.manager.services.diskfull import FullDiskWarnings
from bai.node.manager.services.hubs import EventHub
from bai.node.manager.services.kernel_logs import newest_seq
from bai.node.manager.services.runs import RunHistory
from bai.node.manager.services.session_reads import SessionReads
from bai.node.manager.state import State
from bai.node.manager.state.records import Kernel, Session

if TYPE_CHECKING:
    from bai.node.manager.services.lifecycle import SessionLifecycle

log = logging.getLogger("bai.manager")
S = SessionStatus
R = TypeVar("R")
SERVING = frozenset({S.RUNNING, S.RUNNING_DEGRADED})  # statuses whose kernels run code, take files


def require_running(session: Session, what: str) -> None:
    """NotRunning (naming the session's status and what to do) unless its kernels run (RUNNING, RUNNING_DEGRADED)."""
    if S(session.status) not in SERVING:
        raise NotRunning(session, f"{what} needs a running kernel")


async def _ask(link: ManagerLink, session: Session, kernel: Kernel, what: str, message: Call[R], timeout: float) -> R:
    """`message` to the kernel's agent; a link error as a domain error (see the module's docstring)."""
    agent_id = kernel.agent_id
    if not agent_id:  # not placed yet: the session is not running (whatever the row said when it was read)
        raise NotRunning(session, what)
    try:
        return await call(link, agent_id, message, timeout=timeout)
    except RemoteError as e:
        raise Invalid(e.message) from None
    except (AgentUnavailable, TimeoutError) as e:
        raise KernelUnreachable(agent_id, str(e) or "no answer") from None


class KernelOps:
    """What users do with a running session's kernels."""

    def __init__(
        self,
        store: State,
        link: ManagerLink,
        reads: SessionReads,
        lifecycle: SessionLifecycle,
        activity: Activity,
        runs: RunHistory,
        changes: EventHub[dict[str, Any]],
        learn_labels: Callable[[str, dict[str, str]], None],
        clock: Clock,
    ) -> None:
        self.store = store
        self.link = link
        self.reads = reads
        self.lifecycle = lifecycle  # a restart's status moves
        self.activity = activity
        self.runs = runs
        self.changes = changes  # ("run_finished", …), ("session_renamed", …) for the dashboard
        self.learn_labels = learn_labels  # what a commit made is known at once (Agents.learn_labels)
        self.clock = clock
        self.full_disk = FullDiskWarnings(log)  # run results on a full disk

    async def execute(
        self,
        session: Session,
        run_id: str,
        mode: str,
        code: str,
        options: dict[str, Any],
        flush: float,
        kernel_ref: str | None = None,
        after: int | None = None,
    ) -> dict[str, Any]:
        """Run code in the session's kernel `kernel_ref` (main1 when None; see SessionReads.kernel_for).
        `after` (continue): the last answer the caller saw (its `seq`): answers after it the agent kept come
        again first. The result has the answer's `seq` (the execute stream sends it; the polling API does not)."""
        require_running(session, "running code")
        kernel = await self.reads.kernel_for(session, kernel_ref)
        sid = session.id
        self.activity.touch(sid)
        if mode in ("query", "batch"):
            self.activity.run_began(sid, run_id)  # code is running: the session is not idle until it finishes
            after = await newest_seq(self.store, kernel.id)  # its output comes after what is stored now
            self.runs.start(sid, kernel.id, run_id, after, self.clock.now().isoformat())
        try:
            run = Execute(kernel.id, run_id, mode, code, options, flush, after=after if mode == "continue" else None)
            result = await _ask(self.link, session, kernel, "running code needs a running kernel", run, flush + 60)
        except DomainError:
            self.activity.run_ended(sid, run_id)
            self.runs.end(sid, run_id, None, self.clock.now().isoformat())
            raise
        self.activity.touch(sid)
        if mode == "continue" and result.status != "finished":
            self.activity.run_began(sid, run_id)  # (one re-attached after a restart is busy as well)
        if result.status == "finished":
            self.activity.run_ended(sid, run_id)
            exit_code = result.exit_code
            self.runs.end(sid, run_id, exit_code if isinstance(exit_code, int) else None, self.clock.now().isoformat())
            if isinstance(exit_code, int) and not result.cancelled:
                # the last run's outcome is the session's (kept when it is destroyed), as for a batch session
                # (on a full disk the run's output still reaches its client: only the record is dropped)
                outcome = "SUCCESS" if exit_code == 0 else "FAILURE"
                recorded = self.store.record_run(sid, kernel.id, exit_code, outcome)
                if await self.full_disk.attempt("run results", recorded):
                    self.changes.publish("run_finished", {"ids": [sid]})
        api: dict[str, Any] = result.to_api()
        api["seq"] = result.seq
        return api

    async def interrupt(self, session: Session, run_id: str | None = None) -> bool:
        """Interrupt a run: `run_id`'s (a waiting one leaves the queue), else the one running now (Backend.AI's
        interrupt names no run). False when there was no such run. A named run is interrupted in the kernel it runs
        in (a session of several kernels); one without a name in the main kernel."""
        kernel = await self.reads.main_kernel(session)
        where = self.runs.kernel_of(session.id, run_id) if run_id else None
        if where is not None and where != kernel.id:
            kernel = await self.reads.kernel_for(session, where)
        if not kernel.agent_id or S(session.status) not in SERVING:
            return False
        try:
            found = await call(self.link, kernel.agent_id, Interrupt(kernel.id, run_id), timeout=10)
        except (RemoteError, AgentUnavailable, TimeoutError):
            return False
        return bool(found)

    async def open_terminal(
        self, session: Session, command: list[str] | None, rows: int, cols: int, kernel_ref: str | None = None
    ) -> LinkStream:
        """A terminal in the session's kernel `kernel_ref` (main1 when None): a link stream to its agent
        (frames: agent/terminal.py)."""
        require_running(session, "a terminal")
        kernel = await self.reads.kernel_for(session, kernel_ref)
        if not kernel.agent_id:
            raise NotRunning(session, "a terminal needs a running kernel")
        opening = OpenTerminal(kernel.id, command, rows, cols)
        try:
            stream = await self.link.open_stream(kernel.agent_id, opening.kind, opening.to_wire())
        except AgentUnavailable as e:
            raise KernelUnreachable(kernel.agent_id, str(e)) from None
        self.activity.touch(session.id)
        return stream

    async def upload(self, session: Session, files: list[tuple[str, bytes]]) -> None:
        require_running(session, "uploading files")
        kernel = await self.reads.main_kernel(session)
        upload = UploadFiles(kernel.id, list(files))
        await _ask(self.link, session, kernel, "uploading files needs a running kernel", upload, 120)

    async def list_files(self, session: Session, path: str) -> dict[str, Any]:
        require_running(session, "listing files")
        kernel = await self.reads.main_kernel(session)
        listing = await _ask(
            self.link, session, kernel, "listing files needs a running kernel", ListFiles(kernel.id, path), 60
        )
        return listing.to_wire()  # as the API answers it: {files, errors, abspath}

    async def download(self, session: Session, paths: list[str]) -> list[bytes]:
        """Files of the session's main kernel: one tar archive per path (see agent/download.py)."""
        require_running(session, "downloading files")
        kernel = await self.reads.main_kernel(session)
        archives: list[bytes] = await _ask(
            self.link,
            session,
            kernel,
            "downloading files needs a running kernel",
            DownloadFiles(kernel.id, paths),
            300,
        )
        return archives

    async def commit(self, session: Session, image: str | None = None) -> dict[str, Any]:
        """Save the session's main kernel as an image on its agent (Docker agents only); the image, which
        new sessions can use at once and `bai image ls` lists."""
        require_running(session, "a commit")
        kernel = await self.reads.main_kernel(session)
        if image is None:
            repo = "".join(c if c.isalnum() or c in "._-" else "-" for c in session.name.lower()).strip("._-")
            image = f"bai-commit/{repo or 'session'}:{self.clock.now():%Y%m%d-%H%M%S}"
        # (a RemoteError: e.g. a local or simulated agent, whose kernels are not containers)
        made = await _ask(
            self.link, session, kernel, "a commit needs a running kernel", CommitKernel(kernel.id, image), 600
        )
        self.learn_labels(made.name, made.labels or {})
        return {**made.to_api(), "agent": kernel.agent_id, "sessionId": session.id}

    async def restart(self, session: Session) -> Session:
        """Restart the session's kernel (Backend.AI's PATCH /session/{ref}): its code starts afresh (a new
        Python namespace), the session, its container, home and apps' ports stay; runs going on end.
        RUNNING → RESTARTING → RUNNING."""
        if S(session.status) != S.RUNNING:  # (not RUNNING_DEGRADED either: its kernels are not all there)
            raise NotRunning(session, "a restart needs a RUNNING session")
        if session.type == "batch":
            raise Invalid("a batch session runs its command once: it cannot be restarted")
        kernels = await self.store.kernels_of(session.id)
        sid = session.id
        transition = self.lifecycle.transition
        row = await transition(sid, S.RESTARTING, "restarting", {}, allowed_from=[S.RUNNING])
        if row is None:
            current = await self.store.get_session(sid)
            if current is None:
                raise SessionNotFound(sid)
            raise NotRunning(current, "it cannot be restarted now")
        self.activity.runs_over(sid)
        # every kernel of the session restarts (at once)
        answers = await asyncio.gather(
            *(call(self.link, k.agent_id or "", RestartKernel(k.id), timeout=90) for k in kernels),
            return_exceptions=True,
        )
        for kernel, answer in zip(kernels, answers, strict=True):
            if isinstance(answer, RemoteError | AgentUnavailable | TimeoutError):
                why = answer.message if isinstance(answer, RemoteError) else str(answer) or "no answer in time"
                if len(kernels) > 1:
                    why = f"kernel {kernel_name_of(kernel)}: {why}"
                await transition(sid, S.RUNNING, "", {"msg": f"the restart failed: {why}"}, allowed_from=[S.RESTARTING])
                if isinstance(answer, RemoteError):
                    raise Failed("Restart failed.", f"the kernel could not be restarted: {why}") from None
                raise KernelUnreachable(kernel.agent_id, f"the kernel could not be restarted: {why}") from None
            if isinstance(answer, BaseException):
                raise answer
        back = await transition(sid, S.RUNNING, "restarted", {}, allowed_from=[S.RESTARTING])
        if not all(answers):  # one ended meanwhile: the agent reports that (the session then ends)
            raise Failed("Restart failed.", "the kernel's agent no longer has it")
        return back or (await self.store.get_session(sid)) or session

    async def rename(self, session: Session, name: str) -> Session:
        """Give a live session another name (its id stays; its kernel keeps running)."""
        if not isinstance(name, str):
            raise Invalid("the new name must be a string")
        if why := name_problem(name):
            raise Invalid(why)
        if S(session.status) not in ACTIVE_STATUSES:
            raise Invalid(f"session {session.name} has ended: only a live session can be renamed")
        if name != session.name and not await self.store.rename_session(session.id, session.access_key, name):
            raise Conflict(f"there is already a live session named {name!r}")
        row = await self.store.get_session(session.id)
        assert row is not None
        self.changes.publish("session_renamed", {"ids": [row.id], "name": name})
        return row
