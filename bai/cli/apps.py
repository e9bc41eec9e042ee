"""`bai session app NAME APP`: a local listener whose every connection is tunnelled to an app in the
session (a WebSocket through the manager: `GET /stream/session/{id}/tcpproxy?app=APP`), as Backend.AI's
`backend.ai app` does. It serves until Ctrl-C, or until the session ends (then it says why and exits 1).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import socket
import sys
from dataclasses import dataclass
from typing import Any

READ_SIZE = 256 * 1024


def parse_bind(text: str | None, default_port: int) -> tuple[str, int]:
    """`HOST:PORT`, `PORT` or `HOST` → (host, port) (port 0: any free one); ValueError with a sentence."""
    if not text:
        return "127.0.0.1", default_port
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = ("127.0.0.1", text) if text.isdigit() else (text, str(default_port))
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--bind {text!r}: the port must be a number from 0 to 65535")
    return host, int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def app_url(app: dict[str, Any], host: str, port: int) -> str:
    template = str(app.get("url_template") or "{protocol}://{host}:{port}")
    protocol = "http" if app.get("protocol") in ("http", "preopen") else "tcp"
    shown = f"[{host}]" if ":" in host else host
    return template.replace("{protocol}", protocol).replace("{host}", shown).replace("{port}", str(port))


class AppProxy:
    """Listens on (host, port); each connection gets its own tunnel to the app."""

    def __init__(self, client: Any, session: dict[str, Any], app: str, out=None) -> None:
        self.client = client
        self.session = session
        self.app = app
        self.out = out or sys.stderr
        self.ended: asyncio.Future[str] = asyncio.get_running_loop().create_future()  # why the session ended
        self.connections = 0
        self.tunnels: set[Any] = set()  # the WebSockets of the connections open now
        self.handlers: set[asyncio.Task[Any]] = set()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self.handlers.add(task)
            task.add_done_callback(self.handlers.discard)
        await self._handle(reader, writer)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        import aiohttp

        self.connections += 1
        try:
            ws = await self.client.app_tunnel(self.session["id"], self.app)
        except Exception as e:  # the session ended meanwhile, the manager is gone: this connection fails
            print(f"cannot open a tunnel to {self.app}: {e}", file=self.out)
            writer.close()
            return
        self.tunnels.add(ws)

        async def upstream() -> None:
            while data := await reader.read(READ_SIZE):
                await ws.send_bytes(data)

        async def downstream() -> None:
            why = ""
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.BINARY:
                    writer.write(msg.data)
                    await writer.drain()
                elif msg.type == aiohttp.WSMsgType.TEXT:
                    with contextlib.suppress(ValueError, AttributeError):
                        frame = json.loads(msg.data)
                        if frame.get("type") == "error":
                            why = str(frame.get("data") or "")
            if why:  # the server said why the tunnel ended, then closed with 1001 when the session ended
                self._said(why, ws.close_code == aiohttp.WSCloseCode.GOING_AWAY)

        up = asyncio.create_task(upstream())
        down = asyncio.create_task(downstream())
        try:
            await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
            if up.done() and not down.done():
                # the local client is done sending: let the app finish its answer, then close
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.shield(down), 30)
        finally:
            for task in (up, down):
                task.cancel()
            for task in (up, down):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            self.tunnels.discard(ws)
            with contextlib.suppress(Exception):
                await ws.close()
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def close(self, timeout: float = 5.0) -> None:
        """End the connections open now: their tunnels close, then each ends as when the app closes it."""
        for ws in list(self.tunnels):
            with contextlib.suppress(Exception):
                await ws.close()
        if self.handlers:
            await asyncio.wait(set(self.handlers), timeout=timeout)

    def _said(self, why: str, session_over: bool) -> None:
        if session_over:
            if not self.ended.done():
                self.ended.set_result(why)
        else:
            print(f"tunnel to {self.app}: {why}", file=self.out)


def app_port(app: dict[str, Any], host: str) -> int:
    """Where to listen for an app by default: its own port when that is free on host, else 0 (any free one)."""
    wanted = int((app.get("ports") or [0])[0])
    return wanted if wanted and port_is_free(host, wanted) else 0


@dataclass
class Forward:
    """An app of a session forwarded to a local listener: `url` opens it, `ended` resolves with the reason
    when the session ends (see `watch_session`), `close()` stops listening and ends open connections."""

    server: asyncio.Server
    proxy: AppProxy
    url: str
    started: bool  # the app was started for this forward (else it ran already)

    @property
    def ended(self) -> asyncio.Future[str]:
        return self.proxy.ended

    async def close(self) -> None:
        self.server.close()
        await self.proxy.close()


async def open_forward(
    client: Any, session: dict[str, Any], app: dict[str, Any], host: str, port: int, out=None
) -> Forward:
    """Start the app (an APIError with its output when it fails) and listen on host:port (port 0: any free
    one; an OSError when it cannot), tunnelling every connection to the app; what goes wrong with a
    connection later is written to `out` (stderr by default). Used by `bai session app` and `bai tui`."""
    started = await client.start_app(session["id"], app["name"])
    proxy = AppProxy(client, session, app["name"], out)
    server = await asyncio.start_server(proxy.handle, host, port)
    port = server.sockets[0].getsockname()[1]
    return Forward(server, proxy, app_url(app, host, port), bool(started.get("started")))


async def serve_app(client: Any, session: dict[str, Any], app_name: str, bind: str | None) -> int:
    """Start the app, listen, print the URL, tunnel connections until Ctrl-C (0) or the session ends (1)."""
    from bai.client.api import APIError

    offered = await client.apps(session["id"])
    app = next((a for a in offered if a.get("name") == app_name), None)
    if app is None:
        names = ", ".join(a.get("name", "?") for a in offered) or "none (its image declares no apps)"
        print(f"session {session['name']} offers no app {app_name!r}; its apps: {names}", file=sys.stderr)
        return 1
    try:
        host, port = parse_bind(bind, 0)
    except ValueError as e:
        print(str(e), file=sys.stderr)
        return 2
    if bind is None:  # the app's own port when it is free here, else any free one
        port = app_port(app, host)
    print(f"starting {app_name} in session {session['name']}...", file=sys.stderr, flush=True)
    try:
        forward = await open_forward(client, session, app, host, port)
    except APIError as e:
        print(e.msg or f"{app_name} did not start: {e.title}", file=sys.stderr)
        return 1
    except OSError as e:
        why = e.strerror or e
        print(f"cannot listen on {host}:{port}: {why} (choose another with --bind HOST:PORT)", file=sys.stderr)
        return 1
    if not is_loopback(host):
        print(
            f"warning: listening on {host}, not 127.0.0.1: anyone who reaches this address uses {app_name} as you",
            file=sys.stderr,
        )
    state = "started" if forward.started else "running"
    print(f"{app_name} is {state}; open it at:", file=sys.stderr)
    print(forward.url, flush=True)
    print("(Ctrl-C stops the tunnel; the app keeps running in the session)", file=sys.stderr, flush=True)
    async with forward.server:
        watch = asyncio.create_task(watch_session(client, session, forward.proxy))
        try:
            why = await forward.ended
        finally:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watch
    print(f"the tunnel to {app_name} closed: {why}", file=sys.stderr)
    return 1


async def watch_session(client: Any, session: dict[str, Any], proxy: AppProxy, every: float = 2.0) -> None:
    """End the proxy when the session ends, even while no connection is open."""
    from bai.client.api import APIError

    while not proxy.ended.done():
        await asyncio.sleep(every)
        try:
            current = await client.get_session(session["id"])
        except APIError as e:
            if e.status == 404 and not proxy.ended.done():
                proxy.ended.set_result(f"session {session['name']} is gone")
            continue
        except Exception:
            continue  # the manager is unreachable for a moment: keep serving
        if current.get("status") not in ("RUNNING", "RUNNING_DEGRADED") and not proxy.ended.done():
            info = f" ({current['statusInfo']})" if current.get("statusInfo") else ""
            proxy.ended.set_result(f"session {session['name']} ended{info}")
