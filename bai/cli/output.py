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
