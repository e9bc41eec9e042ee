"""The warm pool's rules, without I/O: which images have a pool and how many kernels each, which
sessions a pooled kernel may serve, what to create or remove next, and how long to wait after failures.

A pooled kernel is a kernel started ahead of any session (container created and started, runner
connected, no mounts) with the small limits below; a session that takes it gets its own limits,
environment and identity at hand-over (see `pool.py` and `DockerBackend.hand_over`). A session that a
pooled kernel could not serve exactly as a cold kernel would (mounts, GPUs, another network, another
cluster role, any kernel of a multi-container session, variables that change how the kernel's Python
starts) takes the cold path.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal

from bai.common.slots import Slots
from bai.node.agent.backends.base import KernelSpec

# what a pooled kernel may use before a session takes it (it only idles): small, so the pool costs little
POOL_CPU = Decimal("0.5")
POOL_MEM = Decimal(256 * 2**20)
POOL_SLOTS: Slots = {"cpu": POOL_CPU, "mem": POOL_MEM}
# what a workstation gets without an [agent.warm_pool] table: one kernel of the `python` alias, on Docker
DEFAULT_TABLE: dict[str, int] = {"python": 1}
MAX_PER_IMAGE = 64
# the session's own variables: set at hand-over, never in a pooled kernel before
SESSION_ENV = ("BACKENDAI_SESSION_ID", "BACKENDAI_SESSION_NAME", "BACKENDAI_ACCESS_KEY", "BACKENDAI_KERNEL_ID")
# variables read when a process starts (the runner's Python, the dynamic loader, the entrypoint's shell):
# a pooled kernel's runner started without them, so a session that sets one takes the cold path
STARTUP_ENV_NAMES = frozenset({"PATH", "HOME", "LANG", "LANGUAGE", "TZ", "SHELL", "USER", "HOSTNAME"})
STARTUP_ENV_PREFIXES = ("PYTHON", "LC_", "LD_", "MALLOC_", "GLIBC_")
MAX_PARALLEL = 2  # pooled kernels starting at once (never while a session's kernel starts cold)
RETRY_FIRST = 1.0  # seconds after a failed creation; doubling up to RETRY_MAX
RETRY_MAX = 60.0


def targets_of(table: Mapping[str, int] | None, aliases: Mapping[str, str], backend: str) -> dict[str, int]:
    """Image (aliases resolved) -> how many ready kernels to keep. Docker only: other backends have no
    images to start ahead. An empty or missing table means `DEFAULT_TABLE`; `python = 0` turns it off.
    Two names of one image: the larger count. ValueError for a count outside 0..MAX_PER_IMAGE."""
    if backend != "docker":
        return {}
    out: dict[str, int] = {}
    for name, count in (table or DEFAULT_TABLE).items():
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_PER_IMAGE:
            raise ValueError(f"[agent.warm_pool] {name}: expected a whole number from 0 to {MAX_PER_IMAGE}")
        image = aliases.get(name, name)
        out[image] = max(out.get(image, 0), count)
    return {image: n for image, n in out.items() if n > 0}


def startup_variable(name: str) -> bool:
    return name in STARTUP_ENV_NAMES or name.startswith(STARTUP_ENV_PREFIXES)


def cold_reason(spec: KernelSpec, pooled_images: Mapping[str, int], default_network: str) -> str | None:
    """Why a pooled kernel cannot serve `spec` (then it starts cold), or None when one can."""
    if spec.cluster is not None:  # its network, hosts and relay are set when its container is created
        return "it is a kernel of a multi-container session"
    if spec.image not in pooled_images:
        return "no warm pool for its image"
    if spec.mounts:
        return "it mounts folders"
    if spec.gpus or any(name not in ("cpu", "mem") for name in spec.slots):
        return "it holds devices"
    if not spec.slots.get("cpu") or not spec.slots.get("mem"):
        return "it has no cpu or memory limit"  # a pooled kernel's limits can be changed, not lifted
    if (spec.network or default_network) != default_network:
        return "it asks for another network"
    if (spec.cluster_role, spec.cluster_idx) != ("main", 1):
        return "it is not a main kernel"
    for name in spec.environ:
        if startup_variable(name):
            return f"its variable {name} changes how the kernel starts"
    return None


def refill(
    targets: Mapping[str, int],
    ready: Mapping[str, int],
    creating: Mapping[str, int],
    blocked_until: Mapping[str, float],
    now: float,
    max_parallel: int,
    cold_starting: int = 0,
) -> list[str]:
    """The images to start one pooled kernel of now: the largest shortfall first, at most `max_parallel`
    creations in flight, none while a session's kernel starts cold (the pool never delays one), none of an
    image whose last creation failed until its back-off has passed."""
    if cold_starting > 0:
        return []
    room = max_parallel - sum(creating.values())
    short = {
        image: want - ready.get(image, 0) - creating.get(image, 0)
        for image, want in targets.items()
        if blocked_until.get(image, 0.0) <= now
    }
    out: list[str] = []
    while room > 0:
        image = max(sorted(short), key=lambda i: short[i], default=None)
        if image is None or short[image] <= 0:
            break
        out.append(image)
        short[image] -= 1
        room -= 1
    return out


def wait_for_one(ready: int, creating: int, waiting: int) -> bool:
    """None ready: a session waits for a warm kernel already starting (it comes sooner than a cold start
    begun now would) when one is starting that no earlier session waits for."""
    return ready == 0 and creating > waiting


def excess(targets: Mapping[str, int], ready: Mapping[str, int]) -> dict[str, int]:
    """How many ready kernels of each image to remove (the pool shrank, or the image has no pool now)."""
    return {image: n - targets.get(image, 0) for image, n in ready.items() if n > targets.get(image, 0)}


def retry_delay(failures: int) -> float:
    """Seconds to wait before trying an image again after `failures` failed creations in a row."""
    if failures <= 0:
        return 0.0
    doublings: int = 2 ** (failures - 1)  # (int ** int is typed Any: a negative power gives a float)
    return min(RETRY_MAX, RETRY_FIRST * doublings)


def reserved(targets: Mapping[str, int]) -> Slots:
    """What a full pool may use (`[agent] warm_pool_reserve = true` takes it off the slots offered)."""
    count = sum(targets.values())
    return {name: amount * count for name, amount in POOL_SLOTS.items()} if count else {}
