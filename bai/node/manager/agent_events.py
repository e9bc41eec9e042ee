"""What agents say over the link, handed to the services it concerns: registration (agents record it,
sessions reconcile their kernels with it), departures (a lost agent's sessions wait out a grace period),
heartbeats, kernel output, pulls and exits."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from bai.common.background import Background
from bai.node.manager.agents import Agents
from bai.node.manager.sessions import Sessions
from bai.node.manager.vfolders.service import VFolders
from bai.node.manager.wakeup import Wakeup

log = logging.getLogger("bai.manager")


class AgentEvents:
    """The manager's end of the link (`ManagerHandler`): routes each agent message to its service."""

    def __init__(
        self,
        agents: Agents,
        sessions: Sessions,
        vfolders: VFolders | None,
        wake: Wakeup,
        background: Background,
        lost_grace: float = 30.0,
    ) -> None:
        self.agents = agents
        self.sessions = sessions
        self.vfolders = vfolders
        self.wake = wake
        self.background = background
        self.lost_grace = lost_grace
        self._lost: dict[str, asyncio.Task[Any]] = {}  # agent id -> the grace period running out

    async def agent_joined(self, agent_id: str, registration: dict[str, Any]) -> dict[str, Any]:
        """Record the agent and reconcile its kernels with ours."""
        lost = self._lost.pop(agent_id, None)
        if lost is not None:  # back within the grace period: its sessions carry on
            lost.cancel()
        await self.agents.joined(agent_id, registration, self.vfolders.hosts if self.vfolders is not None else {})
        destroy = await self.sessions.reconcile(agent_id, registration.get("kernels", []))
        self.wake()
        return {"destroy": destroy}

    async def agent_left(self, agent_id: str, reason: str) -> None:
        await self.agents.left(agent_id, reason)
        if reason == "lost":
            log.warning("agent %s is LOST (no heartbeat); its sessions wait %g s for it", agent_id, self.lost_grace)
            self._lost[agent_id] = self.background.spawn(self._gone(agent_id), f"lost-{agent_id}")

    async def _gone(self, agent_id: str) -> None:
        """The grace period of a lost agent ran out: its sessions end in ERROR (`agent-lost`)."""
        await asyncio.sleep(self.lost_grace)
        self._lost.pop(agent_id, None)
        await self.sessions.agent_lost(agent_id, self.lost_grace)

    async def agent_event(self, agent_id: str, name: str, payload: dict[str, Any]) -> None:
        if name == "heartbeat":
            await self.agents.heartbeat(agent_id, payload)
        elif name == "kernel_logs":
            await self.sessions.kernel_logs(payload["chunks"])
        elif name == "kernel_pulling":
            await self.sessions.kernel_pulling(payload)
        elif name == "kernel_terminated":
            await self.sessions.kernel_terminated(payload)
        else:
            log.warning("unknown event %s from agent %s", name, agent_id)
