"""Rich tables and sentences for CLI output."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from rich.console import Console
from rich.table import Table

from bai.common.slots import format_slots, from_wire

_console: Console | None = None


def console() -> Console:
    global _console
    if _console is None:
        _console = Console(highlight=False)
        if not _console.is_terminal:  # piped: do not fold rows at 80 columns
            _console = Console(highlight=False, width=200)
    return _console


def age(iso: str | None) -> str:
    if not iso:
        return "-"
    seconds = int((datetime.now(UTC) - datetime.fromisoformat(iso)).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


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
        elif data.get("msg"):
            detail = data["msg"]
    if info and detail:
        return f"{info}: {detail}"
    return info or detail


def sessions_table(items: list[dict[str, Any]]) -> Table:
    table = Table(box=None, header_style="bold")
    for col in ("NAME", "ID", "IMAGE", "STATUS", "REASON", "SLOTS", "AGE"):
        table.add_column(col, overflow="fold", no_wrap=col not in ("REASON", "SLOTS"))
    for s in items:
        table.add_row(
            s["name"],
            s["id"][:8],
            s["image"],
            s["status"],
            reason(s),
            format_slots(from_wire(s["requestedSlots"])),
            age(s["creationTime"]),
        )
    return table


def agents_table(items: list[dict[str, Any]]) -> Table:
    table = Table(box=None, header_style="bold")
    for col in ("ID", "STATUS", "BACKEND", "GROUP", "CPU", "MEM", "SEEN"):
        table.add_column(col)
    for a in items:
        cap, used = from_wire(a["availableSlots"]), from_wire(a["occupiedSlots"])
        from bai.common.slots import format_amount

        def pair(slot: str, cap=cap, used=used) -> str:
            return (
                f"{format_amount(slot, used.get(slot, Decimal(0)))} / {format_amount(slot, cap.get(slot, Decimal(0)))}"
            )

        table.add_row(
            a["id"],
            a["status"],
            a["backend"],
            a["scalingGroup"],
            pair("cpu"),
            pair("mem"),
            age(a["lastSeen"]),
        )
    return table


def images_table(items: list[dict[str, Any]]) -> Table:
    table = Table(box=None, header_style="bold")
    for col in ("NAME", "ALIASES", "AGENT", "SIZE"):
        table.add_column(col)
    from bai.common.slots import format_bytes

    for i in items:
        table.add_row(i["name"], ", ".join(i.get("aliases", [])), i["agent"], format_bytes(i.get("size") or 0))
    return table


def session_details(s: dict[str, Any]) -> list[str]:
    lines = [
        f"Session     {s['name']} ({s['id']})",
        f"Image       {s['image']}",
        f"Type        {s['type'].lower()}",
        f"Status      {s['status']}" + (f" ({reason(s)})" if reason(s) else ""),
    ]
    if s.get("queuePosition"):
        lines.append(f"Queue       position {s['queuePosition']} of the pending sessions")
    scheduler = (s.get("statusData") or {}).get("scheduler") or {}
    for p in scheduler.get("failed_predicates") or []:
        lines.append(f"  blocked   {p['name']}: {p['msg']}")
    if scheduler.get("retries"):
        lines.append(f"Tried       {scheduler['retries']} times, last at {scheduler.get('last_try', '?')}")
    lines += [
        f"Resources   {format_slots(from_wire(s['requestedSlots']))}",
        f"Agent       {s.get('agent') or '-'}",
        f"Created     {s['creationTime']} ({age(s['creationTime'])} ago)",
    ]
    if s.get("terminationTime"):
        lines.append(f"Ended       {s['terminationTime']}")
    if s.get("exitCode") is not None:
        lines.append(f"Exit code   {s['exitCode']}")
    for k in s.get("kernels", []):
        lines.append(
            f"Kernel      {k['id']} {k['clusterRole']} {k['status']}"
            + (f" container {k['containerId'][:12]}" if k.get("containerId") else "")
        )
    if s.get("transitions"):
        lines.append("History")
        for t in s["transitions"]:
            extra = f" ({t['status_info']})" if t["status_info"] else ""
            lines.append(f"  {t['at']}  {t['status']}{extra}")
    return lines


def keypairs_table(items: list[dict[str, Any]]) -> Table:
    table = Table(box=None, header_style="bold")
    for col in ("ACCESS KEY", "USER", "ADMIN", "ACTIVE", "POLICY", "CREATED"):
        table.add_column(col, no_wrap=True)
    for k in items:
        table.add_row(
            k["accessKey"],
            k["userId"],
            "yes" if k["isAdmin"] else "",
            "yes" if k["isActive"] else "no",
            k["resourcePolicy"],
            age(k["createdAt"]) + " ago",
        )
    return table


def policies_table(items: list[dict[str, Any]]) -> Table:
    from bai.common.durations import format_duration

    table = Table(box=None, header_style="bold")
    for col in ("NAME", "MAX SESSIONS", "TOTAL SLOTS", "OTHER SLOTS", "IDLE TIMEOUT", "MAX LIFETIME"):
        table.add_column(col)
    for p in items:
        slots = format_slots(from_wire(p["total_resource_slots"])) or "-"
        table.add_row(
            p["name"],
            str(p["max_concurrent_sessions"] or "any"),
            slots,
            p["default_for_unspecified"].lower(),
            format_duration(p["idle_timeout"]) if p["idle_timeout"] else "never",
            format_duration(p["max_session_lifetime"]) if p["max_session_lifetime"] else "none",
        )
    return table


def _clock(iso: str) -> str:
    return iso[11:19]


def explain_lines(h: dict[str, Any]) -> list[str]:
    """The decision history of a session, one line per distinct decision."""
    lines = [f"Session {h['name']} ({h['sessionId']}): {h['status']}"]
    if not h["history"]:
        lines.append("  the scheduler has not looked at it (yet)")
    for item in h["history"]:
        span = _clock(item["first_at"])
        if item["rounds"] > 1:
            span += f"-{_clock(item['last_at'])} ({item['rounds']} rounds)"
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
        lines.append(f"  {span}  {text}")
    lines.append("State changes")
    for t in h["transitions"]:
        extra = f" ({t['status_info']})" if t["status_info"] else ""
        lines.append(f"  {_clock(t['at'])}  {t['status']}{extra}")
    return lines
