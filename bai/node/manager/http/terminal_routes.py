"""`GET /stream/session/{ref}/pty`: a terminal in a session's kernel (the main one by default) over a WebSocket,
in Backend.AI's wire format (text frames of JSON), relayed over the agent's link stream (agents open no inbound port).

Client → server: {"type": "stdin", "chars": BASE64}, {"type": "resize", "rows", "cols"}, {"type": "ping"},
{"type": "restart"} (ignored: a terminal is restarted by opening a new one).
Server → client: {"type": "out", "data": BASE64}, {"type": "error", "data": MESSAGE}, and bai's extension
{"type": "exit", "code": N} when the command ended (then the server closes).
Query (bai's extensions): `command` (a JSON list: what to run instead of the kernel's shell), `rows`, `cols`,
`kernel` (which kernel of a cluster session: main1, sub1 …, a kernel id or an id prefix; main1 when absent).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web

from bai.common import safejson
from bai.common.background import cancel_and_wait
from bai.common.problems import invalid
from bai.common.status import ACTIVE_STATUSES, SessionStatus
from bai.node.link.streams import MAX_FRAME as LINK_FRAME
from bai.node.link.streams import LinkStream, StreamClosed
from bai.node.manager.http.context import services_of, session_of
from bai.node.manager.http.requests import parse_kernel_ref
from bai.node.manager.state.protocols import SessionReadState

log = logging.getLogger("bai.api.terminal")
MAX_FRAME = 1024 * 1024  # bytes of one client frame (a paste of 768 KiB, base64-encoded)
MAX_SIZE = 1000  # rows and columns of a terminal, at most
MAX_BAD_FRAMES = 32  # frames answered with an error, at most, before the terminal is closed (1008)


def terminal_query(request: web.Request) -> tuple[list[str] | None, int, int]:
    """(command, rows, cols) from the query, or a 400."""
    command = None
    raw = request.query.get("command")
    if raw:
        try:
            command = safejson.loads(raw, max_bytes=1024 * 1024, max_depth=2, what="command")
        except safejson.UnsafeJson:
            raise invalid('command must be a JSON list of strings, e.g. ["ls", "-l"]') from None
        if (
            not isinstance(command, list)
            or not command
            or len(command) > 256
            or not all(isinstance(c, str) and "\0" not in c and len(c) < 4096 for c in command)
        ):
            raise invalid("command must be a non-empty JSON list of strings (no NUL)")
    sizes = []
    for name, default in (("rows", 24), ("cols", 80)):
        try:
            value = int(request.query.get(name, default))
        except ValueError:
            raise invalid(f"{name} must be a whole number") from None
        if not 1 <= value <= MAX_SIZE:
            raise invalid(f"{name} must be between 1 and {MAX_SIZE}")
        sizes.append(value)
    return command, sizes[0], sizes[1]


async def pty(request: web.Request) -> web.StreamResponse:
    services = services_of(request)
    row = await session_of(request)
    command, rows, cols = terminal_query(request)
    kernel = parse_kernel_ref(request.query.get("kernel"))
    ws = web.WebSocketResponse(heartbeat=30.0, max_msg_size=MAX_FRAME)
    if not ws.can_prepare(request).ok:
        raise invalid("the terminal is a WebSocket: connect with an Upgrade: websocket request")
    stream = await services.kernel_ops.open_terminal(
        row, command, rows, cols, kernel_ref=kernel
    )  # 4xx before the upgrade
    try:
        await ws.prepare(request)
        activity, state = services.activity, services.state
        await relay(ws, stream, lambda: activity.touch(row.id), lambda: ended(state, row.id))
    finally:
        await stream.close("the client went away")
        if not ws.closed:
            with contextlib.suppress(Exception):
                await ws.close()
    return ws


async def ended(state: SessionReadState, session_id: str) -> str | None:
    """Why the session is over, if it is, or is ending (its terminals end with it)."""
    current = await state.get_session(session_id)
    if current is None:
        return "the session is gone"
    if SessionStatus(current.status) in ACTIVE_STATUSES and current.status != "TERMINATING":
        return None
    info = f" ({current.status_info})" if current.status_info else ""
    return f"session {current.name} ended{info}"


async def relay(
    ws: web.WebSocketResponse,
    stream: LinkStream,
    touch: Callable[[], object],
    why_ended: Callable[[], Awaitable[str | None]],
) -> None:
    """Client frames to the stream, stream frames to the client, until either ends; when the session
    ended under the terminal, the client is told so."""

    async def keys() -> None:
        bad = 0
        async for msg in ws:
            if msg.type != WSMsgType.TEXT:
                continue
            touch()
            try:
                frame = decode_frame(msg.data)
            except FrameError as e:
                bad += 1
                if bad > MAX_BAD_FRAMES:
                    await ws.close(code=WSCloseCode.POLICY_VIOLATION, message=b"too many bad frames")
                    return
                await ws.send_json({"type": "error", "data": str(e)})
                continue
            if frame is None:
                continue
            if frame["t"] == "in":  # a link stream frame carries at most LINK_FRAME bytes
                for i in range(0, len(frame["d"]), LINK_FRAME):
                    await stream.send({"t": "in", "d": frame["d"][i : i + LINK_FRAME]})
            else:
                await stream.send(frame)

    async def screen() -> None:
        while (frame := await stream.receive()) is not None:
            if frame.get("t") == "out":
                await ws.send_json({"type": "out", "data": base64.b64encode(frame.get("d", b"")).decode()})
            elif frame.get("t") == "exit":
                for _ in range(20):  # a kernel destroyed under the shell: say so rather than its exit status
                    if (why := await why_ended()) is not None:
                        await ws.send_json({"type": "error", "data": why})
                        return
                    if frame.get("code") not in (129, 137, 143):
                        break
                    await asyncio.sleep(0.05)
                await ws.send_json({"type": "exit", "code": frame.get("code")})
                return
        why = await why_ended()
        if why is not None or stream.closed_reason:  # the session ended, or the agent gave a reason
            await ws.send_json({"type": "error", "data": why or stream.closed_reason})

    tasks = [asyncio.create_task(screen(), name="pty-out"), asyncio.create_task(keys(), name="pty-in")]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            with contextlib.suppress(StreamClosed, ConnectionError):
                task.result()
    finally:
        await cancel_and_wait(*tasks, expected=(StreamClosed, ConnectionError))


class FrameError(ValueError):
    """A client frame the terminal cannot take (str: the error frame's text); the terminal goes on."""


def _whole(value: object) -> int | None:
    """A whole number as a client may write it (24, 24.0, "24"), or None; never a huge one (no OverflowError)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if abs(value) < 1 << 31 else MAX_SIZE + 1
    if isinstance(value, float) and value.is_integer():
        return int(value) if abs(value) < 1 << 31 else MAX_SIZE + 1
    if isinstance(value, str) and value.isdigit() and value.isascii() and len(value) <= 6:
        return int(value)
    return None


def decode_frame(text: str) -> dict[str, Any] | None:
    """A client's text frame → the link stream's frame (None: nothing to send, e.g. a ping), or FrameError."""
    try:
        frame = safejson.loads(text, max_bytes=MAX_FRAME, max_depth=4, what="a frame")
    except safejson.UnsafeJson as e:
        raise FrameError(f"frames are JSON objects: {e}") from None
    if not isinstance(frame, dict):
        raise FrameError("frames are JSON objects")
    kind = frame.get("type")
    if kind == "stdin":
        chars = frame.get("chars", "")
        if not isinstance(chars, str):
            raise FrameError("stdin chars must be base64")
        try:
            return {"t": "in", "d": base64.b64decode(chars, validate=True)}
        except (binascii.Error, ValueError):
            raise FrameError("stdin chars must be base64") from None
    if kind == "resize":
        rows, cols = _whole(frame.get("rows")), _whole(frame.get("cols"))
        if rows is None or cols is None:
            raise FrameError("resize needs whole rows and cols")
        if not (1 <= rows <= MAX_SIZE and 1 <= cols <= MAX_SIZE):
            raise FrameError(f"resize rows and cols must be between 1 and {MAX_SIZE}")
        return {"t": "resize", "rows": rows, "cols": cols}
    return None  # ping, restart (a terminal is restarted by opening a new one), and kinds bai does not know


def add_terminal_routes(app: web.Application) -> None:
    app.router.add_get("/stream/session/{ref}/pty", pty)
