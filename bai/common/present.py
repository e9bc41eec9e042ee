"""Words for what the API returns, shared by the CLI, the dashboard and the manager's dashboard stream."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any


def utc_now() -> datetime:
    return datetime.now(UTC)


def seconds_since(iso: str | None, now: datetime | None = None) -> float | None:
    if not iso:
        return None
    return ((now or utc_now()) - datetime.fromisoformat(iso)).total_seconds()


def span(seconds: float | None) -> str:
    """A short duration: 42s, 5m, 3h, 2d."""
    if seconds is None:
        return "-"
    whole = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if whole >= size:
            return f"{whole // size}{unit}"
    return f"{whole}s"


def age(iso: str | None, now: datetime | None = None) -> str:
    return span(seconds_since(iso, now))


def reason(session: dict[str, Any]) -> str:
    """A sentence a user can act on: why a session is pending, or why it ended."""
    info = session.get("statusInfo") or ""
    data = session.get("statusData") or {}
    detail = ""
    if isinstance(data, dict):
        if isinstance(data.get("error"), dict):
            detail = data["error"].get("repr") or data["error"].get("name", "")
        elif isinstance(data.get("scheduler"), dict):
            detail = data["scheduler"].get("msg", "")
        elif data.get("exitCode") is not None:
            detail = f"exit code {data['exitCode']}"
            if data.get("msg"):  # why it ended, when known (e.g. out of memory)
                detail = f"{data['msg']} ({detail})"
        elif data.get("msg"):
            detail = data["msg"]
    if info and detail:
        return f"{info}: {detail}"
    return info or detail


def _clock(iso: str) -> str:
    return iso[11:19]


def explain_lines(h: dict[str, Any]) -> list[str]:
    """The decision history of a session, one line per distinct decision."""
    lines = [f"Session {h['name']} ({h['sessionId']}): {h['status']}"]
    if not h["history"]:
        lines.append("  the scheduler has not looked at it (yet)")
    for item in h["history"]:
        when = _clock(item["first_at"])
        if item["rounds"] > 1:
            when += f"-{_clock(item['last_at'])} ({item['rounds']} rounds)"
        if item["outcome"] == "scheduled":
            text = f"placed on {item['agents']}"
        elif item["outcome"] == "cancelled":
            text = f"cancelled: {item['status_info']}: {item['msg']}"
        else:
            text = f"pending: {item['status_info']}"
            failed = item["predicates"]
            if failed:
                text += "".join(f"\n      - {p['name']}: {p['msg']}" for p in failed)
            elif item["msg"]:
                text += f": {item['msg']}"
        lines.append(f"  {when}  {text}")
    lines.append("State changes")
    for t in h["transitions"]:
        extra = f" ({t['status_info']})" if t["status_info"] else ""
        lines.append(f"  {_clock(t['at'])}  {t['status']}{extra}")
    return lines


Clock = Callable[[], datetime]
