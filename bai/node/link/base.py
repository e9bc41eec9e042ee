"""The manager↔agent link: one interface, several transports.

The manager calls agents (request/response) and receives their events; an agent registers,
answers calls and emits events. Neither side knows which transport it has.
"""

from __future__ import annotations

from typing import Any, Protocol


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
        """An agent (re)connected; return what the agent needs to reconcile."""
        ...

    async def agent_event(self, agent_id: str, name: str, payload: dict[str, Any]) -> None: ...

    async def agent_left(self, agent_id: str) -> None: ...


class AgentHandler(Protocol):
    """What an agent gives its link."""

    async def handle_call(self, method: str, args: dict[str, Any]) -> Any: ...


class ManagerLink(Protocol):
    async def start(self, handler: ManagerHandler) -> None: ...

    async def call(self, agent_id: str, method: str, args: dict[str, Any], timeout: float | None = None) -> Any: ...

    def connected(self) -> set[str]: ...

    async def close(self) -> None: ...


class AgentLink(Protocol):
    async def join(self, registration: dict[str, Any], handler: AgentHandler) -> dict[str, Any]: ...

    async def emit(self, name: str, payload: dict[str, Any]) -> None:
        """Send an event; events arrive in order."""
        ...

    async def report(self, name: str, payload: dict[str, Any]) -> None:
        """Send an event and wait until the manager has handled it (after the events before it)."""
        ...

    async def close(self) -> None: ...
