"""Background tasks that are kept referenced, log their failures, and are cancelled on close."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from bai.common.diskspace import disk_full


class Background:
    """Background tasks that are kept referenced, log their failures, and are cancelled on close."""

    def __init__(self, log: logging.Logger) -> None:
        self.log = log
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled() or (e := task.exception()) is None:
            return
        if disk_full(e):  # the node's disk is full: one line, no traceback (writes work once space is freed)
            self.log.warning("task %s failed: the disk is full (%s)", task.get_name(), e)
        else:
            self.log.error("task %s failed", task.get_name(), exc_info=e)

    async def drain(self, timeout: float) -> None:
        """Let the running tasks finish, for at most `timeout` seconds (then `close` cancels the rest)."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout)

    async def close(self) -> None:
        await cancel_and_wait(*self._tasks)


RECANCEL = 1.0  # seconds a cancelled task may take to end before it is cancelled again


async def cancel_and_wait(
    *tasks: asyncio.Future[Any] | None, expected: tuple[type[BaseException], ...] = (Exception,)
) -> None:
    """Cancel `tasks` and wait until each has ended. Their own ends are theirs: a CancelledError, or an
    exception of `expected`, is taken as the end; another is raised here. A cancellation of the caller itself
    goes on from here (`with suppress(CancelledError): await task` would swallow it, and a loop stopped while
    it waits in such a step runs on: a node's stop then hangs). A task still going RECANCEL seconds after
    (it lost its cancellation) is cancelled again, until it ends."""
    live = [t for t in tasks if t is not None and t is not asyncio.current_task()]
    for task in live:
        task.cancel()
    if not live:
        return
    pending: set[asyncio.Future[Any]] = set(live)
    while pending:
        _, pending = await asyncio.wait(pending, timeout=RECANCEL)
        for task in pending:  # a cancellation it swallowed (Python 3.11's asyncio.wait_for loses one that comes
            task.cancel()  # as what it waits for ends): cancelled again
    for task in live:
        if task.cancelled():
            continue
        e = task.exception()
        if e is not None and not isinstance(e, expected):
            raise e
