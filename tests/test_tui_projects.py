"""The dashboard and teams: each session's project (a PROJECT column where it fits), `p` and `:project NAME`
to show one project's sessions (as k9s's namespace), and what each project holds against its cap in the
header (`GET /bai/projects`). On the made-up cluster of tests/tui_fake.py: ml-team (capped), data-eng
(capped, nothing held), default (no cap) and vision (no sessions); pictures at 80×24, 120×40, 200×60.

After a deliberate change: `pytest tests/test_tui_projects.py --snapshot-update`, then look at the
pictures (`bash packaging/snapshots-to-png.sh`) before committing them."""

from __future__ import annotations

from typing import Any

import pytest

from bai.client.api import APIError
from bai.tui.app import Dashboard
from bai.tui.header import header_text, project_text, projects_text
from bai.tui.modals import HelpScreen
from tests.tui_fake import FakeClient, projects, sessions
from tests.tui_support import frozen_clock, plain, until

SIZES = [(80, 24), (120, 40), (200, 60)]
QUOTA = {
    "maxConcurrentSessions": 3,
    "concurrentSessions": 2,
    "totalResourceSlots": {"cpu": "8", "mem": str(16 * 2**30)},
    "occupiedSlots": {"cpu": "3", "mem": str(3 * 2**30)},
}
BY_PROJECT = {
    "ml-team": {"big-sweep", "after-notebook", "train-resnet", "notebook-ana"},
    "data-eng": {"etl-nightly", "flaky-job", "report-after-flaky"},
    "default": {"tensorboard", "lab-agent-10", "bad-image", "stopped-by-me"},
    "vision": set(),
}


def project(name: str) -> dict[str, Any]:
    return next(p for p in projects() if p["name"] == name)


# -- the header's figures ----------------------------------------------------------------------------------


def test_a_project_shows_held_against_its_cap_and_what_is_held_of_uncapped_slots() -> None:
    assert project_text(project("ml-team")).plain == "ml-team 0.5/1 fGPU · 3/8 CPU · 5.0 GiB"
    assert project_text(project("default")).plain == "default 1.5 CPU · 1.5 GiB"
    assert project_text(project("data-eng")).plain == "data-eng 0/4 CPU"
    assert project_text(project("vision")).plain == "vision 0/8 GPU"
    idle = {"name": "idle-team", "sessions": 0, "occupied": {}, "cap": {}}
    assert project_text(idle).plain == "idle-team idle"
    full = {"name": "ml", "occupied": {"cuda.device": "8", "cpu": "12"}, "cap": {"cuda.device": "8", "cpu": "16"}}
    assert project_text(full).plain == "ml 8/8 GPU · 12/16 CPU"  # accelerators first
    styles = {str(span.style) for span in project_text(full).spans}
    assert "bold red" in styles and "yellow" in styles  # full, and 3/4 held


def test_the_chosen_project_comes_first_then_those_with_sessions() -> None:
    names = [part.split()[0] for part in projects_text(projects()).plain.split(" │ ")]
    assert names == ["default", "ml-team", "data-eng", "vision"]
    names = [part.split()[0] for part in projects_text(projects(), selected="vision").plain.split(" │ ")]
    assert names == ["vision", "default", "ml-team", "data-eng"]


@pytest.mark.parametrize("width", [60, 78, 118, 198])
def test_the_header_cuts_the_projects_never_the_stale_marker(width: int) -> None:
    for stale in (None, 12.0):
        text = header_text("AKIATESTADMIN0000000", QUOTA, stale, width, projects=projects()).plain
        assert len(text) <= width and "\n" not in text
        assert text.startswith("AKIA…000  sessions 2/3  cpu 3/8  mem 3.0/16 GiB")
        if stale is not None and width >= 78:
            assert text.endswith("⚠ stale 12s — reconnecting")
        if width >= 78 and stale is None:
            assert "│ default 1.5 CPU · 1.5 GiB" in text
        if width >= 198:
            assert "vision 0/8 GPU" in text
        elif stale is None and width >= 78:
            assert text.endswith("…")  # more projects than fit


# -- p and :project ------------------------------------------------------------------------------------------


async def started(pilot, app: Dashboard) -> None:
    await until(pilot, lambda: len(app.sessions_view.sync.keys) == len(sessions()), what="the sessions drawn")
    await until(pilot, lambda: app.query_one("#header").projects is not None, what="the projects")


def shown(app: Dashboard) -> set[str]:
    return {app.model.sessions[k]["name"] for k in app.sessions_view.sync.keys}


def columns(app: Dashboard) -> list[str]:
    return [c.key for c in app.sessions_view.sync.columns]


async def type_prompt(pilot, text: str) -> None:
    await until(pilot, lambda: pilot.app.prompt_bar.shown, what="the prompt")
    pilot.app.prompt_bar.input.value = text
    await pilot.press("enter")
    await pilot.pause(0.1)


async def test_p_shows_one_project_after_the_other_then_all_again() -> None:
    app = Dashboard(FakeClient(), clock=frozen_clock)
    async with app.run_test(size=(200, 60)) as pilot:
        await started(pilot, app)
        everyone = {s["name"] for s in sessions()}
        assert shown(app) == everyone and "project" in columns(app)
        project_cells = {c.key: i for i, c in enumerate(app.sessions_view.sync.columns)}["project"]
        sid = next(k for k, s in app.model.sessions.items() if s["name"] == "train-resnet")
        assert app.sessions_view.sync.cells[sid][project_cells] == "ml-team"
        header = app.query_one("#header")
        for name in ("data-eng", "default", "ml-team", "vision"):  # those of the sessions and of /bai/projects
            await pilot.press("p")
            await pilot.pause(0.1)
            assert app.sessions_view.project == name
            assert shown(app) == BY_PROJECT[name], name
            assert "project" not in columns(app) and "id" in columns(app)  # the summary names it
            summary = plain(app.sessions_view.query_one("#sessions-summary"))
            assert summary.startswith(f"Sessions of {name} ")
            assert plain(header).split("│ ")[1].startswith(name)  # first in the header
        counts = plain(app.sessions_view.query_one("#sessions-summary"))
        assert "0 pending · 0 running · 0 finished" in counts
        await pilot.press("p")  # back to all
        await pilot.pause(0.1)
        assert app.sessions_view.project is None and shown(app) == everyone and "project" in columns(app)
        assert plain(app.sessions_view.query_one("#sessions-summary")).startswith("Sessions 2 pending")

        # with the / filter: both apply; Esc clears the filter, not the project
        await pilot.press("p", "p", "p")  # ml-team
        await pilot.pause(0.1)
        await pilot.press("slash")
        await type_prompt(pilot, "status:running")
        assert shown(app) == {"train-resnet", "notebook-ana"}
        await pilot.press("escape")
        await pilot.pause(0.1)
        assert app.sessions_view.project == "ml-team" and shown(app) == BY_PROJECT["ml-team"]


async def test_colon_project_picks_one_and_the_filter_knows_projects() -> None:
    app = Dashboard(FakeClient(), clock=frozen_clock)
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot, app)
        await pilot.press("1")  # from another view: the sessions of that project
        await pilot.press("colon")
        await type_prompt(pilot, "project ML-Team")
        assert app.view == "sessions" and app.sessions_view.project == "ml-team"
        assert shown(app) == BY_PROJECT["ml-team"]
        await pilot.press("colon")
        await type_prompt(pilot, "pj nope")
        assert app.sessions_view.project == "ml-team"
        assert any("No project nope" in str(n.message) for n in app._notifications)
        await pilot.press("colon")
        await type_prompt(pilot, "project all")
        assert app.sessions_view.project is None and len(shown(app)) == len(sessions())
        await pilot.press("slash")
        await type_prompt(pilot, "project:data-eng")
        assert shown(app) == BY_PROJECT["data-eng"]
        await pilot.press("slash")
        await type_prompt(pilot, "!project:data-eng")  # (a leading ! inverts the whole filter)
        assert shown(app) == BY_PROJECT["ml-team"] | BY_PROJECT["default"]


@pytest.mark.parametrize("width", [120, 80])
async def test_p_is_in_the_footer_where_it_fits_and_in_the_help(width: int) -> None:
    app = Dashboard(FakeClient(), clock=frozen_clock)
    async with app.run_test(size=(width, 30)) as pilot:
        await started(pilot, app)
        footer = {
            k for k, b in app.active_bindings.items() if b.binding.show and app.check_action(b.binding.action, ())
        }
        assert ("p" in footer) == (width >= 100)
        await pilot.press("1")
        assert app.check_action("project", ()) is False  # the agents view has no projects
        await pilot.press("2", "question_mark")
        assert isinstance(app.screen, HelpScreen)
        text = plain(app.screen.query("Static").first())
        assert "only the next project's sessions" in text and ":project NAME" in text


class NoTeams(FakeClient):
    """A manager without teams: `GET /bai/projects` is not found."""

    async def projects(self, domain: str | None = None) -> list[dict[str, Any]]:
        self.projects_asked += 1
        raise APIError(404, "Not Found", "no route")


async def test_a_manager_without_projects_leaves_the_header_as_it_was() -> None:
    client = NoTeams()
    app = Dashboard(client, clock=frozen_clock)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.query_one("#header").quota is not None, what="the quota")
        header = app.query_one("#header")
        await until(pilot, lambda: not header.projects_supported, what="the 404")
        assert "│" not in plain(header) and "sessions 2/3" in plain(header)
        header.refresh_quota()
        await pilot.pause(0.2)
        assert client.projects_asked == 1  # not asked again
        await pilot.press("p")  # the projects of the sessions still
        await pilot.pause(0.1)
        assert app.sessions_view.project == "data-eng"


async def test_the_projects_are_fetched_with_the_quota_not_more_often() -> None:
    client = FakeClient()
    app = Dashboard(client, clock=frozen_clock)
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot, app)
        asked = client.projects_asked
        for _ in range(3):  # sessions change: at most once a second
            client.events.put_nowait(("sessions", {"items": [dict(client.by_name("tensorboard"))]}))
            await pilot.pause(0.2)
        assert client.projects_asked <= asked + 1


# -- pictures ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_sessions_of_one_project(snap_compare, size) -> None:
    """`p` three times: ml-team's sessions, named in the summary, first and lit in the header."""
    app = Dashboard(FakeClient(), clock=frozen_clock)

    async def before(pilot) -> None:
        await started(pilot, app)
        await pilot.press("p", "p", "p")
        await until(pilot, lambda: len(app.sessions_view.sync.keys) == 4, what="ml-team's sessions")
        await pilot.pause(0.3)

    assert snap_compare(app, terminal_size=size, run_before=before)
