"""The messages between manager and agents, defined once for both ends and both links.

Each is a dataclass that travels as a dict of plain values (what msgpack and JSON carry): `to_wire()` on
the sending side, `from_wire()` on the receiving one (unknown keys are ignored, so either end may be newer;
a missing or mistyped field is a `MessageError`).

- Calls, manager → agent (`Call` subclasses, `method` names them on the wire), each with the type of its
  answer (`decode_result`). The manager sends them with `call()`; the agent finds its handler by type.
- Events, agent → manager (`Event` subclasses, `name` on the wire), delivered in order.
- Registration and its answer, when an agent joins (again).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from bai.node.link.base import ManagerLink

R = TypeVar("R")
M = TypeVar("M", bound="Message")


class MessageError(ValueError):
    """A message that does not have the fields its type needs."""


class Message:
    """A dataclass that travels as a dict of plain values."""

    _nested: ClassVar[dict[str, type[Message]]] = {}  # field -> the Message type of its list items
    _single: ClassVar[frozenset[str]] = frozenset()  # those of `_nested` that hold one message (or None)

    def to_wire(self) -> dict[str, Any]:
        out = {}
        for name in _field_names(type(self)):
            value = getattr(self, name)
            if name in self._nested and value is not None:
                value = value.to_wire() if isinstance(value, Message) else [item.to_wire() for item in value]
            out[name] = value
        return out

    @classmethod
    def from_wire(cls: type[M], data: Any) -> M:
        if not isinstance(data, dict):
            raise MessageError(f"{cls.__name__}: expected a mapping, got {type(data).__name__}")
        names = _field_names(cls)
        values = {k: v for k, v in data.items() if k in names}
        for name, kind in cls._nested.items():
            if name in values:
                items = values[name]
                if name in cls._single:  # one message (or None)
                    values[name] = None if items is None else kind.from_wire(items)
                    continue
                if not isinstance(items, list):
                    raise MessageError(f"{cls.__name__}.{name}: expected a list")
                values[name] = [kind.from_wire(item) for item in items]
        try:
            return cls(**values)
        except TypeError as e:
            raise MessageError(f"{cls.__name__}: {e}") from None


_FIELDS: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


class Call(Message, Generic[R]):
    """A call from the manager to one agent; `decode_result` turns the answer into its type."""

    method: ClassVar[str]

    def decode_result(self, raw: Any) -> R:
        return raw


class Event(Message):
    """An event from an agent to the manager."""

    name: ClassVar[str]


# -- joining ----------------------------------------------------------------------------------------------


@dataclass
class KernelInfo(Message):
    """A kernel an agent has, as it registers."""

    kernel_id: str
    session_id: str = ""
    container_id: str | None = None


@dataclass
class Registration(Message):
    """What an agent registers with (again after every restart or reconnect)."""

    _nested: ClassVar[dict[str, type[Message]]] = {"kernels": KernelInfo}

    id: str
    hostname: str = ""
    backend: str = ""
    version: str = ""
    architecture: str = ""
    scaling_group: str = "default"
    slots: dict[str, str] = field(default_factory=dict)
    kernels: list[KernelInfo] = field(default_factory=list)
    images: list[dict[str, Any]] = field(default_factory=list)  # name, labels, …
    vfolder_hosts: dict[str, str] = field(default_factory=dict)  # host name -> the path the agent sees
    gpus: list[dict[str, Any]] = field(default_factory=list)  # index, uuid, name, memory_total
    warm: dict[str, int] = field(default_factory=dict)  # image -> warm kernels ready (its warm pool)


@dataclass
class JoinAnswer(Message):
    """The manager's answer to a registration: kernels it does not know, to remove."""

    destroy: list[str] = field(default_factory=list)


# -- calls --------------------------------------------------------------------------------------------------


@dataclass
class Ping(Call[dict[str, Any]]):
    """Is the agent there (and how many kernels does it run)?"""

    method: ClassVar[str] = "ping"


@dataclass
class MountSpec(Message):
    """A virtual folder in a kernel: the host directory (as the agent sees it) and where it appears."""

    host_path: str
    target: str
    read_only: bool = False


@dataclass
class DotfileSpec(Message):
    """A file written into every new kernel's home."""

    path: str
    data: str
    permission: str = "644"  # octal, as text


@dataclass
class ClusterSpec(Message):
    """A kernel's place in a multi-container session (CreateKernel.cluster; None for a one-kernel session).

    Its name is `{cluster_role}{cluster_idx}` (CreateKernel); the BACKENDAI_CLUSTER_* variables come in
    CreateKernel.environ (the manager adds them, bai/common/cluster.py); the session's SSH keypair in its
    dotfiles (.ssh/id_cluster, id_cluster.pub, authorized_keys, config).

    On each agent, the session's kernels there share the Docker network `network` (the agent creates it with
    the session's first kernel there and removes it with the last; each kernel joins it under its name), so
    they reach each other on every port. multi-node: a kernel on ANOTHER agent (`agents[rank]` differs) is
    stood in for on this network by a peer proxy under its name, which relays CLUSTER_PORTS through the
    agents' link to the manager (bai/common/cluster.py): kernels keep no route outside and no host opens a port.
    """

    size: int
    mode: str  # single-node | multi-node
    rank: int  # 0: main1, 1: sub1, …
    local_rank: int = 0  # index among the session's kernels on this agent
    network: str = ""  # the session's Docker network on this agent
    hosts: list[str] = field(default_factory=list)  # every kernel's name, main1 first (by rank)
    agents: list[str] = field(default_factory=list)  # the agent of each kernel (by rank)


@dataclass
class KernelCreated(Message):
    """The answer to CreateKernel: where the kernel runs and what it holds."""

    kernel_id: str
    gpus: list[list[str]] = field(default_factory=list)  # [device uuid, share] held
    container_id: str | None = None
    pid: int | None = None
    query: bool = True  # it runs Python code (else only commands)
    service_ports: list[dict[str, Any]] = field(default_factory=list)  # its apps (ServicePort.to_wire)


@dataclass
class CreateKernel(Call[KernelCreated]):
    """Start a session's kernel."""

    method: ClassVar[str] = "create_kernel"
    _nested: ClassVar[dict[str, type[Message]]] = {
        "mounts": MountSpec,
        "dotfiles": DotfileSpec,
        "cluster": ClusterSpec,
    }
    _single: ClassVar[frozenset[str]] = frozenset({"cluster"})

    kernel_id: str
    session_id: str
    session_name: str
    access_key: str
    image: str
    slots: dict[str, str]
    environ: dict[str, str] = field(default_factory=dict)
    cluster_role: str = "main"
    cluster_idx: int = 1
    network: str | None = None
    pull: dict[str, Any] | None = None  # {"registry", "auth"}: for this pull only; never stored or logged
    mounts: list[MountSpec] = field(default_factory=list)
    dotfiles: list[DotfileSpec] = field(default_factory=list)
    cluster: ClusterSpec | None = None  # a kernel of a multi-container session

    def decode_result(self, raw: Any) -> KernelCreated:
        return KernelCreated.from_wire(raw)


@dataclass
class Destroyed(Message):
    """The answer to DestroyKernel: whether the agent had the kernel, and its last statistics (a sample
    taken just before it was killed; see bai/common/stats.py), None when it could not be read."""

    existed: bool = False
    stats: dict[str, Any] | None = None


@dataclass
class DestroyKernel(Call[Destroyed]):
    """Remove a kernel; the answer says whether the agent had it, with the kernel's final statistics."""

    method: ClassVar[str] = "destroy_kernel"

    kernel_id: str
    reason: str = "user-requested"

    def decode_result(self, raw: Any) -> Destroyed:
        if isinstance(raw, dict):
            return Destroyed.from_wire(raw)
        return Destroyed(existed=bool(raw))  # an agent of before statistics answers a bare bool


@dataclass
class RunResult(Message):
    """What a run printed since the last poll, and where it stands."""

    run_id: str
    status: str  # continued | waiting-input | finished
    console: list[list[str]] = field(default_factory=list)  # [stream, text] pieces
    exit_code: int | None = None
    options: dict[str, Any] | None = None  # waiting-input: {"is_password": …}
    queue: dict[str, Any] | None = None  # a run waiting its turn: {"behind", "ahead"}
    cancelled: bool = False  # it left the queue before it ran

    def to_api(self) -> dict[str, Any]:
        """Backend.AI's execution result object (bai adds `queue` while a run waits)."""
        out: dict[str, Any] = {
            "runId": self.run_id,
            "status": self.status,
            "console": self.console,
            "exitCode": self.exit_code,
            "options": self.options,
        }
        if self.queue is not None:
            out["queue"] = self.queue
        return out


@dataclass
class Execute(Call[RunResult]):
    """Start (query, batch), feed (input, input-eof) or poll (continue) a run in a kernel."""

    method: ClassVar[str] = "execute"

    kernel_id: str
    run_id: str
    mode: str
    code: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    flush_timeout: float = 2.0

    def decode_result(self, raw: Any) -> RunResult:
        return RunResult.from_wire(raw)


@dataclass
class Interrupt(Call[bool]):
    """Interrupt `run_id` (a waiting run leaves the queue), else whatever runs; whether there was one."""

    method: ClassVar[str] = "interrupt"

    kernel_id: str
    run_id: str | None = None


@dataclass
class UploadFiles(Call[None]):
    """Write files into a kernel's home."""

    method: ClassVar[str] = "upload_files"

    kernel_id: str
    files: list[list[Any]] = field(default_factory=list)  # [relative path, bytes]


@dataclass
class ListFiles(Call[dict[str, Any]]):
    """List a folder as the kernel sees it."""

    method: ClassVar[str] = "list_files"

    kernel_id: str
    path: str


@dataclass
class DownloadFiles(Call[list[bytes]]):
    """Files of a kernel (paths relative to its home, or absolute inside it): one tar archive per path, each
    holding the file (or folder) under its own name, as `docker cp` makes it."""

    method: ClassVar[str] = "download_files"

    kernel_id: str
    paths: list[str] = field(default_factory=list)
    max_bytes: int = 64 * 1024 * 1024  # for all the archives together

    def decode_result(self, raw: Any) -> list[bytes]:
        if not isinstance(raw, list) or not all(isinstance(b, bytes | bytearray) for b in raw):
            raise MessageError("DownloadFiles: expected a list of archives")
        return [bytes(b) for b in raw]


@dataclass
class RestartKernel(Call[bool]):
    """Restart a kernel's process (a fresh runner: Python's namespace is new), keeping its container, home and
    apps' ports; runs still going end. The answer: whether the agent had the kernel."""

    method: ClassVar[str] = "restart_kernel"

    kernel_id: str

    def decode_result(self, raw: Any) -> bool:
        return bool(raw)


@dataclass
class CommitKernel(Call[dict[str, Any]]):
    """Save a kernel's container as an image on its agent (`docker commit`); the answer is the image as
    ListImages gives it (name, id, size, labels)."""

    method: ClassVar[str] = "commit_kernel"

    kernel_id: str
    image: str  # repository:tag to give it


@dataclass
class ListImages(Call[list[dict[str, Any]]]):
    """The images the agent has (name, labels, …)."""

    method: ClassVar[str] = "images"


@dataclass
class PullImage(Call[dict[str, Any]]):
    """Pull an image from a registry the manager allowed."""

    method: ClassVar[str] = "pull_image"

    image: str
    auth: dict[str, str] | None = None  # the registry's credentials, for this pull only


@dataclass
class RemoveImage(Call[None]):
    """Remove an image from the agent."""

    method: ClassVar[str] = "remove_image"

    image: str


@dataclass
class OpenTerminal(Message):
    """Open a stream (kind `terminal`): `command` on a pseudo-terminal in a kernel (None: its shell).
    Frames: see bai/node/agent/terminal.py."""

    kind: ClassVar[str] = "terminal"

    kernel_id: str
    command: list[str] | None = None
    rows: int = 24
    cols: int = 80


@dataclass
class StartApp(Call[dict[str, Any]]):
    """Start an app in a kernel unless it runs; the answer: {"ok", "started", "error"?, "output"?,
    "token"?} ("token": the app's secret when it has one, see bai/common/service_ports.py)."""

    method: ClassVar[str] = "start_app"

    kernel_id: str
    app: str


@dataclass
class OpenTunnel(Message):
    """Open a stream (kind `tunnel`): a TCP connection to an app's port inside a kernel.
    Frames, both ways: {"t": "data", "d": bytes}, {"t": "eof"} (no more data this way)."""

    kind: ClassVar[str] = "tunnel"

    kernel_id: str
    app: str


@dataclass
class OpenPeerTunnel(Message):
    """Open a stream (kind `peer-tunnel`): a TCP connection to `port` inside a kernel of a multi-node session,
    for another kernel of the same session on another agent (the manager checked both). Frames as OpenTunnel's."""

    kind: ClassVar[str] = "peer-tunnel"

    kernel_id: str
    port: int


@dataclass
class PeerDialed(Message):
    """Open a stream (kind `peer-dialed`): the far end of the connection a kernel asked for with PeerDial
    `dial_id` (frames as OpenTunnel's). With `error`, the connection could not be made: the agent closes the
    kernel's side at once, and the manager closes the stream."""

    kind: ClassVar[str] = "peer-dialed"

    dial_id: str
    error: str = ""


STREAMS: dict[str, type[Message]] = {
    m.kind: m
    for m in (OpenTerminal, OpenTunnel, OpenPeerTunnel, PeerDialed)  # type: ignore[attr-defined]
}


CALLS: dict[str, type[Call[Any]]] = {
    c.method: c
    for c in (
        Ping,
        CreateKernel,
        DestroyKernel,
        Execute,
        Interrupt,
        UploadFiles,
        ListFiles,
        DownloadFiles,
        RestartKernel,
        CommitKernel,
        ListImages,
        PullImage,
        RemoveImage,
        StartApp,
    )
}


async def call(link: ManagerLink, agent_id: str, message: Call[R], timeout: float | None = None) -> R:
    """Send a call to an agent and decode its answer."""
    raw = await link.call(agent_id, message.method, message.to_wire(), timeout=timeout)
    return message.decode_result(raw)


def encode_result(result: Any) -> Any:
    """An answer as it travels."""
    return result.to_wire() if isinstance(result, Message) else result


# -- events ---------------------------------------------------------------------------------------------


@dataclass
class Heartbeat(Event):
    """Every few seconds: what the agent's kernels hold, whether it takes new ones, its GPUs' use."""

    name: ClassVar[str] = "heartbeat"

    occupied_slots: dict[str, str] = field(default_factory=dict)
    kernels: list[str] = field(default_factory=list)
    schedulable: bool = True
    gpus: list[dict[str, Any]] | None = None
    warm: dict[str, int] | None = None  # image -> warm kernels ready (None: an agent without a warm pool)


@dataclass
class KernelLogs(Event):
    """Kernels' output since the last batch: [kernel id, text] pieces, in order."""

    name: ClassVar[str] = "kernel_logs"

    chunks: list[list[str]] = field(default_factory=list)


@dataclass
class KernelPulling(Event):
    """A kernel waits for its image to be pulled: how far it got (bytes)."""

    name: ClassVar[str] = "kernel_pulling"

    kernel_id: str
    session_id: str
    image: str
    done: int = 0
    total: int = 0


@dataclass
class KernelTerminated(Event):
    """A kernel ended by itself (its process exited, or it was killed)."""

    name: ClassVar[str] = "kernel_terminated"

    kernel_id: str
    session_id: str = ""
    reason: str = "self-terminated"
    exit_code: int | None = None
    msg: str | None = None  # why, when the agent knows (e.g. out of memory, naming the limit)
    stats: dict[str, Any] | None = None  # its last statistics sample (bai/common/stats.py), when read


@dataclass
class KernelStats(Event):
    """Every `[agent] stat_interval` seconds: a statistics sample of each running kernel and of the host.

    `samples`: kernel id -> a kernel sample; `node`: the host's sample; both shaped as bai/common/stats.py
    describes (plain values: what msgpack and JSON carry)."""

    name: ClassVar[str] = "kernel_stats"

    samples: dict[str, dict[str, Any]] = field(default_factory=dict)
    node: dict[str, Any] = field(default_factory=dict)


@dataclass
class PeerDial(Event):
    """A kernel of a multi-node session connects to `port` of `host` (another kernel of its session, on
    another agent): the manager opens an OpenPeerTunnel stream to that kernel's agent and a PeerDialed stream
    (`dial_id`) back to this agent, and relays between them."""

    name: ClassVar[str] = "peer_dial"

    dial_id: str
    kernel_id: str  # the kernel that connects
    host: str  # the kernel it connects to, by name (sub1)
    port: int


EVENTS: dict[str, type[Event]] = {
    e.name: e for e in (Heartbeat, KernelLogs, KernelPulling, KernelTerminated, KernelStats, PeerDial)
}


def decode_event(name: str, payload: Any) -> Event:
    """An event as the manager handles it; MessageError for an unknown name or a malformed payload."""
    kind = EVENTS.get(name)
    if kind is None:
        raise MessageError(f"unknown event {name!r}")
    return kind.from_wire(payload)
