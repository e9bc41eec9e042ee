"""The dashboard's keys as a user types them: every key after `/` goes into the filter (also typed all at
once, as `tmux send-keys` does), keys act on the row highlighted when they are pressed (also right after a
shell), 3 describes the highlighted row, a kernel picker for sessions of several kernels (logs, shell,
describe), the events view (e), the JSON view (y), saving (Ctrl-s) and copying (c) a log, and how a live
session's last run and its queued / running times are shown. On the made-up cluster of tests/tui_fake.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from textual import events
from textual.css.query import NoMatches

from bai.tui.app import Dashboard
from bai.tui.modals import ConfirmScreen, KernelScreen
from bai.tui.views import LogsView
from tests.tui_fake import FakeClient, sessions
from tests.tui_support import frozen_clock, plain, until

SIZE = (120, 40)


async def started(pilot, app: Dashboard, cluster: bool = False) -> None:
    count = len(sessions()) + (1 if cluster else 0)
    await until(pilot, lambda: len(app.sessions_view.sync.keys) == count, what="the sessions drawn")


def cursor_name(app: Dashboard) -> str:
    return app.model.sessions[app.sessions_view.selected()]["name"]


async def move_to(pilot, app: Dashboard, name: str) -> None:
    await pilot.press("g")
    for _ in range(len(app.sessions_view.sync.keys)):
        if cursor_name(app) == name:
            return
        await pilot.press("j")
    raise AssertionError(f"no row {name}")


def type_at_once(app: Dashboard, text: str) -> None:
    """Every key of `text` queued at once, before any is handled (as a terminal sends a pasted burst)."""
    names = {"/": "slash", ":": "colon", " ": "space", "!": "exclamation_mark"}
    for char in text:
        app.post_message(events.Key(names.get(char, char), char))


def notes(app: Dashboard) -> list[str]:
    return [str(n.message) for n in app._notifications]


# -- the filter takes every key typed after / ---------------------------------------------------------


async def test_keys_pressed_right_after_slash_go_into_the_filter() -> None:
    app = Dashboard(FakeClient(), clock=frozen_clock)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app)
        await pilot.press("slash", "n", "b", "o", "o", "k")
        assert app.prompt_bar.shown and app.prompt_bar.input.value == "nbook"
        await pilot.press("escape")
        assert not app.prompt_bar.shown and not app.sessions_view.filter
        # all at once, as `tmux send-keys "/tensorboard"`: none lost
        type_at_once(app, "/tensorboard")
        await until(pilot, lambda: app.prompt_bar.input.value == "tensorboard", what="the typed filter")
        await pilot.press("enter")
        await until(pilot, lambda: len(app.sessions_view.sync.keys) == 1, what="the filtered table")
        assert cursor_name(app) == "tensorboard" and app.focused is app.sessions_view.query_one("DataTable")


async def test_a_colon_typed_in_the_filter_is_text_not_the_command_prompt() -> None:
    app = Dashboard(FakeClient(), clock=frozen_clock)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app)
        type_at_once(app, "/status:running")
        await until(pilot, lambda: app.prompt_bar.input.value == "status:running", what="the typed filter")
        assert app.prompt_bar.prompt == "/"  # the filter, not `:`
        type_at_once(app, "/x")  # in the prompt, `/` is text too
        await until(pilot, lambda: app.prompt_bar.input.value == "status:running/x", what="the slash typed")
        await pilot.press("backspace", "backspace")
        await pilot.press("enter")
        await until(pilot, lambda: len(app.sessions_view.sync.keys) == 4, what="the running sessions")
        assert app.view == "sessions" and app.sessions_view.filter.text == "status:running"


# -- keys act on the highlighted row -------------------------------------------------------------------


async def test_3_describes_the_highlighted_row_and_4_opens_its_logs() -> None:
    app = Dashboard(FakeClient(), clock=frozen_clock)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app)
        await move_to(pilot, app, "notebook-ana")
        await pilot.press("3")
        await until(pilot, lambda: app.detail_view.detail is not None, what="the detail")
        assert app.view == "detail" and app.detail_view.detail["name"] == "notebook-ana"
        assert not any("No session chosen" in n for n in notes(app))
        await pilot.press("2")
        await move_to(pilot, app, "train-resnet")
        await pilot.press("4")
        assert app.view == "logs" and app.logs_view.session_name == "train-resnet"


async def test_after_a_shell_keys_act_on_the_row_highlighted_then() -> None:
    asked: list[tuple[str, str | None]] = []

    async def shell_runner(sid: str, kernel: str | None) -> int:
        asked.append((sid, kernel))
        return 0

    client = FakeClient()
    app = Dashboard(client, clock=frozen_clock, shell_runner=shell_runner)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app)
        await move_to(pilot, app, "train-resnet")
        await pilot.press("s")
        await until(pilot, lambda: bool(asked) and not app.shell_open, what="the shell")
        assert asked == [(client.by_name("train-resnet")["id"], None)]  # one kernel: no picker
        assert any("shell in train-resnet ended with status 0" in n for n in notes(app))
        # straight after: move and act, without a pause
        await pilot.press("j", "ctrl+d")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the question")
        assert "notebook-ana" in app.screen.question
        await pilot.press("n")
        await pilot.press("j", "s")
        await until(pilot, lambda: len(asked) == 2 and not app.shell_open, what="the second shell")
        assert asked[1][0] == client.by_name("lab-agent-10")["id"] == app.sessions_view.selected()


# -- a kernel picker for sessions of several kernels -------------------------------------------------------


async def test_logs_of_a_cluster_session_ask_which_kernel_main1_first() -> None:
    client = FakeClient(cluster=True)
    app = Dashboard(client, clock=frozen_clock)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app, cluster=True)
        await move_to(pilot, app, "dist-train")
        await pilot.press("l")
        await until(pilot, lambda: isinstance(app.screen, KernelScreen), what="the kernel picker")
        picker = app.screen
        options = picker.query_one("OptionList")
        assert [options.get_option_at_index(i).id for i in range(options.option_count)] == ["main1", "sub1", "sub2"]
        assert options.highlighted == 0  # main1
        assert "Logs of which kernel of dist-train?" in plain(picker.query("Static").first())
        await pilot.press("down", "enter")
        await until(pilot, lambda: app.view == "logs", what="the logs")
        sid = client.by_name("dist-train")["id"]
        await until(pilot, lambda: (sid, "sub1") in client.log_streams, what="sub1's stream")
        assert "dist-train · sub1" in plain(app.logs_view.query_one("#logs-status"))
        # Esc in the picker: nothing happens
        await pilot.press("escape")
        await pilot.press("l")
        await until(pilot, lambda: isinstance(app.screen, KernelScreen), what="the picker again")
        await pilot.press("escape")
        assert app.view != "logs" and not isinstance(app.screen, KernelScreen)


async def test_one_kernel_goes_straight_and_shell_and_describe_ask_too() -> None:
    asked: list[tuple[str, str | None]] = []

    async def shell_runner(sid: str, kernel: str | None) -> int:
        asked.append((sid, kernel))
        return 0

    client = FakeClient(cluster=True)
    app = Dashboard(client, clock=frozen_clock, shell_runner=shell_runner)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app, cluster=True)
        await move_to(pilot, app, "train-resnet")
        await pilot.press("l")
        await until(pilot, lambda: app.view == "logs", what="the logs")
        assert (client.by_name("train-resnet")["id"], None) in client.log_streams
        await pilot.press("escape")
        await move_to(pilot, app, "dist-train")
        await pilot.press("s")
        await until(pilot, lambda: isinstance(app.screen, KernelScreen), what="the kernel picker")
        assert "A shell of which kernel" in plain(app.screen.query("Static").first())
        await pilot.press("down", "down", "enter")
        await until(pilot, lambda: bool(asked), what="the shell")
        assert asked == [(client.by_name("dist-train")["id"], "sub2")]
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, KernelScreen), what="the kernel picker")
        await pilot.press("down", "enter")
        await until(pilot, lambda: app.detail_view.detail is not None, what="the detail")
        body = plain(app.detail_view.query_one("#detail-body"))
        assert body.startswith("Kernel") and "sub1" in body.splitlines()[0] and "agent-2" in body


# -- events, JSON, saving and copying a log -------------------------------------------------------------


async def test_e_shows_the_sessions_transitions_then_its_events_as_they_come() -> None:
    client = FakeClient()
    client.events.lifecycle = [("session_started", {"sessionName": "train-resnet", "reason": None})]
    app = Dashboard(client, clock=frozen_clock)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app)
        await move_to(pilot, app, "train-resnet")
        await pilot.press("e")
        assert app.view == "events"
        body = app.events_view.query_one("#events-body")
        await until(pilot, lambda: "session_started" in plain(body), what="the events")
        text = plain(body)
        assert "Events of train-resnet" in text and "PENDING" in text and "RUNNING" in text
        client.events.lifecycle_more.put_nowait(
            ("session_terminated", {"sessionName": "train-resnet", "reason": "user-requested", "exitCode": 0})
        )
        await until(pilot, lambda: "session_terminated" in plain(body), what="a new event")
        assert "user-requested · exit code 0" in plain(body)
        assert client.events.asked == [client.by_name("train-resnet")["id"]]


async def test_y_shows_the_session_as_json() -> None:
    client = FakeClient()
    app = Dashboard(client, clock=frozen_clock)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app)
        await move_to(pilot, app, "etl-nightly")
        await pilot.press("y")
        assert app.view == "json"
        await until(pilot, lambda: app.json_view.data is not None, what="the JSON")
        text = plain(app.json_view.query_one("#json-body"))
        sid = client.by_name("etl-nightly")["id"]
        assert f"GET /session/{sid}" in text and '"startedAt":' in text and '"exitCode": 0' in text
        assert json.loads(app.json_view.text)["kernels"][0]["clusterRole"] == "main"
        await pilot.press("escape")
        assert app.view == "sessions"


def _log_lines(n: int) -> list[tuple[str, dict]]:
    chunks = [[i + 1, f"\x1b[32mline {i}\x1b[0m\n", "2026-11-29T11:59:00+00:00"] for i in range(n)]
    return [("log", {"kernelId": "k", "chunks": chunks})]


async def test_ctrl_s_saves_the_log_never_over_a_file_and_c_copies_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    client = FakeClient()
    sid = client.by_name("train-resnet")["id"]
    client.logs[(sid, None)] = _log_lines(3)
    app = Dashboard(client, clock=frozen_clock)
    copied: list[str] = []
    monkeypatch.setattr(app, "copy_to_clipboard", copied.append)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app)
        await move_to(pilot, app, "train-resnet")
        await pilot.press("l")
        await until(pilot, lambda: len(app.logs_view.buffer.lines) == 3, what="the log")
        await pilot.press("ctrl+s")
        first = tmp_path / "train-resnet-main1.log"
        await until(pilot, lambda: first.exists(), what="the file")
        assert first.read_text() == "line 0\nline 1\nline 2\n"  # without colour codes
        assert any(f"saved 3 lines to {first}" in n for n in notes(app))
        await pilot.press("ctrl+s")
        second = tmp_path / "train-resnet-main1-1.log"
        await until(pilot, lambda: second.exists(), what="the second file")
        assert first.read_text() == second.read_text() and any(str(second) in n for n in notes(app))
        await pilot.press("c")
        assert copied == ["line 0\nline 1\nline 2\n"]
        assert any("copied 3 lines to the clipboard" in n for n in notes(app))


@pytest.mark.parametrize("view", ["sessions", "logs"])
@pytest.mark.parametrize("width", [120, 80])
async def test_the_footer_shows_the_new_keys_where_they_fit(view: str, width: int) -> None:
    """From 100 columns the footer shows e, y (and in the logs Ctrl-s, c); at 80 it keeps the others (the
    keys still work, and ? lists them)."""
    app = Dashboard(FakeClient(), clock=frozen_clock)
    async with app.run_test(size=(width, 30)) as pilot:
        await started(pilot, app)
        if view == "logs":
            await pilot.press("l")
        await pilot.pause(0.1)
        shown = {
            key
            for key, b in app.active_bindings.items()
            if b.binding.show and app.check_action(b.binding.action, ()) is not False
        }
        new = {"e", "y"} if view == "sessions" else {"ctrl+s", "c", "e", "y"}
        assert (new <= shown) == (width >= 100) and not (new & shown and width < 100), shown
        assert {"slash", "question_mark", "q"} <= shown
        await pilot.press("y")
        assert app.view == "json"  # hidden from the footer at 80, the key still works
        await pilot.press("question_mark")
        assert "its JSON, as GET /session/{id} returns it" in plain(app.screen.query("Static").first())


async def test_a_live_session_shows_its_last_run_apart_from_its_fate() -> None:
    app = Dashboard(FakeClient(), clock=frozen_clock)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app)
        sync = app.sessions_view.sync
        sid = next(k for k in sync.keys if app.model.sessions[k]["name"] == "notebook-ana")
        cells = {c.key: cell for c, cell in zip(sync.columns, sync.cells[sid], strict=True)}
        assert str(cells["info"]) == "last run: exit 137" and "red" not in str(getattr(cells["info"], "style", ""))
        assert "red" not in str(cells["status"].style)
        await move_to(pilot, app, "notebook-ana")
        await pilot.press("d")
        await until(pilot, lambda: app.detail_view.detail is not None, what="the detail")
        body = plain(app.detail_view.query_one("#detail-body"))
        assert "Last run" in body and "exit 137 (the session goes on)" in body
        assert "FAILURE" not in body and "Exit code" not in body
        assert "queued 3s, running 29m 57s" in body


async def test_closing_stops_drawings_quietly_but_a_missing_widget_while_running_is_raised() -> None:
    """Closing removes the widgets screen by screen while the timers and stream workers still run (CI once
    saw the log flush find the log view gone as a test ended): a drawing then stops quietly. A widget
    missing while the dashboard runs is a bug, and it is raised."""
    client = FakeClient()
    sid = client.by_name("train-resnet")["id"]
    client.logs[(sid, None)] = _log_lines(3)
    app = Dashboard(client, clock=frozen_clock)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app)
        await move_to(pilot, app, "train-resnet")
        await pilot.press("l")
        await until(pilot, lambda: len(app.logs_view.buffer.lines) == 3, what="the log")
        with pytest.raises(NoMatches):
            app._unless_closing(lambda: app.query_one("#no-such-widget"))
        app._pending_logs.extend(_log_lines(1)[0][1]["chunks"])  # output that arrives as the dashboard closes
    assert not app.is_running and not app.query(LogsView)
    app._unless_closing(lambda: app._flush_logs(force=True))  # the flush timer, firing now: no error
