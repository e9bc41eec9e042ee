"""Pictures of the sessions, agents and detail views with live statistics at 80×24, 120×40 and 200×60
(pytest-textual-snapshot), on the made-up cluster of tests/tui_fake.py with a frozen clock: nothing
changes from run to run.

After a deliberate change of a view: `pytest tests/test_tui_tables_snapshots.py --snapshot-update`, then
look at the pictures (`bash packaging/snapshots-to-png.sh` converts them to PNG) before committing them.
"""

from __future__ import annotations

import pytest

from bai.tui.app import Dashboard
from tests.tui_fake import FakeClient, sessions
from tests.tui_support import frozen_clock, until

SIZES = [(80, 24), (120, 40), (200, 60)]


def dashboard() -> Dashboard:
    return Dashboard(FakeClient(), clock=frozen_clock)


async def _loaded(pilot, app: Dashboard) -> None:
    await until(pilot, lambda: len(app.sessions_view.sync.keys) == len(sessions()), what="the sessions drawn")


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_sessions_with_usage(snap_compare, size) -> None:
    """Pending, running (with and without figures), succeeded, failed and cancelled sessions."""
    app = dashboard()

    async def before(pilot) -> None:
        await _loaded(pilot, app)
        await pilot.pause(0.3)

    assert snap_compare(app, terminal_size=size, run_before=before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_agents_with_usage(snap_compare, size) -> None:
    app = dashboard()

    async def before(pilot) -> None:
        await _loaded(pilot, app)
        await pilot.press("1")
        await pilot.pause(0.3)

    assert snap_compare(app, terminal_size=size, run_before=before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_detail_with_usage(snap_compare, size) -> None:
    """Every live figure of a running session."""
    app = dashboard()

    async def before(pilot) -> None:
        await _loaded(pilot, app)
        app.sessions_view.filter = app.sessions_view.filter.parse("name:train-resnet")
        app.sessions_view.refresh_view()
        await pilot.press("d")
        await until(pilot, lambda: app.detail_view.detail is not None, what="the details")
        await pilot.pause(0.3)

    assert snap_compare(app, terminal_size=size, run_before=before)


def test_sessions_sorted_filtered_with_the_whole_reason(snap_compare) -> None:
    """At 80×24: failed sessions sorted by name (▲ in the header), the filter shown, `r`'s panel."""
    app = dashboard()

    async def before(pilot) -> None:
        await _loaded(pilot, app)
        app.sessions_view.filter = app.sessions_view.filter.parse("status:failed")
        app.sessions_view.refresh_view()
        await pilot.press("N", "j", "r")
        await pilot.pause(0.3)

    assert snap_compare(app, terminal_size=(80, 24), run_before=before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_kernel_picker_of_a_cluster_session(snap_compare, size) -> None:
    """`l` on a session of three kernels: which kernel, main1 highlighted."""
    app = Dashboard(FakeClient(cluster=True), clock=frozen_clock)

    async def before(pilot) -> None:
        await until(pilot, lambda: len(app.sessions_view.sync.keys) == len(sessions()) + 1, what="the sessions")
        app.sessions_view.filter = app.sessions_view.filter.parse("name:dist-train")
        app.sessions_view.refresh_view()
        await pilot.press("l")
        await until(pilot, lambda: type(app.screen).__name__ == "KernelScreen", what="the picker")
        await pilot.pause(0.3)

    assert snap_compare(app, terminal_size=size, run_before=before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_events_view(snap_compare, size) -> None:
    """`e`: the session's transitions, then its lifecycle events."""
    client = FakeClient()
    client.events.lifecycle = [
        ("session_terminated", {"sessionName": "flaky-job", "reason": "task-failed", "exitCode": 3})
    ]
    app = Dashboard(client, clock=frozen_clock)

    async def before(pilot) -> None:
        await _loaded(pilot, app)
        app.sessions_view.filter = app.sessions_view.filter.parse("name:flaky-job")
        app.sessions_view.refresh_view()
        await pilot.press("e")
        await until(pilot, lambda: bool(app.events_view.events), what="the events")
        await pilot.pause(0.3)

    assert snap_compare(app, terminal_size=size, run_before=before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_json_view(snap_compare, size) -> None:
    """`y`: the session as GET /session/{id} returns it."""
    app = dashboard()

    async def before(pilot) -> None:
        await _loaded(pilot, app)
        app.sessions_view.filter = app.sessions_view.filter.parse("name:notebook-ana")
        app.sessions_view.refresh_view()
        await pilot.press("y")
        await until(pilot, lambda: app.json_view.data is not None, what="the JSON")
        await pilot.pause(0.3)

    assert snap_compare(app, terminal_size=size, run_before=before)


def test_filter_prompt_while_typing(snap_compare) -> None:
    """At 80×24: `/` and a filter being typed, the hint above it, over the footer."""
    app = dashboard()

    async def before(pilot) -> None:
        await _loaded(pilot, app)
        await pilot.press("slash", *"status:run")
        await pilot.pause(0.3)

    assert snap_compare(app, terminal_size=(80, 24), run_before=before)
