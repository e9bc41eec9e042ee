"""The server's side of RFC 6455 for fake servers in tests, written independently of bai.client.wsclient (the
client under test): the handshake's accept value, frames as a server writes them, a client's frames read."""

from __future__ import annotations

import base64
import hashlib
import struct
from typing import BinaryIO

RFC_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455 §1.3
TEXT, BINARY, CLOSE, PING, PONG = 0x1, 0x2, 0x8, 0x9, 0xA


def accept_of(key: str) -> str:
    return base64.b64encode(hashlib.sha1(key.encode() + RFC_GUID).digest()).decode()


def unmask(data: bytes, key: bytes) -> bytes:
    return bytes(b ^ key[i % 4] for i, b in enumerate(data))


def frame(opcode: int, payload: bytes = b"", fin: bool = True, rsv: int = 0, mask: bytes | None = None) -> bytes:
    """A frame as a server (or, with `mask`, a client) writes it."""
    head = bytes([(0x80 if fin else 0) | rsv | opcode])
    n = len(payload)
    bit = 0x80 if mask is not None else 0
    if n < 126:
        head += bytes([bit | n])
    elif n < 65536:
        head += bytes([bit | 126]) + struct.pack("!H", n)
    else:
        head += bytes([bit | 127]) + struct.pack("!Q", n)
    if mask is not None:
        return head + mask + unmask(payload, mask)
    return head + payload


def parse_head(first: int, second: int) -> tuple[bool, int, bool, int]:
    """(fin, opcode, masked, the 7-bit length) of a frame's first two bytes."""
    return bool(first & 0x80), first & 0x0F, bool(second & 0x80), second & 0x7F


def read_frame(rfile: BinaryIO) -> tuple[bool, int, bytes, bool]:
    """(fin, opcode, unmasked payload, whether it was masked) of a client's next frame, from a blocking file."""

    def exactly(n: int) -> bytes:
        data = rfile.read(n)
        if len(data) != n:
            raise EOFError(f"{len(data)} of {n} bytes")
        return data

    fin, opcode, masked, n = parse_head(*exactly(2))
    if n == 126:
        (n,) = struct.unpack("!H", exactly(2))
    elif n == 127:
        (n,) = struct.unpack("!Q", exactly(8))
    key = exactly(4) if masked else b"\0\0\0\0"
    return fin, opcode, unmask(exactly(n), key), masked
