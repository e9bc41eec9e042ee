"""The log view: ANSI colours, `\\r` progress lines collapsed as a terminal shows them (across chunks), run
separators, bounded cost on huge logs and lines; the header's figures and its stale marker; the quota
route; run boundaries on the dashboard's logs stream, end to end (sim node)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from textual.app import App, ComposeResult

from bai.client.api import APIError
from bai.tui.app import Dashboard
from bai.tui.header import Header, header_text, short_key
from bai.tui.model import MAX_LINE, LogBuffer
from bai.tui.views import LogsView
from bai.tui.widgets import separator
from tests.nodeproc import Node
from tests.tui_support import collect, node_client, until

NOW = datetime(2026, 3, 1, 14, 5, 0, tzinfo=UTC)


def texts(buffer: LogBuffer) -> list[str]:
    return [line.text for line in buffer.all_lines()]


def plain_of(strip) -> str:
    return "".join(segment.text for segment in strip)


# -- the buffer: carriage returns ------------------------------------------------------------------


def test_a_progress_bar_written_in_100_chunks_is_one_line_that_updates() -> None:
    buffer = LogBuffer()
    buffer.feed("downloading\n")
    for n in range(1, 101):
        buffer.feed(f"\r{n:3d}%|{'#' * (n // 10):<10}|")
        assert texts(buffer) == ["downloading", f"{n:3d}%|{'#' * (n // 10):<10}|"]
    buffer.feed("\n")
    buffer.feed("done\n")
    assert texts(buffer) == ["downloading", "100%|##########|", "done"]
    assert [line.index for line in buffer.all_lines()] == [0, 1, 2]


def test_carriage_returns_across_chunk_boundaries() -> None:
    buffer = LogBuffer()
    buffer.feed("abc\r")  # ends with \r: still shows abc
    assert texts(buffer) == ["abc"]
    buffer.feed("\n")  # \r then \n in the next chunk: a plain newline
    assert texts(buffer) == ["abc"]
    buffer.feed("one\rtw")
    assert texts(buffer) == ["abc", "tw"]
    buffer.feed("o\r")
    buffer.feed("three\r\nfour\r\n")  # \r\n is a newline, not an overwrite
    assert texts(buffer) == ["abc", "three", "four"]
    buffer.feed("x\r\ry\n")
    assert texts(buffer) == ["abc", "three", "four", "y"]


def test_crlf_output_is_plain_lines() -> None:
    buffer = LogBuffer()
    done = buffer.feed("a\r\nb\r\nc")
    assert [line.text for line in done] == ["a", "b"] and buffer.partial is not None and buffer.partial.text == "c"


def test_a_huge_line_is_kept_bounded() -> None:
    buffer = LogBuffer()
    started = time.perf_counter()
    for _ in range(160):  # 10 MB without a newline, in 64 KiB chunks
        buffer.feed("x" * 65536)
    buffer.feed("\n")
    assert time.perf_counter() - started < 2.0
    (line,) = buffer.all_lines()
    assert len(line.text) == MAX_LINE and line.cut == 160 * 65536 - MAX_LINE


def test_run_separators_complete_the_partial_line_and_update_in_place() -> None:
    buffer = LogBuffer()
    buffer.feed("before\nno newline")
    added = buffer.mark_run({"run": 1, "startedAt": "2026-03-01T14:02:11+00:00", "endedAt": None, "exitCode": None})
    assert [(line.text, line.run is not None) for line in added] == [("no newline", False), ("", True)]
    buffer.feed("out\n")
    assert buffer.mark_run({"run": 1, "startedAt": "x", "endedAt": "y", "exitCode": 0}) == []
    assert buffer.runs[1].run["exitCode"] == 0
    assert [line.index for line in buffer.all_lines()] == [0, 1, 2, 3]


def test_separator_text() -> None:
    run = {"run": 3, "startedAt": "2026-03-01T14:02:11+00:00", "endedAt": "…", "exitCode": 0}
    assert separator(run, 40).plain == "── run 3 · 14:02:11 " + "─" * 13 + " exit 0"
    assert separator(run, 40).cell_len == 40
    assert separator(dict(run, exitCode=2), 40).plain.endswith("─ exit 2")
    assert separator(dict(run, endedAt=None, exitCode=None), 40).plain.endswith("─ running")


# -- run boundaries on the logs stream (the manager's side, pure) -----------------------------------


def test_run_events_come_between_the_chunks_around_them_and_once_when_resuming() -> None:
    from bai.node.manager.http.dashboard import _RunMarks
    from bai.node.manager.services.runs import RunHistory

    woken: list[str] = []
    runs = RunHistory(woken.append)
    runs.start("s", "k", "r1", 0, "2026-01-01T00:00:01+00:00")
    runs.end("s", "r1", 0, "2026-01-01T00:00:02+00:00")
    runs.start("s", "k", "r2", 10, "2026-01-01T00:00:03+00:00")
    assert woken == ["k", "k", "k"]  # each start and end wakes the kernel's log followers
    marks = _RunMarks(runs.of, "s", "k", 5)  # the lines sent start after chunk 5: run 1 began before them
    assert [(e["run"], e["exitCode"]) for e in marks.due(6)] == [(1, 0)]
    assert marks.next_after() == 10  # chunks up to 10 go before run 2
    assert [e["run"] for e in marks.due(11)] == [2]
    assert marks.due(None) == [] and marks.next_after() is None
    runs.end("s", "r2", 3, "2026-01-01T00:00:04+00:00")
    assert [(e["run"], e["exitCode"]) for e in marks.due(12)] == [(2, 3)]  # its end, once
    assert marks.due(None) == []
    # resuming after chunk 20: run 2 ended before that chunk was stored (the client knows), or after it
    assert _RunMarks(runs.of, "s", "k", 20, "2026-01-01T00:00:05+00:00").due(None) == []
    assert [e["run"] for e in _RunMarks(runs.of, "s", "k", 20, "2026-01-01T00:00:03.5+00:00").due(None)] == [2]
    runs.start("s", "k", "r3", 30, "2026-01-01T00:00:06+00:00")
    runs.end_all("s", "2026-01-01T00:00:07+00:00")  # the session ended: no exit code
    assert runs.of("s", "k")[-1].event("k")["exitCode"] is None and runs.of("s", "k")[-1].ended_at


# -- the view --------------------------------------------------------------------------------------


class LogApp(App):
    def __init__(self, max_lines: int = 10_000) -> None:
        super().__init__()
        self.max_lines = max_lines

    def compose(self) -> ComposeResult:
        yield LogsView(self.max_lines, id="logs")


async def test_ansi_colours_show_as_colours_without_escape_codes() -> None:
    app = LogApp()
    async with app.run_test(size=(80, 10)) as pilot:
        view = app.query_one(LogsView)
        view.reset("s", "demo")
        view.feed([[1, "\x1b[31mred\x1b[0m and \x1b[1;32mbold green\x1b[0m\x1b[K plain\n", NOW.isoformat()]])
        await pilot.pause()
        log = view.log_view
        strip = log.render_line(0)
        assert plain_of(strip).rstrip() == "red and bold green plain"
        assert "\x1b" not in plain_of(strip)
        styles = {segment.text: segment.style for segment in strip if segment.text.strip()}
        assert styles["red"].color is not None and styles["red"].color.name == "color(1)"
        assert styles["bold green"].bold and styles["bold green"].color.name == "color(2)"
        # the filter and widths see the text without codes
        assert log.rows[0][1] == "red and bold green plain"


async def test_the_log_view_draws_a_collapsed_progress_bar_and_run_separators() -> None:
    app = LogApp()
    async with app.run_test(size=(60, 10)) as pilot:
        view = app.query_one(LogsView)
        view.reset("s", "demo")
        ts = NOW.isoformat()
        view.feed([{"run": 1, "startedAt": "2026-03-01T14:02:11+00:00", "endedAt": None, "exitCode": None}])
        for n in range(0, 101, 10):
            view.feed([[n + 1, f"\r{n}%|{'#' * (n // 10):<10}|", ts]])
        view.feed([[200, "\n", ts], {"run": 1, "startedAt": "2026-03-01T14:02:11+00:00", "endedAt": ts, "exitCode": 0}])
        await pilot.pause()
        lines = [plain_of(view.log_view.render_line(y)).rstrip() for y in range(3)]
        assert lines[0].startswith("── run 1 · 14:02:11 ─") and lines[0].endswith("exit 0")
        assert lines[1] == "100%|##########|"
        assert lines[2] == ""


async def test_a_10_mb_log_stays_responsive() -> None:
    app = LogApp()
    async with app.run_test(size=(120, 40)) as pilot:
        view = app.query_one(LogsView)
        view.reset("s", "demo")
        line = "\x1b[32mINFO\x1b[0m step {n} loss=0.123 \x1b[1mok\x1b[0m " + "." * 60 + "\n"
        chunk = "".join(line.format(n=n) for n in range(1000))  # about 100 KB
        started = time.perf_counter()
        seq = 0
        while seq * len(chunk) < 10 * 2**20:
            seq += 1
            view.feed([[seq, chunk, NOW.isoformat()]])
        fed = time.perf_counter() - started
        started = time.perf_counter()
        await pilot.press("t")  # a key that rebuilds every row
        await pilot.pause()
        view.log_view.timestamps = True
        await pilot.pause()
        keyed = time.perf_counter() - started
        assert len(view.buffer.lines) == 10_000
        assert plain_of(view.log_view.render_line(0)).strip()
        print(f"10 MB fed in {fed:.2f} s; t + a timestamp rebuild: {keyed:.2f} s")
        assert fed < 15 and keyed < 2, (fed, keyed)


# -- the header ------------------------------------------------------------------------------------

QUOTA = {
    "accessKey": "AKIAIOSFODNN7EXAMPLE",
    "resourcePolicy": "default",
    "maxConcurrentSessions": 3,
    "concurrentSessions": 2,
    "totalResourceSlots": {"cpu": "4", "mem": str(8 * 2**30)},
    "defaultForUnspecified": "UNLIMITED",
    "occupiedSlots": {"cpu": "3", "mem": str(3 * 2**30)},
}


def test_header_text_shows_the_key_and_the_quota() -> None:
    assert short_key("AKIAIOSFODNN7EXAMPLE") == "AKIA…PLE"
    text = header_text("AKIAIOSFODNN7EXAMPLE", QUOTA, None, 100).plain
    assert text == "AKIA…PLE  sessions 2/3  cpu 3/4  mem 3.0/8 GiB"
    unlimited = dict(QUOTA, maxConcurrentSessions=0, totalResourceSlots={})
    assert header_text("AK", unlimited, None, 100).plain == "AK  sessions 2/∞  cpu 3/∞  mem 3.0/∞ GiB"
    stale = header_text("AKIAIOSFODNN7EXAMPLE", QUOTA, 12.4, 80).plain
    assert stale.endswith("⚠ stale 12s — reconnecting") and len(stale) == 80


class FakeClient:
    """A manager that sends a snapshot, then breaks the stream (and refuses to reconnect)."""

    endpoint = "http://fake"

    def __init__(self) -> None:
        self.drop = asyncio.Event()
        self.calls = 0

    async def dashboard_events(self, **kw: Any):
        self.calls += 1
        if self.calls > 1:
            raise APIError(503, "Service Unavailable", "the manager is restarting")
        yield "snapshot", {"now": NOW.isoformat(), "sessions": [], "agents": []}
        await self.drop.wait()
        raise APIError(503, "Service Unavailable", "connection lost")

    async def request(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        assert (method, path) == ("GET", "/bai/quota")
        return QUOTA


async def test_the_header_shows_the_quota_and_marks_data_stale_while_disconnected() -> None:
    client = FakeClient()
    clock = [NOW]
    app = Dashboard(client, clock=lambda: clock[0])  # type: ignore[arg-type]
    async with app.run_test(size=(120, 30)) as pilot:
        header = app.query_one(Header)
        await until(pilot, lambda: app.connected and header.quota is not None, what="quota")
        await pilot.pause(0.1)
        shown = str(header.render())
        assert "AKIA…PLE  sessions 2/3  cpu 3/4  mem 3.0/8 GiB" in shown and "stale" not in shown
        client.drop.set()
        await until(pilot, lambda: not app.connected, what="disconnected")
        clock[0] = NOW + timedelta(seconds=12)
        await until(pilot, lambda: "⚠ stale 12s — reconnecting" in str(header.render()), what="stale marker")
        assert "sessions 2/3" in str(header.render())  # the last figures stay, marked stale


# -- end to end: the quota route and run boundaries on the logs stream ----------------------------


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> Iterator[Node]:
    node = Node(tmp_path_factory.mktemp("tui-logs"), "sim", agent_config='cpu = "4"\nmem = "8g"\n').start()
    yield node
    node.stop()


async def test_quota_route_gives_the_callers_own_limits_and_use(node: Node) -> None:
    client = node_client(node)
    name = f"quota-{int(time.time() * 1000) % 100000}"
    node.cli("session", "create", "--name", name, "--cpu", "1", "--mem", "1g", "sim")
    try:
        quota = await client.request("GET", "/bai/quota")
        assert quota["accessKey"] == client.creds.access_key
        assert quota["concurrentSessions"] >= 1
        assert float(quota["occupiedSlots"]["cpu"]) >= 1
        assert set(quota) >= {"maxConcurrentSessions", "totalResourceSlots", "defaultForUnspecified"}
        with pytest.raises(APIError) as refused:
            await client.request("GET", "/bai/quota?access_key=someone-else")
        assert refused.value.status == 400
    finally:
        node.cli("session", "destroy", name)


async def test_runs_come_on_the_logs_stream_between_their_output(node: Node) -> None:
    name = f"runs-{int(time.time() * 1000) % 100000}"
    node.cli("session", "create", "--name", name, "sim")
    try:
        node.cli("session", "exec", name, "--", "echo", "first", check=True)
        node.cli("session", "exec", name, "-c", "print('second')", check=True)  # query mode
        node.cli("session", "exec", name, "--", "exit", "3")
        client = node_client(node)

        def stop(ev: str, data: dict) -> bool:
            return ev == "run" and data["run"] == 3 and data["exitCode"] is not None

        events = await collect(client.dashboard_events(topics="logs", session=name), stop)
        order = []
        for ev, data in events:
            if ev == "run":
                order.append(("run", data["run"], data["exitCode"]))
            elif ev == "log":
                order += [("text", text) for _, text, _ in data["chunks"]]
        runs = [o for o in order if o[0] == "run"]
        assert runs == [("run", 1, 0), ("run", 2, 0), ("run", 3, 3)]
        text = "".join(o[1] for o in order if o[0] == "text")
        assert "first" in text and "second" in text
        first_run, second_run = order.index(runs[0]), order.index(runs[1])
        at = [i for i, o in enumerate(order) if o[0] == "text" and "first" in o[1]][0]
        at2 = [i for i, o in enumerate(order) if o[0] == "text" and "second" in o[1]][0]
        assert first_run < at < second_run < at2

        # the dashboard draws them: a separator per run, with its exit code
        app = Dashboard(client)
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: any(s["name"] == name for s in app.model.sessions.values()), what="row")
            sid = next(s["id"] for s in app.model.sessions.values() if s["name"] == name)
            app.logs_view.reset(sid, name)
            app.run_worker(app._follow_logs(sid), group="logs", exclusive=True)
            app.action_show("logs")
            view = app.logs_view.log_view
            await until(pilot, lambda: len(app.logs_view.buffer.runs) == 3, what="three separators")
            await pilot.pause(0.2)
            shown = [plain_of(view.render_line(y)).rstrip() for y in range(len(view.rows))]
            seps = [line for line in shown if line.startswith("── run")]
            assert len(seps) == 3 and seps[0].endswith("exit 0") and seps[2].endswith("exit 3")
            assert shown[shown.index(seps[0]) + 1] == "first" and shown[shown.index(seps[1]) + 1] == "second"
    finally:
        node.cli("session", "destroy", name, check=False)
