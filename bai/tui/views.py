"""The dashboard's views: agents, sessions, one session's details, and a kernel's live log.

Attributes down, messages up: a view draws what it is given when it is made (the cluster model, a clock,
the terminal's width) and what the app sets on it; what the user asks of it (describe this session, show
this agent's sessions) goes up as a message that the app handles. Nothing here imports the app.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from decimal import Decimal
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import DataTable, Static

from bai.common.present import age, explain_lines, utc_now
from bai.common.slots import from_wire
from bai.tui.model import ClusterModel, Filter, LogBuffer, group_of
from bai.tui.tables import Column, TableSync
from bai.tui.widgets import LogView, bar, compact, slot_cell

Clock = Callable[[], datetime]

STATUS_STYLE = {
    "PENDING": "yellow",
    "SCHEDULED": "cyan",
    "PREPARING": "cyan",
    "PULLING": "cyan",
    "RUNNING": "green",
    "RUNNING_DEGRADED": "yellow",
    "RESTARTING": "yellow",
    "TERMINATING": "magenta",
    "TERMINATED": "grey50",
    "CANCELLED": "grey50",
    "ERROR": "bold red",
    "ALIVE": "green",
    "LOST": "bold red",
}


def styled_status(status: str) -> Text:
    return Text(status, style=STATUS_STYLE.get(status, ""))


def gpu_cell(gpus: list[dict[str, Any]]) -> Text:
    """Each GPU as utilisation·held, e.g. `37%·0.5 0%·1` (held: the share kernels hold)."""
    if not gpus:
        return Text("-", style="dim")
    text = Text()
    for g in gpus:
        util = "?" if g.get("utilization") is None else f"{g['utilization']}%"
        held = Decimal(g.get("allocated") or 0)
        if text:
            text.append(" ")
        text.append(f"{util}·{held.normalize():f}", style="green" if held < 1 else "yellow")
    return text


def slots_text(slots: dict[str, str]) -> str:
    values = from_wire(slots)
    order = [n for n in ("cpu", "mem") if n in values] + sorted(set(values) - {"cpu", "mem"})
    return " ".join(f"{n} {compact(n, values[n])}" for n in order if values[n])


class ShellRequested(Message):
    """`s` on a session (in the sessions or the describe view): open a shell in it. The app decides
    whether it can (a running session, a dashboard that is not read-only) and says why not."""

    def __init__(self, session_id: str | None) -> None:
        super().__init__()
        self.session_id = session_id


class ForwardRequested(Message):
    """`f` on a session (in the sessions or the describe view): list its apps to forward one to a local
    port (as k9s's port-forward). The app decides whether it can, as for `ShellRequested`."""

    def __init__(self, session_id: str | None) -> None:
        super().__init__()
        self.session_id = session_id


SHELL_BINDING = Binding("s", "shell", "Shell")
FORWARD_BINDING = Binding("f", "forward", "Forward")
SESSION_BINDINGS = [SHELL_BINDING, FORWARD_BINDING]


class SessionKeys:
    """`s` and `f` (SESSION_BINDINGS, in the view's BINDINGS): ask for a shell in the view's session, or
    for one of its apps on a local port; both hidden when the dashboard is read-only."""

    read_only = False

    def action_shell(self) -> None:
        self.post_message(ShellRequested(self.shell_session()))  # type: ignore[attr-defined]

    def action_forward(self) -> None:
        self.post_message(ForwardRequested(self.shell_session()))  # type: ignore[attr-defined]

    def shell_session(self) -> str | None:
        """The session the keys act on."""
        raise NotImplementedError

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("shell", "forward"):
            return not self.read_only
        return True


class View(Vertical):
    """A view of the dashboard; `refresh_view` redraws it from what it was given."""

    def refresh_view(self) -> None:
        pass


class TableView(View):
    """A view with a table drawn from the cluster model, with ages taken from `clock`.

    `width` gives the terminal's width: a view drawn as it is switched to is not laid out yet (its own
    width is 0) and draws for the terminal's width meanwhile."""

    def __init__(
        self, model: ClusterModel, *, clock: Clock = utc_now, width: Callable[[], int] | None = None, **kw
    ) -> None:
        super().__init__(**kw)
        self.model = model
        self.clock = clock
        self.terminal_width = width

    def on_mount(self) -> None:
        self.sync = TableSync(self.query_one(DataTable))

    def _width(self) -> int:
        if self.size.width:
            return self.size.width
        return self.terminal_width() if self.terminal_width is not None else 80


class AgentsView(TableView):
    """The agents table: status, backend, group, heartbeat age, slot bars."""

    DEFAULT_CSS = """
    AgentsView #agents-total { height: auto; padding: 0 1; }
    AgentsView DataTable { height: 1fr; }
    """

    class Chosen(Message):
        """Enter on an agent: show its sessions."""

        def __init__(self, agent_id: str) -> None:
            super().__init__()
            self.agent_id = agent_id

    def compose(self) -> ComposeResult:
        yield Static(id="agents-total")
        yield DataTable(id="agents-table", cursor_type="row")

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if event.row_key.value:
            self.post_message(self.Chosen(event.row_key.value))

    def _columns(self, width: int, slots: list[str]) -> list[Column]:
        model = self.model
        id_width = min(max((len(a) for a in model.agents), default=8), 28)
        cols = [Column("id", "AGENT", id_width)]
        if width >= 120:
            cols.append(Column("host", "HOST", 14))
        cols += [
            Column("status", "STATUS", 6),
            Column("backend", "BACKEND", 7),
            Column("group", "GROUP", 9 if width >= 100 else 7),
            Column("hb", "SEEN", 4),
        ]
        if any(a.get("gpus") for a in model.agents.values()):
            cols.append(Column("gpus", "GPUS util·held", 24 if width >= 120 else 14))
        if any(a.get("warm") for a in model.agents.values()):  # agents with a warm pool
            cols.append(Column("warm", "WARM", 7))
        used = sum((c.width or 0) + 2 for c in cols)
        per_slot = max(14, (width - used - 2) // max(1, len(slots)) - 2)
        cols += [Column(f"slot:{name}", name.upper(), per_slot) for name in slots]
        return cols

    def refresh_view(self) -> None:
        model = self.model
        now = self.clock()
        width = self._width()
        slots = model.slot_names()
        columns = self._columns(width, slots)
        self.sync.set_columns(columns)
        per_slot = columns[-1].width if slots else 0
        bar_width = max(0, (per_slot or 0) - 12)
        rows = []
        for a in model.agent_rows():
            cap, used = from_wire(a.get("availableSlots")), from_wire(a.get("occupiedSlots"))
            cells: list[Any] = [a["id"]]
            if width >= 120:
                cells.append(a.get("hostname") or "")
            cells += [
                styled_status(a["status"]),
                a.get("backend") or "",
                a.get("scalingGroup") or "",
                age(a.get("lastSeen"), now),
            ]
            if any(c.key == "gpus" for c in columns):
                cells.append(gpu_cell(a.get("gpus") or []))
            if any(c.key == "warm" for c in columns):
                warm = a.get("warm") or {}
                cells.append(f"warm {sum(int(n) for n in warm.values())}" if warm else "")
            for name in slots:
                cells.append(slot_cell(name, used.get(name, Decimal(0)), cap.get(name, Decimal(0)), bar_width))
            rows.append((a["id"], tuple(cells)))
        self.sync.sync(rows)
        cap, used, alive = model.totals()
        total = Text()
        total.append("Cluster ", style="bold")
        total.append(f"{alive}/{len(model.agents)} agents alive")
        total_bar = 20 if width >= 120 else 8
        for name in slots:
            total.append(f"  {name} ", style="bold")
            total.append_text(bar(used.get(name, Decimal(0)), cap.get(name, Decimal(0)), total_bar))
            total.append(f" {compact(name, used.get(name, Decimal(0)))}/{compact(name, cap.get(name, Decimal(0)))}")
        self.query_one("#agents-total", Static).update(total)


class SessionsView(SessionKeys, TableView):
    """The sessions table: status, where or why waiting, slots, age, exit or reason."""

    DEFAULT_CSS = """
    SessionsView #sessions-summary { height: 1; padding: 0 1; }
    SessionsView DataTable { height: 1fr; }
    """
    BINDINGS = SESSION_BINDINGS

    class Chosen(Message):
        """Enter on a session: describe it."""

        def __init__(self, session_id: str) -> None:
            super().__init__()
            self.session_id = session_id

    def __init__(self, model: ClusterModel, *, read_only: bool = False, **kw) -> None:
        super().__init__(model, **kw)
        self.filter = Filter()
        self.read_only = read_only

    def compose(self) -> ComposeResult:
        yield Static(id="sessions-summary")
        yield DataTable(id="sessions-table", cursor_type="row")

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if event.row_key.value is not None:
            self.post_message(self.Chosen(event.row_key.value))

    def selected(self) -> str | None:
        return self.sync.selected_key() if self.sync.keys else None

    def shell_session(self) -> str | None:
        return self.selected()

    def _columns(self, width: int) -> list[Column]:
        medium, wide = width >= 100, width >= 160
        cols = [Column("name", "NAME", 22 if wide else 18 if medium else 14)]
        if medium:
            cols.append(Column("id", "ID", 8))
        if wide:
            cols.append(Column("owner", "OWNER", 20))
        cols += [
            Column("status", "STATUS", 10),
            Column("where", "AGENT / QUEUE", 20 if wide else 14 if medium else 12),
        ]
        if wide:
            cols.append(Column("image", "IMAGE", 20))
            cols.append(Column("type", "TYPE", 5))
        cols += [Column("slots", "SLOTS", 20 if wide else 16 if medium else 11), Column("age", "AGE", 4)]
        used = sum((c.width or 0) + 2 for c in cols) + 2  # cell padding, and the scroll bar
        cols.append(Column("info", "EXIT / REASON", max(12, width - used - 2)))
        return cols

    def refresh_view(self) -> None:
        model = self.model
        now = self.clock()
        width = self._width()
        medium, wide = width >= 100, width >= 160
        self.sync.set_columns(self._columns(width))
        items = model.session_rows(self.filter)
        rows = []
        for s in items:
            group = group_of(s["status"])
            if group == "pending":
                pos = s.get("queuePosition")
                where = Text(f"queue #{pos}" if pos else "queue", style="yellow")
                info = s.get("reason") or ""
            else:
                where = Text(s.get("agent") or "-")
                info = s.get("reason") or ""
                outcome = run_outcome(s)
                if group == "finished" and outcome:
                    # the exit code first; the status info (its detail is the same exit code) after it
                    status_info = s.get("statusInfo") or ""
                    info = outcome + (f" · {status_info}" if status_info else "")
                elif outcome:  # still running: how its last run ended
                    info = f"last run {outcome}" + (f" · {info}" if info else "")
            cells: list[Any] = [s["name"]]
            if medium:
                cells.append(s["id"][:8])
            if wide:
                cells.append(s["accessKey"])
            cells += [styled_status(s["status"]), where]
            if wide:
                cells += [s["image"], s["type"][:5].lower()]
            cells += [slots_text(s.get("requestedSlots") or {}), age(s["creationTime"], now), info]
            rows.append((s["id"], tuple(cells)))
        self.sync.sync(rows)
        counts = model.counts()
        summary = Text()
        summary.append("Sessions ", style="bold")
        summary.append(f"{counts['pending']} pending", style="yellow")
        summary.append(" · ")
        summary.append(f"{counts['running']} running", style="green")
        summary.append(f" · {counts['finished']} finished")
        if self.filter:
            summary.append(f"   filter /{self.filter.text}  ({len(items)} shown)", style="bold cyan")
        self.query_one("#sessions-summary", Static).update(summary)


class DetailView(SessionKeys, View):
    """One session: what it is, where it runs, its kernels and mounts, and its history."""

    DEFAULT_CSS = """
    DetailView VerticalScroll { height: 1fr; padding: 0 1; }
    """
    BINDINGS = SESSION_BINDINGS

    def __init__(
        self,
        *,
        clock: Clock = utc_now,
        read_only: bool = False,
        forwards: dict[tuple[str, str], str] | None = None,
        **kw,
    ) -> None:
        """`forwards`: the local URL of each app forwarded, by (session id, app name); the app keeps it."""
        super().__init__(**kw)
        self.clock = clock
        self.read_only = read_only
        self.forwards = forwards if forwards is not None else {}
        self.session_id: str | None = None
        self.detail: dict[str, Any] | None = None
        self.history: dict[str, Any] | None = None
        self.error: str | None = None

    def compose(self) -> ComposeResult:
        with VerticalScroll(can_focus=True, id="detail-scroll"):
            yield Static(id="detail-body")

    def show(self, session_id: str, detail: dict[str, Any] | None, history: dict[str, Any] | None, error=None) -> None:
        self.session_id, self.detail, self.history, self.error = session_id, detail, history, error
        self.refresh_view()

    def shell_session(self) -> str | None:
        return self.session_id

    def refresh_view(self) -> None:
        body = self.query_one("#detail-body", Static)
        if self.session_id is None:
            body.update(Text("No session chosen: pick one in the sessions view (2) and press d or Enter."))
            return
        if self.detail is None:
            body.update(Text(self.error or "loading…", style="red" if self.error else "dim"))
            return
        sid = self.session_id
        forwarded = {app: url for (session, app), url in self.forwards.items() if session == sid}
        body.update(render_detail(self.detail, self.history, self.clock(), forwarded))


def _field_table() -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    return table


def _stamp(iso: str) -> str:
    """2026-11-29 13:11:33.279 (UTC, as stored)."""
    from datetime import datetime

    return datetime.fromisoformat(iso).strftime("%Y-%m-%d %H:%M:%S.%f")[:23]


def run_outcome(s: dict[str, Any]) -> str:
    """`exit 3 FAILURE`: how the session's last run ended ("" before any ended)."""
    result = s.get("result") or ""
    result = "" if result == "UNDEFINED" else result
    if s.get("exitCode") is None:
        return result
    return f"exit {s['exitCode']}" + (f" {result}" if result else "")


def app_line(a: dict[str, Any], name_width: int = 0, url: str | None = None) -> Text:
    """`jupyterlab  http 8090  127.0.0.1:30001` (where published) `  → URL` (while forwarded)."""
    text = Text()
    ports = ",".join(str(p) for p in a.get("ports") or [])
    text.append(f"{str(a.get('name')):<{name_width}}  ", style="bold")
    text.append(f"{a.get('protocol')} {ports}")
    published = ", ".join(f"127.0.0.1:{p}" for p in a.get("host_ports") or [])
    if published:
        text.append(f"  {published}", style="cyan")
    if url:
        text.append(f"  → {url}", style="bold green")
    return text


def apps_text(apps: list[dict[str, Any]], forwarded: dict[str, str] | None = None) -> Text:
    """One `app_line` per app, the names aligned, with its local URL while the dashboard forwards it;
    "none" (dim) without apps."""
    if not apps:
        return Text("none", style="dim")
    forwarded = forwarded or {}
    width = max(len(str(a.get("name"))) for a in apps)
    return Text("\n").join(app_line(a, width, forwarded.get(str(a.get("name")))) for a in apps)


def render_detail(
    s: dict[str, Any], history: dict[str, Any] | None, now, forwarded: dict[str, str] | None = None
) -> Group:
    """The session's fields, kernels, status history and scheduler decisions; `forwarded` gives the local
    URL of each of its apps the dashboard forwards (f)."""
    from bai.common.present import reason

    fields = _field_table()
    fields.add_row("Session", Text(f"{s['name']}  ") + Text(s["id"], style="dim"))
    fields.add_row(
        "Status",
        Text.assemble(
            (s["status"], STATUS_STYLE.get(s["status"], "")), f"  since {age(s.get('statusChanged'), now)} ago"
        ),
    )
    why = reason(s)
    if why:
        fields.add_row("Status info", why)
    if s.get("queuePosition"):
        fields.add_row("Queue", f"position {s['queuePosition']} of the pending sessions")
    scheduler = (s.get("statusData") or {}).get("scheduler") or {}
    for p in scheduler.get("failed_predicates") or []:
        fields.add_row("  blocked by", Text(p["name"], style="yellow") + Text(f": {p['msg']}"))
    fields.add_row("Image", s["image"])
    fields.add_row("Type", s["type"].lower())
    fields.add_row("Owner", s["accessKey"])
    fields.add_row("Resources", slots_text(s.get("requestedSlots") or {}) or "-")
    fields.add_row("Agent", s.get("agent") or "-")
    if s.get("network"):  # asked for when created (else the agent's own, none unless configured)
        fields.add_row("Network", s["network"])
    fields.add_row("Created", f"{s['creationTime'][:19].replace('T', ' ')}  ({age(s['creationTime'], now)} ago)")
    if s.get("terminationTime"):
        fields.add_row("Ended", s["terminationTime"][:19].replace("T", " "))
    if s.get("exitCode") is not None:
        fields.add_row("Exit code", str(s["exitCode"]))
    if s.get("result") and s["result"] != "UNDEFINED":
        fields.add_row("Result", Text(s["result"], style="green" if s["result"] == "SUCCESS" else "red"))
    mounts = s.get("mounts") or []
    fields.add_row(
        "Mounts",
        "\n".join(f"{m['name']} → {m['target']}" + (" (read-only)" if m["readOnly"] else "") for m in mounts)
        if mounts
        else Text("none", style="dim"),
    )
    fields.add_row("Apps", apps_text(s.get("servicePorts") or [], forwarded))

    kernels = Table(title="Kernels", title_justify="left", title_style="bold", box=None, header_style="bold")
    with_gpus = any(k.get("devices") for k in s.get("kernels", []))
    for col in ("ID", "ROLE", "AGENT", "CONTAINER", "STATUS", "EXIT", *(("GPUS",) if with_gpus else ())):
        kernels.add_column(col, no_wrap=True)
    for k in s.get("kernels", []):
        exit_code = k.get("exitCode")
        row = [
            k["id"][:8],
            f"{k['clusterRole']}{k.get('clusterIdx', '')}",
            k.get("agent") or "-",
            (k.get("containerId") or "-")[:12],
            styled_status(k["status"]),
            "-" if exit_code is None else str(exit_code),
        ]
        if with_gpus:  # which GPU (and how much of it) the kernel holds
            row.append(", ".join(f"{d['uuid']} ×{d['share']}" for d in k.get("devices") or []) or "-")
        kernels.add_row(*row)

    transitions = Table(title="Status history", title_justify="left", title_style="bold", box=None)
    transitions.add_column("AT", no_wrap=True, style="dim")
    transitions.add_column("STATUS", no_wrap=True)
    transitions.add_column("INFO")
    for t in s.get("transitions") or []:
        transitions.add_row(_stamp(t["at"]), styled_status(t["status"]), t.get("status_info") or "")

    parts: list[Any] = [fields, Text(""), kernels, Text(""), transitions]
    if history is not None:
        lines = explain_lines(history)
        # the decision part only (the state changes are above)
        cut = lines.index("State changes") if "State changes" in lines else len(lines)
        parts += [Text(""), Text("Scheduler decisions", style="bold")]
        parts += [Text(line) for line in lines[1:cut]]
    return Group(*parts)


class LogsView(View):
    """A kernel's output, live: `/` filter (`!` inverts), t timestamps, w wrap, G end, g start."""

    DEFAULT_CSS = """
    LogsView #logs-status { height: 1; padding: 0 1; }
    LogsView LogView { height: 1fr; }
    """

    def __init__(self, max_lines: int = 10_000, **kw) -> None:
        super().__init__(**kw)
        self.buffer = LogBuffer(max_lines)
        self.session_id: str | None = None
        self.session_name = ""
        self.kernel_id: str | None = None
        self.state = "no session"

    def compose(self) -> ComposeResult:
        yield Static(id="logs-status")
        yield LogView(self.buffer, id="log-view")

    @property
    def log_view(self) -> LogView:
        return self.query_one(LogView)

    def reset(self, session_id: str, name: str) -> None:
        self.session_id, self.session_name, self.kernel_id = session_id, name, None
        self.buffer.clear()
        self.log_view.following = True
        self.log_view.new_while_paused = 0
        self.log_view.rebuild()
        self.state = "connecting"
        self.refresh_view()

    def feed(self, chunks: list[list[Any]]) -> None:
        added = []
        for seq, text, ts in chunks:
            added += self.buffer.feed(text, ts, seq)
        shown = self.query(LogView)  # none while the view is being built or torn down: the buffer has them
        if shown:
            shown.first().lines_added(added)

    def refresh_view(self) -> None:
        view = self.log_view
        status = Text()
        if self.session_id is None:
            status.append("No session chosen: pick one in the sessions view (2) and press l.")
            self.query_one("#logs-status", Static).update(status)
            return
        status.append("Logs ", style="bold")
        status.append(self.session_name)
        if self.kernel_id:
            status.append(f" · kernel {self.kernel_id[:8]}", style="dim")
        status.append(" · ")
        if self.buffer.ended:
            status.append("ended", style="grey50")
        elif view.following:
            status.append("following", style="green")
        else:
            status.append(f"PAUSED (+{view.new_while_paused} new, G to follow)", style="bold yellow")
        if self.state != "live" and not self.buffer.ended:
            status.append(f" · {self.state}", style="dim")
        status.append(f" · {len(self.buffer.lines)} lines")
        if view.filter:
            status.append(f" · filter /{view.filter.text}", style="bold cyan")
        flags = [name for name, on in (("ts", view.timestamps), ("wrap", view.wrap_lines)) if on]
        if flags:
            status.append(" · " + " ".join(flags), style="cyan")
        self.query_one("#logs-status", Static).update(status)
