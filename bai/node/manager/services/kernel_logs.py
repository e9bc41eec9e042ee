"""Kernels' output as their sessions' logs: what is kept, pages, tails, and following new output."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from bai.node.manager.services.hubs import LogHub
from bai.node.manager.state import Store

Chunk = tuple[int, str, str | None]  # seq, text, stream


class KernelLogs:
    """Reads of the stored kernel output, and following it as it is stored."""

    def __init__(self, store: Store, hub: LogHub) -> None:
        self.store = store
        self.hub = hub

    async def state(self, kernel_id: str) -> dict[str, Any] | None:
        """{"bytes", "dropped", "purged_at"}; None: no output yet."""
        return await self.store.log_state(kernel_id)

    async def tail(self, kernel_id: str, lines: int, after: int = 0) -> tuple[list[Chunk], int]:
        """The chunks of the last `lines` lines (of those after seq `after`), and the seq to follow from."""
        if not after:
            return await self.store.read_log_tail(kernel_id, lines)
        return await self.store.read_log_tail(kernel_id, lines, after_seq=after)

    async def seq_before(self, kernel_id: str, when: str) -> int:
        """The seq of the newest chunk stored before `when` (ISO 8601, UTC); 0: none. Reading after it gives
        the output stored at or after `when`."""
        return await self.store.log_seq_before(kernel_id, when)

    async def tail_start(self, kernel_id: str, lines: int) -> int:
        """The seq after which the last `lines` lines start."""
        return await self.store.log_tail_start(kernel_id, lines)

    async def page(self, kernel_id: str, after: int, max_bytes: int) -> tuple[list[Chunk], bool]:
        """Chunks after seq `after`, up to `max_bytes`; whether there are more."""
        return await self.store.read_log_page(kernel_id, after, max_bytes)

    async def follow(
        self, kernel_id: str, is_over: Callable[[], Awaitable[bool]], after: int = 0, limit: int | None = None
    ) -> AsyncIterator[list[Chunk]]:
        """Batches of chunks after `after`, then new ones as they come, until `is_over()` and all is read."""

        async def read(kernel: str, last: int) -> list[Chunk]:
            if limit is None:
                return await self.store.read_log_chunks(kernel, last)
            return await self.store.read_log_chunks(kernel, last, limit=limit)

        async for chunks in self.hub.follow(read, kernel_id, is_over, after):
            yield chunks


async def newest_seq(store: Store, kernel_id: str) -> int:
    """The seq of a kernel's newest stored chunk (0: none): where a run that starts now begins in its log."""

    def fn(conn: Any) -> int:
        row = conn.execute("SELECT MAX(seq) FROM kernel_logs WHERE kernel_id=?", (kernel_id,)).fetchone()
        return int(row[0] or 0)

    return await store.db.run(fn)
