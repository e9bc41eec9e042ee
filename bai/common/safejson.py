"""One JSON decoder for what a client (or a kernel) sends: bounded in size and nesting depth, and never an
exception other than `UnsafeJson` (a ValueError with a sentence for the client).

`json.loads` itself raises RecursionError on `"[" * 100000` (the C scanner recurses), and accepts any size;
every frame and body decoder of the API goes through `loads` so that the class is closed in one place."""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 64  # nesting of arrays and objects: Backend.AI's own bodies nest 4-5 deep
MAX_BYTES = 4 * 1024 * 1024  # the default bound of the text itself (callers pass their own)


class UnsafeJson(ValueError):
    """The text is not JSON, or is too large or nested too deeply; str(e) says which, for the client."""


def loads(
    data: str | bytes | bytearray, *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH, what: str = "the body"
) -> Any:
    """The JSON value of `data`, or UnsafeJson (never RecursionError, UnicodeDecodeError or anything else)."""
    if len(data) > max_bytes:
        raise UnsafeJson(f"{what} is too large ({len(data)} bytes; at most {max_bytes})")
    try:
        value = json.loads(data)
    except RecursionError:
        raise UnsafeJson(f"{what} is nested too deeply (at most {max_depth} levels)") from None
    except UnicodeDecodeError:
        raise UnsafeJson(f"{what} is not UTF-8 text") from None
    except ValueError as e:
        raise UnsafeJson(f"{what} is not valid JSON ({e})") from None
    if depth_over(value, max_depth):
        raise UnsafeJson(f"{what} is nested too deeply (at most {max_depth} levels)")
    return value


def depth_over(value: Any, limit: int) -> bool:
    """Whether arrays/objects nest more than `limit` levels (iterative: no recursion of its own)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth + 1 > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False
