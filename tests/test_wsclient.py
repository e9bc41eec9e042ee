"""bai.client.wsclient, the standard-library WebSocket client of the execute stream: the handshake (a wrong
Sec-WebSocket-Accept refused, a refusal's body kept), masked client frames, fragmented messages, ping / pong,
close in both directions, frames the protocol forbids; against a scripted server (frames written here by
hand, not with the client's own code) and against aiohttp's server; and bai's Client on top of it (signed
upgrade request, the next manager when one does not answer, a refusal said as the manager's problem)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from bai import API_VERSION
from bai.client import wsclient
from bai.client.api import APIError, Client
from bai.client.wsclient import CloseCode, HandshakeError, HandshakeRefused, Message, Opcode, ProtocolError
from bai.common import auth
from bai.common.credentials import Credentials
from tests.nodeproc import free_port
from tests.ws_frames import accept_of, frame, parse_head, unmask

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


# -- the scripted server (frames: tests.ws_frames, written independently of the client) ----------------------


async def read_request(reader: asyncio.StreamReader) -> tuple[str, dict[str, str]]:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    headers = {}
    for line in head[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return head[0], headers


def upgrade_answer(key: str, *extra: str, accept: str | None = None) -> bytes:
    lines = [
        "HTTP/1.1 101 Switching Protocols",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Accept: {accept if accept is not None else accept_of(key)}",
        *extra,
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def read_frame(reader: asyncio.StreamReader) -> tuple[bool, int, bytes, bool]:
    """(fin, opcode, unmasked payload, whether it was masked) of the client's next frame."""
    fin, opcode, masked, n = parse_head(*await reader.readexactly(2))
    if n == 126:
        (n,) = struct.unpack("!H", await reader.readexactly(2))
    elif n == 127:
        (n,) = struct.unpack("!Q", await reader.readexactly(8))
    key = await reader.readexactly(4) if masked else b"\0\0\0\0"
    return fin, opcode, unmask(await reader.readexactly(n), key), masked


@asynccontextmanager
async def server(handler: Handler) -> AsyncIterator[int]:
    """A server on a free port whose every connection `handler` takes; its port. On leaving, the handlers are
    waited for (what they saw is complete)."""
    handling: list[asyncio.Task[Any]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handling.append(task)
        await handler(reader, writer)

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield srv.sockets[0].getsockname()[1]
    finally:
        srv.close()
        if handling:
            await asyncio.wait(handling, timeout=5)


def script(*then: bytes, seen: list[Any] | None = None, after: Handler | None = None) -> Handler:
    """A handler: the right handshake answer, the bytes `then`, then `after` (or reading the client's frames
    into `seen` until its close, answered)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _, headers = await read_request(reader)
        writer.write(upgrade_answer(headers["sec-websocket-key"]))
        for data in then:
            writer.write(data)
        await writer.drain()
        if after is not None:
            await after(reader, writer)
        else:
            await collect(reader, writer, seen if seen is not None else [])
        writer.close()

    return handle


async def collect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: list[Any]) -> None:
    """The client's frames into `seen` until its close frame, which is echoed (or the connection's end)."""
    while True:
        try:
            got = await read_frame(reader)
        except asyncio.IncompleteReadError:
            return
        seen.append(got)
        if got[1] == Opcode.CLOSE:
            writer.write(frame(Opcode.CLOSE, got[2]))
            await writer.drain()
            return


async def open_ws(port: int, max_size: int | None = None) -> wsclient.WebSocket:
    async with asyncio.timeout(10):
        return await wsclient.connect("127.0.0.1", port, "/ws?x=1", {"Host": f"127.0.0.1:{port}"}, max_size=max_size)


# -- frames -------------------------------------------------------------------------------------------------


def test_a_client_frame_is_masked_as_rfc_6455_shows() -> None:
    # RFC 6455 §5.7: a single-frame masked text message "Hello"
    assert wsclient.encode_frame(Opcode.TEXT, b"Hello", mask_key=bytes.fromhex("37fa213d")) == bytes.fromhex(
        "818537fa213d7f9f4d5158"
    )
    assert wsclient.accept_for("dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="  # §1.3
    for n in (0, 1, 125, 126, 65535, 65536):
        data = os.urandom(n)
        encoded = wsclient.encode_frame(Opcode.BINARY, data, mask_key=b"abcd")
        assert encoded == frame(Opcode.BINARY, data, mask=b"abcd"), n


async def test_the_handshake_then_text_and_binary_both_ways() -> None:
    seen: list[Any] = []
    requests: list[tuple[str, dict[str, str]]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line, headers = await read_request(reader)
        requests.append((line, headers))
        writer.write(upgrade_answer(headers["sec-websocket-key"]))
        writer.write(frame(Opcode.TEXT, "héllo".encode()) + frame(Opcode.BINARY, b"\x00\xff"))
        writer.write(frame(Opcode.TEXT, b"x" * 300) + frame(Opcode.BINARY, b"y" * 70000))
        await writer.drain()
        await collect(reader, writer, seen)
        writer.close()

    async with server(handle) as port:
        ws = await open_ws(port)
        assert [await ws.receive() for _ in range(4)] == [
            Message(Opcode.TEXT, "héllo"),
            Message(Opcode.BINARY, b"\x00\xff"),
            Message(Opcode.TEXT, "x" * 300),
            Message(Opcode.BINARY, b"y" * 70000),
        ]
        await ws.send_text("hi ✓")
        await ws.send_bytes(b"")
        await ws.send_bytes(b"z" * 70000)
        await ws.close()
        assert ws.closed and ws.close_code == CloseCode.NORMAL
    line, headers = requests[0]
    assert line == "GET /ws?x=1 HTTP/1.1"
    assert headers["host"] == f"127.0.0.1:{port}" and headers["upgrade"] == "websocket"
    assert headers["connection"] == "Upgrade" and headers["sec-websocket-version"] == "13"
    assert len(base64.b64decode(headers["sec-websocket-key"])) == 16
    assert "sec-websocket-extensions" not in headers and "sec-websocket-protocol" not in headers
    assert [(fin, op, data, masked) for fin, op, data, masked in seen] == [
        (True, Opcode.TEXT, "hi ✓".encode(), True),
        (True, Opcode.BINARY, b"", True),
        (True, Opcode.BINARY, b"z" * 70000, True),
        (True, Opcode.CLOSE, struct.pack("!H", 1000), True),
    ]


async def test_a_fragmented_message_with_a_ping_between_its_fragments() -> None:
    seen: list[Any] = []
    text = "añb€c🙂".encode()  # fragments cut through multi-byte characters
    fragments = [
        frame(Opcode.TEXT, text[:2], fin=False),
        frame(Opcode.PING, b"are you there"),
        frame(Opcode.CONTINUATION, text[2:6], fin=False),
        frame(Opcode.PONG, b"unasked"),  # dropped
        frame(Opcode.CONTINUATION, text[6:], fin=True),
        frame(Opcode.BINARY, b"ab", fin=False),
        frame(Opcode.CONTINUATION, b"", fin=False),
        frame(Opcode.CONTINUATION, b"cd", fin=True),
    ]
    async with server(script(*fragments, seen=seen)) as port:
        ws = await open_ws(port)
        assert await ws.receive() == Message(Opcode.TEXT, text.decode())
        assert await ws.receive() == Message(Opcode.BINARY, b"abcd")
        await ws.close()
    assert seen[0] == (True, Opcode.PONG, b"are you there", True)  # answered with its payload
    assert seen[1][1] == Opcode.CLOSE


async def test_the_servers_close_is_answered_and_ends_the_iteration() -> None:
    seen: list[Any] = []
    closing = frame(Opcode.CLOSE, struct.pack("!H", 4001) + "done ✓".encode())

    async def after(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await read_frame(reader))

    async with server(script(frame(Opcode.TEXT, b"1"), frame(Opcode.TEXT, b"2"), closing, after=after)) as port:
        ws = await open_ws(port)
        assert [m.data async for m in ws] == ["1", "2"]
        assert ws.closed and (ws.close_code, ws.close_reason) == (4001, "done ✓")
        assert await ws.receive() is None
        await ws.close()  # (nothing more to do)
    assert seen == [(True, Opcode.CLOSE, struct.pack("!H", 4001), True)]  # its code echoed


async def test_a_close_without_a_code_and_a_connection_that_just_ends() -> None:
    async with server(script(frame(Opcode.CLOSE), after=lambda r, w: asyncio.sleep(0))) as port:
        ws = await open_ws(port)
        assert await ws.receive() is None and ws.close_code == CloseCode.NO_STATUS
    async with server(script(frame(Opcode.TEXT, b"last"), after=lambda r, w: asyncio.sleep(0))) as port:
        ws = await open_ws(port)
        assert await ws.receive() == Message(Opcode.TEXT, "last")
        assert await ws.receive() is None and ws.close_code == CloseCode.ABNORMAL


async def test_closing_waits_for_the_servers_close_at_most_a_while() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert (await read_frame(reader))[1] == Opcode.CLOSE  # never answered
        assert await reader.read() == b""  # until the client drops the connection

    async with server(script(after=silent)) as port:
        ws = await open_ws(port)
        loop = asyncio.get_running_loop()
        began = loop.time()
        await ws.close(wait=0.3)
        assert ws.closed and loop.time() - began < 2


@pytest.mark.parametrize(
    ("sent", "code", "says"),
    [
        (frame(Opcode.TEXT, b"x", mask=b"abcd"), CloseCode.PROTOCOL_ERROR, "masked"),
        (frame(Opcode.TEXT, b"x", rsv=0x40), CloseCode.PROTOCOL_ERROR, "reserved bits"),
        (frame(Opcode.CONTINUATION, b"x"), CloseCode.PROTOCOL_ERROR, "continuation"),
        (frame(Opcode.TEXT, b"a", fin=False) + frame(Opcode.TEXT, b"b"), CloseCode.PROTOCOL_ERROR, "new message"),
        (frame(Opcode.PING, b"x" * 126), CloseCode.PROTOCOL_ERROR, "control frame"),
        (frame(Opcode.PING, b"x", fin=False), CloseCode.PROTOCOL_ERROR, "control frame"),
        (frame(0x3, b"x"), CloseCode.PROTOCOL_ERROR, "opcode 0x3"),
        (frame(0xB, b"x"), CloseCode.PROTOCOL_ERROR, "opcode 0xb"),
        (frame(Opcode.TEXT, b"\xff\xfe"), CloseCode.INVALID_DATA, "not UTF-8"),
        (frame(Opcode.CLOSE, b"\x03"), CloseCode.PROTOCOL_ERROR, "one-byte"),
        (frame(Opcode.CLOSE, struct.pack("!H", 1005)), CloseCode.PROTOCOL_ERROR, "1005"),
        (frame(Opcode.TEXT, b"x" * 101), CloseCode.TOO_BIG, "101 bytes"),
        (frame(Opcode.TEXT, b"x" * 60, fin=False) + frame(0, b"x" * 60), CloseCode.TOO_BIG, "more than 100"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
async def test_what_the_protocol_forbids_fails_the_connection_saying_why(sent: bytes, code: int, says: str) -> None:
    seen: list[Any] = []
    async with server(script(sent, seen=seen)) as port:
        ws = await open_ws(port, max_size=100)
        with pytest.raises(ProtocolError, match=says) as failed:
            await ws.receive()
        assert failed.value.code == code and ws.closed
    assert [(op, data[:2]) for _, op, data, _ in seen] == [(Opcode.CLOSE, struct.pack("!H", code))]


# -- the handshake's failures -------------------------------------------------------------------------------


def answering(answer: Callable[[str], bytes]) -> Handler:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _, headers = await read_request(reader)
        writer.write(answer(headers["sec-websocket-key"]))
        await writer.drain()
        await asyncio.sleep(0.2)
        writer.close()

    return handle


async def test_a_wrong_sec_websocket_accept_is_refused_with_a_clear_error() -> None:
    wrong = base64.b64encode(hashlib.sha1(b"something else").digest()).decode()
    async with server(answering(lambda key: upgrade_answer(key, accept=wrong))) as port:
        with pytest.raises(HandshakeError, match="Sec-WebSocket-Accept does not match the key sent"):
            await open_ws(port)
    async with server(answering(lambda key: upgrade_answer(key, accept=""))) as port:
        with pytest.raises(HandshakeError, match="Sec-WebSocket-Accept"):
            await open_ws(port)


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        (lambda key: upgrade_answer(key, "Sec-WebSocket-Extensions: permessage-deflate"), "extension"),
        (lambda key: upgrade_answer(key, "Sec-WebSocket-Protocol: chat"), "subprotocol"),
        (lambda key: upgrade_answer(key).replace(b"Upgrade: websocket", b"Upgrade: h2c"), "without upgrading"),
        (lambda key: b"SSH-2.0-OpenSSH_9.2\r\n\r\n", "did not answer with HTTP/1.1"),
    ],
)
async def test_a_101_that_is_not_a_websockets_is_refused(answer: Callable[[str], bytes], says: str) -> None:
    async with server(answering(answer)) as port:
        with pytest.raises(HandshakeError, match=says):
            await open_ws(port)


async def test_a_refusal_keeps_its_status_and_body() -> None:
    body = json.dumps({"type": "https://api.backend.ai/probs/not-found", "title": "No such session."}).encode()
    answer = b"HTTP/1.1 404 Not Found\r\nContent-Type: application/problem+json\r\nContent-Length: %d\r\n\r\n%s"
    async with server(answering(lambda key: answer % (len(body), body))) as port:
        with pytest.raises(HandshakeRefused) as refused:
            await open_ws(port)
    assert (refused.value.status, refused.value.reason, refused.value.body) == (404, "Not Found", body)
    chunked = b"HTTP/1.1 403 Forbidden\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nno wa\r\n1\r\ny\r\n0\r\n\r\n"
    async with server(answering(lambda key: chunked)) as port:
        with pytest.raises(HandshakeRefused) as refused:
            await open_ws(port)
    assert (refused.value.status, refused.value.body) == (403, b"no way")

    async def until_closed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 400 Bad Request\r\n\r\nup to ")
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.write(b"the end")
        writer.close()

    async with server(until_closed) as port:
        with pytest.raises(HandshakeRefused) as refused:
            await open_ws(port)
    assert (refused.value.status, refused.value.body) == (400, b"up to the end")


# -- against aiohttp's server (what the manager runs) -------------------------------------------------------


async def test_against_aiohttps_server() -> None:
    from aiohttp import WSMsgType, web

    closed_with: list[int | None] = []

    async def echo(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        await ws.ping(b"p")
        async for msg in ws:
            if msg.type == WSMsgType.TEXT:
                await ws.send_str(msg.data.upper())
            elif msg.type == WSMsgType.BINARY:
                await ws.send_bytes(msg.data[::-1])
        closed_with.append(ws.close_code)
        return ws

    app = web.Application()
    app.router.add_get("/ws", echo)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        ws = await open_ws(port)
        await ws.send_text("hello")
        await ws.send_bytes(b"abc" * 1_000_000)  # (more than the stream's buffer: it is read on as it drains)
        assert await ws.receive() == Message(Opcode.TEXT, "HELLO")
        assert await ws.receive() == Message(Opcode.BINARY, b"cba" * 1_000_000)
        await ws.close()
        assert ws.close_code == CloseCode.NORMAL
    finally:
        await runner.cleanup()
    assert closed_with == [CloseCode.NORMAL]


# -- bai's Client on top of it ------------------------------------------------------------------------------

CREDS = ("AKIAEXAMPLEEXAMPLE00", "secret")


async def test_the_clients_upgrade_is_signed_and_passes_over_a_manager_that_does_not_answer() -> None:
    requests: list[tuple[str, dict[str, str]]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        requests.append(await read_request(reader))
        writer.write(upgrade_answer(requests[-1][1]["sec-websocket-key"]))
        writer.write(frame(Opcode.TEXT, json.dumps({"status": "finished", "console": [], "exitCode": 3}).encode()))
        await writer.drain()
        await collect(reader, writer, [])
        writer.close()

    dead = f"http://127.0.0.1:{free_port()}"
    async with server(handle) as port:
        live = f"http://127.0.0.1:{port}/api"
        client = Client(Credentials(dead, *CREDS, endpoints=(dead, live)))
        moved: list[tuple[str, str]] = []
        client.on_move = lambda old, new: moved.append((old, new))
        async with client.execute("s1") as stream:
            await stream.start("query", "raise SystemExit(3)", run_id="r1")
            frames = [f async for f in stream.frames()]
    assert frames == [{"status": "finished", "console": [], "exitCode": 3}]
    assert moved == [(dead, live)] and client.endpoint == live
    line, headers = requests[0]
    assert line == "GET /api/stream/session/s1/execute HTTP/1.1"
    assert headers["host"] == f"127.0.0.1:{port}" and "content-type" not in headers
    assert headers["x-backendai-version"] == API_VERSION and headers["x-backendai-domain"] == "default"
    key = auth.verify(
        authorization=headers["authorization"],
        date=headers["date"],
        method="GET",
        path="/api/stream/session/s1/execute",
        host=f"127.0.0.1:{port}",
        ctype="application/octet-stream",
        version=API_VERSION,
        lookup_secret=lambda ak: CREDS[1] if ak == CREDS[0] else None,
    )
    assert key == CREDS[0]


async def test_the_client_says_a_refusal_as_the_managers_problem() -> None:
    problem = json.dumps({"type": "https://api.backend.ai/probs/session-not-found", "title": "No such session."})
    answer = f"HTTP/1.1 404 Not Found\r\nContent-Length: {len(problem)}\r\n\r\n{problem}".encode()
    plain = b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 4\r\n\r\noops"
    wrong = lambda key: upgrade_answer(key, accept="bm90IGl0")  # noqa: E731
    for answer_of, status, says in [
        (lambda key: answer, 404, "No such session."),
        (lambda key: plain, 502, "cannot open the execution stream HTTP 502 Bad Gateway"),
        (wrong, 0, "the WebSocket handshake with the manager at .* failed: the server's Sec-WebSocket-Accept"),
    ]:
        async with server(answering(answer_of)) as port:
            client = Client(Credentials(f"http://127.0.0.1:{port}", *CREDS))
            with pytest.raises(APIError, match=says) as refused:
                async with client.execute("s1"):
                    pass
            assert refused.value.status == status


async def test_the_client_says_when_no_manager_answers() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    client = Client(Credentials(dead, *CREDS))
    with pytest.raises(APIError, match=f"cannot reach the manager at {dead}"):
        async with client.execute("s1"):
            pass
