"""The statistics samplers (bai/node/agent/stats.py): real Docker containers' cgroup figures, a local
process group's, the simulated backend's from its environment, cgroup v2 files in a fake tree, the host's
sample with fake NVML devices, and the validation of `[agent] stat_interval`."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bai.common.config import ConfigError, check
from bai.node.agent import cgroups
from bai.node.agent.backends.base import KernelSpec
from bai.node.agent.stats import (
    DockerSampler,
    LocalSampler,
    NodeSampler,
    SimSampler,
    gpu_usage,
    kernel_gpus,
)
from tests.nodeproc import PYTHON_IMAGE, ROOT, ensure_image, require_docker

MiB = 1024 * 1024
BURN = ["python3", "-c", "while True: pass"]
HOLD = [
    "python3",
    "-c",
    "import time; x = bytearray(200 * 1024 * 1024); x[::4096] = b'x' * len(x[::4096]); time.sleep(600)",
]
IDLE = ["sleep", "600"]
KEYS = {"at", "cpu_used", "mem", "mem_peak", "io_read", "io_write", "pids"}


def cpu_ms(pids: list[int]) -> float:
    """User + system CPU of the processes and of the children they reaped (/proc/PID/stat), ms."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(f) for f in fields[11:15])
    return total / os.sysconf("SC_CLK_TCK") * 1000


class OwnMeter:
    """The processes' utilisation between calls, from their own CPU time (the check on the sampler's)."""

    def __init__(self, pids: Callable[[], list[int]]) -> None:
        self.pids = pids
        self.mark = (time.monotonic(), cpu_ms(pids()))

    def util(self) -> float:
        now = (time.monotonic(), cpu_ms(self.pids()))
        (t0, c0), self.mark = self.mark, now
        return (now[1] - c0) / ((now[0] - t0) * 1000) * 100


def assert_busy(util: float, own: float) -> None:
    """A CPU burner shows at least half a core; on a machine too busy to give it that much (other tests
    running), the sampler's figure must at least agree with the burner's own CPU time."""
    assert util >= 50 or (own < 50 and abs(util - own) <= 15), f"sampled {util} %, the process's own {own:.1f} %"


def kernel(kid: str, container_id: str | None = None, pid: int | None = None, **spec: Any) -> SimpleNamespace:
    """What a sampler reads of a Kernel: its spec, container id and process."""
    full = KernelSpec(kid, f"s-{kid}", kid, "AK", "python", {}, spec.pop("environ", {}), **spec)
    return SimpleNamespace(spec=full, container_id=container_id, pid=pid)


# -- Docker ------------------------------------------------------------------------------------------


@pytest.fixture
async def docker_backend(tmp_path: Path) -> AsyncIterator[Any]:
    """A started DockerBackend (its cached pid lookup is what the sampler uses); the test's containers
    carry a label of their own and are removed at the end."""
    require_docker()
    ensure_image("python", PYTHON_IMAGE)
    from bai.node.agent.backends.docker import DockerBackend

    backend = DockerBackend("stats-test", tmp_path / "kernels", tmp_path / "runner.py")
    await backend.start()
    assert backend.docker is not None
    backend.test_label = f"stats-{os.getpid()}-{tmp_path.name}"
    try:
        yield backend
    finally:
        for c in await backend.docker.containers.list(all=True, filters={"label": [f"bai.test={backend.test_label}"]}):
            await c.delete(force=True)
        await backend.docker.close()


async def run_container(backend: Any, command: list[str]) -> str:
    config = {
        "Image": PYTHON_IMAGE,
        "Cmd": command,
        "Labels": {"bai.test": backend.test_label},
        "HostConfig": {"NetworkMode": "none"},
    }
    container = await backend.docker.containers.create(config)
    await container.start()
    return container.id


@pytest.mark.docker
async def test_docker_kernels_show_cpu_memory_processes_and_a_vanished_one_is_left_out(docker_backend) -> None:
    burner, holder, idle = [await run_container(docker_backend, c) for c in (BURN, HOLD, IDLE)]
    kernels = [kernel("burn", burner), kernel("hold", holder), kernel("idle", idle)]
    sampler = DockerSampler(docker_backend)
    burner_pid = (await docker_backend.host_pids([burner]))[burner]
    first = await sampler.sample(kernels)
    own = OwnMeter(lambda: [burner_pid])
    assert set(first) == {"burn", "hold", "idle"}
    assert "cpu_util" not in first["burn"]  # nothing to compare with yet
    held: dict[str, Any] = {}
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # the holder may still be touching its pages
        await asyncio.sleep(1.0)
        second = await sampler.sample(kernels)
        burner_own = own.util()
        held = second["hold"]
        if held["mem"] >= 200 * MiB and second["burn"]["cpu_util"] >= 50:
            break
    burn = second["burn"]
    assert_busy(burn["cpu_util"], burner_own)
    assert burn["cpu_util"] <= 200  # at most the machine's two cores
    assert burn["cpu_used"] > first["burn"]["cpu_used"]
    assert held["mem"] >= 200 * MiB, held
    assert held["mem_peak"] >= held["mem"]
    for sample in second.values():
        assert KEYS <= set(sample), sample
        assert sample["pids"] >= 1
        assert sample["net_rx"] == 0 and sample["net_tx"] == 0  # --network none: the loopback only
    assert second["idle"]["cpu_util"] < 10
    # one container goes away between rounds: the others are still sampled, the round does not fail
    await docker_backend.docker.containers.container(idle).delete(force=True)
    third = await sampler.sample(kernels)
    assert set(third) == {"burn", "hold"}
    assert third["burn"]["cpu_util"] > 0 and third["burn"]["cpu_used"] > burn["cpu_used"]


@pytest.mark.docker
async def test_a_container_gone_between_the_pid_lookup_and_the_read_does_not_break_the_round(docker_backend) -> None:
    alive, doomed = [await run_container(docker_backend, IDLE) for _ in range(2)]
    kernels = [kernel("alive", alive), kernel("doomed", doomed)]
    sampler = DockerSampler(docker_backend)
    jobs = await sampler.targets(kernels)  # both pids known
    await docker_backend.docker.containers.container(doomed).delete(force=True)
    readings = await asyncio.to_thread(sampler.read_all, jobs)
    assert [r.kernel_id for r in readings] == ["alive"]
    assert set(await sampler.sample([*kernels, kernel("never", None)])) == {"alive"}


# -- cgroup v2 files (a fake tree: this machine may be on v1) --------------------------------------------


def test_cgroup_v2_files_are_read_as_docker_stats_counts_them(tmp_path: Path) -> None:
    d = tmp_path / "docker" / "abc"
    d.mkdir(parents=True)
    (d / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n")
    (d / "memory.current").write_text(f"{300 * MiB}\n")
    (d / "memory.stat").write_text(f"anon {200 * MiB}\nfile {100 * MiB}\ninactive_file {60 * MiB}\n")
    (d / "memory.peak").write_text(f"{400 * MiB}\n")
    (d / "io.stat").write_text("8:0 rbytes=1000 wbytes=2000 rios=1 wios=2\n8:16 rbytes=10 wbytes=20 rios=1 wios=1\n")
    (d / "pids.current").write_text("7\n")
    files = cgroups.usage_files({"": d})
    assert files is not None and files.v2
    usage = cgroups.read_usage(files)
    assert usage == {
        "cpu_usec": 2_500_000,
        "mem": 240 * MiB,
        "peak": 400 * MiB,
        "io_read": 1010,
        "io_write": 2020,
        "pids": 7,
    }
    (d / "memory.peak").unlink()  # older kernels: the sampler tracks the most it saw
    files = cgroups.usage_files({"": d})
    assert files is not None and files.peak is None and "peak" not in cgroups.read_usage(files)


def test_cgroup_v1_files_and_the_controllers_of_a_process(tmp_path: Path) -> None:
    cid = "f00d" * 16
    for name, content in (
        ("cpuacct/cpuacct.usage", "1500000000\n"),
        ("memory/memory.usage_in_bytes", f"{50 * MiB}\n"),
        ("memory/memory.stat", f"cache {10 * MiB}\ninactive_file 1\ntotal_inactive_file {8 * MiB}\n"),
        (
            "blkio/blkio.throttle.io_service_bytes_recursive",
            "8:0 Read 4096\n8:0 Write 8192\n8:0 Total 12288\nTotal 12288\n",
        ),
        ("pids/pids.current", "3\n"),
    ):
        controller, file = name.split("/")
        folder = tmp_path / controller / "docker" / cid
        folder.mkdir(parents=True, exist_ok=True)
        (folder / file).write_text(content)
    dirs = {c: tmp_path / c / "docker" / cid for c in ("cpuacct", "memory", "blkio", "pids")}
    files = cgroups.usage_files(dirs)
    assert files is not None and not files.v2
    assert cgroups.read_usage(files) == {
        "cpu_usec": 1_500_000,
        "mem": 42 * MiB,
        "io_read": 4096,
        "io_write": 8192,
        "pids": 3,
    }
    assert cgroups.usage_files({"memory": dirs["memory"]}) is None  # no CPU accounting: nothing to read
    # this process's own controllers, as /proc/self/cgroup names them (it is in no container)
    assert cgroups.controller_dirs(os.getpid(), "no-such-container") == {}


def test_the_network_of_a_process_leaves_out_the_loopback() -> None:
    rx, tx = cgroups.read_net(os.getpid())
    text = Path("/proc/self/net/dev").read_text().splitlines()[2:]
    others = [line.split(":", 1) for line in text if line.split(":", 1)[0].strip() != "lo"]
    assert rx >= 0 and tx >= 0
    if not others:
        assert (rx, tx) == (0, 0)
    with pytest.raises(OSError):
        cgroups.read_net(2**22 + 12345)  # no such process


# -- local process groups ----------------------------------------------------------------------------


LOCAL_KERNEL = """
import os, time
if os.fork() == 0:
    while True: pass
x = bytearray(64 * 1024 * 1024)
time.sleep(60)
"""


def group_of(pgid: int) -> list[int]:
    """The processes of a process group."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.getpgid(int(name)) == pgid:
                    out.append(int(name))
            except OSError:
                continue
    return out


async def test_a_local_kernel_is_its_process_group() -> None:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", LOCAL_KERNEL, start_new_session=True)
    sampler = LocalSampler()
    k = kernel("local", pid=proc.pid)
    try:
        await sampler.sample([k])
        own = OwnMeter(lambda: group_of(proc.pid))
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:  # (a busy machine: the burner may get less than a core at first)
            await asyncio.sleep(1.0)
            sample = (await sampler.sample([k]))["local"]
            group_own = own.util()
            if sample["cpu_util"] >= 50 and sample["mem"] >= 64 * MiB:
                break
        assert_busy(sample["cpu_util"], group_own)  # the forked child burns: the group counts it
        assert sample["mem"] >= 64 * MiB and sample["mem_peak"] >= sample["mem"]
        assert sample["pids"] >= 2 and sample["io_read"] >= 0 and sample["io_write"] >= 0
        assert "net_rx" not in sample and "net_tx" not in sample  # local kernels have no network of their own
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
    await asyncio.sleep(0.1)
    assert await sampler.sample([k]) == {}  # the group is gone: left out


# -- the simulated backend ---------------------------------------------------------------------------


async def test_sim_figures_follow_the_session_environment() -> None:
    sampler = SimSampler()
    busy = kernel(
        "busy",
        environ={"BAI_SIM_CPU_PCT": "150", "BAI_SIM_MEM_MIB": "64", "BAI_SIM_GPU_PCT": "40"},
        gpus=[("GPU-1", Decimal(1))],
    )
    plain = kernel("plain", environ={"BAI_SIM_GPU_PCT": "40"})  # no GPUs: no gpus key
    first = await sampler.sample([busy, plain])
    assert first["busy"]["cpu_util"] == 150 and first["busy"]["mem"] == 64 * MiB
    assert first["busy"]["gpus"] == {"GPU-1": {"util": 40.0, "mem": 0}}
    assert first["plain"]["cpu_util"] == 0.0 and first["plain"]["mem"] == 16 * MiB and "gpus" not in first["plain"]
    await asyncio.sleep(0.2)
    second = await sampler.sample([busy, plain])
    assert 200 <= second["busy"]["cpu_used"] <= 600  # 1.5 cores over about 0.2 s: about 300 ms
    assert second["plain"]["cpu_used"] == 0
    busy.spec.environ["BAI_SIM_MEM_MIB"] = "8"  # less now: the peak stays
    third = await sampler.sample([busy])
    assert third["busy"]["mem"] == 8 * MiB and third["busy"]["mem_peak"] == 64 * MiB
    assert third["busy"]["cpu_used"] >= second["busy"]["cpu_used"]
    bad = kernel("bad", environ={"BAI_SIM_CPU_PCT": "lots", "BAI_SIM_MEM_MIB": "-5"})
    assert (await sampler.sample([bad]))["bad"]["cpu_util"] == 0.0  # unreadable: the defaults
    sampler.forget("busy")
    assert "busy" not in sampler.tracks


# -- the host ----------------------------------------------------------------------------------------

DEVICES = [
    {"uuid": "GPU-aaaa-0000", "name": "Fake H200", "memory": 141 << 30, "util": 37, "used": 5 << 30},
    {"uuid": "GPU-bbbb-1111", "name": "Fake H200", "memory": 141 << 30, "util": 0, "used": 0},
]


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch):
    """Two fake devices found through NVML (the module boundary); the second then stops answering."""
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "fake_nvml"))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    monkeypatch.setenv("BAI_FAKE_NVML", json.dumps(DEVICES))
    from bai.node.agent import gpus

    importlib.reload(gpus)
    found = gpus.NVML()
    monkeypatch.setenv("BAI_FAKE_NVML", json.dumps([DEVICES[0], {**DEVICES[1], "fail": True}]))
    yield found
    sys.modules.pop("pynvml", None)
    importlib.reload(gpus)


def test_the_node_sample_has_cpu_memory_network_and_the_gpus_that_answer(fake_nvml) -> None:
    node = NodeSampler(fake_nvml)
    node.host._last = None
    sample = node.sample()
    assert sample["cpu_count"] == len(sample["cpu_per_core"]) == os.cpu_count()
    assert 0 <= sample["cpu_util"] <= 100 * sample["cpu_count"]
    assert 0 < sample["mem"] <= sample["mem_total"]
    assert sample["net_rx"] >= 0 and sample["net_tx"] >= 0
    # the second device stops answering: only the first is reported
    assert sample["gpus"] == {"GPU-aaaa-0000": {"util": 37.0, "mem": 5 << 30, "mem_total": 141 << 30}}
    assert gpu_usage(None) == {} and "gpus" not in NodeSampler(None).sample()
    held = [("GPU-aaaa-0000", Decimal("0.5")), ("GPU-gone", Decimal(1))]
    assert kernel_gpus(held, sample["gpus"]) == {"GPU-aaaa-0000": {"util": 37.0, "mem": 5 << 30}}


# -- configuration -----------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -1, 0.0, 3600.5, 10_000, "2", True])
def test_a_bad_stat_interval_is_refused_with_the_key_and_what_was_expected(value: Any) -> None:
    with pytest.raises(ConfigError) as e:
        check({"agent": {"stat_interval": value}}, Path("bai.toml"))
    assert "bai.toml: [agent] stat_interval: expected a number" in str(e.value)


@pytest.mark.parametrize("value", [0.1, 2, 2.0, 3600])
def test_a_good_stat_interval_is_accepted(value: Any) -> None:
    check({"agent": {"stat_interval": value}}, Path("bai.toml"))
