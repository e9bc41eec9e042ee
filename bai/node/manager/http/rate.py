"""Long-lived requests (event streams, log follows, WebSockets) by keypair: deactivating a keypair closes
them at once instead of when the client next reconnects, and no keypair holds more than its cap open (each
one holds a connection, a file descriptor and buffers on the node: without a cap one keypair could hold
them all)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

from bai.common.problems import Problem

# A browser on a forwarded app opens a tunnel per connection (6 or so per page, plus its WebSockets), a
# dashboard 3, each terminal 1: 256 is room for a busy user and a wall for a flood.
MAX_STREAMS_PER_KEYPAIR = 256
# Requests of one keypair being served at once, streams included: a client that sends its bodies a byte at a
# time holds a connection per request, so without a cap one keypair could hold every connection the server
# has. bench/cluster.py keeps 64 in flight; the official client's pools hold 100.
MAX_REQUESTS_PER_KEYPAIR = 1024


def too_many_streams(limit: int) -> Problem:
    return Problem(
        "rate-limit-exceeded",
        "Too many open streams.",
        f"this keypair already has {limit} streams open (event streams, log follows, WebSockets, app "
        "tunnels); close some and try again",
        status=429,
    )


def too_many_requests(limit: int) -> Problem:
    return Problem(
        "rate-limit-exceeded",
        "Too many requests in flight.",
        f"this keypair already has {limit} requests being served; wait for some to finish and try again",
        status=429,
    )


class OpenStreams:
    """The open execution and event streams per keypair, at most `limit` each."""

    def __init__(self, limit: int = MAX_STREAMS_PER_KEYPAIR, requests: int = MAX_REQUESTS_PER_KEYPAIR) -> None:
        self.limit = limit
        self.requests_limit = requests
        self._tasks: dict[str, set[asyncio.Task[Any]]] = {}
        self._requests: dict[str, int] = {}  # requests being served, per keypair

    @contextlib.contextmanager
    def serving(self, access_key: str) -> Iterator[None]:
        """Count a request of the keypair while it is served; a 429 Problem when it has `requests_limit`."""
        held = self._requests.get(access_key, 0)
        if held >= self.requests_limit:
            raise too_many_requests(self.requests_limit)
        self._requests[access_key] = held + 1
        try:
            yield
        finally:
            left = self._requests[access_key] - 1
            if left:
                self._requests[access_key] = left
            else:
                del self._requests[access_key]

    def in_flight(self, access_key: str) -> int:
        return self._requests.get(access_key, 0)

    @contextlib.contextmanager
    def track(self, access_key: str) -> Iterator[None]:
        """Count the current task (a request handler) as one of the keypair's open streams; a 429 Problem
        when the keypair has `limit` open already."""
        task = asyncio.current_task()
        if task is None:
            yield
            return
        tasks = self._tasks.setdefault(access_key, set())
        if len(tasks) >= self.limit:
            raise too_many_streams(self.limit)
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
