"""Apps end to end with real processes and the sim backend's echo apps: `bai session app` / `apps`, the
WebSocket API, the official client's `backend.ai app`, on a combined node and a ZeroMQ split cluster;
owners only; a tunnel ends with its session and the client is told why. (tests/test_apps_docker.py runs
real apps in Docker kernels.)"""

from __future__ import annotations

import asyncio
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bai.node.manager.http.app_routes import MAX_MESSAGE
from tests.nodeproc import Cluster, Node, admin_keys, free_port, signed_request
from tests.test_official_client import Official, official_client
from tests.tui_support import node_client

APPS = 'sim_apps = "echo:tcp:7000,web:http:8080,broken:tcp:7001"\n'


@pytest.fixture(scope="module")
def sim_node(tmp_path_factory) -> Iterator[Node]:
    node = Node(tmp_path_factory.mktemp("apps"), "sim", agent_config=APPS).start()
    yield node
    node.stop()


@pytest.fixture(scope="module")
def split(tmp_path_factory) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("apps-split"), "sim", agent_config=APPS).start()
    yield cluster
    cluster.stop()


def session(node, name: str) -> dict:
    node.cli("session", "create", "--name", name, "python", check=True)
    return node.json("session", "info", name)


def echo_through(port: int, payload: bytes, timeout: float = 20) -> bytes:
    """Send payload to 127.0.0.1:port, half-close, read until the other side closes."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
            break
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    with sock:
        sock.sendall(payload)
        got = b""
        while len(got) < len(payload):
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            got += chunk
        return got


def start_app_cli(node, name: str, app: str, port: int) -> tuple[subprocess.Popen[str], str]:
    proc = node.popen("session", "app", name, app, "--bind", f"127.0.0.1:{port}")
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()  # the URL is the one line on stdout
    return proc, url


def test_session_info_and_apps_list_the_images_apps(sim_node: Node) -> None:
    info = session(sim_node, "apps-list")
    assert [(a["name"], a["protocol"], a["ports"]) for a in info["servicePorts"]] == [
        ("echo", "tcp", [7000]),
        ("web", "http", [8080]),
        ("broken", "tcp", [7001]),
    ]
    out = sim_node.cli("session", "apps", "apps-list", check=True).stdout
    assert re.search(r"echo\s+tcp\s+7000\s+-\s+bai session app apps-list echo", out), out
    text = sim_node.cli("session", "info", "apps-list", check=True).stdout
    assert "App         web (http, port 8080)" in text
    sim_node.cli("session", "destroy", "apps-list", check=True)


def test_the_cli_tunnels_each_connection_and_stops_when_the_session_ends(sim_node: Node) -> None:
    session(sim_node, "apps-cli")
    port = free_port()
    proc, url = start_app_cli(sim_node, "apps-cli", "echo", port)
    try:
        assert url == f"tcp://127.0.0.1:{port}"
        assert echo_through(port, b"hello through the manager") == b"hello through the manager"
        big = bytes(range(256)) * 8192  # 2 MiB
        assert echo_through(port, big) == big
        sim_node.cli("session", "destroy", "apps-cli", check=True)
        code = proc.wait(20)
        err = proc.stderr.read()
        assert code == 1 and "the tunnel to echo closed: session apps-cli ended" in err, err
    finally:
        proc.kill()


def test_an_http_app_prints_an_http_url_on_the_apps_port_by_default(sim_node: Node) -> None:
    session(sim_node, "apps-web")
    proc = sim_node.popen("session", "app", "apps-web", "web")
    try:
        url = proc.stdout.readline().strip()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/\?token=[A-Za-z0-9_-]{32}", url), url
    finally:
        proc.terminate()
        proc.wait(10)
        sim_node.cli("session", "destroy", "apps-web", check=True)


def test_an_app_that_fails_to_start_shows_its_output_and_exits_1(sim_node: Node) -> None:
    session(sim_node, "apps-broken")
    out = sim_node.cli("session", "app", "apps-broken", "broken", "--bind", f"127.0.0.1:{free_port()}", timeout=30)
    assert out.returncode == 1
    assert "broken did not start: broken exited with code 1 while starting" in out.stderr and "boom" in out.stderr
    out = sim_node.cli("session", "app", "apps-broken", "nope", timeout=30)
    assert out.returncode == 1 and "offers no app 'nope'; its apps: echo, web, broken" in out.stderr
    out = sim_node.cli("session", "app", "apps-broken", "echo", "--bind", "127.0.0.1:99999", timeout=30)
    assert out.returncode == 2 and "0 to 65535" in out.stderr
    sim_node.cli("session", "destroy", "apps-broken", check=True)


def test_only_the_owner_and_admins_reach_a_sessions_apps(sim_node: Node) -> None:
    session(sim_node, "apps-private")
    other = sim_node.json("keypair", "create", "--user", "apps-other")
    out = sim_node.cli("session", "apps", "apps-private", as_keypair=other)
    assert out.returncode != 0 and "apps-private" in out.stderr
    out = sim_node.cli("session", "app", "apps-private", "echo", as_keypair=other, timeout=30)
    assert out.returncode != 0

    async def raw() -> tuple[int, int]:
        client = node_client(sim_node, other)
        info = sim_node.json("session", "info", "apps-private")
        statuses = []
        for path in (f"/stream/session/{info['id']}/apps", f"/stream/session/{info['id']}/apps/echo/start"):
            try:
                await client.request("GET" if path.endswith("apps") else "POST", path)
            except Exception as e:
                statuses.append(e.status)
        await client.close()
        return tuple(statuses)

    assert asyncio.run(raw()) == (404, 404)
    sim_node.cli("session", "destroy", "apps-private", check=True)


def test_the_official_client_opens_an_app_unchanged(sim_node: Node, tmp_path: Path) -> None:
    bai_client = Official(official_client(), sim_node, tmp_path)
    session(sim_node, "apps-official")
    out = bai_client("apps", "apps-official", "--list-names")
    assert "echo, web, broken" in out, out
    port = free_port()
    proc = bai_client.popen("app", "apps-official", "echo", "-b", f"127.0.0.1:{port}")
    try:
        assert echo_through(port, b"from backend.ai app") == b"from backend.ai app"
    finally:
        proc.terminate()
        out = proc.communicate(timeout=20)[0]
    assert f"tcp://127.0.0.1:{port}" in out, out
    # (23.9 says so, then waits for Ctrl-C instead of exiting: its own behaviour)
    proc = bai_client.popen("app", "apps-official", "nope", "-b", f"127.0.0.1:{free_port()}")
    try:
        assert 'The app "nope" is not supported by the session.' in proc.stdout.readline()
    finally:
        proc.terminate()
        proc.wait(20)
    sim_node.cli("session", "destroy", "apps-official", check=True)


def test_tunnels_ride_the_zmq_link_of_a_split_cluster(split: Cluster) -> None:
    session(split, "apps-split")
    port = free_port()
    proc, url = start_app_cli(split, "apps-split", "echo", port)
    try:
        payloads = [bytes([i]) * 200_000 for i in range(20)]

        async def many() -> list[bytes]:
            return await asyncio.gather(*(asyncio.to_thread(echo_through, port, p) for p in payloads))

        assert asyncio.run(many()) == payloads  # 20 tunnels at once, each its own bytes
    finally:
        proc.terminate()
        proc.wait(10)
        split.cli("session", "destroy", "apps-split", check=True)


async def echoed(client, sid: str, frames: list[bytes | str]) -> tuple[bytes, int | None]:
    """Send `frames` down a tunnel to the echo app; what comes back (all of it), and the close code when the
    server closed the tunnel instead."""
    ws = await client.app_tunnel(sid, "echo")
    want = sum(len(f.encode() if isinstance(f, str) else f) for f in frames)
    got = b""
    try:
        for frame in frames:
            await (ws.send_str(frame) if isinstance(frame, str) else ws.send_bytes(frame))
        while len(got) < want:
            msg = await asyncio.wait_for(ws.receive(), 20)
            if msg.type == aiohttp.WSMsgType.BINARY:
                got += msg.data
            elif msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING):
                return got, ws.close_code
        return got, None
    finally:
        await ws.close()


@pytest.fixture(scope="module")
def frames_session(sim_node: Node) -> Iterator[str]:
    info = session(sim_node, "apps-frames")
    yield info["id"]
    sim_node.cli("session", "destroy", "apps-frames", check=True)


frame = st.one_of(st.binary(min_size=1, max_size=70_000), st.text(min_size=1, max_size=2_000))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(frame, min_size=1, max_size=8))
def test_any_frames_within_the_limit_come_back_intact(sim_node: Node, frames_session: str, frames) -> None:
    async def go() -> tuple[bytes, int | None]:
        client = node_client(sim_node)
        try:
            return await echoed(client, frames_session, frames)
        finally:
            await client.close()

    got, closed = asyncio.run(go())
    assert closed is None and got == b"".join(f.encode() if isinstance(f, str) else f for f in frames)


def test_a_frame_over_the_limit_closes_the_tunnel_with_1009_and_the_next_one_works(
    sim_node: Node, frames_session: str
) -> None:
    async def go() -> tuple[tuple[bytes, int | None], tuple[bytes, int | None]]:
        client = node_client(sim_node)
        try:
            over = await echoed(client, frames_session, [b"x" * (MAX_MESSAGE + 1)])
            at = await echoed(client, frames_session, [b"y" * MAX_MESSAGE])
            return over, at
        finally:
            await client.close()

    (got, code), (back, closed) = asyncio.run(go())
    assert got == b"" and code == aiohttp.WSCloseCode.MESSAGE_TOO_BIG
    assert closed is None and back == b"y" * MAX_MESSAGE


@pytest.mark.parametrize(
    "raw",
    ["[" * 2000, '{"a":' * 100 + "1" + "}" * 100, "x" * 5000, "[1]", '{"a": 1}'],
    ids=["deep-array", "deep-object", "not-json", "array", "custom"],
)
def test_a_tunnels_arguments_that_are_not_an_empty_object_are_a_400(
    sim_node: Node, frames_session: str, raw: str
) -> None:
    """Deep, huge, non-object or custom `arguments` on the tunnel: a 400 problem, never a 5xx."""
    path = f"/stream/session/{frames_session}/tcpproxy?app=echo&arguments={quote(raw)}"
    status, body = signed_request(sim_node, "GET", path, *admin_keys(sim_node))
    assert status == 400, body
    assert isinstance(body, dict) and "arguments" in body.get("msg", ""), body


def test_an_idle_tunnel_is_closed_and_a_busy_one_is_not(tmp_path: Path) -> None:
    """[manager] app_idle_timeout: a tunnel with no byte either way for that long is closed saying why; one
    that carries a byte now and then stays open past it."""
    node = Node(tmp_path, "sim", agent_config=APPS, extra_config="[manager]\napp_idle_timeout = 1.0\n").start()
    try:
        sid = session(node, "apps-idle")["id"]

        async def go() -> tuple[list[str], bytes, bool]:
            client = node_client(node)
            try:
                idle = await client.app_tunnel(sid, "echo")
                said = []
                msg = await asyncio.wait_for(idle.receive(), 5)  # nothing sent: the server ends it
                while msg.type == aiohttp.WSMsgType.TEXT:
                    said.append(msg.data)
                    msg = await asyncio.wait_for(idle.receive(), 5)
                busy = await client.app_tunnel(sid, "echo")
                got = b""
                for _ in range(8):  # 2 s in all, a byte every 0.25 s
                    await busy.send_bytes(b"k")
                    got += (await asyncio.wait_for(busy.receive(), 5)).data
                    await asyncio.sleep(0.25)
                open_still = not busy.closed
                await busy.close()
                return said, got, open_still
            finally:
                await client.close()

        said, got, open_still = asyncio.run(go())
        assert any("idle for 1 seconds" in s for s in said), said
        assert got == b"k" * 8 and open_still
    finally:
        node.stop()
