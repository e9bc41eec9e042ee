"""Rich tables and sentences for CLI output."""

from __future__ import annotations

import re
import sys
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from bai.cli.common import no_color
from bai.cli.words import UNLIMITED, limit, sizes_in
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
        wider = getattr(renderable, "width", None)  # a laid-out table (bai.cli.layout) wider than the terminal:
        if isinstance(wider, int) and wider > out.width:  # (-o wide) whole lines, which the terminal wraps
            out.print(renderable, width=wider, crop=False)
            return
        out.print(renderable)
        return
    with out.capture() as captured:
        out.print(renderable)
    sys.stdout.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))


def sessions_table(items: list[dict[str, Any]], wide: bool = False, width: int | None = None) -> Table:
    """`bai session ls`: name, status and why first; the reason takes the width left (see bai.cli.layout)."""
    from bai.cli.layout import Column, fit
    from bai.common import timing

    columns = [Column("NAME", lambda s: s["name"])]
    if wide or len({owner_of(s) for s in items}) > 1:  # an admin's list: whose each session is
        columns.append(Column("OWNER", owner_of, rank=1))
    columns += [
        Column("ID", lambda s: s["id"][:8], wide=True),
        Column("STATUS", lambda s: s["status"]),
        Column("REASON", why, rest=True),
        Column("IMAGE", lambda s: s["image"], rank=5),
        Column("SLOTS", lambda s: slots_text(s.get("requestedSlots") or {}), rank=4),
        Column("AGENT", lambda s: s.get("agent") or "-", wide=True),
        Column("QUEUED", timing.queued_text, wide=True),
        Column("RAN", timing.ran_text, wide=True),
        Column("AGE", lambda s: age(s["creationTime"]), rank=3),
    ]
    return fit(columns, items, console().width if width is None else width, wide)


def owner_of(s: dict[str, Any]) -> str:
    """Whose a session is: its owner's user name when the manager says it, else the access key."""
    return str(s.get("userName") or s.get("accessKey") or "-")


def why(s: dict[str, Any]) -> str:
    """The REASON of `session ls`: `#2 in queue: no-available-instances: …` for a pending session, why it
    ended, and how its last run ended (`last run: exit 137 FAILURE` while the session lives on)."""
    text = "; ".join(part for part in (sizes_in(reason(s)), outcome(s)) if part)
    if queue_position(s):
        text = f"#{queue_position(s)} in queue" + (f": {text}" if text else "")
    return text


def queue_position(s: dict[str, Any]) -> int | None:
    """A pending session's place in the queue: `queuePosition` (a detail), else where the scheduler last put
    it (`statusData.scheduler.position`, in list items too); None for any other status."""
    if s.get("status") != "PENDING":
        return None
    scheduler = (s.get("statusData") or {}).get("scheduler")
    position = s.get("queuePosition") or (scheduler.get("position") if isinstance(scheduler, dict) else None)
    return position if isinstance(position, int) and position > 0 else None


def result_of(s: dict[str, Any]) -> str:
    """SUCCESS or FAILURE: how the session's last run (or its batch job) ended; "" while unknown."""
    result = s.get("result") or ""
    return "" if result == "UNDEFINED" else result


def lives(s: dict[str, Any]) -> bool:
    """The session has not ended: how its last run ended is not how the session did."""
    from bai.common.timing import ended

    return not ended(s)


def outcome(s: dict[str, Any]) -> str:
    """`exit 3 FAILURE`: the exit code and result of the session's last run ("" before one ended); while
    the session lives on, `last run: exit 137 FAILURE` (its run ended, not the session)."""
    code = s.get("exitCode")
    if code is None or f"exit code {code}" in reason(s):  # a batch session's reason says it already
        text = result_of(s)
    else:
        text = " ".join(part for part in (f"exit {code}", result_of(s)) if part)
    return f"last run: {text}" if text and lives(s) else text


def agents_table(items: list[dict[str, Any]], wide: bool = False, width: int | None = None) -> Table:
    """Agents: what kernels hold of each (ALLOC: held / capacity) beside what the host uses now (USE)."""
    from bai.cli.layout import Column, fit

    def held(slot: str, shown: Any) -> Any:
        return lambda a: f"{shown(a['occupiedSlots'].get(slot) or 0)} / {shown(a['availableSlots'].get(slot) or 0)}"

    columns = [
        Column("ID", lambda a: a["id"]),
        Column("STATUS", lambda a: a["status"] + ("" if a.get("schedulable", True) else " (drained)")),
        Column("HOSTNAME", lambda a: a.get("hostname") or "-", wide=True),
        Column("BACKEND", lambda a: a["backend"], rank=9),
        Column("GROUP", lambda a: a["scalingGroup"], rank=7),
        Column("CPU ALLOC", held("cpu", number), rank=1),
        Column("CPU USE", lambda a: host_cpu(a.get("usage")), rank=4),
        Column("MEM ALLOC", held("mem", size), rank=2),
        Column("MEM USE", lambda a: host_mem(a.get("usage")), rank=5),
        Column("GPUS", lambda a: gpu_summary(a.get("gpus") or []), rank=3),
        Column("WARM", lambda a: warm_summary(a.get("warm") or {}), rank=8),
        Column("VERSION", lambda a: a.get("version") or "-", wide=True),
        Column("SEEN", lambda a: age(a["lastSeen"]), rank=6),
    ]
    return fit(columns, items, console().width if width is None else width, wide)


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


def images_table(items: list[dict[str, Any]], wide: bool = False, width: int | None = None) -> Table:
    """`bai image ls`: names whole; the aliases take the width left."""
    from bai.cli.layout import Column, fit

    columns = [
        Column("NAME", lambda i: i["name"]),
        Column("SIZE", lambda i: size(i.get("size") or 0), rank=1, right=True),
        Column("AGENT", lambda i: i["agent"], rank=2),
        Column("ALIASES", lambda i: ", ".join(i.get("aliases", [])), rest=True),
    ]
    return fit(columns, items, console().width if width is None else width, wide)


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
    from bai.common.timing import started_at, timing_sentence

    lines = [
        f"Session     {s['name']} ({s['id']})",
        f"Image       {s['image']}",
        f"Type        {s['type'].lower()}",
        f"Status      {s['status']}" + (f" ({sizes_in(reason(s))})" if reason(s) else ""),
    ]
    if lives(s) and outcome(s):  # how its last run ended, not the session: it goes on
        lines.append(f"Last run    {outcome(s).removeprefix('last run: ')} (the session goes on)")
    if s.get("accessKey") or s.get("userName"):
        lines.append(f"Owner       {owner_of(s)}")
    if queue_position(s):
        lines.append(f"Queue       position {queue_position(s)} of the pending sessions")
    scheduler = (s.get("statusData") or {}).get("scheduler") or {}
    for p in scheduler.get("failed_predicates") or []:
        lines.append(f"  blocked   {p['name']}: {sizes_in(p['msg'])}")
    if scheduler.get("retries"):
        times = "once" if scheduler["retries"] == 1 else f"{scheduler['retries']} times"
        lines.append(f"Tried       {times}, last at {scheduler.get('last_try', '?')}")
    from bai.common.present import scheduling_lines

    lines += [f"{label:<11} {text}" for label, text in scheduling_lines(s)]
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
    start, timing = started_at(s), timing_sentence(s)
    if start is not None:
        lines.append(f"Started     {start.isoformat()} ({timing})")
    elif timing:
        lines.append(f"Queued      {timing.removeprefix('queued ')}")
    if s.get("terminationTime"):
        lines.append(f"Ended       {s['terminationTime']}")
    if s.get("status") in ("RUNNING", "RUNNING_DEGRADED", "RESTARTING") or s.get("usage"):
        usage = usage_lines(s)
        lines.append(f"Usage       {usage[0]}")
        lines += [f"            {line}" for line in usage[1:]]
    if not lives(s):
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


def keypairs_table(items: list[dict[str, Any]], wide: bool = False, width: int | None = None) -> Table:
    from bai.cli.layout import Column, fit

    columns = [
        Column("ACCESS KEY", lambda k: k["accessKey"]),
        Column("USER", lambda k: k["userId"], rank=1),
        Column("ADMIN", lambda k: "yes" if k["isAdmin"] else "", rank=3),
        Column("ACTIVE", lambda k: "yes" if k["isActive"] else "no", rank=2),
        Column("POLICY", lambda k: k["resourcePolicy"], rank=2),
        Column("CREATED", lambda k: age(k["createdAt"]) + " ago", rank=4),
    ]
    return fit(columns, items, console().width if width is None else width, wide)


def policies_table(items: list[dict[str, Any]], wide: bool = False, width: int | None = None) -> Table:
    """Resource policies: each limit, `unlimited` where there is none."""
    from bai.cli.layout import Column, fit
    from bai.common.durations import format_duration

    def slots(p: dict[str, Any]) -> str:
        unlisted = p["default_for_unspecified"].lower()
        return slots_text(p["total_resource_slots"]) or (UNLIMITED if unlisted == UNLIMITED else "none")

    def seconds(key: str) -> Any:
        return lambda p: limit(p.get(key), p.get(key) and format_duration(p[key]))

    columns = [
        Column("NAME", lambda p: p["name"]),
        Column("MAX SESSIONS", lambda p: limit(p["max_concurrent_sessions"]), rank=1),
        Column("TOTAL SLOTS", slots, rank=2),
        Column("OTHER SLOTS", lambda p: p["default_for_unspecified"].lower(), rank=5),
        Column("IDLE TIMEOUT", seconds("idle_timeout"), rank=3),
        Column("MAX LIFETIME", seconds("max_session_lifetime"), rank=4),
        Column("VFOLDERS", lambda p: limit(p.get("max_vfolder_count")), rank=7),
        Column("FOLDER SIZE", lambda p: limit(p.get("max_vfolder_size"), size(p.get("max_vfolder_size"))), rank=8),
        Column("PENDING", lambda p: limit(p.get("max_pending_session_count")), rank=6),
        Column("NETWORKS", lambda p: limit(p.get("max_session_networks")), rank=9),
        Column("MAX PRIORITY", lambda p: str(p.get("max_priority", 100)), wide=True),
    ]
    return fit(columns, items, console().width if width is None else width, wide)


# -- bai session top ---------------------------------------------------------------------------------------

TOP_SORTS = ("cpu", "mem", "name")


def top_sorted(items: list[dict[str, Any]], by: str = "cpu") -> list[dict[str, Any]]:
    """Sessions for `bai session top`: by CPU or memory use (most first; unmeasured last), or by name."""
    if by == "name":
        return sorted(items, key=lambda s: s["name"])
    key = {"cpu": "cpuPct", "mem": "memBytes"}[by]
    return sorted(items, key=lambda s: (-((s.get("usage") or {}).get(key) or -1), s["name"]))


def top_table(items: list[dict[str, Any]], by: str = "cpu", wide: bool = False, width: int | None = None) -> Table:
    """One frame of `bai session top`. CPU % is of one core (200 % = two busy cores), as top shows it."""
    from bai.cli.layout import Column, fit

    def mem(s: dict[str, Any]) -> str:
        u, alloc = s.get("usage") or {}, allocated(s, "mem")
        return size(u.get("memBytes")) + (f" / {size(alloc)}" if alloc else "")

    def cpu(s: dict[str, Any]) -> str:
        value = (s.get("usage") or {}).get("cpuPct")
        return NONE_YET if value is None else f"{value:.1f}"

    def gpu(s: dict[str, Any]) -> str:
        u = s.get("usage") or {}
        if u.get("gpuPct") is None and u.get("gpuMemBytes") is None:
            return NONE_YET
        return f"{percent(u.get('gpuPct'))}, {size(u.get('gpuMemBytes'))}"

    def pids(s: dict[str, Any]) -> str:
        value = (s.get("usage") or {}).get("pids")
        return NONE_YET if value is None else str(value)

    columns = [
        Column("NAME", lambda s: s["name"]),
        Column("ID", lambda s: s["id"][:8], wide=True),
        Column("STATUS", lambda s: s["status"]),
        Column("CPU %", cpu, rank=1, right=True),
        Column("MEM USED / ALLOC", mem, rank=2),
        Column("GPU USE, MEM", gpu, wide=True),
        Column("NET IN / OUT", lambda s: _pair(s.get("usage") or {}, "netRxBytes", "netTxBytes"), rank=5),
        Column("IO READ / WRITE", lambda s: _pair(s.get("usage") or {}, "ioReadBytes", "ioWriteBytes"), rank=6),
        Column("PIDS", pids, rank=4, right=True),
        Column("AGENT", lambda s: s.get("agent") or "-", rank=3),
        Column("IMAGE", lambda s: s["image"], wide=True),
    ]
    return fit(columns, top_sorted(items, by), console().width if width is None else width, wide)


def _pair(usage: dict[str, Any], first: str, second: str) -> str:
    if usage.get(first) is None and usage.get(second) is None:
        return NONE_YET
    return f"{size(usage.get(first))} / {size(usage.get(second))}"


_UNIT = re.compile(r"(\d) (B|[KMGTP]iB|%)(?!\w)")
NBSP = "\u00a0"


def details_text(lines: list[str], width: int | None = None) -> str:
    """`session info`'s lines as a terminal of `width` shows them: a long line wraps between words (never
    inside `23.5 GiB`), its continuation indented under its value (column 12)."""
    import textwrap

    width = console().width if width is None else width
    out = []
    for line in lines:
        if len(line) <= width:
            out.append(line)
            continue
        lead = len(line) - len(line.lstrip(" "))
        indent = " " * (12 if line[10:12] == "  " else lead + 2)  # under the value of `Field       value`
        glued = _UNIT.sub(lambda m: f"{m.group(1)}{NBSP}{m.group(2)}", line)
        wrapped = textwrap.wrap(glued, width, subsequent_indent=indent, break_on_hyphens=False, break_long_words=False)
        out += [part.replace(NBSP, " ") for part in wrapped]
    return "\n".join(out)


# -- teams: users, projects, domains, scaling groups ---------------------------------------------------------


def amount_text(slot: str, value: Any) -> str:
    """One slot's amount: a size for a bytes slot (mem), else a count."""
    from bai.common.slots import is_bytes_slot

    return size(value) if is_bytes_slot(slot) else number(value)


def usage_text(p: dict[str, Any]) -> str:
    """A project's sessions' hold beside its cap, per slot: `cpu 4/16, cuda.device 8/8, mem 2 GiB/64 GiB`
    (`/unlimited` for a slot without a cap; `unlimited` alone for a project with no cap that holds nothing)."""
    cap = p.get("cap") or {}
    occupied = p.get("occupied") or {}
    parts = []
    for slot in sorted(set(cap) | set(occupied)):
        held = amount_text(slot, occupied.get(slot, 0))
        parts.append(f"{slot} {held}/{amount_text(slot, cap[slot]) if slot in cap else UNLIMITED}")
    return ", ".join(parts) or UNLIMITED


def limits_text(slots: dict[str, Any] | None) -> str:
    """Total resource slots as a limit: `cpu 16, mem 64 GiB`, or `unlimited` when none is set."""
    return ", ".join(f"{s} {amount_text(s, v)}" for s, v in sorted((slots or {}).items())) or UNLIMITED


def users_table(items: list[dict[str, Any]], wide: bool = False, width: int | None = None) -> Table:
    from bai.cli.layout import Column, fit

    columns = [
        Column("EMAIL", lambda u: u["email"]),
        Column("USERNAME", lambda u: u["username"] if u["username"] != u["email"] else "-", rank=4),
        Column("ROLE", lambda u: u["role"], rank=1),
        Column("STATUS", lambda u: u["status"]),
        Column("DOMAIN", lambda u: u["domain"], rank=2),
        Column("PROJECTS", lambda u: ", ".join(u.get("projects") or []) or "-", rank=3),
        Column("KEYS", lambda u: str(len(u.get("accessKeys") or [])), rank=5, right=True),
        Column("POLICY", lambda u: u.get("resourcePolicy") or "-", wide=True),
        Column("NAME", lambda u: u.get("fullName") or "-", wide=True),
        Column("UUID", lambda u: u["uuid"], wide=True),
    ]
    return fit(columns, items, console().width if width is None else width, wide)


def projects_table(items: list[dict[str, Any]], wide: bool = False, width: int | None = None) -> Table:
    """`bai project ls`: each project, its sessions and, per slot, what they hold of its cap."""
    from bai.cli.layout import Column, fit

    columns = [
        Column("NAME", lambda p: p["name"]),
        Column("DOMAIN", lambda p: p["domain"], rank=1),
        Column("ACTIVE", lambda p: "yes" if p.get("isActive", True) else "no", rank=3),
        Column("SESSIONS", lambda p: str(p.get("sessions", 0)), rank=2, right=True),
        Column("USED/CAP", usage_text, rest=True),
        Column("POLICY", lambda p: p.get("resourcePolicy") or "-", wide=True),
        Column("ID", lambda p: p["id"], wide=True),
        Column("DESCRIPTION", lambda p: p.get("description") or "-", wide=True),
    ]
    return fit(columns, items, console().width if width is None else width, wide)


def domains_table(items: list[dict[str, Any]], wide: bool = False, width: int | None = None) -> Table:
    from bai.cli.layout import Column, fit

    columns = [
        Column("NAME", lambda d: d["name"]),
        Column("ACTIVE", lambda d: "yes" if d.get("isActive", True) else "no"),
        Column("LIMITS", lambda d: limits_text(d.get("totalResourceSlots")), rank=1),
        Column("DESCRIPTION", lambda d: d.get("description") or "-", rest=True),
        Column("CREATED", lambda d: age(d["createdAt"]) + " ago" if d.get("createdAt") else "-", wide=True),
    ]
    return fit(columns, items, console().width if width is None else width, wide)


def open_to(g: dict[str, Any]) -> str:
    """Where a scaling group may be used: `everyone`, or the domains, projects and keypairs it is open to."""
    if g.get("open"):
        return "everyone"
    parts = [
        f"{kind} {', '.join(g.get(key) or [])}"
        for kind, key in (("domain", "domains"), ("project", "projects"), ("keypair", "keypairs"))
        if g.get(key)
    ]
    return "; ".join(parts) or "nobody"


def scaling_groups_table(items: list[dict[str, Any]], wide: bool = False, width: int | None = None) -> Table:
    from bai.cli.layout import Column, fit

    columns = [
        Column("NAME", lambda g: g["name"]),
        Column("ACTIVE", lambda g: "yes" if g.get("isActive", True) else "no", rank=2),
        Column("PUBLIC", lambda g: "yes" if g.get("isPublic", True) else "no", wide=True),
        Column("OPEN TO", open_to, rest=True),
        Column("DESCRIPTION", lambda g: g.get("description") or "-", rank=3),
    ]
    return fit(columns, items, console().width if width is None else width, wide)


def presets_table(
    items: list[dict[str, Any]], wide: bool = False, width: int | None = None, fits: bool = False
) -> Table:
    """Resource presets: name, resources, shared memory, scaling group (and, from check-presets, whether each fits)."""
    from bai.cli.layout import Column, fit

    columns = [
        Column("NAME", lambda p: p["name"]),
        Column("RESOURCES", lambda p: slots_text(p["resource_slots"]) or "-", rest=True),
        Column("SHARED MEMORY", lambda p: size(p["shared_memory"]) if p.get("shared_memory") else "-", rank=2),
        Column("SCALING GROUP", lambda p: p.get("scaling_group_name") or "every", rank=1),
    ]
    if fits:
        columns.insert(1, Column("FITS NOW", lambda p: "yes" if p.get("allocatable") else "no"))
    return fit(columns, items, console().width if width is None else width, wide)
