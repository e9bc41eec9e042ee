"""The messages between manager and agents, defined once for both ends and both links.

Each is a msgspec `Struct` that travels as a dict of plain values (what msgpack and JSON carry): `to_wire()` on
the sending side, `from_wire()` on the receiving one, which checks every field's type (nested messages, lists
and dicts of them, optional fields; an int is taken where a float is expected, a bool is not an int). Unknown
keys are ignored, so either end may be newer; a missing or mistyped field is a `MessageError` naming the
message and the field (`Execute.kernel_id: expected str, got int`).

- Calls, manager → agent (`Call` subclasses, `method` names them on the wire), each with the type of its
  answer (`answer`, decoded by `decode_result`). The manager sends them with `call()`; the agent finds its
  handler by type, and sends back what `encode_result` makes of the handler's answer.
- Events, agent → manager (`Event` subclasses, `name` on the wire), delivered in order.
- Registration and its answer, when an agent joins (again).
"""

from __future__ import annotations

from typing import Any, ClassVar, Generic, Self, TypeVar, cast, get_args

import msgspec
import msgspec.structs

from bai.node.link.base import ManagerLink, RemoteError

R = TypeVar("R")

# what msgpack carries as it is: never turned into base64 text on the way out, nor taken from text on the way in
_AS_THEY_ARE = (bytes, bytearray, memoryview)


class MessageError(ValueError):
    """A message that does not have the fields its type needs, or whose fields have other types."""


def _problem(where: str, error: msgspec.ValidationError) -> MessageError:
    """msgspec's `Expected `str`, got `int` - at `$.kernel_id`` as `Execute.kernel_id: expected str, got int`."""
    text, _, at = str(error).partition(" - at ")
    path = at.replace("`", "") or "$"
    if path.startswith("key in "):  # a dict's key: `key` in `$.options`
        path = f"{path.removeprefix('key in ')} (a key)"
    if text.startswith("Object missing required field `"):
        path, text = f"{path}.{text.split('`')[1]}", "missing (it is required)"
    else:
        text = text.replace("`", "")
        text = text[:1].lower() + text[1:]
    return MessageError(f"{path.replace('$', where, 1)}: {text}")


def decode(data: Any, kind: Any, where: str) -> Any:
    """`data` (plain values, as they came off the wire) as `kind` (a Message type, or any type msgspec
    checks: `bool`, `list[bytes]`, …), every field's type checked; MessageError saying `where` and what is wrong."""
    try:
        return msgspec.convert(data, type=kind, builtin_types=_AS_THEY_ARE)
    except msgspec.ValidationError as e:
        raise _problem(where, e) from None


def encode(value: Any) -> Any:
    """A message (or an answer: a message, a list of them, plain values) as plain values, to travel."""
    return msgspec.to_builtins(value, builtin_types=_AS_THEY_ARE)


def _holds_messages(kind: Any) -> bool:
    """Whether a field of this type can hold a message (a Message or a Part, or a list, dict, union … of them), or
    UNSET (a field that travels only when set): what only `encode` turns into plain values."""
    if isinstance(kind, type) and (issubclass(kind, (Message, Part)) or kind is msgspec.UnsetType):
        return True
    return any(_holds_messages(arg) for arg in get_args(kind))


_FLAT: dict[type, bool] = {}  # message type -> whether none of its fields holds a message (to_wire: a plain copy)


class Message(msgspec.Struct):
    """A struct that travels as a dict of plain values."""

    def to_wire(self) -> dict[str, Any]:
        kind = type(self)
        flat = _FLAT.get(kind)
        if flat is None:
            fields = msgspec.structs.fields(kind)
            flat = _FLAT[kind] = (
                not any(_holds_messages(f.type) for f in fields) and not kind.__struct_config__.omit_defaults
            )
        if flat:  # its fields' values are plain already (what a decode made, or what the sender put there)
            return msgspec.structs.asdict(self)
        return cast(dict[str, Any], encode(self))

    @classmethod
    def from_wire(cls, data: Any) -> Self:
        return cast(Self, decode(data, cls, cls.__name__))


class Part(msgspec.Struct, frozen=True):
    """A fixed piece of a message (a GPU, a pull's credentials, …): frozen, its fields checked with its
    message's, and travelling as a dict of plain values whose keys are its fields' names (as the dict it replaced)."""

    def to_wire(self) -> dict[str, Any]:
        return cast(dict[str, Any], encode(self))

    @classmethod
    def from_wire(cls, data: Any) -> Self:
        return cast(Self, decode(data, cls, cls.__name__))


class Call(Message, Generic[R]):
    """A call from the manager to one agent; `decode_result` turns the answer into its type (`answer`)."""

    method: ClassVar[str]
    answer: ClassVar[Any] = None  # the type of the answer (None: nothing)

    def decode_result(self, raw: Any) -> R:
        answer = type(self).answer
        where = answer.__name__ if isinstance(answer, type) and issubclass(answer, Message) else "answer"
        return cast(R, decode(raw, answer, f"{type(self).__name__} {where}"))


class Event(Message):
    """An event from an agent to the manager."""

    name: ClassVar[str]


# -- joining ----------------------------------------------------------------------------------------------


class KernelInfo(Message):
    """A kernel an agent has, as it registers."""

    kernel_id: str
    session_id: str = ""
    container_id: str | None = None


class GpuDevice(Part, frozen=True):
    """One GPU of an agent, as it registers (bai/node/agent/gpus.py, NVML.describe)."""

    index: int
    uuid: str
    name: str = ""
    memory_total: int = 0  # bytes


class Registration(Message):
    """What an agent registers with (again after every restart or reconnect)."""

    id: str
    hostname: str = ""
    backend: str = ""
    version: str = ""
    architecture: str = ""
    scaling_group: str = "default"
    slots: dict[str, str] = {}
    kernels: list[KernelInfo] = []
    images: list[ImageInfo] = []  # as ListImages answers them (labels: minimum resources, apps, …)
    vfolder_hosts: dict[str, str] = {}  # host name -> the path the agent sees
    gpus: list[GpuDevice] = []
    warm: dict[str, int] = {}  # image -> warm kernels ready (its warm pool)


class JoinAnswer(Message):
    """The manager's answer to a registration: kernels it does not know, to remove."""

    destroy: list[str] = []


# -- calls --------------------------------------------------------------------------------------------------


class Pong(Message):
    """The answer to Ping: the agent's id and how many kernels it runs."""

    id: str
    kernels: int = 0


class Ping(Call[Pong]):
    """Is the agent there (and how many kernels does it run)?"""

    method: ClassVar[str] = "ping"
    answer: ClassVar[Any] = Pong


class MountSpec(Message):
    """A virtual folder in a kernel: the host directory (as the agent sees it) and where it appears."""

    host_path: str
    target: str
    read_only: bool = False


class DotfileSpec(Message):
    """A file written into every new kernel's home."""

    path: str
    data: str
    permission: str = "644"  # octal, as text


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
    hosts: list[str] = []  # every kernel's name, main1 first (by rank)
    agents: list[str] = []  # the agent of each kernel (by rank)


class KernelCreated(Message):
    """The answer to CreateKernel: where the kernel runs and what it holds."""

    kernel_id: str
    gpus: list[list[str]] = []  # [device uuid, share] held
    container_id: str | None = None
    pid: int | None = None
    query: bool = True  # it runs Python code (else only commands)
    # its apps (ServicePort.to_wire): left as dicts, since ServicePort.from_wire skips a malformed one on purpose
    service_ports: list[dict[str, Any]] = []


class RegistryAuth(Part, frozen=True):
    """A registry's credentials for one pull, as Docker's X-Registry-Auth takes them (the manager's
    [images.registries], bai/node/manager/rules/admission.py). Never stored or logged."""

    username: str
    password: str
    serveraddress: str = ""

    def __repr__(self) -> str:  # (a log line or a traceback never shows the password)
        return f"RegistryAuth(username={self.username!r}, password='***', serveraddress={self.serveraddress!r})"


class PullGrant(Part, frozen=True):
    """What an agent needs to pull a kernel's image (CreateKernel.pull): the registry the manager allows it to
    pull from, and its credentials (None: anonymous), for this pull only."""

    registry: str
    auth: RegistryAuth | None = None


class CreateKernel(Call[KernelCreated]):
    """Start a session's kernel."""

    method: ClassVar[str] = "create_kernel"
    answer: ClassVar[Any] = KernelCreated

    kernel_id: str
    session_id: str
    session_name: str
    access_key: str
    image: str
    slots: dict[str, str]
    environ: dict[str, str] = {}
    cluster_role: str = "main"
    cluster_idx: int = 1
    network: str | None = None
    pull: PullGrant | None = None  # for this pull only; never stored or logged
    mounts: list[MountSpec] = []
    dotfiles: list[DotfileSpec] = []
    cluster: ClusterSpec | None = None  # a kernel of a multi-container session


class Destroyed(Message):
    """The answer to DestroyKernel: whether the agent had the kernel, and its last statistics (a sample
    taken just before it was killed; see bai/common/stats.py), None when it could not be read."""

    existed: bool = False
    stats: dict[str, Any] | None = None  # free-form: a statistics sample (its keys vary by backend and kernel)


class DestroyKernel(Call[Destroyed]):
    """Remove a kernel; the answer says whether the agent had it, with the kernel's final statistics."""

    method: ClassVar[str] = "destroy_kernel"
    answer: ClassVar[Any] = Destroyed

    kernel_id: str
    reason: str = "user-requested"

    def decode_result(self, raw: Any) -> Destroyed:
        if isinstance(raw, dict):
            return Destroyed.from_wire(raw)
        return Destroyed(existed=bool(raw))  # an agent of before statistics answers a bare bool


class QueuePlace(Part, frozen=True):
    """Where a run waiting its turn in its kernel stands (RunResult.queue; the API shows it as it is)."""

    behind: str | None = None  # the run that has the kernel now
    ahead: int = 0  # runs before it (the running one included)


class RunResult(Message):
    """What a run printed since the last poll, and where it stands."""

    run_id: str
    status: str  # continued | waiting-input | finished
    console: list[list[str]] = []  # [stream, text] pieces
    exit_code: int | None = None
    options: dict[str, Any] | None = None  # waiting-input: {"is_password": …} (Backend.AI's, free-form)
    queue: QueuePlace | None = None  # a run waiting its turn
    cancelled: bool = False  # it left the queue before it ran
    seq: int = 0  # the answer's number within its run (1, 2, …): what a caller says it saw (Execute.after)

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
            out["queue"] = self.queue.to_wire()
        return out


class Execute(Call[RunResult]):
    """Start (query, batch), feed (input, input-eof) or poll (continue) a run in a kernel."""

    method: ClassVar[str] = "execute"
    answer: ClassVar[Any] = RunResult

    kernel_id: str
    run_id: str
    mode: str
    code: str = ""
    options: dict[str, Any] = {}  # Backend.AI's run options: free-form (the kernel reads what it knows)
    flush_timeout: float = 2.0
    # continue: the last answer (RunResult.seq) the caller saw; the answers after it that the agent kept (a caller
    # that restarted, or whose answer was lost with its connection) come again first. None: nothing to catch up
    after: int | None = None


class Interrupt(Call[bool]):
    """Interrupt `run_id` (a waiting run leaves the queue), else whatever runs; whether there was one."""

    method: ClassVar[str] = "interrupt"
    answer: ClassVar[Any] = bool

    kernel_id: str
    run_id: str | None = None


class UploadFiles(Call[None]):
    """Write files into a kernel's home."""

    method: ClassVar[str] = "upload_files"

    kernel_id: str
    files: list[tuple[str, bytes]] = []  # (relative path, its bytes)


class FileListing(Message):
    """The answer to ListFiles, in Backend.AI's shape (bai/node/agent/files.py, list_dir): `files` is a JSON
    text of [{filename, size, mode ("-rw-r--r--"), mtime, ctime, atime}]; `errors` says what went wrong."""

    files: str = "[]"
    errors: str = ""
    abspath: str = ""


class ListFiles(Call[FileListing]):
    """List a folder as the kernel sees it."""

    method: ClassVar[str] = "list_files"
    answer: ClassVar[Any] = FileListing

    kernel_id: str
    path: str


class DownloadFiles(Call[list[bytes]]):
    """Files of a kernel (paths relative to its home, or absolute inside it): one tar archive per path, each
    holding the file (or folder) under its own name, as `docker cp` makes it."""

    method: ClassVar[str] = "download_files"
    answer: ClassVar[Any] = list[bytes]

    kernel_id: str
    paths: list[str] = []
    max_bytes: int = 64 * 1024 * 1024  # for all the archives together


class RestartKernel(Call[bool]):
    """Restart a kernel's process (a fresh runner: Python's namespace is new), keeping its container, home and
    apps' ports; runs still going end. The answer: whether the agent had the kernel."""

    method: ClassVar[str] = "restart_kernel"
    answer: ClassVar[Any] = bool

    kernel_id: str


class ImageInfo(Message, omit_defaults=True):
    """An image an agent has (the answer to CommitKernel and PullImage; ListImages answers a list of them).
    `labels` and `python` travel only when the backend has them (Docker's and the simulated backend's images
    have labels; the local backend's one image has the host's Python version instead)."""

    name: str  # repository:tag
    id: str
    size: int
    labels: dict[str, str] | None = None
    python: str | None = None

    def to_api(self) -> dict[str, Any]:
        """The image as the API shows it (name, id, size, and labels or python where the agent said them)."""
        return self.to_wire()


class CommitKernel(Call[ImageInfo]):
    """Save a kernel's container as an image on its agent (`docker commit`); the answer is the image as
    ListImages gives it."""

    method: ClassVar[str] = "commit_kernel"
    answer: ClassVar[Any] = ImageInfo

    kernel_id: str
    image: str  # repository:tag to give it


class ListImages(Call[list[ImageInfo]]):
    """The images the agent has."""

    method: ClassVar[str] = "images"
    answer: ClassVar[Any] = list[ImageInfo]


class PullImage(Call[ImageInfo]):
    """Pull an image from a registry the manager allowed; the answer is the image pulled."""

    method: ClassVar[str] = "pull_image"
    answer: ClassVar[Any] = ImageInfo

    image: str
    auth: RegistryAuth | None = None  # the registry's credentials, for this pull only


class RemoveImage(Call[None]):
    """Remove an image from the agent."""

    method: ClassVar[str] = "remove_image"

    image: str


class OpenTerminal(Message):
    """Open a stream (kind `terminal`): `command` on a pseudo-terminal in a kernel (None: its shell).
    Frames: see bai/node/agent/terminal.py."""

    kind: ClassVar[str] = "terminal"

    kernel_id: str
    command: list[str] | None = None
    rows: int = 24
    cols: int = 80


class AppStarted(Message):
    """The answer to StartApp: whether the app runs (`ok`), whether it was started now (else it ran already),
    why not (`error`, with the end of its `output`), and its secret when it has one (`token`, see
    bai/common/service_ports.py; "" when none)."""

    ok: bool
    started: bool = False
    error: str = ""
    output: str = ""
    token: str = ""


class StartApp(Call[AppStarted]):
    """Start an app in a kernel unless it runs."""

    method: ClassVar[str] = "start_app"
    answer: ClassVar[Any] = AppStarted

    kernel_id: str
    app: str


class OpenTunnel(Message):
    """Open a stream (kind `tunnel`): a TCP connection to an app's port inside a kernel.
    Frames, both ways: {"t": "data", "d": bytes}, {"t": "eof"} (no more data this way)."""

    kind: ClassVar[str] = "tunnel"

    kernel_id: str
    app: str


class OpenPeerTunnel(Message):
    """Open a stream (kind `peer-tunnel`): a TCP connection to `port` inside a kernel of a multi-node session,
    for another kernel of the same session on another agent (the manager checked both). Frames as OpenTunnel's."""

    kind: ClassVar[str] = "peer-tunnel"

    kernel_id: str
    port: int


class PeerDialed(Message):
    """Open a stream (kind `peer-dialed`): the far end of the connection a kernel asked for with PeerDial
    `dial_id` (frames as OpenTunnel's). With `error`, the connection could not be made: the agent closes the
    kernel's side at once, and the manager closes the stream."""

    kind: ClassVar[str] = "peer-dialed"

    dial_id: str
    error: str = ""


STREAMS: dict[str, type[Message]] = {m.kind: m for m in (OpenTerminal, OpenTunnel, OpenPeerTunnel, PeerDialed)}


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
    """Send a call to an agent and decode its answer. An answer that is not of the call's answer type is a
    RemoteError (kind `MessageError`): the agent's fault, handled as any failure the agent reports."""
    raw = await link.call(agent_id, message.method, message.to_wire(), timeout=timeout)
    try:
        return message.decode_result(raw)
    except MessageError as e:
        raise RemoteError("MessageError", f"agent {agent_id} answered {message.method} with {e}") from None


def encode_result(result: Any) -> Any:
    """An answer (a message, a list of them, plain values) as it travels."""
    return encode(result)


# -- events ---------------------------------------------------------------------------------------------


class GpuLive(Part, frozen=True):
    """One GPU's live use, in a heartbeat (bai/node/agent/gpus.py, NVML.sample): None where the device did not
    answer (`error` says why, and travels only then), and how much of it kernels hold (`allocated`, a share)."""

    uuid: str
    utilization: int | None = None  # percent
    memory_used: int | None = None  # bytes
    allocated: str = "0"
    error: str | msgspec.UnsetType = msgspec.UNSET


class Heartbeat(Event):
    """Every few seconds: what the agent's kernels hold, whether it takes new ones, its GPUs' use."""

    name: ClassVar[str] = "heartbeat"

    occupied_slots: dict[str, str] = {}
    kernels: list[str] = []
    schedulable: bool = True
    gpus: list[GpuLive] | None = None
    warm: dict[str, int] | None = None  # image -> warm kernels ready (None: an agent without a warm pool)


class KernelLogs(Event):
    """Kernels' output since the last batch: [kernel id, text] pieces, in order."""

    name: ClassVar[str] = "kernel_logs"

    chunks: list[tuple[str, str]] = []  # (kernel id, text)


class KernelPulling(Event):
    """A kernel waits for its image to be pulled: how far it got (bytes)."""

    name: ClassVar[str] = "kernel_pulling"

    kernel_id: str
    session_id: str
    image: str
    done: int = 0
    total: int = 0


class KernelTerminated(Event):
    """A kernel ended by itself (its process exited, or it was killed)."""

    name: ClassVar[str] = "kernel_terminated"

    kernel_id: str
    session_id: str = ""
    reason: str = "self-terminated"
    exit_code: int | None = None
    msg: str | None = None  # why, when the agent knows (e.g. out of memory, naming the limit)
    stats: dict[str, Any] | None = None  # its last statistics sample (bai/common/stats.py; free-form), when read


class KernelStats(Event):
    """Every `[agent] stat_interval` seconds: a statistics sample of each running kernel and of the host.

    `samples`: kernel id -> a kernel sample; `node`: the host's sample; both shaped as bai/common/stats.py
    describes (plain values: what msgpack and JSON carry)."""

    name: ClassVar[str] = "kernel_stats"

    samples: dict[str, dict[str, Any]] = {}  # free-form samples (their keys vary by backend and kernel)
    node: dict[str, Any] = {}


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
