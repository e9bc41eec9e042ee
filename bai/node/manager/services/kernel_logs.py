"""Kernels' output as their sessions' logs: what is kept, pages, tails, and following new output."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

from bai.node.manager.services.hubs import LogHub
from bai.node.manager.state.protocols import LogState
from bai.node.manager.state.records import LogChunk, LogKept, LogPage, LogTail

Chunk = LogChunk  # seq, text, when stored


class KernelLogs:
    """Reads of the stored kernel output, and following it as it is stored."""

    def __init__(self, state: LogState, hub: LogHub) -> None:
        self.stored = state  # the logs as stored
        self.hub = hub

    async def state(self, kernel_id: str) -> LogKept | None:
        """What is kept of the log (bytes, dropped, purged_at); None: no output yet."""
        return await self.stored.log_state(kernel_id)

    async def tail(self, kernel_id: str, lines: int, after: int = 0) -> LogTail:
        """The chunks of the last `lines` lines (of those after seq `after`), and the seq to follow from."""
        if not after:
            return await self.stored.read_log_tail(kernel_id, lines)
        return await self.stored.read_log_tail(kernel_id, lines, after_seq=after)

    async def seq_before(self, kernel_id: str, when: str) -> int:
        """The seq of the newest chunk stored before `when` (ISO 8601, UTC); 0: none. Reading after it gives
        the output stored at or after `when`."""
        return await self.stored.log_seq_before(kernel_id, when)

    async def newest_seq(self, kernel_id: str) -> int:
        """The seq of a kernel's newest stored chunk (0: none): where a run that starts now begins in its log."""
        return await self.stored.newest_log_seq(kernel_id)

    async def tail_start(self, kernel_id: str, lines: int) -> int:
        """The seq after which the last `lines` lines start."""
        return await self.stored.log_tail_start(kernel_id, lines)

    async def page(self, kernel_id: str, after: int, max_bytes: int) -> LogPage:
        """Chunks after seq `after`, up to `max_bytes`; whether there are more."""
        return await self.stored.read_log_page(kernel_id, after, max_bytes)

    async def follow(
        self, kernel_id: str, is_over: Callable[[], Awaitable[bool]], after: int = 0, limit: int | None = None
    ) -> AsyncIterator[list[Chunk]]:
        """Batches of chunks after `after`, then new ones as they come, until `is_over()` and all is read."""

        async def read(kernel: str, last: int) -> list[Chunk]:
            if limit is None:
                return await self.stored.read_log_chunks(kernel, last)
            return await self.stored.read_log_chunks(kernel, last, limit=limit)

        async for chunks in self.hub.follow(read, kernel_id, is_over, after):
            yield chunks


async def newest_seq(state: LogState, kernel_id: str) -> int:
    """The seq of a kernel's newest stored chunk (0: none): where a run that starts now begins in its log."""
    return await state.newest_log_seq(kernel_id)
