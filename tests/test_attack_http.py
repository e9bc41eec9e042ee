"""What a client can do to the manager over HTTP and WebSockets, as an attacker would, against a real node
(the simulated backend): floods of frames and input, idle and slow connections, malformed requests.
The node's RSS and open file descriptors are measured with psutil before and after."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import resource
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import psutil
import pytest
import yarl
from hypothesis import given, settings
from hypothesis import strategies as st

from bai import API_VERSION
from bai.common import auth
from tests.nodeproc import Node, admin_keys

HEADER_TIMEOUT = 1.0
IDLE_TIMEOUT = 2.0
PER_PEER = 300
LIMITS = (
    "[node]\n"
    f"http_header_timeout = {HEADER_TIMEOUT}\n"
    f"http_idle_timeout = {IDLE_TIMEOUT}\n"
    f"http_max_connections_per_peer = {PER_PEER}\n"
)
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> Iterator[Node]:
    node = Node(tmp_path_factory.mktemp("attack"), "sim", extra_config=LIMITS).start()
    node.cli("session", "create", "--name", "target", "python", check=True)
    yield node
    node.stop()


def signed_headers(node: Node, path: str) -> dict[str, str]:
    """Headers of a signed GET of `path` (with its query), as the CLI signs its WebSocket upgrades."""
    access_key, secret_key = admin_keys(node)
    host = yarl.URL(node.endpoint).raw_authority
    date = auth.now_header()
    sig = auth.sign(secret_key, "GET", path, date, host, "application/octet-stream", API_VERSION)
    return {
        "Date": date,
        "X-BackendAI-Version": API_VERSION,
        "Authorization": auth.authorization_header(access_key, sig),
    }


@contextlib.asynccontextmanager
async def websocket(node: Node, path: str, **kw):
    """A signed WebSocket to the node (the client side accepts any size: the server's bounds are tested)."""
    async with aiohttp.ClientSession() as http:
        url = yarl.URL(node.endpoint + path, encoded=True)
        async with http.ws_connect(url, headers=signed_headers(node, path), max_msg_size=0, **kw) as ws:
            yield ws


async def frames_until_closed(ws, timeout: float = 10.0) -> list:
    """Every frame the server sends until it closes (the close code is then ws.close_code)."""
    out = []
    with contextlib.suppress(asyncio.TimeoutError):
        async with asyncio.timeout(timeout):
            async for msg in ws:
                out.append(json.loads(msg.data) if msg.type == aiohttp.WSMsgType.TEXT else msg)
    return out


def usage(node: Node) -> tuple[int, int]:
    """(RSS in bytes, open file descriptors) of the node process."""
    proc = psutil.Process(node.proc.pid)
    return proc.memory_info().rss, proc.num_fds()


def answers(node: Node, source: str = "127.0.0.2") -> bool:
    """Whether a signed request (from another loopback address than the flood's) gets its answer."""
    import http.client

    access_key, secret_key = admin_keys(node)
    host = yarl.URL(node.endpoint).raw_authority
    date = auth.now_header()
    sig = auth.sign(secret_key, "GET", "/", date, host, "application/json", API_VERSION)
    headers = {
        "Date": date,
        "X-BackendAI-Version": API_VERSION,
        "Authorization": f"BackendAI signMethod=HMAC-SHA256, credential={access_key}:{sig}",
        "Content-Type": "application/json",
    }
    conn = http.client.HTTPConnection(host, timeout=10, source_address=(source, 0))
    try:
        conn.request("GET", "/", headers=headers)
        return conn.getresponse().status == 200
    finally:
        conn.close()


def node_log(node: Node) -> str:
    return node.log_path.read_text(errors="replace")


async def test_a_flood_of_huge_frames_while_code_runs_is_refused_and_costs_no_memory(node: Node) -> None:
    rss0, fds0 = usage(node)
    async with websocket(node, "/stream/session/target/execute") as ws:
        await ws.send_json({"mode": "batch", "code": "sleep 25", "runId": "flood-1"})
        big = "x" * (20 * MiB)
        with contextlib.suppress(ConnectionError, aiohttp.ClientError):
            for _ in range(20):
                await ws.send_str(big)
        await frames_until_closed(ws)
        # 1009 (message too big); 1006 when the close frame was lost in the reset of a socket still being written
        assert ws.close_code in (1009, 1006)
    await asyncio.sleep(0.5)
    rss1, fds1 = usage(node)
    print(f"execute flood: RSS {rss0 / MiB:.0f} -> {rss1 / MiB:.0f} MiB, fds {fds0} -> {fds1}")
    assert rss1 - rss0 < 50 * MiB, (rss0, rss1)
    assert fds1 <= fds0 + 5
    assert answers(node)


async def test_a_huge_first_frame_is_refused_and_one_under_the_limit_runs(node: Node) -> None:
    async with websocket(node, "/stream/session/target/execute") as ws:
        with contextlib.suppress(ConnectionError, aiohttp.ClientError):
            await ws.send_str(json.dumps({"code": "#" * (5 * MiB)}))
        await frames_until_closed(ws)
        assert ws.close_code in (1009, 1006)  # (1006: the close frame lost in the reset of the unread rest)
    async with websocket(node, "/stream/session/target/execute") as ws:
        await ws.send_str(json.dumps({"code": "#" * (3 * MiB), "runId": "big-ok"}))
        frames = await frames_until_closed(ws)
        assert frames and frames[-1]["status"] == "finished", frames


async def test_queued_input_is_bounded_with_an_error_frame(node: Node) -> None:
    """Input lines sent while the code runs are kept for it, up to a bound; the one over the bound is answered
    with an error frame (not dropped silently), the run is interrupted and the socket closed (1009)."""
    from bai.node.manager.http.app import EXECUTE_MAX_QUEUED_INPUTS

    async with websocket(node, "/stream/session/target/execute") as ws:
        await ws.send_json({"mode": "batch", "code": "sleep 25", "runId": "flood-2"})
        with contextlib.suppress(ConnectionError, aiohttp.ClientError):
            for i in range(EXECUTE_MAX_QUEUED_INPUTS + 10):
                await ws.send_str(f"line {i}")
        frames = await frames_until_closed(ws)
        errors = [f for f in frames if isinstance(f, dict) and f.get("status") == "error"]
        assert errors and "too much input" in errors[0]["msg"], frames
        assert ws.close_code == 1009
    async with websocket(node, "/stream/session/target/execute") as ws:  # one input frame over its own bound
        await ws.send_json({"mode": "batch", "code": "sleep 25", "runId": "flood-3"})
        await ws.send_str("y" * (1 * MiB))
        frames = await frames_until_closed(ws)
        assert any(isinstance(f, dict) and "input frame is too large" in f.get("msg", "") for f in frames), frames
    assert answers(node)


async def test_deep_json_frames_get_an_error_frame(node: Node) -> None:
    async with websocket(node, "/stream/session/target/execute") as ws:
        await ws.send_str("[" * 100_000)
        frames = await frames_until_closed(ws)
        assert frames and frames[0]["status"] == "error" and "nested too deeply" in frames[0]["msg"], frames
    async with websocket(node, "/stream/session/target/pty") as ws:
        await ws.send_str("[" * 100_000)
        await ws.send_json({"type": "resize", "rows": 10**30, "cols": 80})
        await ws.send_json({"type": "resize", "rows": 0, "cols": 80})
        await ws.send_json({"type": "stdin", "chars": base64.b64encode(b"echo alive\r").decode()})
        seen, errors = b"", []
        async with asyncio.timeout(10):
            while b"alive" not in seen:
                msg = json.loads((await ws.receive()).data)
                if msg["type"] == "error":
                    errors.append(msg["data"])
                elif msg["type"] == "out":
                    seen += base64.b64decode(msg["data"])
        assert len(errors) == 3 and "nested too deeply" in errors[0] and "between 1 and 1000" in errors[1], errors
    assert "Traceback" not in node_log(node)


async def test_long_streams_outlive_the_header_and_idle_timeouts(node: Node) -> None:
    """The timers only act while a connection waits for a request head: a run of 3 s (longer than both) over
    the execute WebSocket ends normally."""
    started = time.monotonic()
    async with websocket(node, "/stream/session/target/execute") as ws:
        await ws.send_json({"mode": "batch", "code": "sleep 3", "runId": "long-1"})
        frames = await frames_until_closed(ws, timeout=20)
    assert time.monotonic() - started > HEADER_TIMEOUT + IDLE_TIMEOUT
    assert frames and frames[-1]["status"] == "finished", frames


def first_answers(socks: list[socket.socket], started: float, timeout: float) -> list[tuple[bytes, float]]:
    """For each socket, the first bytes the server sent (b"" for a close) and when (seconds after `started`)."""
    import selectors

    answers_of: dict[socket.socket, tuple[bytes, float]] = {}
    with selectors.DefaultSelector() as sel:
        for s in socks:
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        while len(answers_of) < len(socks) and time.monotonic() < deadline:
            for key, _ in sel.select(0.1):
                try:
                    data = key.fileobj.recv(64)
                except OSError:
                    data = b""
                answers_of[key.fileobj] = (data, time.monotonic() - started)
                sel.unregister(key.fileobj)
    return [answers_of.get(s, (b"(nothing)", timeout)) for s in socks]


def test_idle_connections_from_one_address_never_lock_out_a_request_from_it(node: Node) -> None:
    """More idle connections than the per-address cap, from 127.0.0.1 (every local user's address): the
    oldest waiting ones are closed to make room, none is refused, a signed request from 127.0.0.1 itself is
    served during the flood, the rest are closed at the header timeout, and the fds come back."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    count = PER_PEER + 200
    _, fds0 = usage(node)
    socks = []
    try:
        started = time.monotonic()
        for _ in range(count):
            socks.append(socket.create_connection(("127.0.0.1", node.port), timeout=5))
        # the node accepts what waits in its listen backlog over its next loop turns: its peak is what it held
        fds_held = usage(node)[1]
        for _ in range(60):
            if fds_held >= fds0 + PER_PEER // 2:
                break
            time.sleep(0.05)
            fds_held = max(fds_held, usage(node)[1])
        # connections closed to make room give their descriptors back on the node's next loop turns (it
        # accepts a burst of connections in one turn): within a moment it holds at most the cap
        settled = fds_held
        for _ in range(12):
            if settled <= fds0 + PER_PEER + 10:
                break
            time.sleep(0.05)
            settled = usage(node)[1]
        assert answers(node, "127.0.0.1")  # the flooding address itself is served meanwhile
        assert answers(node)  # and another
        got = first_answers(socks, started, HEADER_TIMEOUT + 5)
    finally:
        for s in socks:
            s.close()
    refused = [t for data, t in got if data.startswith(b"HTTP/1.1 503")]
    timed_out = [t for data, t in got if data.startswith(b"HTTP/1.1 408")]
    evicted = [t for data, t in got if data == b""]
    assert not refused, len(refused)  # idle connections make room; nobody is turned away
    # every connection ended: the oldest closed to make room (at least the excess, plus one per request
    # above), the others answered 408 at the header timeout
    assert len(evicted) + len(timed_out) == count, [d for d, _ in got][:5]
    assert len(evicted) >= count - PER_PEER, len(evicted)
    assert timed_out and min(timed_out) >= HEADER_TIMEOUT * 0.9, timed_out[:3]
    time.sleep(0.3)
    _, fds1 = usage(node)
    print(f"{count} idle connections: node fds {fds0} -> {fds_held} (held) -> {fds1}")
    assert fds_held >= fds0 + PER_PEER // 2, (fds0, fds_held)  # they were held, until the timeout
    assert settled <= fds0 + PER_PEER + 10, (fds0, fds_held, settled)  # never more than the cap for long
    assert fds1 <= fds0 + 5, (fds0, fds1)


def test_a_slowloris_is_closed_at_the_header_timeout(node: Node) -> None:
    s = socket.create_connection(("127.0.0.1", node.port), source_address=("127.0.0.3", 0))
    head = b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 100
    started = time.monotonic()
    closed_after = None
    try:
        s.settimeout(0.2)
        for byte in head:
            try:
                s.sendall(bytes([byte]))
                data = s.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                data = b""
            if data == b"" or data.startswith(b"HTTP/1.1 408"):
                closed_after = time.monotonic() - started
                break
    finally:
        s.close()
    assert closed_after is not None and closed_after < HEADER_TIMEOUT + 1.0, closed_after


def test_malformed_requests_get_400_and_no_traceback(node: Node) -> None:
    before = node_log(node)
    for _ in range(50):
        s = socket.create_connection(("127.0.0.1", node.port), source_address=("127.0.0.4", 0))
        try:
            s.sendall(b"GET / HTTP/1.1\r\nContent-Length: abc\r\n\r\n")
            s.settimeout(5)
            assert b" 400 Bad Request" in s.recv(64)
        finally:
            s.close()
    time.sleep(0.2)
    new = node_log(node)[len(before) :]
    assert "Traceback" not in new and "ERROR" not in new, new[-2000:]
    assert new.count("bad request from") <= 2, new


def test_the_limits_are_checked_at_start(tmp_path: Path) -> None:
    node = Node(tmp_path, "sim", extra_config="[node]\nhttp_max_connections_per_peer = 0\n")
    with pytest.raises(AssertionError, match="per-peer cap"):
        node.start()


async def test_an_event_stream_outlives_the_idle_timeout(node: Node) -> None:
    """An SSE stream (the dashboard's) is a request being served: it stays open past both timers."""
    path = "/bai/events?topics=sessions"
    async with aiohttp.ClientSession() as http:
        url = yarl.URL(node.endpoint + path, encoded=True)
        async with http.get(url, headers=signed_headers(node, path)) as resp:
            assert resp.status == 200
            await resp.content.readany()
            await asyncio.sleep(HEADER_TIMEOUT + IDLE_TIMEOUT + 0.5)
            assert not resp.content.at_eof() and not resp.connection.transport.is_closing()


async def test_the_total_cap_closes_waiting_connections_first_and_refuses_only_when_all_serve() -> None:
    """In process: a LimitedTCPSite with a total cap of 5 (per address: more). Idle connections over the cap
    make room (the oldest closed); a new one over a cap of connections all serving requests is a 503; places
    free up when connections close."""
    from aiohttp import web

    from bai.node.manager.http.server import HttpLimits, LimitedTCPSite, connections_for

    assert connections_for(1024) == 64 and connections_for(20000) == 9488 and connections_for(1 << 30) == 65536
    release = asyncio.Event()

    async def hello(request: web.Request) -> web.Response:
        if request.query.get("hold"):
            await release.wait()
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/", hello)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    limits = HttpLimits(header_timeout=5.0, max_connections=5, max_connections_per_peer=100)
    site = LimitedTCPSite(runner, "127.0.0.1", 0, limits=limits)
    await site.start()
    try:
        idle = [await asyncio.open_connection("127.0.0.1", site.port) for _ in range(7)]
        for reader, _ in idle[:2]:  # the two oldest were closed to make room, without an answer
            assert await asyncio.wait_for(reader.read(4096), 2) == b""
        assert limits.total == 5 and limits.evicted == 2 and limits.refused == 0
        # requests that are being served are never closed for room: fill the cap with held requests
        held = []
        for _ in range(5):
            reader, writer = await asyncio.open_connection("127.0.0.1", site.port)
            writer.write(b"GET /?hold=1 HTTP/1.1\r\nHost: x\r\n\r\n")
            held.append((reader, writer))
        for _ in range(100):
            if all(h.waiting() is False for h in limits.open):
                break
            await asyncio.sleep(0.01)
        reader, writer = await asyncio.open_connection("127.0.0.1", site.port)
        refused = await asyncio.wait_for(reader.read(4096), 2)
        assert refused.startswith(b"HTTP/1.1 503") and b"all of them serving requests" in refused, refused
        assert limits.refused == 1
        release.set()
        for reader, _ in held:
            assert (await asyncio.wait_for(reader.readuntil(b"ok"), 2)).startswith(b"HTTP/1.1 200")
        for _, w in [*idle, *held, (reader, writer)]:
            w.close()
        for _ in range(100):
            if limits.total == 0:
                break
            await asyncio.sleep(0.01)
        assert limits.total == 0 and not limits.by_peer and not limits.open
        reader, writer = await asyncio.open_connection("127.0.0.1", site.port)  # a place is free again
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 2)
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"ok")
        writer.close()
    finally:
        await runner.cleanup()


def test_an_over_size_json_body_is_refused_before_it_is_read(node: Node) -> None:
    """A JSON body over MAX_JSON_BODY is a 413 from its Content-Length (nothing of it is read), and a chunked
    one is cut off at the limit."""
    from bai.node.manager.http.context import MAX_JSON_BODY

    access_key, secret_key = admin_keys(node)
    host = yarl.URL(node.endpoint).raw_authority
    date = auth.now_header()
    sig = auth.sign(secret_key, "POST", "/session", date, host, "application/json", API_VERSION)
    head = (
        f"POST /session HTTP/1.1\r\nHost: {host}\r\nDate: {date}\r\nX-BackendAI-Version: {API_VERSION}\r\n"
        f"Authorization: BackendAI signMethod=HMAC-SHA256, credential={access_key}:{sig}\r\n"
        "Content-Type: application/json\r\n"
    )
    rss0, _ = usage(node)
    with socket.create_connection(("127.0.0.1", node.port), source_address=("127.0.0.5", 0)) as s:
        s.sendall(f"{head}Content-Length: {MAX_JSON_BODY + 1}\r\n\r\n".encode())
        s.settimeout(5)
        answer = s.recv(4096)
    assert answer.startswith(b"HTTP/1.1 413") and b"at most" in answer, answer
    with socket.create_connection(("127.0.0.1", node.port), source_address=("127.0.0.5", 0)) as s:
        s.sendall(f"{head}Transfer-Encoding: chunked\r\n\r\n".encode())
        chunk = b"[" + b" " * (MiB - 1)
        with contextlib.suppress(OSError):
            for _ in range(40):
                s.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        s.settimeout(5)
        answer = s.recv(4096)
    assert answer.startswith(b"HTTP/1.1 413"), answer
    rss1, _ = usage(node)
    assert rss1 - rss0 < 50 * MiB, (rss0, rss1)


async def test_json_bodies_being_read_share_one_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """In process: bodies read at once beyond the budget are refused (503), and the budget is given back."""
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    from bai.common.problems import Problem
    from bai.node.manager.http import context as http_mod

    monkeypatch.setattr(http_mod.BODIES, "limit", 100_000)

    async def echo(request: web.Request) -> web.Response:
        try:
            return web.json_response({"n": len(await http_mod.read_json(request))})
        except Problem as p:
            return http_mod.problem_response(p)

    app = web.Application()
    app.router.add_post("/", echo)
    async with TestClient(TestServer(app)) as client:
        ok = await client.post("/", data=json.dumps(["x" * 50_000]).encode())
        assert ok.status == 200
        over = await client.post("/", data=json.dumps(["x" * 200_000]).encode())
        assert over.status == 503 and "try again" in (await over.json())["msg"]
    assert http_mod.BODIES.used == 0


async def test_a_stalled_json_body_is_answered_408(monkeypatch: pytest.MonkeyPatch) -> None:
    """In process: a body that stops coming (a slowloris of the body) ends at BODY_IDLE_TIMEOUT."""
    from aiohttp import web

    from bai.common.problems import Problem
    from bai.node.manager.http import context as http_mod

    monkeypatch.setattr(http_mod, "BODY_IDLE_TIMEOUT", 0.3)

    async def echo(request: web.Request) -> web.Response:
        try:
            return web.json_response(await http_mod.read_json(request))
        except Problem as p:
            return http_mod.problem_response(p)

    app = web.Application()
    app.router.add_post("/", echo)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", site.port)
        writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n[1,")
        started = time.monotonic()
        answer = await asyncio.wait_for(reader.read(4096), 5)
        assert answer.startswith(b"HTTP/1.1 408") and b"no byte of the request body" in answer, answer
        assert time.monotonic() - started < 2
        writer.close()
    finally:
        await runner.cleanup()
    assert http_mod.BODIES.used == 0


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(max_size=200)
    | st.integers(1, 50_000).map(lambda n: "[" * n)
    | st.integers(1, 3000).map(lambda n: '{"a":' * n + "0" + "}" * n)
    | st.binary(max_size=100)
)
def test_safejson_gives_a_value_or_unsafejson_and_nothing_else(text) -> None:
    from bai.common import safejson

    try:
        value = safejson.loads(text, max_bytes=40_000)
    except safejson.UnsafeJson as e:
        assert str(e)
    else:
        assert not safejson.depth_over(value, safejson.MAX_DEPTH)


async def test_an_execute_websocket_that_never_asks_is_closed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In process (the harness and the real app): a WebSocket upgraded and then left silent is told and closed
    after EXECUTE_FIRST_FRAME_TIMEOUT instead of holding its connection for ever."""
    from aiohttp.test_utils import TestClient, TestServer

    from bai.node.manager.http import app as api
    from tests.harness import Harness

    monkeypatch.setattr(api, "EXECUTE_FIRST_FRAME_TIMEOUT", 0.3)
    async with Harness(tmp_path) as h:
        await h.add_agent("a1")
        await h.create("silent-1")
        await h.schedule()
        await h.wait("silent-1", "RUNNING")
        keypairs = await h.store.keypairs()
        settings = {"keypairs": keypairs, "default_resources": h.defaults, "cluster": None}
        async with TestClient(TestServer(api.make_app(h.manager.services, settings))) as client:
            path = "/stream/session/silent-1/execute"
            date = auth.now_header()
            host = f"{client.host}:{client.port}"
            secret = keypairs[h.admin].secret_key
            sig = auth.sign(secret, "GET", path, date, host, "application/octet-stream", API_VERSION)
            headers = {
                "Date": date,
                "X-BackendAI-Version": API_VERSION,
                "Authorization": auth.authorization_header(h.admin, sig),
            }
            started = time.monotonic()
            async with client.ws_connect(path, headers=headers) as ws:
                frames = await frames_until_closed(ws, timeout=5)
            assert frames and frames[0]["status"] == "error" and "no first frame" in frames[0]["msg"], frames
            assert time.monotonic() - started < 3


async def upload_status(node: Node, files: list[tuple[str, bytes]]) -> tuple[int, str]:
    path = "/session/target/upload"
    access_key, secret_key = admin_keys(node)
    host = yarl.URL(node.endpoint).raw_authority
    date = auth.now_header()
    sig = auth.sign(secret_key, "POST", path, date, host, "multipart/form-data", API_VERSION)
    headers = {
        "Date": date,
        "X-BackendAI-Version": API_VERSION,
        "Authorization": auth.authorization_header(access_key, sig),
    }
    form = aiohttp.FormData()
    for name, data in files:
        form.add_field("src", data, filename=name, content_type="application/octet-stream")
    async with aiohttp.ClientSession() as http:
        async with http.post(yarl.URL(node.endpoint + path, encoded=True), data=form, headers=headers) as resp:
            return resp.status, await resp.text()


async def test_uploads_are_bounded_per_file_and_in_all_as_they_arrive(node: Node) -> None:
    """A file over 16 MiB, or files over 64 MiB together, are a 400 saying which; what the node held for
    them is given back; a small upload still works."""
    from bai.node.manager.http.app import MAX_UPLOAD_BYTES, MAX_UPLOAD_TOTAL

    rss0, _ = usage(node)
    status, text = await upload_status(node, [("big.bin", b"x" * (MAX_UPLOAD_BYTES + 1))])
    assert status == 400 and "larger than 16 MiB" in text, text
    many = [(f"f{i}.bin", b"y" * (MAX_UPLOAD_BYTES - 10)) for i in range(MAX_UPLOAD_TOTAL // MAX_UPLOAD_BYTES + 1)]
    status, text = await upload_status(node, many)
    assert status == 400 and "at most 64 MiB in all" in text, text
    status, text = await upload_status(node, [("a.py", b"print(1)\n"), ("b.txt", b"hello\n")])
    assert status == 204, text
    rss1, _ = usage(node)
    print(f"uploads refused: node RSS {rss0 >> 20} -> {rss1 >> 20} MiB")
    assert rss1 - rss0 < 100 * 2**20, (rss0, rss1)
