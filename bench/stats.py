"""What the agent's statistics sampling costs: CPU per round for N idle Docker kernels, as a share of one core.

Starts N (default 50) idle containers of the kernel image (`sleep`, `--network none`, labelled
bai.bench=1; removed at the end), then measures what one agent round costs (bai/node/agent/stats.py:
the host's sample, every container's cgroup files and /proc/<pid>/net/dev read in one thread hop, the
KernelStats event encoded as the link sends it) as CPU time of this process (`time.process_time`: every
thread), over --rounds rounds. The figure is that CPU per round as a percentage of one core at the
default stat_interval of 2 s. Also printed: the same reads done inline (no thread hop), and a "nothing"
round (the empty event, no kernel read).

Baseline, measured in the same run: `docker stats --no-stream` for the same containers (one sample of
each, what an agent asking Docker would cost), as the CPU of the docker CLI plus the CPU the Docker
daemon and containerd used meanwhile (their /proc/<pid>/stat), as a percentage of one core at 2 s.

Target: at most 1 % of one core per 50 kernels at 2 s.

    .venv/bin/python bench/stats.py [--kernels 50] [--rounds 200] [--image bai-python:3.11]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import msgpack  # noqa: E402

from bench.figures import Figure, record  # noqa: E402

LABEL = "bai.bench=1"
INTERVAL = 2.0  # seconds: the default [agent] stat_interval
TARGET_PCT = 1.0  # % of one core per 50 kernels at INTERVAL


def docker(*args: str, check: bool = True) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check).stdout


async def start_containers(client: Any, image: str, n: int, run_label: str) -> list[str]:
    """N idle containers, 8 started at a time."""
    gate = asyncio.Semaphore(8)
    labels = dict(label.split("=", 1) for label in (LABEL, run_label))
    config = {"Image": image, "Cmd": ["sleep", "3600"], "Labels": labels, "HostConfig": {"NetworkMode": "none"}}

    async def one() -> str:
        async with gate:
            container = await client.containers.create(config)
            await container.start()
            return container.id

    return list(await asyncio.gather(*(one() for _ in range(n))))


def remove_containers(run_label: str) -> None:
    ids = docker("ps", "-aq", "--filter", f"label={run_label}", check=False).split()
    if ids:
        docker("rm", "-f", *ids, check=False)


def daemon_pids() -> list[int]:
    """The Docker daemon's and containerd's processes (their CPU counts towards `docker stats`)."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                comm = Path(f"/proc/{name}/comm").read_text().strip()
            except OSError:
                continue
            if comm in ("dockerd", "containerd"):
                out.append(int(name))
    return out


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU of the processes (/proc/<pid>/stat), seconds."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / tick


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def docker_stats_cpu(ids: list[str], runs: int) -> float:
    """CPU seconds (CLI + daemons) of one `docker stats --no-stream` of the containers, median of `runs`."""
    daemons = daemon_pids()
    costs = []
    for _ in range(runs):
        before = children_cpu() + cpu_seconds(daemons)
        docker("stats", "--no-stream", "--format", "{{.ID}} {{.CPUPerc}} {{.MemUsage}}", *ids)
        costs.append(children_cpu() + cpu_seconds(daemons) - before)
    return statistics.median(costs)


def pct_of_core(cpu_per_round: float) -> float:
    return cpu_per_round / INTERVAL * 100


async def measure(backend: Any, ids: list[str], rounds: int) -> dict[str, float]:
    """CPU seconds per round: the agent's round (thread hop), the same reads inline, and an empty round."""
    from bai.node.agent.stats import DockerSampler, NodeSampler
    from bai.node.link.messages import KernelStats

    kernels = [
        SimpleNamespace(container_id=cid, spec=SimpleNamespace(kernel_id=f"k{i}", gpus=[])) for i, cid in enumerate(ids)
    ]
    sampler, node = DockerSampler(backend), NodeSampler(None)
    jobs = await sampler.targets(kernels)  # Docker is asked once per container (the pids), never per round
    if len(jobs) != len(ids):
        raise SystemExit(f"only {len(jobs)} of {len(ids)} containers run")
    first = await sampler.sample(kernels)
    if len(first) != len(ids):
        raise SystemExit(f"only {len(first)} of {len(ids)} containers could be read: cgroups not readable here?")

    async def agent_round() -> int:
        samples = await sampler.sample(kernels)
        return len(msgpack.packb(KernelStats(samples=samples, node=node.sample()).to_wire()))

    async def inline_round() -> int:
        readings = sampler.read_all(await sampler.targets(kernels))
        samples = {r.kernel_id: sampler._sample_of(r) for r in readings}
        return len(msgpack.packb(KernelStats(samples=samples, node=node.sample()).to_wire()))

    async def empty_round() -> int:
        return len(msgpack.packb(KernelStats(samples={}, node=node.sample()).to_wire()))

    out: dict[str, float] = {}
    for name, fn in (("agent", agent_round), ("inline", inline_round), ("empty", empty_round)):
        costs = []
        size = 0
        for _ in range(rounds):
            node.host._last = None  # each round samples the host afresh (as one agent per process does)
            cpu = time.process_time()
            size = await fn()
            costs.append(time.process_time() - cpu)
            await asyncio.sleep(0.005)  # let the containers' counters move a little
        out[name] = statistics.mean(costs)
        out[f"{name}_bytes"] = size
    return out


async def run(args: argparse.Namespace) -> int:
    import aiodocker

    from bai.node.agent.backends.docker import DockerBackend

    run_label = f"bai.bench.stats={os.getpid()}"
    backend = DockerBackend("bench-stats", Path("/nonexistent"), Path("/nonexistent"))
    backend.docker = aiodocker.Docker()
    try:
        started = time.monotonic()
        ids = await start_containers(backend.docker, args.image, args.kernels, run_label)
        print(f"{len(ids)} idle containers started in {time.monotonic() - started:.1f} s", flush=True)
        costs = await measure(backend, ids, args.rounds)
        baseline = docker_stats_cpu(ids, args.baseline_runs)
    finally:
        await backend.docker.close()
        remove_containers(run_label)
    scale = 50 / args.kernels  # the target is per 50 kernels
    agent_pct = pct_of_core(costs["agent"]) * scale
    base_pct = pct_of_core(baseline) * scale
    n = args.kernels
    print(f"\nper round of {n} kernels (mean of {args.rounds}; KernelStats {costs['agent_bytes']:.0f} bytes packed):")
    for what, key in (("agent round (thread hop)", "agent"), ("same reads inline", "inline")):
        print(f"  {what:26} {costs[key] * 1000:7.2f} ms CPU   {costs[key] / n * 1e6:6.1f} µs/kernel")
    print(f"  {'nothing read (node only)':26} {costs['empty'] * 1000:7.2f} ms CPU")
    print(f"  {'docker stats --no-stream':26} {baseline * 1000:7.2f} ms CPU (CLI + dockerd + containerd)")
    print(f"\nshare of one core at {INTERVAL:g} s, per 50 kernels:", end=" ")
    print(f"sampler {agent_pct:.3f} %, docker stats {base_pct:.2f} %")
    met = agent_pct <= TARGET_PCT
    print(f"target <= {TARGET_PCT:g} % of a core: {'MET' if met else 'MISSED'}")
    record(
        Figure(
            "statistics sampling, CPU per round of 50 idle Docker kernels (% of a core at 2 s)",
            agent_pct,
            "%",
            "`docker stats --no-stream`",
            base_pct,
            f"<= {TARGET_PCT:g}%",
            met,
        )
    )
    return 0 if met else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", type=int, default=50, help="idle containers (default 50)")
    ap.add_argument("--rounds", type=int, default=200, help="sampling rounds measured (default 200)")
    ap.add_argument("--baseline-runs", type=int, default=3, help="`docker stats --no-stream` runs (default 3)")
    ap.add_argument("--image", default=os.environ.get("BAI_TEST_IMAGE", "bai-python:3.11"))
    return asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
