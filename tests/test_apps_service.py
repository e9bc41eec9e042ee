"""Apps of sessions through the manager's Apps service and the agent, in the in-process harness (the sim
backend serves echo apps on real 127.0.0.1 sockets): what a session offers, starting, tunnels and their
flow, failures that say why, and tunnels ending with their session."""

from __future__ import annotations

import asyncio

import pytest

from bai.common import service_ports as apps
from bai.common.service_ports import PortPool, PortPoolExhausted, ServicePortError
from bai.node.manager.domain_errors import AppFailed, AppNotFound, Invalid
from bai.node.manager.http.problems import problem_of
from tests.harness import Harness

APPS = "echo:tcp:7000,web:http:[8080,8081],broken:tcp:7001,term:pty:7681"


async def started(h: Harness, name: str = "sess1") -> dict:
    await h.add_agent("a1", apps=APPS)
    return await h.run(name)


async def test_a_session_offers_its_images_apps_in_order_without_pty(tmp_path):
    async with Harness(tmp_path) as h:
        row = await started(h)
        offered = await h.services.apps.offered(row)
        assert [(a.name, a.protocol, a.container_ports) for a in offered] == [
            ("echo", "tcp", (7000,)),
            ("web", "http", (8080, 8081)),
            ("broken", "tcp", (7001,)),
        ]


async def test_a_tunnel_carries_bytes_both_ways_and_the_app_starts_once(tmp_path):
    async with Harness(tmp_path) as h:
        row = await started(h)
        kernel, sp, first = await h.services.apps.start(row, "echo")
        _, _, again = await h.services.apps.start(row, "echo")
        assert (sp.name, first, again) == ("echo", True, False)
        stream = await h.services.apps.open_tunnel(row, kernel, "echo")
        payload = bytes(range(256)) * 4096  # 1 MiB: many frames, flow control in play
        await stream.send({"t": "data", "d": payload})
        await stream.send({"t": "eof"})
        got = b""
        while (frame := await stream.receive()) is not None:
            if frame["t"] == "eof":
                break
            got += frame["d"]
        assert got == payload
        await stream.close()


async def test_an_app_that_fails_to_start_is_a_409_with_its_output(tmp_path):
    async with Harness(tmp_path) as h:
        row = await started(h)
        with pytest.raises(AppFailed) as err:
            await h.services.apps.start(row, "broken")
        problem = problem_of(err.value)
        assert problem.status == 409
        assert "exited with code 1" in problem.msg and "boom" in problem.msg
        assert problem.data["output"] == "boom\n"


async def test_an_unknown_app_is_a_404_naming_the_apps(tmp_path):
    async with Harness(tmp_path) as h:
        row = await started(h)
        with pytest.raises(AppNotFound) as err:
            await h.services.apps.start(row, "jupyter")
        problem = problem_of(err.value)
        assert problem.status == 404 and "echo, web, broken" in problem.msg


async def test_apps_of_a_session_that_is_not_running_are_refused(tmp_path):
    async with Harness(tmp_path) as h:
        await h.add_agent("a1", apps=APPS, cpu=1)
        await h.run("sess1")
        await h.create("sess2")  # waits: the agent is full
        await h.schedule()
        row = await h.row("sess2")
        with pytest.raises(Invalid) as err:
            await h.services.apps.start(row, "echo")
        problem = problem_of(err.value)
        assert problem.status == 400 and "PENDING" in problem.msg


async def test_a_tunnel_ends_when_its_session_ends_and_says_so(tmp_path):
    async with Harness(tmp_path) as h:
        row = await started(h)
        kernel, _, _ = await h.services.apps.start(row, "echo")
        stream = await h.services.apps.open_tunnel(row, kernel, "echo")
        await stream.send({"t": "data", "d": b"ping"})
        assert (await stream.receive())["d"] == b"ping"
        await h.destroy("sess1")
        assert await asyncio.wait_for(stream.receive(), 5) is None
        assert stream.closed_reason == "the kernel ended"


async def test_a_tunnel_to_an_app_that_is_not_running_starts_it_or_says_why(tmp_path):
    async with Harness(tmp_path) as h:
        row = await started(h)
        kernel, _, _ = await h.services.apps.start(row, "echo")
        stream = await h.services.apps.open_tunnel(row, kernel, "web")  # never started: the agent starts it
        await stream.send({"t": "data", "d": b"up"})
        assert (await asyncio.wait_for(stream.receive(), 5))["d"] == b"up"
        await stream.close()
        stream = await h.services.apps.open_tunnel(row, kernel, "broken")
        assert await asyncio.wait_for(stream.receive(), 5) is None
        assert stream.closed_reason == "broken did not start: broken exited with code 1 while starting\nboom"


async def test_later_connections_do_not_ask_the_agent_to_start_the_app_again(tmp_path):
    async with Harness(tmp_path) as h:
        row = await started(h)
        kernel = await h.services.apps.ensure_started(row, "echo")
        calls = []
        agent = h.agent("a1")
        original = agent.apps.start

        async def counting(k, name):
            calls.append(name)
            return await original(k, name)

        agent.apps.start = counting
        assert (await h.services.apps.ensure_started(row, "echo")).id == kernel.id
        assert calls == []


async def test_twenty_tunnels_at_once_stay_apart(tmp_path):
    async with Harness(tmp_path) as h:
        row = await started(h)
        kernel, _, _ = await h.services.apps.start(row, "echo")

        async def one(i: int) -> bytes:
            stream = await h.services.apps.open_tunnel(row, kernel, "echo")
            data = bytes([i]) * 300_000
            await stream.send({"t": "data", "d": data})
            await stream.send({"t": "eof"})
            got = b""
            while (frame := await stream.receive()) is not None and frame["t"] == "data":
                got += frame["d"]
            await stream.close()
            return got

        results = await asyncio.gather(*(one(i) for i in range(20)))
        assert results == [bytes([i]) * 300_000 for i in range(20)]


# -- the label and the port pool (pure) ------------------------------------------------------------------


def test_the_label_parses_as_backend_ai_writes_it():
    parsed = apps.parse("jupyter:http:8080, jupyterlab:http:8090,vscode:http:[8180,8181],shell:pty:7681")
    assert [(p.name, p.protocol, p.container_ports) for p in parsed] == [
        ("jupyter", "http", (8080,)),
        ("jupyterlab", "http", (8090,)),
        ("vscode", "http", (8180, 8181)),
    ]
    assert apps.parse("") == [] and apps.parse(None) == []


@pytest.mark.parametrize(
    "label",
    ["jupyter:http", "jupyter:udp:8080", "a:http:80", "a:http:70000", "a:http:x", "a:http:8080,a:tcp:8081",
     "a:http:8080,b:tcp:8080", "../x:http:8080", "a:http:[]"],
)  # fmt: skip
def test_a_malformed_label_says_which_entry(label):
    with pytest.raises(ServicePortError, match="ai.backend.service-ports"):
        apps.parse(label)


def test_the_api_shape_is_backend_ais():
    (sp,) = apps.parse("jupyterlab:http:8090")
    assert apps.to_api(sp) == {
        "name": "jupyterlab",
        "protocol": "http",
        "ports": [8090],
        "url_template": "{protocol}://{host}:{port}/lab",
        "allowed_arguments": {},
        "allowed_envs": {},
    }


def test_the_port_pool_gives_out_each_port_once_and_says_when_it_is_exhausted():
    pool = PortPool(30000, 30004)
    a = pool.take("k1", 3)
    b = pool.take("k2", 2)
    assert sorted(a + b) == list(range(30000, 30005))
    with pytest.raises(PortPoolExhausted, match=r"30000-30004.*0 free ports; this kernel's apps need 1"):
        pool.take("k3", 1)
    pool.release("k1")
    assert pool.free == 3 and sorted(pool.take("k3", 3)) == sorted(a)
    pool.hold("k4", [30000, 40000])  # an adopted kernel's port outside the range is not the pool's
    assert pool.free == 0


@pytest.mark.parametrize("text", ["30000", "31000-30000", "0-10", "a-b", "1-70000"])
def test_a_bad_port_range_is_refused(text):
    with pytest.raises(ValueError, match="port_range"):
        apps.parse_range(text)


async def test_session_info_graphql_and_the_dashboard_show_the_apps(tmp_path):
    import json

    from bai.node.manager.http.represent import session_graphql, session_json, session_view

    async with Harness(tmp_path) as h:
        row = await started(h)
        api = await session_json(h.services, row)
        assert [a["name"] for a in api["servicePorts"]] == ["echo", "web", "broken"]
        assert api["servicePorts"][1] == {
            "name": "web",
            "protocol": "http",
            "ports": [8080, 8081],
            "url_template": "{protocol}://{host}:{port}/",
            "allowed_arguments": {},
            "allowed_envs": {},
            "host_ports": [],
        }
        gql = await session_graphql(h.services, row)
        assert [a["name"] for a in json.loads(gql["service_ports"])] == ["echo", "web", "broken"]
        assert [a["name"] for a in json.loads(gql["containers"][0]["service_ports"])] == ["echo", "web", "broken"]
        dash = (await session_view(h.services, row)).to_dashboard()
        assert dash["servicePorts"][0] == {"name": "echo", "protocol": "tcp", "ports": [7000]}


async def test_an_apps_secret_reaches_the_owners_listing_once_started_and_only_a_real_one(tmp_path):
    """What the kernel's runner answers as an app's token (bai/node/agent/runner.py start-service) is kept
    by the manager for the listing and start reply of the session's owner; anything that is not a token
    (a runner of a compromised kernel answering garbage) is dropped on the agent's side."""
    secret = "s3cret-" + "a" * 25
    async with Harness(tmp_path) as h:
        row = await started(h)
        backend = h.nodes["a1"].backend
        answers = {"echo": secret, "web": "not a token!\r\nSet-Cookie: x"}
        plain_start = backend.start_app

        async def start_app(kernel, app, timeout):
            reply = await plain_start(kernel, app, timeout)
            return {**reply, "token": answers.get(app.name, "")}

        backend.start_app = start_app
        before = {a["name"]: a for a in await h.services.apps.listed(row)}
        assert "token" not in before["echo"] and "?" not in before["echo"]["url_template"]
        kernel, _, _ = await h.services.apps.start(row, "echo")
        await h.services.apps.start(row, "web")
        after = {a["name"]: a for a in await h.services.apps.listed(row)}
        assert after["echo"]["token"] == secret and after["echo"]["url_template"].endswith(f"?token={secret}")
        assert "token" not in after["web"] and after["web"]["url_template"] == "{protocol}://{host}:{port}/"
        assert h.services.apps.token(kernel, "web") == ""


def test_a_token_goes_into_a_url_once_and_urlencoded():
    assert apps.with_token("{protocol}://{host}:{port}/lab", "") == "{protocol}://{host}:{port}/lab"
    assert apps.with_token("http://h:1/lab?x=1&token=old#f", "new-tok_1") == "http://h:1/lab?x=1&token=new-tok_1#f"
    assert apps.with_token("http://h:1/", "a/b c") == "http://h:1/?token=a%2Fb%20c"
