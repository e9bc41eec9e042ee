"""Every session status × every request on a session × who asks (its owner, another user, an admin): never a
5xx. A request the status cannot serve is a 4xx that says the status (409, or 403 for a destroy that needs
forced); another user's session is not found (404); a forced destroy by the owner or an admin always ends a
live session and leaves no kernel on any agent (one that is away: once it is back).

The real HTTP API (bai/node/manager/http/app.py make_app, signed requests) over the in-process harness
(tests/harness.py), in which each status is reached the way the node reaches it (or, for the short-lived
RESTARTING, RUNNING_DEGRADED and TERMINATING, recorded as the node would on the way)."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from bai import API_VERSION
from bai.common import auth
from bai.common.status import DEAD_STATUSES, SessionStatus
from bai.node.link.messages import KernelPulling
from bai.node.manager.http.app import make_app
from tests.harness import Harness

S = SessionStatus
STATUSES = [
    "PENDING",
    "SCHEDULED",
    "PREPARING",
    "PULLING",
    "RUNNING",
    "RESTARTING",
    "RUNNING_DEGRADED",
    "TERMINATING",
    "TERMINATED",
    "CANCELLED",
    "ERROR",
]
FORCED_ONLY = {"SCHEDULED", "PREPARING", "PULLING", "TERMINATING", "ERROR"}
SERVING = {"RUNNING", "RUNNING_DEGRADED"}  # statuses whose kernel runs code, takes files, restarts


@dataclass
class Caller:
    access_key: str
    secret_key: str


class Api:
    """Signed requests to the node's API, as Backend.AI clients sign them."""

    def __init__(self, client: TestClient) -> None:
        self.client = client

    async def call(self, who: Caller, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """The answer's status and body; method "WS": a WebSocket's opening (101 when it opens; a refusal's
        status and body otherwise)."""
        if method == "WS":
            return await self.websocket(who, path)
        host = f"{self.client.host}:{self.client.port}"
        date = auth.now_header()
        data: Any = None
        if body == "upload":
            form = aiohttp.FormData()
            form.add_field("src", b"hello\n", filename="hello.txt", content_type="application/octet-stream")
            data = form()
            ctype = data.content_type.split(";")[0]
        elif body is not None:
            data, ctype = json.dumps(body).encode(), "application/json"
        else:
            ctype = "application/octet-stream"
        sig = auth.sign(who.secret_key, method, path, date, host, ctype, API_VERSION)
        headers = {
            "Date": date,
            "X-BackendAI-Version": API_VERSION,
            "Authorization": f"BackendAI signMethod=HMAC-SHA256, credential={who.access_key}:{sig}",
        }
        if body != "upload":
            headers["Content-Type"] = ctype
        async with self.client.request(method, path, data=data, headers=headers) as resp:
            raw = await resp.read()
            try:
                return resp.status, json.loads(raw) if raw else None
            except ValueError:
                return resp.status, raw.decode(errors="replace")

    def _signed(self, who: Caller, method: str, path: str, ctype: str) -> dict[str, str]:
        host = f"{self.client.host}:{self.client.port}"
        date = auth.now_header()
        sig = auth.sign(who.secret_key, method, path, date, host, ctype, API_VERSION)
        return {
            "Date": date,
            "X-BackendAI-Version": API_VERSION,
            "Authorization": f"BackendAI signMethod=HMAC-SHA256, credential={who.access_key}:{sig}",
            "Content-Type": ctype,
        }

    async def websocket(self, who: Caller, path: str) -> tuple[int, Any]:
        try:
            ws = await self.client.ws_connect(path, headers=self._signed(who, "GET", path, "application/octet-stream"))
        except aiohttp.WSServerHandshakeError:  # refused before the upgrade: ask again to read the answer
            upgrade = {
                "Connection": "Upgrade",
                "Upgrade": "websocket",
                "Sec-WebSocket-Version": "13",
                "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(),
            }
            headers = {**self._signed(who, "GET", path, "application/octet-stream"), **upgrade}
            async with self.client.request("GET", path, headers=headers) as resp:
                raw = await resp.read()
                return resp.status, json.loads(raw) if raw else None
        await ws.close()
        return 101, None


@pytest.fixture
async def api_node(tmp_path) -> AsyncIterator[tuple[Harness, Api, dict[str, Caller]]]:
    async with Harness(tmp_path, lost_grace=0.01) as h:
        owner = await h.keypair("owner-1")
        other = await h.keypair("other-1")
        keypairs = await h.store.keypairs()
        settings = {"keypairs": keypairs, "default_resources": h.defaults, "cluster": None}
        client = TestClient(TestServer(make_app(h.manager.services, settings)))
        await client.start_server()
        try:
            callers = {
                who: Caller(ak, keypairs[ak].secret_key)
                for who, ak in (("owner", owner), ("other", other), ("admin", h.admin))
            }
            yield h, Api(client), callers
        finally:
            await client.close()


async def _into(h: Harness, status: str, names: list[str], owner: str) -> str:
    """Sessions of `owner` named `names`, all in `status`; the agent their kernels are on."""
    if status in ("PREPARING", "PULLING"):
        await h.add_agent("slow", cpu=16, mem="64g", start_delay=60)  # their kernels take a minute to start
        for name in names:
            await h.create(name, owner=owner)
        await h.schedule()
        for name in names:
            row = await h.wait(name, "PREPARING")
            if status == "PULLING":
                [kernel] = await h.store.kernels_of(row.id)
                await h.lifecycle.kernel_pulling(KernelPulling(kernel.id, row.id, "python", 1, 2))
        return "slow"
    # kernels outlive it, as containers do; they offer an echo app
    await h.add_agent("a1", cpu=16, mem="64g", keeps_kernels=True, apps="echo:tcp:7000")
    for name in names:
        row = await h.create(name, owner=owner)
        if status == "SCHEDULED":  # placed by a round whose start has not begun
            [kernel] = await h.store.kernels_of(row.id)
            await h.store.apply_round([(row.id, {kernel.id: "a1"})], [], [], [], h.clock.now())
        elif status == "CANCELLED":
            await h.destroy(name, owner=owner)
    if status in ("PENDING", "SCHEDULED", "CANCELLED"):
        return "a1"
    await h.schedule()
    for name in names:
        row = await h.wait(name, "RUNNING")
        if status in ("RESTARTING", "RUNNING_DEGRADED", "TERMINATING"):
            await h.lifecycle.transition(row.id, S(status), "", {}, allowed_from=[S.RUNNING])
        elif status == "TERMINATED":
            await h.destroy(name, owner=owner)
    if status == "ERROR":
        await h.lose_agent("a1")  # the grace period runs out: agent-lost
    for name in names:
        assert await h.status(name) == status
    return "a1"


def _probes(ref: str) -> list[tuple[str, str, Any]]:
    """Every request on one session but destroy: (method, path, body)."""
    return [
        ("GET", f"/session/{ref}", None),
        ("POST", f"/session/{ref}", {"mode": "query", "code": "print(1)"}),  # execute
        ("PATCH", f"/session/{ref}", None),  # restart
        ("POST", f"/session/{ref}/upload", "upload"),
        ("GET", f"/session/{ref}/files", None),
        ("GET", f"/session/{ref}/logs", None),
        ("POST", f"/session/{ref}/interrupt", None),
        ("GET", f"/session/{ref}/download?files=hello.txt", None),
        ("GET", f"/session/{ref}/status-history", None),
    ]


@pytest.mark.parametrize("status", STATUSES)
async def test_no_request_in_any_status_by_anyone_is_a_5xx(api_node, status: str) -> None:
    h, api, callers = api_node
    agent = await _into(h, status, ["sweep-a", "sweep-b"], callers["owner"].access_key)
    a, b = await h.row("sweep-a"), await h.row("sweep-b")
    refs = {"owner": "sweep-a", "other": a.id, "admin": a.id}
    seen = []
    for who, ref in refs.items():
        for method, path, body in _probes(ref):
            code, answer = await api.call(callers[who], method, path, body)
            seen.append((who, method, path.split("/")[-1].split("?")[0], code))
            assert code < 500, (who, method, path, code, answer)
            if who == "other":
                assert code == 404, (method, path, code, answer)  # another user's session is not there
            elif method in ("POST", "PATCH") and path.endswith((a.id, "sweep-a", "/upload")):
                # execute, restart, upload: served when the kernel runs, else a 409 saying the status
                if status in SERVING and not (method == "PATCH" and status != "RUNNING"):  # restart: RUNNING only
                    assert code in (200, 204), (who, method, path, code, answer)
                elif S(status) in DEAD_STATUSES:
                    assert code in (404, 409), (who, method, path, code, answer)
                else:
                    assert code == 409 and status in answer["msg"], (who, method, path, code, answer)
    # destroy: another user cannot; the owner without forced only where Backend.AI allows it, with forced always
    code, answer = await api.call(callers["other"], "DELETE", f"/session/{a.id}?forced=true")
    assert code == 404, answer
    code, answer = await api.call(callers["owner"], "DELETE", "/session/sweep-a")
    assert code < 500, answer
    if status in FORCED_ONLY:
        assert code == 403 and "forced=true" in answer["msg"] and status in answer["msg"], answer
        assert await h.status("sweep-a") == status  # nothing changed
    live = S(status) not in DEAD_STATUSES
    code, answer = await api.call(callers["owner"], "DELETE", f"/session/{a.id}?forced=true")
    assert code < 500, answer
    code, answer = await api.call(callers["admin"], "DELETE", f"/session/{b.id}?forced=true")
    assert code == (200 if live else 404), answer
    for row in (a, b):
        assert S(await h.status(row.id)) in DEAD_STATUSES
    if status == "ERROR":
        assert h.kernels_on(agent)  # its agent is away: the kernels go when it is back
        await h.start_agent(agent, keep_kernels=True)
    assert h.kernels_on(agent) == set()


# Every operation on a session's kernels (what KernelOps, Apps and the log routes serve): (what, method, path, body)
KERNEL_OPERATIONS = [
    ("execute", "POST", "/session/{ref}", {"mode": "query", "code": "print(1)"}),
    ("interrupt", "POST", "/session/{ref}/interrupt", None),
    ("upload", "POST", "/session/{ref}/upload", "upload"),
    ("list files", "GET", "/session/{ref}/files", None),
    ("download", "GET", "/session/{ref}/download?files=hello.txt", None),
    ("restart", "PATCH", "/session/{ref}", None),
    ("commit", "POST", "/session/{ref}/commit", None),
    ("rename", "POST", "/session/{ref}/rename?name={ref}", None),  # (to its own name: nothing changes)
    ("terminal", "WS", "/stream/session/{ref}/pty", None),
    ("apps", "GET", "/stream/session/{ref}/apps", None),
    ("app start", "POST", "/stream/session/{ref}/apps/echo/start", None),
    ("app tunnel", "WS", "/stream/session/{ref}/tcpproxy?app=echo", None),
    ("logs", "GET", "/session/{ref}/logs", None),
]
# what needs the session's kernel running: a 409 naming the status otherwise (a restart: RUNNING only)
NEEDS_KERNEL = {"execute", "upload", "list files", "download", "restart", "commit", "terminal"}
NEEDS_APP = {"app start", "app tunnel"}  # a 400 naming the status otherwise (as the apps have always answered)
SWEPT = ["PENDING", "SCHEDULED", "PREPARING", "RUNNING", "TERMINATING", "TERMINATED", "CANCELLED", "ERROR"]


@pytest.mark.parametrize("status", SWEPT)
async def test_every_kernel_operation_in_every_status_is_served_or_a_4xx_naming_the_status(api_node, status) -> None:
    """Execute, interrupt, files, restart, commit, rename, terminal, apps and logs on a session in each status,
    by its owner: never a 5xx; what needs a running kernel is a 409 (apps: a 400) whose message names the
    status and says what to do; an ended session's operations are not found (404), its logs still read."""
    h, api, callers = api_node
    await _into(h, status, ["sweep-a", "sweep-b"], callers["owner"].access_key)
    owner = callers["owner"]
    serving = status in SERVING
    answers = {}
    for what, method, path, body in KERNEL_OPERATIONS:
        code, answer = await api.call(owner, method, path.format(ref="sweep-a"), body)
        answers[what] = code
        assert code < 500, (what, status, code, answer)
        if S(status) in DEAD_STATUSES:
            assert code == (200 if what == "logs" else 404), (what, status, code, answer)
        elif serving:
            assert code != 409, (what, status, code, answer)
        elif what in NEEDS_KERNEL or what in NEEDS_APP:
            assert code == (400 if what in NEEDS_APP else 409), (what, status, code, answer)
            assert f"is {status}" in answer["msg"], (what, status, answer)
            if what in NEEDS_KERNEL:
                assert answer["data"] == {"status": status}
                assert any(say in answer["msg"] for say in ("wait until it is RUNNING", "forced=true", "it has ended"))
    if serving:  # served: the kernel ran the code, took the file, opened the terminal and the app
        assert answers["execute"] == 200 and answers["upload"] == 204 and answers["list files"] == 200
        assert answers["terminal"] == 101 and answers["app start"] == 200 and answers["app tunnel"] == 101
        assert answers["restart"] == 204 and answers["rename"] == 204
        assert await h.status("sweep-a") == "RUNNING"


async def test_a_kernel_whose_agent_is_away_answers_503_for_every_operation(api_node) -> None:
    """A RUNNING session whose agent's link went away (not yet lost): every operation that asks the agent is a
    503 saying the agent is not connected (not a 400 for some and a 500 for others), and nothing changes."""
    h, api, callers = api_node
    await _into(h, "RUNNING", ["away-a", "away-b"], callers["owner"].access_key)
    await h.stop_agent("a1")
    owner = callers["owner"]
    for what, method, path, body in KERNEL_OPERATIONS:
        if what not in NEEDS_KERNEL | NEEDS_APP:
            continue
        code, answer = await api.call(owner, method, path.format(ref="away-a"), body)
        assert code == 503, (what, code, answer)
        assert answer["type"].endswith("/instance-not-available") and "not connected" in answer["msg"], answer
    assert await h.status("away-a") == "RUNNING"
