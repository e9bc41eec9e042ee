"""Multi-container sessions: what eight kernels cost against one, measured in the same run.

With a real Docker node (cold kernels: cluster kernels never come from the warm pool, so neither do the
one-kernel sessions here), interleaved, `--runs` times each:

- a one-kernel session: create -> RUNNING (the POST /session that waits), then destroy (DELETE, waiting);
- an 8-kernel single-node session (`--kernels`), the same.

Prints the medians and the ratios 8-kernel / 1-kernel (targets: RUNNING <= 2.0, destroy <= 1.5), how long
after the destroy answered the containers were gone, and what Docker alone takes to start one container and
eight at once (the same image, no bai in the way): on a machine with few cores the daemon starts containers
largely one after another, which bounds the RUNNING ratio from below. Every kernel asks for 0.25 cpu and
256 MiB (the agent offers 64 cpus, so eight fit on a small machine). Containers carry bai.bench=1 and are
removed at the end.

    .venv/bin/python bench/cluster_session.py [--runs 5] [--kernels 8] [--image bai-python:3.11]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.benchnode import start_node  # noqa: E402
from bench.figures import Figure, record  # noqa: E402

RESOURCES = {"cpu": "0.25", "mem": "256m"}
RUNNING_TARGET = 2.0
DESTROY_TARGET = 1.5


def session_containers(session_id: str) -> list[str]:
    out = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=ai.backend.session-id={session_id}"],
        capture_output=True,
        text=True,
    )
    return out.stdout.split()


def until_gone(session_id: str, timeout: float = 60.0) -> float:
    """Seconds until the session has no container left."""
    start = time.perf_counter()
    while session_containers(session_id):
        if time.perf_counter() - start > timeout:
            raise SystemExit(f"the containers of session {session_id} were still there after {timeout:g} s")
        time.sleep(0.02)
    return time.perf_counter() - start


async def one(c, size: int, name: str) -> tuple[float, float, float]:
    """(create -> RUNNING, destroy, containers gone after the destroy answered), in seconds."""
    start = time.perf_counter()
    created = await c.create_session("python", name=name, resources=RESOURCES, cluster_size=size)
    running = time.perf_counter() - start
    if created["status"] != "RUNNING":
        raise SystemExit(f"session {name} of {size} kernels: {created['status']} ({created})")
    if size > 1 and len(session_containers(created["sessionId"])) != size:
        raise SystemExit(f"session {name}: {size} kernels asked for, not as many containers")
    start = time.perf_counter()
    await c.destroy_session(created["sessionId"])
    destroyed = time.perf_counter() - start
    gone = await asyncio.to_thread(until_gone, created["sessionId"])
    return running, destroyed, gone


async def measure(env: dict[str, str], runs: int, kernels: int) -> dict[int, list[tuple[float, float, float]]]:
    os.environ.update(env)
    from bai.client import Client
    from bai.common import credentials

    creds = credentials.load()
    assert creds is not None
    out: dict[int, list[tuple[float, float, float]]] = {1: [], kernels: []}
    async with Client(creds) as c:
        await one(c, 1, f"warmup-1-{os.getpid()}")  # the first container start of a node is slower
        await one(c, kernels, f"warmup-{kernels}-{os.getpid()}")
        for i in range(runs):  # interleaved, so both see the same machine load
            for size in (1, kernels):
                out[size].append(await one(c, size, f"bench-{size}-{i}-{os.getpid()}"))
    return out


async def docker_floor(image: str, runs: int, kernels: int) -> tuple[float, float]:
    """What Docker alone takes, in the same run: median seconds to start 1 container, and `kernels` containers
    at once (created beforehand, `--network none`, a sleeping shell: no bai in the way)."""
    import aiodocker

    docker = aiodocker.Docker()
    config = {
        "Image": image,
        "Entrypoint": ["/bin/sh", "-c", "sleep 600"],
        "Labels": {"bai.bench": "1"},
        "HostConfig": {"NetworkMode": "none"},
    }
    times: dict[int, list[float]] = {1: [], kernels: []}
    try:
        for _ in range(runs):
            for size in (1, kernels):
                made = await asyncio.gather(*(docker.containers.create(config) for _ in range(size)))
                start = time.perf_counter()
                await asyncio.gather(*(c.start() for c in made))
                times[size].append(time.perf_counter() - start)
                await asyncio.gather(*(c.delete(force=True) for c in made))
    finally:
        await docker.close()
    return statistics.median(times[1]), statistics.median(times[kernels])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--kernels", type=int, default=8)
    ap.add_argument("--image", default="bai-python:3.11")
    args = ap.parse_args()
    if args.kernels < 2:
        ap.error("--kernels wants 2 or more")

    config = f'[images.aliases]\npython = "{args.image}"\n[agent]\ncpu = "64"\n[agent.warm_pool]\npython = 0\n'
    node = start_node(config, "docker")
    try:
        results = asyncio.run(measure(dict(node.env), args.runs, args.kernels))
        floor1, floorn = asyncio.run(docker_floor(args.image, args.runs, args.kernels))
    finally:
        node.stop()  # (removes what carries bai.bench=1)

    def med(size: int, i: int) -> float:
        return statistics.median(r[i] for r in results[size]) * 1000

    run1, runn = med(1, 0), med(args.kernels, 0)
    del1, deln = med(1, 1), med(args.kernels, 1)
    gone1, gonen = med(1, 2), med(args.kernels, 2)
    running_ratio, destroy_ratio = runn / run1, deln / del1
    n = args.kernels
    record(
        Figure(
            f"{n}-kernel session create -> RUNNING",
            runn,
            "ms",
            "1-kernel session",
            run1,
            f"<= {RUNNING_TARGET}x",
            running_ratio <= RUNNING_TARGET,
        )
    )
    record(
        Figure(
            f"{n}-kernel session destroy",
            deln,
            "ms",
            "1-kernel session",
            del1,
            f"<= {DESTROY_TARGET}x",
            destroy_ratio <= DESTROY_TARGET,
        )
    )

    def verdict(value: float, target: float) -> str:
        return "MET" if value <= target else "MISSED"

    rows = [
        ("runs per figure", f"{args.runs} (medians; 1-kernel and {n}-kernel sessions interleaved)"),
        ("kernels ask for", f"{RESOURCES['cpu']} cpu, {RESOURCES['mem']} each, cold"),
        ("create -> RUNNING, 1 kernel", f"{run1:.0f} ms"),
        (f"create -> RUNNING, {n} kernels", f"{runn:.0f} ms"),
        (
            f"ratio {n} / 1",
            f"{running_ratio:.2f}  (target <= {RUNNING_TARGET}: {verdict(running_ratio, RUNNING_TARGET)})",
        ),
        ("destroy, 1 kernel", f"{del1:.0f} ms"),
        (f"destroy, {n} kernels", f"{deln:.0f} ms"),
        (
            f"ratio {n} / 1",
            f"{destroy_ratio:.2f}  (target <= {DESTROY_TARGET}: {verdict(destroy_ratio, DESTROY_TARGET)})",
        ),
        ("containers gone after the destroy", f"1 kernel {gone1:.0f} ms, {n} kernels {gonen:.0f} ms"),
        (
            "Docker alone: container start",
            f"1 at a time {floor1 * 1000:.0f} ms, {n} at once {floorn * 1000:.0f} ms "
            f"(ratio {floorn / floor1:.2f}: the floor of the RUNNING ratio on this machine)",
        ),
    ]
    width = max(len(label) for label, _ in rows) + 2
    for label, value in rows:
        print(label.ljust(width) + value)


if __name__ == "__main__":
    main()
