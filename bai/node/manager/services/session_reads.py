"""The reads of sessions that decide something, for the HTTP layer and the kernel operations: which session a
name means to a caller, which kernel a reference names, whether a session is over, its dependency graph."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from bai.common.cluster import kernel_name_of
from bai.common.problems import Problem
from bai.common.status import ACTIVE_STATUSES, DEAD_STATUSES, SessionStatus
from bai.node.manager.domain_errors import KernelNotFound, SessionNotFound
from bai.node.manager.services.hubs import SessionEvents
from bai.node.manager.state.protocols import SessionReadState
from bai.node.manager.state.records import Kernel, Session

S = SessionStatus
STARTED_OR_OVER = frozenset({S.RUNNING, S.RUNNING_DEGRADED}) | DEAD_STATUSES | {S.ERROR, S.TERMINATING, S.PREEMPTED}


class SessionReads:
    """Reads of sessions that decide something, for the HTTP layer and the kernel operations."""

    def __init__(self, state: SessionReadState, events: SessionEvents) -> None:
        self.state = state
        self.events = events  # session lifecycle events (what wait_started waits on)

    async def resolve(
        self, ref: str, access_key: str, *, active_only: bool = True, ids_of: str | None | bool = True
    ) -> Session:
        """Find a session by id or name (Backend.AI rules); dead ones too unless `active_only`.

        Names are `access_key`'s sessions; ids are `ids_of`'s (True: the same keypair; None: anyone's,
        for admins)."""
        rows = await self.state.find_sessions(ref, access_key, active_only=True, ids_of=ids_of)
        if not rows and not active_only:
            rows = (await self.state.find_sessions(ref, access_key, active_only=False, ids_of=ids_of))[:1]
        exact = [r for r in rows if r.id == ref]
        if exact:
            return exact[0]
        if len(rows) > 1:
            raise Problem(
                "too-many-sessions-matched",
                "Too many sessions matched.",
                f"{len(rows)} sessions match {ref!r}; use the session id",
                {"matches": [{"id": r.id, "name": r.name, "status": r.status} for r in rows]},
            )
        if not rows:
            raise SessionNotFound(ref)
        return rows[0]

    async def session_over(self, session_id: str) -> bool:
        """Whether a session has ended (or is gone): its kernels print nothing more."""
        current = await self.state.get_session(session_id)
        return current is None or S(current.status) not in ACTIVE_STATUSES

    async def kernel_for(self, session: Session, ref: str | None) -> Kernel:
        """The session's kernel named `ref` (`main1`, `sub2`; or a kernel id, or a unique prefix of one of
        at least 4 characters); the main kernel when `ref` is None or empty. KernelNotFound (listing the
        session's kernels) when there is no such kernel."""
        if not ref:
            return await self.main_kernel(session)
        kernels = await self.state.kernels_of(session.id)
        names = [kernel_name_of(k) for k in kernels]
        named = [k for k, name in zip(kernels, names, strict=True) if ref in (name, k.id)]
        if not named and len(ref) >= 4:
            named = [k for k in kernels if k.id.startswith(ref)]
        if len(named) == 1:
            return named[0]
        raise KernelNotFound(session.name, ref, names)

    async def main_kernel(self, session: Session) -> Kernel:
        kernels = await self.state.kernels_of(session.id)
        for k in kernels:
            if k.cluster_role == "main":
                return k
        raise SessionNotFound(session.id)

    async def kernel_by_task(self, task_id: str, access_key: str | None) -> tuple[Session, Kernel]:
        """A batch task's session and main kernel by the task's id (Backend.AI's taskId: a kernel id; the
        session id works too), if `access_key`'s (None: anyone's)."""
        kernel = await self.state.get_kernel(task_id)
        session_id = kernel.session_id if kernel is not None else task_id
        session = await self.state.get_session(session_id)
        if session is None or (access_key is not None and session.access_key != access_key):
            raise SessionNotFound(task_id)
        return session, kernel or await self.main_kernel(session)

    async def wait_started(self, session_id: str, timeout: float | None) -> Session | None:
        """The session once it has started (or ended, or is ending); None if it has not within `timeout`."""
        found: Session | None = await self.events.wait_for(
            session_id,
            lambda: self.state.get_session(session_id),
            lambda row: S(row.status) in STARTED_OR_OVER,
            timeout,
        )
        return found

    async def status_history(self, session: Session) -> dict[str, str]:
        """When the session last entered each status: {STATUS: ISO time} (Backend.AI's status_history)."""
        return {t.status: t.at for t in await self.state.transitions_of(session.id)}

    async def dependency_graph(self, session: Session, depth: int = 0) -> dict[str, Any]:
        """The session and, recursively, the sessions it depends on (Backend.AI's dependency-graph answer:
        session_id, session_name, status as `KernelStatus.X`, status_changed as Python prints a datetime,
        depends_on)."""
        changed = datetime.fromisoformat(session.status_changed)
        node: dict[str, Any] = {
            "session_id": session.id,
            "session_name": session.name,
            "status": f"KernelStatus.{session.status}",
            "status_changed": f"{changed:%Y-%m-%d %H:%M:%S.%f}{changed:%z}".replace("+0000", "+00:00"),
            "depends_on": [],
        }
        ids = list(session.config.get("depends_on") or [])
        if ids and depth < 32:  # dependencies are made on existing sessions, so no cycle; bounded anyway
            for dep in await self.state.sessions_by_ids(ids):
                node["depends_on"].append(await self.dependency_graph(dep, depth + 1))
        return node
