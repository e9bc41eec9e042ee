"""Rich tables and sentences for CLI output."""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING, Any

from bai.common.present import age, reason
from bai.common.slots import format_slots, from_wire

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table
else:

    def Table(*args: Any, **kwargs: Any) -> Any:  # noqa: N802
        """rich's Table, imported when a table is made (rich costs about 35 ms: not for --json or sentences)."""
        from rich.table import Table as RichTable

        return RichTable(*args, **kwargs)


_console: Console | None = None


def console() -> Console:
    from rich.console import Console

    global _console
    if _console is None:
        # no markup: what is shown (reasons, names, commands) may contain brackets ("[agent] port_range");
        # no emoji codes either (":name:" in a reason is text), which also spares loading rich's emoji table
        _console = Console(highlight=False, markup=False, emoji=False)
        if not _console.is_terminal:  # piped: do not fold rows at 80 columns
            _console = Console(highlight=False, markup=False, emoji=False, width=200)
    return _console


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
            "; ".join(part for part in (reason(s), outcome(s)) if part),
            format_slots(from_wire(s["requestedSlots"])),
            age(s["creationTime"]),
        )
    return table


def result_of(s: dict[str, Any]) -> str:
    """SUCCESS or FAILURE: how the session's last run (or its batch job) ended; "" while unknown."""
    result = s.get("result") or ""
    return "" if result == "UNDEFINED" else result


def outcome(s: dict[str, Any]) -> str:
    """`exit 3 FAILURE`: the exit code and result of the session's last run ("" before one ended)."""
    code = s.get("exitCode")
    if code is None or f"exit code {code}" in reason(s):  # a batch session's reason says it already
        return result_of(s)
    return " ".join(part for part in (f"exit {code}", result_of(s)) if part)


def agents_table(items: list[dict[str, Any]]) -> Table:
    table = Table(box=None, header_style="bold")
    for col in ("ID", "STATUS", "BACKEND", "GROUP", "CPU", "MEM", "GPUS", "WARM", "SEEN"):
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
            a["status"] + ("" if a.get("schedulable", True) else " (drained)"),
            a["backend"],
            a["scalingGroup"],
            pair("cpu"),
            pair("mem"),
            gpu_summary(a.get("gpus") or []),
            warm_summary(a.get("warm") or {}),
            age(a["lastSeen"]),
        )
    return table


def warm_summary(warm: dict[str, int]) -> str:
    """`warm 2` (ready kernels of its warm pool, all images), or - without any."""
    total = sum(int(n) for n in warm.values())
    return f"warm {total}" if warm else "-"


def gpu_summary(gpus: list[dict[str, Any]]) -> str:
    """`2 × H200, 0.75 held` (or - without GPUs)."""
    if not gpus:
        return "-"
    held = sum(Decimal(g.get("allocated") or 0) for g in gpus)
    return f"{len(gpus)} × {gpus[0]['name']}, {held.normalize():f} held"


def gpu_lines(gpus: list[dict[str, Any]]) -> list[str]:
    """One line per GPU: index, model, memory, live use, and how much of it kernels hold."""
    from bai.common.slots import format_bytes

    out = []
    for g in gpus:
        util = "-" if g.get("utilization") is None else f"{g['utilization']}%"
        used = "-" if g.get("memory_used") is None else format_bytes(g["memory_used"])
        out.append(
            f"GPU {g['index']}  {g['name']}  {g['uuid']}  memory {used} / {format_bytes(g['memory_total'])}  "
            f"utilization {util}  held {Decimal(g.get('allocated') or 0).normalize():f}"
        )
    return out


def images_table(items: list[dict[str, Any]]) -> Table:
    table = Table(box=None, header_style="bold")
    for col in ("NAME", "ALIASES", "AGENT", "SIZE"):
        table.add_column(col)
    from bai.common.slots import format_bytes

    for i in items:
        table.add_row(i["name"], ", ".join(i.get("aliases", [])), i["agent"], format_bytes(i.get("size") or 0))
    return table


def app_line(a: dict[str, Any]) -> str:
    """`jupyterlab (http, port 8090; published on 127.0.0.1:30001)`: one app of a session."""
    ports = ", ".join(str(p) for p in a.get("ports") or [])
    published = ", ".join(f"127.0.0.1:{p}" for p in a.get("host_ports") or [])
    where = f"; published on {published}" if published else ""
    return f"{a.get('name')} ({a.get('protocol')}, port {ports}{where})"


def apps_table(items: list[dict[str, Any]], session: str) -> Table:
    table = Table(box=None, header_style="bold")
    for col in ("APP", "PROTOCOL", "PORT", "PUBLISHED", "OPEN WITH"):
        table.add_column(col, overflow="fold")
    for a in items:
        table.add_row(
            str(a.get("name")),
            str(a.get("protocol")),
            ", ".join(str(p) for p in a.get("ports") or []),
            ", ".join(f"127.0.0.1:{p}" for p in a.get("host_ports") or []) or "-",
            f"bai session app {session} {a.get('name')}",
        )
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
        *([f"Network     {s['network']}"] if s.get("network") else []),
        *(
            f"Mount       {m['name']} at {m['target']}" + (" (read-only)" if m["readOnly"] else "")
            for m in s.get("mounts") or []
        ),
        *(f"App         {app_line(a)}" for a in s.get("servicePorts") or []),
        f"Created     {s['creationTime']} ({age(s['creationTime'])} ago)",
    ]
    if s.get("terminationTime"):
        lines.append(f"Ended       {s['terminationTime']}")
    if s.get("exitCode") is not None:
        lines.append(f"Exit code   {s['exitCode']}")
    if result_of(s):
        lines.append(f"Result      {result_of(s)}")
    for k in s.get("kernels", []):
        lines.append(
            f"Kernel      {k['id']} {k['clusterRole']} {k['status']}"
            + (f" container {k['containerId'][:12]}" if k.get("containerId") else "")
        )
        for d in k.get("devices") or []:
            lines.append(f"  GPU       {d['uuid']} (share {d['share']})")
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
    from bai.common.slots import format_bytes

    cols = ("NAME", "MAX SESSIONS", "TOTAL SLOTS", "OTHER SLOTS", "IDLE TIMEOUT", "MAX LIFETIME")
    cols += ("VFOLDERS", "FOLDER SIZE")
    for col in cols:
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
            str(p.get("max_vfolder_count") or "any"),
            format_bytes(p["max_vfolder_size"]) if p.get("max_vfolder_size") else "any",
        )
    return table
