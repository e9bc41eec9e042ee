"""Streams over the manager↔agent link: a duplex channel of frames (dicts of plain values) between the
manager and one agent, for traffic that is not a call: a terminal in a kernel, a tunnel to an app.

The manager opens one (`ManagerLink.open_stream(agent_id, kind, args)`); the agent's handler serves it
(`AgentHandler.handle_stream(kind, args, stream)`) until either side closes it. Each direction has flow
control: a sender waits when the other side has `WINDOW` frames it has not taken yet, so one busy stream
cannot flood the link (or starve heartbeats and other streams of the same agent).
"""

from __future__ import annotations

import asyncio
from typing import Any

from bai.node.link.wire import carried

WINDOW = 64  # frames in flight per direction before the sender waits
MAX_FRAME = 256 * 1024  # bytes of data in one frame; senders split larger writes


class StreamClosed(Exception):
    """The stream was closed (by either side, or because the link or the agent went away)."""


class LinkStream:
    """One end of a stream: `send` frames, `receive` the other side's (None once it closed), `close`."""

    def __init__(self, stream_id: str) -> None:
        self.id = stream_id
        self.inbox: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self.closed_reason: str | None = None  # set once closed: why ("" for a normal end)

    async def send(self, frame: dict[str, Any]) -> None:
        raise NotImplementedError

    async def receive(self) -> dict[str, Any] | None:
        """The next frame from the other side; None when the stream has ended."""
        if self.closed_reason is not None and self.inbox.empty():
            return None
        frame = await self.inbox.get()
        if frame is None:
            self.inbox.put_nowait(None)  # every later receive sees the end too
        else:
            self._taken()
        return frame

    def waiting(self) -> dict[str, Any] | None:
        """The next frame when one waits already (taken, as `receive` would), else None: none waits, or the
        stream's end is next (which `receive` then answers)."""
        if self.inbox.empty():
            return None
        frame = self.inbox.get_nowait()
        if frame is None:
            self.inbox.put_nowait(None)
            return None
        self._taken()
        return frame

    def _taken(self) -> None:
        """A frame was taken from the inbox (flow control: the sender may send one more)."""

    async def close(self, reason: str = "") -> None:
        raise NotImplementedError

    def _ended(self, reason: str) -> None:
        """The stream ended (either side): wake the receiver."""
        if self.closed_reason is None:
            self.closed_reason = reason
            self.inbox.put_nowait(None)


class InprocStream(LinkStream):
    """An end of an in-process stream: frames go straight into the peer's bounded inbox."""

    def __init__(self, stream_id: str) -> None:
        super().__init__(stream_id)
        self.peer: InprocStream | None = None
        self._room = asyncio.Semaphore(WINDOW)  # free places in the peer's inbox

    @staticmethod
    def pair(stream_id: str) -> tuple[InprocStream, InprocStream]:
        a, b = InprocStream(stream_id), InprocStream(stream_id)
        a.peer, b.peer = b, a
        return a, b

    async def send(self, frame: dict[str, Any]) -> None:
        peer = self.peer
        if self.closed_reason is not None or peer is None or peer.closed_reason is not None:
            raise StreamClosed(self.closed_reason or (peer.closed_reason if peer else "") or "closed")
        frame = carried(frame)  # as over the ZeroMQ link (a frame that cannot travel fails here)
        await self._room.acquire()
        if peer.closed_reason is not None:
            raise StreamClosed(peer.closed_reason or "closed")
        peer.inbox.put_nowait(frame)

    def _taken(self) -> None:
        if self.peer is not None:
            self.peer._room.release()

    async def close(self, reason: str = "") -> None:
        self._ended(reason)
        if self.peer is not None:
            self.peer._ended(reason)
            self._room.release()  # a sender waiting for room wakes and sees the end
            self.peer._room.release()
