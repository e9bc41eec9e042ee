"""Rich tables and sentences for CLI output."""

from __future__ import annotations

import sys
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from bai.cli.common import no_color
from bai.common.present import NONE_YET, age, allocated, number, percent, reason, size, slots_text, usage_lines

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table
else:

    def Table(*args: Any, **kwargs: Any) -> Any:  # noqa: N802
        """rich's Table, imported when a table is made (rich costs about 35 ms: not for --json or sentences)."""
        from rich.table import Table as RichTable

        return RichTable(*args, **kwargs)


_console: Console | None = None

# Piped output (not a terminal) is never folded nor cut, whatever COLUMNS says: one line per row, each
# column as wide as its widest cell, trailing blanks removed (as kubectl prints tables), so that `grep`,
# `awk` and `cut` see whole rows. On a terminal tables fit its width and long cells fold.
PIPED_WIDTH = 100_000


def console() -> Console:
    """rich's Console for stdout: no markup, and no escapes at all with NO_COLOR."""
    from rich.console import Console

    global _console
    if _console is None:
        # no markup: what is shown (reasons, names, commands) may contain brackets ("[agent] port_range");
        # no emoji codes either (":name:" in a reason is text), which also spares loading rich's emoji table
        settings: dict[str, Any] = {"highlight": False, "markup": False, "emoji": False}
        if no_color():
            settings["color_system"] = None  # rich's own NO_COLOR support still writes bold and dim
        _console = Console(**settings)
        if not _console.is_terminal:
            _console = Console(**settings, width=PIPED_WIDTH)
    return _console


def emit(renderable: Any) -> None:
    """Print a table (or text) on stdout: fitted to a terminal; piped, whole rows without trailing blanks."""
    out = console()
    if getattr(renderable, "pad_edge", None):  # a table's rows start in the first column, as kubectl's do
        renderable.pad_edge = False
    if out.is_terminal:
        out.print(renderable)
        return
    with out.capture() as captured:
        out.print(renderable)
    sys.stdout.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))


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
            slots_text(s["requestedSlots"]),
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
    """Agents: what kernels hold of each (ALLOC: held / capacity) beside what the host uses now (USE)."""
    table = Table(box=None, header_style="bold")
    for col in ("ID", "STATUS", "BACKEND", "GROUP", "CPU ALLOC", "CPU USE", "MEM ALLOC", "MEM USE", "GPUS", "WARM"):
        table.add_column(col, no_wrap=True)
    table.add_column("SEEN", no_wrap=True)
    for a in items:
        cap, used = a["availableSlots"], a["occupiedSlots"]
        table.add_row(
            a["id"],
            a["status"] + ("" if a.get("schedulable", True) else " (drained)"),
            a["backend"],
            a["scalingGroup"],
            f"{number(used.get('cpu') or 0)} / {number(cap.get('cpu') or 0)}",
            host_cpu(a.get("usage")),
            f"{size(used.get('mem') or 0)} / {size(cap.get('mem') or 0)}",
            host_mem(a.get("usage")),
            gpu_summary(a.get("gpus") or []),
            warm_summary(a.get("warm") or {}),
            age(a["lastSeen"]),
        )
    return table


def host_cpu(usage: dict[str, Any] | None) -> str:
    """`35 % of 4 cores`: an agent host's CPU use (its cpuPct is 100 per busy core)."""
    if not usage or usage.get("cpuPct") is None:
        return NONE_YET
    count = usage.get("cpuCount")
    if not count:
        return percent(usage["cpuPct"])
    return f"{percent(usage['cpuPct'] / count)} of {count} cores"


def host_mem(usage: dict[str, Any] | None) -> str:
    """`3.2 GiB / 16 GiB`: an agent host's memory in use, of its total."""
    if not usage or usage.get("memBytes") is None:
        return NONE_YET
    total = usage.get("memTotalBytes")
    return size(usage["memBytes"]) + (f" / {size(total)}" if total else "")


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
    out = []
    for g in gpus:
        util = "-" if g.get("utilization") is None else percent(g["utilization"])
        used = "-" if g.get("memory_used") is None else size(g["memory_used"])
        out.append(
            f"GPU {g['index']}  {g['name']}  {g['uuid']}  memory {used} / {size(g['memory_total'])}  "
            f"utilization {util}  held {Decimal(g.get('allocated') or 0).normalize():f}"
        )
    return out


def images_table(items: list[dict[str, Any]]) -> Table:
    table = Table(box=None, header_style="bold")
    for col in ("NAME", "ALIASES", "AGENT", "SIZE"):
        table.add_column(col)
    for i in items:
        table.add_row(i["name"], ", ".join(i.get("aliases", [])), i["agent"], size(i.get("size") or 0))
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


def kernel_name(k: dict[str, Any]) -> str:
    """A kernel's name in its session: main1, sub1 … (its role alone from a manager that does not say)."""
    return k.get("name") or f"{k.get('clusterRole', '')}{k.get('clusterIdx', '')}"


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
        f"Resources   {slots_text(s['requestedSlots'])}",
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
    if s.get("status") in ("RUNNING", "RUNNING_DEGRADED", "RESTARTING") or s.get("usage"):
        usage = usage_lines(s)
        lines.append(f"Usage       {usage[0]}")
        lines += [f"            {line}" for line in usage[1:]]
    if s.get("exitCode") is not None:
        lines.append(f"Exit code   {s['exitCode']}")
    if result_of(s):
        lines.append(f"Result      {result_of(s)}")
    kernels = s.get("kernels", [])
    if (s.get("clusterSize") or 1) > 1:
        lines.append(f"Cluster     {s['clusterSize']} kernels, {s.get('clusterMode') or 'single-node'}")
    for k in kernels:
        ku = k.get("usage") if len(kernels) > 1 else None  # (one kernel: the session's figures above)
        lines.append(
            f"Kernel      {k['id']} {kernel_name(k)} {k['status']}"
            + (f" on {k['agent']}" if len(kernels) > 1 and k.get("agent") else "")
            + (f" container {k['containerId'][:12]}" if k.get("containerId") else "")
            + (f"  cpu {percent(ku.get('cpuPct'))}, mem {size(ku.get('memBytes'))}" if ku else "")
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
    cols = ("NAME", "MAX SESSIONS", "TOTAL SLOTS", "OTHER SLOTS", "IDLE TIMEOUT", "MAX LIFETIME")
    cols += ("VFOLDERS", "FOLDER SIZE", "PENDING", "NETWORKS")
    for col in cols:
        table.add_column(col)
    for p in items:
        slots = slots_text(p["total_resource_slots"]) or "-"
        table.add_row(
            p["name"],
            str(p["max_concurrent_sessions"] or "any"),
            slots,
            p["default_for_unspecified"].lower(),
            format_duration(p["idle_timeout"]) if p["idle_timeout"] else "never",
            format_duration(p["max_session_lifetime"]) if p["max_session_lifetime"] else "none",
            str(p.get("max_vfolder_count") or "any"),
            size(p["max_vfolder_size"]) if p.get("max_vfolder_size") else "any",
            str(p.get("max_pending_session_count") or "any"),
            str(p.get("max_session_networks") or "any"),
        )
    return table


# -- bai session top ---------------------------------------------------------------------------------------

TOP_SORTS = ("cpu", "mem", "name")


def top_sorted(items: list[dict[str, Any]], by: str = "cpu") -> list[dict[str, Any]]:
    """Sessions for `bai session top`: by CPU or memory use (most first; unmeasured last), or by name."""
    if by == "name":
        return sorted(items, key=lambda s: s["name"])
    key = {"cpu": "cpuPct", "mem": "memBytes"}[by]
    return sorted(items, key=lambda s: (-((s.get("usage") or {}).get(key) or -1), s["name"]))


def top_table(items: list[dict[str, Any]], by: str = "cpu") -> Table:
    """One frame of `bai session top`. CPU % is of one core (200 % = two busy cores), as top shows it."""
    table = Table(box=None, header_style="bold")
    for col in ("NAME", "STATUS", "CPU %", "MEM USED / ALLOC", "NET IN / OUT", "IO READ / WRITE", "PIDS", "AGENT"):
        table.add_column(col, no_wrap=True, justify="right" if col in ("CPU %", "PIDS") else "left")
    for s in top_sorted(items, by):
        u = s.get("usage") or {}
        cpu = u.get("cpuPct")
        mem_alloc = allocated(s, "mem")
        mem = size(u.get("memBytes")) + (f" / {size(mem_alloc)}" if mem_alloc else "")
        table.add_row(
            s["name"],
            s["status"],
            NONE_YET if cpu is None else f"{cpu:.1f}",
            mem,
            _pair(u, "netRxBytes", "netTxBytes"),
            _pair(u, "ioReadBytes", "ioWriteBytes"),
            NONE_YET if u.get("pids") is None else str(u["pids"]),
            s.get("agent") or "-",
        )
    return table


def _pair(usage: dict[str, Any], first: str, second: str) -> str:
    if usage.get(first) is None and usage.get(second) is None:
        return NONE_YET
    return f"{size(usage.get(first))} / {size(usage.get(second))}"
