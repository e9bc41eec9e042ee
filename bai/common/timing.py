"""How long a session waited and how long it ran, apart (for the CLI and the dashboard): from its `startedAt`
(when it first ran), else (a detail) the time of its first transition to RUNNING; one that never ran only queued."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from bai.common.present import utc_now

ENDED = ("TERMINATED", "CANCELLED", "ERROR")


def parse_time(iso: str | None) -> datetime | None:
    if not iso:
        return None
    try:
        return datetime.fromisoformat(iso)
    except ValueError:
        return None


def started_at(s: dict[str, Any]) -> datetime | None:
    """When the session first ran; None when it never did (or nothing says when)."""
    start = parse_time(s.get("startedAt"))
    if start is not None:
        return start
    for t in s.get("transitions") or []:
        if t.get("status") == "RUNNING":
            return parse_time(t.get("at"))
    return None


def ended(s: dict[str, Any]) -> bool:
    return s.get("status") in ENDED


def duration(seconds: float) -> str:
    """`42s`, `5m 3s`, `2h 5m`, `3d 4h`: two units at most."""
    whole = max(0, int(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m {whole % 60}s"
    if whole < 86400:
        return f"{whole // 3600}h {whole % 3600 // 60}m"
    return f"{whole // 86400}d {whole % 86400 // 3600}h"


def queued_and_ran(s: dict[str, Any], now: datetime | None = None) -> tuple[float | None, float | None]:
    """(seconds it waited before it first ran, seconds it ran since): the second None when it never ran;
    the first None when its creation time is unknown. A session still queued waited until now; an ended one
    that never ran, until it ended."""
    now = now or utc_now()
    created = parse_time(s.get("creationTime"))
    start = started_at(s)
    end = (parse_time(s.get("terminationTime") or s.get("statusChanged")) if ended(s) else None) or now
    if start is None:
        return (None if created is None else (end - created).total_seconds()), None
    queued = None if created is None else max(0.0, (start - created).total_seconds())
    return queued, max(0.0, (end - start).total_seconds())


def queued_text(s: dict[str, Any], now: datetime | None = None) -> str:
    queued, _ = queued_and_ran(s, now)
    return "-" if queued is None else duration(queued)


def ran_text(s: dict[str, Any], now: datetime | None = None) -> str:
    _, ran = queued_and_ran(s, now)
    return "-" if ran is None else duration(ran)


def timing_sentence(s: dict[str, Any], now: datetime | None = None) -> str:
    """`queued 2m 1s, running 19m 2s` (`ran` once it ended; `queued 40s so far` while it waits)."""
    queued, ran = queued_and_ran(s, now)
    if ran is None:
        if queued is None:
            return ""
        return f"queued {duration(queued)}" + ("" if ended(s) else " so far") + ("; it never ran" if ended(s) else "")
    parts = [] if queued is None else [f"queued {duration(queued)}"]
    parts.append(f"{'ran' if ended(s) else 'running'} {duration(ran)}")
    return ", ".join(parts)
