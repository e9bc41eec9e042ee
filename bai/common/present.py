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
            detail = _plan_first(str(data["scheduler"].get("msg", "")))
        elif data.get("exitCode") is not None:
            detail = f"exit code {data['exitCode']}"
            if data.get("msg"):  # why it ended, when known (e.g. out of memory)
                detail = f"{data['msg']} ({detail})"
        elif data.get("msg"):
            detail = data["msg"]
    if info and detail:
        return f"{info}: {detail}"
    return info or detail


def _plan_first(msg: str) -> str:
    """A waiting session's reason with what is planned for it first (where a table cuts it short, what a user most
    wants to know stays): "reserved: starts by 14:20 UTC on a1 (no agent has room: …)", "preempting low1 on a1:
    starts once they have ended (no agent has room: …)"."""
    for mark in ("; reserved: ", "; preempting "):
        why, found, plan = msg.partition(mark)
        if found and why:
            return f"{mark[2:]}{plan} ({why})"
    return msg


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
    for label, text in scheduling_lines(h):
        lines.append(f"{label}: {text}")
    lines.append("State changes")
    for t in h["transitions"]:
        extra = f" ({t['status_info']})" if t["status_info"] else ""
        lines.append(f"  {_clock(t['at'])}  {t['status']}{extra}")
    return lines


def scheduling_lines(s: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, text) for a session's place in a multifactor queue: its priority and, while it waits, its score's
    factors and the reservation it holds (`bai session info`, `explain`, the dashboard's details)."""
    scheduler = (s.get("statusData") or {}).get("scheduler") or {}
    out: list[tuple[str, str]] = []
    factors = scheduler.get("factors") if s.get("status") == "PENDING" else None
    if factors:
        parts = ", ".join(
            f"{name.replace('_', ' ')} {factors[name]:.2f}" for name in ("priority", "fair_share", "age", "size")
        )
        out.append(("Priority", f"{s.get('priority', '?')} (score {factors['score']:g}: {parts}; each 0-1, weighted)"))
    elif s.get("priority") not in (None, 10):
        out.append(("Priority", str(s["priority"])))
    if s.get("timeLimit"):
        from bai.common.durations import format_duration

        out.append(("Time limit", format_duration(float(s["timeLimit"]))))
    reservation = scheduler.get("reservation") if s.get("status") == "PENDING" else None
    if reservation:
        agents = ", ".join(reservation.get("agents") or [])
        when = reservation.get("starts_at")
        if when:
            out.append(("Reserved", f"starts by {when[:16].replace('T', ' ')} UTC on {agents}"))
        else:
            out.append(("Reserved", f"{agents}, kept until their running sessions (of unknown length) end"))
    if scheduler.get("round") and s.get("status") == "PENDING":
        # (the last round that considered it)
        out.append(("Round", f"{scheduler['round']} (`bai scheduler replay {scheduler['round']}` replays it)"))
    preempting = scheduler.get("preempting") if s.get("status") == "PENDING" else None
    if preempting:
        out.append(("Preempting", f"{', '.join(preempting)}: it starts once they have ended"))
    if s.get("preemptible") is False:
        out.append(("Preemptible", "no (a session of a higher priority never stops it)"))
    note = (s.get("statusData") or {}).get("preemption")
    if isinstance(note, dict) and note.get("byName"):
        by = f"{note['byName']} (priority {note.get('byPriority', '?')})"
        if s.get("statusInfo") == "preempting":
            deadline = str(note.get("deadline") or "")[:19].replace("T", " ")
            out.append(("Preemption", f"to be stopped at {deadline} UTC for {by}: save your work"))
        else:
            at = str(note.get("at") or "")[:19].replace("T", " ")
            text = f"by {by} at {at} UTC"
            if note.get("ranSeconds") is not None:
                from bai.common.durations import format_duration

                text += f", after {format_duration(float(note['ranSeconds']))} running"
            if note.get("exitCode") is not None:
                text += f"; its command exited {note['exitCode']}"
            elif note.get("exit"):
                text += f"; {note['exit']}"
            if note.get("requeued"):
                text += "; requeued"
            out.append(("Preempted", text))
    return out


Clock = Callable[[], datetime]


# -- sizes and live usage, one style for the CLI: binary units, at most one decimal ("512 MiB", "1.5 GiB") --

NONE_YET = "–"  # a figure not measured yet (before a session's first usage sample)


def size(n: float | int | str | None) -> str:
    """Bytes as people read them: `512 B`, `1.5 KiB`, `210 MiB`, `1 GiB` (binary units, one decimal, no `.0`)."""
    if n is None:
        return NONE_YET
    value = float(n)
    if value == float("inf"):
        return "∞"
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
    at = 0
    while at < len(units) - 1 and abs(value) >= 1024:
        value /= 1024
        at += 1
    if at == 0:
        return f"{int(value)} B"
    text = f"{value:.1f}"
    if text in ("1024.0", "-1024.0") and at < len(units) - 1:  # 1023.96 MiB rounds up: say 1 GiB
        text, at = text.replace("1024.0", "1"), at + 1
    if text.endswith(".0"):
        text = text[:-2]
    return f"{text} {units[at]}"


def number(value: Any) -> str:
    """A count as written without trailing zeros: 2, 0.5, 1.25."""
    from decimal import Decimal

    d = Decimal(str(value)).normalize()
    return f"{d:f}"


def slots_text(slots: dict[str, Any]) -> str:
    """Resource slots from the API (`{"cpu": "2", "mem": "1073741824"}`): `cpu 2, mem 1 GiB` (zero ones left out)."""
    from bai.common.slots import is_bytes_slot

    parts = []
    for name, value in sorted(slots.items()):
        if value in (None, "", 0, "0") or float(value) == 0:
            continue
        parts.append(f"{name} {size(value) if is_bytes_slot(name) else number(value)}")
    return ", ".join(parts)


def percent(value: float | None) -> str:
    """`75 %`, `7.5 %`, `0 %`; `–` without a figure."""
    if value is None:
        return NONE_YET
    text = f"{value:.1f}" if 0 < abs(value) < 10 else f"{value:.0f}"
    return f"{text} %"


def cores(value: float) -> str:
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text


def allocated(session: dict[str, Any], slot: str) -> float | None:
    """What a session holds of a slot (its occupied slots, else what it asked for)."""
    for key in ("occupiedSlots", "requestedSlots"):
        value = (session.get(key) or {}).get(slot)
        if value not in (None, "", "0", 0):
            return float(value)
    return None


def usage_lines(session: dict[str, Any]) -> list[str]:
    """A session's live use beside what it holds: `cpu  1.5 of 2 cores (75 %)`, `mem  210 MiB of 1 GiB (peak
    250 MiB)`, net, io, pids (and GPUs when measured); one line with `–` before the first sample."""
    u = session.get("usage")
    if not u:
        return [f"cpu {NONE_YET}   mem {NONE_YET}   (no sample yet)"]
    lines = []
    cpu_alloc, mem_alloc = allocated(session, "cpu"), allocated(session, "mem")
    if u.get("cpuPct") is not None:
        used = u["cpuPct"] / 100
        if cpu_alloc:
            lines.append(f"cpu   {cores(used)} of {number(cpu_alloc)} cores ({percent(u['cpuPct'] / cpu_alloc)})")
        else:
            lines.append(f"cpu   {cores(used)} cores")
    else:
        lines.append(f"cpu   {NONE_YET}")
    if u.get("memBytes") is not None:
        line = f"mem   {size(u['memBytes'])}" + (f" of {size(mem_alloc)}" if mem_alloc else "")
        if u.get("memPeakBytes") is not None:
            line += f" (peak {size(u['memPeakBytes'])})"
        lines.append(line)
    else:
        lines.append(f"mem   {NONE_YET}")
    if u.get("netRxBytes") is not None or u.get("netTxBytes") is not None:
        lines.append(f"net   {size(u.get('netRxBytes'))} received, {size(u.get('netTxBytes'))} sent")
    if u.get("ioReadBytes") is not None or u.get("ioWriteBytes") is not None:
        lines.append(f"io    {size(u.get('ioReadBytes'))} read, {size(u.get('ioWriteBytes'))} written")
    if u.get("pids") is not None:
        lines.append(f"pids  {u['pids']}")
    if u.get("gpuPct") is not None or u.get("gpuMemBytes") is not None:
        lines.append(f"gpu   {percent(u.get('gpuPct'))}, memory {size(u.get('gpuMemBytes'))}")
    return lines


def preset_check_lines(answer: dict[str, Any]) -> list[str]:
    """check-presets' figures (`bai preset check`, the dashboard's :presets): what the caller may still take, and
    what each scaling group has free for it (`unlimited` for a slot without a limit)."""
    from bai.common.slots import is_bytes_slot

    def amounts(slots: dict[str, Any]) -> str:
        def amount(slot: str, value: Any) -> str:
            if value == "Infinity":
                return "unlimited"
            return size(value) if is_bytes_slot(slot) else number(value)

        return ", ".join(f"{s} {amount(s, v)}" for s, v in sorted(slots.items())) or "-"

    lines = [f"you may still take: {amounts(answer.get('keypair_remaining') or {})}"]
    for name, group in sorted((answer.get("scaling_groups") or {}).items()):
        lines.append(f"free for you in scaling group {name}: {amounts(group.get('remaining') or {})}")
    return lines


FAIR_SHARE_COLUMNS = ("USAGE", "PART", "FACTOR", "WAITING")


def usage_text(seconds: float) -> str:
    """Fair share's decayed usage (GPU-weighted slot-seconds) in the unit that reads best: `1,234 h`, `12.50 h`,
    `7.5 min`, `3.4 s`, `0`."""
    if seconds <= 0:
        return "0"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    hours = seconds / 3600
    return f"{hours:,.2f} h" if hours < 100 else f"{hours:,.0f} h"


def fair_share_header(answer: dict[str, Any]) -> str:
    """What fair share's figures mean (`GET /bai/scheduler/fair-share`'s answer)."""
    days = answer["halfLifeSeconds"] / 86400
    half_life = f"{days:g} days" if days >= 1 else f"{answer['halfLifeSeconds'] / 3600:g} hours"
    return (
        f"Usage: slot-time (a core 1, a GiB 0.1, a GPU {answer['gpuWeight']:g}), halving every {half_life}. "
        f"Factor: 2^-(part x N), N the keypairs compared ({answer['compared']['keypairs']}): 1 for no usage, 0.5 "
        "for an equal part."
    )


def fair_share_table(rows: list[dict[str, Any]], first: str, second: str, *fields: str, expand: bool = False) -> Any:
    """A rich table of fair share's keypairs (fields `accessKey`, `user`) or projects (`name`, `projectId`), headed
    `first`, `second`, then FAIR_SHARE_COLUMNS: the figures and up to 20 characters of the first column are never
    cut; the second (a user, a project's id) gives way first, shortened on one line."""
    from rich.table import Table

    table = Table(box=None, pad_edge=False, padding=(0, 2, 0, 0) if expand else (0, 1), header_style="bold",
                  expand=expand)  # fmt: skip
    found = fair_share_rows(rows, *fields)
    for i, column in enumerate((first, second, *FAIR_SHARE_COLUMNS)):
        widest = max([len(column), *(len(row[i]) for row in found)])
        table.add_column(
            column,
            justify="right" if column in FAIR_SHARE_COLUMNS else "left",
            no_wrap=i != 1,
            overflow="ellipsis",
            min_width=None if i == 1 else min(widest, 20) if i == 0 else widest,
        )
    for row in found:
        table.add_row(*row)
    return table


def fair_share_rows(rows: list[dict[str, Any]], first: str, second: str) -> list[tuple[str, ...]]:
    """Fair share's keypairs (`accessKey`, `user`) or projects (`name`, `projectId`) as table rows: those two fields
    ("-" for none), then FAIR_SHARE_COLUMNS."""
    return [
        (
            r[first] or "-",
            r[second] or "-",
            usage_text(r["usage"]),
            f"{r['part']:.1%}",
            f"{r['factor']:.3f}",
            str(r["waiting"]),
        )  # fmt: skip
        for r in rows
    ]
