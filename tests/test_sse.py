"""The one Server-Sent-Events writer (bai/node/manager/http/sse.py), against a real aiohttp server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from bai.node.manager.http.sse import COMPACT, SPACED, EventStream


async def _client(handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> TestClient:
    app = web.Application()
    app.router.add_get("/events", handler)
    client = TestClient(TestServer(app))
    await client.start_server()
    return client


def _events(text: str) -> list[tuple[str, Any]]:
    out = []
    for block in text.split("\n\n"):
        if block.startswith("event: "):
            name, data = block.split("\n")
            out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


async def test_events_go_out_with_the_headers_and_the_json_asked_for() -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        separators = SPACED if request.query.get("spaced") else COMPACT
        stream = await EventStream.open(request, separators=separators)

        async def produce() -> None:
            await stream.send("one", {"a": 1, "b": [1, 2]})
            await stream.send("two", None)

        assert await stream.serve(produce())
        await stream.end()
        return stream.response

    client = await _client(handler)
    try:
        resp = await client.get("/events")
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "text/event-stream"
        assert resp.headers["Cache-Control"] == "no-cache"
        assert await resp.text() == 'event: one\ndata: {"a":1,"b":[1,2]}\n\nevent: two\ndata: null\n\n'
        resp = await client.get("/events?spaced=1")
        assert await resp.text() == 'event: one\ndata: {"a": 1, "b": [1, 2]}\n\nevent: two\ndata: null\n\n'
    finally:
        await client.close()


async def test_an_idle_stream_gets_keep_alives_and_a_busy_one_does_not() -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        stream = await EventStream.open(request, keepalive=0.05)

        async def produce() -> None:
            if request.query.get("busy"):
                for i in range(20):
                    await stream.send("tick", i)
                    await asyncio.sleep(0.01)
            else:
                await asyncio.sleep(0.18)

        await stream.serve(produce())
        await stream.end()
        return stream.response

    client = await _client(handler)
    try:
        idle = await (await client.get("/events")).text()
        assert idle.count(": keep-alive\n\n") in (2, 3, 4) and idle.replace(": keep-alive\n\n", "") == ""
        busy = await (await client.get("/events?busy=1")).text()
        assert ": keep-alive" not in busy
        assert [d for _, d in _events(busy)] == list(range(20))
    finally:
        await client.close()


async def test_sends_from_several_tasks_go_out_whole() -> None:
    big = "x" * 200_000  # more than one write's worth: an event cut by another would not parse

    async def handler(request: web.Request) -> web.StreamResponse:
        stream = await EventStream.open(request, keepalive=0.001)

        async def writer(n: int) -> None:
            for i in range(10):
                await stream.send(f"w{n}", {"i": i, "pad": big})

        async def produce() -> None:
            await asyncio.gather(*(writer(n) for n in range(4)))

        await stream.serve(produce())
        await stream.end()
        return stream.response

    client = await _client(handler)
    try:
        text = await (await client.get("/events")).text()
        got = _events(text.replace(": keep-alive\n\n", ""))
        assert len(got) == 40
        for n in range(4):
            assert [d["i"] for name, d in got if name == f"w{n}"] == list(range(10))
    finally:
        await client.close()


async def test_a_client_that_goes_away_ends_the_stream_quietly() -> None:
    """The next write (a keep-alive here) finds the client gone: `serve` ends its producers and says so,
    without an error (or aiohttp cancels the handler first, as it may when a connection is lost)."""
    ended: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    producer_cancelled = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        stream = await EventStream.open(request, keepalive=0.02)

        async def produce() -> None:
            try:
                await asyncio.sleep(30)  # nothing to send: only the keep-alives notice the client is gone
            except asyncio.CancelledError:
                producer_cancelled.set()
                raise

        try:
            ended.set_result("served" if await stream.serve(produce()) else "client gone")
        except asyncio.CancelledError:
            ended.set_result("handler cancelled")
            raise
        return stream.response

    client = await _client(handler)
    try:
        resp = await client.get("/events")
        assert await resp.content.readuntil(b"\n\n") == b": keep-alive\n\n"
        resp.close()  # the client goes away
        assert await asyncio.wait_for(ended, 5) in ("client gone", "handler cancelled")
        await asyncio.wait_for(producer_cancelled.wait(), 5)
    finally:
        await client.close()


async def test_serve_tells_a_gone_client_from_a_failure() -> None:
    """Unit level: a ConnectionError from a write is the client gone (False); another error is raised."""

    class Gone:
        async def write(self, data: bytes) -> None:
            raise ConnectionResetError("Cannot write to closing transport")

    stream = EventStream(Gone(), keepalive=60)  # type: ignore[arg-type]

    async def send() -> None:
        await stream.send("x", 1)

    assert await stream.serve(send()) is False

    async def fail() -> None:
        raise ValueError("bug")

    with pytest.raises(ValueError):  # a producer's failure does not pass for a gone client
        await stream.serve(fail())
