"""The Docker backend: one container per kernel, through aiodocker.

Each container gets the kernel's labels, enforced limits (cpu → NanoCpus, mem → Memory with no
swap, a pids limit, a nofile ulimit), `--network none` unless configured otherwise, and is
confined: every capability dropped (but those of `[agent.docker] cap_add`), no-new-privileges, a
read-only root filesystem whose only writable places are the kernel's scratch (/home/work, /tmp,
/var/tmp, bounded as `[agent] scratch_type` says: see scratch.py) and its virtual folders.

The runner is mounted read-only: given `runner_lib` (a folder `runner_lib.install` made, as `bai node` does), at
/opt/bai/lib, imported as a module so that a kernel whose Python is the node's loads its bytecode instead of
compiling it; otherwise the file alone at /opt/bai/runner.py, run as a script. The kernel's run folder is mounted
read-only at /opt/bai/run: the agent listens on a Unix socket there that the runner connects to (so exec works
without any network, and a kernel can write nothing into the node's state folder). Images without
Python print a marker line instead (seen in the container's log) and run batch commands through
docker exec.

A container the OOM killer ended (State.OOMKilled) is reported as `out-of-memory` with a sentence naming
its limit; a command OOM-killed inside a kernel that lives on (its memory cgroup's oom_kill count went up)
ends its run with 137 and that sentence on stderr. After an agent restart, kernels are adopted at once and
their channel settles in the background: the runner connects again, or the log says there is no Python
(a kernel caught starting), within the start timeout; calls on such a kernel wait for that.

Warm kernels (`create_pooled`, labelled `bai.warm-pool`): what `create` makes for a session, before any
session, with small limits. `hand_over` makes one a session's: assignment.json (see assignment.py), its
limits written into its cgroup at once (cgroups.py; `docker update` records them just after), the
session's variables through the runner's env op and on every `docker exec` (`Kernel.exec_env`), its
dotfiles through the runner. `kill` ends a kernel's processes at once (SIGKILL to its first process) so
that `destroy`, which removes the container and scratch, can run off the session's critical path.

Multi-container sessions (`KernelSpec.cluster`, more than one kernel; see bai/common/cluster.py):

- in both modes the session's kernels on this agent share a Docker network of the session
  (bai-cluster-<session id>-<agent tag>, named for the agent: bridge driver, labelled bai.session / bai.agent). Each
  kernel joins it under its name (main1, sub1 …, a DNS alias) so the kernels find each other by name and
  reach every port of each other. The network is INTERNAL and the host has no address on it
  (inhibit_ipv4): it gives no route out of the node and no way to the node's own services, so a cluster
  kernel reaches no more than a one-kernel session's would, only its session's other kernels. Each such
  network takes a subnet from the daemon's address pools (`default-address-pools` in daemon.json says
  how many there can be). A kernel whose network is `none`
  (the default) has only the session network; one whose network is a named one (`bridge`, a network the
  operator made) keeps that one as its primary network (its route out, its published ports) and joins
  the session network besides. Host networking is refused. The first kernel of the session to be created
  makes the network (one lock per session: the manager creates the kernels all at once; "already
  exists" counts as found), the last one destroyed on this agent (or whose start fails) removes it; at
  start the agent removes its bai-cluster-* networks that no kernel uses (leftovers.remove_networks).
- multi-node: for each kernel of the session on ANOTHER agent (`cluster.agents[rank]`), a "peer proxy"
  stands in on the network under that kernel's name: a small container (bai-peer-<session id>-<name>-<agent tag>,
  labelled bai.session / bai.agent / bai.peer=<name>, of the session's image, confined as kernels are and
  smaller) that runs the runner in relay mode: it listens on 0.0.0.0 for CLUSTER_PORTS and dials each
  connection through the agent's socket of a kernel of the session here (the first one's run folder,
  mounted read-only), so the agent takes it as that kernel's dial and relays it through the manager
  (agent.py `dial`). The first kernel of the session here starts them (after the network exists, while its
  own container starts); every kernel of the session here waits for them before its start counts. They go
  with the network (before it). Were the first kernel destroyed while others of the session stay here,
  the proxies would lose its socket: that happens only while the session is torn down (or when its
  start failed: the session fails with it), so it is left so. A restarted agent keeps the proxies of the
  sessions whose kernels it adopts and removes the others (leftovers.remove_networks). An image without
  Python cannot run them: such a kernel's start fails saying so.

Cluster kernels are never warm ones (warm_pool.cold_reason). A kernel's cluster spec is in its labels
(bai.cluster, JSON), so a restarted agent adopts it with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
from collections.abc import AsyncIterator, Sequence
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiodocker
from aiodocker.exceptions import DockerError
from aiodocker.networks import DockerNetwork

from bai.common import service_ports as apps
from bai.common.cluster import (
    CLUSTER_PORTS,
    MULTI_NODE,
    NETWORK_PREFIX,
    SINGLE_NODE,
    agent_tag,
    kernel_name,
    network_name,
    parse_hostname,
)
from bai.common.service_ports import PortPool, PortPoolExhausted, ServicePort
from bai.common.status import StatusInfo
from bai.node.agent import assignment, cgroups, leftovers, runner_lib
from bai.node.agent import scratch as scratchlib
from bai.node.agent.backends.base import (
    BackendBase,
    Dotfile,
    Kernel,
    KernelSpec,
    KernelStartError,
    PullProgress,
    kernel_env,
    listen_for_runner,
    oom_ending,
)
from bai.node.agent.channel import AGENT_SOCKET, Channel, ChannelError, OutputSink, RunnerChannel
from bai.node.agent.download import tar_script
from bai.node.agent.files import list_script
from bai.node.agent.scratch import Layout, Scratch, ScratchError
from bai.node.agent.terminal import DockerExecTerminal, Terminal
from bai.node.agent.warm_pool import POOL_SLOTS, SESSION_ENV
from bai.node.link.messages import ClusterSpec

if TYPE_CHECKING:
    from bai.node.agent.stats import Sampler

log = logging.getLogger("bai.agent.docker")
LABEL_KERNEL = "ai.backend.kernel-id"
LABEL_SESSION = "ai.backend.session-id"
LABEL_AGENT = "bai.agent-id"
LABEL_SERVICE_PORTS = "bai.service-ports"  # the kernel's apps and their host ports (JSON)
LABEL_POOL = "bai.warm-pool"  # a kernel started ahead of its session, of this image (see warm_pool.py)
LABEL_CLUSTER = "bai.cluster"  # a multi-container session's kernel: its ClusterSpec (JSON)
LABEL_CLUSTER_IDX = "bai.cluster-idx"  # its index within its role (with bai.cluster-role: its name)
# a cluster session's network (and its peer proxies): whose it is
NET_LABEL_SESSION = "bai.session"
NET_LABEL_AGENT = "bai.agent"
LABEL_PEER = "bai.peer"  # a peer proxy: the name of the kernel (on another agent) it stands in for
PEER_PREFIX = "bai-peer-"  # bai-peer-<session id>-<name>
PEER_MEMORY = 64 * 2**20
PEER_NANO_CPUS = 250_000_000
PEER_PIDS_LIMIT = 256  # about two threads per open connection (the runner's relay mode)
# Processes are host-wide (kernel.pid_max: 32768 on a 2-core host): kernels together may hold at most
# PID_SHARE of them, each in proportion to its cpu share of the host, so one user's small sessions cannot
# fork the node (its agent, its Docker daemon) out of processes. MIN_KERNEL_PIDS keeps a tiny kernel usable.
PID_SHARE = 0.5
MIN_KERNEL_PIDS = 128


def host_pid_max() -> int:
    try:
        with open("/proc/sys/kernel/pid_max") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 4_194_304  # the kernel's largest


def kernel_pids_limit(configured: int, cpu: float, host_cpus: int, pid_max: int) -> int:
    """A kernel's pids limit: its cpu share of PID_SHARE of the host's process ids (at least MIN_KERNEL_PIDS),
    and never above `configured` ([agent] pids_limit, which an operator may set lower still; 0: no bound of
    its own)."""
    share = max(MIN_KERNEL_PIDS, int(pid_max * PID_SHARE * max(cpu, 0.0) / max(host_cpus, 1)))
    return min(configured, share) if configured > 0 else share


CONTAINER_LOG_MAX = "1m"  # the container's own log (Docker's json-file) on the node's disk
# how long a create waits, when the port pool is short, for the host ports of killed kernels whose containers are
# still being removed (a destroy answers once a kernel's processes are dead; its container goes a moment later)
PORTS_FREED_WAIT = 10.0
NO_PYTHON = "bai: no python in this image"  # the first line of such a kernel's log
EXEC_MARKER = "exec-channel"  # in the kernel's folder (not the run folder): the kernel has no runner
# Start the runner with the image's Python (it connects to the agent), or say there is none and idle
# (batch commands then use docker exec). `{start}`: how the runner is started, see `_runner_start`.
_ENTRYPOINT = (
    "for p in python3 python; do "
    'if command -v "$p" >/dev/null 2>&1; then '
    f'exec "$p" -u {{start}} --connect /opt/bai/run/{AGENT_SOCKET} --workdir /home/work; fi; done; '
    f"echo '{NO_PYTHON}'; "
    "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done"
)
# A peer proxy: the runner in relay mode ($1: the name it stands in for, $2: its ports), with the image's Python.
_PEER_ENTRYPOINT = (
    "for p in python3 python; do "
    'if command -v "$p" >/dev/null 2>&1; then '
    f'exec "$p" -u {{start}} --relay "$1" --connect /opt/bai/run/{AGENT_SOCKET} --ports "$2"; fi; done; '
    f"echo '{NO_PYTHON}'; exit 3"
)
SCRIPT_START = "/opt/bai/runner.py"  # the runner mounted alone, run as a script (compiled at every start)
MODULE_START = '-c "$0"'  # the runner module of `[runner_lib]`, imported: $0 is runner_lib.START
ENTRYPOINT = _ENTRYPOINT.format(start=SCRIPT_START)
PEER_ENTRYPOINT = _PEER_ENTRYPOINT.format(start=SCRIPT_START)
# Linux capabilities that `[agent.docker] cap_add` may name (capabilities(7), without CAP_)
CAPABILITIES = frozenset(
    """AUDIT_CONTROL AUDIT_READ AUDIT_WRITE BLOCK_SUSPEND BPF CHECKPOINT_RESTORE CHOWN DAC_OVERRIDE
    DAC_READ_SEARCH FOWNER FSETID IPC_LOCK IPC_OWNER KILL LEASE LINUX_IMMUTABLE MAC_ADMIN MAC_OVERRIDE
    MKNOD NET_ADMIN NET_BIND_SERVICE NET_BROADCAST NET_RAW PERFMON SETFCAP SETGID SETPCAP SETUID
    SYS_ADMIN SYS_BOOT SYS_CHROOT SYS_MODULE SYS_NICE SYS_PACCT SYS_PTRACE SYS_RAWIO SYS_RESOURCE
    SYS_TIME SYS_TTY_CONFIG SYSLOG WAKE_ALARM""".split()
)


def check_capabilities(names: list[str]) -> list[str]:
    """`cap_add` names as Docker takes them (CAP_ prefix optional, any case); ValueError for a name
    that is not a Linux capability, or ALL."""
    out = []
    for name in names:
        bare = name.strip().upper().removeprefix("CAP_")
        if bare == "ALL":
            raise ValueError("[agent.docker] cap_add: ALL would undo dropping capabilities; name each one")
        if not re.fullmatch(r"[A-Z_]+", bare) or bare not in CAPABILITIES:
            raise ValueError(f"[agent.docker] cap_add: {name!r} is not a Linux capability (e.g. NET_BIND_SERVICE)")
        out.append(f"CAP_{bare}")
    return out


def owner_of(user: str) -> tuple[int, int] | None:
    """(uid, gid) of a numeric `uid[:gid]` kernel user (gid 0 when left out), else None."""
    uid, _, gid = user.partition(":")
    if not uid.isdigit() or (gid and not gid.isdigit()):
        return None
    return int(uid), int(gid or 0)


def gpus_from_labels(labels: dict[str, str]) -> list[tuple[str, Decimal]]:
    """The GPUs a kernel's container holds, from its `bai.gpus` label (to rebuild the agent's map)."""
    return [(u, Decimal(a)) for u, a in json.loads(labels.get("bai.gpus") or "[]")]


NO_ADDRESS_POOL = (
    "the Docker daemon has no free address pool for the session's network (every pool of its "
    "default-address-pools is taken by other networks: end other multi-container sessions, or give the "
    "daemon more or smaller pools in daemon.json)"
)


def no_address_pool(error: DockerError) -> bool:
    """Whether Docker refused a network because its address pools are all taken ("could not find an available,
    non-overlapping IPv4 address pool among the defaults to assign to the network")."""
    text = str(error.message).lower()
    return "address pool" in text or "non-overlapping" in text


def peer_container_name(session_id: str, name: str, agent_id: str) -> str:
    """The container of the peer proxy that stands in for kernel `name` of the session on agent `agent_id`
    (named for the agent too: two agents of a session on one Docker daemon may each stand in for it)."""
    return f"{PEER_PREFIX}{session_id}-{name}-{agent_tag(agent_id)}"


def cluster_from_labels(labels: dict[str, str]) -> ClusterSpec | None:
    """A cluster kernel's place in its session, from its `bai.cluster` label (None: none, or unreadable)."""
    raw = labels.get(LABEL_CLUSTER)
    if not raw:
        return None
    try:
        return assignment.cluster_of(json.loads(raw))
    except ValueError:
        return None


def write_dotfiles(home: Path, dotfiles: list[Dotfile], owner: tuple[int, int] | None) -> None:
    """Write the dotfiles into a new kernel's home on the host (its scratch), owned by the kernel's user."""
    for f in dotfiles:
        parts = [p for p in f.path.split("/") if p not in ("", ".")]
        if not parts or ".." in parts:
            continue  # the manager refuses such paths; never write outside the home
        folder = home
        for part in parts[:-1]:
            folder = folder / part
            if not folder.is_dir():
                folder.mkdir()
                if owner is not None:
                    with contextlib.suppress(PermissionError):  # an agent that is not root
                        os.chown(folder, *owner)
        target = folder / parts[-1]
        target.write_text(f.data)
        target.chmod(f.mode)
        if owner is not None:
            with contextlib.suppress(PermissionError):
                os.chown(target, *owner)


async def exec_write(
    docker: aiodocker.Docker, container_id: str, path: str, data: bytes, mode: int, env: dict[str, str] | None = None
) -> None:
    """Write a file under /home/work through the kernel itself (as its user): the root filesystem is
    read-only and a tmpfs home is not reachable from outside, so docker's put_archive cannot."""
    container = docker.containers.container(container_id)
    script = 'mkdir -p "$(dirname "$1")" && cat > "$1" && chmod "$2" "$1"'
    run = await container.exec(
        ["/bin/sh", "-c", script, "sh", path, f"{mode:o}"], stdin=True, workdir="/home/work", environment=env or None
    )
    stream = run.start(detach=False)
    err = b""
    try:
        await stream.write_in(data)
        resp = stream._resp  # end of stdin, then read what it says
        assert resp is not None and resp.connection is not None  # the stream is started: write_in went through it
        transport = resp.connection.transport
        if transport is not None and transport.can_write_eof():
            transport.write_eof()
        while (msg := await stream.read_out()) is not None:
            err += msg.data
    finally:
        await stream.close()
    code = (await run.inspect()).get("ExitCode")
    if code != 0:
        raise ChannelError(f"cannot write {path}: {err.decode(errors='replace').strip()[-200:] or f'exit {code}'}")


def _kill_if_in(pid: int, container_id: str) -> bool:
    """SIGKILL `pid` if it is in the container's cgroup (`cgroups.in_container`); False when not done."""
    if not cgroups.in_container(pid, container_id):
        return False
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        return False
    return True


class DockerUnavailable(Exception):
    """No Docker daemon answers (or it refuses this agent)."""


async def docker_available(timeout: float = 3.0) -> bool:
    try:
        docker = aiodocker.Docker()
    except Exception:
        return False
    try:
        await asyncio.wait_for(docker.version(), timeout)
        return True
    except Exception:
        return False
    finally:
        await docker.close()


class DockerBackend(BackendBase):
    """Kernels as hardened Docker containers, through aiodocker."""

    name = "docker"
    manages_images = True

    def __init__(
        self,
        agent_id: str,
        kernels_dir: Path,
        runner_path: Path,
        *,
        network: str = "none",
        pids_limit: int = 4096,
        labels: dict[str, str] | None = None,
        start_timeout: float = 30.0,
        user: str = "",
        cap_add: list[str] | None = None,
        nofile: int = 0,
        nproc: int = 0,
        scratch: Scratch | None = None,
        port_range: tuple[int, int] = (30000, 31000),
        runner_lib: Path | None = None,
    ) -> None:
        self.agent_id = agent_id
        self.ports = PortPool(*port_range)  # host ports (127.0.0.1) kernels publish their apps on
        self._dying: set[str] = set()  # kernels killed whose containers (and host ports) are still being removed
        self._ports_freed = asyncio.Event()  # set whenever a dying kernel's host ports come back
        self.user = user
        self.owner = owner_of(user)  # who owns the kernel's home and its runner socket
        self.cap_add = check_capabilities(cap_add or [])
        # no nproc ulimit: it counts every process of the kernel's uid on the node (all users' kernels run as
        # the same uid), so one kernel's forks would make the others' fail. The cgroup pids limit is the
        # per-kernel bound; a configured `[agent] nproc` lowers it (min of the two), it is never a ulimit.
        self.ulimits = [{"Name": "nofile", "Soft": nofile, "Hard": nofile}] if nofile > 0 else []
        # None (only for building configurations in tests): no scratch mounts
        self.scratch = scratch
        self.kernels_dir = kernels_dir
        self.runner_path = runner_path
        self.runner_lib = runner_lib  # (see `_runner_mount`)
        self.network = network
        self.pids_limit = pids_limit if nproc <= 0 else min(pids_limit, nproc) if pids_limit > 0 else nproc
        self.pid_max = host_pid_max()
        self.host_cpus = os.cpu_count() or 1
        self.labels = dict(labels or {})
        self.start_timeout = start_timeout
        self.docker: aiodocker.Docker | None = None
        self._pids: dict[str, int] = {}  # container id -> its main process (where its cgroup is read)
        self._chores: set[asyncio.Task[Any]] = set()  # best-effort work after a hand-over (renames)
        self._image_ids: dict[str, str] = {}  # pooled kernel's container id -> the image id it runs
        # cluster sessions: session id -> its kernels here that hold its network (created with the first,
        # removed with the last), and the lock (with how many wait on it) that orders that per session
        self._net_members: dict[str, set[str]] = {}
        self._net_locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}
        # multi-node sessions: session id -> the start of its peer proxies here (by its first kernel here)
        self._peers: dict[str, asyncio.Future[None]] = {}

    async def start(self) -> None:
        self.kernels_dir.mkdir(parents=True, exist_ok=True)
        self.docker = aiodocker.Docker()
        try:
            await asyncio.wait_for(self.docker.version(), 5)
        except Exception as e:
            await self.docker.close()
            raise DockerUnavailable(f"the Docker daemon does not answer: {e}") from None

    def sampler(self) -> Sampler:
        """The containers' cgroup files, read directly (agent.stats.DockerSampler)."""
        from bai.node.agent.stats import DockerSampler

        return DockerSampler(self)

    async def images(self) -> list[dict[str, Any]]:
        assert self.docker is not None
        out = []
        for img in await self.docker.images.list():
            for tag in img.get("RepoTags") or []:
                if tag != "<none>:<none>":
                    labels = img.get("Labels") or {}
                    out.append({"name": tag, "id": img["Id"], "size": img.get("Size", 0), "labels": labels})
        return sorted(out, key=lambda i: i["name"])

    def publishes(self, spec: KernelSpec) -> bool:
        """Whether the kernel's network can publish ports (none and host cannot)."""
        return (spec.network or self.network) not in ("none", "host")

    # -- multi-container sessions -------------------------------------------------------------------

    def check_cluster(self, spec: KernelSpec) -> str:
        """The kernel's own network (`none`, `bridge`, …); KernelStartError when a cluster kernel cannot run
        as asked."""
        network = spec.network or self.network
        if not spec.clustered():
            return network
        assert spec.cluster is not None
        if network == "host":
            raise KernelStartError(
                "a multi-container session cannot use host networking: its kernels need a network of their own "
                "to find each other by name"
            )
        if spec.cluster.mode not in (SINGLE_NODE, MULTI_NODE):
            raise KernelStartError(f"unknown cluster mode {spec.cluster.mode!r} (single-node or multi-node)")
        net = spec.cluster.network
        if net and not net.startswith(NETWORK_PREFIX):
            raise KernelStartError(f"a session's network must be named {NETWORK_PREFIX}…, not {net!r}")
        return network

    def pids_of(self, spec: KernelSpec) -> int:
        """The kernel's pids limit (kernel_pids_limit: its cpu share of the host's process ids)."""
        return kernel_pids_limit(self.pids_limit, float(spec.slots.get("cpu") or 0), self.host_cpus, self.pid_max)

    def session_network(self, spec: KernelSpec) -> str | None:
        """The Docker network of a cluster kernel's session here (None for a one-kernel session's): always
        named for this agent (whatever the spec says), so that agents sharing a Docker daemon never make,
        remove or adopt each other's."""
        if not spec.clustered() or spec.cluster is None:
            return None
        return network_name(spec.session_id, self.agent_id)

    def remote_peers(self, spec: KernelSpec) -> list[str]:
        """multi-node: the names of the session's kernels on other agents (each gets a peer proxy here)."""
        cluster = spec.cluster
        if not spec.clustered() or cluster is None or cluster.mode != MULTI_NODE:
            return []
        return [
            name
            for rank, (name, agent) in enumerate(zip(cluster.hosts, cluster.agents, strict=False))
            if rank != cluster.rank and agent and agent != self.agent_id and parse_hostname(name) is not None
        ]

    @contextlib.asynccontextmanager
    async def _session_lock(self, session_id: str) -> AsyncIterator[None]:
        """One holder at a time per session (its network's creation and removal); the lock goes with its last user."""
        entry = self._net_locks.get(session_id)
        if entry is None:
            entry = self._net_locks[session_id] = (asyncio.Lock(), [0])
        lock, users = entry
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if users[0] == 0:
                del self._net_locks[session_id]

    async def _join_network(self, spec: KernelSpec, run_dir: Path | None = None) -> asyncio.Future[None] | None:
        """Count the kernel among its session's network's holders here; the first creates the network. A
        multi-node kernel: the start of the session's peer proxies here (begun by the first, with its
        `run_dir`; begun again when it failed), to be waited for; else None."""
        assert self.docker is not None
        name = self.session_network(spec)
        if name is None:
            return None
        async with self._session_lock(spec.session_id):
            members = self._net_members.get(spec.session_id)
            if members:  # made by the session's first kernel
                members.add(spec.kernel_id)
            else:
                await self._create_network(spec, name)
            peers = self.remote_peers(spec)
            if not peers or run_dir is None:
                return None
            job = self._peers.get(spec.session_id)
            if job is None or (job.done() and (job.cancelled() or job.exception() is not None)):
                job = self._peers[spec.session_id] = asyncio.ensure_future(
                    self._start_peers(spec, name, peers, run_dir)
                )
            return job

    async def _create_network(self, spec: KernelSpec, name: str) -> None:
        """The session's network, made by its first kernel here (under the session's lock)."""
        assert self.docker is not None
        config = {
            "Name": name,
            "Driver": "bridge",
            "CheckDuplicate": True,  # (Docker before 25 makes a second network of the same name without it)
            "Internal": True,  # no route out of the node: the kernels keep their own network for that
            # and no address of the host's on it: a kernel reaches no service of the node (as with `none`)
            "Options": {"com.docker.network.bridge.inhibit_ipv4": "true"},
            "Labels": {**self.labels, NET_LABEL_SESSION: spec.session_id, NET_LABEL_AGENT: self.agent_id},
        }
        # counted first: a start cancelled while the network is made removes it (its clean-up leaves)
        self._net_members[spec.session_id] = {spec.kernel_id}
        job = asyncio.ensure_future(self.docker.networks.create(config))
        try:
            await asyncio.shield(job)
            log.debug("created network %s", name)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):  # made or not, before the clean-up looks
                await job
            raise
        except DockerError as e:
            if e.status != 409 and "already exists" not in str(e.message):
                del self._net_members[spec.session_id]
                if no_address_pool(e):
                    raise KernelStartError(NO_ADDRESS_POOL) from None
                raise KernelStartError(f"cannot create the session's network {name}: {e.message}") from None

    # -- peer proxies (multi-node) ------------------------------------------------------------------

    def _peer_config(self, spec: KernelSpec, network: str, name: str, run_dir: Path) -> dict[str, Any]:
        """The container of the peer proxy for kernel `name`: the runner in relay mode, dialling through the
        socket in `run_dir` (a kernel's of the session here), confined as a kernel and small."""
        ports = ",".join(str(p) for p in CLUSTER_PORTS)
        config: dict[str, Any] = {
            "Image": spec.image,
            "Entrypoint": ["/bin/sh", "-c", *self._runner_start(_PEER_ENTRYPOINT), name, ports],
            "Cmd": [],
            "Env": ["PYTHONDONTWRITEBYTECODE=1"],
            "Labels": {
                **self.labels,
                NET_LABEL_SESSION: spec.session_id,
                NET_LABEL_AGENT: self.agent_id,
                LABEL_PEER: name,
            },
            "Hostname": name,
            "HostConfig": {
                "Binds": [self._runner_mount(), f"{run_dir}:/opt/bai/run:ro"],
                "NetworkMode": network,
                "PidsLimit": PEER_PIDS_LIMIT,
                "Memory": PEER_MEMORY,
                "MemorySwap": PEER_MEMORY,
                "NanoCpus": PEER_NANO_CPUS,
                "ReadonlyRootfs": True,
                "CapDrop": ["ALL"],
                "SecurityOpt": ["no-new-privileges"],
                "Ulimits": list(self.ulimits),
                "LogConfig": {"Type": "json-file", "Config": {"max-size": CONTAINER_LOG_MAX, "max-file": "1"}},
            },
            "NetworkingConfig": {"EndpointsConfig": {network: {"Aliases": [name]}}},
        }
        if self.user:
            config["User"] = self.user
        return config

    async def _start_peers(self, spec: KernelSpec, network: str, peers: list[str], run_dir: Path) -> None:
        """Create and start the session's peer proxies here (one already there is started, if need be); all
        are tried before the first error (a KernelStartError) is raised, so none is still being made after."""
        results = await asyncio.gather(
            *(self._start_peer(spec, network, name, run_dir) for name in peers), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def _start_peer(self, spec: KernelSpec, network: str, name: str, run_dir: Path) -> None:
        assert self.docker is not None
        cname = peer_container_name(spec.session_id, name, self.agent_id)
        what = f"the peer proxy for {name} (a kernel of the session on another agent)"
        try:
            container = await self.docker.containers.create(self._peer_config(spec, network, name, run_dir), name=cname)
        except DockerError as e:
            if e.status == 404:
                raise KernelStartError(f"image {spec.image!r} not found on agent {self.agent_id}") from None
            if e.status != 409:
                raise KernelStartError(f"cannot create {what}: {e.message}") from None
            container = self.docker.containers.container(cname)  # made before (a start tried again)
        try:
            await container.start()
        except DockerError as e:
            raise KernelStartError(f"cannot start {what}: {e.message}") from None
        log.debug("started peer proxy %s", cname)

    async def _check_peers(self, spec: KernelSpec) -> None:
        """KernelStartError when a peer proxy of the kernel's session here has exited (it never does by itself:
        the image has no Python, or its Python cannot run the runner)."""
        assert self.docker is not None
        names = self.remote_peers(spec)
        containers = [
            self.docker.containers.container(peer_container_name(spec.session_id, n, self.agent_id)) for n in names
        ]
        shown = await asyncio.gather(*(c.show() for c in containers), return_exceptions=True)
        for name, container, info in zip(names, containers, shown, strict=True):
            if isinstance(info, DockerError):
                raise KernelStartError(f"the peer proxy for {name} is gone: {info.message}")
            if isinstance(info, BaseException):
                raise info
            state = info.get("State") or {}
            if state.get("Running"):
                continue
            if await self._says_no_python(container):
                raise KernelStartError(self._no_python_for_peers(spec))
            detail = await self._tail(container)
            raise KernelStartError(
                f"the peer proxy for {name} exited with code {state.get('ExitCode')}{': ' + detail if detail else ''}"
            )

    @staticmethod
    def _no_python_for_peers(spec: KernelSpec) -> str:
        return (
            f"image {spec.image!r} has no Python: a multi-node session's image needs one (python3 or python), "
            "as its kernels reach the kernels on other agents through proxies that run it"
        )

    async def _remove_peers(self, spec: KernelSpec) -> None:
        """Remove the session's peer proxies here (those not there are fine)."""
        assert self.docker is not None
        names = self.remote_peers(spec)
        await asyncio.gather(
            *(self._remove_peer(peer_container_name(spec.session_id, n, self.agent_id)) for n in names)
        )

    async def _remove_peer(self, cname: str) -> None:
        assert self.docker is not None
        try:
            await self.docker.containers.container(cname).delete(force=True, v=True)
            log.debug("removed peer proxy %s", cname)
        except DockerError as e:
            if e.status == 404 or (e.status == 409 and "in progress" in str(e.message)):
                return
            leftovers.report(f"container {cname}", e, remedy=f"remove it with `docker rm -f {cname}`", logger=log)

    async def _connect_network(self, container: Any, spec: KernelSpec) -> None:
        """A cluster kernel with a network of its own (not `none`) joins its session's network besides."""
        assert self.docker is not None
        name = self.session_network(spec)
        if name is None or (spec.network or self.network) == "none":
            return  # (none: the session's network is its only one, in its configuration)
        hostname = kernel_name(spec.cluster_role, spec.cluster_idx)
        network = DockerNetwork(self.docker, name)  # type: ignore[no-untyped-call]  # aiodocker: __init__ unannotated
        await network.connect({"Container": container.id, "EndpointConfig": {"Aliases": [hostname]}})

    async def _leave_network(self, spec: KernelSpec) -> None:
        """The kernel no longer holds its session's network (its container is gone); the last one here
        removes it, after the session's peer proxies here. Idempotent."""
        assert self.docker is not None
        name = self.session_network(spec)
        if name is None or spec.kernel_id not in self._net_members.get(spec.session_id, ()):
            return
        async with self._session_lock(spec.session_id):
            members = self._net_members.get(spec.session_id)
            if members is None or spec.kernel_id not in members:
                return
            members.discard(spec.kernel_id)
            if members:
                return
            del self._net_members[spec.session_id]
            job = self._peers.pop(spec.session_id, None)
            if job is not None:  # let a start of the proxies finish (none is half made), whatever it came to
                await asyncio.gather(job, return_exceptions=True)
            await self._remove_peers(spec)  # (before the network: they are on it)
            await self._remove_network(name)

    async def _remove_network(self, name: str) -> None:
        assert self.docker is not None
        try:
            await DockerNetwork(self.docker, name).delete()  # type: ignore[no-untyped-call]  # __init__ unannotated
            log.debug("removed network %s", name)
        except DockerError as e:
            if e.status != 404:
                leftovers.report(f"network {name}", e, remedy=f"remove it with `docker network rm {name}`", logger=log)

    def _runner_mount(self) -> str:
        """The runner's bind: the module folder of `runner_lib`, or the runner file alone."""
        if self.runner_lib is not None:
            return f"{self.runner_lib}:{runner_lib.MOUNT}:ro"
        return f"{self.runner_path}:{SCRIPT_START}:ro"

    def _runner_start(self, entrypoint: str) -> list[str]:
        """`sh -c`'s script and its $0: the runner imported as a module ($0 the code that does it) or run as a
        script."""
        if self.runner_lib is not None:
            return [entrypoint.format(start=MODULE_START), runner_lib.START]
        return [entrypoint.format(start=SCRIPT_START), "sh"]

    def _container_config(
        self,
        spec: KernelSpec,
        run_dir: Path,
        layout: Layout | None = None,
        service_ports: Sequence[ServicePort] = (),
        pooled: bool = False,
    ) -> dict[str, Any]:
        env = kernel_env(spec)
        if pooled:  # no session yet: its variables come at hand-over (the runner's env op, exec_env)
            env = {k: v for k, v in env.items() if k not in SESSION_ENV}
        layout = layout or Layout()
        hostname = kernel_name(spec.cluster_role, spec.cluster_idx)
        network = self.check_cluster(spec)
        session_net = self.session_network(spec)
        networking: dict[str, Any] | None = None
        if session_net is not None and network == "none":  # the session's network is its only one
            network = session_net
            networking = {"EndpointsConfig": {session_net: {"Aliases": [hostname]}}}
        host: dict[str, Any] = {
            "Binds": [
                self._runner_mount(),
                f"{run_dir}:/opt/bai/run:ro",  # only the agent's socket is there; connecting needs no write
                *(f"{folder}:{target}:rw" for target, folder in layout.binds.items()),
                *(f"{m.host_path}:{m.target}:{'ro' if m.read_only else 'rw'}" for m in spec.mounts),
            ],
            "NetworkMode": network,
            "PidsLimit": self.pids_of(spec),
            "ReadonlyRootfs": True,  # the scratch and the virtual folders are all a kernel can write
            "CapDrop": ["ALL"],
            "CapAdd": list(self.cap_add),
            "SecurityOpt": ["no-new-privileges"],
            "Ulimits": list(self.ulimits),
            # what reaches the container's own stdout (a kernel may write to fd 1 of its runner) is
            # capped on the node's disk; kernel output proper goes to the manager, bounded there
            "LogConfig": {"Type": "json-file", "Config": {"max-size": CONTAINER_LOG_MAX, "max-file": "1"}},
        }
        if layout.tmpfs:
            owner = f",uid={self.owner[0]},gid={self.owner[1]}" if self.owner else ""
            host["Tmpfs"] = {
                target: f"rw,exec,nosuid,nodev,size={size},mode={mode:o}{owner if target == '/home/work' else ''}"
                for target, (size, mode) in layout.tmpfs.items()
            }
        if spec.gpus:  # the NVIDIA container runtime gives the container exactly these devices
            host["DeviceRequests"] = [
                {"Driver": "nvidia", "DeviceIDs": [u for u, _ in spec.gpus], "Capabilities": [["gpu"]]}
            ]
        cpu, mem = spec.slots.get("cpu"), spec.slots.get("mem")
        if cpu:
            host["NanoCpus"] = int(cpu * 1_000_000_000)
        if mem:
            host["Memory"] = int(mem)
            host["MemorySwap"] = int(mem)
        labels = {
            **self.labels,
            LABEL_KERNEL: spec.kernel_id,
            LABEL_SESSION: spec.session_id,
            LABEL_AGENT: self.agent_id,
            "bai.session-name": spec.session_name,
            "bai.cluster-role": spec.cluster_role,
        }
        if pooled:
            labels[LABEL_POOL] = spec.image
        if spec.cluster is not None:  # the agent adopts it with its place in the session
            labels[LABEL_CLUSTER] = json.dumps(spec.cluster.to_wire())
            labels[LABEL_CLUSTER_IDX] = str(spec.cluster_idx)
        if spec.gpus:  # the agent rebuilds its GPU map from these after a restart
            labels["bai.gpus"] = json.dumps([[u, str(a)] for u, a in spec.gpus])
        if service_ports:  # the kernel's apps and the host ports they are published on (for adoption)
            labels[LABEL_SERVICE_PORTS] = json.dumps([sp.to_wire() for sp in service_ports])
            published = {
                f"{c}/tcp": [{"HostIp": "127.0.0.1", "HostPort": str(h)}]
                for sp in service_ports
                for c, h in zip(sp.container_ports, sp.host_ports, strict=False)
            }
            if published:
                host["PortBindings"] = published
        config: dict[str, Any] = {
            "Image": spec.image,
            "Entrypoint": ["/bin/sh", "-c", *self._runner_start(_ENTRYPOINT)],
            "Cmd": [],
            "Env": [f"{k}={v}" for k, v in env.items()],
            "Labels": labels,
            "WorkingDir": "/home/work",
            "Hostname": hostname,
            "HostConfig": host,
        }
        if networking is not None:
            config["NetworkingConfig"] = networking
        if self.user:
            config["User"] = self.user
        if "PortBindings" in host:
            config["ExposedPorts"] = {port: {} for port in host["PortBindings"]}
        return config

    async def create(self, spec: KernelSpec, on_output: OutputSink, pooled: bool = False) -> Kernel:
        assert self.docker is not None
        self.check_cluster(spec)  # (before anything is made)
        loop = asyncio.get_running_loop()
        kdir = self.kernels_dir / spec.kernel_id
        run_dir = kdir / "run"
        run_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(run_dir, 0o755)  # mounted read-only; the kernel only connects to the socket in it
        exited: asyncio.Future[int] = loop.create_future()
        ending: dict[str, str] = {}
        listener: RunnerChannel | None = None
        container: Any = None
        watcher: asyncio.Task[None] | None = None
        peers: asyncio.Future[None] | None = None  # multi-node: the start of its session's peer proxies here

        async def clean_up() -> None:
            self.ports.release(spec.kernel_id)
            if listener is not None:
                await listener.close()
            if container is not None:
                await self._remove_container(container, spec.kernel_id)
            await self._leave_network(spec)  # (after its container: the last kernel's start removes the network)
            if watcher is not None:
                watcher.cancel()
            await asyncio.to_thread(scratchlib.remove_kernel_dir, kdir)

        try:
            volumes, labels = await self._image_config(spec)
            service_ports = await self._service_ports_once_freed(spec, labels)
            # the scratch is prepared (mkfs, mount: in a thread) while the container is created: creating
            # only names the scratch's folders (Docker looks at a bind's source when it starts)
            layout = self.scratch.plan(kdir, self.owner, volumes) if self.scratch is not None else Layout()
            preparing = asyncio.ensure_future(self._prepare_scratch(kdir, volumes))
            try:
                # a cluster kernel: its session's network exists now (and its peer proxies are starting)
                peers = await self._join_network(spec, run_dir)
                listener = await listen_for_runner(run_dir, on_output, self.owner)
                config = self._container_config(spec, run_dir, layout, service_ports, pooled)
                try:
                    container = await self.docker.containers.create(config, name=f"bai-{spec.kernel_id}")
                except DockerError as e:
                    if e.status == 404:
                        raise KernelStartError(f"image {spec.image!r} not found on agent {self.agent_id}") from None
                    raise KernelStartError(f"cannot create the container: {e.message}") from None
                await self._connect_network(container, spec)
            except BaseException:
                await asyncio.gather(preparing, return_exceptions=True)  # a mount in progress: before the clean-up
                raise
            if await preparing != layout:
                raise ScratchError("the kernel's scratch is not where its container was told")  # (a bug)
            if layout.home is not None:
                write_dotfiles(layout.home, spec.dotfiles, self.owner)
            await container.start()
            watcher = asyncio.create_task(self._watch(container, exited, ending))
            # the host's mount of the scratch comes off while the runner starts (the container holds it now)
            detaching = asyncio.ensure_future(asyncio.to_thread(self.scratch.detach, kdir)) if self.scratch else None
            try:
                channel = await self._runner_or_exec(
                    container, listener, kdir, loop.time() + self.start_timeout, exited
                )
            except BaseException:
                if detaching is not None:
                    await asyncio.gather(detaching, return_exceptions=True)  # before the clean-up unmounts
                raise
            if detaching is not None:
                await detaching
            if channel is not listener:
                listener = None  # closed: the image has no Python
                if peers is not None:
                    raise KernelStartError(self._no_python_for_peers(spec))
            if peers is not None:
                await asyncio.shield(peers)  # (shared by the session's kernels here: never cancelled by one)
                await self._check_peers(spec)
            if layout.home is None:  # the home is a tmpfs that exists only now: write through the kernel
                for f in spec.dotfiles:
                    await exec_write(self.docker, container.id, f.path, f.data.encode(), f.mode)
        except asyncio.CancelledError:  # the manager gave up waiting: leave nothing behind
            await asyncio.shield(clean_up())
            raise
        except KernelStartError:
            await clean_up()
            raise
        except (ChannelError, DockerError, ScratchError, OSError) as e:
            detail = await self._tail(container) if container is not None else ""
            await clean_up()
            reason = e.message if isinstance(e, DockerError) else str(e)
            if "rlimit" in reason:
                reason += " ([agent] nofile above the Docker daemon's own limits?)"
            if exited.done():
                reason = ending.get("msg") or f"the container exited with code {exited.result()} while starting"
            raise KernelStartError(f"{reason}{': ' + detail if detail else ''}") from None
        kernel = Kernel(spec=spec, channel=channel, run_dir=run_dir, container_id=container.id, ending=ending)
        kernel.service_ports = service_ports
        if pooled:
            kernel.pool_image = spec.image
        self._link_exit(kernel, exited, watcher)
        return kernel

    # -- the warm pool ----------------------------------------------------------------------------

    warm_pool = True

    async def create_pooled(self, image: str, pool_id: str, on_output: OutputSink) -> Kernel:
        """A kernel of `image` for the warm pool: what `create` makes for a session, minus the session
        (its variables, dotfiles) and with POOL_SLOTS as limits; labelled LABEL_POOL."""
        spec = KernelSpec(pool_id, "", "", "", image, dict(POOL_SLOTS), {})
        kernel = await self.create(spec, on_output, pooled=True)
        await self._host_pid(kernel.container_id or "")  # known ahead: the hand-over writes its cgroup
        return kernel

    async def _host_pid(self, container_id: str) -> int:
        """The container's first process as the host sees it (0: not running, or unknown)."""
        assert self.docker is not None
        pid = self._pids.get(container_id)
        if pid is None:
            try:
                state = (await self.docker.containers.container(container_id).show()).get("State") or {}
            except DockerError:
                return 0
            pid = int(state.get("Pid") or 0) if state.get("Running") else 0
            if pid:
                self._pids[container_id] = pid
        return pid

    async def host_pids(self, container_ids: list[str]) -> dict[str, int]:
        """Container id -> its first process as the host sees it, for those that run; Docker is asked only
        about containers whose process is not known yet (the statistics sampler asks every round)."""
        missing = [cid for cid in container_ids if cid not in self._pids]
        if missing:
            await asyncio.gather(*(self._host_pid(cid) for cid in missing), return_exceptions=True)
        return {cid: self._pids[cid] for cid in container_ids if self._pids.get(cid)}

    async def stale(self, kernels: list[Kernel]) -> list[Kernel]:
        """Pooled kernels whose image name now means another image (rebuilt, pulled again): a session must
        get what a cold start would, so they go."""
        assert self.docker is not None
        current: dict[str, str | None] = {}
        out = []
        for kernel in kernels:
            image, cid = kernel.spec.image, kernel.container_id or ""
            if image not in current:
                try:
                    current[image] = (await self.docker.images.inspect(image))["Id"]
                except DockerError:
                    current[image] = None  # gone: its removal takes the kernels
            if cid not in self._image_ids:
                with contextlib.suppress(DockerError):
                    self._image_ids[cid] = (await self.docker.containers.container(cid).show()).get("Image") or ""
            if current[image] and self._image_ids.get(cid) and self._image_ids[cid] != current[image]:
                out.append(kernel)
        return out

    async def hand_over(self, kernel: Kernel, spec: KernelSpec) -> None:
        """Make a pooled kernel `spec`'s: claimed on the host first (see assignment.py), then its limits
        (`docker update`), the session's variables (the runner's env op; exec_env for docker exec) and its
        dotfiles, then recorded as ready. The container is renamed bai-<kernel id> afterwards."""
        assert self.docker is not None and kernel.container_id is not None
        kdir = kernel.run_dir.parent
        env = kernel_env(spec)
        pool_id = kernel.spec.kernel_id
        try:
            assignment.write(kdir, spec, env, assignment.CLAIMED)
            cpu, mem = spec.slots["cpu"], int(spec.slots["mem"])
            limits = {
                "NanoCpus": int(cpu * 1_000_000_000),
                "Memory": mem,
                "MemorySwap": mem,
                "PidsLimit": self.pids_of(spec),
            }
            update = self.docker._query_json(f"containers/{kernel.container_id}/update", method="POST", data=limits)
            pid = self._pids.get(kernel.container_id, 0)
            old_mem = int(kernel.spec.slots.get("mem") or 0) or None
            # a few small writes to sysfs (well under a millisecond): not worth a thread hop
            if pid and cgroups.apply(pid, kernel.container_id, cpu, mem, old_mem):
                # in force now; Docker records the same limits (for `docker inspect`) in the background
                self._chore(self._record_limits(update, kernel.container_id))
            else:
                await update
            if isinstance(kernel.channel, ExecChannel):
                kernel.channel.env = env
            else:
                await kernel.channel.set_env(env)
            for f in spec.dotfiles:
                if isinstance(kernel.channel, ExecChannel):
                    await exec_write(self.docker, kernel.container_id, f.path, f.data.encode(), f.mode, env)
                else:
                    await kernel.channel.put_file(f.path, f.data.encode(), f.mode)
            assignment.write(kdir, spec, env, assignment.READY)
        except (DockerError, ChannelError, OSError, KeyError) as e:
            raise KernelStartError(f"the warm kernel could not be handed over: {leftovers.detail(e)}") from None
        if kernel.service_ports:  # its apps' host ports are the session kernel's now
            self.ports.release(pool_id)
            self.ports.hold(spec.kernel_id, [p for sp in kernel.service_ports for p in sp.host_ports])
        kernel.spec = spec
        kernel.pool_image = None
        kernel.exec_env = env
        container = self.docker.containers.container(kernel.container_id)
        self._chore(self._rename(container, f"bai-{spec.kernel_id}"))

    def _chore(self, coro: Any) -> None:
        chore = asyncio.ensure_future(coro)
        self._chores.add(chore)
        chore.add_done_callback(self._chores.discard)

    async def _record_limits(self, update: Any, container_id: str) -> None:
        try:
            await update
        except DockerError as e:  # (the kernel was removed meanwhile) the limits are in force anyway
            log.debug("docker update of %s: %s", container_id[:12], e.message)

    async def _rename(self, container: Any, name: str) -> None:
        """Best effort (the name only helps people reading `docker ps`; labels and the assignment decide)."""
        with contextlib.suppress(DockerError):
            await container.rename(name)

    async def kill(self, kernel: Kernel) -> bool:
        """SIGKILL to the kernel's first process (as the host sees it, once checked to be the container's):
        every process of the kernel dies with it at once. Docker's own kill when that cannot be done. The
        container and its scratch are then removed by `destroy`."""
        assert self.docker is not None
        kernel.destroying = True
        if kernel.settled is not None:
            kernel.settled.cancel()
        await kernel.channel.close()
        cid = kernel.container_id
        if not cid:
            return False
        pid = await self._host_pid(cid)
        # (in the loop, not a thread: two reads under /proc and a signal; a session's kernels end together)
        if pid and _kill_if_in(pid, cid):
            self._dying.add(kernel.spec.kernel_id)  # (`destroy`, in the background, gives its host ports back)
            return True
        try:
            await self.docker.containers.container(cid).kill(signal="SIGKILL")
        except DockerError as e:
            if e.status not in (404, 409):  # gone, or not running
                return False
        self._dying.add(kernel.spec.kernel_id)
        return True

    async def _image_config(self, spec: KernelSpec) -> tuple[list[str], dict[str, str]]:
        """The image's VOLUME paths that no virtual folder covers (they go on the scratch, bounded), and
        its labels."""
        assert self.docker is not None
        try:
            info = await self.docker.images.inspect(spec.image)
        except DockerError:
            return [], {}  # no such image: creating the container says so
        config = info.get("Config") or {}
        mounted = {m.target for m in spec.mounts}
        return sorted(v for v in config.get("Volumes") or {} if v not in mounted), dict(config.get("Labels") or {})

    async def _service_ports_once_freed(self, spec: KernelSpec, labels: dict[str, str]) -> list[ServicePort]:
        """`_service_ports`; where the pool is short while killed kernels' containers are still being removed,
        once their host ports are back (at most PORTS_FREED_WAIT seconds): a destroy that answered has freed its
        ports as far as its user can tell."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PORTS_FREED_WAIT
        while True:
            try:
                return self._service_ports(spec, labels)
            except KernelStartError:
                if not any(self.ports.held.get(k) for k in self._dying) or loop.time() >= deadline:
                    raise
            self._ports_freed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ports_freed.wait(), deadline - loop.time())

    def _service_ports(self, spec: KernelSpec, labels: dict[str, str]) -> list[ServicePort]:
        """The image's apps; published on 127.0.0.1 from the port pool where the kernel's network can
        publish (KernelStartError when the pool is exhausted)."""
        try:
            declared = apps.from_labels(labels)
        except ValueError as e:
            log.warning("image %s: %s (its apps are not offered)", spec.image, e)
            return []
        if not declared or not self.publishes(spec):
            return declared
        try:
            hosts = self.ports.take(spec.kernel_id, sum(len(sp.container_ports) for sp in declared))
        except PortPoolExhausted as e:
            raise KernelStartError(str(e)) from None
        out = []
        for sp in declared:
            mine, hosts = hosts[: len(sp.container_ports)], hosts[len(sp.container_ports) :]
            out.append(ServicePort(sp.name, sp.protocol, sp.container_ports, tuple(mine)))
        return out

    async def _prepare_scratch(self, kdir: Path, volumes: list[str]) -> Layout:
        """The kernel's scratch, set up on the host (mkfs and mount for hostfile) in a thread."""
        if self.scratch is None:
            return Layout()
        job = asyncio.ensure_future(asyncio.to_thread(self.scratch.prepare, kdir, self.owner, volumes))
        try:
            return await asyncio.shield(job)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):  # its error does not matter now: the start was cancelled
                await job  # let a mount finish, so that the clean-up finds it
            raise

    async def _runner_or_exec(
        self, container: Any, listener: RunnerChannel, kdir: Path, deadline: float, exited: asyncio.Future[int]
    ) -> Channel:
        """Wait until the runner connects, or the container's log says the image has no Python. The
        connection is an event, waited for on its own: the log is read alongside (from 50 ms on, less and
        less often), never in the way of a runner that connects meanwhile."""
        assert self.docker is not None
        connected = asyncio.ensure_future(listener.wait_connected(deadline, exited))
        no_python = asyncio.ensure_future(self._watch_no_python(container))
        try:
            await asyncio.wait({connected, no_python}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            no_python.cancel()
            if not connected.done():
                connected.cancel()
        if connected.done() and not connected.cancelled():
            connected.result()  # ChannelError: it exited, or did not connect in time
            return listener
        await asyncio.gather(connected, return_exceptions=True)  # its cancellation done (not ours swallowed)
        no_python.result()  # True (or what went wrong reading the log)
        await listener.close()
        (kdir / EXEC_MARKER).touch()  # for the next agent that adopts the kernel
        return ExecChannel(self.docker, container.id, listener.on_output)

    async def _watch_no_python(self, container: Any) -> bool:
        """True once the container's log says the image has no Python (polled: 50 ms, then ×1.5 up to 200 ms)."""
        delay = 0.05
        while True:
            await asyncio.sleep(delay)
            if await self._says_no_python(container):
                return True
            delay = min(delay * 1.5, 0.2)

    async def _remove_container(self, container: Any, kernel_id: str) -> None:
        """Remove a kernel's container and its anonymous volumes. One already gone (or being removed) is
        fine; one that cannot be removed is logged as left behind, with how to remove it by hand."""
        try:
            await container.delete(force=True, v=True)
        except DockerError as e:
            if e.status == 404 or (e.status == 409 and "in progress" in str(e.message)):
                return
            short = str(container.id)[:12]
            what = f"container {short} (kernel {kernel_id})"
            leftovers.report(what, e, remedy=f"remove it with `docker rm -f {short}`", logger=log)

    async def _says_no_python(self, container: Any) -> bool:
        with contextlib.suppress(DockerError):
            lines = await container.log(stdout=True, tail=20)
            return bool(lines) and lines[0].strip() == NO_PYTHON
        return False

    def _link_exit(self, kernel: Kernel, exited: asyncio.Future[int], watcher: asyncio.Task[None]) -> None:
        kernel.watcher = watcher
        exited.add_done_callback(lambda f: kernel.set_exit(f.result()))

    async def _watch(self, container: Any, exited: asyncio.Future[int], ending: dict[str, str]) -> None:
        """Wait for the container to end; then record in `ending` whether the OOM killer ended it (Docker's
        State.OOMKilled), before telling `exited`."""
        code = 137
        try:
            result = await container.wait()
            code = int(result.get("StatusCode", 137))
        except DockerError as e:
            if e.status != 404:
                code = 137
        except asyncio.CancelledError:
            return
        try:
            info = await container.show()
        except DockerError:
            info = {}  # removed (destroyed) meanwhile
        except asyncio.CancelledError:
            return
        # OOMKilled says the OOM killer struck in the container at some time: it ended the kernel when the
        # kernel ended by SIGKILL (a command killed earlier does not make a later exit an OOM kill)
        if code == 137 and (info.get("State") or {}).get("OOMKilled"):
            ending.update(oom_ending(int((info.get("HostConfig") or {}).get("Memory") or 0)))
        if not exited.done():
            exited.set_result(code)

    async def oom_kills(self, kernel: Kernel) -> int | None:
        """How many processes of the kernel the OOM killer has killed so far (its memory cgroup's count),
        or None where that cannot be read (e.g. a kernel older than v4.13 on cgroup v1)."""
        assert self.docker is not None and kernel.container_id is not None
        pid = self._pids.get(kernel.container_id)
        if pid is None:
            try:
                info = await self.docker.containers.container(kernel.container_id).show()
            except DockerError:
                return None
            pid = self._pids[kernel.container_id] = int((info.get("State") or {}).get("Pid") or 0)
        return await asyncio.to_thread(cgroups.oom_kills, pid) if pid else None

    async def memory_limit(self, kernel: Kernel) -> int:
        if kernel.spec.slots.get("mem"):
            return int(kernel.spec.slots["mem"])
        assert self.docker is not None
        if kernel.container_id is None:
            return 0  # (no container to ask)
        with contextlib.suppress(DockerError):
            info = await self.docker.containers.container(kernel.container_id).show()
            return int((info.get("HostConfig") or {}).get("Memory") or 0)
        return 0

    async def _tail(self, container: Any) -> str:
        with contextlib.suppress(Exception):
            lines = await container.log(stdout=True, stderr=True, tail=5)
            return "".join(lines).strip()[-400:]
        return ""

    async def destroy(self, kernel: Kernel) -> None:
        assert self.docker is not None
        kernel.destroying = True
        if kernel.settled is not None:
            kernel.settled.cancel()
        await kernel.channel.close()
        self._pids.pop(kernel.container_id or "", None)
        self._image_ids.pop(kernel.container_id or "", None)
        if kernel.container_id:
            await self._remove_container(self.docker.containers.container(kernel.container_id), kernel.spec.kernel_id)
        await self._leave_network(kernel.spec)  # the session's last kernel here takes its network with it
        if kernel.watcher is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(kernel.watcher, 5)
        kernel.set_exit(137)
        self.ports.release(kernel.spec.kernel_id)
        if kernel.spec.kernel_id in self._dying:
            self._dying.discard(kernel.spec.kernel_id)
            self._ports_freed.set()
        await asyncio.to_thread(scratchlib.remove_kernel_dir, kernel.run_dir.parent)

    async def adopt(self, on_output: OutputSink) -> list[Kernel]:
        """Re-attach to this agent's running containers; remove its dead ones, and the folders and scratch
        mounts of kernels that are gone. Returns at once: a kernel whose runner has not connected again yet
        (one still starting when the agent died, or slow) settles in the background (see _settle)."""
        assert self.docker is not None
        found = await self.docker.containers.list(all=True, filters={"label": [f"{LABEL_AGENT}={self.agent_id}"]})
        adopted = await asyncio.gather(*(self._adopt_one(c, on_output) for c in found))
        kernels = [k for k in adopted if k is not None]
        for kernel in kernels:  # the sessions' networks are held by their kernels still running
            if self.session_network(kernel.spec) is not None:
                self._net_members.setdefault(kernel.spec.session_id, set()).add(kernel.spec.kernel_id)
        held = {name for k in kernels if (name := self.session_network(k.spec)) is not None}
        await leftovers.remove_networks(
            self.docker,
            self.agent_id,
            held,
            prefix=NETWORK_PREFIX,
            agent_label=NET_LABEL_AGENT,
            peer_label=LABEL_PEER,
            logger=log,
        )
        keep = {k.run_dir.parent.name for k in kernels}  # a handed-over warm kernel keeps its pool folder
        gone = await asyncio.to_thread(scratchlib.cleanup, self.kernels_dir, keep)
        if gone:
            log.info("removed the folders of %d kernels that are gone", len(gone))
        return kernels

    async def _adopt_one(self, c: Any, on_output: OutputSink) -> Kernel | None:
        assert self.docker is not None
        loop = asyncio.get_running_loop()
        info = c._container
        labels = info.get("Labels") or {}
        kid = str(labels.get(LABEL_KERNEL) or "")
        kdir = self.kernels_dir / kid
        run_dir = kdir / "run"
        safe = re.fullmatch(r"[A-Za-z0-9_.-]+", kid) is not None and kid not in (".", "..")
        if not safe or info.get("State") != "running" or not run_dir.exists():
            await self._remove_container(c, kid or "unknown")
            return None
        pool_image = labels.get(LABEL_POOL)
        assigned = assignment.read(kdir) if pool_image is not None else None
        if assigned is not None and assigned.get("state") != assignment.READY:
            log.info("removing warm kernel %s: its hand-over to a session did not finish", kid)
            await self._remove_container(c, kid)
            return None
        container = self.docker.containers.container(c.id)
        exited: asyncio.Future[int] = loop.create_future()
        ending: dict[str, str] = {}
        watcher = asyncio.create_task(self._watch(container, exited, ending))
        channel: Channel
        try:
            if (kdir / EXEC_MARKER).exists():
                channel = ExecChannel(self.docker, c.id, on_output)
            else:
                channel = await listen_for_runner(run_dir, on_output, self.owner)
        except OSError as e:
            log.warning("removing kernel %s: cannot listen for its runner (%s)", kid, e)
            watcher.cancel()
            await self._remove_container(c, kid)
            return None
        spec = KernelSpec(
            kernel_id=kid,
            session_id=labels.get(LABEL_SESSION, ""),
            session_name=labels.get("bai.session-name", ""),
            access_key="",
            image=info.get("Image", ""),
            slots={},
            environ={},
            cluster_role=labels.get("bai.cluster-role") or "main",
            cluster_idx=int(idx) if (idx := labels.get(LABEL_CLUSTER_IDX, "1")).isdigit() else 1,
            gpus=gpus_from_labels(labels),
            cluster=cluster_from_labels(labels),
        )
        if assigned is not None:  # a warm kernel handed over to its session
            spec = assignment.spec_of(assigned)
        kernel = Kernel(spec=spec, channel=channel, run_dir=run_dir, container_id=c.id, ending=ending)
        if assigned is not None:
            kernel.exec_env = assignment.env_of(assigned)
            if isinstance(channel, ExecChannel):
                channel.env = kernel.exec_env
        elif pool_image is not None:
            kernel.pool_image = pool_image
        with contextlib.suppress(ValueError):
            kernel.service_ports = apps.loads(json.loads(labels.get(LABEL_SERVICE_PORTS) or "[]"))
        for sp in kernel.service_ports:
            self.ports.hold(spec.kernel_id, sp.host_ports)
        self._link_exit(kernel, exited, watcher)
        if isinstance(channel, RunnerChannel):
            kernel.settled = asyncio.ensure_future(self._settle(kernel, container, channel, exited))
        return kernel

    async def _settle(
        self, kernel: Kernel, container: Any, listener: RunnerChannel, exited: asyncio.Future[int]
    ) -> None:
        """An adopted kernel's runner connects again, or (a kernel caught starting by the agent's death, before
        the agent saw it) its log says the image has no Python: then its channel becomes docker exec. Waits
        up to the start timeout; a kernel that does neither is removed, and ends saying why."""
        kid = kernel.spec.kernel_id
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.start_timeout
        try:
            channel = await self._runner_or_exec(container, listener, kernel.run_dir.parent, deadline, exited)
        except ChannelError as e:
            if exited.done():
                return  # it ended by itself: the agent reports that
            log.warning("removing kernel %s: its runner did not come back (%s)", kid, e)
            kernel.ending.update(
                reason=StatusInfo.FAILED_TO_START,
                msg=f"the kernel's runner did not connect within {self.start_timeout:g} s after the agent restarted",
            )
            await self._remove_container(container, kid)
            return
        except Exception:
            log.exception("adopting kernel %s failed", kid)
            return
        if channel is not listener:
            channel.on_output = listener.on_output  # the agent's sink, given after adoption
            if isinstance(channel, ExecChannel):
                channel.env = kernel.exec_env
            kernel.channel = channel
            log.info("kernel %s has no Python: its commands run through docker exec", kid)

    async def has_image(self, image: str) -> bool:
        assert self.docker is not None
        try:
            await self.docker.images.inspect(image)
        except DockerError as e:
            if e.status == 404:
                return False
            raise
        return True

    async def pull(
        self, image: str, progress: PullProgress | None = None, auth: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """`docker pull` with progress: `progress(done_bytes, total_bytes)` as layers download; `auth`
        ({username, password, serveraddress}, from the manager) goes only into X-Registry-Auth."""
        assert self.docker is not None
        layers: dict[str, tuple[int, int]] = {}
        try:
            async for event in self.docker.images.pull(image, auth=auth or None, stream=True, timeout=None):
                detail = event.get("progressDetail") or {}
                if event.get("id") and detail.get("total"):
                    layers[event["id"]] = (int(detail.get("current", 0)), int(detail["total"]))
                elif event.get("id") and event.get("status") in ("Download complete", "Pull complete"):
                    done = layers.get(event["id"])
                    if done:
                        layers[event["id"]] = (done[1], done[1])
                if progress is not None:
                    await progress(sum(c for c, _ in layers.values()), sum(t for _, t in layers.values()))
        except DockerError as e:
            raise KernelStartError(f"cannot pull {image}: {e.message}") from None
        info = await self.docker.images.inspect(image)
        return {
            "name": image,
            "id": info["Id"],
            "size": info.get("Size", 0),
            "labels": info["Config"].get("Labels") or {},
        }

    async def remove_image(self, image: str) -> None:
        assert self.docker is not None
        try:
            await self.docker.images.delete(image)
        except DockerError as e:
            raise KernelStartError(f"cannot remove {image}: {e.message}") from None

    async def open_terminal(self, kernel: Kernel, command: list[str], rows: int, cols: int) -> Terminal:
        """`docker exec` with a TTY, as the kernel's user, in /home/work."""
        assert self.docker is not None
        if kernel.container_id is None:
            raise KernelStartError("the kernel has no container yet")
        container = self.docker.containers.container(kernel.container_id)
        try:
            return await DockerExecTerminal.start(container, command, kernel.exec_env, rows, cols)
        except aiodocker.DockerError as e:
            raise KernelStartError(f"cannot start {command[0]!r} in the kernel: {e.message}") from None

    async def list_files(self, kernel: Kernel, path: str) -> dict[str, Any]:
        """Run the listing with the container's Python, so it sees the kernel's files and mounts."""
        assert self.docker is not None and kernel.container_id is not None
        container = self.docker.containers.container(kernel.container_id)
        try:
            run = await container.exec(
                ["python3", "-c", list_script(), path], workdir="/home/work", environment=kernel.exec_env or None
            )
            stream = run.start(detach=False)
            out, err = b"", b""
            async with stream:
                while (msg := await stream.read_out()) is not None:
                    if msg.stream == 1:
                        out += msg.data
                    else:
                        err += msg.data
        except DockerError as e:
            return {"files": "[]", "errors": f"cannot list files: {e.message}", "abspath": path}
        try:
            listing: dict[str, Any] = json.loads(out)  # list_script prints one JSON object
            return listing
        except ValueError:
            detail = err.decode(errors="replace").strip()[-300:] or "no Python in this image?"
            return {"files": "[]", "errors": f"cannot list files: {detail}", "abspath": path}

    async def download(self, kernel: Kernel, path: str, limit: int) -> bytes:
        """A tar archive of `path` in the kernel, made inside it as its user (with its Python, else `tar`),
        so it sees exactly the kernel's files and mounts and reaches nothing else."""
        assert self.docker is not None and kernel.container_id is not None
        container = self.docker.containers.container(kernel.container_id)
        script = (
            'if command -v python3 >/dev/null 2>&1; then exec python3 -c "$0" "$1" "$2"; fi; '
            '[ -e "$1" ] || { echo "$1: no such file or folder" >&2; exit 2; }; '
            'cd "$(dirname "$1")" && exec tar -cf - -- "$(basename "$1")"'
        )
        out, err = bytearray(), b""
        try:
            run = await container.exec(
                ["/bin/sh", "-c", script, tar_script(), path, str(limit)],
                workdir="/home/work",
                environment=kernel.exec_env or None,
            )
            stream = run.start(detach=False)
            async with stream:
                while (msg := await stream.read_out()) is not None:
                    if msg.stream == 1:
                        out += msg.data
                        if len(out) > limit + 1024 * 1024:  # file data plus tar headers
                            raise ChannelError(f"{path} is larger than {limit // (1024 * 1024)} MiB")
                    else:
                        err += msg.data
            code = (await run.inspect()).get("ExitCode")
        except DockerError as e:
            raise ChannelError(f"cannot read {path}: {e.message}") from None
        if code != 0:
            raise ChannelError(err.decode(errors="replace").strip()[-300:] or f"cannot read {path} (exit {code})")
        return bytes(out)

    async def commit(self, kernel: Kernel, image: str) -> dict[str, Any]:
        """`docker commit` of the kernel's container as `image`, with its image's own configuration (not the
        kernel's labels, environment or entrypoint), so that it starts as the image it came from did."""
        assert self.docker is not None
        if kernel.container_id is None:
            raise KernelStartError("the kernel has no container")
        container = self.docker.containers.container(kernel.container_id)
        repository, _, tag = image.rpartition(":")
        try:
            info = await container.show()
            base = await self.docker.images.inspect(info.get("Image") or kernel.spec.image)
            original = base.get("Config") or {}
            mine = info.get("Config") or {}
            # Docker fills what the config leaves out from the container's own: blank the kernel's labels and
            # environment (the session's variables may be secrets) instead of leaving them out
            labels = {k: "" for k in mine.get("Labels") or {}} | (original.get("Labels") or {})
            env = list(original.get("Env") or [])
            names = {e.partition("=")[0] for e in env}
            env += [f"{n}=" for n in (e.partition("=")[0] for e in mine.get("Env") or []) if n not in names]
            config = {k: original.get(k) for k in ("Entrypoint", "Cmd", "User", "WorkingDir", "ExposedPorts")}
            config.update(Labels=labels, Env=env)
            await container.commit(repository=repository, tag=tag, config=config, pause=True)
            made = await self.docker.images.inspect(image)
        except DockerError as e:
            raise KernelStartError(f"cannot commit the kernel: {e.message}") from None
        return {
            "name": image,
            "id": made["Id"],
            "size": made.get("Size", 0),
            "labels": (made.get("Config") or {}).get("Labels") or {},
        }

    async def close(self, kernels: list[Kernel]) -> None:
        # Containers keep running (pooled ones too); the next start of this agent re-adopts them.
        for chore in list(self._chores):
            chore.cancel()
        for kernel in kernels:
            if kernel.settled is not None:
                kernel.settled.cancel()
            await kernel.channel.detach()  # its runs go on: the next agent re-attaches to them
            if kernel.watcher is not None:
                kernel.watcher.cancel()
        if self.docker is not None:
            await self.docker.close()


class ExecChannel(Channel):
    """Batch commands through `docker exec`, for images without Python."""

    supports_query = False

    def __init__(self, docker: aiodocker.Docker, container_id: str, on_output: OutputSink) -> None:
        super().__init__(on_output)
        self.docker = docker
        self.container_id = container_id
        self._task: asyncio.Task[None] | None = None
        self._stream: Any = None
        self._exec: Any = None
        self.env: dict[str, str] = {}  # a warm kernel's session variables (see Kernel.exec_env)

    async def _start(self, mode: str, code: str) -> None:
        container = self.docker.containers.container(self.container_id)
        self._exec = await container.exec(
            ["/bin/sh", "-c", code], stdin=True, workdir="/home/work", environment=self.env or None
        )
        self._stream = self._exec.start(detach=False)
        await self._stream._init()
        self._task = asyncio.create_task(self._pump())

    async def _pump(self) -> None:
        code = 1
        try:
            while (msg := await self._stream.read_out()) is not None:
                self.feed({"t": "stdout" if msg.stream == 1 else "stderr", "d": msg.data.decode(errors="replace")})
            info = await self._exec.inspect()
            code = info.get("ExitCode") or 0
        except Exception as e:  # the container went away
            self.feed({"t": "stderr", "d": f"\n[{e}]\n"})
            code = 137
        finally:
            with contextlib.suppress(Exception):  # the exec's connection; nothing of the kernel's stays behind
                await self._stream.close()
            self.feed({"t": "finished", "exit": code})

    async def send_input(self, data: str) -> None:
        if self._stream is not None:
            await self._stream.write_in((data if data.endswith("\n") else data + "\n").encode())

    async def interrupt(self) -> None:
        if self._exec is not None:
            info = await self._exec.inspect()
            pid = info.get("Pid")
            if pid:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGINT)

    async def put_file(self, path: str, data: bytes, mode: int | None = None) -> None:
        if path.startswith("/") or ".." in Path(path).parts:
            raise ChannelError(f"cannot write {path}: the path must stay inside /home/work")
        await exec_write(self.docker, self.container_id, path, data, 0o644 if mode is None else mode, self.env)

    async def restart(self, timeout: float, exited: asyncio.Future[Any] | None = None) -> None:
        """No runner to start afresh: runs end and every process of the kernel but its first is killed
        (`kill -KILL -1` in the kernel spares its PID 1), so nothing of the old commands is left."""
        self.lost("\n[the kernel was restarted]\n")
        container = self.docker.containers.container(self.container_id)
        try:
            run = await container.exec(["/bin/sh", "-c", "kill -KILL -1 2>/dev/null; exit 0"])
            async with run.start(detach=False) as stream:
                while await stream.read_out() is not None:
                    pass
        except DockerError as e:
            raise ChannelError(f"cannot restart the kernel: {e.message}") from None

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
        await super().close()
