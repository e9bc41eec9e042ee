"""Kernel logs: appended in chunks, each kernel's kept within log_max_bytes, paged, tailed, purged."""

from __future__ import annotations

import sqlite3
from datetime import datetime

from bai.node.manager.state.records import LogChunk, LogKept, LogPage, LogTail, stamp
from bai.node.manager.state.sqlite.db import Database, Queries, in_transaction

LOG_MAX_BYTES = 16 * 2**20  # [manager] log_max_bytes
LOG_PAGE_BYTES = 2**20  # what one read of a log holds at most (whole chunks, at least one)


def human_bytes(n: int) -> str:
    if n < 1024:
        return f"{n} bytes"
    size = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        size /= 1024
        if size < 1024 or unit == "GiB":
            break
    return f"{size:.1f} {unit}"


def drop_marker(dropped: int) -> str:
    """The line a log starts with once older output was dropped to keep it within log_max_bytes."""
    return f"[bai: {human_bytes(dropped)} of older output dropped]\n"


def _char_start(raw: bytes, i: int) -> int:
    """The first UTF-8 character start at or after byte i."""
    while i < len(raw) and 0x80 <= raw[i] < 0xC0:
        i += 1
    return i


def _log_rows(texts: list[str], max_bytes: int) -> tuple[list[tuple[int, str]], int]:
    """New output chunks as (size, text) rows of at most about max_bytes/8 each (so dropping whole rows
    keeps at least 7/8 of the bound), keeping only their last max_bytes; and how many bytes went."""
    row = max(256, max_bytes // 8)
    if all(t.isascii() and len(t) <= row for t in texts) and sum(map(len, texts)) <= max_bytes:
        return [(len(t), t) for t in texts if t], 0  # the usual case, without encoding
    rows: list[tuple[int, str]] = []
    budget, dropped = max_bytes, 0
    for text in reversed(texts):
        raw = text.encode("utf-8", "surrogatepass")
        keep = max(budget, 0)
        cut = _char_start(raw, len(raw) - keep) if len(raw) > keep else 0
        dropped += cut
        pieces: list[tuple[int, str]] = []
        pos = cut
        while pos < len(raw):
            end = _char_start(raw, min(pos + row, len(raw)))
            pieces.append(
                (end - pos, raw[pos:end].decode("utf-8", "surrogatepass") if (pos, end) != (0, len(raw)) else text)
            )
            pos = end
        rows[:0] = pieces
        budget -= len(raw) - cut
    return rows, dropped


LogSize = tuple[int, int, int | None]  # a kernel_log_sizes row: bytes, dropped, marker_seq


def _append_log(
    conn: sqlite3.Connection, kernel_id: str, texts: list[str], max_bytes: int, now: str, state: LogSize | None = None
) -> LogSize:
    """Append a kernel's output and drop its oldest rows beyond max_bytes, in the caller's transaction
    (down to 15/16 of it, so that a kernel printing on and on drops rows now and then, not each time).

    The kernel's running total is in kernel_log_sizes; what was dropped is said by one marker row that
    stays first (it takes the seq of the last row dropped) and whose count grows. `state`: that row as
    the caller knows it (None: read it). Returns the row as it is now."""
    rows, dropped = _log_rows(texts, max_bytes)
    fresh = state is None  # no row yet, or one that says the log was purged
    if state is None:
        row = conn.execute(
            "SELECT bytes, dropped, marker_seq, purged_at FROM kernel_log_sizes WHERE kernel_id=?", (kernel_id,)
        ).fetchone()
        if row is not None and row[3] is None:
            state, fresh = (row[0], row[1], row[2]), False
    kept, total_dropped, marker = state if state is not None else (0, 0, None)
    excess = kept + sum(size for size, _ in rows) - max_bytes
    last = None
    if excess > 0:
        excess += max_bytes // 16  # go a little below the bound, so that not every append has to drop rows
        cursor = conn.execute(
            "SELECT seq, COALESCE(size, length(CAST(data AS BLOB))) FROM kernel_logs "
            "WHERE kernel_id=? AND seq>? ORDER BY seq",
            (kernel_id, marker or 0),
        )
        for seq, size in cursor:
            last, excess, kept, dropped = seq, excess - size, kept - size, dropped + size
            if excess <= 0:
                break
        else:
            kept = 0  # every row went (the total may have been off for rows an older bai stored)
        cursor.close()
        if last is not None:
            conn.execute(
                "DELETE FROM kernel_logs WHERE kernel_id=? AND seq>? AND seq<=?", (kernel_id, marker or 0, last)
            )
    if dropped:
        total_dropped += dropped
        line = drop_marker(total_dropped)
        size = len(line)
        if marker is not None:
            conn.execute(
                "UPDATE kernel_logs SET seq=?, data=?, size=?, ts=? WHERE seq=?",
                (last or marker, line, size, now, marker),
            )
            marker = last or marker
        elif last is not None:
            conn.execute(
                "INSERT INTO kernel_logs(seq, kernel_id, size, data, ts) VALUES (?, ?, ?, ?, ?)",
                (last, kernel_id, size, line, now),
            )
            marker = last
        else:  # nothing older to drop: only the head of this output went
            marker = conn.execute(
                "INSERT INTO kernel_logs(kernel_id, size, data, ts) VALUES (?, ?, ?, ?)", (kernel_id, size, line, now)
            ).lastrowid
    for size, data in rows:
        conn.execute(
            "INSERT INTO kernel_logs(kernel_id, size, data, ts) VALUES (?, ?, ?, ?)", (kernel_id, size, data, now)
        )
    new_state = (kept + sum(size for size, _ in rows), total_dropped, marker)
    if fresh:
        conn.execute(
            "INSERT INTO kernel_log_sizes(kernel_id, bytes, dropped, marker_seq) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(kernel_id) DO UPDATE SET bytes=excluded.bytes, dropped=excluded.dropped, "
            "marker_seq=excluded.marker_seq, purged_at=NULL",
            (kernel_id, *new_state),
        )
    else:
        conn.execute(
            "UPDATE kernel_log_sizes SET bytes=?, dropped=?, marker_seq=? WHERE kernel_id=?", (*new_state, kernel_id)
        )
    return new_state


def _log_page(conn: sqlite3.Connection, kernel_id: str, after_seq: int, limit: int, max_bytes: int | None) -> LogPage:
    """Up to `limit` chunks and about `max_bytes` (whole chunks, at least one) after `after_seq`, and
    whether more follow."""
    cursor = conn.execute(
        "SELECT seq, data, ts, COALESCE(size, length(CAST(data AS BLOB))) FROM kernel_logs "
        "WHERE kernel_id=? AND seq>? ORDER BY seq LIMIT ?",
        (kernel_id, after_seq, limit + 1),
    )
    out: list[LogChunk] = []
    used, more = 0, False
    for seq, data, ts, size in cursor:
        if len(out) >= limit or (out and max_bytes is not None and used + size > max_bytes):
            more = True
            break
        out.append(LogChunk(seq, data, ts))
        used += size
    cursor.close()
    return LogPage(out, more)


class Logs(Queries):
    """Kernels' output, each kernel's kept within `log_max_bytes`."""

    def __init__(self, db: Database, log_max_bytes: int = LOG_MAX_BYTES) -> None:
        super().__init__(db)
        self.log_max_bytes = log_max_bytes  # per kernel (a session has one): older output is dropped
        self._log_sizes: dict[str, LogSize] = {}  # kernel_log_sizes rows as committed (this is the only writer)

    async def cut_logs_to_bound(self, now: datetime) -> list[str]:
        """Cut every log over `log_max_bytes` (kept by an older bai, or before log_max_bytes was lowered), the
        marker line stamped `now`; the kernels whose logs were cut."""
        at = stamp(now)

        def fn(conn: sqlite3.Connection) -> list[str]:
            sql = "SELECT kernel_id FROM kernel_log_sizes WHERE bytes > ?"
            over = [r[0] for r in conn.execute(sql, (self.log_max_bytes,))]
            if over:
                in_transaction(conn, lambda conn: [_append_log(conn, kid, [], self.log_max_bytes, at) for kid in over])
            return over

        return await self.db.run(fn)

    async def append_logs(self, chunks: list[tuple[str, str]], now: datetime) -> None:
        """Append (kernel_id, text) chunks in one transaction, stored `now`, each kernel's log kept within
        `log_max_bytes` (its oldest output dropped, one marker line first saying how much)."""
        at = stamp(now)
        by_kernel: dict[str, list[str]] = {}
        for kid, text in chunks:
            by_kernel.setdefault(kid, []).append(text)

        def append(conn: sqlite3.Connection) -> dict[str, LogSize]:
            return {
                kid: _append_log(conn, kid, texts, self.log_max_bytes, at, self._log_sizes.get(kid))
                for kid, texts in by_kernel.items()
            }

        def fn(conn: sqlite3.Connection) -> None:
            # the cache of kernel_log_sizes changes in the database's thread, once committed
            try:
                sizes = in_transaction(conn, append)
            except BaseException:
                for kid in by_kernel:
                    self._log_sizes.pop(kid, None)
                raise
            self._log_sizes.update(sizes)

        await self.db.run(fn)

    async def read_logs(self, kernel_id: str, after_seq: int = 0, limit: int = 1000) -> list[tuple[int, str]]:
        return [(seq, data) for seq, data, _ in await self.read_log_chunks(kernel_id, after_seq, limit)]

    async def read_log_chunks(
        self, kernel_id: str, after_seq: int = 0, limit: int = 1000, max_bytes: int | None = LOG_PAGE_BYTES
    ) -> list[LogChunk]:
        """(seq, text, stored-at) chunks of a kernel's log after `after_seq`, oldest first: at most `limit`
        of them and about `max_bytes` (whole chunks, at least one)."""
        return (await self.read_log_page(kernel_id, after_seq, max_bytes, limit))[0]

    async def read_log_page(
        self, kernel_id: str, after_seq: int = 0, max_bytes: int | None = LOG_PAGE_BYTES, limit: int = 100_000
    ) -> LogPage:
        """Chunks as `read_log_chunks` gives them, and whether more chunks follow."""
        return await self.db.run(lambda conn: _log_page(conn, kernel_id, after_seq, limit, max_bytes))

    async def read_log_tail(self, kernel_id: str, lines: int, after_seq: int = 0) -> LogTail:
        """The chunks holding a kernel's last `lines` lines (the first one cut to where they start), and the
        seq of its newest chunk (`after_seq` when none is newer), from which to follow it. `after_seq`: only
        chunks after it count (`since` / `sinceTime` with `tail`)."""

        def fn(conn: sqlite3.Connection) -> LogTail:
            out: list[LogChunk] = []
            newest, need = 0, lines
            cursor = conn.execute(
                "SELECT seq, data, ts FROM kernel_logs WHERE kernel_id=? AND seq>? ORDER BY seq DESC",
                (kernel_id, after_seq),
            )
            for seq, data, ts in cursor:
                if not newest:
                    newest = seq
                    need += data.endswith("\n")  # the newline that ends the last line starts no line
                if need <= 0:
                    break
                count = data.count("\n")
                if count >= need:
                    pos = len(data)
                    for _ in range(need):
                        pos = data.rindex("\n", 0, pos)
                    out.append(LogChunk(seq, data[pos + 1 :], ts))
                    break
                need -= count
                out.append(LogChunk(seq, data, ts))
            cursor.close()
            return LogTail([c for c in reversed(out) if c.data], newest or after_seq)

        return await self.db.run(fn)

    async def log_seq_before(self, kernel_id: str, when: str) -> int:
        """The seq of a kernel's newest chunk stored before `when` (ISO 8601, UTC; a chunk of an older bai,
        without a time, counts as before); 0 when none is."""
        row = await self.db.run(
            lambda conn: conn.execute(
                "SELECT MAX(seq) FROM kernel_logs WHERE kernel_id=? AND (ts IS NULL OR ts < ?)", (kernel_id, when)
            ).fetchone()
        )
        return int(row[0] or 0)

    async def newest_log_seq(self, kernel_id: str) -> int:
        """The seq of a kernel's newest stored chunk; 0: none."""
        return await self.db.statement(
            "SELECT MAX(seq) FROM kernel_logs WHERE kernel_id=?", (kernel_id,), lambda _conn, rows: int(rows[0][0] or 0)
        )

    async def log_state(self, kernel_id: str) -> LogKept | None:
        """What is kept of a kernel's log (bytes kept, bytes dropped, when purged); None: no output yet."""
        row = await self.db.run(
            lambda conn: conn.execute(
                "SELECT bytes, dropped, purged_at FROM kernel_log_sizes WHERE kernel_id=?", (kernel_id,)
            ).fetchone()
        )
        return LogKept(row[0], row[1], row[2]) if row is not None else None

    async def purge_logs(self, ended_before: datetime, now: datetime, batch: int = 50) -> list[str]:
        """Delete the logs of kernels whose session ended before `ended_before`, `batch` kernels per
        transaction, marked purged `now`; the kernels purged. Their kernel_log_sizes rows stay, to say so."""
        purged: list[str] = []
        before, at = stamp(ended_before), stamp(now)

        def fn(conn: sqlite3.Connection) -> list[str]:
            kernels = [
                r[0]
                for r in conn.execute(
                    "SELECT z.kernel_id FROM kernel_log_sizes z JOIN kernels k ON k.id = z.kernel_id "
                    "JOIN sessions s ON s.id = k.session_id "
                    "WHERE z.purged_at IS NULL AND s.terminated_at IS NOT NULL AND s.terminated_at < ? LIMIT ?",
                    (before, batch),
                )
            ]
            for kid in kernels:
                self._log_sizes.pop(kid, None)  # read again should it log once more
                conn.execute("DELETE FROM kernel_logs WHERE kernel_id=?", (kid,))
                conn.execute(
                    "UPDATE kernel_log_sizes SET bytes=0, dropped=0, marker_seq=NULL, purged_at=? WHERE kernel_id=?",
                    (at, kid),
                )
            return kernels

        while done := await self.db.transaction(fn):
            purged.extend(done)
            if len(done) < batch:
                break
        return purged

    async def log_tail_start(self, kernel_id: str, lines: int) -> int:
        """The `after_seq` from which reading a kernel's log yields about its last `lines` lines."""

        def fn(conn: sqlite3.Connection) -> int:
            seen = 0
            cursor = conn.execute("SELECT seq, data FROM kernel_logs WHERE kernel_id=? ORDER BY seq DESC", (kernel_id,))
            for seq, data in cursor:
                seen += data.count("\n")
                if seen > lines:
                    return int(seq)
            return 0

        return await self.db.run(fn)
