"""A small TOML writer for `bai config show` (tomllib reads TOML but cannot write it)."""

from __future__ import annotations

import json
import re
from typing import Any

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(k: object) -> str:
    text = str(k)
    return text if _BARE_KEY.match(text) else json.dumps(text)


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + "}"
    return json.dumps(str(v))


def dumps(data: dict[str, Any], prefix: str = "") -> str:
    scalars = {k: v for k, v in data.items() if not (isinstance(v, dict) and v and prefix.count(".") < 2)}
    tables = {k: v for k, v in data.items() if k not in scalars}
    out = []
    if prefix and (scalars or not tables):
        out.append(f"[{prefix}]")
    out.extend(f"{_key(k)} = {_value(v)}" for k, v in scalars.items())
    if out:
        out.append("")
    for key, table in tables.items():
        out.append(dumps(table, f"{prefix}.{_key(key)}" if prefix else _key(key)).rstrip("\n") + "\n")
    return "\n".join(out)
