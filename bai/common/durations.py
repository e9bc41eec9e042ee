"""Durations as users write them: `90`, `30s`, `10m`, `1h30m`, `2d`."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

_PART = re.compile(r"(\d+(?:\.\d+)?)(d|h|min|m|s)")
_UNIT = {"d": 86400, "h": 3600, "min": 60, "m": 60, "s": 1}


def parse_duration(text: str) -> float:
    """Seconds in `text`; raises ValueError with a sentence for anything else."""
    raw = text.strip().lower()
    try:
        value = float(raw)
    except ValueError:
        pass
    else:
        if value < 0 or value != value or value == float("inf"):
            raise ValueError(f"a duration must be a number of seconds >= 0, got {text!r}")
        return value
    pos, total = 0, 0.0
    for m in _PART.finditer(raw):
        if m.start() != pos:
            break
        total += float(m[1]) * _UNIT[m[2]]
        pos = m.end()
    if pos != len(raw) or not raw:
        raise ValueError(f"cannot read {text!r} as a duration (examples: 90, 30s, 10m, 1h30m, 2d)")
    return total


def format_duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds <= 0:
        return "0s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(parts)


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """The time `text` names: a duration before `now` (`30s`, `10m`, `1h`, `1h30m`, `90`) or an ISO 8601 time
    (`2026-12-01T10:00:00Z`; one without a zone is UTC). Raises ValueError with a sentence for anything else."""
    raw = text.strip()
    try:
        ago = parse_duration(raw)
    except ValueError:
        pass
    else:
        return (now or datetime.now(UTC)) - timedelta(seconds=ago)
    try:
        when = datetime.fromisoformat(raw)
    except ValueError:
        raise ValueError(
            f"cannot read {text[:40]!r} as a time: give a duration before now (30s, 10m, 1h) "
            "or an ISO 8601 time (2026-12-01T10:00:00Z)"
        ) from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)
