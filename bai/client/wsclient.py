"""A small WebSocket client (RFC 6455) on asyncio's streams: the standard library only.

bai's CLI streams a run's output over a WebSocket; aiohttp, which could open it, takes about a third of a
second to import, longer than the rest of a short `bai session run`. This client is what that stream
needs and no more: the opening handshake (Sec-WebSocket-Key sent, Sec-WebSocket-Accept checked; no
subprotocol, no extension), masked client frames, text, binary, ping (answered), pong and close
frames, fragmented messages, and the closing handshake. The caller signs the request (`headers`).

Failures: `HandshakeRefused` (the server answered the upgrade with another status: its body says why),
`HandshakeError` (a 101 that is not a WebSocket's, e.g. a wrong Sec-WebSocket-Accept), `ProtocolError`
(a frame the protocol forbids: the connection is closed with 1002, 1007 or 1009 as RFC 6455 says). An
`OSError` is what the connection itself raised (refused, reset, a TLS failure).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import enum
import hashlib
import os
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455 §1.3
MAX_HEADERS = 64 * 1024  # bytes of the handshake answer's status line and headers
MAX_REFUSAL_BODY = 64 * 1024  # bytes of a refusal's body kept for its message
REFUSAL_WAIT = 5.0  # seconds to read a refusal's body
CLOSE_WAIT = 2.0  # seconds `close` waits for the server's close frame before it drops the connection


class Opcode(enum.IntEnum):
    CONTINUATION = 0x0
    TEXT = 0x1
    BINARY = 0x2
    CLOSE = 0x8
    PING = 0x9
    PONG = 0xA


class CloseCode(enum.IntEnum):
    NORMAL = 1000
    GOING_AWAY = 1001
    PROTOCOL_ERROR = 1002
    NO_STATUS = 1005  # (never sent: a close frame without a code)
    ABNORMAL = 1006  # (never sent: the connection ended without a close frame)
    INVALID_DATA = 1007
    TOO_BIG = 1009


class WebSocketError(Exception):
    """Base of this module's errors."""


class HandshakeRefused(WebSocketError):
    """The server answered the upgrade request with an HTTP status other than 101."""

    def __init__(self, status: int, reason: str, body: bytes) -> None:
        super().__init__(f"the server refused the WebSocket: HTTP {status} {reason}")
        self.status = status
        self.reason = reason
        self.body = body


class HandshakeError(WebSocketError):
    """The server answered 101, but not as a WebSocket server does (the connection is closed)."""


class ProtocolError(WebSocketError):
    """The server sent what RFC 6455 forbids; `code` is the close code the connection was closed with."""

    def __init__(self, msg: str, code: CloseCode = CloseCode.PROTOCOL_ERROR) -> None:
        super().__init__(msg)
        self.code = code


@dataclass(frozen=True, slots=True)
class Message:
    """One whole (reassembled) data message: TEXT (data is str) or BINARY (data is bytes)."""

    kind: Opcode
    data: str | bytes


def accept_for(key: str) -> str:
    """The Sec-WebSocket-Accept a server answers to `key` (RFC 6455 §4.2.2)."""
    return base64.b64encode(hashlib.sha1((key + GUID).encode(), usedforsecurity=False).digest()).decode()


def mask(payload: bytes, key: bytes) -> bytes:
    """`payload` XOR the repeated 4-byte `key` (masking and unmasking are the same)."""
    n = len(payload)
    if not n:
        return b""
    repeated = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "little") ^ int.from_bytes(repeated, "little")).to_bytes(n, "little")


def encode_frame(opcode: Opcode, payload: bytes, fin: bool = True, mask_key: bytes | None = None) -> bytes:
    """One client frame (masked with `mask_key`, a fresh random one when None)."""
    key = mask_key if mask_key is not None else os.urandom(4)
    head = bytearray([(0x80 if fin else 0) | opcode])
    n = len(payload)
    if n < 126:
        head.append(0x80 | n)
    elif n < 1 << 16:
        head.append(0x80 | 126)
        head += struct.pack("!H", n)
    else:
        head.append(0x80 | 127)
        head += struct.pack("!Q", n)
    return bytes(head) + key + mask(payload, key)


def _header_lines(raw: bytes) -> tuple[int, str, dict[str, str]]:
    """(status, reason, headers by lower-case name; repeated ones joined with ", ") of an HTTP answer's head."""
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise HandshakeError(f"the server did not answer with HTTP/1.1: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise HandshakeError(f"a malformed header line in the server's answer: {line[:80]!r}")
        key = name.strip().lower()
        headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
    return int(parts[1]), parts[2] if len(parts) > 2 else "", headers


def _sendable(code: int) -> bool:
    """A close code a peer may send (RFC 6455 §7.4: the registered ones, 3000-4999 for others)."""
    return 1000 <= code <= 1014 and code not in (1004, 1005, 1006) or 3000 <= code <= 4999


def _tokens(value: str) -> set[str]:
    return {t.strip().lower() for t in value.split(",")}


class WebSocket:
    """An open client WebSocket: `send_text`, `send_bytes`, `receive` (or iterate), `close`."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, max_size: int | None) -> None:
        self._reader = reader
        self._writer = writer
        self.max_size = max_size  # bytes of one message (None: no bound)
        self.close_code: int | None = None  # the server's close code once the connection has ended
        self.close_reason = ""
        self._close_sent = False
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    # -- sending -----------------------------------------------------------------------------------

    async def _send(self, opcode: Opcode, payload: bytes) -> None:
        if self._close_sent:
            raise ConnectionResetError("the WebSocket is closing")
        self._writer.write(encode_frame(opcode, payload))  # (one write: frames never interleave)
        await self._writer.drain()

    async def send_text(self, text: str) -> None:
        await self._send(Opcode.TEXT, text.encode())

    async def send_bytes(self, data: bytes) -> None:
        await self._send(Opcode.BINARY, data)

    async def ping(self, data: bytes = b"") -> None:
        await self._send(Opcode.PING, data)

    async def _send_close(self, code: int, reason: str = "") -> None:
        if self._close_sent:
            return
        payload = struct.pack("!H", code) + reason.encode()[:123].decode(errors="ignore").encode()
        self._close_sent = True
        with contextlib.suppress(OSError, RuntimeError):  # (the server may have gone already)
            self._writer.write(encode_frame(Opcode.CLOSE, payload))
            await self._writer.drain()

    # -- receiving ---------------------------------------------------------------------------------

    async def _frame(self) -> tuple[bool, int, bytes]:
        """(fin, opcode, payload) of the next frame; IncompleteReadError at the connection's end."""
        first, second = await self._reader.readexactly(2)
        if first & 0x70:
            raise ProtocolError("a frame with reserved bits set (no extension was agreed)")
        if second & 0x80:
            raise ProtocolError("a masked frame from the server")
        n = second & 0x7F
        if n == 126:
            (n,) = struct.unpack("!H", await self._reader.readexactly(2))
        elif n == 127:
            (n,) = struct.unpack("!Q", await self._reader.readexactly(8))
            if n >> 63:
                raise ProtocolError("a frame length with its top bit set")
        opcode = first & 0x0F
        fin = bool(first & 0x80)
        if opcode >= 0x8 and (not fin or n > 125):
            raise ProtocolError("a fragmented or over-long control frame")
        if self.max_size is not None and n > self.max_size:
            raise ProtocolError(f"a frame of {n} bytes (at most {self.max_size})", CloseCode.TOO_BIG)
        return fin, opcode, await self._reader.readexactly(n) if n else b""

    async def receive(self) -> Message | None:
        """The next data message, or None once the connection has ended (`close_code` says how). Pings are
        answered, pongs dropped; a server's close is answered and ends the connection."""
        if self._closed:
            return None
        try:
            return await self._receive()
        except ProtocolError as e:
            await self._fail(e.code, str(e))
            raise
        except (asyncio.IncompleteReadError, OSError):  # (the connection broke: no close frame came)
            await self._drop(CloseCode.ABNORMAL)
            return None

    async def _receive(self) -> Message | None:
        kind: Opcode | None = None  # the message being reassembled from fragments
        parts: list[bytes] = []
        size = 0
        while True:
            fin, opcode, payload = await self._frame()
            if opcode >= 0x8:  # control frames (whole and short: `_frame` checked): allowed between fragments
                if opcode == Opcode.PING:
                    with contextlib.suppress(OSError):  # (closing, or gone: the next read says which)
                        await self._send(Opcode.PONG, payload)
                elif opcode == Opcode.CLOSE:
                    await self._closed_by_server(payload)
                    return None
                elif opcode != Opcode.PONG:
                    raise ProtocolError(f"an unknown control opcode {opcode:#x}")
                continue
            if opcode == Opcode.CONTINUATION:
                if kind is None:
                    raise ProtocolError("a continuation frame with no message to continue")
            elif opcode in (Opcode.TEXT, Opcode.BINARY):
                if kind is not None:
                    raise ProtocolError("a new message began before the fragmented one ended")
                kind = Opcode(opcode)
            else:
                raise ProtocolError(f"an unknown data opcode {opcode:#x}")
            size += len(payload)
            if self.max_size is not None and size > self.max_size:
                raise ProtocolError(f"a message of more than {self.max_size} bytes", CloseCode.TOO_BIG)
            parts.append(payload)
            if fin:
                data = b"".join(parts)
                if kind == Opcode.BINARY:
                    return Message(kind, data)
                try:
                    return Message(kind, data.decode())
                except UnicodeDecodeError:
                    raise ProtocolError("a text message that is not UTF-8", CloseCode.INVALID_DATA) from None

    async def _closed_by_server(self, payload: bytes) -> None:
        if len(payload) == 1:
            raise ProtocolError("a close frame with a one-byte payload")
        code = struct.unpack("!H", payload[:2])[0] if payload else CloseCode.NO_STATUS
        if payload and not _sendable(code):
            raise ProtocolError(f"a close frame with the code {code}, which is not sent on the wire")
        try:
            reason = payload[2:].decode()
        except UnicodeDecodeError:
            raise ProtocolError("a close reason that is not UTF-8", CloseCode.INVALID_DATA) from None
        self.close_code, self.close_reason = code, reason
        await self._send_close(code if payload else CloseCode.NORMAL)  # echoed, as RFC 6455 §5.5.1 asks
        await self._drop(code)

    async def _fail(self, code: CloseCode, reason: str) -> None:
        """Fail the connection (RFC 6455 §7.1.7): a close frame saying why, then the end."""
        await self._send_close(code, reason)
        await self._drop(code)

    async def _drop(self, code: int) -> None:
        if self.close_code is None:
            self.close_code = code
        self._closed = True
        self._writer.close()
        with contextlib.suppress(OSError, RuntimeError):
            await self._writer.wait_closed()

    def __aiter__(self) -> AsyncIterator[Message]:
        return self._messages()

    async def _messages(self) -> AsyncIterator[Message]:
        while (msg := await self.receive()) is not None:
            yield msg

    async def close(self, code: int = CloseCode.NORMAL, reason: str = "", wait: float = CLOSE_WAIT) -> None:
        """The closing handshake: a close frame, then the server's (messages before it are dropped), for at
        most `wait` seconds; then the connection is dropped."""
        if self._closed:
            return
        await self._send_close(code, reason)
        try:
            async with asyncio.timeout(wait):
                while await self.receive() is not None:
                    pass
        except (TimeoutError, ProtocolError, OSError):
            pass
        finally:
            await self._drop(CloseCode.ABNORMAL)


async def open_stream(
    host: str, port: int, *, ssl: Any = None, timeout: float | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection for `handshake` (TLS when `ssl`, an SSLContext, is given: the host's name is checked);
    `timeout`: seconds to make it (TimeoutError, an OSError)."""
    async with asyncio.timeout(timeout):
        return await asyncio.open_connection(host, port, ssl=ssl, limit=MAX_HEADERS)


async def connect(
    host: str,
    port: int,
    target: str,
    headers: dict[str, str],
    *,
    ssl: Any = None,
    timeout: float | None = None,
    max_size: int | None = None,
) -> WebSocket:
    """Open a WebSocket to `target` (path and query, as sent) at host:port: `open_stream`, then `handshake`."""
    reader, writer = await open_stream(host, port, ssl=ssl, timeout=timeout)
    try:
        return await handshake(reader, writer, target, headers, max_size)
    except BaseException:
        writer.close()
        raise


async def handshake(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    target: str,
    headers: dict[str, str],
    max_size: int | None = None,
) -> WebSocket:
    """The opening handshake over an open connection (RFC 6455 §4.1). `headers` (Host first, then the caller's
    own, e.g. signed ones) go with the upgrade request; `max_size`: bytes of one message (None: no bound)."""
    key = base64.b64encode(os.urandom(16)).decode()
    lines = [f"GET {target} HTTP/1.1"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    lines += ["Upgrade: websocket", "Connection: Upgrade", f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13"]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
    await writer.drain()
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError:
        raise HandshakeError(f"the server's answer has more than {MAX_HEADERS} bytes of headers") from None
    except asyncio.IncompleteReadError as e:
        raise ConnectionResetError(f"the server closed the connection during the handshake ({len(e.partial)} "
                                   "bytes of an answer)") from None  # fmt: skip
    status, reason, answer = _header_lines(head[:-4])
    if status != 101:
        raise HandshakeRefused(status, reason, await _refusal_body(reader, answer))
    if "websocket" not in _tokens(answer.get("upgrade", "")) or "upgrade" not in _tokens(answer.get("connection", "")):
        raise HandshakeError("the server answered 101 without upgrading to a WebSocket")
    if answer.get("sec-websocket-accept") != accept_for(key):
        raise HandshakeError(
            "the server's Sec-WebSocket-Accept does not match the key sent: it is not a WebSocket server, or "
            "something between changed the handshake"
        )
    if answer.get("sec-websocket-extensions"):
        raise HandshakeError(f"the server chose an extension none was asked for: {answer['sec-websocket-extensions']}")
    if answer.get("sec-websocket-protocol"):
        raise HandshakeError(f"the server chose a subprotocol none was asked for: {answer['sec-websocket-protocol']}")
    return WebSocket(reader, writer, max_size)


async def _refusal_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    """The body of a refusal (by its Content-Length, chunked, else up to the connection's end), at most
    MAX_REFUSAL_BODY bytes and REFUSAL_WAIT seconds; what cannot be read is left out."""
    length = headers.get("content-length", "")
    body = bytearray()
    try:
        async with asyncio.timeout(REFUSAL_WAIT):
            if length.isdigit():
                body += await reader.readexactly(min(int(length), MAX_REFUSAL_BODY))
            elif "chunked" in _tokens(headers.get("transfer-encoding", "")):
                await _chunked(reader, body)
            else:
                while len(body) < MAX_REFUSAL_BODY and (more := await reader.read(MAX_REFUSAL_BODY - len(body))):
                    body += more
    except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, OSError):
        pass
    return bytes(body)


async def _chunked(reader: asyncio.StreamReader, body: bytearray) -> None:
    """A chunked body into `body`, up to MAX_REFUSAL_BODY bytes."""
    while len(body) < MAX_REFUSAL_BODY:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
        if not size:
            return
        body += (await reader.readexactly(size + 2))[:size]
