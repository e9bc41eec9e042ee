"""The link's messages are typed end to end: every field's type is checked when a message is decoded (a wrong
one is a MessageError naming the message and the field), every answer is a typed struct, the wire stays the
same dicts of plain values, and the in-process link carries them through msgpack as the ZeroMQ link does."""

from __future__ import annotations

import logging
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bai.node.link import messages as m
from bai.node.link.base import RemoteError
from bai.node.link.inproc import InprocHub
from bai.node.link.messages import (
    CALLS,
    EVENTS,
    STREAMS,
    AppStarted,
    ClusterSpec,
    CommitKernel,
    CreateKernel,
    DestroyKernel,
    DownloadFiles,
    Execute,
    FileListing,
    GpuDevice,
    GpuLive,
    Heartbeat,
    ImageInfo,
    KernelInfo,
    KernelLogs,
    ListFiles,
    ListImages,
    Message,
    MessageError,
    MountSpec,
    Part,
    Ping,
    Pong,
    PullGrant,
    PullImage,
    QueuePlace,
    Registration,
    RegistryAuth,
    RunResult,
    StartApp,
    UploadFiles,
    call,
)
from bai.node.link.wire import carried
from tests.harness import Harness


def error_of(kind: type[Message | Part], data: Any) -> str:
    with pytest.raises(MessageError) as e:
        kind.from_wire(data)
    return str(e.value)


def test_a_wrong_type_is_an_error_naming_the_message_and_the_field() -> None:
    assert error_of(Execute, {"kernel_id": 5, "mode": ["x"], "flush_timeout": "abc"}) == (
        "Execute.kernel_id: expected str, got int"
    )
    assert (
        error_of(Execute, {"kernel_id": "k", "run_id": "r", "mode": ["x"]}) == "Execute.mode: expected str, got array"
    )
    assert error_of(Execute, {"kernel_id": "k", "run_id": "r", "mode": "query", "flush_timeout": "abc"}) == (
        "Execute.flush_timeout: expected float, got str"
    )
    assert error_of(Execute, {"run_id": "r", "mode": "query"}) == "Execute.kernel_id: missing (it is required)"
    assert error_of(Execute, ["not", "a", "map"]) == "Execute: expected object, got array"


@pytest.mark.parametrize(
    ("kind", "data", "said"),
    [
        # a nested message, and a list of them
        (
            CreateKernel,
            {"kernel_id": "k", "session_id": "s", "session_name": "n", "access_key": "a", "image": "i", "slots": {}}
            | {"cluster": {"size": 2, "mode": "single-node", "rank": "0"}},
            "CreateKernel.cluster.rank: expected int, got str",
        ),
        (
            CreateKernel,
            {"kernel_id": "k", "session_id": "s", "session_name": "n", "access_key": "a", "image": "i", "slots": {}}
            | {"mounts": [{"host_path": "/a", "target": "/b"}, {"host_path": 1, "target": "/c"}]},
            "CreateKernel.mounts[1].host_path: expected str, got int",
        ),
        (Registration, {"id": "a1", "kernels": [{"session_id": "s"}]}, "Registration.kernels[0].kernel_id: missing"),
        (Registration, {"id": "a1", "kernels": "k1"}, "Registration.kernels: expected array, got str"),
        # an optional field holds its type or None
        (KernelInfo, {"kernel_id": "k", "container_id": 5}, "KernelInfo.container_id: expected str | null, got int"),
        # a bool is not an int; dict[str, str] checks keys and values
        (ClusterSpec, {"size": True, "mode": "single-node", "rank": 0}, "ClusterSpec.size: expected int, got bool"),
        (Registration, {"id": "a1", "slots": {"cpu": 4}}, "Registration.slots[...]: expected str, got int"),
        (Registration, {"id": "a1", "slots": {4: "cpu"}}, "Registration.slots (a key): expected str, got int"),
        # bytes are bytes (never base64 text)
        (UploadFiles, {"kernel_id": "k", "files": [["a.txt", "aGk="]]}, "UploadFiles.files[0][1]: expected bytes"),
        (UploadFiles, {"kernel_id": "k", "files": [["a.txt"]]}, "UploadFiles.files[0]: expected array of length 2"),
    ],
)
def test_nested_optional_and_container_fields_are_checked(kind: type[Message], data: Any, said: str) -> None:
    assert error_of(kind, data).startswith(said)


CREATE = {"kernel_id": "k", "session_id": "s", "session_name": "n", "access_key": "a", "image": "i", "slots": {}}


@pytest.mark.parametrize(
    ("kind", "data", "said"),
    [
        # the registration's images and GPUs
        (
            Registration,
            {"id": "a1", "images": [{"name": "a:1", "id": "x", "size": 0}, {"name": "b", "id": "y", "size": "big"}]},
            "Registration.images[1].size: expected int, got str",
        ),
        (Registration, {"id": "a1", "images": [{"name": "a:1", "size": 0}]}, "Registration.images[0].id: missing"),
        (
            Registration,
            {"id": "a1", "images": [{"name": "a:1", "id": "x", "size": 0, "labels": {"a": 1}}]},
            "Registration.images[0].labels[...]: expected str, got int",
        ),
        (
            Registration,
            {"id": "a1", "gpus": [{"index": "0", "uuid": "GPU-1", "name": "A100", "memory_total": 1}]},
            "Registration.gpus[0].index: expected int, got str",
        ),
        (Registration, {"id": "a1", "gpus": [{"index": 0}]}, "Registration.gpus[0].uuid: missing"),
        (Registration, {"id": "a1", "gpus": ["GPU-1"]}, "Registration.gpus[0]: expected object, got str"),
        # the GPUs' live use
        (
            Heartbeat,
            {"gpus": [{"uuid": "GPU-1", "utilization": "busy", "memory_used": 0}]},
            "Heartbeat.gpus[0].utilization: expected int | null, got str",
        ),
        (Heartbeat, {"gpus": [{"uuid": "GPU-1", "allocated": 0.5}]}, "Heartbeat.gpus[0].allocated: expected str"),
        (Heartbeat, {"gpus": [{"uuid": "GPU-1", "error": None}]}, "Heartbeat.gpus[0].error: expected str, got null"),
        # a pull's registry and credentials
        (CreateKernel, CREATE | {"pull": {"auth": None}}, "CreateKernel.pull.registry: missing"),
        (
            CreateKernel,
            CREATE | {"pull": {"registry": "r.example", "auth": {"username": 1, "password": "p"}}},
            "CreateKernel.pull.auth.username: expected str, got int",
        ),
        (CreateKernel, CREATE | {"pull": "r.example"}, "CreateKernel.pull: expected object | null, got str"),
        (PullImage, {"image": "a:1", "auth": {"username": "u"}}, "PullImage.auth.password: missing"),
        # where a waiting run stands
        (
            RunResult,
            {"run_id": "r", "status": "continued", "queue": {"behind": "r1", "ahead": "1"}},
            "RunResult.queue.ahead: expected int, got str",
        ),
        (RunResult, {"run_id": "r", "status": "continued", "queue": [1]}, "RunResult.queue: expected object | null"),
        # a part on its own
        (GpuDevice, {"index": True, "uuid": "u"}, "GpuDevice.index: expected int, got bool"),
        (QueuePlace, {"behind": 1}, "QueuePlace.behind: expected str | null, got int"),
    ],
)
def test_the_parts_of_messages_are_checked_down_to_their_fields(
    kind: type[Message | Part], data: Any, said: str
) -> None:
    assert error_of(kind, data).startswith(said)


def test_what_todays_agents_send_decodes_to_the_parts_and_travels_the_same() -> None:
    gpu = {"index": 0, "uuid": "GPU-1", "name": "A100", "memory_total": 80 << 30}
    labels = {"ai.backend.resource.min.mem": "1g"}
    image = {"name": "a:1", "id": "sha256:x", "size": 5, "labels": labels}
    local = {"name": "python", "id": "local", "size": 0, "python": "3.11.2"}
    wire = {"id": "a1", "images": [image, local], "gpus": [gpu]}
    joined = Registration.from_wire(wire)
    assert joined.gpus == [GpuDevice(0, "GPU-1", "A100", 80 << 30)]
    assert joined.images == [
        ImageInfo("a:1", "sha256:x", 5, labels),
        ImageInfo("python", "local", 0, python="3.11.2"),
    ]
    assert {k: v for k, v in joined.to_wire().items() if k in wire} == wire
    answered = {"uuid": "GPU-1", "utilization": 40, "memory_used": 1 << 30, "allocated": "0.5"}
    silent = {"uuid": "GPU-2", "utilization": None, "memory_used": None, "error": "NVMLError: gone", "allocated": "0"}
    beat = Heartbeat.from_wire({"gpus": [answered, silent]})
    assert beat.gpus == [GpuLive("GPU-1", 40, 1 << 30, "0.5"), GpuLive("GPU-2", None, None, "0", "NVMLError: gone")]
    assert beat.to_wire()["gpus"] == [answered, silent]  # `error` only where a device did not answer
    assert Heartbeat.from_wire({"gpus": None}).gpus is None
    grant = {"registry": "r.example", "auth": {"username": "u", "password": "p", "serveraddress": "r.example"}}
    made = CreateKernel.from_wire(CREATE | {"pull": grant})
    assert made.pull == PullGrant("r.example", RegistryAuth("u", "p", "r.example"))
    assert made.to_wire()["pull"] == grant
    assert CreateKernel.from_wire(CREATE | {"pull": {"registry": "r.example", "auth": None}}).to_wire()["pull"] == (
        {"registry": "r.example", "auth": None}
    )
    assert PullImage("a:1", RegistryAuth("u", "p")).to_wire() == (
        {"image": "a:1", "auth": {"username": "u", "password": "p", "serveraddress": ""}}
    )
    waiting = RunResult.from_wire({"run_id": "r2", "status": "continued", "queue": {"behind": "r1", "ahead": 1}})
    assert waiting.queue == QueuePlace("r1", 1)
    assert waiting.to_api()["queue"] == {"behind": "r1", "ahead": 1}  # the API shows it as before
    assert waiting.to_wire()["queue"] == {"behind": "r1", "ahead": 1}
    assert "queue" not in RunResult("r", "finished").to_api()
    with pytest.raises(AttributeError):  # the parts are frozen
        waiting.queue.ahead = 2  # type: ignore[misc]


def test_defaults_unknown_keys_ints_for_floats_and_none_for_optionals() -> None:
    run = Execute.from_wire({"kernel_id": "k", "run_id": "r", "mode": "query", "flush_timeout": 3, "newer": 1})
    assert run == Execute("k", "r", "query", "", {}, 3.0)
    assert isinstance(run.flush_timeout, float)
    assert Execute.from_wire(run.to_wire()) == run
    assert KernelInfo.from_wire({"kernel_id": "k", "container_id": None}) == KernelInfo("k")
    made = CreateKernel.from_wire(
        {"kernel_id": "k", "session_id": "s", "session_name": "n", "access_key": "a", "image": "i", "slots": {}}
        | {"mounts": [{"host_path": "/a", "target": "/b"}], "cluster": None}
    )
    assert made.mounts == [MountSpec("/a", "/b")] and made.cluster is None and made.cluster_idx == 1
    assert made.environ == {} and made.environ is not CreateKernel("k", "s", "n", "a", "i", {}).environ
    uploaded = UploadFiles.from_wire({"kernel_id": "k", "files": [["a.txt", b"\x00hi"]]})
    assert uploaded.files == [("a.txt", b"\x00hi")]


# -- the wire -----------------------------------------------------------------------------------------------

SAMPLES: list[Message] = [
    Registration("a1", "h", "sim", "1", "x86_64", slots={"cpu": "4"}, kernels=[KernelInfo("k1", "s1", "c1")]),
    Registration(
        "a2",
        images=[ImageInfo("a:1", "x", 1, {"k": "v"}), ImageInfo("python", "local", 0, python="3.11")],
        gpus=[GpuDevice(0, "GPU-1", "A100", 1 << 30)],
    ),
    Heartbeat(gpus=[GpuLive("GPU-1", 5, 10, "1"), GpuLive("GPU-2", error="gone")]),
    CreateKernel("k", "s", "n", "ak", "r.example/python:3", {}, pull=PullGrant("r.example", RegistryAuth("u", "p"))),
    PullImage("r.example/python:3", RegistryAuth("u", "p", "r.example")),
    RunResult("r2", "continued", queue=QueuePlace("r1", 1)),
    CreateKernel(
        "k",
        "s",
        "n",
        "ak",
        "python",
        {"cpu": "1"},
        mounts=[MountSpec("/h", "/home/work/d", True)],
        cluster=ClusterSpec(2, "multi-node", 1, hosts=["main1", "sub1"], agents=["a1", "a2"]),
    ),
    Execute("k", "r", "query", "print(1)", {"exec": "x"}, 2.5),
    UploadFiles("k", [("a.txt", b"\x00\xff")]),
    DownloadFiles("k", ["a.txt"], 10),
    RunResult("r", "finished", [["stdout", "1\n"]], 0),
    KernelLogs([("k1", "line\n"), ("k2", "other\n")]),
    Pong("a1", 3),
    FileListing('[{"filename": "a"}]', "", "/home/work"),
    ImageInfo("python:3.11", "sha256:x", 10, {"ai.backend.service-ports": "x"}),
    ImageInfo("python", "local", 0, python="3.11.2"),
    AppStarted(True, True, token="t" * 20),
]


@pytest.mark.parametrize("message", SAMPLES, ids=lambda s: type(s).__name__)
def test_a_message_travels_as_plain_values_and_comes_back_the_same(message: Message) -> None:
    wire = message.to_wire()
    packed = msgpack.packb(wire, use_bin_type=True)  # what the ZeroMQ link sends: plain values only
    back = msgpack.unpackb(packed, raw=False, strict_map_key=False)
    assert type(message).from_wire(back) == message
    assert type(message).from_wire(carried(wire)) == message


def test_the_wire_is_the_dicts_of_before() -> None:
    assert Execute("k", "r", "query").to_wire() == {
        "kernel_id": "k",
        "run_id": "r",
        "mode": "query",
        "code": "",
        "options": {},
        "flush_timeout": 2.0,
        "after": None,  # (since answers are numbered: a caller that missed some asks for them again)
    }
    assert KernelInfo("k").to_wire() == {"kernel_id": "k", "session_id": "", "container_id": None}
    # an image's labels and python travel only when the backend has them (the shapes the API shows)
    assert ImageInfo("a:1", "x", 5, {}).to_wire() == {"name": "a:1", "id": "x", "size": 5, "labels": {}}
    assert ImageInfo("python", "local", 0, python="3.11").to_api() == {
        "name": "python",
        "id": "local",
        "size": 0,
        "python": "3.11",
    }
    assert list(FileListing("[]", "", "/home/work").to_wire()) == ["files", "errors", "abspath"]


# -- the six answers that were plain dicts -------------------------------------------------------------------

ANSWERS: list[tuple[m.Call[Any], Any, Any]] = [
    (Ping(), {"id": "a1", "kernels": 2}, Pong("a1", 2)),
    (
        ListFiles("k", "/home/work"),
        {"files": "[]", "errors": "", "abspath": "/home/work"},
        FileListing("[]", "", "/home/work"),
    ),
    (
        CommitKernel("k", "mine:1"),
        {"name": "mine:1", "id": "sha256:1", "size": 9, "labels": {"a": "b"}},
        ImageInfo("mine:1", "sha256:1", 9, {"a": "b"}),
    ),
    (
        ListImages(),
        [
            {"name": "a:1", "id": "x", "size": 0, "labels": {}},
            {"name": "python", "id": "local", "size": 0, "python": "3"},
        ],
        [ImageInfo("a:1", "x", 0, {}), ImageInfo("python", "local", 0, python="3")],
    ),
    (PullImage("a:1"), {"name": "a:1", "id": "x", "size": 1, "labels": {}}, ImageInfo("a:1", "x", 1, {})),
    (
        StartApp("k", "jupyter"),
        {"ok": False, "started": False, "error": "boom", "output": "trace"},
        AppStarted(False, False, "boom", "trace"),
    ),
]


@pytest.mark.parametrize(("message", "raw", "typed"), ANSWERS, ids=lambda a: type(a).__name__)
def test_the_answers_are_typed_structs(message: m.Call[Any], raw: Any, typed: Any) -> None:
    assert message.decode_result(raw) == typed
    assert message.decode_result(carried(m.encode_result(typed))) == typed  # what the agent sends back


@pytest.mark.parametrize(
    ("message", "raw", "said"),
    [
        (Ping(), {"id": 1}, "Ping Pong.id: expected str, got int"),
        (ListImages(), [{"name": "a"}], "ListImages answer[0].id: missing"),
        (StartApp("k", "a"), {"ok": "yes"}, "StartApp AppStarted.ok: expected bool, got str"),
        (DownloadFiles("k", ["a"]), ["text"], "DownloadFiles answer[0]: expected bytes, got str"),
        (Execute("k", "r", "query"), {"run_id": "r", "status": 1}, "Execute RunResult.status: expected str, got int"),
    ],
)
def test_an_answer_of_the_wrong_type_is_a_message_error(message: m.Call[Any], raw: Any, said: str) -> None:
    with pytest.raises(MessageError) as e:
        message.decode_result(raw)
    assert str(e.value).startswith(said)


def test_a_destroyed_answer_of_an_older_agent_still_decodes() -> None:
    assert DestroyKernel("k").decode_result(True).existed is True
    assert DestroyKernel("k").decode_result({"existed": True, "stats": None}).existed is True


class _Answers:
    """An agent's end that answers every call with `answer` (as it comes from a handler)."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.args: list[Any] = []

    async def registration(self) -> dict[str, Any]:
        return Registration("a1").to_wire()

    async def rejoined(self, answer: dict[str, Any]) -> None:
        pass

    def heartbeat(self) -> dict[str, Any]:
        return {}

    async def handle_call(self, method: str, args: dict[str, Any]) -> Any:
        self.args.append(args)
        return self.answer

    async def handle_stream(self, kind: str, args: dict[str, Any], stream: Any) -> None:
        await stream.send({"echo": args, "t": ("a", b"\x00")})
        await stream.close()


class _Manager:
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    async def agent_joined(self, agent_id: str, registration: dict[str, Any]) -> dict[str, Any]:
        self.registration = registration
        return {"destroy": ("k-old",)}

    async def agent_event(self, agent_id: str, name: str, payload: dict[str, Any]) -> None:
        self.events.append((name, payload))

    async def agent_left(self, agent_id: str, reason: str) -> None:
        pass


async def test_the_in_process_link_carries_what_zmq_would() -> None:
    """Through msgpack both ways: tuples arrive as lists, bytes as bytes, and a value msgpack cannot carry
    fails where it is sent (an answer that cannot travel is the agent's error)."""
    hub = InprocHub(heartbeat_interval=3600)
    manager = _Manager()
    await hub.manager.start(manager)
    agent = _Answers({"id": "a1", "kernels": 1, "extra": ("x", 1)})
    link = hub.agent_link("a1")
    try:
        assert await link.join(agent) == {"destroy": ["k-old"]}
        assert manager.registration == Registration("a1").to_wire()
        assert await call(hub.manager, "a1", Ping()) == Pong("a1", 1)
        await hub.manager.call("a1", "x", {"files": [("a", b"\x00")]})
        assert agent.args[-1] == {"files": [["a", b"\x00"]]}
        with pytest.raises(TypeError):  # arguments that cannot travel: refused where the call is made
            await hub.manager.call("a1", "x", {"when": object()})
        agent.answer = {"id": object()}
        with pytest.raises(RemoteError) as e:
            await hub.manager.call("a1", "ping", {})
        assert e.value.kind == "TypeError"
        agent.answer = {"id": 5}  # an answer of the wrong type: a RemoteError the callers already handle
        with pytest.raises(RemoteError) as e:
            await call(hub.manager, "a1", Ping())
        assert e.value.kind == "MessageError" and "Ping Pong.id: expected str, got int" in e.value.message
        await link.report("kernel_logs", {"chunks": [("k1", "hi\n")]})
        assert manager.events[-1] == ("kernel_logs", {"chunks": [["k1", "hi\n"]]})
        with pytest.raises(TypeError):
            await link.emit("kernel_logs", {"chunks": {1, 2}})
        stream = await hub.manager.open_stream("a1", "echo", {"n": (1, 2)})
        assert await stream.receive() == {"echo": {"n": [1, 2]}, "t": ["a", b"\x00"]}
    finally:
        await link.close()
        await hub.manager.close()


# -- the two ends: what cannot be decoded ---------------------------------------------------------------------


async def test_a_call_the_agent_cannot_decode_is_answered_with_a_clear_error(tmp_path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("a1")
        with pytest.raises(RemoteError) as e:
            await h.hub.manager.call("a1", "execute", {"kernel_id": 5, "mode": ["x"], "flush_timeout": "abc"})
        assert (e.value.kind, e.value.message) == ("MessageError", "Execute.kernel_id: expected str, got int")
        with pytest.raises(RemoteError) as e:
            await h.hub.manager.call("a1", "list_files", {"kernel_id": "k"})
        assert e.value.message == "ListFiles.path: missing (it is required)"
        assert await call(h.hub.manager, "a1", Ping()) == Pong("a1", 0)  # and it answers on


async def test_events_the_manager_cannot_decode_are_dropped_with_one_log_line(tmp_path, caplog) -> None:
    async with Harness(tmp_path) as h:
        agent = await h.add_agent("a1")
        caplog.set_level(logging.WARNING, logger="bai.manager")
        for i in range(50):
            await agent.link.emit("kernel_logs", {"chunks": [["k1", i]]})
            await agent.link.emit("kernel_terminated", {"kernel_id": i})
        await agent.link.report("no_such_event", {})
        unreadable = [r for r in caplog.records if "cannot read" in r.getMessage()]
        assert len(unreadable) == 1, [r.getMessage() for r in unreadable]
        assert "KernelLogs.chunks[0][1]: expected str, got int" in unreadable[0].getMessage()
        await h.heartbeat("a1")  # the pump goes on: a report returns once the manager handled it


# -- whatever comes: the message's type or a MessageError -----------------------------------------------------

MESSAGE_TYPES = sorted(
    {
        *CALLS.values(),
        *EVENTS.values(),
        *STREAMS.values(),
        *(
            v
            for v in vars(m).values()
            if isinstance(v, type) and issubclass(v, (Message, Part)) and v.__struct_fields__
        ),
    },
    key=lambda t: t.__name__,
)

wire_ints = st.integers(min_value=-(2**63), max_value=2**64 - 1)  # (what msgpack carries: nothing else comes in)
plain = st.one_of(
    st.none(),
    st.booleans(),
    wire_ints,
    st.floats(),
    st.text(max_size=8),
    st.binary(max_size=8),
)
values = st.recursive(
    plain,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.one_of(st.text(max_size=6), wire_ints), inner, max_size=4)
    ),
    max_leaves=12,
)


@st.composite
def wire_of(draw: st.DrawFn, kind: type[Message | Part]) -> Any:
    """Mostly maps with the type's own field names (so that decoding goes deep), else anything."""
    if draw(st.integers(0, 9)) == 0:
        return draw(values)
    names = list(kind.__struct_fields__) + ["unknown"]
    return draw(st.dictionaries(st.sampled_from(names), values, max_size=len(names)))


@pytest.mark.parametrize("kind", MESSAGE_TYPES, ids=lambda t: t.__name__)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_anything_decodes_to_the_type_or_a_message_error(kind: type[Message | Part], data: st.DataObject) -> None:
    wire = data.draw(wire_of(kind))
    try:
        decoded = kind.from_wire(wire)
    except MessageError:
        return
    assert isinstance(decoded, kind)
    assert kind.from_wire(carried(decoded.to_wire())) == decoded or _has_nan(wire)


def _has_nan(value: Any) -> bool:
    if isinstance(value, float):
        return value != value
    if isinstance(value, dict):
        return any(_has_nan(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_nan(v) for v in value)
    return False


def test_registry_credentials_never_show_their_password() -> None:
    from bai.node.link.messages import PullGrant, RegistryAuth

    grant = PullGrant("registry.example:5000", RegistryAuth("alice", "s3cret-pw"))
    assert "s3cret-pw" not in repr(grant) and "s3cret-pw" not in str(
        CreateKernel("k", "s", "n", "AK", "img", {"cpu": "1"}, pull=grant)
    )
    assert grant.to_wire()["auth"]["password"] == "s3cret-pw"  # (on the wire, for the pull, it is there)
