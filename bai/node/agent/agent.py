"""The agent: runs kernels through a backend, answers the manager's calls, ships events and logs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import platform
import secrets
import socket
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

from bai import __version__
from bai.common import slots as slotlib
from bai.common.background import Background, cancel_and_wait
from bai.common.cluster import CLUSTER_PORTS, kernel_name
from bai.common.images import registry_of
from bai.common.logs import LogThrottle
from bai.node.agent import batch
from bai.node.agent.apps import AppError, Apps, offered, relay
from bai.node.agent.backends.base import Backend, Dotfile, Kernel, KernelSpec, KernelStartError, Mount, oom_ending
from bai.node.agent.channel import ChannelError, OutputSink, RunnerChannel
from bai.node.agent.download import DownloadError, kernel_path
from bai.node.agent.gpu_alloc import GpuAllocator
from bai.node.agent.gpus import NVML
from bai.node.agent.pool import WarmPool
from bai.node.agent.stats import NodeSampler, Sample, kernel_gpus, sampler_for
from bai.node.agent.terminal import DEFAULT_COMMAND, window_part
from bai.node.agent.terminal import serve as serve_terminal
from bai.node.agent.warm_pool import reserved
from bai.node.link.base import AgentLink
from bai.node.link.messages import (
    CALLS,
    STREAMS,
    AppStarted,
    CommitKernel,
    CreateKernel,
    Destroyed,
    DestroyKernel,
    DownloadFiles,
    Execute,
    FileListing,
    GpuLive,
    Heartbeat,
    ImageInfo,
    Interrupt,
    JoinAnswer,
    KernelCreated,
    KernelInfo,
    KernelLogs,
    KernelPulling,
    KernelStats,
    KernelTerminated,
    ListFiles,
    ListImages,
    OpenPeerTunnel,
    OpenTerminal,
    OpenTunnel,
    PeerDial,
    PeerDialed,
    Ping,
    Pong,
    PullImage,
    Registration,
    RegistryAuth,
    RemoveImage,
    RestartKernel,
    RunResult,
    StartApp,
    UploadFiles,
    encode_result,
)
from bai.node.link.streams import LinkStream

log = logging.getLogger("bai.agent")
LOG_FLUSH_INTERVAL = 0.05
LOG_FLUSH_BYTES = 256 * 1024
MAX_TERMINALS = 16  # per kernel: each is a process a user keeps running
TERMINAL_AGENT_STOPPED = (
    "the agent of its kernel stopped (a restart?): the session goes on; open a terminal again once the node is back"
)
ENDED_KERNEL_GRACE = 60.0  # seconds an ended kernel's last output stays collectable
RESTART_TIMEOUT = 30.0  # seconds a restarted kernel's runner has to connect again
POOL_WAIT = 10.0  # seconds a session waits for a warm kernel that is starting before it starts cold
REMOVAL_GRACE = 10.0  # seconds a stopping agent lets killed kernels' removal finish (its next start removes the rest)
DIAL_TIMEOUT = 10.0  # seconds a kernel's connection to a kernel on another agent waits for the manager
FINAL_SAMPLE_TIMEOUT = 2.0  # seconds a kernel's last statistics may take before its end is reported without them


class LogShipper:
    """Batches kernel output into `kernel_logs` events (every 50 ms or 256 KiB)."""

    def __init__(self, link: AgentLink) -> None:
        self.link = link
        self.chunks: list[tuple[str, str]] = []
        self.size = 0
        self._has_data = asyncio.Event()
        self._full = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name="log-shipper")

    def add(self, kernel_id: str, text: str) -> None:
        if self.chunks and self.chunks[-1][0] == kernel_id:
            self.chunks[-1] = (kernel_id, self.chunks[-1][1] + text)
        else:
            self.chunks.append((kernel_id, text))
        self.size += len(text)
        self._has_data.set()
        if self.size >= LOG_FLUSH_BYTES:
            self._full.set()

    async def flush(self) -> None:
        if self.chunks:
            chunks, self.chunks, self.size = self.chunks, [], 0
            await self.link.emit(KernelLogs.name, KernelLogs(chunks).to_wire())

    async def _run(self) -> None:
        while True:  # idle until output arrives, then ship it within LOG_FLUSH_INTERVAL
            await self._has_data.wait()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._full.wait(), LOG_FLUSH_INTERVAL)
            self._has_data.clear()
            self._full.clear()
            try:
                await self.flush()
            except Exception:
                log.exception("shipping logs failed")

    async def close(self) -> None:
        await cancel_and_wait(self._task, expected=())
        await self.flush()


class Agent:
    """One node's agent: its kernels, their backend, and its end of the link to the manager."""

    def __init__(
        self,
        agent_id: str,
        backend: Backend,
        link: AgentLink,
        slots: slotlib.Slots,
        scaling_group: str = "default",
        vfolder_hosts: dict[str, Path] | None = None,
        state_dir: Path | None = None,
        gpus: NVML | None = None,
        app_start_timeout: float = 60.0,
        warm_pool: dict[str, int] | None = None,
        warm_pool_reserve: bool = False,
        default_network: str = "none",
        stat_interval: float = 2.0,
    ) -> None:
        self.gpus = gpus
        # statistics: every stat_interval seconds a KernelStats event (see agent/stats.py)
        self.stat_interval = stat_interval
        self.sampler = sampler_for(backend)
        self.node_sampler = NodeSampler(gpus, reuse=stat_interval / 2)
        self._last_samples: dict[str, Sample] = {}  # kernel id -> its latest periodic sample
        # kernels whose final samples are being taken in the next round (see _final_sample)
        self._final_round: list[tuple[Kernel, asyncio.Future[Sample | None]]] = []
        self._last_gpus: dict[str, dict[str, Any]] = {}  # device uuid -> its latest figures
        self._stats_task: asyncio.Task[None] | None = None
        self.apps = Apps(backend, app_start_timeout)
        self.gpu_alloc = GpuAllocator([g.uuid for g in gpus.gpus] if gpus else [])
        self.id = agent_id
        # the watcher (`bai watcher`, a separate process) reads status.json and sets / clears `drained`
        self.status_file = state_dir / "agent-status.json" if state_dir else None
        self._status_error: str | None = None  # why the status file cannot be written (warned about once)
        self.drain_file = state_dir / "drained" if state_dir else None
        self.vfolder_hosts = vfolder_hosts or {}  # name -> root, as this node's configuration says
        self.backend = backend
        self.link = link
        self.slots = slots
        self.scaling_group = scaling_group
        self.kernels: dict[str, Kernel] = {}
        self.logs: LogShipper | None = None
        self.background = Background(log)
        self.removals = Background(log)  # killed kernels' containers and scratch: a stop lets them finish
        self._ended: dict[str, Kernel] = {}  # kernels that ended by themselves, for a grace period
        # kernel id -> (run id, the kernel's OOM-kill count when the run started), where the backend counts
        self._oom_at_start: dict[str, tuple[str, int]] = {}
        self._terminals: dict[str, int] = {}  # kernel id -> terminals open in it
        self._terminal_streams: set[Any] = set()  # the streams of the terminals open now (ended when it stops)
        # dial id -> what the `peer-dialed` stream of a kernel's connection to another agent's kernel delivers:
        # (the stream, its error, an Event set once the connection is done with the stream)
        self._dials: dict[str, asyncio.Future[tuple[LinkStream, str, asyncio.Event]]] = {}
        # kernel id -> the log of its dials: a kernel can dial at will, so refusals are logged once per burst
        self._dial_logs: dict[str, LogThrottle] = {}
        # kernels started ahead of their sessions (Docker only; see pool.py and warm_pool.py)
        self.pool = WarmPool(backend, (warm_pool or {}) if getattr(backend, "warm_pool", False) else {})
        self.warm_pool_reserve = warm_pool_reserve
        self.default_network = default_network  # what a session that names no network gets

    def offered_slots(self) -> slotlib.Slots:
        """The slots offered to the manager: all of them, or (warm_pool_reserve) less what the pool may use."""
        if not self.warm_pool_reserve:
            return self.slots
        left = slotlib.sub(self.slots, reserved(self.pool.targets))
        return {name: max(amount, Decimal(0)) for name, amount in left.items()}

    async def registration(self) -> dict[str, Any]:
        return Registration(
            id=self.id,
            hostname=socket.gethostname(),
            backend=self.backend.name,
            version=__version__,
            architecture=platform.machine(),
            scaling_group=self.scaling_group,
            slots=slotlib.to_wire(self.offered_slots()),
            kernels=[KernelInfo(k.spec.kernel_id, k.spec.session_id, k.container_id) for k in self.kernels.values()],
            images=[ImageInfo.from_wire(i) for i in await self.backend.images()],  # with labels: minimum resources
            # the vfolder hosts this agent can reach, at which path (the manager compares with its own)
            vfolder_hosts={name: str(root) for name, root in self.vfolder_hosts.items() if root.is_dir()},
            gpus=self.gpus.describe() if self.gpus else [],
            warm=self.pool.counts(),
        ).to_wire()

    def heartbeat(self) -> dict[str, Any]:
        occupied: slotlib.Slots = {}
        for k in self.kernels.values():
            occupied = slotlib.add(occupied, k.spec.slots)
        drained = self.drain_file is not None and self.drain_file.exists()
        beat = Heartbeat(
            occupied_slots=slotlib.to_wire(occupied),
            kernels=sorted(self.kernels),
            schedulable=not drained,
            warm=self.pool.counts(),
        )
        if self.gpus and self.gpus.gpus:  # live use, and how much of each device kernels hold
            free = self.gpu_alloc.free()
            live = self.gpus.sample()
            beat.gpus = [GpuLive(**device, allocated=str(1 - f)) for device, f in zip(live, free, strict=True)]
        self._write_status(beat)
        return beat.to_wire()

    def _write_status(self, beat: Heartbeat) -> None:
        """What the watcher reports; its age tells a stuck agent from a busy one."""
        if self.status_file is None:
            return
        status = {
            "id": self.id,
            "pid": os.getpid(),
            "time": time.time(),
            "backend": self.backend.name,
            "drained": not beat.schedulable,
            "kernels": [
                {"kernel_id": k.spec.kernel_id, "session": k.spec.session_name, "container_id": k.container_id}
                for k in self.kernels.values()
            ],
            "warm": beat.warm,
        }
        tmp = self.status_file.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(status))
            tmp.replace(self.status_file)
        except OSError as e:  # (a full disk, say): warned about once, not at every heartbeat
            if self._status_error != e.strerror:
                self._status_error = e.strerror
                log.warning("cannot write %s: %s (the agent carries on)", self.status_file, e)
            return
        if self._status_error is not None:
            self._status_error = None
            log.info("%s is written again", self.status_file)

    async def rejoined(self, answer: dict[str, Any]) -> None:
        await self._reconcile(answer)

    async def _reconcile(self, answer: dict[str, Any]) -> None:
        """Remove the kernels the manager's join answer names (it does not know them, or their sessions have
        ended): each one's failure is logged, and the others are removed all the same."""
        for kid in JoinAnswer.from_wire(answer).destroy:
            kernel = self.kernels.pop(kid, None)
            if kernel is None:
                continue
            log.info("removing kernel %s: the manager does not know it, or its session has ended", kid)
            try:
                await self.backend.destroy(kernel)
            except Exception as e:
                log.warning("could not remove kernel %s: %s; the agent's next start removes it", kid, e)
            finally:
                self.gpu_alloc.release(kid)

    async def start(self) -> None:
        self.logs = LogShipper(self.link)
        # adopted kernels get their real output sink in _watch_exit
        pooled = []
        for kernel in await self.backend.adopt(lambda kind, text: None):
            if kernel.pool_image is not None:  # a warm kernel no session took: the pool's again
                pooled.append(kernel)
                continue
            self.kernels[kernel.spec.kernel_id] = kernel
            self.gpu_alloc.adopt(kernel.spec.kernel_id, kernel.spec.gpus)  # from the container's labels
            self._watch_exit(kernel)
        self.pool.adopt(pooled)
        await self._reconcile(await self.link.join(self))
        self.pool.start()  # after joining: refilling never delays the agent's start
        # a background task: an agent whose tasks end (stop, or a test's vanished agent) stops sampling too
        self._stats_task = self.background.spawn(self._stats_loop(), f"kernel-stats-{self.id}")

    async def stop(self) -> None:
        # a terminal is a connection to this process: it ends, saying why (its kernel and session go on)
        for stream in list(self._terminal_streams):
            with contextlib.suppress(Exception):
                await stream.close(TERMINAL_AGENT_STOPPED)
        await cancel_and_wait(self._stats_task, expected=())
        self._stats_task = None
        await self.pool.close()  # ready warm kernels stay running: the next start adopts them
        await self.background.close()
        await self.removals.drain(REMOVAL_GRACE)
        await self.removals.close()
        await self.backend.close([*self.kernels.values(), *self.pool.kernels()])
        if self.logs is not None:
            await self.logs.close()
        await self.link.close()

    # -- statistics ------------------------------------------------------------------------------

    async def _stats_loop(self) -> None:
        """Every stat_interval seconds, one KernelStats event: each running kernel's sample and the host's
        (sent even without kernels). A failing round is logged; the next one runs as usual."""
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                await self.stats_round()
            except Exception:
                log.exception("sampling the kernels' statistics failed")
            await asyncio.sleep(max(0.0, started + self.stat_interval - loop.time()))

    async def stats_round(self) -> KernelStats:
        """Sample the host and every running kernel, and send the samples (one KernelStats event)."""
        node = self.node_sampler.sample()
        self._last_gpus = node.get("gpus") or {}
        kernels = [k for k in self.kernels.values() if not k.destroying]
        # a kernel destroyed meanwhile is left out: its final sample went with its end
        samples = {kid: s for kid, s in (await self._sample(kernels)).items() if kid in self.kernels}
        self._last_samples = {kid: s for kid, s in {**self._last_samples, **samples}.items() if kid in self.kernels}
        self.sampler.prune()
        event = KernelStats(samples=samples, node=node)
        try:
            await self.link.emit(event.name, event.to_wire())
        except Exception as e:  # (the link is closing): the next round sends again
            log.debug("cannot send statistics: %s", e)
        return event

    async def _sample(self, kernels: list[Kernel]) -> dict[str, Sample]:
        """The kernels' samples (those that could be read), with the figures of the GPUs they hold."""
        if not kernels:
            return {}
        try:
            samples = await self.sampler.sample(kernels)
        except Exception:
            log.exception("sampling %d kernels failed", len(kernels))
            return {}
        for kernel in kernels:
            sample = samples.get(kernel.spec.kernel_id)
            if sample is not None and kernel.spec.gpus and "gpus" not in sample:
                sample["gpus"] = kernel_gpus(kernel.spec.gpus, self._last_gpus)
        return samples

    async def _final_sample(self, kernel: Kernel) -> Sample | None:
        """A kernel's last statistics as it ends: sampled now when it can still be read, else its latest
        periodic sample (None when it never had one). Kernels ending together (a session's kernels destroyed
        at once) are sampled in one round."""
        kid = kernel.spec.kernel_id
        latest = self._last_samples.pop(kid, None)
        loop = asyncio.get_running_loop()
        waiting: asyncio.Future[Sample | None] = loop.create_future()
        self._final_round.append((kernel, waiting))
        if len(self._final_round) == 1:  # the first of a round: the others arriving with it join it
            self.removals.spawn(self._sample_finals(), f"final-samples-{kid}")
        try:
            sample = await waiting
        finally:
            self.sampler.forget(kid)
        return sample or latest

    async def _sample_finals(self) -> None:
        """One sampling round for the kernels whose final samples are asked for now."""
        await asyncio.sleep(0)  # the calls that arrived with the first one join the round
        round_, self._final_round = self._final_round, []
        try:
            samples = await asyncio.wait_for(self._sample([k for k, _ in round_]), FINAL_SAMPLE_TIMEOUT)
        except Exception as e:
            log.debug("no final samples of %d kernels: %s", len(round_), e)
            samples = {}
        for kernel, waiting in round_:
            if not waiting.done():
                waiting.set_result(samples.get(kernel.spec.kernel_id))

    def _output_sink(self, kernel_id: str) -> OutputSink:
        def sink(kind: str, text: str) -> None:
            if self.logs is not None:
                self.logs.add(kernel_id, text)

        return sink

    def _watch_exit(self, kernel: Kernel) -> None:
        kernel.channel.on_output = self._output_sink(kernel.spec.kernel_id)
        if isinstance(kernel.channel, RunnerChannel):  # its connections to the other kernels of its session

            async def on_dial(host: str, port: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                await self.dial(kernel, host, port, reader, writer)

            kernel.channel.on_dial = on_dial

        def done(fut: asyncio.Future[int]) -> None:
            if kernel.destroying or self.kernels.get(kernel.spec.kernel_id) is not kernel:
                return
            self.background.spawn(self._kernel_exited(kernel, fut.result()), f"kernel-exited-{kernel.spec.kernel_id}")

        kernel.exited.add_done_callback(done)

    async def _kernel_exited(self, kernel: Kernel, code: int) -> None:
        """A kernel ended by itself: report it (acknowledged), then let a run still waiting finish."""
        kid = kernel.spec.kernel_id
        self.kernels.pop(kid, None)
        self.gpu_alloc.release(kid)
        # its channel still holds the end of the run: keep it reachable for the calls that collect it
        self._ended[kid] = kernel
        asyncio.get_running_loop().call_later(ENDED_KERNEL_GRACE, self._ended.pop, kid, None)
        self._oom_at_start.pop(kid, None)
        stats = await self._final_sample(kernel)  # at once: its cgroup may still be readable
        why = kernel.ending.get("msg")
        if why:  # into its log, and into a run still going (it ends with the exit code below)
            kernel.channel.feed({"t": "stderr", "d": f"\n[{why}]\n"})
        if self.logs is not None:
            await self.logs.flush()
        report = KernelTerminated(
            kernel_id=kid,
            session_id=kernel.spec.session_id,
            reason=kernel.ending.get("reason") or "self-terminated",
            exit_code=code,
            msg=why or None,
            stats=stats,
        )
        try:
            await self.link.report(report.name, report.to_wire())
        finally:
            if not kernel.channel.exit_code.done():
                kernel.channel.exit_code.set_result(code)
            try:
                await self.backend.destroy(kernel)
            except Exception as e:
                log.warning(
                    "could not remove ended kernel %s (container %s): %s; it may be left behind until the agent "
                    "restarts",
                    kid,
                    kernel.container_id,
                    e,
                )

    # -- calls from the manager ---------------------------------------------------------------

    async def handle_call(self, method: str, args: dict[str, Any]) -> Any:
        kind = CALLS.get(method)
        if kind is None:
            raise ValueError(f"unknown agent call {method!r}")
        message = kind.from_wire(args)
        handler = self._handlers[kind]
        return encode_result(await handler(message))

    async def handle_stream(self, kind: str, args: dict[str, Any], stream: LinkStream) -> None:
        opening = STREAMS.get(kind)
        if opening is None:
            raise ValueError(f"unknown stream {kind!r}")
        message = opening.from_wire(args)
        if isinstance(message, OpenTunnel):
            await self.apps.serve(await self._settled(message.kernel_id), message.app, stream)
            return
        if isinstance(message, OpenPeerTunnel):  # another agent's kernel connects to one of ours
            await self.apps.serve_peer(await self._settled(message.kernel_id), int(message.port), stream)
            return
        if isinstance(message, PeerDialed):  # the far end of a connection one of our kernels asked for
            await self._dialed(message, stream)
            return
        assert isinstance(message, OpenTerminal)
        kernel = await self._settled(message.kernel_id)
        rows, cols = window_part(message.rows, 24), window_part(message.cols, 80)
        command = list(message.command) if message.command else list(DEFAULT_COMMAND)
        kid = message.kernel_id
        if self._terminals.get(kid, 0) >= MAX_TERMINALS:
            raise KernelStartError(f"a kernel has at most {MAX_TERMINALS} terminals open at once")
        self._terminals[kid] = self._terminals.get(kid, 0) + 1
        self._terminal_streams.add(stream)
        try:
            terminal = await self.backend.open_terminal(kernel, command, rows, cols)
            await serve_terminal(terminal, stream)
        finally:
            self._terminal_streams.discard(stream)
            self._terminals[kid] -= 1
            if not self._terminals[kid]:
                del self._terminals[kid]

    # -- kernels of a cluster session reaching each other ---------------------------------------

    async def dial(
        self, kernel: Kernel, host: str, port: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """A connection to `port` of kernel `host` of `kernel`'s session (a peer proxy relays it through
        `kernel`'s socket; see apps.py): spliced to that kernel when it is on this agent, else relayed over a
        `peer-dialed` stream that the manager opens once it has connected a `peer-tunnel` stream on the target's
        agent (PeerDial).
        Returns when the connection is done, or at once when it cannot be made (the caller closes it)."""
        kid = kernel.spec.kernel_id
        if port not in CLUSTER_PORTS or self.kernels.get(kid) is not kernel:
            self._dial_log(kid)(logging.INFO, "kernel %s may not connect to %s:%d: refused", kid, host, port)
            return
        sid = kernel.spec.session_id
        for other in list(self.kernels.values()):
            spec = other.spec
            same_session = other is not kernel and spec.session_id == sid
            if same_session and kernel_name(spec.cluster_role, spec.cluster_idx) == host:
                await self.apps.splice_peer(kernel, other, port, reader, writer)
                return
        dial_id = secrets.token_hex(16)
        dialed: asyncio.Future[tuple[LinkStream, str, asyncio.Event]] = asyncio.get_running_loop().create_future()
        self._dials[dial_id] = dialed
        try:
            event = PeerDial(dial_id=dial_id, kernel_id=kid, host=host, port=port)
            await self.link.emit(event.name, event.to_wire())
            stream, error, done = await asyncio.wait_for(asyncio.shield(dialed), DIAL_TIMEOUT)
        except BaseException as e:
            if dialed.done() and not dialed.cancelled():  # it came just too late: nobody relays it
                late_stream, _, late_done = dialed.result()
                late_done.set()
                with contextlib.suppress(Exception):
                    await late_stream.close("the connection gave up waiting")
            dialed.cancel()
            if not isinstance(e, Exception):
                raise
            why = f"the manager did not connect it in {DIAL_TIMEOUT:g} s" if isinstance(e, TimeoutError) else str(e)
            self._dial_log(kid)(logging.INFO, "kernel %s could not reach %s:%d: %s", kid, host, port, why)
            return
        finally:
            self._dials.pop(dial_id, None)
        try:
            if error:
                self._dial_log(kid)(logging.INFO, "kernel %s could not reach %s:%d: %s", kid, host, port, error)
                await stream.close(error)
                return
            await relay(reader, writer, stream, kernel.exited)
        finally:
            done.set()

    def _dial_log(self, kid: str) -> LogThrottle:
        """The log of kernel `kid`'s dials (those of kernels that are gone are dropped here)."""
        throttle = self._dial_logs.get(kid)
        if throttle is None:
            for gone in [k for k in self._dial_logs if k not in self.kernels]:
                self._dial_logs.pop(gone).close()
            throttle = self._dial_logs[kid] = LogThrottle(log)
        return throttle

    async def _dialed(self, message: PeerDialed, stream: LinkStream) -> None:
        """The manager's `peer-dialed` stream: handed to the connection that waits for it (`dial`), and kept
        open until that connection is done with it. One nobody waits for (it gave up) is closed."""
        dialed = self._dials.pop(message.dial_id, None)
        if dialed is None or dialed.done():
            await stream.close("no connection waits for it (it gave up)")
            return
        done = asyncio.Event()
        dialed.set_result((stream, message.error, done))
        await done.wait()

    @property
    def _handlers(self) -> dict[type, Any]:
        return {
            Ping: self.ping,
            CreateKernel: self.create_kernel,
            DestroyKernel: self.destroy_kernel,
            Execute: self.execute,
            Interrupt: self.interrupt,
            UploadFiles: self.upload_files,
            ListFiles: self.list_files,
            DownloadFiles: self.download_files,
            RestartKernel: self.restart_kernel,
            CommitKernel: self.commit_kernel,
            ListImages: self.list_images,
            PullImage: self.pull_image,
            RemoveImage: self.remove_image,
            StartApp: self.start_app,
        }

    async def ping(self, _: Ping) -> Pong:
        return Pong(id=self.id, kernels=len(self.kernels))

    async def create_kernel(self, config: CreateKernel) -> KernelCreated:
        spec = KernelSpec(
            kernel_id=config.kernel_id,
            session_id=config.session_id,
            session_name=config.session_name,
            access_key=config.access_key,
            image=config.image,
            slots={k: Decimal(v) for k, v in config.slots.items()},
            environ=config.environ or {},
            cluster_role=config.cluster_role,
            cluster_idx=config.cluster_idx,
            network=config.network,
            mounts=[Mount(m.host_path, m.target, bool(m.read_only)) for m in config.mounts],
            dotfiles=[Dotfile(d.path, d.data, int(d.permission, 8)) for d in config.dotfiles],
            cluster=config.cluster,  # a kernel of a multi-container session (never a warm one: see warm_pool)
        )
        if registry_of(spec.image) and self.backend.manages_images and not await self.backend.has_image(spec.image):
            # only from a registry the manager allowed, with the credentials it sent for this pull
            grant = config.pull
            if grant is None or grant.registry != (registry_of(spec.image) or "").lower():
                raise KernelStartError(
                    f"cannot pull {spec.image}: the manager allowed no pull from {registry_of(spec.image)}"
                )
            await self._pull_for(spec, grant.auth)
        spec.gpus = self.gpu_alloc.allocate(spec.kernel_id, spec.slots)  # raises when they do not fit
        for mount in spec.mounts:  # a folder this agent cannot see would be an empty directory
            if not Path(mount.host_path).is_dir():
                raise KernelStartError(
                    f"this agent does not see the folder mounted at {mount.target} ({mount.host_path})"
                )
        kernel = await self._from_pool(spec)
        if kernel is None:
            self.pool.cold_starting += 1  # the pool's refill waits meanwhile
            try:
                kernel = await self.backend.create(spec, self._output_sink(spec.kernel_id))
            except KernelStartError:
                self.gpu_alloc.release(spec.kernel_id)
                raise
            except BaseException as e:
                self.gpu_alloc.release(spec.kernel_id)
                if not isinstance(e, Exception):
                    raise
                log.exception("creating kernel %s failed", spec.kernel_id)
                raise KernelStartError(f"{type(e).__name__}: {e}") from None
            finally:
                self.pool.cold_starting -= 1
                self.pool.wake()
        self.kernels[spec.kernel_id] = kernel
        self._watch_exit(kernel)
        return KernelCreated(
            kernel_id=spec.kernel_id,
            gpus=[[u, str(a)] for u, a in spec.gpus],
            container_id=kernel.container_id,
            pid=kernel.pid,
            query=kernel.channel.supports_query,
            service_ports=[sp.to_wire() for sp in offered(kernel)],  # (sshd too, where its runner offers one)
        )

    async def _from_pool(self, spec: KernelSpec) -> Kernel | None:
        """A warm kernel handed over to `spec`, or None (the session starts cold)."""
        # waiting for a warm kernel already starting beats starting another one cold
        kernel = await self.pool.take(spec, self.default_network, wait=POOL_WAIT)
        if kernel is None:
            return None
        try:
            await asyncio.shield(self.backend.hand_over(kernel, spec))
        except Exception as e:  # it may be half handed over: never back to the pool
            log.warning("kernel %s starts cold: %s", spec.kernel_id, e)
            self.background.spawn(self._discard(kernel), f"discard-{kernel.spec.kernel_id}")
            return None
        except asyncio.CancelledError:
            self.background.spawn(self._discard(kernel), f"discard-{kernel.spec.kernel_id}")
            raise
        log.debug("kernel %s is a warm kernel of %s", spec.kernel_id, spec.image)
        return kernel

    async def _discard(self, kernel: Kernel) -> None:
        with contextlib.suppress(Exception):
            await self.backend.destroy(kernel)

    async def _pull_for(self, spec: KernelSpec, auth: RegistryAuth | None = None) -> None:
        """Pull a kernel's image from its registry, telling the manager how far it got (at most 4 times a second)."""
        last = 0.0

        async def progress(done: int, total: int) -> None:
            nonlocal last
            now = time.monotonic()
            if now - last >= 0.25:
                last = now
                event = KernelPulling(spec.kernel_id, spec.session_id, spec.image, done, total)
                await self.link.emit(event.name, event.to_wire())

        await progress(0, 0)
        await self.backend.pull(spec.image, progress, auth=auth.to_wire() if auth else None)

    async def pull_image(self, call: PullImage) -> ImageInfo:
        pulled = await self.backend.pull(call.image, auth=call.auth.to_wire() if call.auth else None)
        self.pool.image_changed()  # warm kernels of the image's previous version are replaced
        return ImageInfo.from_wire(pulled)

    async def remove_image(self, call: RemoveImage) -> None:
        await self.pool.remove_image(call.image)  # its warm kernels first: Docker keeps an image in use
        try:
            await self.backend.remove_image(call.image)
        finally:
            self.pool.resume(call.image)

    async def start_app(self, call: StartApp) -> AppStarted:
        try:
            return AppStarted.from_wire(await self.apps.start(await self._settled(call.kernel_id), call.app))
        except AppError as e:
            return AppStarted(ok=False, started=False, error=str(e), output="")

    async def destroy_kernel(self, call: DestroyKernel) -> Destroyed:
        """Remove a kernel, answering whether the agent had it and its statistics just before it was killed."""
        kernel = self.kernels.pop(call.kernel_id, None)
        if kernel is None:
            return Destroyed(existed=False)
        stats = await self._final_sample(kernel)
        if await self.backend.kill(kernel):  # its processes are gone: the rest need not hold the session up
            self.removals.spawn(self._remove_killed(kernel), f"remove-{call.kernel_id}")
        else:
            await self.backend.destroy(kernel)
        self.gpu_alloc.release(call.kernel_id)
        if self.logs is not None:
            await self.logs.flush()
        return Destroyed(existed=True, stats=stats)

    async def _remove_killed(self, kernel: Kernel) -> None:
        """A killed kernel's container and scratch; an agent that stops meanwhile removes them at its next
        start (adoption removes containers that no longer run, and folders of kernels that are gone)."""
        try:
            await self.backend.destroy(kernel)
        except Exception as e:
            log.warning("could not remove kernel %s: %s; the agent's next start removes it", kernel.spec.kernel_id, e)

    def _kernel(self, kernel_id: str) -> Kernel:
        kernel = self.kernels.get(kernel_id) or self._ended.get(kernel_id)
        if kernel is None:
            raise ChannelError(f"kernel {kernel_id} is not running on agent {self.id}")
        return kernel

    async def _settled(self, kernel_id: str) -> Kernel:
        """The kernel, once its channel is decided (an adopted kernel's runner may still be reconnecting)."""
        kernel = self._kernel(kernel_id)
        if kernel.settled is not None and not kernel.settled.done():
            await asyncio.wait([kernel.settled])  # bounded by the backend's start timeout
        return kernel

    async def _oom_kills(self, kernel: Kernel) -> int | None:
        if kernel.container_id is None:
            return None
        try:
            return await self.backend.oom_kills(kernel)
        except Exception as e:  # (the container went away meanwhile): no OOM note for this run
            log.debug("cannot count the OOM kills of kernel %s: %s", kernel.spec.kernel_id, e)
            return None

    async def _say_if_oom(self, kernel: Kernel, result: RunResult) -> None:
        """A run that ended with SIGKILL while the OOM killer killed in its kernel (a command, a child of
        the runner: the kernel lives on) says so on its stderr."""
        kid = kernel.spec.kernel_id
        start = self._oom_at_start.get(kid)
        if start is None or start[0] != result.run_id or result.status != "finished":
            return
        del self._oom_at_start[kid]
        if result.exit_code != 137:
            return
        now = await self._oom_kills(kernel)
        if now is None or now <= start[1]:
            return
        limit = await self.backend.memory_limit(kernel)
        msg = oom_ending(limit or 0)["msg"].replace("the kernel ran", "a process of the run ran")
        result.console.append(["stderr", f"\n[{msg}]\n"])

    async def execute(self, call: Execute) -> RunResult:
        kernel = await self._settled(call.kernel_id)
        channel, run_id, mode, code = kernel.channel, call.run_id, call.mode, call.code
        if mode == "query" and not channel.supports_query:
            # an image without Python: the code is a shell command, as Backend.AI's non-Python runners take it
            mode = "batch"
        if mode in ("query", "batch"):
            steps = None
            if mode == "batch" and run_id not in channel.runs:
                try:
                    steps = batch.plan(code, call.options or {}, kernel.uploads, channel.supports_query)
                except batch.NoCommand as e:
                    channel.fail_run(run_id, f"bai: {e}")
                    return await channel.next_result(run_id, call.flush_timeout)
            if run_id not in channel.runs:
                count = await self._oom_kills(kernel)
                if count is not None:
                    self._oom_at_start[call.kernel_id] = (run_id, count)
            await channel.start_run(run_id, mode, code, steps)
        elif mode == "input":
            channel.check_running(run_id)
            await channel.send_input(code)
        elif mode == "input-eof":  # the client's input ended: input() raises EOFError
            channel.check_running(run_id)
            await channel.send_eof()
        elif mode != "continue":
            raise ChannelError(f"unknown execution mode {mode!r}")
        result = await channel.next_result(run_id, call.flush_timeout, after=call.after)
        await self._say_if_oom(kernel, result)
        return result

    async def interrupt(self, call: Interrupt) -> bool:
        """Interrupt `run_id` (a waiting one leaves the queue), else whatever runs now."""
        return await (await self._settled(call.kernel_id)).channel.interrupt_run(call.run_id)

    async def upload_files(self, call: UploadFiles) -> None:
        kernel = await self._settled(call.kernel_id)
        for path, data in call.files:
            await kernel.channel.put_file(path, data)
        # what a batch run that leaves the command to the kernel runs (agent/batch.py)
        kernel.uploads = [path for path, _ in call.files]

    async def list_files(self, call: ListFiles) -> FileListing:
        return FileListing.from_wire(await self.backend.list_files(self._kernel(call.kernel_id), call.path))

    async def list_images(self, _: ListImages) -> list[ImageInfo]:
        return [ImageInfo.from_wire(image) for image in await self.backend.images()]

    async def download_files(self, call: DownloadFiles) -> list[bytes]:
        """One tar archive per path (see agent/download.py), at most `max_bytes` of file data in all."""
        kernel = await self._settled(call.kernel_id)
        archives: list[bytes] = []
        left = max(0, int(call.max_bytes))
        for path in call.paths:
            try:
                full = kernel_path(path)
            except DownloadError as e:
                raise ChannelError(str(e)) from None
            archive = await self.backend.download(kernel, full, left)
            left = max(0, left - len(archive))
            archives.append(archive)
        return archives

    async def restart_kernel(self, call: RestartKernel) -> bool:
        """The kernel's code starts afresh (a new runner: a new Python namespace), in the same container with
        the same home; runs still going end. False when this agent does not have the kernel."""
        kernel = self.kernels.get(call.kernel_id)
        if kernel is None:
            return False
        await self._settled(call.kernel_id)
        self._oom_at_start.pop(call.kernel_id, None)
        await kernel.channel.restart(RESTART_TIMEOUT, kernel.exited)
        if self.logs is not None:
            await self.logs.flush()
        return True

    async def commit_kernel(self, call: CommitKernel) -> ImageInfo:
        return ImageInfo.from_wire(await self.backend.commit(await self._settled(call.kernel_id), call.image))
