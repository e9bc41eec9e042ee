"""Bounds on the HTTP server's connections (what aiohttp does not bound on its own).

- header timeout: a connection must send a complete request head within `header_timeout` seconds of
  connecting (or of its first byte after a response); else it is answered 408 and closed. aiohttp has no
  such timer (its keep-alive timer starts at a response's end and is not reset by bytes), so a slowloris or
  a connect-and-wait client held a file descriptor for an hour (its default keep-alive of 3630 s).
- idle timeout: a kept-alive connection with no request in progress is closed after `idle_timeout`
  seconds (aiohttp's keepalive_timeout). A request being served (an SSE stream, a WebSocket, a download)
  is never cut by either timer: both only act while the connection waits for a request head.
- caps: at most `max_connections_per_peer` connections from one address and `max_connections` in all
  (0: derived from RLIMIT_NOFILE, leaving room for the agent, the store and kernels). A new connection over
  a cap first makes room by closing the oldest connection of that address (or, for the total cap, of any)
  that is only waiting (for its first request head or, kept alive, for its next one): so idle connections,
  which cost a client nothing to open, can never lock out a client that sends its request at once, even
  from the same address (on a shared node every local user is 127.0.0.1). Only when every connection over
  the cap is serving a request is the new one answered 503 (a problem body with Retry-After) and closed at
  once, without a request being read.
- bad requests (a malformed request line or header) are answered 400 by aiohttp; instead of its ERROR
  line with a traceback each, they are logged as a one-line warning at most once per LOG_EVERY seconds
  (with the count of those not logged), so that an unauthenticated client cannot fill the log.

`LimitedTCPSite` is a `web.TCPSite` whose protocol factory makes `LimitedRequestHandler`s (a subclass of
aiohttp's RequestHandler that uses only its documented constructor and a few attributes of
aiohttp 3.9-3.14: `_waiter`, `_request_count`, `force_close`, `transport`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

from bai.common.logs import LOG_EVERY, LogThrottle

log = logging.getLogger("bai.http")

HEADER_TIMEOUT = 10.0  # seconds to send a complete request head
IDLE_TIMEOUT = 60.0  # seconds a kept-alive connection may wait for its next request
MAX_CONNECTIONS_PER_PEER = 512  # open connections from one address (a browser opens 6-10, a CLI 1)
NOFILE_RESERVE = 1024  # file descriptors kept for the store, the agent link, kernels and logs
NOFILE_SHARE = 0.5  # of the rest, the share HTTP connections may hold
MAX_CONNECTIONS_CEILING = 65536
MIN_CONNECTIONS = 64


def raise_nofile() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard one (as far as the kernel allows); the (soft, hard) after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as e:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, target, e)
    return soft, hard


def connections_for(nofile: int) -> int:
    """The total connection cap an open-file limit leaves room for."""
    return max(MIN_CONNECTIONS, min(MAX_CONNECTIONS_CEILING, int((nofile - NOFILE_RESERVE) * NOFILE_SHARE)))


class _RateLog:
    """One LogThrottle per kind of line (refusals, bad requests, timeouts, evictions): each logged once per
    burst, then counted at most every LOG_EVERY seconds."""

    def __init__(self) -> None:
        self._by_kind: dict[str, LogThrottle] = {}

    def warning(self, kind: str, msg: str, *args: Any) -> None:
        throttle = self._by_kind.get(kind)
        if throttle is None:
            throttle = self._by_kind[kind] = LogThrottle(log, LOG_EVERY)
        throttle(logging.WARNING, msg, *args)


@dataclass
class HttpLimits:
    """The bounds, and the count of open connections per peer address (shared by every handler)."""

    header_timeout: float = HEADER_TIMEOUT
    idle_timeout: float = IDLE_TIMEOUT
    max_connections: int = 0  # 0: connections_for(RLIMIT_NOFILE)
    max_connections_per_peer: int = MAX_CONNECTIONS_PER_PEER
    by_peer: Counter[str] = field(default_factory=Counter)
    total: int = 0
    refused: int = 0  # connections refused over a cap, since the start (for tests and metrics)
    evicted: int = 0  # waiting connections closed to make room for a new one
    # the open connections, oldest first: all of them, and per peer address (eviction looks for a waiting one)
    open: dict[Any, None] = field(default_factory=dict)
    open_by_peer: dict[str, dict[Any, None]] = field(default_factory=dict)
    timed_out: int = 0  # connections closed at the header timeout
    rate_log: _RateLog = field(default_factory=_RateLog)

    @classmethod
    def from_config(cls, node: dict[str, Any]) -> HttpLimits:
        """From the [node] table (keys http_header_timeout, http_idle_timeout, http_max_connections,
        http_max_connections_per_peer); ValueError with a sentence when a value is out of range."""
        limits = cls(
            header_timeout=float(node.get("http_header_timeout", HEADER_TIMEOUT)),
            idle_timeout=float(node.get("http_idle_timeout", IDLE_TIMEOUT)),
            max_connections=int(node.get("http_max_connections", 0)),
            max_connections_per_peer=int(node.get("http_max_connections_per_peer", MAX_CONNECTIONS_PER_PEER)),
        )
        if not 0.1 <= limits.header_timeout <= 3600 or not 0.1 <= limits.idle_timeout <= 86400:
            raise ValueError("[node] http_header_timeout and http_idle_timeout must be seconds (0.1-3600, 0.1-86400)")
        if limits.max_connections < 0 or limits.max_connections_per_peer < 1:
            raise ValueError("[node] http_max_connections must be 0 (derived) or more, and the per-peer cap 1 or more")
        return limits

    def resolve(self, nofile: int) -> None:
        """Fill in the derived total cap from the open-file limit."""
        if self.max_connections == 0:
            self.max_connections = connections_for(nofile)

    def admit(self, peer: str, handler: Any = None) -> str | None:
        """Count a new connection from `peer` (its `handler`), making room over a cap by closing the oldest
        waiting connection there; or say why it is refused (then nothing is counted)."""
        if self.max_connections and self.total >= self.max_connections and not self._evict(self.open):
            return f"the server has {self.total} connections open, its limit, all of them serving requests"
        if self.by_peer[peer] >= self.max_connections_per_peer and not self._evict(self.open_by_peer.get(peer, {})):
            return f"{peer} has {self.by_peer[peer]} connections open, the limit per address, all serving requests"
        self.by_peer[peer] += 1
        self.total += 1
        if handler is not None:
            self.open[handler] = None
            self.open_by_peer.setdefault(peer, {})[handler] = None
        return None

    def release(self, peer: str, handler: Any = None) -> None:
        self.total -= 1
        self.by_peer[peer] -= 1
        if self.by_peer[peer] <= 0:
            del self.by_peer[peer]
        if handler is not None:
            self.open.pop(handler, None)
            mine = self.open_by_peer.get(peer)
            if mine is not None:
                mine.pop(handler, None)
                if not mine:
                    del self.open_by_peer[peer]

    def _evict(self, pool: dict[Any, None]) -> bool:
        """Close the oldest connection of `pool` that is only waiting; whether there was one."""
        for handler in pool:
            if handler.waiting():
                handler.evict()
                self.evicted += 1
                return True
        return False


def _refusal(status: int, reason: str, title: str, msg: str) -> bytes:
    body = json.dumps({"type": "https://api.backend.ai/probs/generic-bad-request", "title": title, "msg": msg}).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/problem+json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n"
    )
    if status == 503:
        head += "Retry-After: 1\r\n"
    return head.encode() + b"\r\n" + body


class LimitedRequestHandler(RequestHandler):
    """aiohttp's RequestHandler with a header timeout, per-peer and total caps and quiet bad requests."""

    def __init__(self, *args: Any, limits: HttpLimits, **kwargs: Any) -> None:
        super().__init__(*args, keepalive_timeout=limits.idle_timeout, **kwargs)
        self._limits = limits
        self._peer: str | None = None  # set once counted (released when the connection goes)
        self._refused = False
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peername = transport.get_extra_info("peername")
        peer = str(peername[0]) if isinstance(peername, tuple) and peername else str(peername or "unix")
        why = self._limits.admit(peer, self)
        if why is not None:  # refused before aiohttp sees it: nothing is read, nothing is registered
            self._refused = True
            self._limits.refused += 1
            self._limits.rate_log.warning("refused", "refused a connection from %s: %s", peer, why)
            msg = f"too many connections ({why}); try again later"
            transport.write(_refusal(503, "Service Unavailable", "Too many connections.", msg))  # type: ignore[attr-defined]
            transport.close()
            return
        self._peer = peer
        super().connection_made(transport)
        self._start_head_timer()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._refused:
            return
        if self._peer is not None:
            self._limits.release(self._peer, self)
            self._peer = None
        self._stop_head_timer()
        super().connection_lost(exc)

    def waiting(self) -> bool:
        """Whether the connection only waits: for its first request head, or (kept alive) for the next."""
        if self._messages or self.transport is None:
            return False
        return self._request_count == 0 or (self._waiter is not None and not self._waiter.done())

    def evict(self) -> None:
        """Closed to make room for a new connection (it was only waiting): its place is free at once."""
        if self._peer is not None:
            self._limits.release(self._peer, self)
            self._limits.rate_log.warning(
                "evicted", "closed a waiting connection from %s to make room for a new one", self._peer
            )
            self._peer = None
        self._stop_head_timer()
        self.force_close()
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._head_timer is None and self._waiter is not None and not self._waiter.done():
            self._start_head_timer()  # the first byte of a head after a response: the head's clock starts
        requests = self._request_count
        super().data_received(data)
        if self._request_count != requests:  # a complete head (or a bad one, answered 400) arrived
            self._stop_head_timer()

    def _start_head_timer(self) -> None:
        self._stop_head_timer()
        self._head_timer = asyncio.get_running_loop().call_later(self._limits.header_timeout, self._head_timeout)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self.transport is None or (self._waiter is not None and self._waiter.done()):
            return
        if self._waiter is None and self._request_count:  # a request is being served: never cut it
            return
        self._limits.timed_out += 1
        self._limits.rate_log.warning(
            "header-timeout",
            "closed a connection from %s: no complete request head in %.1f s",
            self._peer,
            self._limits.header_timeout,
        )
        msg = f"no complete request head within {self._limits.header_timeout:g} seconds"
        self.transport.write(_refusal(408, "Request Timeout", "Request timeout.", msg))
        self.force_close()

    def log_exception(self, *args: Any, **kw: Any) -> None:
        exc = kw.get("exc_info")
        if isinstance(exc, HttpProcessingError):  # a malformed request: the client's fault, answered 400
            self._limits.rate_log.warning(
                "bad-request",
                "bad request from %s: %s",
                self._peer,
                (getattr(exc, "message", "") or type(exc).__name__).splitlines()[0][:200],
            )
            return
        super().log_exception(*args, **kw)


class LimitedTCPSite(web.TCPSite):
    """A TCPSite whose connections are `LimitedRequestHandler`s sharing one `HttpLimits`."""

    __slots__ = ("_limits",)

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *, limits: HttpLimits, **kwargs: Any) -> None:
        super().__init__(runner, host, port, **kwargs)
        self._limits = limits

    async def start(self) -> None:
        self._runner._reg_site(self)  # what BaseSite.start does
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        limits = self._limits

        def factory() -> LimitedRequestHandler:
            return LimitedRequestHandler(server, loop=loop, limits=limits, **server._kwargs)

        self._server = await loop.create_server(
            factory,
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
            ssl_handshake_timeout=limits.header_timeout if self._ssl_context else None,
        )
        if self._server.sockets:
            self._bound_port = self._server.sockets[0].getsockname()[1]
        else:
            self._bound_port = self._port
