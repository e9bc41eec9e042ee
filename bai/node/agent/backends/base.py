"""What a kernel backend provides to the agent."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from bai.node.agent.scratch import Scratch
    from bai.node.agent.stats import Sampler
    from bai.node.agent.terminal import Terminal

from bai.common.service_ports import KNOWN_COMMANDS, ServicePort
from bai.common.status import StatusInfo
from bai.node.agent.channel import AGENT_SOCKET, Channel, OutputSink, RunnerChannel
from bai.node.link.messages import ClusterSpec

# `progress(done_bytes, total_bytes)` as an image pull goes
PullProgress = Callable[[int, int], Awaitable[None]]


class KernelStartError(Exception):
    """A kernel could not start; the message is a sentence a user can act on."""


@dataclass
class KernelSpec:
    """What a kernel is to be: its session, image, slots, environment, network, mounts and dotfiles."""

    kernel_id: str
    session_id: str
    session_name: str
    access_key: str
    image: str
    slots: dict[str, Decimal]
    environ: dict[str, str]
    cluster_role: str = "main"
    cluster_idx: int = 1
    network: str | None = None
    mounts: list[Mount] = field(default_factory=list)
    dotfiles: list[Dotfile] = field(default_factory=list)
    gpus: list[tuple[str, Decimal]] = field(default_factory=list)  # (device UUID, share of it) held
    # its place in a multi-container session (CreateKernel.cluster, see bai/common/cluster.py); None: a
    # one-kernel session. Kept where the kernel is adopted from (container labels, assignment.json)
    cluster: ClusterSpec | None = None

    def clustered(self) -> bool:
        """Whether it is one of several kernels of its session."""
        return self.cluster is not None and self.cluster.size > 1


@dataclass(frozen=True)
class Mount:
    """A virtual folder in a kernel: host directory → target path."""

    host_path: str
    target: str
    read_only: bool


@dataclass(frozen=True)
class Dotfile:
    """A file written into every new kernel's home (/home/work), e.g. .bashrc."""

    path: str  # relative to the home
    data: str
    mode: int = 0o644


@dataclass
class Kernel:
    """A kernel the agent runs: its spec, execution channel, run folder and process or container."""

    spec: KernelSpec
    channel: Channel
    run_dir: Path
    container_id: str | None = None
    pid: int | None = None
    exited: asyncio.Future[int] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    destroying: bool = False
    watcher: asyncio.Task[None] | None = None  # the backend's task that notices the kernel's exit
    # why it ended, when the backend knows more than the exit code: {"reason": status_info, "msg": sentence}
    # (set before `exited` completes)
    ending: dict[str, str] = field(default_factory=dict)
    # an adopted kernel whose channel is still being decided (its runner has yet to connect, or its log to
    # say the image has no Python): done once `channel` is final; None when it always was
    settled: asyncio.Future[None] | None = None
    service_ports: list[ServicePort] = field(default_factory=list)  # the apps its image declares
    uploads: list[str] = field(default_factory=list)  # the files of its last upload (relative paths), in order
    # a warm-pool kernel no session has taken yet: the image it was started from (None: a session's kernel)
    pool_image: str | None = None
    # variables given to every `docker exec` in the kernel (a warm kernel's session variables, which its
    # container's own configuration predates); empty for a kernel created for its session
    exec_env: dict[str, str] = field(default_factory=dict)

    def set_exit(self, code: int) -> None:
        """The kernel's process ended. The agent tells the manager, then ends a run still going."""
        if not self.exited.done():
            self.exited.set_result(code)


class Backend(Protocol):
    """What the agent needs of a kernel backend (Docker containers, local processes, simulated kernels).

    The optional capabilities (images, OOM accounting, scratch space) are members too: `BackendBase`
    gives the answers of a backend that has none of them."""

    name: str
    manages_images: bool  # kernels run from images the backend pulls and removes (Docker)
    scratch: Scratch | None  # the kernels' writable scratch space (agent/scratch.py), or None

    async def start(self) -> None: ...

    async def create(self, spec: KernelSpec, on_output: OutputSink) -> Kernel: ...

    async def destroy(self, kernel: Kernel) -> None: ...

    async def adopt(self, on_output: OutputSink) -> list[Kernel]:
        """Kernels of this agent still alive from an earlier run."""
        ...

    async def images(self) -> list[dict[str, Any]]: ...

    async def has_image(self, image: str) -> bool: ...

    async def pull(
        self, image: str, progress: PullProgress | None = None, auth: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """Pull an image (`progress(done, total)` as it goes); its labels."""
        ...

    async def remove_image(self, image: str) -> None: ...

    async def oom_kills(self, kernel: Kernel) -> int | None:
        """How often the OOM killer killed in the kernel (None: this backend cannot tell)."""
        ...

    async def memory_limit(self, kernel: Kernel) -> int | None:
        """The kernel's memory limit in bytes (None: unknown)."""
        ...

    async def list_files(self, kernel: Kernel, path: str) -> dict[str, Any]:
        """A folder as the kernel sees it (bai.node.agent.files.list_dir's shape)."""
        ...

    async def open_terminal(self, kernel: Kernel, command: list[str], rows: int, cols: int) -> Terminal:
        """Start `command` on a pseudo-terminal in the kernel (as its user, in /home/work)."""
        ...

    async def download(self, kernel: Kernel, path: str, limit: int) -> bytes:
        """A tar archive of `path` (absolute, under /home/work) as the kernel sees it, holding it under its
        base name; ChannelError (what is wrong) when it is missing or holds more than `limit` bytes."""
        ...

    async def commit(self, kernel: Kernel, image: str) -> dict[str, Any]:
        """Save the kernel as the image `image` (name:tag) on this agent; the image as `images()` lists it."""
        ...

    async def start_app(self, kernel: Kernel, app: ServicePort, timeout: float) -> dict[str, Any]:
        """Start an app in the kernel unless it runs: {"ok", "started", "error"?, "output"?}."""
        ...

    async def connect_app(self, kernel: Kernel, app: ServicePort) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A TCP connection to the app's port inside the kernel (ChannelError when nothing listens)."""
        ...

    async def close(self, kernels: list[Kernel]) -> None: ...

    # -- the warm pool (Docker): kernels started ahead of their session --

    warm_pool: bool  # whether this backend can start kernels ahead of their session

    async def create_pooled(self, image: str, pool_id: str, on_output: OutputSink) -> Kernel:
        """A kernel of `image` started ahead of any session (`pool_image` set), with small limits."""
        ...

    async def hand_over(self, kernel: Kernel, spec: KernelSpec) -> None:
        """Make a pooled kernel `spec`'s (limits, environment, dotfiles, identity), durably, so that a
        restarted agent adopts it as that session's; KernelStartError when it cannot (the kernel is then
        unusable: remove it)."""
        ...

    async def stale(self, kernels: list[Kernel]) -> list[Kernel]:
        """Pooled kernels whose image name now means another image (they must not serve sessions)."""
        ...

    async def kill(self, kernel: Kernel) -> bool:
        """End the kernel's processes at once, leaving the removal to `destroy` (which may then run in the
        background); False when this backend does not (then `destroy` does all)."""
        ...

    def sampler(self) -> Sampler:
        """What samples this backend's kernels' resource usage (an agent.stats.Sampler)."""
        ...


class BackendBase:
    """The optional capabilities of a backend that has none: no images to manage, no OOM accounting,
    no scratch space. Backends override what they do have."""

    name = "?"
    manages_images = False
    scratch: Scratch | None = None
    warm_pool = False

    async def create_pooled(self, image: str, pool_id: str, on_output: OutputSink) -> Kernel:
        raise KernelStartError(f"the {self.name} backend has no warm pool")

    async def hand_over(self, kernel: Kernel, spec: KernelSpec) -> None:
        raise KernelStartError(f"the {self.name} backend has no warm pool")

    async def kill(self, kernel: Kernel) -> bool:
        return False

    def sampler(self) -> Sampler:
        from bai.node.agent.stats import Sampler

        return Sampler()  # measures nothing: its kernels' samples are absent

    async def stale(self, kernels: list[Kernel]) -> list[Kernel]:
        return []

    async def has_image(self, image: str) -> bool:
        return True  # any image name will do (it is not pulled)

    async def pull(
        self, image: str, progress: PullProgress | None = None, auth: dict[str, str] | None = None
    ) -> dict[str, Any]:
        raise KernelStartError(f"the {self.name} backend has no images to pull")

    async def remove_image(self, image: str) -> None:
        raise KernelStartError(f"the {self.name} backend has no images to remove")

    async def oom_kills(self, kernel: Kernel) -> int | None:
        return None

    async def memory_limit(self, kernel: Kernel) -> int | None:
        return None

    async def open_terminal(self, kernel: Kernel, command: list[str], rows: int, cols: int) -> Terminal:
        raise KernelStartError(f"the {self.name} backend has no terminals")

    async def download(self, kernel: Kernel, path: str, limit: int) -> bytes:
        raise KernelStartError(f"the {self.name} backend cannot send a kernel's files")

    async def commit(self, kernel: Kernel, image: str) -> dict[str, Any]:
        raise KernelStartError(
            f"the {self.name} backend's kernels are not containers: only Docker kernels can be saved as images"
        )

    async def start_app(self, kernel: Kernel, app: ServicePort, timeout: float) -> dict[str, Any]:
        """Through the kernel's runner: the image's service definition, else the command bai knows."""
        return await kernel.channel.start_service(app.name, app.port, KNOWN_COMMANDS.get(app.name), {}, timeout)

    async def connect_app(self, kernel: Kernel, app: ServicePort) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Through the kernel's runner, which connects inside the kernel (no network needed)."""
        return await kernel.channel.open_tunnel(app.port)


MPS_PIPE = Path("/tmp/nvidia-mps")  # where an MPS control daemon listens, when one runs


def gpu_env(gpus: list[tuple[str, Decimal]]) -> dict[str, str]:
    """What a kernel is told about its GPUs: which devices (by UUID, for CUDA and the NVIDIA container
    runtime), its share of a device (`BAI_CUDA_SHARE`), and, where an MPS daemon runs, the matching MPS
    limit. Without MPS a share is a scheduling promise, not an enforced limit."""
    if not gpus:
        return {}
    uuids = ",".join(u for u, _ in gpus)
    env = {"CUDA_VISIBLE_DEVICES": uuids, "NVIDIA_VISIBLE_DEVICES": uuids}
    fractions = [a for _, a in gpus if a < 1]
    if fractions:
        env["BAI_CUDA_SHARE"] = f"{fractions[0].normalize():f}"
        if MPS_PIPE.is_dir():
            env["CUDA_MPS_PIPE_DIRECTORY"] = str(MPS_PIPE)
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, int(fractions[0] * 100)))
    return env


def kernel_env(spec: KernelSpec) -> dict[str, str]:
    """The kernel's variables: bai's, its GPUs', then the session's own (`spec.environ`, which wins: the
    manager's BACKENDAI_CLUSTER_* among them)."""
    env = {
        "BACKENDAI_SESSION_ID": spec.session_id,
        "BACKENDAI_SESSION_NAME": spec.session_name,
        "BACKENDAI_ACCESS_KEY": spec.access_key,
        "BACKENDAI_KERNEL_ID": spec.kernel_id,
        "BACKENDAI_KERNEL_IMAGE": spec.image,
        "BACKENDAI_CLUSTER_ROLE": spec.cluster_role,
        "BACKENDAI_CLUSTER_IDX": str(spec.cluster_idx),
        "BACKENDAI_CLUSTER_SIZE": str(spec.cluster.size) if spec.cluster is not None else "1",
        "PYTHONUNBUFFERED": "1",
    }
    env.update(gpu_env(spec.gpus))
    env.update(spec.environ)
    return env


def memory_size(n: int) -> str:
    """512 MiB, 1.5 GiB: a memory limit as people say it."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.4g} {unit}"
    return f"{n} bytes"


def oom_ending(limit: int) -> dict[str, str]:
    """How a kernel killed by the out-of-memory killer is reported: status_info and a sentence naming
    the limit (0: unknown)."""
    where = f" (limit {memory_size(limit)})" if limit > 0 else ""
    return {"reason": StatusInfo.OUT_OF_MEMORY, "msg": f"the kernel ran out of memory{where} and was killed"}


async def listen_for_runner(
    run_dir: Path, on_output: OutputSink, owner: tuple[int, int] | None = None
) -> RunnerChannel:
    """A channel listening in the kernel's run folder for its runner to connect (see RunnerChannel)."""
    channel = RunnerChannel(run_dir / AGENT_SOCKET, on_output)
    await channel.listen(owner)
    return channel
