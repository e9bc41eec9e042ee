"""`bai usage`: what sessions held and used in a month or between two days, per keypair, user or project
(`GET /bai/usage`); the command itself is registered in bai/cli/main.py."""

from __future__ import annotations

from typing import Any

from bai.common.present import size


def period_param(month: str | None, since: str | None, until: str | None) -> str | None:
    """The `period` of `GET /bai/usage` from the options (None: the manager's current month); a message for a
    mix it cannot be."""
    if month and (since or until):
        raise ValueError("give --month, or --since and --until, not both")
    if month:
        return month
    if since or until:
        if not (since and until):
            raise ValueError("--since and --until go together (days as YYYYMMDD or YYYY-MM-DD)")
        return f"{since}..{until}"
    return None


def _hours(value: float) -> str:
    """An amount of hours: two places, and two significant digits below 0.01 (short sessions show)."""
    if value == 0:
        return "0"
    if abs(value) < 0.01:
        return f"{value:.2g}"
    return f"{value:,.2f}"


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:,.2f} h"


def usage_table(found: dict[str, Any], width: int | None = None) -> Any:
    """The rows of `GET /bai/usage` as a table: allocation times time, and what was used."""
    from bai.cli.layout import Column, fit
    from bai.cli.output import console

    by = found.get("by", "keypair")
    label = {"keypair": "KEYPAIR", "user": "USER", "project": "PROJECT"}[by]
    columns = [
        Column(label, lambda r: (r["name"] or r["key"]) if by != "keypair" else r["key"]),
        Column("USER", lambda r: r["name"] or "-", rank=3) if by == "keypair" else None,
        Column("DOMAIN", lambda r: r["domain"] or "-", rank=4),
        Column("SESSIONS", lambda r: str(r["sessions"]), right=True),
        Column("HOURS", lambda r: _hours(r["hours"]), right=True, rank=2),
        Column("CPU·H", lambda r: _hours(r["cpuCoreHours"]), right=True),
        Column("MEM GiB·H", lambda r: _hours(r["memGiBHours"]), right=True),
        Column("GPU·H", lambda r: _hours(r["gpuHours"]), right=True, rank=1),
        Column("CPU USED", lambda r: _duration(r["cpuUsedSeconds"]), right=True, rank=2),
        Column("MEM PEAK", lambda r: size(r["memPeakBytes"]) if r["memPeakBytes"] else "-", right=True, rank=3),
        Column("IO R/W", lambda r: f"{size(r['ioReadBytes'])} / {size(r['ioWriteBytes'])}", wide=True),
        Column("KEY", lambda r: r["key"], wide=True) if by != "keypair" else None,
    ]
    shown = [c for c in columns if c is not None]
    return fit(shown, found.get("items") or [], console().width if width is None else width, False)


def usage_heading(found: dict[str, Any]) -> str:
    """E.g. `Your usage in 202612 (2026-12-01 to 2026-12-31, UTC)`."""
    from datetime import datetime, timedelta

    period = found.get("period") or {}
    who = "Everyone's" if found.get("scope") == "all" else "Your"
    try:
        start = datetime.fromisoformat(period["start"])
        last = datetime.fromisoformat(period["end"]) - timedelta(days=1)
    except (KeyError, TypeError, ValueError):
        return f"{who} usage in {period.get('label', '?')}"
    return f"{who} usage in {period.get('label', '?')} ({start:%Y-%m-%d} to {last:%Y-%m-%d}, UTC)"
