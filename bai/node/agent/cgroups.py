"""A container's cgroups as the host sees them: which process belongs to it, its OOM kills, and its cpu and
memory limits written straight into its cgroup files.

Limits: what `docker update --cpus C --memory M --memory-swap M` does, with the values Docker computes (cpu:
period 100000 µs, quota C × 100000; memory M with no swap), in microseconds instead of a round trip through
a daemon that may be busy starting other containers. The warm pool's hand-over uses it, then has Docker
record the same limits in the background (so `docker inspect` agrees). Only cgroups whose path names the
container's id are touched; anything unexpected returns False and the caller asks Docker instead.
"""

from __future__ import annotations

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


def cgroup_dirs(pid: int, container_id: str, root: Path = ROOT) -> dict[str, Path] | None:
    """Controller -> the folder of process `pid`'s cgroup ("" for cgroup v2's unified one), or None when
    they cannot be read or do not belong to the container."""
    out: dict[str, Path] = {}
    for controllers, path in entries(pid) or []:
        if container_id not in path:
            continue
        if controllers == "" and (root / "cgroup.controllers").exists():  # v2 (not v1's hybrid "0::" line)
            out[""] = root / path.lstrip("/")
        for name in controllers.split(","):
            if name in ("cpu", "memory"):
                out[name] = root / name / path.lstrip("/")
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
