"""An agent with several managers (managers of one database): `FanoutAgentLink` over real ZeroMQ links on
127.0.0.1, and how `--manager` (repeated) / `[node] manager = [...]` reach the agent's link factory.

Every manager must get the agent's registration and events and be able to call it; one manager going away
must not cost the others anything; a manager that starts after the agent gets it within a few seconds."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from bai.common import config
from bai.common.config import ConfigError
from bai.node.link.fanout import FanoutAgentLink
from bai.node.link.keys import ManagerSecrets, load_or_create
from bai.node.link.streams import LinkStream
from bai.node.link.zmq import LinkUnavailable, ZmqAgentLink, ZmqManagerLink
from tests.nodeproc import free_port

HEARTBEAT = 0.1
TIMEOUT = 0.6  # the managers declare a silent agent lost after this


class FakeManager:
    """Records what a manager's link hands it."""

    def __init__(self) -> None:
        self.joined: list[dict[str, Any]] = []
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.left: list[tuple[str, str]] = []

    async def agent_joined(self, agent_id: str, registration: dict[str, Any]) -> dict[str, Any]:
        self.joined.append(registration)
        return {"destroy": [], "joins": len(self.joined)}

    async def agent_event(self, agent_id: str, name: str, payload: dict[str, Any]) -> None:
        if name != "heartbeat":
            self.events.append((name, payload))

    async def agent_left(self, agent_id: str, reason: str) -> None:
        self.left.append((agent_id, reason))

    def names(self) -> list[str]:
        return [name for name, _ in self.events]


class FakeAgent:
    """Answers calls and streams, and records the answers of managers that took it after the first."""

    def __init__(self) -> None:
        self.rejoins: list[dict[str, Any]] = []

    async def registration(self) -> dict[str, Any]:
        return {"id": "agent-1", "slots": {"cpu": "4"}, "kernels": []}

    async def rejoined(self, answer: dict[str, Any]) -> None:
        self.rejoins.append(answer)

    def heartbeat(self) -> dict[str, Any]:
        return {"occupied_slots": {}, "kernels": []}

    async def handle_call(self, method: str, args: dict[str, Any]) -> Any:
        return {"method": method, "args": args}

    async def handle_stream(self, kind: str, args: dict[str, Any], stream: LinkStream) -> None:
        frame = await stream.receive()
        await stream.send({"echo": frame, "kind": kind})


async def wait_until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


class Cluster:
    """Managers (ZmqManagerLink, one key and token, as managers of one database have) and fanout agents."""

    def __init__(self, secrets: ManagerSecrets) -> None:
        self.secrets = secrets
        self.managers: list[ZmqManagerLink] = []
        self.agents: list[FanoutAgentLink] = []

    async def manager(self, handler: FakeManager, port: int = 0) -> ZmqManagerLink:
        link = ZmqManagerLink(f"tcp://127.0.0.1:{port}", self.secrets, heartbeat_timeout=TIMEOUT)
        await link.start(handler)
        self.managers.append(link)
        return link

    def agent(self, endpoints: list[str], join_timeout: float = 30.0, retry: float = 0.5) -> FanoutAgentLink:
        makers = [
            partial(
                ZmqAgentLink,
                "agent-1",
                endpoint,
                self.secrets.public_key,
                self.secrets.join_token,
                heartbeat_interval=HEARTBEAT,
                join_timeout=join_timeout,
            )
            for endpoint in endpoints
        ]
        link = FanoutAgentLink(makers, names=endpoints, retry_interval=retry)
        self.agents.append(link)
        return link

    async def close(self) -> None:
        for agent in self.agents:
            await agent.abort()
        for manager in self.managers:
            await manager.close()


@pytest.fixture
def secrets(tmp_path: Path) -> ManagerSecrets:
    return load_or_create(tmp_path)


@pytest.fixture
async def cluster(secrets: ManagerSecrets) -> AsyncIterator[Cluster]:
    made = Cluster(secrets)
    try:
        yield made
    finally:
        await made.close()


async def two_managers(cluster: Cluster) -> tuple[FakeManager, ZmqManagerLink, FakeManager, ZmqManagerLink]:
    fm1, fm2 = FakeManager(), FakeManager()
    return fm1, await cluster.manager(fm1), fm2, await cluster.manager(fm2)


def endpoint(link: ZmqManagerLink) -> str:
    assert link.endpoint is not None
    return link.endpoint


async def test_the_agent_registers_with_both_managers_and_both_can_call_it(cluster: Cluster) -> None:
    fm1, m1, fm2, m2 = await two_managers(cluster)
    fa = FakeAgent()
    agent = cluster.agent([endpoint(m1), endpoint(m2)])
    answer = await asyncio.wait_for(agent.join(fa), 10)
    assert answer["joins"] == 1
    await wait_until(lambda: len(fm1.joined) == 1 and len(fm2.joined) == 1)
    assert fm1.joined[0]["id"] == fm2.joined[0]["id"] == "agent-1"
    await wait_until(lambda: m1.connected() == m2.connected() == {"agent-1"})
    await wait_until(lambda: sorted(agent.joined()) == sorted([endpoint(m1), endpoint(m2)]))
    assert await m1.call("agent-1", "ping", {"from": 1}) == {"method": "ping", "args": {"from": 1}}
    assert await m2.call("agent-1", "ping", {"from": 2}) == {"method": "ping", "args": {"from": 2}}
    stream = await m2.open_stream("agent-1", "echo", {})  # streams too come through each link
    await stream.send({"x": 1})
    assert await asyncio.wait_for(stream.receive(), 5) == {"echo": {"x": 1}, "kind": "echo"}


async def test_events_and_reports_reach_both_managers(cluster: Cluster) -> None:
    fm1, m1, fm2, m2 = await two_managers(cluster)
    agent = cluster.agent([endpoint(m1), endpoint(m2)])
    await agent.join(FakeAgent())
    await wait_until(lambda: len(agent.joined()) == 2)
    await agent.emit("kernel_started", {"kernel_id": "k1"})
    await asyncio.wait_for(agent.report("kernel_terminated", {"kernel_id": "k1"}), 5)
    await wait_until(lambda: fm1.names() == fm2.names() == ["kernel_started", "kernel_terminated"])
    assert fm1.events[0] == fm2.events[0] == ("kernel_started", {"kernel_id": "k1"})


async def test_with_one_manager_gone_the_other_still_gets_events_and_calls(cluster: Cluster) -> None:
    fm1, m1, fm2, m2 = await two_managers(cluster)
    agent = cluster.agent([endpoint(m1), endpoint(m2)])
    await agent.join(FakeAgent())
    await wait_until(lambda: len(agent.joined()) == 2)
    await m1.close()
    await asyncio.sleep(0.2)  # the agent's link to m1 has lost its manager
    started = time.monotonic()
    for i in range(20):
        await asyncio.wait_for(agent.emit("tick", {"i": i}), 1)
    await asyncio.wait_for(agent.report("kernel_terminated", {"kernel_id": "k2"}), 5)
    assert time.monotonic() - started < 5
    await wait_until(lambda: fm2.names() == [*["tick"] * 20, "kernel_terminated"])
    assert [p["i"] for n, p in fm2.events if n == "tick"] == list(range(20))
    assert fm1.events == []
    assert await asyncio.wait_for(m2.call("agent-1", "still-there", {}), 5) == {"method": "still-there", "args": {}}


async def test_a_manager_that_starts_after_the_agent_gets_it(cluster: Cluster) -> None:
    fm1 = FakeManager()
    m1 = await cluster.manager(fm1)
    late_port = free_port()
    late = f"tcp://127.0.0.1:{late_port}"
    fa = FakeAgent()
    # a short join timeout: the late manager's first try fails and the background retries take over
    agent = cluster.agent([endpoint(m1), late], join_timeout=1.0, retry=0.3)
    answer = await asyncio.wait_for(agent.join(fa), 10)
    assert answer["joins"] == 1 and agent.joined() == [endpoint(m1)]
    await asyncio.sleep(1.5)  # its first try gave up
    fm2 = FakeManager()
    m2 = await cluster.manager(fm2, late_port)
    started = time.monotonic()
    await wait_until(lambda: len(fm2.joined) == 1, timeout=5)
    assert time.monotonic() - started < 5
    await wait_until(lambda: fa.rejoins == [{"destroy": [], "joins": 1}])  # its answer reconciles the agent
    assert sorted(agent.joined()) == sorted([endpoint(m1), late])
    assert await m2.call("agent-1", "hello", {}) == {"method": "hello", "args": {}}
    await agent.emit("after", {})
    await wait_until(lambda: fm1.names() == fm2.names() == ["after"])


async def test_a_manager_that_comes_back_gets_the_agent_again(cluster: Cluster) -> None:
    fm1, m1, fm2, m2 = await two_managers(cluster)
    agent = cluster.agent([endpoint(m1), endpoint(m2)])
    await agent.join(FakeAgent())
    await wait_until(lambda: len(agent.joined()) == 2)
    port = int(endpoint(m1).rsplit(":", 1)[1])
    await m1.close()
    await agent.emit("while-away", {})  # m1's link keeps it until m1 is back
    back = FakeManager()
    m1 = await cluster.manager(back, port)
    await wait_until(lambda: len(back.joined) == 1, timeout=5)
    await wait_until(lambda: back.names() == ["while-away"], timeout=5)
    assert await m1.call("agent-1", "again", {}) == {"method": "again", "args": {}}
    assert fm2.names() == ["while-away"]


async def test_join_fails_naming_every_manager_when_none_answers(cluster: Cluster) -> None:
    dead = [f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"]
    agent = cluster.agent(dead, join_timeout=0.5)
    started = time.monotonic()
    with pytest.raises(LinkUnavailable) as caught:
        await agent.join(FakeAgent())
    assert time.monotonic() - started < 3
    for where in dead:
        assert where in str(caught.value)
    with pytest.raises(LinkUnavailable):  # nothing to send to
        await agent.emit("tick", {})


async def test_close_says_bye_to_every_manager(cluster: Cluster) -> None:
    fm1, m1, fm2, m2 = await two_managers(cluster)
    agent = cluster.agent([endpoint(m1), endpoint(m2)])
    await agent.join(FakeAgent())
    await wait_until(lambda: len(agent.joined()) == 2)
    await agent.emit("last", {})
    await asyncio.wait_for(agent.close(), 10)
    assert fm1.names() == fm2.names() == ["last"]  # sent before the bye
    await wait_until(lambda: fm1.left == fm2.left == [("agent-1", "closed")])
    assert agent.joined() == []


# -- configuration: bai.toml and the command line reach the agent's link factory -----------------------


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("BAI_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return tmp_path


def test_a_list_of_managers_in_bai_toml_makes_a_fanout_link(
    isolated: Path, secrets: ManagerSecrets, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bai.node.main import zmq_agent_link_factory

    path = isolated / "bai.toml"
    path.write_text(
        '[node]\nmanager = ["tcp://127.0.0.1:5002", "tcp://127.0.0.1:5003"]\n\n'
        f'[agent]\nmanager_key = "{secrets.public_key}"\njoin_token = "{secrets.join_token}"\n'
    )
    monkeypatch.setenv("BAI_CONFIG", str(path))
    cfg, _ = config.load()
    link = zmq_agent_link_factory(cfg)("agent-1")
    assert isinstance(link, FanoutAgentLink)
    assert [m.name for m in link.managers] == ["tcp://127.0.0.1:5002", "tcp://127.0.0.1:5003"]
    made = [m.make() for m in link.managers]  # one key for both: managers of one database share it
    assert [(z.manager_endpoint, z.manager_public_key) for z in made if isinstance(z, ZmqAgentLink)] == [
        ("tcp://127.0.0.1:5002", secrets.public_key),
        ("tcp://127.0.0.1:5003", secrets.public_key),
    ]


@pytest.mark.parametrize("value", ["[]", '["tcp://127.0.0.1:5002", ""]', "[5002]", "5002"])
def test_bad_manager_lists_in_bai_toml_are_refused(isolated: Path, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    path = isolated / "bai.toml"
    path.write_text(f"[node]\nmanager = {value}\n")
    monkeypatch.setenv("BAI_CONFIG", str(path))
    with pytest.raises(ConfigError, match=r"\[node\] manager"):
        config.load()


def _node_cfg(monkeypatch: pytest.MonkeyPatch, args: list[str]) -> dict[str, Any]:
    """The configuration `bai node ARGS` hands the node (which does not start here)."""
    import bai.node.main
    from bai.cli.main import app

    seen: dict[str, Any] = {}

    def fake_main(cfg: dict[str, Any], *rest: Any) -> int:
        seen.update(cfg)
        return 0

    monkeypatch.setattr(bai.node.main, "main", fake_main)
    result = CliRunner().invoke(app, ["node", *args])
    assert result.exit_code == 0, result.output
    return seen


def test_repeated_manager_flags_reach_the_factory(
    isolated: Path, secrets: ManagerSecrets, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bai.node.main import NodeError, zmq_agent_link_factory

    key, other = secrets.public_key, load_or_create(isolated / "other").public_key
    base = ["--role", "agent", "--join-token", secrets.join_token]
    two = ["--manager", "tcp://127.0.0.1:5002", "--manager", "tcp://127.0.0.1:5003"]
    cfg = _node_cfg(monkeypatch, [*base, *two, "--manager-key", key, "--manager-key", other])
    assert cfg["node"]["manager"] == ["tcp://127.0.0.1:5002", "tcp://127.0.0.1:5003"]
    link = zmq_agent_link_factory(cfg)("agent-1")
    assert isinstance(link, FanoutAgentLink)
    made = [m.make() for m in link.managers]  # one key per manager, in order
    assert [(z.manager_endpoint, z.manager_public_key) for z in made if isinstance(z, ZmqAgentLink)] == [
        ("tcp://127.0.0.1:5002", key),
        ("tcp://127.0.0.1:5003", other),
    ]
    # one --manager: the plain link, as before
    cfg = _node_cfg(monkeypatch, [*base, "--manager", "tcp://127.0.0.1:5002", "--manager-key", key])
    assert cfg["node"]["manager"] == "tcp://127.0.0.1:5002" and cfg["agent"]["manager_key"] == key
    assert type(zmq_agent_link_factory(cfg)("agent-1")) is ZmqAgentLink
    # two managers, three keys: refused, saying what to give
    cfg = _node_cfg(monkeypatch, [*base, *two, *["--manager-key", key] * 3])
    with pytest.raises(NodeError, match="2 managers but 3 manager keys"):
        zmq_agent_link_factory(cfg)
