"""The dashboard's views: agents, sessions, one session's details, and a kernel's live log.

Attributes down, messages up: a view draws what it is given when it is made (the cluster model, a clock,
the terminal's width) and what the app sets on it; what the user asks of it (describe this session, show
this agent's sessions) goes up as a message that the app handles. Nothing here imports the app.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from rich.ansi import re_ansi
from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import DataTable, Static

from bai.common.present import age, explain_lines, scheduling_lines, utc_now
from bai.common.slots import from_wire
from bai.common.timing import duration, parse_time, started_at
from bai.tui.model import GROUPS, ClusterModel, Filter, LogBuffer, group_of, is_failed
from bai.tui.tables import DOWN, UP, Column, KeyTable, TableSync, fit_columns
from bai.tui.widgets import NO_FIGURE, LogView, bar, bytes_label, compact, cpu_label, gauge, separator

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
    "PREEMPTED": "magenta",
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


_SLOTS_TEXT: dict[tuple[tuple[str, str], ...], str] = {}


def _slots_text_of(s: dict[str, Any]) -> str:
    """`slots_text` of a session's requested slots, remembered (most sessions ask for the same)."""
    key = tuple(sorted((s.get("requestedSlots") or {}).items()))
    text = _SLOTS_TEXT.get(key)
    if text is None:
        if len(_SLOTS_TEXT) > 4096:
            _SLOTS_TEXT.clear()
        text = _SLOTS_TEXT[key] = slots_text(dict(key))
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


# -- live figures, timing and sorting of the tables --------------------------------------------------

Figure = tuple[float | None, float | None, str]  # (value, what it is measured against, its label)


def _usage(row: dict[str, Any], key: str) -> float | None:
    usage = row.get("usage") or {}
    value = usage.get(key)
    return None if value is None else float(value)


_REQUESTED: dict[tuple[tuple[str, str], ...], tuple[float, float]] = {}


def _requested(s: dict[str, Any]) -> tuple[float, float]:
    """The cpu and mem (bytes) a session asked for, 0 when not; remembered (most ask for the same)."""
    key = tuple(sorted((s.get("requestedSlots") or {}).items()))
    found = _REQUESTED.get(key)
    if found is None:
        if len(_REQUESTED) > 4096:
            _REQUESTED.clear()
        values = from_wire(dict(key))
        found = _REQUESTED[key] = (float(values.get("cpu", 0)), float(values.get("mem", 0)))
    return found


def session_cpu(s: dict[str, Any]) -> Figure:
    """CPU in percent of one core, against the cores the session asked for (none once it ended)."""
    pct = None if group_of(s["status"]) == "finished" else _usage(s, "cpuPct")
    if pct is None:
        return None, None, ""
    cores = _requested(s)[0]
    return pct, cores * 100 if cores else None, cpu_label(pct)


def session_mem(s: dict[str, Any], with_cap: bool = False) -> Figure:
    """Memory in use against the memory the session asked for (`with_cap`: the label names both; none
    once it ended)."""
    used = None if group_of(s["status"]) == "finished" else _usage(s, "memBytes")
    if used is None:
        return None, None, ""
    cap = _requested(s)[1]
    label = bytes_label(used) + (f"/{bytes_label(cap)}" if with_cap and cap else "")
    return used, cap or None, label


def agent_cpu(a: dict[str, Any]) -> Figure:
    """The host's CPU in percent of one core, against all its cores (else the agent's cpu slots)."""
    pct = _usage(a, "cpuPct")
    cores = _usage(a, "cpuCount") or float(from_wire(a.get("availableSlots") or {}).get("cpu") or 0)
    return pct, cores * 100 or None, "" if pct is None else cpu_label(pct)


def agent_mem(a: dict[str, Any]) -> Figure:
    """The host's memory in use against its total (else the agent's mem slots)."""
    used = _usage(a, "memBytes")
    total = _usage(a, "memTotalBytes") or float(from_wire(a.get("availableSlots") or {}).get("mem") or 0)
    if used is None:
        return None, None, ""
    return used, total or None, bytes_label(used) + (f"/{bytes_label(total)}" if total else "")


def gauge_widths(figures: list[Figure], width: int) -> tuple[int, int]:
    """(bar, label) widths in a column of live figures `width` wide: bars as wide as the longest label
    leaves (none under 2 cells)."""
    label_width = max((len(label) for value, _, label in figures if value is not None), default=0)
    bar_width = width - label_width - 1
    return (0 if bar_width < 2 else bar_width), label_width


def gauge_column(figures: list[Figure], width: int) -> list[Text]:
    """The cells of a column of live figures `width` wide, labels aligned on the right."""
    bar_width, label_width = gauge_widths(figures, width)
    return [gauge(value, cap, bar_width, label.rjust(label_width)) for value, cap, label in figures]


def queue_and_run(s: dict[str, Any], now: datetime) -> str:
    """`queued 2m 1s, ran 19m 2s` (`running` while it runs): the time it waited and the time it ran, apart;
    "" when it is not known when it started (then only its age is shown)."""
    start = started_at(s)
    created = parse_time(s.get("creationTime"))
    if start is None:
        return ""
    finished = group_of(s["status"]) == "finished"
    end = (parse_time(s.get("terminationTime") or s.get("statusChanged")) if finished else now) or now
    parts = []
    if created is not None and (start - created).total_seconds() >= 1:
        parts.append(f"queued {duration((start - created).total_seconds())}")
    parts.append(f"{'ran' if finished else 'running'} {duration((end - start).total_seconds())}")
    return ", ".join(parts)


def run_timing(s: dict[str, Any], now: datetime) -> str:
    """A finished session's `queued 5s, ran 2m 3s · ended 14:02` (UTC; with the date when not within the last
    20 hours): how long it waited and how long it ran, apart, when it is known that it started."""
    end = parse_time(s.get("terminationTime") or s.get("statusChanged"))
    if end is None:
        return ""
    parts = [queue_and_run(s, now)]
    shown = end.strftime("%H:%M") if (now - end).total_seconds() < 20 * 3600 else end.strftime("%m-%d %H:%M")
    parts.append(f"ended {shown}")
    return " · ".join(p for p in parts if p)


def last_run(s: dict[str, Any]) -> str:
    """A live session's `last run: exit 137`: how its previous run ended, which is not the session's fate."""
    if s.get("exitCode") is None:
        return ""
    return f"last run: exit {s['exitCode']}"


def info_text(s: dict[str, Any], now: datetime) -> str:
    """The EXIT / REASON cell: a finished run's exit code first, how long it waited and ran and when it
    ended, then the status info; a cancelled or failed one's reason first; a waiting one's reason; a live
    one's last run (`last run: exit 137`), which says nothing of the session itself."""
    reason = s.get("reason") or ""
    if group_of(s["status"]) == "finished":
        outcome = run_outcome(s)
        if s.get("exitCode") is not None:  # the row's colour says whether it failed: the code is enough
            outcome = f"exit {s['exitCode']}"
        parts = [outcome or reason]
        parts.append(run_timing(s, now))
        if outcome and s.get("statusInfo"):
            parts.append(s["statusInfo"])
        return " · ".join(p for p in parts if p)
    previous = last_run(s)
    if previous:
        return previous + (f" · {_words_of(reason)}" if reason else "")
    return _words_of(reason)


def _words_of(reason: str) -> str:
    """A waiting session's reason in words: without Backend.AI's status slug in front when words follow
    (`no-available-instances: no agent has 4 cpu free` -> `no agent has 4 cpu free`); `r` and the detail
    view show it whole."""
    slug, sep, words = reason.partition(": ")
    return words if sep and words and slug.replace("-", "").isalpha() and slug.islower() else reason


def reason_text(s: dict[str, Any], now: datetime) -> Text:
    """`r` in the sessions view: the session, its status and outcome, and its whole reason."""
    from bai.common.present import reason

    failed = is_failed(s)
    text = Text()
    text.append(s["name"], style="bold")
    text.append("  ")
    text.append(s["status"], style="bold red" if failed else STATUS_STYLE.get(s["status"], ""))
    ended = group_of(s["status"]) == "finished"
    outcome = run_outcome(s) if ended else last_run(s)
    timing = run_timing(s, now) if ended else queue_and_run(s, now)
    for part in (outcome, timing):
        if part:
            text.append(f" · {part}", style="red" if failed and part == outcome else "")
    why = max(reason(s), s.get("reason") or "", key=len)
    text.append("\n")
    text.append(why or "no reason given", style="" if why else "dim")
    return text


@dataclass(frozen=True)
class Sort:
    """A column the table sorts by: shift + `letter`; `value` of a row (None: last), `descending` first."""

    letter: str
    label: str
    value: Callable[[dict[str, Any]], Any]
    descending: bool = False


def _epoch(iso: str | None) -> float | None:
    t = parse_time(iso)
    return None if t is None else t.timestamp()


def _neg(x: float | None) -> float | None:
    return None if x is None else -x


def _lower(key: str) -> Callable[[dict[str, Any]], Any]:
    return lambda row: str(row.get(key) or "").lower() or None


SESSION_SORTS: dict[str, Sort] = {
    "name": Sort("N", "NAME", _lower("name")),
    "project": Sort("P", "PROJECT", _lower("project")),
    "id": Sort("D", "ID", _lower("id")),
    "owner": Sort("O", "OWNER", _lower("accessKey")),
    "status": Sort("S", "STATUS", lambda s: (GROUPS[group_of(s["status"])], not is_failed(s), s["status"])),
    "where": Sort("Q", "AGENT/QUEUE", lambda s: (s.get("queuePosition") or 0, str(s.get("agent") or ""))),
    "image": Sort("I", "IMAGE", _lower("image")),
    "type": Sort("T", "TYPE", _lower("type")),
    "slots": Sort("L", "SLOTS", lambda s: tuple(float(v) for v in _cpu_mem(s.get("requestedSlots"))), True),
    "cpu": Sort("C", "CPU", lambda s: session_cpu(s)[0], True),
    "mem": Sort("M", "MEM", lambda s: session_mem(s)[0], True),
    "age": Sort("A", "AGE", lambda s: _neg(_epoch(s.get("creationTime")))),
    "info": Sort("R", "EXIT / REASON", lambda s: (s.get("exitCode") or 0, str(s.get("reason") or "")), True),
}


def _cpu_mem(slots: dict[str, str] | None) -> tuple[Decimal, Decimal]:
    values = from_wire(slots or {})
    return values.get("cpu", Decimal(0)), values.get("mem", Decimal(0))


def _agent_cpu_share(a: dict[str, Any]) -> float | None:
    pct, cap, _ = agent_cpu(a)
    return None if pct is None else pct / (cap or 1)


def _agent_mem_share(a: dict[str, Any]) -> float | None:
    used, cap, _ = agent_mem(a)
    return None if used is None else used / (cap or 1)


AGENT_SORTS: dict[str, Sort] = {
    "id": Sort("A", "AGENT", _lower("id")),
    "host": Sort("H", "HOST", _lower("hostname")),
    "status": Sort("S", "STATUS", lambda a: (a["status"] != "ALIVE", a["status"])),
    "backend": Sort("B", "BACKEND", _lower("backend")),
    "group": Sort("R", "GROUP", _lower("scalingGroup")),
    "hb": Sort("E", "SEEN", lambda a: _neg(_epoch(a.get("lastSeen")))),
    "gpus": Sort("U", "GPUS", lambda a: sum(g.get("utilization") or 0 for g in a.get("gpus") or []) or None, True),
    "warm": Sort("W", "WARM", lambda a: sum(int(n) for n in (a.get("warm") or {}).values()) or None, True),
    "cpu": Sort("C", "CPU USE", _agent_cpu_share, True),
    "mem": Sort("M", "MEM USE", _agent_mem_share, True),
}


def sort_rows(rows: list[dict[str, Any]], sorts: dict[str, Sort], sort: tuple[str, bool] | None) -> list[dict]:
    """The rows by `sort` = (column, descending); rows without a value keep their order, last."""
    if sort is None or sort[0] not in sorts:
        return rows
    value = sorts[sort[0]].value
    keyed = [(value(r), r) for r in rows]
    have = [kr for kr in keyed if kr[0] is not None]
    have.sort(key=lambda kr: kr[0], reverse=sort[1])
    return [r for _, r in have] + [r for v, r in keyed if v is None]


def sort_label(sorts: dict[str, Sort], sort: tuple[str, bool]) -> str:
    spec = sorts.get(sort[0])
    return f"{spec.label if spec else sort[0]} {DOWN if sort[1] else UP}"


def sort_bindings(sorts: dict[str, Sort]) -> list[Binding]:
    return [Binding(s.letter, f"sort('{key}')", f"Sort {s.label}", show=False) for key, s in sorts.items()]


def reason_width(width: int) -> int:
    """The least width of the sessions' EXIT / REASON column at a terminal `width` wide: the reason matters
    more than the secondary columns (image, owner, id, slots, type, age …), which give way to it first;
    then it takes whatever is left."""
    return max(24, (width - 8) // 3)


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
        self.sort: tuple[str, bool] | None = None  # (column, descending); None: the model's order

    SORTS: dict[str, Sort] = {}

    def on_mount(self) -> None:
        self.sync = TableSync(self.query_one(DataTable))

    def action_sort(self, key: str) -> None:
        """Shift + a column's letter: sort by it; again: the other way; a third time: the usual order."""
        first = self.SORTS[key].descending
        if self.sort is None or self.sort[0] != key:
            self.sort = (key, first)
        elif self.sort[1] == first:
            self.sort = (key, not first)
        else:
            self.sort = None
        self.refresh_view()

    def on_resize(self) -> None:
        """The columns are laid out again for the new width (the reason column takes what is left)."""
        if hasattr(self, "sync"):
            self.refresh_view()

    def _width(self) -> int:
        if self.size.width:
            return self.size.width
        return self.terminal_width() if self.terminal_width is not None else 80


class AgentsView(TableView):
    """The agents table: status, backend, group, heartbeat age, live CPU and memory of the host, slot
    bars (what kernels hold of what the agent offers). Shift + a column's letter sorts by it."""

    DEFAULT_CSS = """
    AgentsView #agents-total { height: auto; padding: 0 1; }
    AgentsView DataTable { height: 1fr; }
    """
    BINDINGS = sort_bindings(AGENT_SORTS)
    SORTS = AGENT_SORTS

    class Chosen(Message):
        """Enter on an agent: show its sessions."""

        def __init__(self, agent_id: str) -> None:
            super().__init__()
            self.agent_id = agent_id

    def compose(self) -> ComposeResult:
        yield Static(id="agents-total")
        yield KeyTable(id="agents-table", cursor_type="row")

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if event.row_key.value:
            self.post_message(self.Chosen(event.row_key.value))

    def _columns(self, width: int, slots: list[str], figures: dict[str, list[Figure]] | None = None) -> list[Column]:
        """`figures`: the live and slot figures of each bar column, whose labels set its least width."""
        model = self.model
        wide = width >= 120
        id_width = min(max((len(a) for a in model.agents), default=8), 28)
        cols = [
            Column("id", "AGENT", max(5, id_width), sort="A"),
            Column("host", "HOST", 14, priority=5, sort="H"),
            Column("status", "STATUS", 6, sort="S"),
            Column("backend", "BACKEND", 7, priority=4, sort="B"),
            Column("group", "GROUP", 9 if width >= 100 else 7, priority=6, sort="R"),
            Column("hb", "SEEN", 4, priority=3, sort="E"),
        ]
        if any(a.get("gpus") for a in model.agents.values()):
            cols.append(Column("gpus", "GPUS util·held", 24 if wide else 14, priority=2, sort="U"))
        if any(a.get("warm") for a in model.agents.values()):  # agents with a warm pool
            cols.append(Column("warm", "WARM", 7, priority=3, sort="W"))

        def least(key: str, label: str) -> int:  # a bar of 4 at least, then the longest label
            shown = (figures or {}).get(key, [])
            longest = max((len(text) for value, _, text in shown if value is not None), default=0)
            return max(len(label), longest + 5)

        # live figures of the host, then what kernels hold of each slot: these share what is left
        cols.append(Column("cpu", "CPU USE", least("cpu", "CPU USE"), flex=True, sort="C"))
        cols.append(Column("mem", "MEM USE", least("mem", "MEM USE"), flex=True, sort="M"))
        for name in slots:
            label = f"{name.upper()} HELD"
            cols.append(Column(f"slot:{name}", label, least(f"slot:{name}", label), priority=1, flex=True))
        return fit_columns(cols, width)

    def refresh_view(self) -> None:
        model = self.model
        now = self.clock()
        width = self._width()
        slots = model.slot_names()
        agents = sort_rows(model.agent_rows(), AGENT_SORTS, self.sort)
        figures: dict[str, list[Figure]] = {
            "cpu": [agent_cpu(a) for a in agents],
            "mem": [agent_mem(a) for a in agents],
        }
        for name in slots:
            figures[f"slot:{name}"] = []
            for a in agents:
                cap = from_wire(a.get("availableSlots")).get(name, Decimal(0))
                used = from_wire(a.get("occupiedSlots")).get(name, Decimal(0))
                figures[f"slot:{name}"].append((float(used), float(cap), f"{compact(name, used)}/{compact(name, cap)}"))
        columns = self._columns(width, slots, figures)
        self.sync.set_columns(columns, self.sort)
        shown = {c.key: c for c in columns}
        cells: dict[str, list[Any]] = {c.key: [] for c in columns}
        for a in agents:
            if "host" in shown:
                cells["host"].append(a.get("hostname") or "")
            if "backend" in shown:
                cells["backend"].append(a.get("backend") or "")
            if "group" in shown:
                cells["group"].append(a.get("scalingGroup") or "")
            if "hb" in shown:
                cells["hb"].append(age(a.get("lastSeen"), now))
            if "gpus" in shown:
                cells["gpus"].append(gpu_cell(a.get("gpus") or []))
            if "warm" in shown:
                warm = a.get("warm") or {}
                cells["warm"].append(f"warm {sum(int(n) for n in warm.values())}" if warm else "")
        for key, column in shown.items():
            if key in figures:
                cells[key] = gauge_column(figures[key], column.width or 0)
        rows = []
        for i, a in enumerate(agents):
            row: list[Any] = []
            for c in columns:
                if c.key == "id":
                    row.append(a["id"])
                elif c.key == "status":
                    row.append(styled_status(a["status"]))
                else:
                    row.append(cells[c.key][i])
            rows.append((a["id"], tuple(row)))
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
        if self.sort is not None:
            total.append(f"   sorted by {sort_label(AGENT_SORTS, self.sort)}", style="cyan")
        self.query_one("#agents-total", Static).update(total)


class SessionsView(SessionKeys, TableView):
    """The sessions table: its project, status, where or why waiting, live CPU and memory against what the
    session asked for, slots, age, exit or reason (the column that takes what width is left; `r` shows the
    whole of it under the table). Failed sessions are red. Shift + a column's letter sorts by it.

    `project` (the app's `p`, as k9s's namespace): only that project's sessions, and no PROJECT column
    (the summary names the project); None: every project's."""

    DEFAULT_CSS = """
    SessionsView #sessions-summary { height: 1; padding: 0 1; }
    SessionsView DataTable { height: 1fr; }
    SessionsView #sessions-reason {
        height: auto; max-height: 8; padding: 0 1; background: $panel; display: none;
    }
    SessionsView #sessions-reason.shown { display: block; }
    """
    BINDINGS = [*SESSION_BINDINGS, Binding("r", "reason", "Reason", show=False), *sort_bindings(SESSION_SORTS)]
    SORTS = SESSION_SORTS

    class Chosen(Message):
        """Enter on a session: describe it."""

        def __init__(self, session_id: str) -> None:
            super().__init__()
            self.session_id = session_id

    def __init__(self, model: ClusterModel, *, read_only: bool = False, **kw) -> None:
        super().__init__(model, **kw)
        self.filter = Filter()
        self.project: str | None = None
        self.read_only = read_only
        self.show_reason = False
        self._layout: Any = None
        self._drawn: dict[str, tuple[dict, Any, str, tuple]] = {}  # id -> (row, usage, age, cells)

    def compose(self) -> ComposeResult:
        yield Static(id="sessions-summary")
        yield KeyTable(id="sessions-table", cursor_type="row")
        yield Static(id="sessions-reason")

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if event.row_key.value is not None:
            self.post_message(self.Chosen(event.row_key.value))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if self.show_reason:
            self._draw_reason()

    def selected(self) -> str | None:
        return self.sync.selected_key() if self.sync.keys else None

    def shell_session(self) -> str | None:
        return self.selected()

    def action_reason(self) -> None:
        """`r`: the whole reason (or outcome) of the session under the cursor, under the table; again hides it."""
        self.show_reason = not self.show_reason
        self.query_one("#sessions-reason", Static).set_class(self.show_reason, "shown")
        self._draw_reason()

    def _draw_reason(self) -> None:
        if not self.show_reason:
            return
        row = self.model.sessions.get(self.selected() or "")
        panel = self.query_one("#sessions-reason", Static)
        panel.update(reason_text(row, self.clock()) if row is not None else Text("no session", style="dim"))

    def _columns(self, width: int, items: list[dict[str, Any]], slot_texts: list[str] | None = None) -> list[Column]:
        medium, wide = width >= 100, width >= 160

        def longest(values, least: int, most: int) -> int:
            return min(most, max([least, *(len(v) for v in values)]))

        cpu = 14 if wide else 10 if medium else 7
        mem = 18 if wide else 13 if medium else 7
        name = longest((s["name"] for s in items), 4, 22 if wide else 18)
        if slot_texts is None:
            slot_texts = [slots_text(s.get("requestedSlots") or {}) for s in items]
        slots = longest(slot_texts, 5, 30)
        cols = [Column("name", "NAME", name, sort="N")]
        id_priority = 4
        if self.project is None:  # all projects: theirs, a secondary column (the reason, figures, AGE, SLOTS first)
            projects = longest((str(s.get("project") or "-") for s in items), 7, 16)
            cols.append(Column("project", "PROJECT", projects, priority=4, sort="P"))
            id_priority = 6  # the id gives way to it (the detail view shows the id)
        cols += [
            Column("id", "ID", 8, priority=id_priority, sort="D"),
            Column("owner", "OWNER", longest((s["accessKey"] for s in items), 5, 20), priority=6, sort="O"),
            Column("status", "STATUS", longest((s["status"] for s in items), 6, 16 if medium else 10), sort="S"),
            Column("where", "AGENT/QUEUE" if medium else "AGENT", 11 if medium else 9, priority=1, sort="Q"),
            Column("image", "IMAGE", longest((s["image"] for s in items), 5, 24), priority=7, sort="I"),
            Column("type", "TYPE", 5, priority=8, sort="T"),
            Column("slots", "SLOTS", slots, priority=5, sort="L"),
            Column("cpu", "CPU", cpu, priority=2, sort="C"),
            Column("mem", "MEM", mem, priority=2, sort="M"),
            Column("age", "AGE", 4, priority=3, sort="A"),
            Column("info", "EXIT / REASON", reason_width(width), flex=True, sort="R"),
        ]
        return fit_columns(cols, width)

    def refresh_view(self) -> None:
        model = self.model
        now = self.clock()
        width = self._width()
        items = sort_rows(model.session_rows(self.filter, self.project), SESSION_SORTS, self.sort)
        slot_texts = [_slots_text_of(s) for s in items]
        columns = self._columns(width, items, slot_texts)
        self.sync.set_columns(columns, self.sort)
        shown = {c.key: c for c in columns}
        wide_mem = (shown["mem"].width or 0) >= 13 if "mem" in shown else False
        figures: dict[str, list[Figure]] = {}
        if "cpu" in shown:
            figures["cpu"] = [session_cpu(s) for s in items]
        if "mem" in shown:
            figures["mem"] = [session_mem(s, wide_mem) for s in items]
        gauges = {key: gauge_widths(figs, shown[key].width or 0) for key, figs in figures.items()}
        # a row's cells are drawn again only when its row, its figures, its age or the layout changed
        layout = (columns, gauges, now.date())
        if layout != self._layout:
            self._layout, self._drawn = layout, {}
        drawn, self._drawn = self._drawn, {}
        rows = []
        for i, s in enumerate(items):
            sid, usage = s["id"], s.get("usage")
            when = age(s["creationTime"], now) if "age" in shown else ""
            hit = drawn.get(sid)
            if hit is not None and hit[0] is s and hit[1] is usage and hit[2] == when:
                self._drawn[sid] = hit
                rows.append((sid, hit[3]))
                continue
            failed = is_failed(s)
            group = group_of(s["status"])
            tone = "red" if failed else "grey50" if group == "finished" else ""
            cells: list[Any] = []
            for c in columns:
                key = c.key
                if key == "name":
                    cells.append(Text(s["name"], style=tone) if tone else s["name"])
                elif key == "id":
                    cells.append(s["id"][:8])
                elif key == "project":
                    cells.append(s.get("project") or "-")
                elif key == "owner":
                    cells.append(s["accessKey"])
                elif key == "status":
                    cells.append(Text(s["status"], style="bold red") if failed else styled_status(s["status"]))
                elif key == "where":
                    if group == "pending":
                        pos = s.get("queuePosition")
                        cells.append(Text(f"queue #{pos}" if pos else "queue", style="yellow"))
                    else:
                        cells.append(s.get("agent") or "-")
                elif key == "image":
                    cells.append(s["image"])
                elif key == "type":
                    cells.append(s["type"][:5].lower())
                elif key == "slots":
                    cells.append(slot_texts[i])
                elif key in gauges:
                    value, cap, label = figures[key][i]
                    bar_width, label_width = gauges[key]
                    cells.append(gauge(value, cap, bar_width, label.rjust(label_width)))
                elif key == "age":
                    cells.append(when)
                else:
                    info = info_text(s, now)
                    cells.append(Text(info, style="red") if failed else info)
            row = tuple(cells)
            self._drawn[sid] = (s, usage, when, row)
            rows.append((sid, row))
        self.sync.sync(rows)
        counts = model.counts(self.project)
        summary = Text()
        summary.append("Sessions ", style="bold")
        if self.project is not None:
            summary.append(f"of {self.project} ", style="bold cyan")
        summary.append(f"{counts['pending']} pending", style="yellow")
        summary.append(" · ")
        summary.append(f"{counts['running']} running", style="green")
        summary.append(f" · {counts['finished']} finished")
        medium = width >= 100
        if self.filter:
            clears = "; Esc clears" if medium else ""
            summary.append(f"  filter /{self.filter.text} ({len(items)} shown{clears})", style="bold cyan")
        if self.sort is not None and medium:  # narrower, the column's header says it
            summary.append(f"  sorted by {sort_label(SESSION_SORTS, self.sort)}", style="cyan")
        if medium and summary.cell_len + 40 < width:
            summary.append("   r: whole reason · Enter: describe", style="dim")
            if summary.cell_len + 20 < width:
                summary.append(" · p: project", style="dim")
        self.query_one("#sessions-summary", Static).update(summary)
        self._draw_reason()


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
        self.usage: dict[str, Any] | None = None  # the stream's latest live figures, once `live`
        self.live = False
        self.kernel: str | None = None  # the kernel chosen of a session of several (main1, sub1 …)

    def set_usage(self, usage: dict[str, Any] | None) -> None:
        """The session's live figures as the stream tells them (the app passes them on): redrawn when
        they changed; from now on they, not those of the session as loaded, are shown."""
        if usage != self.usage or not self.live:
            self.usage, self.live = usage, True
            if self.detail is not None:
                self.refresh_view()

    def compose(self) -> ComposeResult:
        with VerticalScroll(can_focus=True, id="detail-scroll"):
            yield Static(id="detail-body")

    def show(self, session_id: str, detail: dict[str, Any] | None, history: dict[str, Any] | None, error=None) -> None:
        if session_id != self.session_id:
            self.usage, self.live = None, False
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
        detail = {**self.detail, "usage": self.usage} if self.live else self.detail
        body.update(render_detail(detail, self.history, self.clock(), forwarded, self.kernel))


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


def usage_rows(s: dict[str, Any], usage: dict[str, Any] | None, now: datetime) -> list[tuple[str, Any]]:
    """Every live figure of a session, as (field, text) rows: CPU and memory with bars against what it
    asked for, CPU time, peak memory, network, disk, processes, GPUs, and when they were sampled."""
    if not usage:
        why = "none: the session has ended" if group_of(s["status"]) == "finished" else "no sample yet"
        return [("Usage", Text(f"{NO_FIGURE}  ({why})", style="dim"))]
    rows: list[tuple[str, Any]] = []
    requested = from_wire(s.get("requestedSlots") or {})
    if usage.get("cpuPct") is not None:
        pct, cores = float(usage["cpuPct"]), requested.get("cpu")
        text = gauge(pct, float(cores) * 100 if cores else None, 20, cpu_label(pct))
        if cores:
            text.append(f" of {compact('cpu', cores)} core{'s' if cores != 1 else ''} asked for")
        text.append("  (100% = one core)", style="dim")
        rows.append(("CPU", text))
    if usage.get("cpuMs") is not None:
        rows.append(
            ("CPU time", duration(float(usage["cpuMs"]) / 1000) if usage["cpuMs"] >= 1000 else f"{usage['cpuMs']} ms")
        )
    if usage.get("memBytes") is not None:
        used, cap = float(usage["memBytes"]), requested.get("mem")
        text = gauge(used, float(cap) if cap else None, 20, bytes_label(used))
        if cap:
            text.append(f" of {bytes_label(float(cap))} asked for ({used / float(cap):.0%})")
        if usage.get("memPeakBytes") is not None:
            text.append(f" · peak {bytes_label(float(usage['memPeakBytes']))}")
        rows.append(("Memory", text))
    for field, rx, tx, a, b in (
        ("Network", "netRxBytes", "netTxBytes", "received", "sent"),
        ("Disk I/O", "ioReadBytes", "ioWriteBytes", "read", "written"),
    ):
        if usage.get(rx) is not None or usage.get(tx) is not None:
            parts = [f"{bytes_label(float(usage[k]))} {w}" for k, w in ((rx, a), (tx, b)) if usage.get(k) is not None]
            rows.append((field, " · ".join(parts)))
    if usage.get("pids") is not None:
        rows.append(("Processes", str(usage["pids"])))
    if usage.get("gpuPct") is not None or usage.get("gpuMemBytes") is not None:
        parts = []
        if usage.get("gpuPct") is not None:
            parts.append(f"{float(usage['gpuPct']):.0f}% busy (mean of its devices)")
        if usage.get("gpuMemBytes") is not None:
            parts.append(f"{bytes_label(float(usage['gpuMemBytes']))} memory")
        rows.append(("GPU", " · ".join(parts)))
    if usage.get("at"):
        rows.append(("Sampled", Text(f"{usage['at'][11:19]} UTC ({age(usage['at'], now)} ago)", style="dim")))
    return rows


def kernel_name(k: dict[str, Any]) -> str:
    """main1, sub1 …: a kernel's name in its session (also its hostname)."""
    return k.get("name") or f"{k['clusterRole']}{k.get('clusterIdx', '')}"


def kernels_table(s: dict[str, Any]) -> Table:
    """The session's kernels. A cluster session's (several kernels) first say what matters of each, its name,
    agent, status and live CPU and memory, so that the narrowest screen keeps them; one kernel's figures are
    the session's (above)."""
    items = s.get("kernels", [])
    cluster = len(items) > 1
    title = f"Kernels ({len(items)}, {s.get('clusterMode') or 'single-node'})" if cluster else "Kernels"
    table = Table(title=title, title_justify="left", title_style="bold", box=None, header_style="bold")
    with_gpus = any(k.get("devices") for k in items)
    if cluster:
        columns = ("NAME", "AGENT", "STATUS", "CPU", "MEM", "ID", "CONTAINER", "EXIT")
    else:
        columns = ("ID", "ROLE", "AGENT", "CONTAINER", "STATUS", "EXIT")
    for col in (*columns, *(("GPUS",) if with_gpus else ())):
        table.add_column(col, no_wrap=True, justify="right" if col in ("CPU", "MEM") else "left")
    for k in items:
        exit_code = k.get("exitCode")
        container = (k.get("containerId") or "-")[:12]
        ended = "-" if exit_code is None else str(exit_code)
        if cluster:
            usage = k.get("usage") or {}
            cpu = usage.get("cpuPct")
            mem = usage.get("memBytes")
            row = [
                Text(kernel_name(k), style="bold"),
                k.get("agent") or "-",
                styled_status(k["status"]),
                NO_FIGURE if cpu is None else cpu_label(float(cpu)),
                NO_FIGURE if mem is None else bytes_label(float(mem)),
                Text(k["id"][:8], style="dim"),
                container,
                ended,
            ]
        else:
            row = [k["id"][:8], kernel_name(k), k.get("agent") or "-", container, styled_status(k["status"]), ended]
        if with_gpus:  # which GPU (and how much of it) the kernel holds
            row.append(", ".join(f"{d['uuid']} ×{d['share']}" for d in k.get("devices") or []) or "-")
        table.add_row(*row)
    return table


def kernel_fields(k: dict[str, Any]) -> Table:
    """One kernel of a session of several, described: name, id, agent, container, status, exit, figures."""
    table = _field_table()
    table.add_row("Kernel", Text(f"{kernel_name(k)}  ", style="bold") + Text(k["id"], style="dim"))
    table.add_row("  agent", k.get("agent") or "-")
    table.add_row("  container", (k.get("containerId") or "-")[:12])
    table.add_row("  status", styled_status(k["status"]))
    if k.get("exitCode") is not None:
        table.add_row("  exit code", str(k["exitCode"]))
    usage = k.get("usage") or {}
    if usage.get("cpuPct") is not None:
        table.add_row("  CPU", cpu_label(float(usage["cpuPct"])))
    if usage.get("memBytes") is not None:
        table.add_row("  memory", bytes_label(float(usage["memBytes"])))
    return table


def render_detail(
    s: dict[str, Any],
    history: dict[str, Any] | None,
    now,
    forwarded: dict[str, str] | None = None,
    kernel: str | None = None,
) -> Group:
    """The session's fields, live figures (its `usage`), kernels, status history and scheduler decisions;
    `forwarded` gives the local URL of each of its apps the dashboard forwards (f); `kernel`: the kernel
    described (of a session of several), whose own fields come first."""
    from bai.common.present import reason

    failed = is_failed(s)
    fields = _field_table()
    fields.add_row("Session", Text(f"{s['name']}  ") + Text(s["id"], style="dim"))
    fields.add_row(
        "Status",
        Text.assemble(
            (s["status"], "bold red" if failed else STATUS_STYLE.get(s["status"], "")),
            ("  failed" if failed else "", "red"),
            f"  since {age(s.get('statusChanged'), now)} ago",
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
    for label, text in scheduling_lines(s):
        fields.add_row(label, text)
    fields.add_row("Image", s["image"])
    fields.add_row("Type", s["type"].lower())
    fields.add_row("Owner", s["accessKey"])
    if s.get("project"):
        fields.add_row("Project", f"{s['domain']} / {s['project']}" if s.get("domain") else s["project"])
    fields.add_row("Resources", slots_text(s.get("requestedSlots") or {}) or "-")
    fields.add_row("Agent", s.get("agent") or "-")
    if (s.get("clusterSize") or 1) > 1:  # its kernels are listed below
        fields.add_row("Cluster", f"{s['clusterSize']} kernels, {s.get('clusterMode') or 'single-node'}")
    if s.get("network"):  # asked for when created (else the agent's own, none unless configured)
        fields.add_row("Network", s["network"])
    fields.add_row("Created", f"{s['creationTime'][:19].replace('T', ' ')}  ({age(s['creationTime'], now)} ago)")
    start = started_at(s)
    if start is not None:
        fields.add_row("Started", f"{start.isoformat()[:19].replace('T', ' ')}  ({queue_and_run(s, now)})")
    if s.get("terminationTime"):
        fields.add_row("Ended", s["terminationTime"][:19].replace("T", " "))
    if group_of(s["status"]) != "finished":  # a live session: its last run's end says nothing of it
        if s.get("exitCode") is not None:
            fields.add_row("Last run", f"exit {s['exitCode']} (the session goes on)")
    else:
        if s.get("exitCode") is not None:
            fields.add_row("Exit code", Text(str(s["exitCode"]), style="bold red" if s["exitCode"] else ""))
        if s.get("result") and s["result"] != "UNDEFINED":
            fields.add_row("Result", Text(s["result"], style="green" if s["result"] == "SUCCESS" else "red"))
    for field, value in usage_rows(s, s.get("usage"), now):
        fields.add_row(field, value)
    mounts = s.get("mounts") or []
    fields.add_row(
        "Mounts",
        "\n".join(f"{m['name']} → {m['target']}" + (" (read-only)" if m["readOnly"] else "") for m in mounts)
        if mounts
        else Text("none", style="dim"),
    )
    fields.add_row("Apps", apps_text(s.get("servicePorts") or [], forwarded))

    kernels = kernels_table(s)

    transitions = Table(title="Status history", title_justify="left", title_style="bold", box=None)
    transitions.add_column("AT", no_wrap=True, style="dim")
    transitions.add_column("STATUS", no_wrap=True)
    transitions.add_column("INFO")
    for t in s.get("transitions") or []:
        transitions.add_row(_stamp(t["at"]), styled_status(t["status"]), t.get("status_info") or "")

    parts: list[Any] = [fields, Text(""), kernels, Text(""), transitions]
    chosen = next((k for k in s.get("kernels") or [] if kernel is not None and kernel_name(k) == kernel), None)
    if chosen is not None:
        parts[:0] = [kernel_fields(chosen), Text("")]
    if history is not None:
        lines = explain_lines(history)
        # the decision part only (the state changes are above)
        cut = lines.index("State changes") if "State changes" in lines else len(lines)
        parts += [Text(""), Text("Scheduler decisions", style="bold")]
        parts += [Text(line) for line in lines[1:cut]]
    return Group(*parts)


class LogsView(View):
    """A kernel's output, live: `/` filter (`!` inverts), t timestamps, w wrap, G end, g start. ANSI colours
    show, `\\r` progress lines update in place, and each run starts with a separator (the stream's `run`)."""

    DEFAULT_CSS = """
    LogsView #logs-status { height: 1; padding: 0 1; }
    LogsView LogView { height: 1fr; }
    """

    def __init__(self, max_lines: int = 10_000, **kw) -> None:
        super().__init__(**kw)
        self.buffer = LogBuffer(max_lines)
        self.session_id: str | None = None
        self.session_name = ""
        self.kernel: str | None = None  # the kernel chosen (main1, sub1 …); None: the main one
        self.kernel_id: str | None = None
        self.state = "no session"

    def compose(self) -> ComposeResult:
        yield Static(id="logs-status")
        yield LogView(self.buffer, id="log-view")

    @property
    def log_view(self) -> LogView:
        return self.query_one(LogView)

    def reset(self, session_id: str, name: str, kernel: str | None = None) -> None:
        self.session_id, self.session_name, self.kernel, self.kernel_id = session_id, name, kernel, None
        self.buffer.clear()
        self.log_view.following = True
        self.log_view.new_while_paused = 0
        self.log_view.rebuild()
        self.state = "connecting"
        self.refresh_view()

    def plain_lines(self, shown_only: bool = False) -> list[str]:
        """The log's lines without colour codes (a run's separator as its label); `shown_only`: those the
        filter lets through."""
        flt = self.log_view.filter if shown_only else None
        lines = []
        for line in self.buffer.all_lines():
            if line.run is not None:
                text = separator(line.run, 0).plain.replace("──", "").strip()
            else:
                text = re_ansi.sub("", line.text)
            if flt is None or flt.match_text(text):
                lines.append(text)
        return lines

    def feed(self, chunks: list[Any]) -> None:
        """Chunks of output ([seq, text, stored-at]) and, between them, runs (the stream's `run` events)."""
        added = []
        for item in chunks:
            if isinstance(item, dict):
                added += self.buffer.mark_run(item)
            else:
                seq, text, ts = item
                added += self.buffer.feed(text, ts, seq)
        shown = self.query(LogView)  # none while the view is being built or torn down: the buffer has them
        if shown:
            shown.first().lines_added(added)

    def refresh_view(self) -> None:
        view = self.log_view
        status = Text()
        if self.session_id is None:
            status.append("No session chosen: pick one in the sessions view (2) and press l.")
            self._show_status(status)
            return
        status.append("Logs ", style="bold")
        status.append(self.session_name)
        if self.kernel:
            status.append(f" · {self.kernel}", style="bold")
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
        self._show_status(status)

    def _show_status(self, status: Text) -> None:
        for line in self.query("#logs-status").results(Static):  # (none while the view is being laid out again)
            line.update(status)
