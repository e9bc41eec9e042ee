"""`bai tui` driven with Textual's pilot against real nodes: navigation, filters, terminate, shells, apps
forwarded to local ports, reconnect, logs."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from bai.tui.app import Dashboard
from bai.tui.modals import AppsScreen, ConfirmScreen, HelpScreen
from tests.nodeproc import ROOT, Node
from tests.tui_support import node_client, plain, until

SIZE = (120, 40)
# the sim backend's apps: echo servers, and one that fails to start saying "boom" (see tests/test_apps_sim.py)
APPS = 'sim_apps = "echo:tcp:7000,web:http:8080,broken:tcp:7001"\n'


@pytest.fixture(scope="module")
def sim_node(tmp_path_factory) -> Iterator[Node]:
    node = Node(tmp_path_factory.mktemp("tui"), "sim", agent_config='cpu = "4"\nmem = "8g"\n' + APPS).start()
    node.cli("session", "create", "--name", "nav-running", "--cpu", "1", "sim", check=True)
    # all 4 cores while nav-running holds one: it waits (more than the agent has would be refused)
    node.cli("session", "create", "--name", "nav-waiting", "--cpu", "4", "--no-wait", "sim", check=True)
    node.cli(
        "session", "create", "--name", "nav-done", "--type", "batch", "--startup-command", "exit 3", "--wait", "sim"
    )  # fmt: skip
    yield node
    node.stop()


def shown_names(app: Dashboard) -> list[str]:
    return [app.model.sessions[key]["name"] for key in app.sessions_view.sync.keys]


async def type_prompt(pilot, text: str) -> None:
    await until(pilot, lambda: pilot.app.prompt_bar.shown, what="the prompt")
    pilot.app.prompt_bar.input.value = text
    await pilot.press("enter")


async def test_views_and_keys(sim_node: Node) -> None:
    app = Dashboard(node_client(sim_node))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.connected and len(app.model.sessions) >= 3, what="the snapshot")
        await pilot.pause(0.3)
        assert app.view == "sessions"
        names = shown_names(app)
        # pending first (with its queue position and reason), then running, then finished
        assert names.index("nav-waiting") < names.index("nav-running") < names.index("nav-done")
        table = app.sessions_view.sync
        waiting = next(k for k in table.keys if app.model.sessions[k]["name"] == "nav-waiting")
        cells = [str(c) for c in table.cells[waiting]]
        reason = app.model.sessions[waiting]["reason"]  # in the table in words, without the status slug
        assert reason.startswith("no-available-instances: ") and "queue #1" in cells
        assert reason.partition(": ")[2] in cells
        done = next(k for k in table.keys if app.model.sessions[k]["name"] == "nav-done")
        assert any(str(c).startswith("exit 3") for c in table.cells[done])

        await pilot.press("1")
        assert app.view == "agents"
        await pilot.pause(0.3)
        assert app.agents_view.sync.keys == [sim_node.agent_id]
        assert "1/1 agents alive" in plain(app.agents_view.query_one("#agents-total"))

        await pilot.press("colon")
        await type_prompt(pilot, "sessions")
        assert app.view == "sessions"
        await pilot.press("escape")  # back to where we came from
        assert app.view == "agents"
        await pilot.press("escape")
        assert app.view == "sessions"

        # describe the running one: detail with its kernel and history
        app.sessions_view.filter = app.sessions_view.filter.parse("nav-running")
        app.sessions_view.refresh_view()
        await pilot.press("d")
        assert app.view == "detail"
        await until(pilot, lambda: app.detail_view.detail is not None, what="the session's details")
        body = plain(app.detail_view.query_one("#detail-body"))
        assert "nav-running" in body and "Kernels" in body and "Status history" in body
        assert "Scheduler decisions" in body and "placed on" in body

        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)

        await pilot.press("l")
        assert app.view == "logs" and app.logs_view.session_name == "nav-running"
        await pilot.press("escape")
        assert app.view == "detail"
        await pilot.press("q")
    assert app.return_code in (0, None)


async def test_filter_sessions_by_status_owner_and_words(sim_node: Node) -> None:
    app = Dashboard(node_client(sim_node))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.connected and len(app.model.sessions) >= 3, what="the snapshot")
        await pilot.press("slash")
        await type_prompt(pilot, "status:pending")
        await pilot.pause(0.3)
        assert shown_names(app) == ["nav-waiting"]
        assert "filter /status:pending" in plain(app.sessions_view.query_one("#sessions-summary"))
        await pilot.press("slash")
        await type_prompt(pilot, "!status:pending nav")
        await pilot.pause(0.3)
        assert "nav-waiting" not in shown_names(app) and "nav-running" in shown_names(app)
        await pilot.press("slash")
        await type_prompt(pilot, "owner:AKIANOBODY")
        await pilot.pause(0.3)
        assert shown_names(app) == []
        await pilot.press("slash")
        await type_prompt(pilot, "")
        await pilot.pause(0.3)
        assert {"nav-waiting", "nav-running", "nav-done"} <= set(shown_names(app))


async def test_terminate_asks_first(sim_node: Node) -> None:
    sim_node.cli("session", "create", "--name", "to-terminate", "sim", check=True)
    app = Dashboard(node_client(sim_node))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: any(s["name"] == "to-terminate" for s in app.model.sessions.values()))
        await pilot.press("slash")
        await type_prompt(pilot, "to-terminate")
        await pilot.pause(0.3)
        assert shown_names(app) == ["to-terminate"]

        await pilot.press("ctrl+d")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")
        assert not isinstance(app.screen, ConfirmScreen)
        await pilot.pause(0.5)
        assert sim_node.json("session", "info", "to-terminate")["status"] == "RUNNING"

        await pilot.press("ctrl+d")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("y")
        sid = next(k for k, s in app.model.sessions.items() if s["name"] == "to-terminate")
        await until(pilot, lambda: app.model.sessions[sid]["status"] == "TERMINATED", what="TERMINATED")
        assert sim_node.json("session", "info", sid)["status"] == "TERMINATED"
        # an ended session cannot be terminated again: the key does nothing
        await pilot.pause(0.3)
        assert app.check_action("terminate", ()) is None
        await pilot.press("ctrl+d")
        assert not isinstance(app.screen, ConfirmScreen)


async def test_read_only_hides_actions(sim_node: Node) -> None:
    app = Dashboard(node_client(sim_node), read_only=True)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.connected and len(app.model.sessions) >= 3, what="the snapshot")
        await pilot.press("slash")
        await type_prompt(pilot, "nav-running")
        await pilot.pause(0.3)
        assert app.check_action("terminate", ()) is False
        await pilot.press("ctrl+d")
        assert not isinstance(app.screen, ConfirmScreen)
        assert "read-only" in plain(app.query_one("#topbar"))
        footer_keys = {b.binding.action for b in app.active_bindings.values() if b.enabled and b.binding.show}
        assert "terminate" not in footer_keys and "describe" in footer_keys
        assert "forward" not in footer_keys and "shell" not in footer_keys
    assert sim_node.json("session", "info", "nav-running")["status"] == "RUNNING"


def notes(app: Dashboard) -> list[str]:
    return [str(n.message) for n in app._notifications]


async def test_shell_key_opens_a_shell_in_a_running_session(sim_node: Node) -> None:
    calls: list[str] = []

    async def shell_runner(session_id: str, kernel: str | None) -> int:
        calls.append(session_id)
        return 7

    app = Dashboard(node_client(sim_node), shell_runner=shell_runner)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.connected and len(app.model.sessions) >= 3, what="the snapshot")
        ids = {s["name"]: k for k, s in app.model.sessions.items()}
        footer_keys = {b.binding.action for b in app.screen.active_bindings.values() if b.enabled}
        assert "shell" in footer_keys

        # a pending session: no shell, and the dashboard says why
        await pilot.press("slash")
        await type_prompt(pilot, "nav-waiting")
        await pilot.pause(0.3)
        assert shown_names(app) == ["nav-waiting"]
        await pilot.press("s")
        await until(pilot, lambda: any("nav-waiting" in n and "PENDING" in n for n in notes(app)), what="why not")
        assert calls == []

        # a running one: the runner gets its id, and its exit status is shown when it ends
        await pilot.press("slash")
        await type_prompt(pilot, "nav-running")
        await pilot.pause(0.3)
        assert shown_names(app) == ["nav-running"]
        await pilot.press("s")
        await until(pilot, lambda: "shell in nav-running ended with status 7" in notes(app), what="the note")
        assert calls == [ids["nav-running"]]
        assert not app.shell_open

        # the dashboard is usable afterwards; `s` works in the describe view too
        await pilot.press("d")
        assert app.view == "detail" and app.detail_view.session_id == ids["nav-running"]
        await pilot.press("s")
        await until(pilot, lambda: len(calls) == 2, what="the second shell")
        assert calls == [ids["nav-running"]] * 2
        await pilot.press("escape")
        assert app.view == "sessions"
        await pilot.press("1")
        assert app.view == "agents"
        await pilot.press("s")  # not a key of the agents view
        await pilot.pause(0.2)
        assert len(calls) == 2


async def test_shell_runner_failure_and_read_only(sim_node: Node) -> None:
    from bai.client.api import APIError

    async def refused(session_id: str, kernel: str | None) -> int:
        raise APIError(409, "no terminal here")

    app = Dashboard(node_client(sim_node), shell_runner=refused)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.connected and len(app.model.sessions) >= 3, what="the snapshot")
        await pilot.press("slash")
        await type_prompt(pilot, "nav-running")
        await pilot.pause(0.3)
        await pilot.press("s")
        await until(pilot, lambda: any("Could not open a shell in nav-running" in n for n in notes(app)))
        assert not app.shell_open and app.is_running

    calls: list[str] = []

    async def runner(session_id: str, kernel: str | None) -> int:
        calls.append(session_id)
        return 0

    app = Dashboard(node_client(sim_node), read_only=True, shell_runner=runner)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.connected and len(app.model.sessions) >= 3, what="the snapshot")
        await pilot.press("slash")
        await type_prompt(pilot, "nav-running")
        await pilot.pause(0.3)
        footer_keys = {b.binding.action for b in app.screen.active_bindings.values() if b.enabled}
        assert "shell" not in footer_keys
        await pilot.press("s")
        await pilot.press("d")
        await pilot.press("s")
        await pilot.pause(0.3)
        assert calls == []


async def test_shell_without_a_suspendable_terminal(sim_node: Node) -> None:
    """The default runner suspends the app; headless it cannot, and says so instead of failing."""
    app = Dashboard(node_client(sim_node))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.connected and len(app.model.sessions) >= 3, what="the snapshot")
        await pilot.press("slash")
        await type_prompt(pilot, "nav-running")
        await pilot.pause(0.3)
        await pilot.press("s")
        await until(pilot, lambda: any("cannot give way to a shell" in n for n in notes(app)), what="the note")
        assert not app.shell_open
        await pilot.press("d")
        assert app.view == "detail"


async def echoed(port: int, payload: bytes, timeout: float = 20) -> bytes:
    """Send payload to 127.0.0.1:port (a forward in the dashboard's loop: this test's loop) and read as
    many bytes back."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(payload)
        await writer.drain()
        got = b""
        async with asyncio.timeout(timeout):
            while len(got) < len(payload):
                chunk = await reader.read(1 << 16)
                if not chunk:
                    break
                got += chunk
        return got
    finally:
        writer.close()


async def refused(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return True
    writer.close()
    return False


async def choose(pilot, app_name: str) -> AppsScreen:
    """In the apps dialog (f), choose an app by its name."""
    await until(pilot, lambda: isinstance(pilot.app.screen, AppsScreen), what="the apps dialog")
    screen = pilot.app.screen
    options = screen.query_one("OptionList")
    names = [options.get_option_at_index(i).id for i in range(options.option_count)]
    options.highlighted = names.index(app_name)
    await pilot.press("enter")
    await until(pilot, lambda: not isinstance(pilot.app.screen, AppsScreen), what="the dialog closed")
    return screen


def url_port(note: str) -> int:
    match = re.search(r"://127\.0\.0\.1:(\d+)", note)
    assert match, note
    return int(match.group(1))


async def test_forward_key_lists_the_apps_and_forwards_one(sim_node: Node) -> None:
    """f on a running session: its apps in a dialog; echo is forwarded to a local port in the dashboard's
    loop (bytes come back through the manager), shown in the describe view, not forwarded twice; broken
    says why it did not start; the listener closes with the dashboard."""
    app = Dashboard(node_client(sim_node))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.connected and len(app.model.sessions) >= 3, what="the snapshot")
        await pilot.press("slash")
        await type_prompt(pilot, "nav-running")
        await pilot.pause(0.3)
        footer_keys = {b.binding.action for b in app.screen.active_bindings.values() if b.enabled and b.binding.show}
        assert "forward" in footer_keys

        await pilot.press("f")
        await until(pilot, lambda: isinstance(app.screen, AppsScreen), what="the apps dialog")
        dialog = app.screen
        assert [a["name"] for a in dialog.apps] == ["echo", "web", "broken"]
        await pilot.press("escape")  # cancelled: nothing forwarded
        await pilot.pause(0.2)
        assert not isinstance(app.screen, AppsScreen) and app.forwards == {}

        await pilot.press("f")
        await choose(pilot, "echo")
        await until(pilot, lambda: any(n.startswith("echo: tcp://127.0.0.1:") for n in notes(app)), what="the URL")
        assert "starting echo…" in notes(app)
        url = next(n for n in notes(app) if n.startswith("echo: "))[len("echo: ") :]
        port = url_port(url)
        assert await echoed(port, b"hello through the dashboard") == b"hello through the dashboard"
        big = bytes(range(256)) * 4096  # 1 MiB
        assert await echoed(port, big) == big

        # the describe view shows the apps, and where echo is forwarded
        await pilot.press("d")
        await until(pilot, lambda: app.detail_view.detail is not None, what="the session's details")
        body = plain(app.detail_view.query_one("#detail-body"))
        assert re.search(rf"Apps\s+echo\s+tcp 7000\s+→ {re.escape(url)}", body), body
        assert re.search(r"\n\s+web\s+http 8080\s*\n", body) and "broken  tcp 7001" in body

        # f in the describe view: the dialog says echo is forwarded; choosing it again shows the URL
        await pilot.press("f")
        dialog = await choose(pilot, "echo")
        assert dialog.forwarded == {"echo": url}
        await until(pilot, lambda: notes(app).count(f"echo: {url}") == 2, what="the URL again")
        assert list(app.forwards) == [(app.detail_view.session_id, "echo")]

        # an app that fails to start: its error and output, as an error
        await pilot.press("f")
        await choose(pilot, "broken")
        await until(pilot, lambda: any("broken did not start" in n for n in notes(app)), what="the failure")
        failure = next(n for n in app._notifications if "broken did not start" in str(n.message))
        assert "boom" in str(failure.message) and failure.severity == "error"
        assert len(app.forwards) == 1
        await pilot.press("q")
    assert await refused(port), "the forward closes with the dashboard"


async def test_forward_refused_without_a_running_session_or_apps_and_read_only(sim_node: Node) -> None:
    calls: list[str] = []

    async def forwarder(session, app_item):
        calls.append(app_item["name"])
        raise AssertionError("not to be called")

    client = node_client(sim_node)
    app = Dashboard(client, forwarder=forwarder)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.connected and len(app.model.sessions) >= 3, what="the snapshot")
        for name, status in (("nav-waiting", "PENDING"), ("nav-done", "TERMINATED")):
            await pilot.press("slash")
            await type_prompt(pilot, name)
            await pilot.pause(0.3)
            assert shown_names(app) == [name]
            await pilot.press("f")
            why = f"No apps of {name}: it is {status}"
            await until(pilot, lambda why=why: any(why in n for n in notes(app)), what=why)
            assert not isinstance(app.screen, AppsScreen)

        async def no_apps(ref: str) -> list:
            return []

        client.apps = no_apps  # an image without apps
        await pilot.press("slash")
        await type_prompt(pilot, "nav-running")
        await pilot.pause(0.3)
        await pilot.press("f")
        await until(pilot, lambda: "session nav-running offers no apps" in notes(app), what="no apps")
        assert not isinstance(app.screen, AppsScreen)
        await pilot.press("1")
        await pilot.press("f")  # not a key of the agents view
        await pilot.pause(0.2)
        assert not isinstance(app.screen, AppsScreen)

    app = Dashboard(node_client(sim_node), read_only=True, forwarder=forwarder)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.connected and len(app.model.sessions) >= 3, what="the snapshot")
        await pilot.press("slash")
        await type_prompt(pilot, "nav-running")
        await pilot.pause(0.3)
        footer_keys = {b.binding.action for b in app.screen.active_bindings.values() if b.enabled}
        assert "forward" not in footer_keys
        await pilot.press("f")
        await pilot.press("d")
        await until(pilot, lambda: app.detail_view.detail is not None, what="the session's details")
        await pilot.press("f")
        await pilot.pause(0.3)
        assert not isinstance(app.screen, AppsScreen) and calls == []
        app.choose_app(app.detail_view.session_id)  # and the app refuses, should a view ask anyway
        await until(pilot, lambda: "Read-only dashboard: no apps forwarded." in notes(app), what="the refusal")
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        assert "forward an app" not in plain(app.screen.query("Static").first())


async def test_a_forward_closes_when_its_session_ends(sim_node: Node) -> None:
    """The injected forwarder (here the default one on any free port, counted); the session ends: the
    listener closes and a note says why; the help lists f."""
    from bai.cli.apps import open_forward

    await asyncio.to_thread(sim_node.cli, "session", "create", "--name", "fwd-ends", "sim", check=True)
    client = node_client(sim_node)
    calls: list[str] = []

    async def forwarder(session, app_item):
        calls.append(app_item["name"])
        return await open_forward(client, session, app_item, "127.0.0.1", 0)

    app = Dashboard(client, forwarder=forwarder)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: any(s["name"] == "fwd-ends" for s in app.model.sessions.values()))
        await pilot.press("question_mark")
        assert "forward an app" in plain(app.screen.query("Static").first())
        await pilot.press("escape")
        await pilot.press("slash")
        await type_prompt(pilot, "fwd-ends")
        await pilot.pause(0.3)
        await pilot.press("f")
        await choose(pilot, "web")
        await until(pilot, lambda: any(n.startswith("web: http://127.0.0.1:") for n in notes(app)), what="the URL")
        note = next(n for n in notes(app) if n.startswith("web: "))
        token = note.rpartition("/?token=")[2]
        assert len(token) == 32, note  # an http app: its URL template, with the listener's token
        port = url_port(note)
        request = f"GET /?token={token} HTTP/1.0\r\n\r\n".encode()
        assert await echoed(port, request) == request
        await pilot.press("f")
        await choose(pilot, "web")
        await until(pilot, lambda: notes(app).count(note) == 2, what="the URL again")
        assert calls == ["web"]

        await asyncio.to_thread(sim_node.cli, "session", "destroy", "fwd-ends", check=True)
        await until(
            pilot,
            lambda: any("closed: session fwd-ends ended" in n for n in notes(app)),
            timeout=20,
            what="the note that the forward closed",
        )
        assert app.forwards == {} and app.forward_urls == {}
        assert await refused(port)


async def test_reconnects_when_the_manager_restarts(tmp_path) -> None:
    node = Node(tmp_path / "restart", "sim").start()
    try:
        app = Dashboard(node_client(node))
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.connected, what="connected")
            assert app.snapshots == 1
            node.stop()
            await until(pilot, lambda: not app.connected, what="the loss of the connection")
            await pilot.pause(0.3)
            assert "disconnected" in plain(app.query_one("#topbar"))
            node.start()
            node.cli("session", "create", "--name", "after-restart", "sim", check=True)
            await until(pilot, lambda: app.connected and app.snapshots == 2, timeout=20, what="reconnection")
            await until(pilot, lambda: any(s["name"] == "after-restart" for s in app.model.sessions.values()))
            assert "● connected" in plain(app.query_one("#topbar"))
    finally:
        node.stop()


@pytest.fixture(scope="module")
def local_node(tmp_path_factory) -> Iterator[Node]:
    node = Node(tmp_path_factory.mktemp("tui-local"), "local").start()
    yield node
    node.stop()


async def test_logs_follow_pause_filter_and_bound(local_node: Node) -> None:
    # a kernel printing about 200 numbered lines a second, and a few longer ones, until stopped
    script = 'i=0; while :; do echo "line $i"; i=$((i+1)); [ $((i % 50)) = 0 ] && sleep 0.25; done'
    local_node.cli(
        "session", "create", "--name", "chatty", "--type", "batch", "--startup-command", script, "python", check=True
    )  # fmt: skip
    app = Dashboard(node_client(local_node), max_log_lines=300)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: any(s["name"] == "chatty" for s in app.model.sessions.values()))
        await pilot.press("slash")
        await type_prompt(pilot, "chatty")
        await pilot.pause(0.3)
        await pilot.press("l")
        view = app.logs_view
        log = view.log_view
        await until(pilot, lambda: view.buffer.next_index > 400, what="400 lines")
        assert len(view.buffer.lines) <= 300, "the buffer keeps only the last lines"
        assert log.following and log.scroll_y == log.max_scroll_y

        await pilot.press("g")  # to the top: following stops, new lines are counted
        assert not log.following and log.scroll_y == 0
        await until(pilot, lambda: log.new_while_paused > 0, what="lines counted while paused")
        await pilot.pause(0.2)
        assert "PAUSED" in plain(view.query_one("#logs-status"))
        await pilot.press("G")
        assert log.following
        await pilot.pause(0.3)
        assert log.scroll_y == log.max_scroll_y

        await pilot.press("pageup")  # scrolling up pauses too
        assert not log.following

        await pilot.press("slash")
        await type_prompt(pilot, "line 7")
        await pilot.pause(0.3)
        assert log.rows and all("line" in text and "7" in text for _, text in log.rows)  # every word occurs
        assert len(log.rows) < len(view.buffer.lines)
        await pilot.press("slash")
        await type_prompt(pilot, "!7")
        await pilot.pause(0.3)
        assert log.rows and all("7" not in text for _, text in log.rows)
        await pilot.press("slash")
        await type_prompt(pilot, "")

        await pilot.press("t")
        await pilot.pause(0.2)
        assert log.timestamps and all(text[2] == ":" and text[5] == ":" for _, text in log.rows[-20:])
        await pilot.press("t")
        await pilot.press("w")
        assert log.wrap_lines
    local_node.cli("session", "destroy", "chatty", check=True)


def need_tmux() -> None:
    """tmux drives the real terminal; CI installs it (a missing one fails there, as Docker does)."""
    if shutil.which("tmux") is None:
        reason = "tmux is not installed (apt-get install tmux)"
        if os.environ.get("BAI_REQUIRE_DOCKER") == "1":
            pytest.fail(reason)
        pytest.skip(reason)


def test_cli_starts_the_dashboard_and_quits_on_q(sim_node: Node) -> None:
    """`bai tui` in a real terminal (tmux): it draws, shows the connection, and q ends it."""
    need_tmux()
    name = f"bai-tui-{sim_node.port}"
    env_args = [f"{k}={v}" for k, v in sim_node.env.items() if k.startswith(("XDG_", "BAI_"))]
    cmd = ["env", *env_args, sys.executable, "-m", "bai", "tui", "--read-only"]
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", name, "-x", "100", "-y", "30", "-c", str(ROOT), *cmd], check=True
    )
    try:
        deadline = time.monotonic() + 20
        screen = ""
        while time.monotonic() < deadline:
            screen = subprocess.run(["tmux", "capture-pane", "-p", "-t", name], capture_output=True, text=True).stdout
            if "connected" in screen and "nav-running" in screen:
                break
            time.sleep(0.2)
        assert "● connected" in screen and "nav-running" in screen, screen
        subprocess.run(["tmux", "send-keys", "-t", name, "q"], check=True)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if subprocess.run(["tmux", "has-session", "-t", name], capture_output=True).returncode != 0:
                break
            time.sleep(0.2)
        else:
            raise AssertionError("bai tui did not quit on q")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)


def test_cli_shell_key_gives_the_terminal_to_a_shell_and_takes_it_back(local_node: Node) -> None:
    """`s` in `bai tui` in a real terminal (tmux): the dashboard gives way to the session's shell (at the
    terminal's size), and comes back with the shell's exit status when it ends; right after, keys typed
    at once after `/` all go into the filter, and Ctrl-d acts on the row highlighted then."""
    need_tmux()
    local_node.cli("session", "create", "--name", "shelly", "python", check=True)
    local_node.cli("session", "create", "--name", "other-one", "python", check=True)
    name = f"bai-tui-shell-{local_node.port}"
    env_args = [f"{k}={v}" for k, v in local_node.env.items() if k.startswith(("XDG_", "BAI_"))]
    cmd = ["env", *env_args, sys.executable, "-m", "bai", "tui"]
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", name, "-x", "100", "-y", "30", "-c", str(ROOT), *cmd], check=True
    )

    def screen() -> str:
        return subprocess.run(["tmux", "capture-pane", "-p", "-t", name], capture_output=True, text=True).stdout

    def wait(check, what: str, timeout: float = 20) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            shown = screen()
            if check(shown):
                return shown
            time.sleep(0.2)
        raise AssertionError(f"{what} not shown; the terminal shows:\n{screen()}")

    def keys(*words: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", name, *words], check=True)

    try:
        wait(lambda s: "● connected" in s and "shelly" in s and "RUNNING" in s, "the running session")
        keys("s")
        wait(lambda s: "● connected" not in s and s.strip(), "the shell")
        time.sleep(0.5)
        keys("echo hi-$((40+2)); stty size", "Enter")
        wait(lambda s: "hi-42" in s and "30 100" in s, "the shell's output")
        keys("exit 5", "Enter")
        # back: the dashboard redraws (the note on the status is checked by the pilot test above; a toast
        # may be gone by the time a loaded machine captures the pane)
        wait(lambda s: "● connected" in s and "shelly" in s and "hi-42" not in s, "the dashboard")
        keys("/name:other-one")  # one burst, as typed by a fast hand: every key goes into the filter
        wait(lambda s: "name:other-one" in s, "the typed filter")
        keys("Enter")
        wait(lambda s: "filter /name:other-one" in s and "shelly" not in s, "the filtered table")
        keys("C-d")
        wait(lambda s: "Terminate session other-one" in s, "the question about the highlighted row")
        keys("n", "Escape")
        wait(lambda s: "shelly" in s and "filter /" not in s, "the whole table")
        keys("g")
        keys("d")
        wait(lambda s: "Kernels" in s, "the describe view")
        keys("q")
        deadline = time.monotonic() + 10
        while subprocess.run(["tmux", "has-session", "-t", name], capture_output=True).returncode == 0:
            if time.monotonic() > deadline:
                raise AssertionError("bai tui did not quit on q")
            time.sleep(0.2)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)
        local_node.cli("session", "destroy", "shelly")
        local_node.cli("session", "destroy", "other-one")
