"""What agents say over the link, handed to the services it concerns: registration (agents record it,
sessions reconcile their kernels with it), departures (a lost agent's sessions wait out a grace period),
heartbeats, kernel output, pulls and exits, and multi-node kernels' connections to each other (PeerDial,
relayed by manager/peers.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from bai.common.background import Background
from bai.common.clock import Clock
from bai.common.logs import LogThrottle
from bai.node.link.messages import (
    Heartbeat,
    JoinAnswer,
    KernelInfo,
    KernelLogs,
    KernelPulling,
    KernelStats,
    KernelTerminated,
    MessageError,
    PeerDial,
    Registration,
    decode_event,
)
from bai.node.manager.services.agent_registry import Agents
from bai.node.manager.services.lifecycle import SessionLifecycle
from bai.node.manager.services.peers import PeerRelay
from bai.node.manager.services.stats_book import StatsBook
from bai.node.manager.services.vfolder_service import VFolders
from bai.node.manager.services.wakeup import Wakeup

log = logging.getLogger("bai.manager")
STARTING = ("SCHEDULED", "PREPARING", "PULLING")  # a session's statuses on its way to running
ADOPT_GRACE = 5.0  # seconds past a start's timeout that a new leader waits for kernels the last one was starting
ADOPT_POLL = 0.5


class AgentEvents:
    """The manager's end of the link (`ManagerHandler`): routes each agent message to its service."""

    def __init__(
        self,
        agents: Agents,
        sessions: SessionLifecycle,
        vfolders: VFolders | None,
        wake: Wakeup,
        background: Background,
        lost_grace: float = 30.0,
        stats: StatsBook | None = None,
        peers: PeerRelay | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.agents = agents
        self.clock = clock or Clock()  # the grace period runs out when it says so
        self.stats = stats or StatsBook()
        self.sessions = sessions
        self.vfolders = vfolders
        self.wake = wake
        self.background = background
        self.lost_grace = lost_grace
        self.peers = peers  # None: kernels' PeerDial events are refused (by the agent's timeout)
        self._lost: dict[str, asyncio.Task[Any]] = {}  # agent id -> the grace period running out
        self._unreadable = LogThrottle(log)  # events bai cannot decode: an agent may send them at any rate
        # whether this manager leads the managers of its database (services/leadership.py): only the leader
        # changes the state for what agents say (reconciles, stores output, ends sessions); the others keep
        # their view of the agents (registrations, heartbeats, statistics) to serve calls and reads
        self.leading: Callable[[], bool] = lambda: True
        self._registrations: dict[str, Registration] = {}  # the last of each agent (reconciled on taking the lead)
        self._beats: dict[str, list[str]] = {}  # the kernels each agent's last heartbeat named

    async def agent_joined(self, agent_id: str, registration: dict[str, Any]) -> dict[str, Any]:
        """Record the agent and reconcile its kernels with ours."""
        lost = self._lost.pop(agent_id, None)
        if lost is not None:  # back within the grace period: its sessions carry on
            lost.cancel()
        joined = Registration.from_wire({**registration, "id": agent_id})
        self._registrations[agent_id] = joined
        await self.agents.joined(agent_id, joined, self.vfolders.hosts if self.vfolders is not None else {})
        if not self.leading():
            return JoinAnswer([]).to_wire()  # (the leader reconciles the agent's kernels)
        destroy = await self.sessions.reconcile(agent_id, joined.kernels)
        self.wake()
        return JoinAnswer(destroy).to_wire()

    async def take_over(self) -> None:
        """This manager took the lead: reconcile every agent it knows (what the last leader may not have done),
        as each did when it registered.

        The last leader may have died starting sessions: one still SCHEDULED was never sent to its agent (its
        start moves it to PREPARING first), so it is started here; one PREPARING or PULLING may be coming up on
        its agent, whose answer went to the dead leader. An agent with such kernels is reconciled once each
        shows in its heartbeats (or once a start would have timed out), not before: reconciling now would
        cancel every session whose kernel is still being made."""
        for agent_id, joined in list(self._registrations.items()):
            try:
                inherited = await self._inherited_starts(agent_id)
                if inherited:
                    self.background.spawn(self._adopt_then_reconcile(agent_id, inherited), f"take-over-{agent_id}")
                    continue
                await self._reconcile_now(agent_id, joined)
            except Exception as e:  # noqa: BLE001 (the others go on)
                log.warning("reconciling agent %s on taking the lead: %s", agent_id, e)
        self.wake()

    async def _reconcile_now(self, agent_id: str, joined: Registration) -> None:
        kernels = await self._kernels_now(agent_id, joined)
        destroy = await self.sessions.reconcile(agent_id, kernels, leave_starts=True)  # (its starts since are its own)
        for kernel_id in destroy:
            log.info("agent %s runs kernel %s of no live session (seen on taking the lead)", agent_id, kernel_id)

    async def _inherited_starts(self, agent_id: str) -> list[Any]:
        """The kernels on `agent_id` of sessions starting with no start of theirs under way here."""
        starting = await self.sessions.store.kernels_where(STARTING, agent_id)
        return [k for k in starting if not self.sessions.is_starting(k.session_id)]

    async def _adopt_then_reconcile(self, agent_id: str, inherited: list[Any]) -> None:
        """Start the inherited sessions still SCHEDULED; once no kernel of the agent is starting without its
        heartbeat naming it (or after a start's time), reconcile the agent."""
        started: set[str] = set()
        for kernel in inherited:
            if kernel.status != "SCHEDULED" or kernel.session_id in started:
                continue
            started.add(kernel.session_id)
            row = await self.sessions.store.get_session(kernel.session_id)
            if row is None:
                continue
            placed = {k.id: k.agent_id or "" for k in await self.sessions.store.kernels_of(row.id)}
            log.info("session %s was scheduled by the last leader and never started: starting it", row.id)
            self.background.spawn(self.sessions._start_session(row, placed), f"start-{row.id}")
        deadline = asyncio.get_running_loop().time() + self.sessions.start_timeout + ADOPT_GRACE
        while asyncio.get_running_loop().time() < deadline and self.leading():
            beat = set(self._beats.get(agent_id) or ())
            waiting = [k for k in await self.sessions.store.kernels_where(STARTING, agent_id) if k.id not in beat]
            if not waiting:
                break
            await asyncio.sleep(ADOPT_POLL)
        joined = self._registrations.get(agent_id)
        if joined is None or not self.leading():
            return  # (it left meanwhile: its registration reconciles it; or this one follows now)
        try:
            await self._reconcile_now(agent_id, joined)
        except Exception as e:  # noqa: BLE001 (said; the agent's next registration reconciles it)
            log.warning("reconciling agent %s on taking the lead: %s", agent_id, e)
        self.wake()

    async def _kernels_now(self, agent_id: str, joined: Registration) -> list[KernelInfo]:
        """The kernels an agent has now: those its last heartbeat named (its registration may be older than
        the kernels started since), each with its container as registered or as stored."""
        beat = self._beats.get(agent_id)
        if beat is None:
            return list(joined.kernels)
        known = {k.kernel_id: k for k in joined.kernels}
        out: list[KernelInfo] = []
        for kernel_id in beat:
            info = known.get(kernel_id)
            if info is None:
                stored = await self.sessions.store.get_kernel(kernel_id)
                info = KernelInfo(
                    kernel_id=kernel_id,
                    session_id=stored.session_id if stored is not None else "",
                    container_id=stored.container_id if stored is not None else None,
                )
            out.append(info)
        return out

    async def agent_left(self, agent_id: str, reason: str) -> None:
        self._registrations.pop(agent_id, None)
        self._beats.pop(agent_id, None)
        if not self.leading():
            self.stats.agent_left(agent_id)
            return  # (the leader marks it and runs its grace period)
        await self.agents.left(agent_id, reason)
        self.stats.agent_left(agent_id)  # its host's figures are no longer news
        if reason == "lost":
            log.warning("agent %s is LOST (no heartbeat); its sessions wait %g s for it", agent_id, self.lost_grace)
            ends = self.clock.now() + timedelta(seconds=self.lost_grace)
            self._lost[agent_id] = self.background.spawn(self._gone(agent_id, ends), f"lost-{agent_id}")

    def grace_of(self, agent_id: str) -> asyncio.Task[Any] | None:
        """The grace period of a lost agent, while it runs out (None when the agent is not lost)."""
        task = self._lost.get(agent_id)
        return task if task is not None and not task.done() else None

    async def _gone(self, agent_id: str, ends: datetime) -> None:
        """Once the grace period of a lost agent has run out (at `ends`, by the clock): its sessions end in ERROR
        (`agent-lost`)."""
        await self.clock.sleep_until(ends)
        self._lost.pop(agent_id, None)
        await self.sessions.agent_lost(agent_id, self.lost_grace)

    async def agent_event(self, agent_id: str, name: str, payload: dict[str, Any]) -> None:
        try:
            event = decode_event(name, payload)
        except MessageError as e:
            self._unreadable(logging.WARNING, "agent %s sent an event bai cannot read (%s): skipped", agent_id, e)
            return
        match event:
            case Heartbeat():
                await self.agents.heartbeat(agent_id, event)
                if isinstance(event.kernels, list):
                    self._beats[agent_id] = [k for k in event.kernels if isinstance(k, str)]
                if not self.leading():
                    return
                # kernels it still runs of sessions that have ended (a removal that failed): removed
                await self.sessions.remove_strays(agent_id, event.kernels if isinstance(event.kernels, list) else [])
            case KernelStats():
                await self.sessions.kernel_stats(agent_id, event)
            case _ if not self.leading():
                return  # (the leader stores it, and acts on it)
            case KernelLogs():
                await self.sessions.kernel_logs(event.chunks)
            case KernelPulling():
                await self.sessions.kernel_pulling(event)
            case KernelTerminated():
                await self.sessions.kernel_terminated(event)
            case PeerDial():
                if self.peers is not None:
                    self.peers.dial(agent_id, event)  # in the background: the events after it go on
                else:
                    log.warning("agent %s asked to relay a kernel connection, and no relay is wired", agent_id)
