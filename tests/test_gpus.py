"""GPUs: NVML discovery through a fake `pynvml` (the module boundary), the agent's allocation map, the
Docker device requests, and a node whose agent has fake GPUs (scheduling, session info, agent info)."""

from __future__ import annotations

import importlib
import json
import os
import sys
from decimal import Decimal as D
from pathlib import Path

import pytest

from bai.node.agent.backends.base import KernelSpec, KernelStartError, gpu_env
from bai.node.agent.backends.docker import DockerBackend, gpus_from_labels
from bai.node.agent.gpu_alloc import GpuAllocator
from tests.nodeproc import ROOT, Node

FAKE = ROOT / "tests" / "fake_nvml"
DEVICES = [
    {"uuid": "GPU-aaaa-0000", "name": "Fake H200", "memory": 141 << 30, "util": 37, "used": 5 << 30},
    {"uuid": "GPU-bbbb-1111", "name": "Fake H200", "memory": 141 << 30, "util": 0, "used": 0},
]


@pytest.fixture
def fake_pynvml(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(FAKE))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    yield lambda devices: monkeypatch.setenv(
        "BAI_FAKE_NVML", devices if isinstance(devices, str) else json.dumps(devices)
    )
    sys.modules.pop("pynvml", None)


def nvml():
    from bai.node.agent import gpus

    importlib.reload(gpus)
    return gpus.NVML()


def test_discovery_and_live_samples(fake_pynvml) -> None:
    fake_pynvml(DEVICES)
    found = nvml()
    assert [(g.index, g.uuid, g.name, g.memory_total) for g in found.gpus] == [
        (0, "GPU-aaaa-0000", "Fake H200", 141 << 30),
        (1, "GPU-bbbb-1111", "Fake H200", 141 << 30),
    ]
    assert found.sample() == [
        {"uuid": "GPU-aaaa-0000", "utilization": 37, "memory_used": 5 << 30},
        {"uuid": "GPU-bbbb-1111", "utilization": 0, "memory_used": 0},
    ]


def test_no_driver_means_no_gpus_and_a_failing_device_does_not_stop_sampling(fake_pynvml) -> None:
    fake_pynvml("init-error")
    none = nvml()
    assert none.gpus == [] and "LibraryNotFound" in (none.error or "")
    fake_pynvml(DEVICES)
    found = nvml()
    fake_pynvml([DEVICES[0], {**DEVICES[1], "fail": True}])  # the second one stops answering
    samples = found.sample()
    assert samples[0]["utilization"] == 37
    assert samples[1]["utilization"] is None and "GPU is lost" in samples[1]["error"]


def test_the_allocation_map_packs_and_never_oversubscribes() -> None:
    alloc = GpuAllocator(["g0", "g1"])
    assert alloc.allocate("k1", {"cuda.shares": D("0.5")}) == [("g0", D("0.5"))]
    assert alloc.allocate("k2", {"cuda.shares": D("0.25")}) == [("g0", D("0.25"))]  # fill the used one
    assert alloc.allocate("k3", {"cuda.device": D(1)}) == [("g1", D(1))]
    with pytest.raises(KernelStartError, match="free per GPU: 0.25, 0"):
        alloc.allocate("k4", {"cuda.shares": D("0.5")})
    assert alloc.allocate("k5", {"cuda.shares": D("0.25")}) == [("g0", D("0.25"))]
    assert alloc.free() == [D(0), D(0)]
    alloc.release("k3")
    assert alloc.free() == [D(0), D(1)]
    # rebuilt after a restart from what containers hold (their labels)
    labels = {"bai.gpus": json.dumps([["g1", "0.5"]])}
    rebuilt = GpuAllocator(["g0", "g1"])
    rebuilt.adopt("old", gpus_from_labels(labels))
    assert rebuilt.free() == [D(1), D("0.5")]
    with pytest.raises(KernelStartError):
        rebuilt.allocate("big", {"cuda.device": D(2)})


def test_docker_containers_request_exactly_their_gpus(tmp_path: Path) -> None:
    backend = DockerBackend("agent-x", tmp_path, tmp_path / "runner.py", user="1000:1000")
    spec = KernelSpec(
        kernel_id="k1", session_id="s1", session_name="train", access_key="AK", image="img",
        slots={"cpu": D(1), "cuda.shares": D("0.5")}, environ={}, gpus=[("GPU-bbbb-1111", D("0.5"))],
    )  # fmt: skip
    config = backend._container_config(spec, tmp_path)
    assert config["HostConfig"]["DeviceRequests"] == [
        {"Driver": "nvidia", "DeviceIDs": ["GPU-bbbb-1111"], "Capabilities": [["gpu"]]}
    ]
    env = dict(e.split("=", 1) for e in config["Env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == "GPU-bbbb-1111" and env["BAI_CUDA_SHARE"] == "0.5"
    assert gpus_from_labels(config["Labels"]) == [("GPU-bbbb-1111", D("0.5"))]
    assert gpu_env([]) == {}
    assert gpu_env([("g", D(1))])["CUDA_VISIBLE_DEVICES"] == "g" and "BAI_CUDA_SHARE" not in gpu_env([("g", D(1))])


@pytest.fixture(scope="module")
def gpu_node(tmp_path_factory):
    node = Node(tmp_path_factory.mktemp("gpu"), "sim", agent_config='cpu = "16"\ngpu_shares = true\n')
    node.env["PYTHONPATH"] = os.pathsep.join([str(FAKE), node.env.get("PYTHONPATH", "")])
    node.env["BAI_FAKE_NVML"] = json.dumps(DEVICES)
    node.start()
    yield node
    node.stop()


def test_a_node_with_gpus_places_shares_and_explains_shortages(gpu_node: Node) -> None:
    node = gpu_node
    assert "gpus      0: Fake H200 (141 GiB), 1: Fake H200 (141 GiB)" in node.banner
    (agent,) = node.json("agent", "ls")
    assert agent["availableSlots"]["cuda.device"] == "2" and agent["availableSlots"]["cuda.shares"] == "2"
    for name in ("half-a", "half-b", "half-c"):
        node.cli("session", "create", "sim", "--name", name, "--gpu-share", "0.5", check=True)
    held = {n: node.json("session", "info", n)["kernels"][0]["devices"] for n in ("half-a", "half-b", "half-c")}
    assert held["half-a"] == held["half-b"] == [{"uuid": "GPU-aaaa-0000", "share": "0.5"}]  # packed
    assert held["half-c"] == [{"uuid": "GPU-bbbb-1111", "share": "0.5"}]
    assert "GPU       GPU-aaaa-0000 (share 0.5)" in node.cli("session", "info", "half-a").stdout
    # a whole GPU: no device is free, though 0.5 shares are
    node.cli("session", "create", "sim", "--name", "whole-one", "--gpu", "1", "--no-wait", check=True)
    import time

    deadline = time.monotonic() + 15
    while not (msg := node.json("session", "info", "whole-one")["statusData"].get("scheduler", {}).get("msg")):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert "GPUs can hold it" in msg and "free per GPU: 0, 0.5" in msg, msg
    node.cli("session", "destroy", "half-c", check=True)
    deadline = time.monotonic() + 15
    while node.json("session", "info", "whole-one")["status"] != "RUNNING":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert node.json("session", "info", "whole-one")["kernels"][0]["devices"] == [
        {"uuid": "GPU-bbbb-1111", "share": "1"}
    ]
    # the agent's GPUs with live use (from heartbeats) and what kernels hold
    deadline = time.monotonic() + 15
    while "held 1" not in (info := node.cli("agent", "info", agent["id"]).stdout):
        assert time.monotonic() < deadline, info
        time.sleep(0.2)
    assert "GPU 0  Fake H200  GPU-aaaa-0000" in info and "utilization 37 %" in info and "held 1" in info
    for name in ("half-a", "half-b", "whole-one"):
        node.cli("session", "destroy", name, check=True)


def test_concurrent_requests_never_oversubscribe_a_gpu(gpu_node: Node) -> None:

    names = [f"race-{i}" for i in range(6)]
    procs = [gpu_node.popen("session", "create", "sim", "--name", n, "--gpu-share", "0.5", "--no-wait") for n in names]
    for p in procs:
        p.communicate(timeout=60)
    import time

    deadline = time.monotonic() + 20
    while True:
        infos = [gpu_node.json("session", "info", n) for n in names]
        settled = [i for i in infos if i["status"] == "RUNNING" or i["statusData"].get("scheduler")]
        if len(settled) == len(names) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    running = [i for i in infos if i["status"] == "RUNNING"]
    assert len(running) == 4 and sum(i["status"] == "PENDING" for i in infos) == 2  # 2 GPUs × 2 halves
    held: dict[str, D] = {}
    for i in running:
        for d in i["kernels"][0]["devices"]:
            held[d["uuid"]] = held.get(d["uuid"], D(0)) + D(d["share"])
    assert held == {"GPU-aaaa-0000": D(1), "GPU-bbbb-1111": D(1)}
    for n in names:
        gpu_node.cli("session", "destroy", n)


async def test_the_dashboard_shows_each_gpu(gpu_node: Node) -> None:
    from bai.tui.app import Dashboard
    from tests.tui_support import node_client, until

    gpu_node.cli("session", "create", "sim", "--name", "dash-gpu", "--gpu-share", "0.5", check=True)
    app = Dashboard(node_client(gpu_node))
    async with app.run_test(size=(160, 40)) as pilot:
        await until(pilot, lambda: app.connected and app.model.agents, what="agents")
        await pilot.press("1")
        await until(
            pilot,
            lambda: any("37%·0.5" in str(c) for cells in app.agents_view.sync.cells.values() for c in cells),
            what="the GPU column",
        )
        # the session's detail names the GPU its kernel holds
        await pilot.press("2")
        app.sessions_view.filter = app.sessions_view.filter.parse("dash-gpu")
        app.sessions_view.refresh_view()
        await until(pilot, lambda: app.sessions_view.sync.keys, what="the session row")
        await pilot.press("d")
        await until(pilot, lambda: app.detail_view.detail is not None, what="the detail")
        from tests.tui_support import plain

        body = plain(app.detail_view.query_one("#detail-body"))
        assert "GPUS" in body and "GPU-aaaa-0000 ×0.5" in body
    gpu_node.cli("session", "destroy", "dash-gpu", check=True)
