"""How the link's values travel: msgpack, the same for both transports.

The ZeroMQ link packs every message with `pack` and reads it with `unpack`; the in-process link passes every
call's arguments, answer, event, registration and stream frame through `carried` (pack, then unpack), so
that its ends see exactly what the other end of a ZeroMQ link would: bytes stay bytes, tuples become lists,
and a value msgpack cannot carry fails the same way (TypeError) where it is sent.
"""

from __future__ import annotations

from typing import Any, cast

import msgpack


def pack(value: Any) -> bytes:
    """`value` (plain values: dicts, lists, str, bytes, numbers, bools, None) as it travels."""
    return cast(bytes, msgpack.packb(value, use_bin_type=True))


def unpack(data: bytes) -> Any:
    """What `pack` made, as plain values again (binary data as bytes, text as str; maps may have any keys)."""
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def carried(value: Any) -> Any:
    """`value` as the other end of the link receives it."""
    return unpack(pack(value))
