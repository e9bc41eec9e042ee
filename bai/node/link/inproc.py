"""The in-process link for `bai node --role all`: direct calls and an ordered event queue.

Whatever crosses it (a call's arguments and answer, an event, a registration and its answer, a stream's
arguments and frames) goes through msgpack as over the ZeroMQ link (`wire.carried`: packed where it is sent,
unpacked where it arrives), so both ends see the same plain values as over ZeroMQ, and tests over this link
catch what the ZeroMQ one would: a value msgpack cannot carry, a tuple that arrives as a list, a message that
its receiver cannot decode.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any

from bai.common.background import cancel_and_wait
from bai.node.link.base import AgentHandler, AgentUnavailable, ManagerHandler, RemoteError
from bai.node.link.streams import InprocStream, LinkStream
from bai.node.link.wire import carried, pack, unpack

log = logging.getLogger("bai.link")
LEFT = object()  # in the event queue: the agent closed its link (after the events before it)


class InprocHub:
    """Joins a manager and the agents of the same process."""

    def __init__(self, heartbeat_interval: float = 3.0) -> None:
        self.heartbeat_interval = heartbeat_interval
        self.manager = InprocManagerLink(self)

    def agent_link(self, agent_id: str) -> InprocAgentLink:
        return InprocAgentLink(self, agent_id)


class InprocManagerLink:
    """The manager's side: calls go straight to the agents' handlers, events through one ordered queue."""

    def __init__(self, hub: InprocHub) -> None:
        self.hub = hub
        self.handler: ManagerHandler | None = None
        self.agents: dict[str, AgentHandler] = {}
        # (agent id, event name or LEFT, the payload packed (the reason for LEFT), handled)
        self._events: asyncio.Queue[tuple[str, Any, Any, asyncio.Future[None] | None]] = asyncio.Queue()
        self._pump: asyncio.Task[None] | None = None
        self._streams: dict[asyncio.Task[None], tuple[str, InprocStream]] = {}  # handler -> (agent id, our end)

    async def start(self, handler: ManagerHandler) -> None:
        self.handler = handler
        self._pump = asyncio.create_task(self._deliver_events(), name="inproc-events")

    async def _deliver_events(self) -> None:
        assert self.handler is not None
        while True:
            agent_id, name, payload, handled = await self._events.get()
            try:
                if name is LEFT:
                    await self.handler.agent_left(agent_id, payload)
                else:
                    await self.handler.agent_event(agent_id, name, unpack(payload))
            except Exception:  # a bad event must not stop the pump
                log.exception("event %s from %s failed", name, agent_id)
            finally:
                if handled is not None and not handled.done():
                    handled.set_result(None)

    async def call(self, agent_id: str, method: str, args: dict[str, Any], timeout: float | None = None) -> Any:
        handler = self.agents.get(agent_id)
        if handler is None:
            raise AgentUnavailable(f"agent {agent_id} is not connected")
        args = carried(args)  # arguments that cannot travel fail here, as a ZeroMQ call's do
        try:
            return await asyncio.wait_for(self._answer(handler, method, args), timeout)
        except (RemoteError, asyncio.CancelledError, TimeoutError):
            raise
        except Exception as e:  # what a remote transport would carry back
            raise RemoteError(type(e).__name__, str(e)) from e

    @staticmethod
    async def _answer(handler: AgentHandler, method: str, args: Any) -> Any:
        """The agent's answer as the manager receives it (one that cannot travel fails on the agent's side)."""
        return carried(await handler.handle_call(method, args))

    async def open_stream(self, agent_id: str, kind: str, args: dict[str, Any]) -> LinkStream:
        handler = self.agents.get(agent_id)
        if handler is None:
            raise AgentUnavailable(f"agent {agent_id} is not connected")
        args = carried(args)
        ours, theirs = InprocStream.pair(secrets.token_hex(8))
        task = asyncio.create_task(self._serve(handler, kind, args, theirs), name=f"stream-{kind}-{ours.id}")
        self._streams[task] = (agent_id, ours)
        task.add_done_callback(lambda t: self._streams.pop(t, None))
        return ours

    async def _end_streams(self, agent_id: str | None, reason: str) -> None:
        """End the streams of an agent (None: all) as a network link would: both ends see `reason`."""
        for aid, ours in list(self._streams.values()):
            if agent_id is None or aid == agent_id:
                await ours.close(reason)

    @staticmethod
    async def _serve(handler: AgentHandler, kind: str, args: dict[str, Any], stream: InprocStream) -> None:
        try:
            await handler.handle_stream(kind, args, stream)
        except Exception as e:  # what a remote transport would carry back: the reason it ended
            log.debug("stream %s (%s) failed: %s", stream.id, kind, e)
            await stream.close(f"{type(e).__name__}: {e}")
        else:
            await stream.close("")

    def connected(self) -> set[str]:
        return set(self.agents)

    async def close(self) -> None:
        await self._end_streams(None, "the link is closed")
        for task in list(self._streams):
            task.cancel()
        if self._pump:
            # deliver what is queued, then stop
            for _ in range(1000):
                if self._events.empty():
                    break
                await asyncio.sleep(0.001)
            await cancel_and_wait(self._pump, expected=())


class InprocAgentLink:
    """An agent's side: registers with the hub's manager, heartbeats, queues its events."""

    def __init__(self, hub: InprocHub, agent_id: str) -> None:
        self.hub = hub
        self.agent_id = agent_id
        self._heartbeats: asyncio.Task[None] | None = None

    async def join(self, handler: AgentHandler) -> dict[str, Any]:
        manager = self.hub.manager
        assert manager.handler is not None, "the manager link must start before agents join"
        manager.agents[self.agent_id] = handler
        answer = await manager.handler.agent_joined(self.agent_id, carried(await handler.registration()))
        self._heartbeats = asyncio.create_task(self._beat(handler), name=f"heartbeat-{self.agent_id}")
        return carried(answer)  # type: ignore[no-any-return]

    async def _beat(self, handler: AgentHandler) -> None:
        """Heartbeats as over a network link, so `bai agent ls` shows the same heartbeat age."""
        while True:
            await asyncio.sleep(self.hub.heartbeat_interval)
            await self.emit("heartbeat", handler.heartbeat())

    async def emit(self, name: str, payload: dict[str, Any]) -> None:
        # packed now, as the ZeroMQ link does (a snapshot; a payload that cannot travel fails here)
        self.hub.manager._events.put_nowait((self.agent_id, name, pack(payload), None))

    async def report(self, name: str, payload: dict[str, Any]) -> None:
        data = pack(payload)
        handled: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.hub.manager._events.put_nowait((self.agent_id, name, data, handled))
        await handled

    async def drop(self) -> None:
        """Vanish without a goodbye (as a killed agent does): no more heartbeats, no calls reach it. The
        manager hears nothing (a network link would time it out; here the caller says `agent_left`)."""
        if self._heartbeats is not None:
            await cancel_and_wait(self._heartbeats, expected=())
        self.hub.manager.agents.pop(self.agent_id, None)
        await self.hub.manager._end_streams(self.agent_id, f"agent {self.agent_id} is lost")

    async def close(self) -> None:
        if self._heartbeats is not None:
            self._heartbeats.cancel()
        manager = self.hub.manager
        await manager._end_streams(self.agent_id, f"agent {self.agent_id} closed its link")
        if manager.agents.pop(self.agent_id, None) is not None and manager.handler is not None:
            # as over a network link: the manager hears of it after the events sent before it
            handled: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            manager._events.put_nowait((self.agent_id, LEFT, "closed", handled))
            if manager._pump is not None and not manager._pump.done():
                await handled
