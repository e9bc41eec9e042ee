"""A keypair holds at most its cap of long-lived requests open (event streams, log follows, WebSockets,
app tunnels): the next one is a 429 problem that says so, another keypair is not affected, and a closed
stream frees its place at once."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import yarl
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from bai.node.manager.http.app import errors
from bai.node.manager.http.rate import MAX_STREAMS_PER_KEYPAIR, OpenStreams


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


def request_app(streams: OpenStreams, release: asyncio.Event) -> web.Application:
    async def handler(request: web.Request) -> web.StreamResponse:
        with streams.serving(request.query["ak"]):
            await release.wait()
            return web.Response(text="done")

    app = web.Application(middlewares=[errors])
    app.router.add_get("/slow", handler)
    return app


async def test_a_keypair_past_its_requests_in_flight_gets_429() -> None:
    """A client that sends its bodies a byte at a time holds a connection per request: a keypair may have
    only so many being served at once, and others are not affected."""
    streams, release = OpenStreams(requests=4), asyncio.Event()
    async with TestClient(TestServer(request_app(streams, release))) as client:
        held = [asyncio.ensure_future(client.get("/slow", params={"ak": "A"})) for _ in range(4)]
        for _ in range(100):
            if streams.in_flight("A") == 4:
                break
            await asyncio.sleep(0.01)
        refused = await client.get("/slow", params={"ak": "A"})
        assert refused.status == 429 and "4 requests being served" in (await refused.json())["msg"]
        other = asyncio.ensure_future(client.get("/slow", params={"ak": "B"}))
        for _ in range(100):
            if streams.in_flight("B") == 1:
                break
            await asyncio.sleep(0.01)
        assert streams.in_flight("B") == 1
        release.set()
        for r in [*await asyncio.gather(*held), await other]:
            assert r.status == 200
        assert streams.in_flight("A") == 0 and streams.in_flight("B") == 0


async def test_a_node_answers_429_to_a_keypairs_stream_past_its_cap(tmp_path: Path) -> None:
    """On a real node: MAX_STREAMS_PER_KEYPAIR event streams of one keypair are served, the next is a 429,
    and once one closes a new one is served."""
    from tests.nodeproc import Node
    from tests.test_attack_http import signed_headers

    node = Node(tmp_path, "sim").start()
    path = "/events/session"
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            url = yarl.URL(node.endpoint + path, encoded=True)
            held = []
            for _ in range(MAX_STREAMS_PER_KEYPAIR):
                resp = await http.get(url, headers=signed_headers(node, path))
                assert resp.status == 200
                held.append(resp)
            over = await http.get(url, headers=signed_headers(node, path))
            assert over.status == 429, over.status
            assert "streams open" in (await over.json())["msg"]
            held.pop().close()
            for _ in range(50):
                again = await http.get(url, headers=signed_headers(node, path))
                if again.status == 200:
                    break
                await asyncio.sleep(0.1)
            assert again.status == 200
            for r in [*held, again]:
                r.close()
    finally:
        node.stop()
