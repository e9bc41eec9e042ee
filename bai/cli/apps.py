"""`bai session app NAME APP`: a local listener whose every connection is tunnelled to an app in the
session (a WebSocket through the manager: `GET /stream/session/{id}/tcpproxy?app=APP`), as Backend.AI's
`backend.ai app` does. It serves until Ctrl-C, or until the session ends (then it says why and exits 1).

Users of a host share its loopback, so the listener lets in only who has the URL it printed: for an HTTP
app the first request of each connection must carry the app's token (`?token=`, an `Authorization: token`
header, or the cookie the listener then sets) before a tunnel is opened; anything else gets a 403 page
saying so (`Gate`). The token is the app's own secret when it has one (Jupyter is started with it, so its
own login accepts the same URL), else one made for this listener. TCP apps cannot be gated this way: their
own authentication (sshd's keys) is what protects them, and the CLI says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import secrets
import socket
import sys
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from bai.common.service_ports import with_token

READ_SIZE = 256 * 1024
HEAD_LIMIT = 64 * 1024  # bytes of a connection's first request head the gate reads (more: 431, closed)
HEAD_TIMEOUT = 30.0  # seconds a new connection has to send its first request head (then: 408, closed)
MAX_WAITING = 64  # connections sending their first head at once; more are closed at once (a flood of idle
# connections costs a few file descriptors, never a tunnel)
STATUS_LINE_LIMIT = 8 * 1024  # bytes of the app's first response buffered to add the gate's cookie


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


def new_token() -> str:
    """A secret for a listener whose app has none of its own (32 URL-safe characters)."""
    return secrets.token_urlsafe(24)


def _response(status: str, body: str, extra: str = "") -> bytes:
    data = body.encode()
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {len(data)}\r\n"
        f"Cache-Control: no-store\r\nConnection: close\r\n{extra}\r\n"
    )
    return head.encode() + data


class Gate:
    """Who may use an HTTP app's local listener: a connection whose first request carries the token (query
    `token=`, header `Authorization: token T`, or the cookie `bai-app-PORT`, set on the first answer to a
    request that had it some other way). Refused connections never open a tunnel."""

    def __init__(self, token: str, app: str) -> None:
        self.token = token
        self.app = app
        self.port = 0  # the listener's, once it listens (the cookie's name: cookies do not tell ports apart)
        self.waiting = 0  # connections sending their first head now
        self.refused = 0  # connections refused so far

    @property
    def cookie(self) -> str:
        return f"bai-app-{self.port}"

    def set_cookie(self) -> str:
        return f"{self.cookie}={self.token}; Path=/; HttpOnly; SameSite=Lax"

    def _matches(self, value: str) -> bool:
        return hmac.compare_digest(value.strip().encode(), self.token.encode())

    def how(self, head: bytes) -> str | None:
        """How the request head carries the token ("cookie", "query", "header"), "" when it does not; None
        when it is no HTTP request."""
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return None
        found = ""
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "cookie":
                for item in value.split(";"):
                    key, _, got = item.strip().partition("=")
                    if key == self.cookie and self._matches(got):
                        return "cookie"
            elif name == "authorization":
                scheme, _, got = value.strip().partition(" ")
                if scheme.lower() in ("token", "bearer") and self._matches(got):
                    found = "header"
        if not found:
            query = parts[1].partition("?")[2].partition("#")[0]  # (not urlsplit: "//[" is a ValueError to it)
            if any(self._matches(t) for t in parse_qs(query).get("token", [])):
                found = "query"
        return found

    async def admit(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[bytes, str] | None:
        """Read the connection's first request head (bounded in size and time) and judge it: (the bytes read,
        a Set-Cookie value to add to the app's first answer or ""), or None when it was refused (answered
        with why, or simply closed when it sent nothing)."""
        if self.waiting >= MAX_WAITING:
            self.refused += 1
            return None
        self.waiting += 1
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        except TimeoutError:
            await self._refuse(writer, "408 Request Timeout", "No request came in time.")
            return None
        except (asyncio.LimitOverrunError, ValueError):
            await self._refuse(writer, "431 Request Header Fields Too Large", "The request head is too large.")
            return None
        finally:
            self.waiting -= 1
        how = self.how(head)
        if how is None:
            await self._refuse(writer, "400 Bad Request", f"{self.app} is an HTTP app: this was no HTTP request.")
            return None
        if not how:
            await self._refuse(
                writer,
                "403 Forbidden",
                f"This port forwards the app {self.app} of a bai session to its owner only. Open the URL that "
                f"<code>bai session app</code> printed when it started (it ends in <code>?token=...</code>).",
            )
            return None
        return head, "" if how == "cookie" else self.set_cookie()

    async def _refuse(self, writer: asyncio.StreamWriter, status: str, text: str) -> None:
        self.refused += 1
        page = f"<!doctype html><title>{status}</title><h1>{status}</h1><p>{text}</p>\n"
        with contextlib.suppress(Exception):
            writer.write(_response(status, page))
            await asyncio.wait_for(writer.drain(), 5)


def add_cookie(head: bytes, set_cookie: str) -> bytes:
    """The app's first answer with the gate's Set-Cookie header after its status line (unchanged when it
    does not start like an HTTP/1 response)."""
    cut = head.find(b"\r\n")
    if cut < 0 or not head.startswith(b"HTTP/1."):
        return head
    return head[: cut + 2] + f"Set-Cookie: {set_cookie}\r\n".encode() + head[cut + 2 :]


class AppProxy:
    """Listens on (host, port); each connection gets its own tunnel to the app (once `gate`, when there
    is one, admits it)."""

    def __init__(self, client: Any, session: dict[str, Any], app: str, out=None, gate: Gate | None = None) -> None:
        self.client = client
        self.session = session
        self.app = app
        self.out = out or sys.stderr
        self.gate = gate
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

        first, cookie = b"", ""
        if self.gate is not None:
            admitted = await self.gate.admit(reader, writer)
            if admitted is None:
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()
                return
            first, cookie = admitted
        self.connections += 1
        try:
            ws = await self.client.app_tunnel(self.session["id"], self.app)
        except Exception as e:  # the session ended meanwhile, the manager is gone: this connection fails
            print(f"cannot open a tunnel to {self.app}: {e}", file=self.out)
            writer.close()
            return
        self.tunnels.add(ws)

        async def upstream() -> None:
            if first:
                await ws.send_bytes(first)
            while data := await reader.read(READ_SIZE):
                await ws.send_bytes(data)

        async def downstream() -> None:
            why = ""
            held, pending = b"", cookie  # the app's first bytes, until its status line is whole
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.BINARY:
                    data = msg.data
                    if pending:
                        held += data
                        if b"\r\n" not in held and len(held) < STATUS_LINE_LIMIT:
                            continue
                        data, held, pending = add_cookie(held, pending), b"", ""
                    writer.write(data)
                    await writer.drain()
                elif msg.type == aiohttp.WSMsgType.TEXT:
                    with contextlib.suppress(ValueError, AttributeError):
                        frame = json.loads(msg.data)
                        if frame.get("type") == "error":
                            why = str(frame.get("data") or "")
            if held:
                writer.write(held)
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
    url: str  # with the token that opens it, for an HTTP app
    started: bool  # the app was started for this forward (else it ran already)
    token: str = ""  # what the listener asks for (HTTP apps; the app's own secret when it has one)

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
    http = app.get("protocol") in ("http", "preopen")
    token = str(started.get("token") or "")
    gate = Gate(token or new_token(), app["name"]) if http else None
    proxy = AppProxy(client, session, app["name"], out, gate)
    server = await asyncio.start_server(proxy.handle, host, port, limit=HEAD_LIMIT)
    port = server.sockets[0].getsockname()[1]
    template = str(started.get("url_template") or app.get("url_template") or "")
    url = app_url({**app, "url_template": template}, host, port)
    if gate is not None:
        gate.port = port
        url = with_token(url, gate.token)
    return Forward(server, proxy, url, bool(started.get("started")), gate.token if gate else token)


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
    if forward.proxy.gate is None:
        print(
            f"note: {app_name} is a TCP app: bai cannot tell who connects to {forward.url.rpartition('/')[2]}; "
            "other users of this host reach it as you unless it asks them to log in itself",
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
