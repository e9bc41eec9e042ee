"""The agent's statistics sampler: what each running kernel uses now, and what the host does.

One small interface per backend (`Sampler.sample(kernels) -> {kernel id: kernel sample}`) and one
`NodeSampler` for the host; the shapes are bai/common/stats.py's. Each sampler keeps, per kernel, the CPU
time it saw last so that `cpu_util` is the utilisation over the interval since then (a kernel's first
sample has no `cpu_util`: nothing to compare with), and the most memory it saw (`mem_peak` where the
backend keeps no high-water mark of its own).

- Docker (`DockerSampler`): the container's cgroup files read directly (cgroups.py: cgroup v2, or v1's
  controllers), all kernels in one thread hop per round, and the network from /proc/<pid>/net/dev of its
  first process (loopback excluded). Docker's own stats call takes about a second per container.
- Local (`LocalSampler`): psutil over the kernel's process group (no network: no net keys).
- Sim (`SimSampler`): synthetic figures from the session's environment, so that tests drive them:
  BAI_SIM_CPU_PCT (default 0), BAI_SIM_MEM_MIB (default 16), BAI_SIM_GPU_PCT (kernels with GPUs only).

A kernel whose figures cannot be read (its container went away mid-round) is left out of that round;
the others are not affected.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bai.node.agent import cgroups

if TYPE_CHECKING:
    from bai.node.agent.backends.base import Kernel
    from bai.node.agent.backends.docker import DockerBackend

log = logging.getLogger("bai.agent.stats")
MIN_UTIL_INTERVAL = 0.05  # seconds: over a shorter interval the last utilisation is repeated
STALE_AFTER = 300.0  # seconds: what a sampler remembers of a kernel it has not sampled since is dropped
Sample = dict[str, Any]


@dataclass
class Track:
    """What a sampler remembers of one kernel between rounds."""

    seen: float  # monotonic time of the CPU figure below
    cpu_ms: float  # CPU time then, milliseconds
    util: float | None = None  # the utilisation last reported
    peak: int = 0  # the most memory seen


class Sampler:
    """Samples kernels of one backend; this base samples nothing (a backend that cannot measure)."""

    def __init__(self) -> None:
        self.tracks: dict[str, Track] = {}

    async def sample(self, kernels: Sequence[Kernel]) -> dict[str, Sample]:
        """A kernel sample of each kernel that could be read, by kernel id."""
        return {}

    def forget(self, kernel_id: str) -> None:
        """The kernel ended: drop what is remembered of it."""
        self.tracks.pop(kernel_id, None)

    def prune(self, now: float | None = None) -> None:
        """Drop what is remembered of kernels not sampled for STALE_AFTER seconds."""
        now = time.monotonic() if now is None else now
        for kid in [k for k, t in self.tracks.items() if now - t.seen > STALE_AFTER]:
            del self.tracks[kid]

    def figures(self, kernel_id: str, now: float, cpu_ms: float, mem: int, peak: int | None = None) -> Sample:
        """The CPU and memory keys of a sample from raw figures: `cpu_util` over the interval since the
        last sample (absent on the first), `cpu_used`, `mem`, and `mem_peak` (the backend's high-water
        mark `peak` when it keeps one, never below the most seen)."""
        track = self.tracks.get(kernel_id)
        out: Sample = {"at": time.time(), "cpu_used": round(cpu_ms, 3), "mem": mem}
        if track is None:
            track = self.tracks[kernel_id] = Track(seen=now, cpu_ms=cpu_ms)
        else:
            cpu_ms = max(cpu_ms, track.cpu_ms)  # never backwards (a process of the group ended unreaped)
            out["cpu_used"] = round(cpu_ms, 3)
            elapsed = now - track.seen
            if elapsed >= MIN_UTIL_INTERVAL:
                track.util = round(max(0.0, (cpu_ms - track.cpu_ms) / (elapsed * 1000) * 100), 2)
                track.seen, track.cpu_ms = now, cpu_ms
            if track.util is not None:
                out["cpu_util"] = track.util
        track.peak = max(track.peak, mem, peak or 0)
        out["mem_peak"] = track.peak
        return out


# -- Docker ------------------------------------------------------------------------------------------


@dataclass
class Reading:
    """One container's raw figures, read in the sampler's thread."""

    kernel_id: str
    now: float
    usage: dict[str, int]
    net: tuple[int, int] | None


class DockerSampler(Sampler):
    """Containers' cgroup files and /proc/<pid>/net/dev, read in one thread hop per round.

    The backend's `host_pids(container ids)` gives each running container's first process as the host
    sees it (cached: Docker is asked once per container, never once per round)."""

    def __init__(self, backend: DockerBackend) -> None:
        super().__init__()
        self.backend = backend
        self._files: dict[str, cgroups.UsageFiles] = {}  # kernel id -> its container's usage files

    async def targets(self, kernels: Sequence[Kernel]) -> list[tuple[str, str, int]]:
        """(kernel id, container id, host pid) of the kernels whose container runs."""
        pids = await self.backend.host_pids([k.container_id for k in kernels if k.container_id])
        return [
            (k.spec.kernel_id, cid, pids[cid]) for k in kernels if (cid := k.container_id) is not None and cid in pids
        ]

    async def sample(self, kernels: Sequence[Kernel]) -> dict[str, Sample]:
        jobs = await self.targets(kernels)
        if not jobs:
            return {}
        readings = await asyncio.to_thread(self.read_all, jobs)
        return {r.kernel_id: self._sample_of(r) for r in readings}

    def read_all(self, jobs: list[tuple[str, str, int]]) -> list[Reading]:
        """Every container's figures (runs in a thread); one that cannot be read is left out."""
        out = []
        for kid, cid, pid in jobs:
            try:
                out.append(self._read_one(kid, cid, pid))
            except (OSError, ValueError) as e:  # gone mid-read (or never readable here)
                self._files.pop(kid, None)
                log.debug("cannot read the usage of kernel %s: %s", kid, e)
        return out

    def _read_one(self, kernel_id: str, container_id: str, pid: int) -> Reading:
        files = self._files.get(kernel_id)
        if files is None:
            files = cgroups.usage_files(cgroups.controller_dirs(pid, container_id))
            if files is None:
                raise OSError(f"no cgroup of container {container_id[:12]} found through process {pid}")
            self._files[kernel_id] = files
        # the network first: the container's cgroup still being there after it means that its first
        # process (the one whose namespace was read) still ran (its number was not reused meanwhile)
        net: tuple[int, int] | None = None
        try:
            net = cgroups.read_net(pid)
        except (OSError, ValueError):
            pass
        usage = cgroups.read_usage(files)
        return Reading(kernel_id, time.monotonic(), usage, net)

    def _sample_of(self, r: Reading) -> Sample:
        out = self.figures(r.kernel_id, r.now, r.usage["cpu_usec"] / 1000, r.usage["mem"], r.usage.get("peak"))
        if r.net is not None:
            out["net_rx"], out["net_tx"] = r.net
        out["io_read"], out["io_write"] = r.usage["io_read"], r.usage["io_write"]
        if "pids" in r.usage:
            out["pids"] = r.usage["pids"]
        return out

    def forget(self, kernel_id: str) -> None:
        super().forget(kernel_id)
        self._files.pop(kernel_id, None)

    def prune(self, now: float | None = None) -> None:
        super().prune(now)
        for kid in [k for k in self._files if k not in self.tracks]:
            del self._files[kid]


# -- local processes ---------------------------------------------------------------------------------


def process_groups() -> dict[int, list[int]]:
    """Process group id -> its processes, for every process of the host (one pass over /proc)."""
    groups: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            pid = int(name)
            try:
                groups.setdefault(os.getpgid(pid), []).append(pid)
            except OSError:  # ended meanwhile
                continue
    return groups


def group_usage(pids: list[int]) -> dict[str, float] | None:
    """The summed figures of a process group's processes (psutil); None when none of them could be read.
    CPU time counts the children they reaped, so that a finished command's time stays counted."""
    import psutil

    cpu = rss = read = write = threads = 0.0
    seen = False
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            with proc.oneshot():
                if proc.status() == psutil.STATUS_ZOMBIE:  # ended, not reaped yet: uses nothing
                    continue
                t = proc.cpu_times()
                cpu += t.user + t.system + t.children_user + t.children_system
                rss += proc.memory_info().rss
                threads += proc.num_threads()
                try:
                    io = proc.io_counters()
                    read += io.read_bytes
                    write += io.write_bytes
                except (psutil.AccessDenied, AttributeError):
                    pass
            seen = True
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    if not seen:
        return None
    return {"cpu_ms": cpu * 1000, "mem": rss, "io_read": read, "io_write": write, "pids": threads}


class LocalSampler(Sampler):
    """Local kernels: each is the process group its runner leads (`Kernel.pid`), read with psutil."""

    async def sample(self, kernels: Sequence[Kernel]) -> dict[str, Sample]:
        jobs = [(k.spec.kernel_id, k.pid) for k in kernels if k.pid]
        if not jobs:
            return {}
        raw = await asyncio.to_thread(self.read_all, jobs)
        out = {}
        for kid, (now, figures) in raw.items():
            sample = self.figures(kid, now, figures["cpu_ms"], int(figures["mem"]))
            sample.update(io_read=int(figures["io_read"]), io_write=int(figures["io_write"]))
            sample["pids"] = int(figures["pids"])
            out[kid] = sample
        return out

    def read_all(self, jobs: list[tuple[str, int]]) -> dict[str, tuple[float, dict[str, float]]]:
        """Kernel id -> (monotonic time, figures) of each group that has processes (runs in a thread)."""
        groups = process_groups()
        out = {}
        for kid, pgid in jobs:
            figures = group_usage(groups.get(pgid, []))
            if figures is not None:
                out[kid] = (time.monotonic(), figures)
        return out


# -- simulated kernels -------------------------------------------------------------------------------


def _number(env: dict[str, str], key: str, default: float) -> float:
    try:
        value = float(env.get(key, default))
    except ValueError:
        return default
    return value if value >= 0 else default


class SimSampler(Sampler):
    """Figures simulated kernels report, from their session's environment (see the module docstring):
    `cpu_used` accumulates at BAI_SIM_CPU_PCT, memory is BAI_SIM_MEM_MIB, GPUs are BAI_SIM_GPU_PCT busy."""

    def __init__(self) -> None:
        super().__init__()
        self._used: dict[str, float] = {}  # kernel id -> simulated CPU time so far (ms)

    async def sample(self, kernels: Sequence[Kernel]) -> dict[str, Sample]:
        now = time.monotonic()
        return {k.spec.kernel_id: self.sample_one(k, now) for k in kernels}

    def sample_one(self, kernel: Kernel, now: float) -> Sample:
        env, kid = kernel.spec.environ, kernel.spec.kernel_id
        pct = _number(env, "BAI_SIM_CPU_PCT", 0.0)
        track = self.tracks.get(kid)
        used = self._used.get(kid, 0.0)
        if track is not None:
            used += pct / 100 * max(0.0, now - track.seen) * 1000
        self._used[kid] = used
        sample = self.figures(kid, now, used, int(_number(env, "BAI_SIM_MEM_MIB", 16) * 2**20))
        sample["cpu_util"] = pct  # as simulated, from the first sample on
        sample.update(net_rx=0, net_tx=0, io_read=0, io_write=0, pids=1)
        if kernel.spec.gpus:
            gpu = _number(env, "BAI_SIM_GPU_PCT", 0.0)
            sample["gpus"] = {uuid: {"util": gpu, "mem": 0} for uuid, _ in kernel.spec.gpus}
        return sample

    def forget(self, kernel_id: str) -> None:
        super().forget(kernel_id)
        self._used.pop(kernel_id, None)

    def prune(self, now: float | None = None) -> None:
        super().prune(now)
        for kid in [k for k in self._used if k not in self.tracks]:
            del self._used[kid]


# -- the host ----------------------------------------------------------------------------------------


def gpu_usage(gpus: Any) -> dict[str, dict[str, Any]]:
    """Device uuid -> {"util", "mem", "mem_total"} of the devices that answered (agent.gpus.NVML's
    `sample()` and `gpus`); {} without GPUs."""
    if gpus is None or not gpus.gpus:
        return {}
    totals = {g.uuid: g.memory_total for g in gpus.gpus}
    out = {}
    for item in gpus.sample():
        if item.get("utilization") is None or item.get("memory_used") is None:
            continue
        out[item["uuid"]] = {
            "util": float(item["utilization"]),
            "mem": int(item["memory_used"]),
            "mem_total": int(totals.get(item["uuid"], 0)),
        }
    return out


def kernel_gpus(held: list[tuple[str, Any]], devices: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """A kernel's `gpus`: the utilisation and memory of the devices it holds (a device's own figures: a
    kernel holding a share of one reports the whole device)."""
    return {uuid: {"util": devices[uuid]["util"], "mem": devices[uuid]["mem"]} for uuid, _ in held if uuid in devices}


def _total(t: Any) -> float:
    """All of a core's time (guest time is already in user and nice)."""
    return float(sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0))  # (psutil is untyped)


def _idle(t: Any) -> float:
    return float(t.idle + getattr(t, "iowait", 0.0))


class HostSampler:
    """The host's CPU, memory and network figures (psutil), since the previous call. One per process,
    shared by the agents it runs (scale tests run hundreds): a call within `max_age` seconds of the
    previous one gets the same figures."""

    def __init__(self) -> None:
        import psutil

        self.psutil = psutil
        self._cpu_times = psutil.cpu_times(percpu=True)
        self._net = (time.monotonic(), *self._net_bytes())
        self._last: tuple[float, Sample] | None = None

    def _net_bytes(self) -> tuple[int, int]:
        rx = tx = 0
        for name, c in self.psutil.net_io_counters(pernic=True).items():
            if name != "lo":
                rx += c.bytes_recv
                tx += c.bytes_sent
        return rx, tx

    def _cpu_per_core(self) -> list[float]:
        """Percent busy per core since the last call."""
        now = self.psutil.cpu_times(percpu=True)
        out = []
        for before, after in zip(self._cpu_times, now, strict=False):
            total = _total(after) - _total(before)
            idle = _idle(after) - _idle(before)
            out.append(round(max(0.0, min(100.0, (total - idle) / total * 100)), 1) if total > 0 else 0.0)
        self._cpu_times = now
        return out

    def sample(self, max_age: float = 0.0) -> Sample:
        """at, cpu_util, cpu_count, cpu_per_core, mem, mem_total, net_rx, net_tx (bai/common/stats.py)."""
        now = time.monotonic()
        if self._last is not None and now - self._last[0] < max_age:
            return self._last[1]
        per_core = self._cpu_per_core()
        vm = self.psutil.virtual_memory()
        rx, tx = self._net_bytes()
        then, rx0, tx0 = self._net
        elapsed = max(now - then, 1e-6)
        self._net = (now, rx, tx)
        out: Sample = {
            "at": time.time(),
            "cpu_util": round(sum(per_core), 1),
            "cpu_count": len(per_core),
            "cpu_per_core": per_core,
            "mem": int(vm.total - vm.available),
            "mem_total": int(vm.total),
            "net_rx": int(max(0, rx - rx0) / elapsed),
            "net_tx": int(max(0, tx - tx0) / elapsed),
        }
        self._last = (now, out)
        return out


_host: HostSampler | None = None
HOST_REUSE = 0.5  # seconds within which agents of one process share the host's figures


def host_sampler() -> HostSampler:
    """The process's HostSampler."""
    global _host
    if _host is None:
        _host = HostSampler()
    return _host


class NodeSampler:
    """An agent's node sample: the host's figures (shared by the agents of a process) and its GPUs'."""

    def __init__(self, gpus: Any = None, reuse: float = HOST_REUSE) -> None:
        self.host = host_sampler()
        self.gpus = gpus
        self.reuse = min(reuse, HOST_REUSE)  # host figures this recent are shared, not sampled again

    def sample(self) -> Sample:
        out = dict(self.host.sample(self.reuse))
        devices = gpu_usage(self.gpus)
        if devices:
            out["gpus"] = devices
        return out


def sampler_for(backend: Any) -> Sampler:
    """The backend's sampler (`backend.sampler()`), or one that samples nothing."""
    make = getattr(backend, "sampler", None)
    return make() if callable(make) else Sampler()
