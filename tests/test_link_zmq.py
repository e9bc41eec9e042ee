"""The ZeroMQ manager↔agent link over real CURVE sockets on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import stat
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq
import zmq.asyncio

from bai.node.link.base import AgentUnavailable, RemoteError
from bai.node.link.keys import ManagerSecrets, load_or_create
from bai.node.link.streams import WINDOW, LinkStream, StreamClosed
from bai.node.link.zmq import RECV_BATCH, LinkRefused, LinkUnavailable, ZmqAgentLink, ZmqManagerLink

HEARTBEAT = 0.1  # agents heartbeat fast here
TIMEOUT = 0.6  # and the manager declares them lost fast


class FakeManager:
    """Records what the manager's link hands it."""

    def __init__(self) -> None:
        self.joined: list[tuple[str, dict[str, Any]]] = []
        self.events: list[tuple[str, str, dict[str, Any]]] = []
        self.heartbeats: list[tuple[str, dict[str, Any]]] = []
        self.beat_times: list[float] = []
        self.left: list[tuple[str, str]] = []

    async def agent_joined(self, agent_id: str, registration: dict[str, Any]) -> dict[str, Any]:
        self.joined.append((agent_id, registration))
        return {"destroy": ["k-unknown"], "joins": len(self.joined)}

    async def agent_event(self, agent_id: str, name: str, payload: dict[str, Any]) -> None:
        if name == "heartbeat":
            self.heartbeats.append((agent_id, payload))
            self.beat_times.append(time.monotonic())
            return
        if name == "boom":
            raise RuntimeError("the handler broke")
        if "slow" in payload:
            await asyncio.sleep(payload["slow"])
        self.events.append((agent_id, name, payload))

    async def agent_left(self, agent_id: str, reason: str) -> None:
        self.left.append((agent_id, reason))

    def names(self) -> list[str]:
        return [name for _, name, _ in self.events]


class FakeAgent:
    """Answers calls and records what the agent's link hands it."""

    def __init__(self, agent_id: str) -> None:
        self.agent_id = agent_id
        self.rejoins: list[dict[str, Any]] = []
        self.stream_ends: list[str | None] = []  # closed_reason of each stream whose receive returned None

    async def registration(self) -> dict[str, Any]:
        return {"id": self.agent_id, "slots": {"cpu": "4"}, "kernels": []}

    async def rejoined(self, answer: dict[str, Any]) -> None:
        self.rejoins.append(answer)

    def heartbeat(self) -> dict[str, Any]:
        return {"occupied_slots": {}, "kernels": []}

    async def handle_call(self, method: str, args: dict[str, Any]) -> Any:
        if method == "echo":
            return {"args": args, "blob": b"\x00\xffbinary"}
        if method == "fail":
            raise KeyError("no such kernel")
        if method == "sleep":
            await asyncio.sleep(args["seconds"])
            return "slept"
        raise ValueError(f"unknown call {method}")

    async def handle_stream(self, kind: str, args: dict[str, Any], stream: LinkStream) -> None:
        if kind == "flood":  # n frames of `size` bytes, as fast as the flow control lets it
            data = b"x" * args["size"]
            for i in range(args["n"]):
                await stream.send({"i": i, "data": data})
        elif kind == "wait":  # until the stream ends
            while await stream.receive() is not None:
                pass
            self.stream_ends.append(stream.closed_reason)
        else:
            raise ValueError(f"unknown stream {kind}")


async def wait_until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


@pytest.fixture
def manager_secrets(tmp_path: Path) -> ManagerSecrets:
    return load_or_create(tmp_path)


@pytest.fixture
async def links(manager_secrets: ManagerSecrets) -> AsyncIterator[Links]:
    made = Links(manager_secrets)
    try:
        yield made
    finally:
        await made.close()


class Links:
    """Makes managers and agents and closes whatever a test left open."""

    def __init__(self, secrets: ManagerSecrets) -> None:
        self.secrets = secrets
        self.managers: list[ZmqManagerLink] = []
        self.agents: list[ZmqAgentLink] = []

    async def manager(self, handler: FakeManager, bind: str = "tcp://127.0.0.1:0") -> ZmqManagerLink:
        link = ZmqManagerLink(bind, self.secrets, heartbeat_timeout=TIMEOUT)
        await link.start(handler)
        self.managers.append(link)
        return link

    def agent(self, manager: ZmqManagerLink, agent_id: str = "agent-1", **kw: Any) -> ZmqAgentLink:
        kw.setdefault("heartbeat_interval", HEARTBEAT)
        kw.setdefault("join_token", self.secrets.join_token)
        assert manager.endpoint is not None
        link = ZmqAgentLink(agent_id, manager.endpoint, self.secrets.public_key, **kw)
        self.agents.append(link)
        return link

    async def close(self) -> None:
        for agent in self.agents:
            await agent.abort()
        for manager in self.managers:
            await manager.close()


Pair = tuple[FakeManager, ZmqManagerLink, FakeAgent, ZmqAgentLink]


async def joined_pair(links: Links, agent_id: str = "agent-1") -> Pair:
    fm = FakeManager()
    manager = await links.manager(fm)
    fa = FakeAgent(agent_id)
    agent = links.agent(manager, agent_id)
    await agent.join(fa)
    return fm, manager, fa, agent


def test_keys_are_created_once_with_private_modes(tmp_path: Path) -> None:
    first = load_or_create(tmp_path)
    d = tmp_path / "link"
    assert stat.S_IMODE((d / "manager.key_secret").stat().st_mode) == 0o600
    assert stat.S_IMODE((d / "join-token").stat().st_mode) == 0o600
    assert (d / "manager.key").read_text().strip() == first.public_key
    assert len(first.public_key) == len(first.secret_key) == 40
    assert zmq.curve_public(first.secret_key.encode()).decode() == first.public_key
    assert load_or_create(tmp_path) == first
    assert first.secret_key not in repr(first) and first.join_token not in repr(first)


async def test_register_returns_the_answer_and_calls_round_trip(links: Links) -> None:
    fm, manager, _, _ = await joined_pair(links)
    assert manager.endpoint is not None and not manager.endpoint.endswith(":0")
    assert fm.joined == [("agent-1", {"id": "agent-1", "slots": {"cpu": "4"}, "kernels": []})]
    assert manager.connected() == {"agent-1"}
    result = await manager.call("agent-1", "echo", {"data": b"\x01\x02", "files": [("a.txt", b"x")]}, timeout=5)
    assert result == {"args": {"data": b"\x01\x02", "files": [["a.txt", b"x"]]}, "blob": b"\x00\xffbinary"}


async def test_join_returns_the_managers_answer(links: Links) -> None:
    fm = FakeManager()
    manager = await links.manager(fm)
    answer = await links.agent(manager).join(FakeAgent("agent-1"))
    assert answer == {"destroy": ["k-unknown"], "joins": 1}


async def test_a_remote_exception_comes_back_as_remote_error(links: Links) -> None:
    _, manager, _, _ = await joined_pair(links)
    with pytest.raises(RemoteError) as info:
        await manager.call("agent-1", "fail", {}, timeout=5)
    assert info.value.kind == "KeyError"
    assert "no such kernel" in info.value.message


async def test_a_slow_call_times_out_without_blocking_others(links: Links) -> None:
    _, manager, _, _ = await joined_pair(links)
    slow = asyncio.create_task(manager.call("agent-1", "sleep", {"seconds": 0.5}, timeout=5))
    with pytest.raises(TimeoutError):
        await manager.call("agent-1", "sleep", {"seconds": 2}, timeout=0.2)
    assert await manager.call("agent-1", "echo", {}, timeout=1)  # answered while the slow one runs
    assert await slow == "slept"
    assert not manager._pending  # the timed-out call was forgotten


async def test_more_answers_than_one_receive_turn_takes_all_arrive(links: Links) -> None:
    # the manager takes at most RECV_BATCH messages per turn of its loop, then looks again: every answer of a
    # burst bigger than that reaches its own caller, and the link still answers afterwards
    _, manager, _, _ = await joined_pair(links)
    n = 3 * RECV_BATCH + 7
    answers = await asyncio.gather(*(manager.call("agent-1", "echo", {"i": i}, timeout=10) for i in range(n)))
    assert [a["args"]["i"] for a in answers] == list(range(n))
    assert not manager._pending
    assert await manager.call("agent-1", "echo", {"after": True}, timeout=5)


async def test_a_closed_manager_link_stops_watching_its_socket(links: Links) -> None:
    _, manager, _, _ = await joined_pair(links)
    assert manager._fd is not None
    await manager.close()
    assert manager._fd is None and manager._sock is None
    with pytest.raises(AgentUnavailable):
        await manager.call("agent-1", "echo", {}, timeout=1)
    await asyncio.sleep(0.05)  # a look for input scheduled before the close finds nothing to do


async def test_calling_an_unknown_agent_is_unavailable(links: Links) -> None:
    manager = await links.manager(FakeManager())
    with pytest.raises(AgentUnavailable):
        await manager.call("nobody", "echo", {}, timeout=1)


async def test_a_burst_of_events_arrives_in_order_and_report_waits_for_the_handler(links: Links) -> None:
    fm, _, _, agent = await joined_pair(links)
    for i in range(1000):
        await agent.emit("kernel_logs", {"i": i})
    await agent.report("kernel_terminated", {"slow": 0.3})
    # report returned only after the handler finished the slow event, and after all the events before it
    assert len(fm.events) == 1001
    assert [p["i"] for _, _, p in fm.events[:1000]] == list(range(1000))
    assert fm.events[-1] == ("agent-1", "kernel_terminated", {"slow": 0.3})
    await wait_until(lambda: not agent._events)  # every event acknowledged, nothing buffered


async def test_a_full_buffer_drops_the_oldest_events(links: Links) -> None:
    fm = FakeManager()
    manager = await links.manager(fm)
    agent = links.agent(manager, max_buffered=10)
    dropped = asyncio.create_task(agent.report("dropped", {}))  # seq 1: dropped before it is ever sent
    await asyncio.sleep(0)
    for i in range(30):  # before joining: nothing can be sent yet
        await agent.emit("e", {"i": i})
    with pytest.raises(LinkUnavailable, match="dropped"):
        await dropped
    await agent.join(FakeAgent("agent-1"))
    await agent.report("after", {})
    assert [p["i"] for _, _, p in fm.events[:-1]] == list(range(21, 30))  # the newest 10, less the report's slot
    assert fm.names()[-1] == "after"


async def test_a_failing_handler_does_not_stop_the_events(links: Links) -> None:
    fm, _, _, agent = await joined_pair(links)
    await agent.emit("boom", {})
    with pytest.raises(TypeError):
        await agent.emit("cannot-travel", {"what": object()})  # refused at once, nothing queued
    await agent.report("after", {})
    assert fm.names() == ["after"]


async def test_a_wrong_join_token_is_refused(links: Links, caplog: pytest.LogCaptureFixture) -> None:
    fm = FakeManager()
    manager = await links.manager(fm)
    agent = links.agent(manager, "intruder", join_token="not-the-token")
    with caplog.at_level(logging.WARNING, logger="bai.link"), pytest.raises(LinkRefused, match="join token"):
        await agent.join(FakeAgent("intruder"))
    assert fm.joined == [] and fm.events == [] and fm.left == []
    assert manager.connected() == set()
    assert any("intruder" in r.getMessage() and "refused" in r.getMessage() for r in caplog.records)


async def test_a_client_without_curve_gets_nothing(links: Links, manager_secrets: ManagerSecrets) -> None:
    fm = FakeManager()
    manager = await links.manager(fm)
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.ROUTING_ID, b"plain")
    try:
        sock.connect(manager.endpoint)
        body = {"agent_id": "plain", "token": manager_secrets.join_token, "link": "x", "attempt": "y"}
        await sock.send_multipart([msgpack.packb(["register", {**body, "registration": {}}], use_bin_type=True)])
        assert await sock.poll(1000) == 0
    finally:
        sock.close(linger=0)
        ctx.term()
    assert fm.joined == [] and manager.connected() == set()


async def test_a_curve_client_without_the_token_cannot_speak_for_an_agent(
    links: Links, manager_secrets: ManagerSecrets
) -> None:
    fm, manager, _, _ = await joined_pair(links)
    fm.heartbeats.clear()
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.ROUTING_ID, b"agent-1")  # the agent id, but not its link's routing id
    public, secret = zmq.curve_keypair()
    sock.curve_publickey, sock.curve_secretkey = public, secret
    sock.curve_serverkey = manager_secrets.public_key.encode()
    try:
        sock.connect(manager.endpoint)
        for kind, body in [
            ("event", {"link": "x", "seq": 1, "low": 1, "name": "forged", "payload": {}, "ack_wanted": True}),
            ("heartbeat", {"link": "x", "low": 1, "sent": 0, "payload": {"forged": True}}),
            ("bye", {}),
        ]:
            await sock.send_multipart([msgpack.packb([kind, body], use_bin_type=True)])
        assert await sock.poll(2000)
        kind, _ = msgpack.unpackb(await sock.recv(), raw=False)
        assert kind in ("register-please", "bye-ack")
    finally:
        sock.close(linger=0)
        ctx.term()
    await asyncio.sleep(0.2)
    assert fm.events == [] and fm.left == []
    assert all("forged" not in payload for _, payload in fm.heartbeats)
    assert manager.connected() == {"agent-1"}
    assert await manager.call("agent-1", "echo", {}, timeout=2)  # still reaches the real agent


async def test_joining_with_no_manager_gives_up(links: Links, manager_secrets: ManagerSecrets) -> None:
    manager = await links.manager(FakeManager())
    endpoint = manager.endpoint
    await manager.close()
    agent = ZmqAgentLink("agent-1", endpoint, manager_secrets.public_key, manager_secrets.join_token, join_timeout=0.5)
    links.agents.append(agent)
    with pytest.raises(LinkUnavailable):
        await agent.join(FakeAgent("agent-1"))


async def test_a_silent_agent_is_lost(links: Links) -> None:
    fm, manager, _, agent = await joined_pair(links)
    await agent.abort()  # no bye, no more heartbeats
    started = time.monotonic()
    await wait_until(lambda: fm.left == [("agent-1", "lost")], timeout=TIMEOUT + 1)
    assert time.monotonic() - started < TIMEOUT + 1
    assert manager.connected() == set()
    with pytest.raises(AgentUnavailable):
        await manager.call("agent-1", "echo", {}, timeout=1)
    await asyncio.sleep(TIMEOUT)
    assert fm.left == [("agent-1", "lost")]  # once


async def test_a_lost_agent_that_heartbeats_again_comes_back(links: Links) -> None:
    fm, manager, fa, agent = await joined_pair(links)
    assert agent._heartbeat_task is not None
    agent._heartbeat_task.cancel()
    await wait_until(lambda: fm.left == [("agent-1", "lost")], timeout=TIMEOUT + 1)
    await agent.emit("while-lost", {})  # the manager ignores it; it comes again after the re-registration
    agent._heartbeat_task = asyncio.create_task(agent._heartbeat_loop())
    await wait_until(lambda: len(fa.rejoins) == 1 and manager.connected() == {"agent-1"})
    assert [aid for aid, _ in fm.joined] == ["agent-1", "agent-1"]
    assert fa.rejoins == [{"destroy": ["k-unknown"], "joins": 2}]
    await wait_until(lambda: fm.names() == ["while-lost"])
    assert await manager.call("agent-1", "echo", {}, timeout=2)


async def test_a_lost_event_is_sent_again(links: Links) -> None:
    fm, _, _, agent = await joined_pair(links)

    class DropOnce:
        """The socket, losing the event with seq 5 on its way (like a connection cut would)."""

        def __init__(self, sock: zmq.asyncio.Socket) -> None:
            self.sock = sock
            self.dropped = False

        def send_multipart(self, frames: list[bytes], **kw: Any) -> Any:
            kind, body = msgpack.unpackb(frames[-1], raw=False)
            if kind == "event" and body["seq"] == 5 and not self.dropped:
                self.dropped = True
                fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                fut.set_result(None)
                return fut
            return self.sock.send_multipart(frames, **kw)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.sock, name)

    real = agent._sock
    assert real is not None
    agent._sock = DropOnce(real)  # type: ignore[assignment]
    try:
        for i in range(1, 11):
            await agent.emit("e", {"i": i})
        await wait_until(lambda: len(fm.events) == 10, timeout=3)
    finally:
        agent._sock = real
    assert [p["i"] for _, _, p in fm.events] == list(range(1, 11))


class CuttableProxy:
    """A TCP relay between an agent and the manager whose connections can be cut (a network failure)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.writers: list[asyncio.StreamWriter] = []
        self.blackhole = False  # while set, what is relayed vanishes (and the connection looks fine)
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self.writers += [writer, up_writer]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await src.read(65536):
                    if not self.blackhole:
                        dst.write(data)
                        await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def cut(self) -> None:
        for w in self.writers:
            w.transport.abort()
        self.writers.clear()

    async def close(self) -> None:
        self.cut()
        if self.server is not None:
            self.server.close()


async def test_events_survive_a_network_cut(links: Links, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="bai.link")
    fm = FakeManager()
    manager = await links.manager(fm)
    assert manager.endpoint is not None
    proxy = CuttableProxy(int(manager.endpoint.rsplit(":", 1)[1]))
    await proxy.start()
    try:
        agent = ZmqAgentLink(
            "agent-1",
            f"tcp://127.0.0.1:{proxy.port}",
            links.secrets.public_key,
            links.secrets.join_token,
            heartbeat_interval=HEARTBEAT,
        )
        links.agents.append(agent)
        await agent.join(FakeAgent("agent-1"))
        for i in range(3000):
            await agent.emit("e", {"i": i, "pad": "x" * 100})
            if i % 100 == 0:
                await asyncio.sleep(0.002)  # let the events flow
            if i in (500, 1500):
                proxy.blackhole = True  # these events are "sent" and lost in the network
            if i in (800, 1800):
                await asyncio.sleep(0.05)
                proxy.cut()  # the connection breaks; the agent reconnects through the relay
                proxy.blackhole = False
                await wait_until(lambda i=i: len(fm.events) > i)  # through again
        await asyncio.wait_for(agent.report("last", {}), 10)
        assert [p["i"] for _, _, p in fm.events[:-1]] == list(range(3000))  # in order, none twice
        assert "send its events again" in caplog.text  # the manager noticed the gap
        # events lost with nothing after them: the next heartbeat says what was sent
        proxy.blackhole = True
        for i in range(5):
            await agent.emit("tail", {"i": i})
        await asyncio.sleep(0.05)
        proxy.cut()
        proxy.blackhole = False
        await wait_until(lambda: fm.names()[-5:] == ["tail"] * 5, timeout=5)
        assert len(fm.events) == 3006
        assert fm.left == [] and manager.connected() == {"agent-1"}
        assert await manager.call("agent-1", "echo", {}, timeout=2)
    finally:
        await proxy.close()


async def test_a_restarted_manager_gets_the_agent_and_its_events_back(
    links: Links, manager_secrets: ManagerSecrets
) -> None:
    fm1, manager1, fa, agent = await joined_pair(links)
    await agent.report("before", {})
    await wait_until(lambda: not agent._events)
    endpoint = manager1.endpoint
    assert endpoint is not None
    await manager1.close()

    for i in range(20):
        await agent.emit("while-down", {"i": i})
    reported = asyncio.create_task(agent.report("reported-while-down", {}))
    await asyncio.sleep(0.3)
    assert not reported.done()

    fm2 = FakeManager()
    await links.manager(fm2, bind=endpoint)
    await asyncio.wait_for(reported, 5)
    assert [aid for aid, _ in fm2.joined] == ["agent-1"]
    assert fa.rejoins == [{"destroy": ["k-unknown"], "joins": 1}]
    assert fm2.names() == ["while-down"] * 20 + ["reported-while-down"]
    assert [p["i"] for _, _, p in fm2.events[:20]] == list(range(20))
    assert fm1.names() == ["before"]


async def test_a_restarted_agent_counts_its_events_from_the_start_again(links: Links) -> None:
    fm, manager, _, agent = await joined_pair(links)
    for i in range(5):
        await agent.emit("old", {"i": i})
    await wait_until(lambda: len(fm.events) == 5)
    await agent.abort()
    again = links.agent(manager, "agent-1")  # the same agent id, a new process
    await again.join(FakeAgent("agent-1"))
    await again.report("new", {})
    assert fm.names() == ["old"] * 5 + ["new"]
    assert manager.connected() == {"agent-1"}


async def test_closing_an_agent_says_bye(links: Links) -> None:
    fm, manager, _, agent = await joined_pair(links)
    await agent.emit("last-words", {})
    await agent.close()
    assert not agent._events  # the bye's answer acknowledged everything before it
    assert fm.names() == ["last-words"]
    assert fm.left == [("agent-1", "closed")]
    assert manager.connected() == set()
    with pytest.raises(AgentUnavailable):
        await manager.call("agent-1", "echo", {}, timeout=1)
    with pytest.raises(LinkUnavailable):
        await agent.emit("too-late", {})


async def test_two_agents_are_told_apart(links: Links) -> None:
    fm = FakeManager()
    manager = await links.manager(fm)
    a, b = links.agent(manager, "a"), links.agent(manager, "b")
    await asyncio.gather(a.join(FakeAgent("a")), b.join(FakeAgent("b")))
    assert manager.connected() == {"a", "b"}
    await asyncio.gather(a.report("from-a", {}), b.report("from-b", {}))
    assert sorted((aid, name) for aid, name, _ in fm.events) == [("a", "from-a"), ("b", "from-b")]
    assert (await manager.call("b", "echo", {"x": 1}, timeout=2))["args"] == {"x": 1}
    await wait_until(lambda: {aid for aid, _ in fm.heartbeats} == {"a", "b"})
    with contextlib.suppress(Exception):
        await a.close()
    assert manager.connected() == {"b"}


# -- streams --------------------------------------------------------------------------------------------


async def test_a_saturated_stream_does_not_delay_heartbeats_or_calls(links: Links) -> None:
    fm, manager, _, _ = await joined_pair(links)
    n, size = 5000, 64 * 1024
    started = time.monotonic()
    stream = await manager.open_stream("agent-1", "flood", {"n": n, "size": size})
    call_times: list[float] = []

    async def call_meanwhile() -> None:
        while True:
            await asyncio.sleep(0.1)
            t = time.monotonic()
            assert await manager.call("agent-1", "echo", {}, timeout=2)
            call_times.append(time.monotonic() - t)

    # how long the loop's thread was kept off the CPU (a machine busy with other tests: every task waits then,
    # heartbeats or not); time the loop spends on the link's own work counts as CPU, so a heartbeat that waits
    # behind the stream's frames is not excused
    starved: list[float] = [0.0]

    async def watch_the_loop() -> None:
        while True:
            wall, cpu = time.monotonic(), time.thread_time()
            await asyncio.sleep(0.01)
            starved.append((time.monotonic() - wall) - (time.thread_time() - cpu))

    caller = asyncio.create_task(call_meanwhile())
    watcher = asyncio.create_task(watch_the_loop())
    got, held = 0, 0
    try:
        while (frame := await asyncio.wait_for(stream.receive(), 5)) is not None:
            assert frame["i"] == got and len(frame["data"]) == size
            got += 1
            held = max(held, stream.inbox.qsize() - (stream.closed_reason is not None))
            if got % 100 == 0:
                await asyncio.sleep(0.03)  # a slow reader: 1.5 s of sleeping at least
    finally:
        for task in (caller, watcher):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    ended = time.monotonic()
    assert got == n and stream.closed_reason == ""
    assert held <= WINDOW  # what waits on the receiving side, at most
    beats = [started, *(t for t in fm.beat_times if t >= started), ended]
    late, off = max(b - a for a, b in zip(beats, beats[1:], strict=False)), max(starved)
    assert late < TIMEOUT / 2 + off, f"a heartbeat came {late:.2f} s after the last ({off:.2f} s off the CPU)"
    assert len(call_times) >= 5 and max(call_times) < TIMEOUT / 2 + off, "a call was slow"
    assert fm.left == [] and manager.connected() == {"agent-1"}


async def test_the_sender_waits_for_credit(links: Links) -> None:
    fm, manager, _, agent = await joined_pair(links)
    stream = await manager.open_stream("agent-1", "flood", {"n": 3 * WINDOW, "size": 10})
    await wait_until(lambda: stream.inbox.qsize() == WINDOW)
    [theirs] = agent._streams.values()
    await asyncio.sleep(0.2)
    assert stream.inbox.qsize() == WINDOW and theirs._credit == 0  # nothing more until the manager reads
    assert await stream.receive() == {"i": 0, "data": b"x" * 10}
    for i in range(1, 3 * WINDOW):
        assert (await asyncio.wait_for(stream.receive(), 2))["i"] == i  # type: ignore[index]
    assert await asyncio.wait_for(stream.receive(), 2) is None and stream.closed_reason == ""
    await wait_until(lambda: not agent._streams and not manager._streams)


async def test_a_lost_agent_ends_its_streams_on_both_sides(links: Links) -> None:
    fm, manager, fa, agent = await joined_pair(links)
    stream = await manager.open_stream("agent-1", "wait", {})
    await wait_until(lambda: len(agent._streams) == 1)
    assert agent._heartbeat_task is not None
    agent._heartbeat_task.cancel()  # silent: the manager declares it lost
    assert await asyncio.wait_for(stream.receive(), TIMEOUT + 2) is None
    assert stream.closed_reason == "agent agent-1 is lost"
    with pytest.raises(StreamClosed):
        await stream.send({"late": True})
    # the agent's end heard it too (the manager told it, and forgot the link: it asks it to register again)
    await wait_until(lambda: fa.stream_ends == ["agent agent-1 is lost"])
    assert not agent._streams and not manager._streams


async def test_an_agent_asked_to_register_again_ends_its_streams(links: Links) -> None:
    fm, manager, fa, agent = await joined_pair(links)
    stream = await manager.open_stream("agent-1", "wait", {})
    await wait_until(lambda: len(agent._streams) == 1)
    [theirs] = agent._streams.values()
    theirs.on_end = None  # the manager's stream-close is lost: the register-please alone must end it
    agent._dispatch("register-please", {})
    await wait_until(lambda: fa.stream_ends == ["the manager asked the agent to register again"])
    await wait_until(lambda: len(fa.rejoins) == 1)
    assert await asyncio.wait_for(stream.receive(), 3) is None
    assert stream.closed_reason == "agent agent-1 registered again"


async def test_a_restarted_agent_ends_the_streams_of_its_old_link(links: Links) -> None:
    fm, manager, _, agent = await joined_pair(links)
    stream = await manager.open_stream("agent-1", "wait", {})
    await wait_until(lambda: len(agent._streams) == 1)
    await agent.abort()  # a crash: the manager hears nothing...
    again = links.agent(manager, "agent-1")
    fa2 = FakeAgent("agent-1")
    await again.join(fa2)  # ...until the new process registers
    assert await asyncio.wait_for(stream.receive(), 2) is None
    assert stream.closed_reason == "agent agent-1 registered again"
    assert fm.left == []
    fresh = await manager.open_stream("agent-1", "wait", {})
    await wait_until(lambda: len(again._streams) == 1)
    await fresh.close()
    await wait_until(lambda: fa2.stream_ends == [""])


async def test_unknown_streams_are_ignored(links: Links, caplog: pytest.LogCaptureFixture) -> None:
    fm, manager, _, agent = await joined_pair(links)
    assert agent._sock is not None
    caplog.set_level(logging.DEBUG, logger="bai.link")
    for kind, body in [
        ("stream-data", {"sid": "nope", "frame": {"x": 1}}),
        ("stream-credit", {"sid": "nope", "n": 5}),
        ("stream-close", {"sid": "nope", "reason": ""}),
        ("stream-data", {"frame": {}}),
    ]:
        await agent._sock.send_multipart([msgpack.packb([kind, body], use_bin_type=True)])
        assert manager._send_now(agent.routing_id, msgpack.packb([kind, body], use_bin_type=True))
    assert await manager.call("agent-1", "echo", {}, timeout=2)  # both still answer
    await wait_until(lambda: sum("unknown stream" in r.getMessage() for r in caplog.records) == 8)
    assert fm.left == [] and manager.connected() == {"agent-1"}


async def test_a_sender_that_ignores_the_flow_control_loses_its_stream(links: Links) -> None:
    fm, manager, _, agent = await joined_pair(links)
    stream = await manager.open_stream("agent-1", "wait", {})
    await wait_until(lambda: len(agent._streams) == 1)
    [theirs] = agent._streams.values()
    for i in range(WINDOW + 1):
        theirs._credit = WINDOW  # a broken agent that does not wait
        await theirs.send({"i": i})
    await wait_until(lambda: stream.closed_reason is not None)  # the manager does not read meanwhile
    frames = []
    while (frame := await asyncio.wait_for(stream.receive(), 2)) is not None:
        frames.append(frame)
    assert stream.closed_reason == "ProtocolError: the sender ignored the flow control"
    assert [f["i"] for f in frames] == list(range(WINDOW + 1))  # what came before the end is still read
    await wait_until(lambda: not agent._streams)  # the agent was told
    assert await manager.call("agent-1", "echo", {}, timeout=2)


async def test_frames_that_cannot_travel_fail_the_send_only(links: Links) -> None:
    _, manager, _, _ = await joined_pair(links)
    stream = await manager.open_stream("agent-1", "wait", {})
    with pytest.raises(TypeError):
        await stream.send({"x": object()})
    assert stream.closed_reason is None
    await stream.send({"x": 1})
    with pytest.raises(TypeError):
        await manager.open_stream("agent-1", "wait", {"x": object()})
    assert len(manager._streams) == 1


async def test_an_over_size_message_drops_only_its_connection(
    links: Links, manager_secrets: ManagerSecrets, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A peer that sends more than MAX_MESSAGE_TO_MANAGER bytes in one message is disconnected by libzmq before
    the message is buffered (logged as a dropped connection); the manager and its agents go on."""
    import bai.node.link.zmq as link_zmq

    monkeypatch.setattr(link_zmq, "MAX_MESSAGE_TO_MANAGER", 1024 * 1024)
    caplog.set_level(logging.INFO, logger="bai.link")
    fm, manager, _, _ = await joined_pair(links)
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    public, secret = zmq.curve_keypair()
    sock.curve_publickey, sock.curve_secretkey = public, secret
    sock.curve_serverkey = manager_secrets.public_key.encode()
    try:
        sock.connect(manager.endpoint)
        await sock.send_multipart([msgpack.packb(["register", {"blob": b"x" * (2 * 1024 * 1024)}], use_bin_type=True)])
        for _ in range(50):
            if "dropped" in caplog.text:
                break
            await asyncio.sleep(0.05)
        assert not await sock.poll(200)  # no answer: the message never reached the manager's code
    finally:
        sock.close(linger=0)
        ctx.term()
    assert "agent link connection(s) dropped" in caplog.text and "over 1 MiB" in caplog.text
    assert manager.connected() == {"agent-1"}
    assert await manager.call("agent-1", "echo", {"small": True}, timeout=2)  # the real agent is unaffected


async def test_connections_that_never_shake_hands_are_dropped(links: Links, monkeypatch: pytest.MonkeyPatch) -> None:
    """TCP connections to the manager's link that send nothing (no ZMTP / CURVE handshake) are closed after
    HANDSHAKE_MS: connecting and waiting holds no descriptor of the manager for long; agents go on."""
    import socket

    import bai.node.link.zmq as link_zmq

    monkeypatch.setattr(link_zmq, "HANDSHAKE_MS", 500)
    _, manager, _, _ = await joined_pair(links)
    host, port = manager.endpoint.removeprefix("tcp://").rsplit(":", 1)
    socks = [socket.create_connection((host, int(port)), timeout=5) for _ in range(50)]
    try:
        await asyncio.sleep(1.5)
        closed = 0
        for s in socks:
            s.setblocking(False)
            try:
                while data := s.recv(4096):  # libzmq's greeting, then the close
                    assert len(data) < 4096
                closed += 1  # b"": the manager closed it
            except BlockingIOError:
                pass
            except ConnectionResetError:
                closed += 1
        assert closed == len(socks), closed
    finally:
        for s in socks:
            s.close()
    assert manager.connected() == {"agent-1"}
    assert await manager.call("agent-1", "echo", {"small": True}, timeout=2)
