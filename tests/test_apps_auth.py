"""A forwarded app asks who you are (security review, issue 27 finding 3): users of a node share its host's
loopback, so `bai session app` lets a connection to an HTTP app through only when its first request carries
the app's token (the URL it printed, or the cookie it then set), and the images' Jupyter apps are started
with a secret of their own that only the session's owner is shown.

The first tests drive the CLI's listener in-process against a fake manager (what reaches a tunnel and what
does not, floods of idle and oversized connections with this process's fds and RSS measured, and a
property over arbitrary request heads); the last ones attack a real JupyterLab in a Docker kernel as
another local process and as another user, and open it as its owner.
"""

from __future__ import annotations

import asyncio
import http.cookiejar
import os
import re
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bai.cli import apps as cli_apps
from bai.cli.apps import Gate, open_forward
from tests.nodeproc import Node, free_port
from tests.test_browser_driver import jupyter_image  # noqa: F401 (fixture)
from tests.test_official_client import Official, official_client
from tests.tui_support import node_client

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
HTTP_APP = {"name": "web", "protocol": "http", "ports": [8080], "url_template": "{protocol}://{host}:{port}/lab"}
SESSION = {"id": "s1", "name": "nb"}


class FakeTunnel:
    """A tunnel's WebSocket as the manager's: what the listener sends is recorded; the app answers ANSWER
    to the first bytes, then closes."""

    def __init__(self) -> None:
        self.sent = b""
        self.queue: asyncio.Queue[aiohttp.WSMessage | None] = asyncio.Queue()
        self.close_code = 1000

    async def send_bytes(self, data: bytes) -> None:
        if not self.sent:
            self.queue.put_nowait(aiohttp.WSMessage(aiohttp.WSMsgType.BINARY, ANSWER[:20], None))
            self.queue.put_nowait(aiohttp.WSMessage(aiohttp.WSMsgType.BINARY, ANSWER[20:], None))
            self.queue.put_nowait(None)
        self.sent += data

    def __aiter__(self) -> FakeTunnel:
        return self

    async def __anext__(self) -> aiohttp.WSMessage:
        msg = await self.queue.get()
        if msg is None:
            raise StopAsyncIteration
        return msg

    async def close(self) -> None:
        self.queue.put_nowait(None)


class FakeManager:
    """The client calls `open_forward` makes: start_app answers `token` (the app's own secret, or none)."""

    def __init__(self, token: str = "") -> None:
        self.token = token
        self.tunnels: list[FakeTunnel] = []

    async def start_app(self, session_id: str, app: str) -> dict[str, Any]:
        return {"app": app, "started": True, "token": self.token}

    async def app_tunnel(self, session_id: str, app: str) -> FakeTunnel:
        self.tunnels.append(FakeTunnel())
        return self.tunnels[-1]


async def exchange(port: int, request: bytes, timeout: float = 10) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()


def get(target: str, *headers: str) -> bytes:
    return ("\r\n".join([f"GET {target} HTTP/1.1", "Host: 127.0.0.1", *headers]) + "\r\n\r\n").encode()


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS:")).split()[1])


async def forwarded(manager: FakeManager) -> tuple[Any, int, str]:
    forward = await open_forward(manager, SESSION, HTTP_APP, "127.0.0.1", 0, out=open(os.devnull, "w"))
    port = forward.server.sockets[0].getsockname()[1]
    return forward, port, forward.token


async def test_without_the_token_a_connection_gets_403_and_never_a_tunnel() -> None:
    manager = FakeManager()
    forward, port, token = await forwarded(manager)
    try:
        assert re.fullmatch(rf"http://127\.0\.0\.1:{port}/lab\?token=[A-Za-z0-9_-]{{32}}", forward.url), forward.url
        attempts = [
            get("/api/contents"),
            get("/api/contents?token=wrong"),
            get(f"/api/contents?token={token[:-1]}"),
            get("/api/contents", f"Cookie: bai-app-{port}=nope; other=1"),
            get("/api/contents", f"Cookie: bai-app-{port + 1}={token}"),  # another listener's cookie name
            get("/api/contents", "Authorization: token nope"),
            get(f"/api/contents#token={token}"),
        ]
        for request in attempts:
            answer = await exchange(port, request)
            assert answer.startswith(b"HTTP/1.1 403 Forbidden\r\n"), (request, answer[:200])
            assert b"bai session app" in answer and token.encode() not in answer
        answer = await exchange(port, b"\x16\x03\x01 not http at all\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 400 Bad Request"), answer[:100]
        put = b"PUT /api/contents/x.txt HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello"
        assert (await exchange(port, put)).startswith(b"HTTP/1.1 403")
        assert manager.tunnels == []  # nothing an unauthenticated peer sent reached the session
        assert forward.proxy.gate.refused == len(attempts) + 2
    finally:
        await forward.close()


async def test_the_url_opens_it_and_the_cookie_it_sets_then_suffices() -> None:
    manager = FakeManager()
    forward, port, token = await forwarded(manager)
    try:
        first = get(f"/lab?token={token}")
        answer = await exchange(port, first)
        cookie = f"bai-app-{port}={token}"
        assert answer == ANSWER.replace(
            b"\r\n", f"\r\nSet-Cookie: {cookie}; Path=/; HttpOnly; SameSite=Lax\r\n".encode(), 1
        )
        assert manager.tunnels[-1].sent == first  # the app gets the request as it was sent
        later = get("/api/contents", f"Cookie: _xsrf=1; {cookie}")
        assert await exchange(port, later) == ANSWER  # the cookie lets it in, and is not set again
        assert manager.tunnels[-1].sent == later
        assert await exchange(port, get("/api/contents", f"Authorization: token {token}")) != b""
        assert len(manager.tunnels) == 3 and forward.proxy.gate.refused == 0
    finally:
        await forward.close()


async def test_an_apps_own_secret_is_what_the_listener_asks_for() -> None:
    secret = "S3cr3t-" + "x" * 25
    forward, port, token = await forwarded(FakeManager(secret))
    try:
        assert token == secret and forward.url == f"http://127.0.0.1:{port}/lab?token={secret}"
    finally:
        await forward.close()


async def test_floods_of_idle_and_oversized_connections_are_shed_and_cost_nothing_after(monkeypatch) -> None:
    monkeypatch.setattr(cli_apps, "HEAD_TIMEOUT", 0.5)
    manager = FakeManager()
    forward, port, token = await forwarded(manager)
    try:
        await exchange(port, get(f"/?token={token}"))  # warm: one tunnel, so later figures are steady
        fds0, rss0 = fds(), rss_kib()
        gate = forward.proxy.gate
        refused0 = gate.refused
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(300)]
        await asyncio.sleep(0.1)
        assert gate.waiting <= cli_apps.MAX_WAITING
        answers = await asyncio.wait_for(asyncio.gather(*(r.read() for r, _ in idle)), 10)
        timed_out = sum(a.startswith(b"HTTP/1.1 408") for a in answers)
        assert all(a == b"" or a.startswith(b"HTTP/1.1 408") for a in answers)  # the rest: closed at once
        # all 300 refused; at most MAX_WAITING wait at once, the others are closed at once, unanswered (on a slow
        # machine the first ones' half second may run out while the last connect, which frees places for later ones)
        assert timed_out >= cli_apps.MAX_WAITING and gate.refused - refused0 == 300, (timed_out, gate.refused)
        assert gate.waiting == 0
        for _, w in idle:
            w.close()
        huge = b"GET / HTTP/1.1\r\nX-Fill: " + b"a" * (cli_apps.HEAD_LIMIT + 1024)
        answer = await exchange(port, huge)
        assert answer.startswith(b"HTTP/1.1 431"), answer[:80]
        await asyncio.sleep(0.2)
        fds1, rss1 = fds(), rss_kib()
        print(f"fds {fds0} -> {fds1}, RSS {rss0} -> {rss1} KiB after 300 idle connections and a 65 KiB head")
        assert fds1 <= fds0 + 2 and rss1 - rss0 < 16 * 1024
        assert len(manager.tunnels) == 1
        assert await exchange(port, get(f"/?token={token}")) != b""  # still serves its owner
    finally:
        await forward.close()


TOKEN = "T" * 8 + "oken-0123456789abcdefghij"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=2048))
def test_no_head_without_the_token_is_let_in(head: bytes) -> None:
    gate = Gate(TOKEN, "web")
    gate.port = 8080
    assert not gate.how(head + b"\r\n\r\n")


header_text = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["GET", "POST", "PUT", "DELETE", "OPTIONS"]),
    st.text(st.characters(min_codepoint=33, max_codepoint=126, exclude_characters="?#&"), max_size=30),
    st.lists(st.tuples(header_text.filter(lambda t: ":" not in t and t.strip()), header_text), max_size=6),
    st.sampled_from(["query", "cookie", "header"]),
)
def test_a_head_carrying_the_token_anywhere_is_let_in(method, path, headers, where) -> None:
    gate = Gate(TOKEN, "web")
    gate.port = 8080
    target = f"/{path}" + (f"?a=1&token={TOKEN}" if where == "query" else "")
    lines = [f"{method} {target} HTTP/1.1", *(f"{k}: {v}" for k, v in headers)]
    if where == "cookie":
        lines.append(f"Cookie: x=y; bai-app-8080={TOKEN}")
    elif where == "header":
        lines.append(f"Authorization: token {TOKEN}")
    assert gate.how(("\r\n".join(lines) + "\r\n\r\n").encode()) == where
    wrong = "\r\n".join(lines).replace(TOKEN, TOKEN[:-1] + "X") + "\r\n\r\n"
    assert gate.how(wrong.encode()) == ""


# ---------------------------------------------------------------------------------------------------------
# a real JupyterLab in a Docker kernel


def status_of(opener: urllib.request.OpenerDirector, url: str, method: str = "GET", body: bytes | None = None) -> int:
    request = urllib.request.Request(url, data=body, method=method)
    try:
        with opener.open(request, timeout=20) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def wait_answering(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=10).close()
            return
        except urllib.error.HTTPError:
            return  # it answers (403 and the like are answers)
        except OSError:
            assert time.monotonic() < deadline, f"nothing answered at {url}"
            time.sleep(0.2)


async def raw_through_tunnel(client: Any, session_id: str, request: bytes) -> bytes:
    """What JupyterLab answers `request` through a tunnel of its own (what the official client opens: no
    listener of bai's in between)."""
    ws = await client.app_tunnel(session_id, "jupyterlab")
    try:
        await ws.send_bytes(request)
        got = b""
        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.BINARY:
                got += msg.data
                if b"\r\n\r\n" in got:
                    break
        return got
    finally:
        await ws.close()


def node_figures(node: Node) -> tuple[int, int]:
    """The node process's open file descriptors and RSS (KiB)."""
    assert node.proc is not None
    pid = node.proc.pid
    with open(f"/proc/{pid}/status") as f:
        rss = int(next(line for line in f if line.startswith("VmRSS:")).split()[1])
    return len(os.listdir(f"/proc/{pid}/fd")), rss


@pytest.mark.docker
@pytest.mark.timeout(300)
def test_jupyterlab_lets_in_its_owner_only(docker_node: Node, jupyter_image: str, tmp_path: Path) -> None:  # noqa: F811
    name = f"nb-{uuid.uuid4().hex[:6]}"
    docker_node.cli("session", "create", "--name", name, "--mem", "1g", jupyter_image, check=True, timeout=120)
    sid = docker_node.json("session", "info", name)["id"]
    port = free_port()
    proc = docker_node.popen("session", "app", name, "jupyterlab", "--bind", f"127.0.0.1:{port}")
    official = None
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        m = re.fullmatch(rf"http://127\.0\.0\.1:{port}/lab\?token=([A-Za-z0-9_-]{{32}})", url)
        assert m, (url, proc.stderr.read() if proc.poll() is not None else "")
        token, base = m[1], f"http://127.0.0.1:{port}"
        wait_answering(f"{base}/")

        # another local process at the forwarded port: refused before anything reaches the session
        stranger = urllib.request.build_opener()
        assert status_of(stranger, f"{base}/api/contents") == 403
        assert (
            status_of(
                stranger, f"{base}/api/contents/evil.txt", "PUT", b'{"type":"file","format":"text","content":"x"}'
            )
            == 403
        )
        assert status_of(stranger, f"{base}/api/kernels", "POST", b"{}") == 403
        assert status_of(stranger, f"{base}/lab?token=guess") == 403

        # the owner: the URL works, and then the cookies alone do (the browser's later requests)
        jar = http.cookiejar.CookieJar()
        owner = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        assert status_of(owner, url) == 200
        assert {c.name for c in jar} >= {f"bai-app-{port}"}, [c.name for c in jar]
        assert status_of(owner, f"{base}/api/contents") == 200

        # the app's own secret, without bai's listener (a tunnel as the official client opens it)
        client = node_client(docker_node)

        async def own_secret() -> tuple[bytes, bytes, bytes, list[dict], tuple[int, int], tuple[int, int]]:
            plain = b"GET /api/contents HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
            body = b'{"type":"file","format":"text","content":"pwned"}'
            put = (
                b"PUT /api/contents/pwned.txt HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
            )
            refused = await raw_through_tunnel(client, sid, plain)
            refused_put = await raw_through_tunnel(client, sid, put)
            with_token = await raw_through_tunnel(
                client, sid, plain.replace(b"contents", b"contents?token=" + token.encode())
            )
            listing = await client.apps(sid)
            before = node_figures(docker_node)
            for _ in range(30):  # a stranger with a keypair of the owner's would still meet Jupyter's 403
                assert (await raw_through_tunnel(client, sid, plain)).startswith(b"HTTP/1.1 403")
            await asyncio.sleep(0.5)
            after = node_figures(docker_node)
            await client.close()
            return refused, refused_put, with_token, listing, before, after

        refused, refused_put, with_token, listing, before, after = asyncio.run(own_secret())
        assert refused.startswith(b"HTTP/1.1 403"), refused[:200]
        assert refused_put.startswith(b"HTTP/1.1 403"), refused_put[:200]
        assert with_token.startswith(b"HTTP/1.1 200"), with_token[:200]
        print(f"node fds {before[0]} -> {after[0]}, RSS {before[1]} -> {after[1]} KiB after 30 refused tunnels")
        assert after[0] <= before[0] + 5 and after[1] - before[1] < 32 * 1024
        (lab,) = [a for a in listing if a["name"] == "jupyterlab"]
        assert lab["token"] == token and lab["url_template"] == "{protocol}://{host}:{port}/lab?token=" + token
        # the official client prints the owner's URL (the listing's url_template), and Jupyter's login takes it
        official_port = free_port()
        official = Official(official_client(), docker_node, tmp_path).popen(
            "app", name, "jupyterlab", "-b", f"127.0.0.1:{official_port}"
        )
        wait_answering(f"http://127.0.0.1:{official_port}/")
        assert status_of(stranger, f"http://127.0.0.1:{official_port}/api/contents") == 403
        assert status_of(stranger, f"http://127.0.0.1:{official_port}/api/contents?token={token}") == 200

        # another user: neither the token nor a tunnel
        other = docker_node.json("keypair", "create", "--user", f"nb-other-{uuid.uuid4().hex[:4]}")
        stranger_client = node_client(docker_node, other)

        async def as_other() -> list[int]:
            statuses = []
            for call in (
                stranger_client.apps(sid),
                stranger_client.start_app(sid, "jupyterlab"),
                stranger_client.app_tunnel(sid, "jupyterlab"),
            ):
                try:
                    await call
                    statuses.append(200)
                except Exception as e:
                    statuses.append(getattr(e, "status", 0))
            await stranger_client.close()
            return statuses

        assert asyncio.run(as_other()) == [404, 404, 404]
        out = docker_node.cli("session", "app", name, "jupyterlab", as_keypair=other, timeout=30)
        assert out.returncode != 0 and token not in out.stdout + out.stderr
    finally:
        if official is not None:
            official.terminate()
            printed = official.communicate(timeout=20)[0]
        docker_node.cli("session", "destroy", name, check=True)
        proc.wait(30)
    assert f"://127.0.0.1:{official_port}/lab?token={token}" in printed, printed  # (23.9 says tcp:// for all)
