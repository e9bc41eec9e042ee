"""Apps through the manager, in Backend.AI's wire format:

- `GET /stream/session/{ref}/apps`: the session's apps, a JSON list of
  `{name, protocol, ports, url_template, allowed_arguments, allowed_envs}` (plus bai's `host_ports`: where
  the agent published them on its 127.0.0.1, when the kernel's network can publish). An app started with a
  secret of its own (Jupyter; see bai/common/service_ports.py) has it as `token` and in its url_template
  (`...?token=SECRET`, so the URL the official client prints opens it), once it was started.
- `POST /stream/session/{ref}/apps/{app}/start` (bai's): start the app unless it runs, and say so
  (`{"app", "started", "token", "url_template"}`: started now or already running; its secret, "" when it
  has none; its URL with the secret); a 409 problem with its output when it fails.
  Only the session's owner and admins reach these (others get 404, as for the session itself).
  Backend.AI starts apps only inside the proxy request; this lets a client report a failure in full
  before it listens for connections (a WebSocket handshake that fails carries no body to most clients).
- `GET /stream/session/{ref}/tcpproxy?app=NAME` (and `httpproxy`, the same here): a WebSocket carrying one
  TCP connection to the app, as binary frames both ways. The app is started first if it does not run (a
  409 with its output when it fails to start, before the upgrade). When the tunnel ends for a reason (the
  session ended, the app went away) the server sends a text frame `{"type": "error", "data": REASON}` and
  closes with code 1001 (session over) or 1011 (anything else); a normal end closes with 1000. A client
  frame over MAX_MESSAGE bytes closes the WebSocket with 1009 (message too big).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web

from bai.common import safejson
from bai.common import service_ports as apps
from bai.common.background import cancel_and_wait
from bai.common.problems import invalid
from bai.node.link.streams import MAX_FRAME, LinkStream, StreamClosed
from bai.node.manager.http.context import SETTINGS, services_of, session_of
from bai.node.manager.http.terminal_routes import ended

log = logging.getLogger("bai.api.apps")
# The largest client frame taken (bigger: closed with 1009). bai's CLI sends what one read of its local
# connection gives (at most bai.cli.apps.READ_SIZE, 256 KiB); the official client reads up to 16 MiB a time
# but an asyncio stream hands over at most what it buffered (its 64 KiB limit x 2 plus one socket read of
# 256 KiB): 1 MiB takes both with room and bounds what one frame makes the manager buffer.
MAX_MESSAGE = 1024 * 1024
APP_IDLE_TIMEOUT = 3600.0  # seconds without a byte either way: the tunnel is closed ([manager] app_idle_timeout)


async def list_apps(request: web.Request) -> web.Response:
    row = await session_of(request)
    return web.json_response(await services_of(request).apps.listed(row))


async def start_app(request: web.Request) -> web.Response:
    row = await session_of(request)
    name = request.match_info["app"]
    if not apps.NAME.fullmatch(name):
        raise invalid(f"{name[:80]!r} is not an app name")
    service = services_of(request).apps
    kernel, sp, started = await service.start(row, name)
    token = service.token(kernel, sp.name)
    reply = {"app": sp.name, "started": started, "token": token, "url_template": apps.to_api(sp, token)["url_template"]}
    return web.json_response(reply)


def app_query(request: web.Request) -> str:
    """The app a proxy request names (a 400 when it names none, or asks for what bai cannot do)."""
    name = request.query.get("app", "")
    if not name:
        raise invalid("app is required: the name of one of the session's apps (see /stream/session/{ref}/apps)")
    if not apps.NAME.fullmatch(name):
        raise invalid(f"app: {name[:80]!r} is not an app name")
    for key in ("arguments", "envs"):
        raw = request.query.get(key)
        if raw is None:
            continue
        try:
            value = safejson.loads(raw, max_bytes=64 * 1024, what=key)
        except ValueError:
            raise invalid(f"{key} must be a JSON object") from None
        if not isinstance(value, dict):
            raise invalid(f"{key} must be a JSON object")
        if value:
            raise invalid(f"{key}: bai starts apps as their image defines them; custom {key} are not supported")
    return name


async def proxy(request: web.Request) -> web.StreamResponse:
    services = services_of(request)
    row = await session_of(request)
    name = app_query(request)
    ws = web.WebSocketResponse(heartbeat=30.0, max_msg_size=MAX_MESSAGE + 1)  # aiohttp refuses sizes >= it
    if not ws.can_prepare(request).ok:
        raise invalid("the app proxy is a WebSocket: connect with an Upgrade: websocket request")
    kernel = await services.apps.ensure_started(row, name)  # 4xx before the upgrade
    stream = await services.apps.open_tunnel(row, kernel, name)
    try:
        await ws.prepare(request)
        idle = float(request.app[SETTINGS].get("app_idle_timeout") or APP_IDLE_TIMEOUT)
        why = await relay(ws, stream, idle)
        if why is not None:
            over = await ended(services.state, row.id)
            await say_and_close(ws, over or why, WSCloseCode.GOING_AWAY if over else WSCloseCode.INTERNAL_ERROR)
    finally:
        await stream.close("the client went away")
        if not ws.closed:
            with contextlib.suppress(Exception):
                await ws.close()
    return ws


async def say_and_close(ws: web.WebSocketResponse, reason: str, code: int) -> None:
    with contextlib.suppress(Exception):
        await ws.send_json({"type": "error", "data": reason})
        await ws.close(code=code, message=reason.encode()[:120])


async def relay(ws: web.WebSocketResponse, stream: LinkStream, idle_timeout: float = 0.0) -> str | None:
    """Client frames to the stream, the app's bytes to the client, until either side ends or (with an
    `idle_timeout`) no byte went either way for that long. Returns why the tunnel ended under the client
    (None: an ordinary end)."""
    loop = asyncio.get_running_loop()
    last = loop.time()

    async def upstream() -> None:
        nonlocal last
        async for msg in ws:
            last = loop.time()
            if msg.type == WSMsgType.BINARY:
                data = msg.data
                for i in range(0, len(data), MAX_FRAME):
                    await stream.send({"t": "data", "d": data[i : i + MAX_FRAME]})
            elif msg.type == WSMsgType.TEXT:  # some clients send text: the bytes of it
                await stream.send({"t": "data", "d": msg.data.encode()})
        with contextlib.suppress(StreamClosed):
            await stream.send({"t": "eof"})

    async def downstream() -> str | None:
        nonlocal last
        while (frame := await stream.receive()) is not None:
            last = loop.time()
            if frame.get("t") == "data":
                data, frame = coalesced(stream, frame.get("d") or b"")
                if data:
                    await ws.send_bytes(data)
                if frame is None:
                    continue
            if frame.get("t") == "eof":
                return None  # the app closed the connection: so does the client's
        return stream.closed_reason or None

    async def quiet() -> str:
        while (left := last + idle_timeout - loop.time()) > 0:  # noqa: ASYNC110 (a deadline that moves)
            await asyncio.sleep(left)
        return f"the tunnel was idle for {idle_timeout:g} seconds (no byte either way): closed"

    up = asyncio.create_task(upstream(), name="app-up")
    down = asyncio.create_task(downstream(), name="app-down")
    tasks = {up, down}
    watch = asyncio.create_task(quiet(), name="app-idle") if idle_timeout > 0 else None
    if watch is not None:
        tasks.add(watch)
    try:
        # the client closed its WebSocket (a WebSocket cannot be half-closed), or the app's side ended
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        if watch is not None and watch.done():
            return watch.result()
        if down.done() and not down.cancelled() and down.exception() is None:
            return down.result()
        return None
    finally:
        await cancel_and_wait(*tasks)


def coalesced(stream: LinkStream, data: bytes) -> tuple[bytes, dict[str, Any] | None]:
    """`data` and the data frames already waiting behind it (up to MAX_FRAME bytes), as one WebSocket message,
    and the frame after them that is not data (None: none waits). An app writes a reply in several pieces
    (sshd: a packet each); sent as one message, the client hands them on in one write, with one frame's work
    on either side instead of one per piece."""
    parts = [data]
    size = len(data)
    while size < MAX_FRAME and (frame := stream.waiting()) is not None:
        if frame.get("t") != "data":
            return b"".join(parts), frame
        piece = frame.get("d") or b""
        parts.append(piece)
        size += len(piece)
    return b"".join(parts), None


def add_app_routes(app: web.Application) -> None:
    app.router.add_get("/stream/session/{ref}/apps", list_apps)
    app.router.add_post("/stream/session/{ref}/apps/{app}/start", start_app)
    app.router.add_get("/stream/session/{ref}/tcpproxy", proxy)
    app.router.add_get("/stream/session/{ref}/httpproxy", proxy)
