"""The manager↔agent link: one interface, several transports.

The manager calls agents (request/response) and receives their events; an agent registers,
answers calls and emits events. Neither side knows which transport it has.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from bai.node.link.streams import LinkStream


class RemoteError(Exception):
    """An exception raised on the other side of the link, carried back as (type, message)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class AgentUnavailable(Exception):
    """The agent is not connected (never joined, or its link went away)."""


class ManagerHandler(Protocol):
    """What the manager gives its link."""

    async def agent_joined(self, agent_id: str, registration: dict[str, Any]) -> dict[str, Any]:
        """An agent registered (first time, or again after a restart / reconnect); return what it
        needs to reconcile: {"destroy": [kernel ids the manager does not know]}."""
        ...

    async def agent_event(self, agent_id: str, name: str, payload: dict[str, Any]) -> None:
        """An event from an agent, in the order the agent sent them. `name == "heartbeat"` carries
        the agent's occupied slots and kernel list."""
        ...

    async def agent_left(self, agent_id: str, reason: str) -> None:
        """The agent closed its link ("closed") or stopped heartbeating ("lost")."""
        ...


class AgentHandler(Protocol):
    """What an agent gives its link."""

    async def registration(self) -> dict[str, Any]:
        """What the agent registers with (asked again for every re-registration)."""
        ...

    async def rejoined(self, answer: dict[str, Any]) -> None:
        """The manager accepted a re-registration (after a restart of either side); reconcile."""
        ...

    def heartbeat(self) -> dict[str, Any]:
        """The payload of a heartbeat: occupied slots and kernel ids."""
        ...

    async def handle_call(self, method: str, args: dict[str, Any]) -> Any: ...

    async def handle_stream(self, kind: str, args: dict[str, Any], stream: LinkStream) -> None:
        """Serve a stream the manager opened (a terminal, a tunnel) until it ends; close it when done."""
        ...


class ManagerLink(Protocol):
    """The manager's side of a link: start with a handler, call agents, know who is connected."""

    async def start(self, handler: ManagerHandler) -> None: ...

    async def call(self, agent_id: str, method: str, args: dict[str, Any], timeout: float | None = None) -> Any: ...

    async def open_stream(self, agent_id: str, kind: str, args: dict[str, Any]) -> LinkStream:
        """Open a stream to an agent (AgentUnavailable when it is not connected)."""
        ...

    def connected(self) -> set[str]: ...

    async def close(self) -> None: ...


class AgentLink(Protocol):
    """An agent's side of a link: join, emit and report events, close."""

    async def join(self, handler: AgentHandler) -> dict[str, Any]:
        """Register (asking `handler.registration()`), start answering calls; return the manager's
        reconcile answer. A link that can lose its manager re-registers by itself later."""
        ...

    async def emit(self, name: str, payload: dict[str, Any]) -> None:
        """Send an event; events arrive in order."""
        ...

    async def report(self, name: str, payload: dict[str, Any]) -> None:
        """Send an event and wait until the manager has handled it (after the events before it)."""
        ...

    async def close(self) -> None: ...
