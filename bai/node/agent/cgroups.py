"""A container's cgroups as the host sees them: which process belongs to it, its OOM kills, and its cpu and
memory limits written straight into its cgroup files.

Limits: what `docker update --cpus C --memory M --memory-swap M` does, with the values Docker computes (cpu:
period 100000 µs, quota C × 100000; memory M with no swap), in microseconds instead of a round trip through
a daemon that may be busy starting other containers. The warm pool's hand-over uses it, then has Docker
record the same limits in the background (so `docker inspect` agrees). Only cgroups whose path names the
container's id are touched; anything unexpected returns False and the caller asks Docker instead.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

CPU_PERIOD = 100_000  # µs, as Docker sets it for NanoCpus
ROOT = Path("/sys/fs/cgroup")


def entries(pid: int) -> list[tuple[str, str]] | None:
    """(controllers, path) of each line of /proc/PID/cgroup ("" controllers: cgroup v2); None when unreadable."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    return [(parts[1], parts[2]) for parts in (line.split(":", 2) for line in lines) if len(parts) == 3]


def in_container(pid: int, container_id: str) -> bool:
    """Whether process `pid` is in the container's cgroup (its cgroup path names the container id: never a
    process that merely reused the number, nor one of another PID namespace's numbering)."""
    return any(container_id in path for _, path in entries(pid) or [])


def oom_kills(pid: int, root: Path = ROOT) -> int | None:
    """The `oom_kill` count of the memory cgroup process `pid` is in (cgroup v2 memory.events, or v1
    memory.oom_control on kernels that have it), as the host sees it; None when it cannot be read."""
    for controllers, path in entries(pid) or []:
        if controllers == "":
            where = root / path.lstrip("/") / "memory.events"
        elif "memory" in controllers.split(","):
            where = root / "memory" / path.lstrip("/") / "memory.oom_control"
        else:
            continue
        try:
            for entry in where.read_text().splitlines():
                key, _, value = entry.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            continue
    return None


def controller_dirs(pid: int, container_id: str, root: Path = ROOT) -> dict[str, Path]:
    """Every controller of process `pid`'s cgroups whose path names the container -> its folder ("" for
    cgroup v2's unified one; v1 controllers by name: cpu, cpuacct, memory, blkio, pids, ...); {} when
    /proc/PID/cgroup cannot be read."""
    out: dict[str, Path] = {}
    for controllers, path in entries(pid) or []:
        if container_id not in path:
            continue
        if controllers == "" and (root / "cgroup.controllers").exists():  # v2 (not v1's hybrid "0::" line)
            out[""] = root / path.lstrip("/")
        for name in controllers.split(","):
            if name and not name.startswith("name="):
                out[name] = root / name / path.lstrip("/")
    return out


def cgroup_dirs(pid: int, container_id: str, root: Path = ROOT) -> dict[str, Path] | None:
    """Controller -> the folder of process `pid`'s cgroup ("" for cgroup v2's unified one), or None when
    they cannot be read or do not belong to the container."""
    out = {k: v for k, v in controller_dirs(pid, container_id, root).items() if k in ("", "cpu", "memory")}
    if "" in out or ("cpu" in out and "memory" in out):
        return out
    return None


def writes(dirs: dict[str, Path], cpu: Decimal, mem: int, current_mem: int | None) -> list[tuple[Path, str]]:
    """The files to write, in order (cgroup v1 wants memory+swap >= memory at every step)."""
    quota = int(cpu * CPU_PERIOD)
    if "" in dirs:  # cgroup v2
        d = dirs[""]
        return [(d / "cpu.max", f"{quota} {CPU_PERIOD}"), (d / "memory.max", str(mem)), (d / "memory.swap.max", "0")]
    cpu_dir, mem_dir = dirs["cpu"], dirs["memory"]
    out = [(cpu_dir / "cpu.cfs_period_us", str(CPU_PERIOD)), (cpu_dir / "cpu.cfs_quota_us", str(quota))]
    memory = [(mem_dir / "memory.limit_in_bytes", str(mem))]
    if (mem_dir / "memory.memsw.limit_in_bytes").exists():
        swap = (mem_dir / "memory.memsw.limit_in_bytes", str(mem))
        raising = current_mem is None or mem >= current_mem
        memory = [swap, *memory] if raising else [*memory, swap]
    return out + memory


def apply(pid: int, container_id: str, cpu: Decimal, mem: int, current_mem: int | None) -> bool:
    """Set the limits of the container whose first process is `pid`; False (nothing or part written: the
    caller then has Docker set them all) when that cannot be done here."""
    dirs = cgroup_dirs(pid, container_id)
    if dirs is None:
        return False
    try:
        for path, value in writes(dirs, cpu, mem, current_mem):
            path.write_text(value)
    except OSError:
        return False
    return True


# -- live usage (the statistics sampler, agent/stats.py) ------------------------------------------------


@dataclass(frozen=True)
class UsageFiles:
    """The files a container's live usage is read from: its cgroup v2 folder's, or its v1 controllers'.
    Paths are plain strings (opened once a round each: no Path objects built per read)."""

    cpu: str  # v2 cpu.stat (usage_usec), v1 cpuacct.usage (nanoseconds)
    v2: bool
    mem: str  # memory.current | memory.usage_in_bytes
    mem_stat: str  # memory.stat, for the inactive file cache subtracted from `mem`
    peak: str | None  # memory.peak (v2, on kernels that have it; v1: the sampler tracks the most it saw)
    io: str | None  # io.stat | blkio.throttle.io_service_bytes_recursive (what `docker stats` reads)
    pids: str | None  # pids.current


def usage_files(dirs: dict[str, Path]) -> UsageFiles | None:
    """Where a container's usage is read, from `controller_dirs`; None without cpu and memory accounting."""
    if "" in dirs:
        d = dirs[""]
        peak = d / "memory.peak"
        return UsageFiles(
            cpu=str(d / "cpu.stat"),
            v2=True,
            mem=str(d / "memory.current"),
            mem_stat=str(d / "memory.stat"),
            peak=str(peak) if peak.exists() else None,
            io=str(d / "io.stat"),
            pids=str(d / "pids.current") if (d / "pids.current").exists() else None,
        )
    cpu, mem = dirs.get("cpuacct"), dirs.get("memory")
    if cpu is None or mem is None:
        return None
    blkio, pids = dirs.get("blkio"), dirs.get("pids")
    return UsageFiles(
        cpu=str(cpu / "cpuacct.usage"),
        v2=False,
        mem=str(mem / "memory.usage_in_bytes"),
        mem_stat=str(mem / "memory.stat"),
        peak=None,  # memory.max_usage_in_bytes counts the page cache too: not what `mem` counts
        io=str(blkio / "blkio.throttle.io_service_bytes_recursive") if blkio else None,
        pids=str(pids / "pids.current") if pids else None,
    )


def _read(path: str) -> bytes:
    """A small kernel file's content (os-level calls: about half the cost of `open()` here)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(fd, 65536)
        if len(data) == 65536:  # (never for cgroup files; a namespace with very many interfaces)
            chunks = [data]
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
            data = b"".join(chunks)
        return data
    finally:
        os.close(fd)


def _stat_value(data: bytes, key: bytes) -> int:
    """The value of `key` in a flat-keyed file (memory.stat, cpu.stat); 0 when absent."""
    prefix = key + b" "
    if data.startswith(prefix):
        start = 0
    else:
        at = data.find(b"\n" + prefix)
        if at == -1:
            return 0
        start = at + 1
    end = data.find(b"\n", start)
    return int(data[start + len(prefix) : end if end != -1 else None])


def _io_bytes(files: UsageFiles) -> tuple[int, int]:
    """Bytes read and written from block devices, summed over devices (0, 0 without block IO accounting)."""
    if files.io is None:
        return 0, 0
    try:
        data = _read(files.io)
    except OSError:
        return 0, 0
    read = write = 0
    if files.v2:  # "8:0 rbytes=N wbytes=N rios=N ..."
        for token in data.split():
            if token.startswith(b"rbytes="):
                read += int(token[7:])
            elif token.startswith(b"wbytes="):
                write += int(token[7:])
        return read, write
    for line in data.splitlines():  # "8:0 Read N", "8:0 Write N", ..., "Total N"
        parts = line.split()
        if len(parts) == 3:
            if parts[1] == b"Read":
                read += int(parts[2])
            elif parts[1] == b"Write":
                write += int(parts[2])
    return read, write


def read_usage(files: UsageFiles) -> dict[str, int]:
    """A container's usage now: cpu_usec (CPU time since it started), mem (bytes in use less the inactive
    file cache, as `docker stats` counts it), peak (the cgroup's own high-water mark, when it keeps one),
    io_read / io_write (bytes), pids (tasks). OSError when the cgroup is gone (the container ended)."""
    out: dict[str, int] = {}
    cpu = _read(files.cpu)
    out["cpu_usec"] = _stat_value(cpu, b"usage_usec") if files.v2 else int(cpu) // 1000
    current = int(_read(files.mem))
    inactive = _stat_value(_read(files.mem_stat), b"inactive_file" if files.v2 else b"total_inactive_file")
    out["mem"] = max(0, current - inactive)
    if files.peak is not None:
        try:
            out["peak"] = int(_read(files.peak))
        except OSError:
            pass
    out["io_read"], out["io_write"] = _io_bytes(files)
    if files.pids is not None:
        out["pids"] = int(_read(files.pids))
    return out


def read_net(pid: int) -> tuple[int, int]:
    """Bytes received and sent by the network namespace process `pid` is in, over its interfaces but
    the loopback (/proc/PID/net/dev); OSError when the process is gone."""
    rx = tx = 0
    for line in _read(f"/proc/{pid}/net/dev").splitlines()[2:]:
        name, _, figures = line.partition(b":")
        if name.strip() == b"lo":
            continue
        fields = figures.split()
        if len(fields) >= 9:
            rx += int(fields[0])
            tx += int(fields[8])
    return rx, tx
