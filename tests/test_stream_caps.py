"""A keypair holds at most its cap of long-lived requests open (event streams, log follows, WebSockets,
app tunnels): the next one is a 429 problem that says so, another keypair is not affected, and a closed
stream frees its place at once."""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from bai.node.manager.api import errors
from bai.node.manager.streams import OpenStreams


def stream_app(streams: OpenStreams, release: asyncio.Event) -> web.Application:
    async def handler(request: web.Request) -> web.StreamResponse:
        with streams.track(request.query["ak"]):
            response = web.StreamResponse()
            await response.prepare(request)
            await response.write(b"open\n")
            await release.wait()
            return response

    app = web.Application(middlewares=[errors])
    app.router.add_get("/stream", handler)
    return app


async def test_a_keypair_past_its_cap_gets_429_and_others_do_not() -> None:
    streams, release = OpenStreams(limit=3), asyncio.Event()
    async with TestClient(TestServer(stream_app(streams, release))) as client:
        held = [await client.get("/stream", params={"ak": "A"}) for _ in range(3)]
        for r in held:
            assert await r.content.readline() == b"open\n"
        refused = await client.get("/stream", params={"ak": "A"})
        assert refused.status == 429
        body = await refused.json()
        assert body["type"].endswith("/rate-limit-exceeded")
        assert "3 streams open" in body["msg"]
        other = await client.get("/stream", params={"ak": "B"})  # another keypair still gets one
        assert other.status == 200 and await other.content.readline() == b"open\n"
        assert streams.count("A") == 3
        held[0].close()  # the client goes away: its place is free once the handler ends
        release.set()
        for _ in range(100):
            if streams.count("A") == 0:
                break
            await asyncio.sleep(0.01)
        assert streams.count("A") == 0
        again = await client.get("/stream", params={"ak": "A"})
        assert again.status == 200
        for r in (*held[1:], other, again):
            r.close()
