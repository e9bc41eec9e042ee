"""Kernels of a multi-node cluster session reaching each other, manager side.

A multi-node session's kernels run on different agents; on each agent, the session's kernels there share an
internal Docker network of the session, and every kernel of the session on ANOTHER agent is stood in for on
it by a peer proxy under that kernel's name (bai/common/cluster.py), which listens on the cluster's ports
(CLUSTER_PORTS). A connection to it goes through the agents' existing link to the manager, so no host opens
a port and the kernels get no route outside:

    app in sub1 → main1:12345 (the peer proxy "main1" on sub1's agent) → sub1's agent (a `dial` connection
    on a local kernel's socket) → PeerDial event → here → `peer-tunnel` stream to main1's agent → main1's
    runner → 127.0.0.1:12345 in main1

The dialling agent waits (10 s) for the `peer-dialed` stream this opens back to it (with the event's dial
id), and relays the kernel's connection over it; here the frames ({"t": "data", "d": bytes}, {"t": "eof"})
are piped between the two streams until both are done. Two kernels of a session on the same agent are
joined by that agent directly (bai/node/agent/apps.py), without the manager.

Before anything is opened the dial is checked: the dialling kernel exists and is on the agent that asks,
its session is running (RUNNING or RUNNING_DEGRADED), the session has a kernel of that name on a known
agent, and the port is one of CLUSTER_PORTS. A refused or failed dial gets its `peer-dialed` stream with
the reason (`error`), closed at once; the agent closes the kernel's connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from bai.common.background import Background
from bai.common.cluster import CLUSTER_PORTS, kernel_name_of
from bai.common.status import SessionStatus as S
from bai.node.link.base import ManagerLink
from bai.node.link.messages import OpenPeerTunnel, PeerDial, PeerDialed
from bai.node.link.streams import LinkStream, StreamClosed
from bai.node.manager.state import SessionReadState
from bai.node.manager.state.records import Session

log = logging.getLogger("bai.manager.peers")
MAX_PER_SESSION = 256  # connections relayed at once between one session's kernels
RUNNING = (S.RUNNING, S.RUNNING_DEGRADED)


class Refused(Exception):
    """A dial that may not (or cannot) be relayed; the message says why."""


class PeerRelay:
    """Relays multi-node sessions' kernel-to-kernel connections between their agents (see above)."""

    def __init__(
        self, link: ManagerLink, store: SessionReadState, background: Background, max_per_session: int = MAX_PER_SESSION
    ) -> None:
        self.link = link
        self.store = store
        self.background = background
        self.max_per_session = max_per_session
        self.active: dict[str, int] = {}  # session id -> connections relayed now

    def dial(self, agent_id: str, event: PeerDial) -> None:
        """A PeerDial event from `agent_id`: relayed in the background (events are handled in order, and a
        connection lasts as long as its kernels want)."""
        self.background.spawn(self.relay(agent_id, event), f"peer-dial-{event.dial_id[:16]}")

    async def relay(self, agent_id: str, event: PeerDial) -> None:
        """Check the dial, open both streams and pipe them until both ends are done."""
        try:
            session_id, target_agent, target_kernel = await self.check(agent_id, event)
        except Refused as e:
            log.info(
                "kernel %s on agent %s may not reach %s:%s: %s", event.kernel_id, agent_id, event.host, event.port, e
            )
            await self._refuse(agent_id, event, str(e))
            return
        if self.active.get(session_id, 0) >= self.max_per_session:
            log.warning(
                "session %s has %d kernel connections relayed: one more is refused", session_id, self.max_per_session
            )
            await self._refuse(agent_id, event, f"the session has {self.max_per_session} connections relayed already")
            return
        self.active[session_id] = self.active.get(session_id, 0) + 1
        try:
            opening = OpenPeerTunnel(kernel_id=target_kernel, port=int(event.port))
            try:
                far = await self.link.open_stream(target_agent, opening.kind, opening.to_wire())
            except Exception as e:
                log.info("cannot reach kernel %s on agent %s: %s", target_kernel, target_agent, e)
                await self._refuse(agent_id, event, f"cannot reach {event.host}: {e}")
                return
            answer = PeerDialed(dial_id=event.dial_id)
            try:
                near = await self.link.open_stream(agent_id, answer.kind, answer.to_wire())
            except Exception as e:
                log.info("cannot answer dial %s of agent %s: %s", event.dial_id, agent_id, e)
                await far.close(f"the dialling agent is gone: {e}")
                return
            await asyncio.gather(_pipe(near, far), _pipe(far, near))
        finally:
            self.active[session_id] -= 1
            if not self.active[session_id]:
                del self.active[session_id]

    async def check(self, agent_id: str, event: PeerDial) -> tuple[str, str, str]:
        """(session id, the target kernel's agent, the target kernel's id) of a dial that may be relayed;
        Refused saying why not."""
        port = event.port
        if isinstance(port, bool) or not isinstance(port, int) or port not in CLUSTER_PORTS:
            raise Refused(f"port {port!r} is not one a cluster's kernels reach each other on")
        kernel = await self.store.get_kernel(event.kernel_id)
        if kernel is None:
            raise Refused(f"no kernel {event.kernel_id}")
        if kernel.agent_id != agent_id:
            raise Refused(f"kernel {event.kernel_id} is not on agent {agent_id}")
        session: Session | None = await self.store.get_session(kernel.session_id)
        if session is None:
            raise Refused(f"no session {kernel.session_id}")
        if session.status not in RUNNING:
            raise Refused(f"session {session.name or session.id} is {session.status}")
        kernels = await self.store.kernels_of(session.id) if isinstance(event.host, str) else []
        target = next((other for other in kernels if kernel_name_of(other) == event.host), None)
        if target is None or target.id == kernel.id:
            raise Refused(f"session {session.name or session.id} has no other kernel named {event.host!r}")
        if not target.agent_id:
            raise Refused(f"kernel {event.host} is not on an agent")
        if target.status not in RUNNING:
            raise Refused(f"kernel {event.host} is {target.status}")
        return session.id, target.agent_id, target.id

    async def _refuse(self, agent_id: str, event: PeerDial, reason: str) -> None:
        """Tell the dialling agent (its `peer-dialed` stream, with the reason, closed at once)."""
        answer = PeerDialed(dial_id=event.dial_id, error=reason or "refused")
        try:
            stream = await self.link.open_stream(agent_id, answer.kind, answer.to_wire())
        except Exception as e:  # it is gone: its kernel's connection ends with it (or by its own timeout)
            log.debug("cannot refuse dial %s of agent %s: %s", event.dial_id, agent_id, e)
            return
        with contextlib.suppress(Exception):
            await stream.close(answer.error)


async def _pipe(source: LinkStream, sink: LinkStream) -> None:
    """Frames from `source` to `sink` until `source` ends; then `sink` is closed (with the same reason)."""
    try:
        while (frame := await source.receive()) is not None:
            await sink.send(frame)
    except StreamClosed:
        pass  # `sink` ended: closing `source` below ends the other way too
    except Exception as e:
        log.info("a relayed kernel connection failed: %s", e)
    finally:
        reason = source.closed_reason or ""
        with contextlib.suppress(Exception):
            await sink.close(reason)
        if sink.closed_reason is not None:
            with contextlib.suppress(Exception):
                await source.close(sink.closed_reason)
