"""What every manager↔agent link must do, checked the same way over each transport (the in-process link of
`bai node --role all`, and ZeroMQ with CURVE on 127.0.0.1), with the typed messages both ends use."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from bai.node.link.base import AgentUnavailable, RemoteError
from bai.node.link.inproc import InprocHub
from bai.node.link.keys import load_or_create
from bai.node.link.messages import (
    CALLS,
    Execute,
    Heartbeat,
    JoinAnswer,
    KernelInfo,
    KernelLogs,
    KernelTerminated,
    Registration,
    RunResult,
    UploadFiles,
    call,
    decode_event,
    encode_result,
)
from bai.node.link.streams import WINDOW, LinkStream, StreamClosed
from bai.node.link.zmq import ZmqAgentLink, ZmqManagerLink

BEAT = 0.05


class Manager:
    """The manager's end: records registrations, events (decoded) and departures."""

    def __init__(self) -> None:
        self.registrations: list[Registration] = []
        self.events: list[tuple[str, Any]] = []
        self.left: list[tuple[str, str]] = []
        self.slow = 0.0

    async def agent_joined(self, agent_id: str, registration: dict[str, Any]) -> dict[str, Any]:
        self.registrations.append(Registration.from_wire(registration))
        return JoinAnswer(destroy=["k-stale"]).to_wire()

    async def agent_event(self, agent_id: str, name: str, payload: dict[str, Any]) -> None:
        event = decode_event(name, payload)
        if isinstance(event, KernelTerminated) and self.slow:
            await asyncio.sleep(self.slow)
        self.events.append((agent_id, event))

    async def agent_left(self, agent_id: str, reason: str) -> None:
        self.left.append((agent_id, reason))

    def of(self, kind: type) -> list[Any]:
        return [e for _, e in self.events if isinstance(e, kind)]


class AgentEnd:
    """The agent's end: answers Execute and UploadFiles; anything else fails as an agent would. Serves streams:
    "echo" sends each frame back upper-cased, "boom" fails, "flood" sends `n` frames as fast as it may."""

    def __init__(self, agent_id: str) -> None:
        self.agent_id = agent_id
        self.uploaded: list[list[Any]] = []
        self.stream_ends: list[str | None] = []  # closed_reason of each stream whose receive returned None
        self.flooded = 0  # frames a "flood" stream sent so far

    async def registration(self) -> dict[str, Any]:
        return Registration(
            id=self.agent_id, backend="sim", slots={"cpu": "4"}, kernels=[KernelInfo("k1", "s1", "c1")]
        ).to_wire()

    async def rejoined(self, answer: dict[str, Any]) -> None:
        pass

    def heartbeat(self) -> dict[str, Any]:
        return Heartbeat(occupied_slots={"cpu": "1"}, kernels=["k1"]).to_wire()

    async def handle_call(self, method: str, args: dict[str, Any]) -> Any:
        message = CALLS[method].from_wire(args)
        if isinstance(message, Execute):
            if message.kernel_id == "missing":
                raise LookupError(f"kernel {message.kernel_id} is not running")
            return encode_result(RunResult(message.run_id, "finished", [["stdout", message.code]], 0))
        if isinstance(message, UploadFiles):
            self.uploaded.extend(message.files)
            return None
        raise ValueError(f"unexpected call {method}")

    async def handle_stream(self, kind: str, args: dict[str, Any], stream: LinkStream) -> None:
        if kind == "echo":
            while (frame := await stream.receive()) is not None:
                await stream.send({k: v.upper() if isinstance(v, str | bytes) else v for k, v in frame.items()})
            self.stream_ends.append(stream.closed_reason)
        elif kind == "boom":
            raise RuntimeError("the handler broke")
        elif kind == "flood":
            for i in range(args["n"]):
                await stream.send({"i": i, "data": b"x" * args.get("size", 1)})
                self.flooded = i + 1
        else:
            raise ValueError(f"unexpected stream {kind}")


Transport = Callable[[Manager, AgentEnd], Any]


@pytest.fixture(params=["inproc", "zmq"])
async def connect(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Transport]:
    """connect(manager, agent) -> (manager link, agent link, join answer) over the transport."""
    closers: list[Any] = []

    async def inproc(manager: Manager, agent: AgentEnd):
        hub = InprocHub(heartbeat_interval=BEAT)
        await hub.manager.start(manager)
        link = hub.agent_link(agent.agent_id)
        closers.extend([link.close, hub.manager.close])
        return hub.manager, link, await link.join(agent)

    async def zmq(manager: Manager, agent: AgentEnd):
        secrets = load_or_create(tmp_path)
        mlink = ZmqManagerLink("tcp://127.0.0.1:0", secrets, heartbeat_timeout=2.0)
        await mlink.start(manager)
        assert mlink.endpoint is not None
        alink = ZmqAgentLink(
            agent.agent_id, mlink.endpoint, secrets.public_key, join_token=secrets.join_token, heartbeat_interval=BEAT
        )
        closers.extend([alink.close, mlink.close])
        return mlink, alink, await alink.join(agent)

    yield inproc if request.param == "inproc" else zmq
    for close in closers:
        await close()


async def until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not in time"
        await asyncio.sleep(0.01)


async def test_joining_carries_the_registration_and_the_answer(connect: Transport) -> None:
    manager = Manager()
    mlink, _, answer = await connect(manager, AgentEnd("a1"))
    assert JoinAnswer.from_wire(answer).destroy == ["k-stale"]
    [registration] = manager.registrations
    assert registration.id == "a1" and registration.slots == {"cpu": "4"}
    assert registration.kernels == [KernelInfo("k1", "s1", "c1")]
    assert mlink.connected() == {"a1"}


async def test_typed_calls_round_trip_bytes_included(connect: Transport) -> None:
    agent = AgentEnd("a1")
    mlink, _, _ = await connect(Manager(), agent)
    result = await call(mlink, "a1", Execute("k1", "r1", "query", "print(1)"), timeout=5)
    assert result == RunResult("r1", "finished", [["stdout", "print(1)"]], 0)
    await call(mlink, "a1", UploadFiles("k1", [["a.bin", b"\x00\xff"]]), timeout=5)
    assert [list(f) for f in agent.uploaded] == [["a.bin", b"\x00\xff"]]


async def test_an_error_on_the_agent_comes_back_as_remote_error(connect: Transport) -> None:
    mlink, _, _ = await connect(Manager(), AgentEnd("a1"))
    with pytest.raises(RemoteError) as caught:
        await call(mlink, "a1", Execute("missing", "r1", "query"), timeout=5)
    assert caught.value.kind == "LookupError" and "missing is not running" in caught.value.message


async def test_calling_an_agent_that_is_not_there_is_unavailable(connect: Transport) -> None:
    mlink, _, _ = await connect(Manager(), AgentEnd("a1"))
    with pytest.raises(AgentUnavailable):
        await call(mlink, "nobody", Execute("k1", "r1", "query"), timeout=5)


async def test_events_arrive_in_order_and_report_waits_for_the_handler(connect: Transport) -> None:
    manager = Manager()
    _, alink, _ = await connect(manager, AgentEnd("a1"))
    for i in range(50):
        await alink.emit(KernelLogs.name, KernelLogs([["k1", f"line {i}\n"]]).to_wire())
    manager.slow = 0.05
    ended = KernelTerminated("k1", "s1", exit_code=3, msg="out of memory")
    await alink.report(ended.name, ended.to_wire())
    # report returned: the manager handled it, after every event before it
    assert manager.of(KernelTerminated) == [ended]
    texts = [chunk[1] for e in manager.of(KernelLogs) for chunk in e.chunks]
    assert texts == [f"line {i}\n" for i in range(50)]


async def test_heartbeats_arrive_as_typed_events(connect: Transport) -> None:
    manager = Manager()
    await connect(manager, AgentEnd("a1"))
    await until(lambda: bool(manager.of(Heartbeat)))
    assert manager.of(Heartbeat)[0] == Heartbeat(occupied_slots={"cpu": "1"}, kernels=["k1"])


async def test_closing_the_agent_says_it_left_after_its_events(connect: Transport) -> None:
    manager = Manager()
    mlink, alink, _ = await connect(manager, AgentEnd("a1"))
    await alink.emit(KernelLogs.name, KernelLogs([["k1", "last words\n"]]).to_wire())
    await alink.close()
    await until(lambda: manager.left == [("a1", "closed")])
    assert manager.of(KernelLogs)[-1].chunks == [("k1", "last words\n")]
    await until(lambda: mlink.connected() == set())


# -- streams --------------------------------------------------------------------------------------------


async def receive_all(stream: LinkStream) -> list[dict[str, Any]]:
    frames = []
    while (frame := await asyncio.wait_for(stream.receive(), 5)) is not None:
        frames.append(frame)
    return frames


async def test_a_stream_round_trips_frames_in_order_bytes_included(connect: Transport) -> None:
    mlink, _, _ = await connect(Manager(), AgentEnd("a1"))
    stream = await mlink.open_stream("a1", "echo", {})
    for i in range(10):
        await stream.send({"text": f"line {i}", "data": b"\x00ab\xff", "n": i})
    got = [await asyncio.wait_for(stream.receive(), 5) for _ in range(10)]
    assert got == [{"text": f"LINE {i}", "data": b"\x00AB\xff", "n": i} for i in range(10)]
    assert stream.closed_reason is None
    await stream.close()


async def test_the_agent_ending_a_stream_ends_the_managers_receive(connect: Transport) -> None:
    mlink, _, _ = await connect(Manager(), AgentEnd("a1"))
    stream = await mlink.open_stream("a1", "flood", {"n": 3})
    assert [f["i"] for f in await receive_all(stream)] == [0, 1, 2]  # every frame, then the end
    assert stream.closed_reason == ""
    assert await stream.receive() is None  # and again
    with pytest.raises(StreamClosed):
        await stream.send({"late": True})


async def test_the_manager_closing_a_stream_ends_the_agents_receive(connect: Transport) -> None:
    agent = AgentEnd("a1")
    mlink, _, _ = await connect(Manager(), agent)
    stream = await mlink.open_stream("a1", "echo", {})
    await stream.send({"text": "hi"})
    assert await asyncio.wait_for(stream.receive(), 5) == {"text": "HI"}
    await stream.close()
    await until(lambda: agent.stream_ends == [""])
    assert stream.closed_reason == ""
    assert await stream.receive() is None
    with pytest.raises(StreamClosed):
        await stream.send({"text": "late"})


async def test_an_error_in_the_stream_handler_closes_it_with_its_message(connect: Transport) -> None:
    mlink, _, _ = await connect(Manager(), AgentEnd("a1"))
    stream = await mlink.open_stream("a1", "boom", {})
    assert await asyncio.wait_for(stream.receive(), 5) is None
    assert stream.closed_reason == "RuntimeError: the handler broke"


async def test_opening_a_stream_to_an_agent_that_is_not_there_is_unavailable(connect: Transport) -> None:
    mlink, _, _ = await connect(Manager(), AgentEnd("a1"))
    with pytest.raises(AgentUnavailable):
        await mlink.open_stream("nobody", "echo", {})


async def test_flow_control_bounds_what_the_receiver_holds(connect: Transport) -> None:
    agent = AgentEnd("a1")
    mlink, _, _ = await connect(Manager(), agent)
    stream = await mlink.open_stream("a1", "flood", {"n": 3 * WINDOW})
    await until(lambda: agent.flooded == WINDOW and stream.inbox.qsize() == WINDOW)
    await asyncio.sleep(0.2)
    assert agent.flooded == WINDOW and stream.inbox.qsize() == WINDOW  # the sender waits for the reader
    held, got = 0, []
    while (frame := await asyncio.wait_for(stream.receive(), 5)) is not None:
        got.append(frame["i"])
        held = max(held, stream.inbox.qsize() - (stream.closed_reason is not None))
        if len(got) % 16 == 0:
            await asyncio.sleep(0.01)  # a slow reader
    assert got == list(range(3 * WINDOW)) and stream.closed_reason == ""
    assert held <= WINDOW


async def test_closing_the_agent_link_ends_its_streams(connect: Transport) -> None:
    agent = AgentEnd("a1")
    mlink, alink, _ = await connect(Manager(), agent)
    stream = await mlink.open_stream("a1", "echo", {})
    await stream.send({"text": "hi"})
    assert await asyncio.wait_for(stream.receive(), 5) == {"text": "HI"}
    await alink.close()
    assert await asyncio.wait_for(stream.receive(), 5) is None
    assert stream.closed_reason  # why, e.g. "agent a1 closed its link"
    with pytest.raises(StreamClosed):
        await stream.send({"text": "late"})
    with pytest.raises(AgentUnavailable):
        await mlink.open_stream("a1", "echo", {})


async def test_closing_the_manager_link_ends_its_streams(connect: Transport) -> None:
    agent = AgentEnd("a1")
    mlink, alink, _ = await connect(Manager(), agent)
    stream = await mlink.open_stream("a1", "echo", {})
    await mlink.close()
    assert await asyncio.wait_for(stream.receive(), 5) is None
    assert stream.closed_reason == "the link is closed"
    with pytest.raises(StreamClosed):
        await stream.send({"text": "late"})
    await (alink.abort() if hasattr(alink, "abort") else alink.drop())  # no manager to say bye to
