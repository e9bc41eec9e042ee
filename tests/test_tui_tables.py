"""The dashboard's tables and navigation: columns that fit 80, 120 and 200 columns, live statistics,
k9s keys (j/k, g/G, Home/End, shift + letter sorts, `:` prefixes and aliases), exact filters, Esc, Enter
on an agent, failed sessions in red, and how long finished ones ran. Driven on a made-up cluster
(tests/tui_fake.py), with a frozen clock."""

from __future__ import annotations

from datetime import timedelta

import pytest
from rich.text import Text

from bai.tui.app import VIEW_NAMES, Dashboard
from bai.tui.model import ClusterModel, Filter, is_failed, view_of
from bai.tui.tables import Column, fit_columns, header
from bai.tui.views import duration, gauge_column, info_text, queue_and_run, run_timing
from tests.tui_fake import GIB, FakeClient, agents, sessions
from tests.tui_support import FROZEN, frozen_clock, plain, until

SIZES = [(80, 24), (120, 40), (200, 60)]


def by_name(name: str) -> dict:
    return next(s for s in sessions() if s["name"] == name)


# -- pure pieces -------------------------------------------------------------------------------------


def test_columns_give_way_by_priority_and_the_flex_column_takes_the_rest() -> None:
    cols = [
        Column("name", "NAME", 10),
        Column("id", "ID", 8, priority=4),
        Column("age", "AGE", 4, priority=2),
        Column("info", "REASON", 10, flex=True),
    ]
    # everything fits: the reason takes what is left (cells of padding 2 each, 2 for the scroll bar)
    wide = fit_columns(cols, 100)
    assert [c.key for c in wide] == ["name", "id", "age", "info"]
    assert sum(c.width + 2 for c in wide) + 2 == 100
    # short: the highest priority (id) goes first, then age; priority 0 never goes
    assert [c.key for c in fit_columns(cols, 40)] == ["name", "age", "info"]
    assert [c.key for c in fit_columns(cols, 30)] == ["name", "info"]
    assert [c.key for c in fit_columns(cols, 10)] == ["name", "info"]
    # several flex columns share the spare cells
    two = fit_columns([Column("a", "A", 5, flex=True), Column("b", "B", 5, flex=True)], 21)
    assert [c.width for c in two] == [8, 7]


def test_the_header_underlines_the_sort_letter_and_shows_the_direction() -> None:
    col = Column("where", "AGENT/QUEUE", 11, sort="Q")
    text = header(col)
    assert text.plain == "AGENT/QUEUE" and any(span.style == "underline" for span in text.spans)
    assert header(col, ("where", False)).plain == "AGENT/QUEUE▲"
    assert header(col, ("where", True)).plain == "AGENT/QUEUE▼"
    assert header(col, ("name", True)).plain == "AGENT/QUEUE"


def test_filters_match_fields_exactly_and_plain_words_anywhere() -> None:
    rows = sessions()

    def names(text: str) -> list[str]:
        return [s["name"] for s in rows if Filter.parse(text).match_session(s)]

    assert names("exit:3") == ["flaky-job"]
    assert names("exit:0") == ["etl-nightly"]
    assert names("agent:agent-1") == ["train-resnet", "flaky-job"]  # not agent-10's
    assert "lab-agent-10" in names("agent-1")  # a plain word still matches anywhere
    assert names("status:failed") == ["flaky-job", "report-after-flaky", "bad-image"]
    assert names("status:ok") == ["etl-nightly", "stopped-by-me"]
    assert names("status:pending") == ["big-sweep", "after-notebook"]
    assert names("status:error") == ["bad-image"]
    assert names("name:flaky") == [] and names("name:flaky-job") == ["flaky-job"]
    assert names("status:failed agent:agent-1") == ["flaky-job"]  # different fields: both
    assert names("exit:3 exit:0") == ["etl-nightly", "flaky-job"]  # one field twice: either
    assert "flaky-job" not in names("!status:failed")
    assert Filter.parse("http://x:1").words == ("http://x:1",)  # not a field: a word


def test_failed_sessions() -> None:
    failed = {s["name"] for s in sessions() if is_failed(s)}
    assert failed == {"flaky-job", "report-after-flaky", "bad-image"}
    running = {**by_name("train-resnet"), "exitCode": 3}  # a running session's last run failed: not it
    assert not is_failed(running)


def test_a_live_session_says_its_last_run_ended_not_that_it_failed() -> None:
    notebook = by_name("notebook-ana")  # RUNNING, its last run exit 137 FAILURE
    assert info_text(notebook, FROZEN) == "last run: exit 137"
    assert "FAILURE" not in info_text(notebook, FROZEN)
    ended = {
        **notebook,
        "status": "TERMINATED",
        **{k: FROZEN.isoformat() for k in ("terminationTime", "statusChanged")},
    }
    assert info_text(ended, FROZEN).startswith("exit 137 · ")


def test_finished_sessions_say_how_long_they_ran_and_when_they_ended() -> None:
    assert [duration(s) for s in (0, 45, 123, 3725, 90000)] == ["0s", "45s", "2m 3s", "1h 2m", "1d 1h"]
    etl, flaky = by_name("etl-nightly"), by_name("flaky-job")
    # queued and running times apart (startedAt), no "queued" when it did not wait
    assert run_timing(etl, FROZEN) == "queued 5s, ran 2m 3s · ended 11:52"
    assert info_text(etl, FROZEN) == "exit 0 · queued 5s, ran 2m 3s · ended 11:52 · task-done"
    assert info_text(flaky, FROZEN).startswith("exit 3 · ran 47s · ended 11:54")
    # a session that waited 2m 1s and ran 19m 2s does not say it "ran 21m 3s"
    long_wait = {**etl, "creationTime": (FROZEN - timedelta(seconds=21 * 60 + 3)).isoformat()}
    long_wait.update(
        startedAt=(FROZEN - timedelta(seconds=19 * 60 + 2)).isoformat(), terminationTime=FROZEN.isoformat()
    )
    assert run_timing(long_wait, FROZEN).startswith("queued 2m 1s, ran 19m 2s · ended 12:00")
    # no startedAt: the transition to RUNNING (a detail) says when it started; neither: only when it ended
    detail = {**long_wait, "startedAt": None, "transitions": [{"status": "RUNNING", "at": long_wait["startedAt"]}]}
    assert run_timing(detail, FROZEN).startswith("queued 2m 1s, ran 19m 2s")
    assert run_timing({**long_wait, "startedAt": None}, FROZEN) == "ended 12:00"
    # a running session: how long it waited and how long it has run
    train = by_name("train-resnet")
    assert queue_and_run(train, FROZEN) == "queued 2m 1s, running 39m 59s"
    assert queue_and_run(by_name("lab-agent-10"), FROZEN) == ""  # no startedAt: the AGE column says it
    # never reached an agent: no "ran"; the reason first
    cancelled = info_text(by_name("report-after-flaky"), FROZEN)
    assert cancelled.startswith("dependency-failed: ") and cancelled.endswith("· ended 11:54")
    assert "ran" not in run_timing(by_name("stopped-by-me"), FROZEN)
    # a day later the date is shown too
    assert run_timing(etl, FROZEN + timedelta(days=1)).endswith("ended 11-29 11:52")


def test_gauges_align_and_show_a_dash_without_a_figure() -> None:
    cells = gauge_column([(150.0, 200.0, "150%"), (None, None, ""), (5.0, 100.0, "5%")], 10)
    assert [c.plain for c in cells] == ["████░ 150%", "–", "█░░░░   5%"]
    assert all(c.cell_len <= 10 for c in cells)


def test_colon_takes_names_prefixes_and_aliases() -> None:
    expected = {
        "ag": "agents", "agents": "agents", "no": "agents", "nodes": "agents", "1": "agents",
        "se": "sessions", "sess": "sessions", "po": "sessions", "pods": "sessions",
        "de": "detail", "desc": "detail", "lo": "logs",
    }  # fmt: skip
    for word, view in expected.items():
        assert view_of(word, VIEW_NAMES) == view, word
    assert view_of("xyz", VIEW_NAMES) is None
    assert view_of("", VIEW_NAMES) is None


def test_usage_events_update_rows_and_count_as_changes() -> None:
    model = ClusterModel()
    model.load_snapshot({"sessions": sessions(), "agents": agents()})
    sid = by_name("tensorboard")["id"]
    version, agents_version = model.version, model.agents_version
    model.update_usage({"sessions": {sid: {"cpuPct": 50.0, "memBytes": GIB}, "gone": {}}, "agents": {}})
    assert model.sessions[sid]["usage"]["cpuPct"] == 50.0
    assert model.version == version + 1 and model.agents_version == agents_version
    model.update_usage({"agents": {"agent-3": None}})
    assert model.agents["agent-3"]["usage"] is None and model.agents_version == agents_version + 1


# -- the dashboard -----------------------------------------------------------------------------------


async def started(pilot, app: Dashboard) -> None:
    await until(pilot, lambda: len(app.sessions_view.sync.keys) == len(sessions()), what="the sessions drawn")


def shown(app: Dashboard) -> list[str]:
    return [app.model.sessions[k]["name"] for k in app.sessions_view.sync.keys]


def cells_of(app: Dashboard, name: str) -> dict[str, object]:
    sync = app.sessions_view.sync
    sid = next(k for k in sync.keys if app.model.sessions[k]["name"] == name)
    return {c.key: cell for c, cell in zip(sync.columns, sync.cells[sid], strict=True)}


def cursor_name(app: Dashboard) -> str:
    return app.model.sessions[app.sessions_view.selected()]["name"]


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_nothing_essential_is_cut(size) -> None:
    """Every cell fits its column but the reason's (which takes what is left, and `r` shows whole); the
    exit code always shows; slot units are never cut."""
    app = Dashboard(FakeClient(), clock=frozen_clock)
    async with app.run_test(size=size) as pilot:
        await started(pilot, app)
        for view in ("sessions", "agents"):
            await pilot.press("2" if view == "sessions" else "1")
            await pilot.pause(0.1)
            table = app.sessions_view.sync if view == "sessions" else app.agents_view.sync
            total = sum(c.width + 2 for c in table.columns)
            assert total <= size[0], (view, total)
            for cells in table.cells.values():
                for column, cell in zip(table.columns, cells, strict=True):
                    text = cell.plain if isinstance(cell, Text) else str(cell)
                    if column.key != "info":
                        assert len(text) <= column.width, (view, column.key, text, column.width)
        keys = [c.key for c in app.sessions_view.sync.columns]
        # the queue position and the reason before the secondary columns: at 80 even MEM gives way to it
        assert {"name", "status", "where", "cpu", "info"} <= set(keys)
        info = next(c for c in app.sessions_view.sync.columns if c.key == "info")
        assert info.width >= 24
        if size[0] >= 120:
            assert {"mem", "age"} <= set(keys) and info.width >= 37
            assert not {"image", "owner", "type"} & set(keys)
        if size[0] >= 200:
            assert "slots" in keys and info.width >= 64
        assert {c.key for c in app.agents_view.sync.columns} >= {"id", "status", "cpu", "mem", "slot:cpu", "slot:mem"}


async def test_the_reason_takes_the_rest_of_the_width_after_a_resize() -> None:
    """The columns are laid out again when the terminal is resized: the reason always fills the row, and
    the secondary columns come back (or go) by importance."""
    app = Dashboard(FakeClient(), clock=frozen_clock)
    async with app.run_test(size=(80, 24)) as pilot:
        await started(pilot, app)
        for width in (200, 120, 80):
            await pilot.resize_terminal(width, 30)
            await until(pilot, lambda w=width: _row_width(app) == w - 2, what=f"the columns for {width}")
            columns = {c.key: c for c in app.sessions_view.sync.columns}
            assert columns["info"].width >= max(24, (width - 8) // 3)
            assert ("mem" in columns) == (width >= 120) and ("slots" in columns) == (width >= 200)
            assert "image" not in columns and "owner" not in columns  # secondary: they gave way to the reason
        reason = str(cells_of(app, "big-sweep")["info"])
        assert (
            reason.startswith("no agent has 4 cpu free (") and cells_of(app, "big-sweep")["where"].plain == "queue #1"
        )


def _row_width(app: Dashboard) -> int:
    return sum(c.width + 2 for c in app.sessions_view.sync.columns)


async def test_keys_move_jump_and_sort() -> None:
    app = Dashboard(FakeClient(), clock=frozen_clock)
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot, app)
        order = shown(app)
        assert cursor_name(app) == order[0]
        await pilot.press("j", "j")
        assert cursor_name(app) == order[2]
        await pilot.press("k")
        assert cursor_name(app) == order[1]
        await pilot.press("end")
        assert cursor_name(app) == order[-1]
        await pilot.press("home")
        assert cursor_name(app) == order[0]
        await pilot.press("G")
        assert cursor_name(app) == order[-1]
        await pilot.press("g")
        assert cursor_name(app) == order[0]

        # shift + N: by name; again: the other way; a third time: the usual order
        await pilot.press("N")
        assert shown(app) == sorted(order)
        assert "NAME▲" in str(app.sessions_view.query_one("#sessions-table").columns["name"].label)
        assert "sorted by NAME ▲" in plain(app.sessions_view.query_one("#sessions-summary"))
        await pilot.press("N")
        assert shown(app) == sorted(order, reverse=True)
        assert "NAME▼" in str(app.sessions_view.query_one("#sessions-table").columns["name"].label)
        await pilot.press("N")
        assert shown(app) == order
        assert "▲" not in str(app.sessions_view.query_one("#sessions-table").columns["name"].label)
        # by CPU: the busiest first, sessions without a figure last
        await pilot.press("C")
        assert shown(app)[:3] == ["train-resnet", "lab-agent-10", "notebook-ana"]
        await pilot.press("C")
        assert shown(app)[:3] == ["notebook-ana", "lab-agent-10", "train-resnet"]
        # by memory, on the agents view too
        await pilot.press("1")
        await pilot.pause(0.1)
        await pilot.press("M")
        assert app.agents_view.sync.keys[:3] == ["agent-10", "agent-1", "agent-2"]
        assert "MEM USE▼" in str(app.agents_view.query_one("#agents-table").columns["mem"].label)


async def type_prompt(pilot, text: str) -> None:
    await until(pilot, lambda: pilot.app.prompt_bar.shown, what="the prompt")
    pilot.app.prompt_bar.input.value = text
    await pilot.press("enter")


async def test_filters_escape_and_enter_on_an_agent() -> None:
    app = Dashboard(FakeClient(), clock=frozen_clock)
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot, app)
        await pilot.press("slash")
        await type_prompt(pilot, "exit:3")
        await pilot.pause(0.1)
        assert shown(app) == ["flaky-job"]
        summary = app.sessions_view.query_one("#sessions-summary")
        assert "filter /exit:3" in plain(summary) and "Esc clears" in plain(summary)
        await pilot.press("escape")  # clears the filter, stays
        assert app.view == "sessions" and len(shown(app)) == len(sessions())

        await pilot.press("slash")
        await type_prompt(pilot, "status:failed")
        assert shown(app) == ["bad-image", "flaky-job", "report-after-flaky"]
        await pilot.press("escape")

        # Enter on an agent: exactly its sessions (agent-10's are not agent-1's), a filter one can see
        await pilot.press("1")
        await pilot.pause(0.1)
        assert app.agents_view.sync.keys[0] == "agent-1"
        await pilot.press("enter")
        await pilot.pause(0.1)
        assert app.view == "sessions"
        assert shown(app) == ["train-resnet", "flaky-job"]
        assert "filter /agent:agent-1" in plain(app.sessions_view.query_one("#sessions-summary"))
        await pilot.press("escape")  # the filter first
        assert app.view == "sessions" and len(shown(app)) == len(sessions())
        await pilot.press("escape")  # then back
        assert app.view == "agents"


async def test_colon_commands() -> None:
    app = Dashboard(FakeClient(), clock=frozen_clock)
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot, app)
        for word, view in (("ag", "agents"), ("po", "sessions"), ("no", "agents"), ("se", "sessions")):
            await pilot.press("colon")
            await type_prompt(pilot, word)
            assert app.view == view, word
        await pilot.press("colon")
        await type_prompt(pilot, "frobnicate")
        await pilot.pause(0.1)
        assert app.view == "sessions"
        assert any("Unknown command :frobnicate" in str(n.message) for n in app._notifications)


async def test_colours_live_figures_and_the_whole_reason() -> None:
    client = FakeClient()
    app = Dashboard(client, clock=frozen_clock)
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot, app)
        flaky, etl = cells_of(app, "flaky-job"), cells_of(app, "etl-nightly")
        assert "red" in str(flaky["status"].style) and "red" in str(flaky["name"].style)
        assert "red" in str(flaky["info"].style)
        assert "grey" in str(etl["status"].style) and "red" not in str(etl["name"].style)
        assert str(flaky["info"]).startswith("exit 3 · ran 47s · ended 11:54")
        # live figures against what the session asked for; "–" without a figure
        train = cells_of(app, "train-resnet")
        assert str(train["cpu"]).endswith("188%") and str(train["mem"]).endswith("3.6G/4G")
        assert str(cells_of(app, "tensorboard")["cpu"]) == "–"
        # a usage event redraws the row
        sid = client.by_name("tensorboard")["id"]
        client.events.put_nowait(("usage", {"sessions": {sid: {"cpuPct": 75.0, "memBytes": 100 * 1024**2}}}))
        await until(pilot, lambda: str(cells_of(app, "tensorboard")["cpu"]).endswith("75%"), what="the usage")
        assert str(cells_of(app, "tensorboard")["mem"]).endswith("100M/1G")
        # a changed row is drawn again: ended with exit 2, it is red, without live figures
        ended = {**client.by_name("tensorboard"), "status": "TERMINATED", "exitCode": 2, "result": "FAILURE"}
        ended.update(statusChanged=FROZEN.isoformat(), terminationTime=FROZEN.isoformat())
        client.events.put_nowait(("sessions", {"items": [ended]}))
        await until(pilot, lambda: "red" in str(cells_of(app, "tensorboard")["status"].style), what="the end")
        assert str(cells_of(app, "tensorboard")["info"]).startswith("exit 2 · ran 1m 0s · ended 12:00")
        assert str(cells_of(app, "tensorboard")["cpu"]) == "–"

        # r: the whole reason of the session under the cursor, under the table; r again hides it
        panel = app.sessions_view.query_one("#sessions-reason")
        assert not panel.display
        await pilot.press("r")
        assert panel.display
        assert "it waits for sessions to end" in plain(panel)  # big-sweep's, cut in the table
        await pilot.press("j")
        await pilot.pause(0.05)
        assert "notebook-ana (RUNNING) to finish" in plain(panel)
        await pilot.press("r")
        assert not panel.display


async def test_the_detail_view_shows_every_figure_live() -> None:
    client = FakeClient()
    app = Dashboard(client, clock=frozen_clock)
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot, app)
        await pilot.press("slash")
        await type_prompt(pilot, "name:train-resnet")
        await pilot.press("enter")
        await until(pilot, lambda: app.detail_view.detail is not None, what="the details")
        body = plain(app.detail_view.query_one("#detail-body"))
        for figure in (
            "188% of 2 cores asked for", "CPU time", "12m 34s", "3.6G of 4G asked for (90%) · peak 3.9G",
            "48M received · 3M sent", "812M read · 97M written", "Processes", "71% busy", "5.2G memory",
            "11:59:58 UTC (2s ago)",
        ):  # fmt: skip
            assert figure in body, figure
        sid = client.by_name("train-resnet")["id"]
        client.events.put_nowait(("usage", {"sessions": {sid: {"cpuPct": 20.0, "memBytes": GIB}}}))
        await until(
            pilot, lambda: "20% of 2 cores" in plain(app.detail_view.query_one("#detail-body")), what="live figures"
        )
        client.events.put_nowait(("usage", {"sessions": {sid: None}}))
        await until(
            pilot, lambda: "no sample yet" in plain(app.detail_view.query_one("#detail-body")), what="no figures"
        )
