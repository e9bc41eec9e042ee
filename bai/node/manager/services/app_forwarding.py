"""Apps of sessions (Jupyter, a web server, ...), manager side: which a session offers, starting one on
first use, and opening a tunnel to it over the agent's link (agents open no inbound port for it).

A session's apps are its main kernel's, as the agent reported them when the kernel started (the image's
`ai.backend.service-ports` label). Only the session's owner and admins reach them: handlers resolve the
session as the caller may see it before calling here.
"""

from __future__ import annotations

import logging
from typing import Any

from bai.common import service_ports as apps
from bai.common.service_ports import ServicePort
from bai.common.status import SessionStatus as S
from bai.node.link.base import AgentUnavailable, ManagerLink, RemoteError
from bai.node.link.messages import OpenTunnel, StartApp, call
from bai.node.link.streams import LinkStream
from bai.node.manager.domain_errors import AppFailed, AppNotFound, Invalid, KernelUnreachable
from bai.node.manager.services.activity import Activity
from bai.node.manager.services.session_reads import SessionReads
from bai.node.manager.state.records import Kernel, Session

log = logging.getLogger("bai.manager.apps")
START_TIMEOUT = 180.0  # seconds the manager waits for an agent to start an app (the agent bounds it first)


class Apps:
    """Apps of sessions: list, start, tunnel."""

    def __init__(self, link: ManagerLink, reads: SessionReads, activity: Activity) -> None:
        self.link = link
        self.reads = reads  # the sessions' main kernels
        self.activity = activity  # an app in use: its session is not idle
        # (kernel id, app) started (or found running) before: later connections skip asking the agent
        # first (an app that went away since is started again by the agent when its tunnel cannot connect)
        self.started: set[tuple[str, str]] = set()
        # (kernel id, app) -> the app's secret, as its kernel's runner answered it when asked to start it
        # (apps with a {token} in their command: Jupyter). Shown only to the session's owner and admins
        # (the handlers resolve the session as the caller may see it); never logged.
        self.tokens: dict[tuple[str, str], str] = {}

    async def offered(self, session: Session) -> list[ServicePort]:
        """The apps the session's main kernel offers (none before it started)."""
        kernel = await self.reads.main_kernel(session)
        return apps.loads(kernel.service_ports or [])

    async def find(self, session: Session, name: str) -> tuple[Kernel, ServicePort]:
        """The running session's main kernel and its app `name`, or a 4xx saying what is wrong."""
        if S(session.status) not in (S.RUNNING, S.RUNNING_DEGRADED):
            raise Invalid(f"session {session.name} is {session.status}: its apps need a running kernel")
        kernel = await self.reads.main_kernel(session)
        offered = apps.loads(kernel.service_ports or [])
        for sp in offered:
            if sp.name == name:
                return kernel, sp
        raise AppNotFound(session.name, name, [sp.name for sp in offered])

    async def start(self, session: Session, name: str) -> tuple[Kernel, ServicePort, bool]:
        """Start the app unless it runs (409 with its output when it fails). Returns the kernel, the app and
        whether it was started now."""
        kernel, sp = await self.find(session, name)
        try:
            reply = await call(self.link, kernel.agent_id or "", StartApp(kernel.id, name), timeout=START_TIMEOUT)
        except AgentUnavailable as e:
            raise KernelUnreachable(kernel.agent_id, str(e)) from None
        except (RemoteError, TimeoutError) as e:
            raise AppFailed(name, str(e) or "the agent did not answer in time", "") from None
        if not reply.ok:
            self.started.discard((kernel.id, name))
            raise AppFailed(name, reply.error or "unknown error", reply.output)
        if len(self.started) > 10_000:  # kernels come and go: forget old ones wholesale, rarely
            self.started.clear()
            self.tokens.clear()
        self.started.add((kernel.id, name))
        if apps.TOKEN.fullmatch(reply.token):
            self.tokens[(kernel.id, name)] = reply.token
        else:
            self.tokens.pop((kernel.id, name), None)
        self.activity.touch(session.id)
        return kernel, sp, reply.started

    def token(self, kernel: Kernel, name: str) -> str:
        """The secret of app `name` in the kernel ("" when it has none, or was not started since the manager
        started: the next start asks the kernel again, which answers the same one)."""
        return self.tokens.get((kernel.id, name), "")

    async def listed(self, session: Session) -> list[dict[str, Any]]:
        """The session's apps as `/stream/session/{ref}/apps` answers them: with the secrets known of those
        started (their url_template then opens them; the caller is the session's owner or an admin)."""
        kernel = await self.reads.main_kernel(session)
        return [
            {**apps.to_api(sp, self.token(kernel, sp.name)), "host_ports": list(sp.host_ports)}
            for sp in apps.loads(kernel.service_ports or [])
        ]

    async def ensure_started(self, session: Session, name: str) -> Kernel:
        """The kernel to tunnel to: the app is started first unless it was before (a 4xx when it fails)."""
        kernel, _ = await self.find(session, name)
        if (kernel.id, name) not in self.started:
            kernel, _, _ = await self.start(session, name)
        return kernel

    async def open_tunnel(self, session: Session, kernel: Kernel, name: str) -> LinkStream:
        """A tunnel (one TCP connection) to the app: a link stream to the kernel's agent (frames:
        bai/node/agent/apps.py)."""
        opening = OpenTunnel(kernel.id, name)
        try:
            stream = await self.link.open_stream(kernel.agent_id or "", opening.kind, opening.to_wire())
        except AgentUnavailable as e:
            raise KernelUnreachable(kernel.agent_id, str(e)) from None
        self.activity.touch(session.id)
        return stream
