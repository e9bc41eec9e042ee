"""The agent's statistics: a KernelStats event every `stat_interval` (kernels and host), the final sample in
`destroy_kernel`'s answer and in `KernelTerminated`, the figures of held GPUs, and a loop that outlives a
failing round. Simulated kernels (their figures follow BAI_SIM_*) over the in-process link."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from decimal import Decimal
from typing import Any

import pytest

from bai.common.gpus import DEVICE
from bai.node.agent.agent import Agent
from bai.node.agent.backends.sim import SimBackend
from bai.node.agent.stats import Sampler
from bai.node.link.inproc import InprocHub
from bai.node.link.messages import CreateKernel, Destroyed, DestroyKernel, KernelStats, call
from tests.harness import FakeGPUs

MiB = 1024 * 1024
INTERVAL = 0.1
NODE_KEYS = {"at", "cpu_util", "cpu_count", "cpu_per_core", "mem", "mem_total", "net_rx", "net_tx"}
SIM_ENV = {"BAI_SIM_CPU_PCT": "50", "BAI_SIM_MEM_MIB": "32"}


class Manager:
    """The manager's end of the link, recording events with the time they arrived."""

    def __init__(self) -> None:
        self.events: list[tuple[float, str, dict[str, Any]]] = []

    async def agent_joined(self, agent_id: str, registration: dict[str, Any]) -> dict[str, Any]:
        return {"destroy": []}

    async def agent_event(self, agent_id: str, name: str, payload: dict[str, Any]) -> None:
        self.events.append((time.monotonic(), name, payload))

    async def agent_left(self, agent_id: str, reason: str) -> None:
        pass

    def stats(self) -> list[KernelStats]:
        return [KernelStats.from_wire(p) for _, name, p in self.events if name == KernelStats.name]

    async def until(self, check: Callable[[], Any], timeout: float = 5.0) -> Any:
        deadline = time.monotonic() + timeout
        while not (found := check()):
            assert time.monotonic() < deadline, "timed out"
            await asyncio.sleep(0.01)
        return found


class Cluster:
    """A hub, a recording manager and one agent with the sim backend."""

    def __init__(self, agent: Agent, hub: InprocHub, manager: Manager) -> None:
        self.agent, self.hub, self.manager = agent, hub, manager

    async def create(self, kid: str, environ: dict[str, str] | None = None, **slots: str) -> None:
        create = CreateKernel(kid, f"s-{kid}", kid, "AK", "python", {"cpu": "1", **slots}, environ or {})
        await call(self.hub.manager, self.agent.id, create)

    async def destroy(self, kid: str) -> Destroyed:
        return await call(self.hub.manager, self.agent.id, DestroyKernel(kid))


@pytest.fixture
async def make_cluster() -> AsyncIterator[Callable[..., Any]]:
    started: list[Cluster] = []

    async def make(backend: SimBackend | None = None, gpus: int = 0, interval: float = INTERVAL) -> Cluster:
        hub, manager = InprocHub(), Manager()
        await hub.manager.start(manager)
        slots = {"cpu": Decimal(8), "mem": Decimal(2**34)}
        fake = FakeGPUs("a1", gpus) if gpus else None
        if gpus:
            slots[DEVICE] = Decimal(gpus)
        backend = backend or SimBackend(start_delay=0)
        agent = Agent("a1", backend, hub.agent_link("a1"), slots, gpus=fake, stat_interval=interval)  # type: ignore[arg-type]
        await agent.start()
        started.append(Cluster(agent, hub, manager))
        return started[-1]

    yield make
    for c in started:
        await c.agent.stop()
        await c.hub.manager.close()


async def test_the_agent_sends_kernel_stats_every_interval(make_cluster) -> None:
    c = await make_cluster()
    await c.manager.until(lambda: c.manager.stats())  # the host's sample, before any kernel
    first = c.manager.stats()[0]
    assert first.samples == {} and NODE_KEYS <= set(first.node)
    await c.create("k1", SIM_ENV)
    begun = time.monotonic()
    await c.manager.until(lambda: len([s for s in c.manager.stats() if "k1" in s.samples]) >= 5)
    took = time.monotonic() - begun
    assert 4 * INTERVAL * 0.8 <= took <= 10 * INTERVAL + 1.0  # about one event per interval
    times = [t for t, name, _ in c.manager.events if name == KernelStats.name]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert min(gaps) >= INTERVAL * 0.5, gaps  # a steady beat, not a burst
    latest = [s for s in c.manager.stats() if "k1" in s.samples][-1]
    sample = latest.samples["k1"]
    assert sample["cpu_util"] == 50 and sample["mem"] == 32 * MiB and sample["cpu_used"] > 0
    assert NODE_KEYS <= set(latest.node) and latest.node["cpu_count"] >= 1


async def test_destroy_answers_the_kernels_final_stats(make_cluster) -> None:
    c = await make_cluster()
    await c.create("k1", SIM_ENV)
    await c.manager.until(lambda: len([s for s in c.manager.stats() if "k1" in s.samples]) >= 3)
    last = [s for s in c.manager.stats() if "k1" in s.samples][-1].samples["k1"]
    answer = await c.destroy("k1")
    assert answer.existed is True and answer.stats is not None
    assert answer.stats["cpu_used"] >= last["cpu_used"] > 0  # sampled just before the kill
    assert answer.stats["mem"] == 32 * MiB and answer.stats["at"] >= last["at"]
    assert await c.destroy("k1") == Destroyed(existed=False, stats=None)
    count = len(c.manager.stats())
    await c.manager.until(lambda: len(c.manager.stats()) >= count + 2)
    assert "k1" not in c.manager.stats()[-1].samples  # no longer sampled


async def test_a_kernel_that_ends_by_itself_reports_its_last_stats(make_cluster) -> None:
    c = await make_cluster()
    await c.create("k1", {**SIM_ENV, "BAI_SIM_MEM_MIB": "48"})
    await c.manager.until(lambda: any("k1" in s.samples for s in c.manager.stats()))
    c.agent.kernels["k1"].set_exit(3)
    ended = await c.manager.until(lambda: [p for _, name, p in c.manager.events if name == "kernel_terminated"])
    assert ended[0]["exit_code"] == 3
    assert ended[0]["stats"]["mem"] == 48 * MiB and ended[0]["stats"]["cpu_util"] == 50


class Gone(Sampler):
    """A sampler whose kernels can no longer be read (their cgroups are gone)."""

    async def sample(self, kernels):
        return {}


async def test_a_kernel_whose_figures_are_gone_reports_its_last_periodic_sample(make_cluster) -> None:
    c = await make_cluster()
    await c.create("k1", SIM_ENV)
    await c.manager.until(lambda: len([s for s in c.manager.stats() if "k1" in s.samples]) >= 2)
    c.agent.sampler = Gone()  # the container and its cgroup went away with it
    latest = c.agent._last_samples["k1"]
    c.agent.kernels["k1"].set_exit(137)
    ended = await c.manager.until(lambda: [p for _, name, p in c.manager.events if name == "kernel_terminated"])
    assert ended[0]["stats"] == latest


class FailsTwice(Sampler):
    """A sampler whose first two rounds fail outright."""

    def __init__(self, inner: Sampler) -> None:
        super().__init__()
        self.inner, self.calls = inner, 0

    async def sample(self, kernels):
        self.calls += 1
        if self.calls <= 2:
            raise RuntimeError("boom")
        return await self.inner.sample(kernels)


async def test_a_failing_round_does_not_stop_the_loop_and_the_host_is_still_sent(make_cluster) -> None:
    c = await make_cluster()
    c.agent.sampler = FailsTwice(c.agent.sampler)
    await c.create("k1", SIM_ENV)
    await c.manager.until(lambda: any("k1" in s.samples for s in c.manager.stats()))
    assert c.agent.sampler.calls >= 3
    failed = [s for s in c.manager.stats() if not s.samples]
    assert failed and all(NODE_KEYS <= set(s.node) for s in failed)  # the failed rounds still sent the host


class NoGpuFigures(Sampler):
    """Kernels' figures without their GPUs' (as Docker and local kernels report them)."""

    async def sample(self, kernels):
        return {k.spec.kernel_id: {"at": time.time(), "mem": 1} for k in kernels}


class PlainSim(SimBackend):
    def sampler(self) -> Sampler:
        return NoGpuFigures()


async def test_a_kernel_holding_gpus_reports_its_devices_figures(make_cluster) -> None:
    c = await make_cluster(PlainSim(start_delay=0), gpus=2)
    await c.create("k1", {}, **{DEVICE: "1"})
    held = [u for u, _ in c.agent.kernels["k1"].spec.gpus]
    assert len(held) == 1
    stats = await c.manager.until(lambda: [s for s in c.manager.stats() if "k1" in s.samples])
    assert stats[-1].samples["k1"]["gpus"] == {held[0]: {"util": 0.0, "mem": 0}}
    assert set(stats[-1].node["gpus"]) == {"GPU-a1-0", "GPU-a1-1"}
    assert stats[-1].node["gpus"]["GPU-a1-0"]["mem_total"] == 16 << 30
