"""Two more views of one session: its events (`e`) and its JSON (`y`, as `GET /session/{id}` returns it).

Attributes down as in bai/tui/views.py: the app loads what they show and sets it; they only draw it.
"""

from __future__ import annotations

import json
from typing import Any

from rich.console import Group
from rich.json import JSON
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from bai.tui.views import View, styled_status


def _stamp(iso: str | None) -> str:
    return (iso or "")[:19].replace("T", " ")


class EventsView(View):
    """A session's events: its status transitions as stored (time, status, why), then the lifecycle events
    (`GET /events/session`, as `bai session events` prints them) as they arrive, newest last."""

    DEFAULT_CSS = """
    EventsView VerticalScroll { height: 1fr; padding: 0 1; }
    """

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.session_id: str | None = None
        self.session_name = ""
        self.transitions: list[dict[str, Any]] = []
        self.events: list[tuple[str, str, dict[str, Any]]] = []  # (arrived at, name, data)
        self.state = ""

    def compose(self) -> ComposeResult:
        with VerticalScroll(can_focus=True, id="events-scroll"):
            yield Static(id="events-body")

    def reset(self, session_id: str, name: str) -> None:
        self.session_id, self.session_name = session_id, name
        self.transitions, self.events, self.state = [], [], "loading…"
        self.refresh_view()

    def add_event(self, at: str, name: str, data: dict[str, Any]) -> None:
        self.events.append((at, name, data))
        self.refresh_view()

    def refresh_view(self) -> None:
        body = self.query_one("#events-body", Static)
        if self.session_id is None:
            body.update(Text("No session chosen: pick one in the sessions view (2) and press e."))
            return
        table = Table(box=None, header_style="bold", title_justify="left", title_style="bold", padding=(0, 2, 0, 0))
        table.title = f"Events of {self.session_name}"
        table.add_column("AT (UTC)", no_wrap=True, style="dim")
        table.add_column("EVENT", no_wrap=True)
        table.add_column("DETAIL")
        for t in self.transitions:
            table.add_row(_stamp(t.get("at")), styled_status(t.get("status") or ""), t.get("status_info") or "")
        for at, name, data in self.events:
            detail = []
            if data.get("clusterRole"):
                detail.append(f"kernel {data['clusterRole']}{data.get('clusterIdx', '')}")
            if data.get("reason"):
                detail.append(str(data["reason"]))
            if data.get("exitCode") is not None:
                detail.append(f"exit code {data['exitCode']}")
            table.add_row(at, Text(name, style="cyan"), " · ".join(detail))
        note = Text(self.state or "live: new events are added below as they happen", style="dim")
        if not self.transitions and not self.events:
            body.update(
                Group(Text(f"Events of {self.session_name}", style="bold"), Text("none yet", style="dim"), note)
            )
        else:
            body.update(Group(table, note))


class JsonView(View):
    """`y`: the session as `GET /session/{id}` returns it, as JSON, to scroll through (k9s's YAML view)."""

    DEFAULT_CSS = """
    JsonView VerticalScroll { height: 1fr; padding: 0 1; }
    """

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.session_id: str | None = None
        self.session_name = ""
        self.data: dict[str, Any] | None = None
        self.error: str | None = None

    def compose(self) -> ComposeResult:
        with VerticalScroll(can_focus=True, id="json-scroll"):
            yield Static(id="json-body")

    def show(self, session_id: str, name: str, data: dict[str, Any] | None, error: str | None = None) -> None:
        self.session_id, self.session_name, self.data, self.error = session_id, name, data, error
        self.refresh_view()

    @property
    def text(self) -> str:
        """The JSON as shown (indented by 2)."""
        return json.dumps(self.data, indent=2, ensure_ascii=False)

    def refresh_view(self) -> None:
        body = self.query_one("#json-body", Static)
        if self.session_id is None:
            body.update(Text("No session chosen: pick one in the sessions view (2) and press y."))
        elif self.data is None:
            body.update(Text(self.error or "loading…", style="red" if self.error else "dim"))
        else:
            title = Text(f"GET /session/{self.session_id}  ({self.session_name})", style="bold")
            body.update(Text("\n").join([title, JSON(self.text).text]))
