"""The agent's warm pool: ready kernels per image, taken by sessions, refilled in the background.

The rules (sizes, who may take one, what to create next, back-off) are in `warm_pool.py`; this keeps the
kernels and does the I/O through the backend. A kernel is taken synchronously (`take`: popped from its
list in the event loop, so two sessions never get the same one), and the refill runs as one background
task that starts at most `max_parallel` creations at once and none while a session's kernel starts cold.
A pooled kernel that ends by itself is dropped and replaced. On agent stop, pooled kernels keep running
and the next start adopts them again (as pooled, or as a session's once handed over); a shrunk pool
(configuration changed) and removed images lose theirs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable

from bai.common.background import Background, cancel_and_wait
from bai.node.agent import warm_pool
from bai.node.agent.backends.base import Backend, Kernel, KernelSpec

log = logging.getLogger("bai.agent.pool")
CHECK_INTERVAL = 5.0  # seconds between looks at the pool when nothing wakes the refill


class WarmPool:
    """Ready kernels per image (`targets`: image -> how many), through `backend`."""

    def __init__(
        self,
        backend: Backend,
        targets: dict[str, int],
        *,
        max_parallel: int = warm_pool.MAX_PARALLEL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backend = backend
        self.targets = dict(targets)
        self.max_parallel = max_parallel
        self.clock = clock
        self.ready: dict[str, list[Kernel]] = {}
        self.creating: dict[str, int] = {}
        self.failures: dict[str, int] = {}
        self.blocked_until: dict[str, float] = {}
        self.paused: set[str] = set()  # images being removed: no refill
        # sessions waiting for a warm kernel being started (the first to finish is theirs), per image
        self.waiting: dict[str, list[asyncio.Future[Kernel | None]]] = {}
        self.cold_starting = 0  # sessions' kernels starting cold now (the refill waits for them)
        self.background = Background(log)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._creations: set[asyncio.Task[None]] = set()
        self._checked_at = float("-inf")  # when the pooled kernels' images were last compared with their names

    # -- what the agent asks ------------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        """Ready kernels per image (every image with a pool, 0 included)."""
        return {image: len(self.ready.get(image, [])) for image in sorted(set(self.targets) | set(self.ready))}

    def kernels(self) -> list[Kernel]:
        return [k for ks in self.ready.values() for k in ks]

    async def take(self, spec: KernelSpec, default_network: str, wait: float) -> Kernel | None:
        """A warm kernel for `spec` (no longer the pool's), or None: it starts cold. A ready one at once (taken
        without yielding: never two sessions' kernel); else, when one is being started that no earlier
        session waits for, that one (up to `wait` seconds). Refills."""
        if warm_pool.cold_reason(spec, self.targets, default_network) is not None:
            return None
        image = spec.image
        ready = self.ready.get(image) or []
        waiting = self.waiting.setdefault(image, [])
        if ready:
            kernel = ready.pop(0)  # the oldest
            self.wake()
            return kernel
        if not warm_pool.wait_for_one(0, self.creating.get(image, 0), len(waiting)):
            return None
        fut: asyncio.Future[Kernel | None] = asyncio.get_running_loop().create_future()
        waiting.append(fut)
        self.wake()
        try:
            return await asyncio.wait_for(asyncio.shield(fut), wait)
        except (TimeoutError, asyncio.CancelledError):
            if fut in waiting:
                waiting.remove(fut)
            if fut.done() and not fut.cancelled() and (late := fut.result()) is not None:
                self._add(late)  # it came just as we gave up: the pool's again
            if not fut.done():
                fut.cancel()
            return None

    def adopt(self, kernels: list[Kernel]) -> None:
        """Pooled kernels found running at start; those beyond the pool's size are removed."""
        for kernel in kernels:
            self._add(kernel)
        self._shrink()

    def wake(self) -> None:
        self._wake.set()

    def image_changed(self) -> None:
        """An image was pulled: compare the pooled kernels' images with their names now."""
        self._checked_at = float("-inf")
        self.wake()

    def start(self) -> None:
        if self._task is None and self.targets:  # no pool (other backends, or turned off): no task
            self._task = asyncio.create_task(self._loop(), name="warm-pool")

    async def remove_image(self, image: str) -> None:
        """The image goes: its pooled kernels go first (Docker keeps an image that containers use), and no
        new one starts until `resume(image)`."""
        self.paused.add(image)
        starting = [t for t in self._creations if t.get_name() == f"pool-create-{image}"]
        if starting:  # each removes what it made, as the image is paused
            await asyncio.wait(starting)
        for kernel in self.ready.pop(image, []):
            await self._remove(kernel, "its image is removed")

    def resume(self, image: str) -> None:
        self.paused.discard(image)
        self.wake()

    async def close(self) -> None:
        """Stop refilling; creations under way are cancelled (the backend removes what they made). The ready
        kernels stay running for the next start of the agent to adopt."""
        if self._task is not None:
            await cancel_and_wait(self._task, expected=())
        for image in list(self.waiting):
            while self._hand_to_waiter(image, None):
                pass
        await cancel_and_wait(*self._creations)
        await self.background.close()

    # -- inside ---------------------------------------------------------------------------------------

    def _add(self, kernel: Kernel) -> None:
        image = kernel.pool_image or kernel.spec.image
        if self._hand_to_waiter(image, kernel):
            return
        self.ready.setdefault(image, []).append(kernel)

        def ended(_: asyncio.Future[int]) -> None:
            mine = self.ready.get(image, [])
            if kernel in mine:  # it ended while pooled: drop it, a new one replaces it
                mine.remove(kernel)
                log.warning("warm kernel %s (%s) ended by itself; replacing it", kernel.spec.kernel_id, image)
                self.background.spawn(self._remove(kernel, "it ended"), f"pool-remove-{kernel.spec.kernel_id}")
                self.wake()

        kernel.exited.add_done_callback(ended)

    def _hand_to_waiter(self, image: str, kernel: Kernel | None) -> bool:
        """Give a kernel that just started (None: a start that failed) to the first session waiting."""
        waiting = self.waiting.get(image) or []
        while waiting:
            fut = waiting.pop(0)
            if not fut.done():
                fut.set_result(kernel)
                return True
        return False

    def _shrink(self) -> None:
        for image, n in warm_pool.excess(self.targets, {i: len(ks) for i, ks in self.ready.items()}).items():
            for _ in range(n):
                kernel = self.ready[image].pop()
                why = "the pool shrank" if image in self.targets else "its image has no pool now"
                self.background.spawn(self._remove(kernel, why), f"pool-remove-{kernel.spec.kernel_id}")

    async def _remove(self, kernel: Kernel, why: str) -> None:
        log.info("removing warm kernel %s of %s: %s", kernel.spec.kernel_id, kernel.pool_image, why)
        try:
            await self.backend.destroy(kernel)
        except Exception as e:
            log.warning("could not remove warm kernel %s: %s", kernel.spec.kernel_id, e)

    async def _retire_stale(self) -> None:
        """Pooled kernels of an image that was rebuilt or pulled again are replaced (checked every few seconds,
        and after a pull)."""
        try:
            stale = await self.backend.stale(self.kernels())
        except Exception as e:
            log.debug("cannot check the warm kernels' images: %s", e)
            return
        for kernel in stale:
            mine = self.ready.get(kernel.pool_image or kernel.spec.image, [])
            if kernel in mine:  # (not taken meanwhile)
                mine.remove(kernel)
                self.background.spawn(self._remove(kernel, "its image changed"), f"pool-remove-{kernel.spec.kernel_id}")

    async def _loop(self) -> None:
        while True:
            self._wake.clear()
            if self.clock() - self._checked_at >= CHECK_INTERVAL:
                self._checked_at = self.clock()
                await self._retire_stale()
            self._shrink()
            now = self.clock()
            blocked = dict(self.blocked_until) | {image: float("inf") for image in self.paused}
            ready = {image: len(ks) for image, ks in self.ready.items()}
            plan = warm_pool.refill(
                self.targets, ready, self.creating, blocked, now, self.max_parallel, self.cold_starting
            )
            for image in plan:
                self.creating[image] = self.creating.get(image, 0) + 1
                task = asyncio.create_task(self._create(image), name=f"pool-create-{image}")
                self._creations.add(task)
                task.add_done_callback(self._creations.discard)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._next_check(now))

    def _next_check(self, now: float) -> float:
        waits = [until - now for until in self.blocked_until.values() if until > now]
        return max(0.05, min([CHECK_INTERVAL, *waits]))

    async def _create(self, image: str) -> None:
        pool_id = f"pool-{secrets.token_hex(8)}"
        try:
            if not await self.backend.has_image(image):
                raise LookupError(f"the image {image} is not on this agent (pull it, or change [agent.warm_pool])")
            kernel = await self.backend.create_pooled(image, pool_id, lambda kind, text: None)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            failures = self.failures[image] = self.failures.get(image, 0) + 1
            delay = warm_pool.retry_delay(failures)
            self.blocked_until[image] = self.clock() + delay
            say = log.warning if failures == 1 or failures % 10 == 0 else log.debug
            say("could not start a warm kernel of %s (%s); trying again in %.0f s", image, e, delay)
            self._hand_to_waiter(image, None)  # a session waiting for it starts cold
            return
        finally:
            self.creating[image] -= 1
            self.wake()
        if self.failures.pop(image, 0):
            log.info("warm kernels of %s start again", image)
        self.blocked_until.pop(image, None)
        if image in self.paused:
            self._hand_to_waiter(image, None)
            await self._remove(kernel, "its image is removed")
            return
        self._add(kernel)
