"""GET /session/{ref}/logs: a session's kernel output, bounded, streamed rather than built in memory.

Without parameters: `{"result": {"logs": TEXT, "next": SEQ, "more": false}}` with everything kept (at most
`[manager] log_max_bytes`, after one marker line when older output was dropped) — Backend.AI's shape,
plus the cursor. Parameters:
  `tail=N`             the last N lines;
  `since=SEQ`          only chunks after the cursor SEQ (a `next` of an earlier answer);
  `limit=BYTES`        a page of about BYTES (whole chunks, at least one); `more` says whether more follow;
  `follow=true`        plain text that goes on until the session ends (from `since` or the `tail` if given);
  `sinceTime=WHEN`     only output stored at or after WHEN: a duration before now (`30s`, `10m`, `1h`, `90`)
                       or an ISO 8601 time (`2026-12-01T10:00:00Z`; UTC without a zone). It combines with
                       the others: `tail` counts lines from there, `follow` and pages start there.
Which kernel's (a cluster session has several; the main kernel's by default): `kernel_id=ID` (Backend.AI's
name) or `kernel=NAME` (bai's: main1, sub1 …, a kernel id or an id prefix of 4 or more characters).
A purged log (its session ended more than `[manager] log_retention` ago) answers a line saying so, and
`"purged": true`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from bai.common.problems import invalid
from bai.node.manager.services.kernel_logs import KernelLogs
from bai.node.manager.services.session_reads import SessionReads
from bai.node.manager.state import LOG_PAGE_BYTES
from bai.node.manager.state.records import Kernel, Session

TRUE = ("1", "true", "yes")


@dataclass(frozen=True)
class LogQuery:
    """What part of a log a request asks for: tail, page (since, limit) or follow."""

    follow: bool = False
    tail: int | None = None
    since: int | None = None
    limit: int | None = None
    since_time: str | None = None  # ISO 8601, UTC: only chunks stored at or after it


MAX_WHOLE = 2**63 - 1  # what SQLite's integers hold


def _whole(request: web.Request, name: str, minimum: int) -> int | None:
    raw = request.query.get(name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise invalid(f"{name} must be a whole number, got {raw[:40]!r}") from None
    if not minimum <= value <= MAX_WHOLE:
        raise invalid(f"{name} must be between {minimum} and {MAX_WHOLE}")
    return value


def _time(request: web.Request, name: str) -> str | None:
    from datetime import UTC

    from bai.common.durations import parse_since

    raw = request.query.get(name)
    if raw is None:
        return None
    try:
        return parse_since(raw).astimezone(UTC).isoformat()
    except (ValueError, OverflowError) as e:
        raise invalid(f"{name}: {e}") from None


def log_query(request: web.Request) -> LogQuery:
    """The parameters of a logs request; a 400 problem for a bad one."""
    query = LogQuery(
        follow=request.query.get("follow", "").lower() in TRUE,
        tail=_whole(request, "tail", 0),
        since=_whole(request, "since", 0),
        limit=_whole(request, "limit", 1),
        since_time=_time(request, "sinceTime"),
    )
    if query.tail is not None and (query.since is not None or query.limit is not None):
        raise invalid("use either tail=N (the last N lines) or since=SEQ and limit=BYTES (pages), not both")
    if query.follow and query.limit is not None:
        raise invalid("limit pages a log; a followed log has no pages (use since=SEQ or tail=N with follow)")
    return query


def log_kernel(request: web.Request) -> str | None:
    """The kernel a logs request names (`kernel_id` or `kernel`), None for the main kernel; a 400 when both
    name different kernels or one is not a kernel reference."""
    from bai.node.manager.http.requests import parse_kernel_ref

    by_id = parse_kernel_ref(request.query.get("kernel_id"), "kernel_id")
    by_name = parse_kernel_ref(request.query.get("kernel"), "kernel")
    if by_id is not None and by_name is not None and by_id != by_name:
        raise invalid("name the kernel once: kernel_id or kernel, not both")
    return by_id or by_name


def purged_line(purged_at: str) -> str:
    return f"[bai: this output was purged at {purged_at[:19]}Z, [manager] log_retention after the session ended]\n"


async def serve_logs(
    request: web.Request,
    logs: KernelLogs,
    reads: SessionReads,
    row: Session,
    kernel: Kernel,
    query: LogQuery,
) -> web.StreamResponse:
    kernel_id = kernel.id
    state = await logs.state(kernel_id)
    purged_at = state.purged_at if state is not None else None
    floor = 0  # with sinceTime: the newest chunk stored before it (what is read comes after)
    if query.since_time is not None and purged_at is None:
        floor = await logs.seq_before(kernel_id, query.since_time)
        query = dataclasses.replace(query, since=max(query.since or 0, floor))
    if query.follow:
        response = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8"})
        await response.prepare(request)
        if purged_at is not None:
            await response.write(purged_line(purged_at).encode())
        else:
            after = query.since or 0
            if query.tail is not None:
                chunks, after = await logs.tail(kernel_id, query.tail, after=query.since or 0)
                await response.write("".join(c[1] for c in chunks).encode())
            over = lambda: reads.session_over(row.id)  # noqa: E731
            async for chunks in logs.follow(kernel_id, over, after):
                await response.write("".join(c[1] for c in chunks).encode())
        await response.write_eof()
        return response

    if purged_at is not None:
        body = {"logs": purged_line(purged_at), "next": query.since or 0, "more": False, "purged": True}
        return web.json_response({"result": body})
    # the body is written as it is read: never more than a page of the log in memory
    response = web.StreamResponse(headers={"Content-Type": "application/json; charset=utf-8"})
    await response.prepare(request)
    await response.write(b'{"result": {"logs": "')
    next_seq, more = query.since or 0, False
    if query.tail is not None:
        chunks, next_seq = await logs.tail(kernel_id, query.tail, after=query.since or 0)
        await response.write(_escaped(chunks))
    elif query.limit is not None:
        chunks, more = await logs.page(kernel_id, next_seq, query.limit)
        next_seq = chunks[-1][0] if chunks else next_seq
        await response.write(_escaped(chunks))
    else:
        more = True
        while more:
            chunks, more = await logs.page(kernel_id, next_seq, LOG_PAGE_BYTES)
            next_seq = chunks[-1][0] if chunks else next_seq
            await response.write(_escaped(chunks))
    await response.write(f'", "next": {next_seq}, "more": {json.dumps(more)}}}}}'.encode())
    await response.write_eof()
    return response


def _escaped(chunks: Sequence[tuple[Any, ...]]) -> bytes:
    """The chunks' text as the inside of a JSON string (ASCII, so pieces join into one valid string)."""
    return "".join(json.dumps(c[1])[1:-1] for c in chunks).encode()
