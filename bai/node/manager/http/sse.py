"""Server-Sent Events: the one writer behind `GET /events/session` and the dashboard's `GET /bai/events`.

    stream = await EventStream.open(request)
    await stream.serve(producer(stream))   # with keep-alives, until it ends or the client goes away
    return stream.response

An event is `event: NAME` and one `data:` line of JSON, then a blank line; a comment line
(`: keep-alive`) goes out after `keepalive` seconds without a write, so that idle connections (and the
proxies in between) stay open and a client that went away is noticed. Writes from several tasks go out
whole and in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable
from typing import Any

from aiohttp import web

from bai.node.manager.services.hubs import Lagged

KEEPALIVE = 15.0  # seconds without a write before a keep-alive comment
GONE_CHECK = 1.0  # seconds between looks at whether the client's connection closed (its stream's place frees)
HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
COMPACT = (",", ":")
SPACED = (", ", ": ")  # json.dumps's own separators


class EventStream:
    """One client's event stream. `separators`: how the JSON of `data` is written (compact by default)."""

    def __init__(
        self,
        response: web.StreamResponse,
        *,
        separators: tuple[str, str] = COMPACT,
        keepalive: float = KEEPALIVE,
        transport: asyncio.BaseTransport | None = None,
    ) -> None:
        self.response = response
        self.transport = transport
        self.separators = separators
        self.keepalive = keepalive
        self._lock = asyncio.Lock()
        self._last_write = asyncio.get_running_loop().time()

    @classmethod
    async def open(
        cls, request: web.Request, *, separators: tuple[str, str] = COMPACT, keepalive: float = KEEPALIVE
    ) -> EventStream:
        """Send the response's head (status 200, `text/event-stream`, not to be cached)."""
        response = web.StreamResponse(headers=HEADERS)
        await response.prepare(request)
        return cls(response, separators=separators, keepalive=keepalive, transport=request.transport)

    async def send(self, event: str, data: Any) -> None:
        """One event; a ConnectionError when the client went away."""
        await self._write(f"event: {event}\ndata: {json.dumps(data, separators=self.separators)}\n\n".encode())

    async def comment(self, text: str = "keep-alive") -> None:
        await self._write(f": {text}\n\n".encode())

    async def _write(self, payload: bytes) -> None:
        async with self._lock:
            await self.response.write(payload)
            self._last_write = asyncio.get_running_loop().time()

    async def keep_alive(self) -> None:
        """Forever: a comment whenever nothing was written for `keepalive` seconds."""
        loop = asyncio.get_running_loop()
        while True:
            idle = loop.time() - self._last_write
            if idle >= self.keepalive:
                await self.comment()
                idle = 0.0
            await asyncio.sleep(self.keepalive - idle)

    async def gone(self) -> None:
        """Raises ConnectionError once the client's connection closed: a quiet stream whose client left
        ends within GONE_CHECK seconds (not at its next write), and so gives its keypair's place back."""
        transport = self.transport
        if transport is None:  # not known (a stream not opened from a request): nothing to watch
            await asyncio.get_running_loop().create_future()  # never done: waits until cancelled
        else:
            while not transport.is_closing():  # noqa: ASYNC110 (aiohttp offers no event for a closed peer)
                await asyncio.sleep(GONE_CHECK)
        raise ConnectionError("the client went away")

    async def serve(self, *producers: Awaitable[Any]) -> bool:
        """Run the producers, with keep-alives, until one of them ends (or fails: re-raised); False if
        the client went away meanwhile (normal: nothing more can be sent), True otherwise. A producer that
        fell behind the events (Lagged) ends the stream with a comment saying so (the client reconnects)."""
        try:
            await first_of(self.keep_alive(), self.gone(), *producers)
        except ConnectionError:
            return False
        except Lagged as e:
            with contextlib.suppress(ConnectionError):
                await self.comment(f"this stream {e}: reconnect to go on")
        return True

    async def end(self) -> None:
        """Finish the response (the client sees the stream end)."""
        await self.response.write_eof()


async def first_of(*coros: Awaitable[Any]) -> None:
    """Run until one of them ends or fails (then cancel the rest); re-raise a failure."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
