"""`bai manager ls`: the managers of the node's database, which one leads and since when, and the database."""

from __future__ import annotations

from typing import Any

import typer

from bai.cli.common import call, show

app = typer.Typer(help="Managers: the processes that serve the API over one database.", no_args_is_help=True)


def managers_table(status: dict[str, Any]) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("ID", "ROLE", "API", "LINK", "PID", "SEEN", "SINCE"):
        table.add_column(column, no_wrap=column in {"ID", "ROLE"})
    for m in status.get("managers") or []:
        role = "leader" if m.get("leader") else "follower" if m.get("alive", True) else "gone"
        name = m["id"] + (" (this)" if m.get("self") else "")
        seen = "now" if (m.get("seenAgo") or 0) < 2 else f"{m['seenAgo']:g}s ago"
        since = (m.get("leaderSince") or m.get("startedAt") or "")[:19].replace("T", " ")
        table.add_row(name, role, m.get("api", ""), m.get("link", ""), str(m.get("pid", "")), seen, since)
    line = f"database  {status.get('database') or '?'}"
    if status.get("databaseError"):
        line += f"  (cannot be reached: {status['databaseError']})"
    return Group(Text(line), table)


@app.command("ls")
def manager_ls(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List the managers of this node's database: which one leads (runs the scheduling rounds and timers)
    and since when, where each serves the API and where agents dial it."""
    show(call(lambda c: c.manager_status()), as_json, managers_table)
