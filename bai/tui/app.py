"""`bai tui`: a live dashboard of agents, resource slots, sessions and kernel logs (Textual).

Everything it shows comes through `bai.client` from the manager's dashboard stream (`GET /bai/events`):
a snapshot, then changes as they happen; a kernel's output comes on a stream of its own. When the stream
breaks the dashboard says so and reconnects by itself (backing off up to 5 s), taking a fresh snapshot.
Drawing is throttled: the model changes on every event, the visible view is redrawn at most 5 times a
second (and once a second for ages), the log view at most 10 times a second. `s` on a running session
gives the terminal to a shell in it (as `bai session shell`) and takes it back when the shell ends; `f`
lists its apps and forwards the chosen one to a port on 127.0.0.1 (as `bai session app`, in the
dashboard's own event loop) until the session ends or the dashboard exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import replace
from datetime import datetime
from typing import Any

from rich.text import Text
from textual import events
from textual.app import App, ComposeResult, SuspendNotSupported
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.widgets import ContentSwitcher, DataTable, Footer, Static

from bai.cli.apps import Forward, app_port, open_forward, watch_session
from bai.client.api import APIError, Client
from bai.client.endpoints import move_line
from bai.common.present import utc_now
from bai.tui.header import Header
from bai.tui.logfile import save_log
from bai.tui.modals import (
    AppsScreen,
    ConfirmScreen,
    FairShareScreen,
    HelpScreen,
    KernelScreen,
    PresetsScreen,
    RoundsScreen,
)
from bai.tui.model import ClusterModel, Filter, view_of
from bai.tui.prompt import PromptBar
from bai.tui.session_views import EventsView, JsonView
from bai.tui.views import (
    AgentsView,
    DetailView,
    ForwardRequested,
    LogsView,
    SessionsView,
    ShellRequested,
    kernel_name,
)

VIEWS = ("agents", "sessions", "detail", "logs", "events", "json")
VIEW_NAMES = {
    "agents": "agents", "a": "agents", "agent": "agents", "1": "agents",
    "sessions": "sessions", "s": "sessions", "session": "sessions", "2": "sessions",
    "detail": "detail", "describe": "detail", "d": "detail", "3": "detail",
    "logs": "logs", "l": "logs", "log": "logs", "4": "logs",
    "events": "events", "e": "events", "ev": "events", "json": "json", "y": "json", "yaml": "json",
    # k9s's names: nodes are agents, pods are sessions
    "nodes": "agents", "no": "agents", "pods": "sessions", "po": "sessions",
}  # fmt: skip
SESSION_VIEWS = ("sessions", "detail", "logs", "events", "json")
SHELL_STATUSES = ("RUNNING", "RUNNING_DEGRADED")  # as `bai session shell` requires
ShellRunner = Callable[[str, str | None], Awaitable[int]]  # (session id, kernel name or None: main1)
Forwarder = Callable[[dict[str, Any], dict[str, Any]], Awaitable[Forward]]
FORWARD_HOST = "127.0.0.1"
LOG_ACTIONS = {"toggle_timestamps", "toggle_wrap", "log_end", "log_start", "save_log", "copy_log"}
MAX_BACKOFF = 5.0
LOG_FLUSH = 0.1  # seconds between feeds of the log view
LOG_FLUSH_BUSY = 0.5  # ... after a feed of more than LOG_BUSY_BYTES of output
LOG_BUSY_BYTES = 16 * 1024
COMPACT_FOOTER_BELOW = 100  # columns
WIDE_FOOTER_KEYS = ("e", "y", "p", "ctrl+s", "c")  # in the footer from 100 columns; narrower, in ? help only


class Dashboard(App):
    """`bai tui`: the cluster's agents, sessions, a session's detail and logs, live from the manager."""

    TITLE = "bai"
    ENABLE_COMMAND_PALETTE = False  # `:` is the command line here
    CSS = """
    #topbar { height: 1; background: $panel; padding: 0 1; }
    ContentSwitcher { height: 1fr; }
    """
    BINDINGS = [
        Binding("1", "show('agents')", "Agents", show=False),
        Binding("2", "show('sessions')", "Sessions", show=False),
        Binding("3", "number('detail')", "Detail", show=False),
        Binding("4", "number('logs')", "Logs", show=False),
        Binding("d", "describe", "Describe"),
        Binding("l", "logs", "Logs"),
        Binding("e", "events", "Events"),
        Binding("y", "json", "JSON"),
        Binding("ctrl+d", "terminate", "Terminate"),
        Binding("p", "project", "Project"),  # as k9s's namespace: all projects, then each in turn
        # priority: handled as the key arrives, before the keys typed after it (see action_filter)
        Binding("slash", "filter", "Filter", priority=True),
        Binding("t", "toggle_timestamps", "Time"),
        Binding("w", "toggle_wrap", "Wrap"),
        Binding("G", "log_end", "End"),
        Binding("g", "log_start", "Start", show=False),
        Binding("ctrl+s", "save_log", "Save"),
        Binding("c", "copy_log", "Copy"),
        Binding("colon", "command", "Cmd", show=False, priority=True),
        Binding("question_mark", "help", "Help"),
        Binding("escape", "back", "Back"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(
        self,
        client: Client,
        *,
        read_only: bool = False,
        clock: Callable[[], datetime] = utc_now,
        max_log_lines: int = 10_000,
        start_view: str = "sessions",
        shell_runner: ShellRunner | None = None,
        forwarder: Forwarder | None = None,
    ) -> None:
        """`shell_runner(session_id, kernel) -> exit status` runs a shell in a session's kernel (None: the
        main one) for `s`; by default the
        dashboard suspends and attaches this terminal to the session's (tests pass their own).
        `forwarder(session, app) -> Forward` starts an app and listens for it for `f`; by default on
        127.0.0.1, on the app's own port when free (`bai.cli.apps.open_forward`)."""
        super().__init__()
        self.client = client
        self.read_only = read_only
        self.shell_runner: ShellRunner = shell_runner or self._suspended_shell
        self.shell_open = False
        self.forwarder: Forwarder = forwarder or self._forward_locally
        self.forwards: dict[tuple[str, str], Forward] = {}  # (session id, app) -> its open forward
        self.forward_urls: dict[tuple[str, str], str] = {}  # the same, their URLs (the detail view shows them)
        self._opening: set[tuple[str, str]] = set()
        self.clock = clock
        self.model = ClusterModel()
        self.max_log_lines = max_log_lines
        self.start_view = start_view
        self.view = start_view
        self.history: list[str] = []
        self.connection = "connecting"
        self.connected = False
        self.snapshots = 0  # how many snapshots arrived (1 + reconnections)
        self._drawn: dict[str, int] = {}
        self._pending_logs: list[Any] = []  # chunks, and runs (dicts) between them
        self._log_flushed = 0.0  # when the log view was last fed (monotonic)
        self._log_wait = 0.0  # seconds the next feed waits after the last one
        self._detail_key: Any = None
        self._last_age_tick = 0.0

    # -- layout -----------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        # the client moves to another manager from a worker thread, or this one: say so here, in the app's loop
        self._client_loop = asyncio.get_running_loop()
        self.client.on_move = self._client_moved
        yield Static(id="topbar")
        yield Header(self.client, self.clock, id="header")  # who, quota, stale while disconnected
        with ContentSwitcher(initial=self.start_view):
            # attributes down: the views draw the model, by the clock, for the terminal's width
            width = self._terminal_width
            yield AgentsView(self.model, clock=self.clock, width=width, id="agents")
            yield SessionsView(self.model, clock=self.clock, width=width, read_only=self.read_only, id="sessions")
            yield DetailView(clock=self.clock, read_only=self.read_only, forwards=self.forward_urls, id="detail")
            yield LogsView(self.max_log_lines, id="logs")
            yield EventsView(id="events")
            yield JsonView(id="json")
        yield PromptBar(id="prompt-bar")
        yield Footer()

    def _terminal_width(self) -> int:
        return self.size.width

    def on_mount(self) -> None:
        self._fit_footer(self.size.width)
        self._background(self._follow_cluster(), group="cluster", exclusive=True)
        self.set_interval(0.2, lambda: self._unless_closing(self._redraw))
        self.set_interval(LOG_FLUSH, lambda: self._unless_closing(lambda: self._flush_logs(force=False)))
        self._focus_view()
        self._draw_topbar()

    def on_resize(self, event: events.Resize) -> None:
        self._fit_footer(event.size.width)

    def _fit_footer(self, width: int) -> None:
        """Under 100 columns the keys go closer together, and those of WIDE_FOOTER_KEYS leave the footer
        (they still work; ? lists them): every other key of a view fits in 80."""
        wide = width >= COMPACT_FOOTER_BELOW
        self.query_one(Footer).compact = not wide
        keys = self._bindings.key_to_bindings
        if any(b.show != wide for key in WIDE_FOOTER_KEYS for b in keys.get(key, [])):
            for key in WIDE_FOOTER_KEYS:
                keys[key] = [replace(b, show=wide) for b in keys.get(key, [])]
            self.refresh_bindings()

    @property
    def agents_view(self) -> AgentsView:
        return self.query_one(AgentsView)

    @property
    def sessions_view(self) -> SessionsView:
        return self.query_one(SessionsView)

    @property
    def detail_view(self) -> DetailView:
        return self.query_one(DetailView)

    @property
    def logs_view(self) -> LogsView:
        return self.query_one(LogsView)

    @property
    def events_view(self) -> EventsView:
        return self.query_one(EventsView)

    @property
    def json_view(self) -> JsonView:
        return self.query_one(JsonView)

    @property
    def prompt_bar(self) -> PromptBar:
        return self.query_one(PromptBar)

    # -- the live stream --------------------------------------------------------------------------

    async def _follow_cluster(self) -> None:
        attempt = 0
        while True:
            try:
                async for name, data in self.client.dashboard_events():
                    if name == "snapshot":
                        self.model.load_snapshot(data)
                        self.snapshots += 1
                        attempt = 0
                        self.connected = True
                        self.connection = "connected"
                        self._draw_topbar()
                    elif name == "sessions":
                        self.model.update_sessions(data["items"])
                    elif name == "agents":
                        self.model.update_agents(data["items"])
                    elif name == "usage":
                        self.model.update_usage(data)
                error = "the manager closed the stream"
            except APIError as e:
                error = str(e)
            attempt += 1
            delay = min(MAX_BACKOFF, 0.25 * 2**attempt)
            self.connected = False
            self.connection = f"disconnected ({error}); retry {attempt} in {delay:g}s"
            self._draw_topbar()
            await asyncio.sleep(delay)

    async def _follow_logs(self, session_id: str, kernel: str | None = None) -> None:
        view = self.logs_view
        attempt = 0
        while True:
            after = view.buffer.last_seq or None
            try:
                async for name, data in self.client.dashboard_events(
                    topics="logs", session=session_id, kernel=kernel, after=after
                ):
                    if view.session_id != session_id or view.kernel != kernel:
                        return
                    view.kernel_id = data.get("kernelId")
                    view.state = "live"
                    attempt = 0
                    if name == "log":
                        self._pending_logs.extend(data["chunks"])
                    elif name == "run":  # a run's separator, in order with the output around it
                        self._pending_logs.append(data)
                    elif name == "log_end":
                        self._flush_logs()
                        view.buffer.ended = True
                        view.state = "kernel ended"
                        view.refresh_view()
                        return
            except APIError as e:
                if e.status in (400, 401, 403, 404):
                    view.state = f"cannot follow: {e}"
                    view.refresh_view()
                    return
                view.state = f"disconnected ({e})"
            attempt += 1
            delay = min(MAX_BACKOFF, 0.25 * 2**attempt)
            view.state = f"{view.state.split(';')[0]}; retry in {delay:g}s"
            view.refresh_view()
            await asyncio.sleep(delay)

    def _client_moved(self, old: str, new: str) -> None:
        """The client's `on_move` (called from any thread): the note and the top bar, in the app's loop."""
        try:
            here = asyncio.get_running_loop() is self._client_loop
        except RuntimeError:  # a worker thread
            here = False
        if here:
            self._show_move(old, new)
        else:
            with contextlib.suppress(RuntimeError):  # (the dashboard's loop has closed)
                self._client_loop.call_soon_threadsafe(self._show_move, old, new)

    def _show_move(self, old: str, new: str) -> None:
        self.notify(move_line(old, new), severity="warning", timeout=10)
        self._unless_closing(self._draw_topbar)

    # -- drawing ----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _quiet_when_closing(self) -> Iterator[None]:
        """Once the dashboard is closing its widgets go (screen by screen, while its timers and workers
        still run): what finds one gone then just stops. A missing widget while it runs is a bug, raised."""
        try:
            yield
        except NoMatches:
            if self.is_running:
                raise

    def _unless_closing(self, draw: Callable[[], None]) -> None:
        """Run a timer's drawing (see `_quiet_when_closing`)."""
        with self._quiet_when_closing():
            draw()

    def _background(self, work: Awaitable[None], group: str, exclusive: bool = False) -> None:
        """Run `work` in a worker (a stream followed, a request sent; see `_quiet_when_closing`)."""

        async def guarded() -> None:
            with self._quiet_when_closing():
                await work

        self.run_worker(guarded(), group=group, exclusive=exclusive)

    def _redraw(self) -> None:
        """Redraw the visible view when the model changed, and once a second for ages and clocks."""
        now = asyncio.get_running_loop().time()
        age_tick = now - self._last_age_tick >= 1.0
        if age_tick:
            self._last_age_tick = now
            self._draw_topbar()
        version = self.model.version + self.model.agents_version
        if self.view in ("agents", "sessions") and (age_tick or self._drawn.get(self.view) != version):
            self._drawn[self.view] = version
            self.query_one(f"#{self.view}").refresh_view()  # type: ignore[attr-defined]
        elif self.view == "detail":
            self._maybe_reload_detail()
        elif self.view == "logs" and age_tick:
            self.logs_view.refresh_view()

    def _flush_logs(self, force: bool = True) -> None:
        """Feed the log view what arrived since the last flush. A busy stream is shown less often (each
        repaint of a scrolling view costs tens of milliseconds) so that keys stay quick: after a feed of
        more than LOG_BUSY_BYTES of output the next waits LOG_FLUSH_BUSY seconds."""
        if self._pending_logs:
            now = time.monotonic()
            if not force and now - self._log_flushed < self._log_wait:
                return
            self._log_flushed = now
            chunks, self._pending_logs = self._pending_logs, []
            size = sum(len(c[1]) for c in chunks if isinstance(c, list) and len(c) > 1 and isinstance(c[1], str))
            self._log_wait = LOG_FLUSH_BUSY if size > LOG_BUSY_BYTES else 0.0
            self.logs_view.feed(chunks)
            if self.view == "logs":
                self.logs_view.refresh_view()

    def _draw_topbar(self) -> None:
        """bai, the views (the current one lit), the connection, the clock; the endpoint when it fits."""
        self.query_one(Header).sync(not self.connected and self.snapshots > 0, self.model.version)
        width = self.size.width or 80
        text = Text()
        text.append("bai ", style="bold")
        for i, (view, label) in enumerate(
            (("agents", "agents"), ("sessions", "sessions"), ("detail", "describe"), ("logs", "logs")), 1
        ):
            style = "bold reverse" if view == self.view else "dim"
            text.append(f" {i} {label} ", style=style)
        text.append("  ")
        if self.connected:
            text.append("● connected", style="bold green")
        else:
            text.append(f"○ {self.connection}", style="bold red")
        if self.read_only:
            text.append(" · read-only", style="cyan")
        if width >= 120:
            text.append(f"  {self.client.endpoint}", style="dim")
        clock = self.clock().strftime("%H:%M:%S")
        pad = width - 2 - text.cell_len - len(clock)
        if pad >= 2:
            text.append(" " * pad)
            text.append(clock, style="dim")
        text.truncate(max(1, width - 2), overflow="ellipsis")
        self.query_one("#topbar", Static).update(text)

    # -- navigation -------------------------------------------------------------------------------

    def _switch(self, view: str) -> None:
        self.view = view
        self.query_one(ContentSwitcher).current = view
        self._drawn.pop(view, None)
        if view in ("agents", "sessions"):
            self.query_one(f"#{view}").refresh_view()  # type: ignore[attr-defined]
            self._drawn[view] = self.model.version + self.model.agents_version
        elif view == "detail":
            self.detail_view.refresh_view()
        elif view in ("logs", "events", "json"):
            self.query_one(f"#{view}").refresh_view()  # type: ignore[attr-defined]
        self._focus_view()
        self.refresh_bindings()
        self._draw_topbar()

    def _focus_view(self) -> None:
        target = {
            "agents": "#agents-table",
            "sessions": "#sessions-table",
            "detail": "#detail-scroll",
            "logs": "#log-view",
            "events": "#events-scroll",
            "json": "#json-scroll",
        }[self.view]
        self.query_one(target).focus()

    def action_show(self, view: str) -> None:
        if view != self.view:
            self.history.append(self.view)
            del self.history[:-20]
            self._switch(view)

    def action_back(self) -> None:
        if self.view == "sessions" and self.sessions_view.filter:  # Esc clears a filter before it leaves
            self.sessions_view.filter = Filter()
            self.sessions_view.refresh_view()
            self.refresh_bindings()
        elif self.history:
            self._switch(self.history.pop())

    def action_number(self, view: str) -> None:
        """3 / 4 from the sessions view: the highlighted session's detail / logs (as d / l); else the view."""
        if self.view == "sessions" and self.selected_session() is not None:
            if view == "detail":
                self.action_describe()
            else:
                self.action_logs()
        else:
            self.action_show(view)

    def selected_session(self) -> str | None:
        """The session a key acts on, as the screen shows it now: the highlighted row, or the view's own."""
        if self.view == "sessions":
            return self.sessions_view.selected()
        if self.view in ("detail", "logs", "events", "json"):
            return self.query_one(f"#{self.view}").session_id  # type: ignore[attr-defined]
        return None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("filter", "command") and len(self.screen_stack) > 1:
            return False  # a dialog is open: the key is the dialog's
        if action == "terminate":
            if self.read_only or self.view not in SESSION_VIEWS:
                return False
            sid = self.selected_session()
            row = self.model.sessions.get(sid or "")
            return None if row is None or row["status"] in ("TERMINATED", "CANCELLED") else True
        if action == "describe":
            return self.view in ("sessions", "logs", "events", "json")
        if action == "logs":
            return self.view in ("sessions", "detail", "events", "json")
        if action == "events":
            return self.view in ("sessions", "detail", "logs", "json")
        if action == "json":
            return self.view in ("sessions", "detail", "logs", "events")
        if action == "filter":
            return self.view in ("sessions", "logs")
        if action == "project":
            return self.view == "sessions"
        if action in LOG_ACTIONS:
            return self.view == "logs"
        if action == "back":
            return bool(self.history) or (self.view == "sessions" and bool(self.sessions_view.filter))
        return True

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self.refresh_bindings()

    # messages up: what the user asked of a view

    def on_sessions_view_chosen(self, message: SessionsView.Chosen) -> None:
        self._describe(message.session_id)

    def on_agents_view_chosen(self, message: AgentsView.Chosen) -> None:
        self.sessions_view.filter = Filter.parse(f"agent:{message.agent_id}")  # exactly its sessions
        self.action_show("sessions")

    def on_shell_requested(self, message: ShellRequested) -> None:
        self.open_shell(message.session_id)

    def on_forward_requested(self, message: ForwardRequested) -> None:
        self.choose_app(message.session_id)

    # -- which kernel (a session of several) --------------------------------------------------------

    def with_kernel(self, sid: str, what: str, then: Callable[[str | None], None]) -> None:
        """`then(kernel)` for the session's kernel: None (its only one, main1) straight away; of a session of
        several kernels, the one chosen in a picker (main1 highlighted first)."""
        row = self.model.sessions.get(sid) or {}
        if (row.get("clusterSize") or 1) <= 1 and len(row.get("kernels") or []) <= 1:
            then(None)
            return
        self._background(self._pick_kernel(sid, row.get("name", sid[:8]), what, then), group="kernel", exclusive=True)

    async def _pick_kernel(self, sid: str, name: str, what: str, then: Callable[[str | None], None]) -> None:
        try:
            detail = await self.client.get_session(sid)
        except APIError as e:
            self.notify(f"Cannot list the kernels of {name}: {e}", severity="error", timeout=8)
            return
        kernels = detail.get("kernels") or []
        if len(kernels) <= 1:
            then(None)
            return
        choices = [(kernel_name(k), f"{k.get('agent') or '-'}  {k.get('status', '')}") for k in kernels]

        def chosen(kernel: str | None) -> None:
            if kernel is not None:
                then(kernel)

        self.push_screen(KernelScreen(name, what, choices), chosen)

    # -- actions on sessions ----------------------------------------------------------------------

    def action_describe(self) -> None:
        self._describe(self.selected_session())

    def _describe(self, sid: str | None) -> None:
        if sid is None:
            self.notify("No session chosen.", severity="warning")
            return
        self.with_kernel(sid, "describe", lambda kernel: self._describe_kernel(sid, kernel))

    def _describe_kernel(self, sid: str, kernel: str | None) -> None:
        if sid != self.detail_view.session_id:
            self.detail_view.show(sid, None, None)
        self.detail_view.kernel = kernel
        self._load_detail(sid)
        self.action_show("detail")

    def _load_detail(self, sid: str) -> None:
        row = self.model.sessions.get(sid)
        self._detail_key = _detail_key(row)
        self._background(self._fetch_detail(sid), group="detail", exclusive=True)

    async def _fetch_detail(self, sid: str) -> None:
        try:
            detail, history = await asyncio.gather(self.client.get_session(sid), self.client.history(sid))
        except APIError as e:
            self.detail_view.show(sid, None, None, error=f"cannot load the session: {e}")
            return
        if self.detail_view.session_id == sid:
            self.detail_view.show(sid, detail, history)

    def _maybe_reload_detail(self) -> None:
        sid = self.detail_view.session_id
        if sid is not None and _detail_key(self.model.sessions.get(sid)) != self._detail_key:
            self._load_detail(sid)
        elif sid is not None and sid in self.model.sessions:
            self.detail_view.set_usage(self.model.sessions[sid].get("usage"))

    def action_logs(self) -> None:
        sid = self.selected_session()
        if sid is None:
            self.notify("No session chosen.", severity="warning")
            return
        if self.view == "logs":
            return
        self.with_kernel(sid, "logs", lambda kernel: self._open_logs(sid, kernel))

    def _open_logs(self, sid: str, kernel: str | None) -> None:
        if sid != self.logs_view.session_id or kernel != self.logs_view.kernel:
            row = self.model.sessions.get(sid) or {}
            self._pending_logs = []
            self.logs_view.reset(sid, row.get("name", sid[:8]), kernel)
            self._background(self._follow_logs(sid, kernel), group="logs", exclusive=True)
        self.action_show("logs")

    def action_events(self) -> None:
        """`e`: the session's events, its transitions as stored and then lifecycle events as they happen."""
        sid = self.selected_session()
        if sid is None:
            self.notify("No session chosen.", severity="warning")
            return
        if sid != self.events_view.session_id:
            row = self.model.sessions.get(sid) or {}
            self.events_view.reset(sid, row.get("name", sid[:8]))
            self._background(self._follow_events(sid), group="events", exclusive=True)
        self.action_show("events")

    async def _follow_events(self, sid: str) -> None:
        view = self.events_view
        try:
            detail = await self.client.get_session(sid)
        except APIError as e:
            view.state = f"cannot load the session: {e}"
            view.refresh_view()
            return
        view.transitions = list(detail.get("transitions") or [])
        view.state = ""
        view.refresh_view()
        try:
            async for name, data in self.client.events(sid, until_end=True):
                if view.session_id != sid:
                    return
                view.add_event(self.clock().strftime("%Y-%m-%d %H:%M:%S"), name, data)
        except APIError as e:
            view.state = f"the events stream stopped: {e}"
            view.refresh_view()
            return
        view.state = "the session ended: no more events"
        view.refresh_view()

    def action_json(self) -> None:
        """`y`: the session as `GET /session/{id}` returns it, as JSON."""
        sid = self.selected_session()
        if sid is None:
            self.notify("No session chosen.", severity="warning")
            return
        name = (self.model.sessions.get(sid) or {}).get("name", sid[:8])
        self.json_view.show(sid, name, None)
        self._background(self._fetch_json(sid, name), group="json", exclusive=True)
        self.action_show("json")

    async def _fetch_json(self, sid: str, name: str) -> None:
        try:
            data = await self.client.get_session(sid)
        except APIError as e:
            self.json_view.show(sid, name, None, error=f"cannot load the session: {e}")
            return
        if self.json_view.session_id == sid:
            self.json_view.show(sid, name, data)

    def action_terminate(self) -> None:
        if self.read_only:
            return
        sid = self.selected_session()
        row = self.model.sessions.get(sid or "")
        if sid is None or row is None:
            self.notify("No session chosen.", severity="warning")
            return
        question = f"Terminate session {row['name']} ({sid[:8]}, {row['status']})?"

        def answered(yes: bool | None) -> None:
            if yes:
                self._background(self._terminate(sid, row["name"]), group=f"terminate-{sid}")

        self.push_screen(ConfirmScreen(question, yes="Terminate"), answered)

    async def _terminate(self, sid: str, name: str) -> None:
        try:
            await self.client.destroy_session(sid, wait=False)
        except APIError as e:
            self.notify(f"Could not terminate {name}: {e}", severity="error", timeout=8)
            return
        self.notify(f"Terminating {name}…")

    def _running_session(self, sid: str | None, refused: str, not_running: str) -> dict[str, Any] | None:
        """The chosen session's row when it runs and this dashboard may act on it; else None, and a note
        saying why (`not_running` is completed with "a running session.")."""
        if self.read_only:
            self.notify(f"Read-only dashboard: {refused}.", severity="warning")
            return None
        row = self.model.sessions.get(sid or "")
        if sid is None or row is None:
            self.notify("No session chosen.", severity="warning")
            return None
        if row["status"] not in SHELL_STATUSES:
            sentence = not_running.format(name=row["name"], status=row["status"])
            self.notify(f"{sentence} a running session.", severity="warning")
            return None
        return row

    def open_shell(self, sid: str | None) -> None:
        """`s`: a shell in a running session; the dashboard gives way to it until it ends."""
        row = self._running_session(sid, "no shells", "No shell in {name}: it is {status}, and a shell needs")
        if row is None:
            return
        if self.shell_open or sid is None:
            return
        name = row["name"]

        def start(kernel: str | None) -> None:
            if self.shell_open:
                return
            self.shell_open = True
            self._background(self._shell(sid, name, kernel), group="shell", exclusive=True)

        self.with_kernel(sid, "a shell", start)

    async def _shell(self, sid: str, name: str, kernel: str | None = None) -> None:
        where = name if kernel is None else f"{name} ({kernel})"
        try:
            status = await self.shell_runner(sid, kernel)
        except SuspendNotSupported:
            self.notify("This terminal cannot give way to a shell: use `bai session shell`.", severity="error")
            return
        except (APIError, OSError) as e:
            self.notify(f"Could not open a shell in {where}: {e}", severity="error", timeout=8)
            return
        finally:
            self.shell_open = False
            self._back_from_shell()
        self.notify(
            f"shell in {where} ended with status {status}", severity="information" if status == 0 else "warning"
        )

    def _back_from_shell(self) -> None:
        """The terminal is the dashboard's again: the view is drawn anew and its table has the focus, so
        that the next key acts on the row highlighted now."""
        self._unless_closing(lambda: self._switch(self.view))

    async def _suspended_shell(self, sid: str, kernel: str | None = None) -> int:
        """Give this terminal to a shell in the session (attach_terminal, as `bai session shell`) and take
        it back when the shell ends; nothing is drawn meanwhile (the model keeps up with the cluster)."""
        from bai.cli.terminal import attach_terminal

        failed: BaseException
        with self.batch_update(), self.suspend():
            try:  # App.suspend resumes only when its block ends without an exception
                return await attach_terminal(self.client, sid, kernel=kernel)
            except BaseException as e:
                failed = e
        raise failed

    # -- apps forwarded to local ports (f) ----------------------------------------------------------

    def choose_app(self, sid: str | None) -> None:
        """`f`: the running session's apps in a dialog; the one chosen is forwarded to a local port."""
        row = self._running_session(sid, "no apps forwarded", "No apps of {name}: it is {status}, and apps need")
        if row is None:
            return
        self._background(self._choose_app(row), group="apps", exclusive=True)

    async def _choose_app(self, row: dict[str, Any]) -> None:
        sid, name = row["id"], row["name"]
        try:
            apps = await self.client.apps(sid)
        except APIError as e:
            self.notify(f"Could not list the apps of {name}: {e}", severity="error", timeout=8)
            return
        if not apps:
            self.notify(f"session {name} offers no apps", severity="warning")
            return
        forwarded = {app: url for (session, app), url in self.forward_urls.items() if session == sid}

        def chosen(app_name: str | None) -> None:
            app = next((a for a in apps if a.get("name") == app_name), None)
            if app is not None:
                self.forward_app(row, app)

        self.push_screen(AppsScreen(name, apps, forwarded), chosen)

    def forward_app(self, row: dict[str, Any], app: dict[str, Any]) -> None:
        """Forward an app of a session, once: asked again, the dashboard says where it is."""
        key = (row["id"], str(app["name"]))
        if key in self.forwards:
            self.notify(f"{key[1]}: {self.forwards[key].url}")
            return
        if key in self._opening:
            return
        self._opening.add(key)
        self._background(self._forward(key, row, app), group=f"forward-{key[0]}-{key[1]}")

    async def _forward(self, key: tuple[str, str], row: dict[str, Any], app: dict[str, Any]) -> None:
        sid, name = key
        self.notify(f"starting {name}…")
        try:
            forward = await self.forwarder(row, app)
        except APIError as e:
            self.notify(f"{name} did not start: {e.msg or e.title}", severity="error", timeout=15)
            return
        except OSError as e:
            self.notify(f"Cannot listen for {name}: {e.strerror or e}", severity="error", timeout=10)
            return
        finally:
            self._opening.discard(key)
        self.forwards[key] = forward
        self.forward_urls[key] = forward.url
        self.detail_view.refresh_view()
        self.notify(f"{name}: {forward.url}", timeout=10)
        watch = asyncio.create_task(watch_session(self.client, row, forward.proxy))
        try:
            why = await forward.ended
        finally:  # the session ended, or the dashboard exits (the worker is cancelled)
            watch.cancel()
            await self._close_forward(key)
        self.notify(f"the forward of {name} ({forward.url}) closed: {why}", severity="warning", timeout=10)

    async def _close_forward(self, key: tuple[str, str]) -> None:
        forward = self.forwards.pop(key, None)
        self.forward_urls.pop(key, None)
        if forward is not None:
            if self.is_running:
                self.detail_view.refresh_view()
            await forward.close()

    async def _forward_locally(self, session: dict[str, Any], app: dict[str, Any]) -> Forward:
        """Start the app, listen on 127.0.0.1 (the app's port when free, else any), as `bai session app`;
        what goes wrong with a connection later is told in a note."""
        return await open_forward(
            self.client, session, app, FORWARD_HOST, app_port(app, FORWARD_HOST), out=_Notes(self)
        )

    async def on_unmount(self) -> None:
        """The dashboard exits: every forward closes."""
        await asyncio.gather(*(self._close_forward(key) for key in list(self.forwards)))

    # -- prompts ----------------------------------------------------------------------------------

    def _typed_in_prompt(self, char: str) -> bool:
        """`/` and `:` are priority keys (so that the prompt opens before the next key is handled); while the
        prompt is open they are text in it."""
        if self.prompt_bar.shown:
            self.prompt_bar.input.insert_text_at_cursor(char)
            return True
        return False

    # -- projects (p, :project NAME) ----------------------------------------------------------------

    def project_choices(self) -> list[str]:
        """The projects seen: those `GET /bai/projects` lists (the header's) and those of the sessions."""
        return sorted(set(self.query_one(Header).project_names()) | set(self.model.project_names()))

    def action_project(self) -> None:
        """`p`: the sessions of the next project (all of them, then each project in turn, then all again)."""
        choices: list[str | None] = [None, *self.project_choices()]
        current = self.sessions_view.project
        at = choices.index(current) if current in choices else 0
        self.select_project(choices[(at + 1) % len(choices)])

    def select_project(self, name: str | None) -> None:
        """Only the sessions of project `name` (None: every project's), named in the summary, lit in the header."""
        self.sessions_view.project = name
        self.sessions_view.refresh_view()
        self._drawn.pop("sessions", None)
        self.query_one(Header).select_project(name)
        self.refresh_bindings()

    def _command_project(self, arg: str) -> None:
        """`:project NAME` (any case; `all` or nothing: every project)."""
        if arg in ("", "all", "*"):
            self.select_project(None)
            return
        found = [p for p in self.project_choices() if p.lower() == arg.lower()]
        if not found:
            known = ", ".join(self.project_choices()) or "none seen yet"
            self.notify(f"No project {arg} (projects: {known})", severity="warning")
            return
        self.select_project(found[0])
        if self.view != "sessions":
            self.action_show("sessions")

    def action_filter(self) -> None:
        if self._typed_in_prompt("/"):
            return
        if self.view == "sessions":
            current = self.sessions_view.filter.text
            hint = (
                "filter sessions: words; status:pending|running|finished|failed|STATUS, exit:N, agent:ID, "
                "name:, image:, owner:KEY, id:PREFIX; a leading ! inverts"
            )
        elif self.view == "logs":
            current = self.logs_view.log_view.filter.text
            hint = "filter lines: words that must all occur; a leading ! inverts; empty: no filter"
        else:
            return
        view = self.view

        def done(value: str | None) -> None:
            self._focus_view()
            if value is None:
                return
            flt = Filter.parse(value)
            if view == "sessions":
                self.sessions_view.filter = flt
                self.sessions_view.refresh_view()
            else:
                self.logs_view.log_view.set_filter(flt)
                self.logs_view.refresh_view()
            self.refresh_bindings()

        self.prompt_bar.ask("/", current, hint, done)

    def action_command(self) -> None:
        if self._typed_in_prompt(":"):
            return

        def done(value: str | None) -> None:
            self._focus_view()
            if not value:
                return
            word = value.strip().lstrip(":").lower()
            first, _, rest = value.strip().lstrip(":").partition(" ")
            if first.lower() in ("project", "projects", "proj", "pj"):
                self._command_project(rest.strip())
                return
            if word in ("preset", "presets", "pre"):
                self._background(self._show_presets(), group="presets", exclusive=True)
                return
            if word in ("round", "rounds"):
                self._background(self._show_rounds(None), group="rounds", exclusive=True)
                return
            if word in ("fairshare", "fair-share", "fair", "fs"):
                self._background(self._show_fair_share(), group="fair-share", exclusive=True)
                return
            if first.lower() == "replay":
                if not rest.strip().isdigit():
                    self.notify("Replay which round? :replay N (:rounds lists them)")
                    return
                self._background(self._show_rounds(int(rest.strip())), group="rounds", exclusive=True)
                return
            target = view_of(word, VIEW_NAMES)
            if word in ("q", "quit", "exit"):
                self.exit()
            elif word in ("h", "help", "?"):
                self.action_help()
            elif target is not None:
                if target == "detail" and self.view == "sessions":
                    self.action_describe()
                elif target == "logs" and self.view in ("sessions", "detail"):
                    self.action_logs()
                elif target == "events" and self.view != "events":
                    self.action_events()
                elif target == "json" and self.view != "json":
                    self.action_json()
                else:
                    self.action_show(target)
            else:
                self.notify(
                    f"Unknown command :{word} (try agents, sessions, describe, logs, events, json, project NAME, "
                    "presets, rounds, replay N, fairshare, help, quit)"
                )

        hint = "agents · sessions · describe · logs · events · json · project NAME · presets · help · quit"
        self.prompt_bar.ask(":", "", hint, done)

    async def _show_fair_share(self) -> None:
        try:
            screen = FairShareScreen(await self.client.fair_share())
        except APIError as e:
            self.notify(f"Could not read fair share: {e}", severity="error", timeout=8)
            return
        self.push_screen(screen)

    async def _show_rounds(self, number: int | None) -> None:
        try:
            if number is None:
                screen = RoundsScreen(rounds=(await self.client.scheduler_rounds(50))["rounds"])
            else:
                screen = RoundsScreen(replay=await self.client.replay_round(number))
        except APIError as e:
            self.notify(f"Could not read the scheduling rounds: {e}", severity="error", timeout=8)
            return
        self.push_screen(screen)

    async def _show_presets(self) -> None:
        try:
            answer = await self.client.check_presets()
        except APIError as e:
            self.notify(f"Could not check the resource presets: {e}", severity="error", timeout=8)
            return
        self.push_screen(PresetsScreen(answer))

    def action_help(self) -> None:
        self.push_screen(HelpScreen(self.read_only))

    # -- log view keys ----------------------------------------------------------------------------

    def action_toggle_timestamps(self) -> None:
        view = self.logs_view.log_view
        view.timestamps = not view.timestamps
        self.logs_view.refresh_view()

    def action_toggle_wrap(self) -> None:
        view = self.logs_view.log_view
        view.wrap_lines = not view.wrap_lines
        self.logs_view.refresh_view()

    def action_log_end(self) -> None:
        self.logs_view.log_view.jump_end()
        self.logs_view.refresh_view()

    def action_log_start(self) -> None:
        self.logs_view.log_view.jump_start()
        self.logs_view.refresh_view()

    def action_save_log(self) -> None:
        """Ctrl-s: the log as kept (every line, without colour codes) to ./SESSION-KERNEL.log in the current
        folder; never over a file (then -1, -2 … before .log). The note says where it went."""
        view = self.logs_view
        if view.session_id is None:
            return
        try:
            path = save_log(view.plain_lines(), view.session_name, view.kernel or "main1")
        except OSError as e:
            self.notify(f"Could not save the log: {e.strerror or e}", severity="error", timeout=8)
            return
        self.notify(f"saved {len(view.buffer.lines)} lines to {path}", timeout=8)

    def action_copy_log(self) -> None:
        """c: the lines the log view shows (its filter applied) to the clipboard (OSC 52 on the terminal)."""
        view = self.logs_view
        lines = view.plain_lines(shown_only=True)
        self.copy_to_clipboard("\n".join(lines) + ("\n" if lines else ""))
        self.notify(f"copied {len(lines)} lines to the clipboard")


class _Notes:
    """A file for `print`: each line written becomes a note on the dashboard (a warning)."""

    def __init__(self, app: App) -> None:
        self.app = app

    def write(self, text: str) -> int:
        if text.strip():
            self.app.notify(text.strip(), severity="warning", timeout=8)
        return len(text)

    def flush(self) -> None:
        pass


def _detail_key(row: dict[str, Any] | None) -> Any:
    if row is None:
        return None
    return (row["status"], row.get("statusChanged"), row.get("queuePosition"), row.get("reason"))


def run(client: Client, read_only: bool = False) -> None:
    Dashboard(client, read_only=read_only).run()
