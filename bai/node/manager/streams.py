"""Long-lived requests (event streams, log follows, WebSockets) by keypair, so that deactivating a
keypair closes them at once instead of when the client next reconnects."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator


class OpenStreams:
    """The open execution and event streams per keypair, so a deactivated keypair's can be closed."""

    def __init__(self) -> None:
        self._tasks: dict[str, set[asyncio.Task]] = {}

    @contextlib.contextmanager
    def track(self, access_key: str) -> Iterator[None]:
        """Count the current task (a request handler) as one of the keypair's open streams."""
        task = asyncio.current_task()
        if task is None:
            yield
            return
        tasks = self._tasks.setdefault(access_key, set())
        tasks.add(task)
        try:
            yield
        finally:
            tasks.discard(task)
            if not tasks:
                self._tasks.pop(access_key, None)

    def count(self, access_key: str) -> int:
        return len(self._tasks.get(access_key, ()))

    def close_all(self, access_key: str) -> int:
        """End every open stream of a keypair (their handlers are cancelled); how many there were."""
        tasks = self._tasks.pop(access_key, set())
        for task in tasks:
            task.cancel()
        return len(tasks)
