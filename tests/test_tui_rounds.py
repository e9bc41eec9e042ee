"""The dashboard's scheduling rounds (superadmins): `:rounds` lists the latest kept, `:replay N` shows a replay (the
decisions then, whether today's scheduler decides the same, what changed since, what would be decided now), and a
bad `:replay` says how to use it; `:fairshare` shows fair share's standings. On the made-up cluster of
tests/tui_fake.py; pictures at 80×24, 120×40, 200×60.

After a deliberate change: `pytest tests/test_tui_rounds.py --snapshot-update`, then look at the pictures
(`bash packaging/snapshots-to-png.sh`) before committing them."""

from __future__ import annotations

import pytest

from bai.tui.app import Dashboard
from bai.tui.modals import FairShareScreen, RoundsScreen
from tests.test_tui_projects import started
from tests.tui_fake import FakeClient
from tests.tui_support import frozen_clock, until

SIZES = [(80, 24), (120, 40), (200, 60)]


async def test_rounds_then_a_replay_and_a_replay_without_a_number() -> None:
    app = Dashboard(FakeClient(), clock=frozen_clock)
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot, app)
        await pilot.press("colon", *"rounds", "enter")
        await until(pilot, lambda: isinstance(app.screen, RoundsScreen), what="the rounds")
        screen = app.screen
        assert isinstance(screen, RoundsScreen) and [r["round"] for r in screen.rounds or []] == [1042, 1041, 1040]
        await pilot.press("escape")
        await pilot.press("colon", *"replay", "enter")
        await pilot.pause(0.2)
        assert not isinstance(app.screen, RoundsScreen)
        assert any("Replay which round?" in str(n.message) for n in app._notifications)
        await pilot.press("colon", *"replay 1040", "enter")
        await until(pilot, lambda: isinstance(app.screen, RoundsScreen), what="the replay")
        assert app.screen.replay is not None and app.screen.replay["round"] == 1040  # type: ignore[attr-defined]


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_replay_dialog(snap_compare, size) -> None:
    """`:replay 1040`: the decisions then, the same again, what changed since, what would be decided now."""
    app = Dashboard(FakeClient(), clock=frozen_clock)

    async def before(pilot) -> None:
        await started(pilot, app)
        await pilot.press("colon", *"replay 1040", "enter")
        await until(pilot, lambda: isinstance(app.screen, RoundsScreen), what="the replay")
        await pilot.pause(0.3)

    assert snap_compare(app, terminal_size=size, run_before=before)


async def test_fair_share_lists_keypairs_and_projects_most_used_first() -> None:
    app = Dashboard(FakeClient(), clock=frozen_clock)
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot, app)
        await pilot.press("colon", *"fairshare", "enter")
        await until(pilot, lambda: isinstance(app.screen, FairShareScreen), what="fair share")
        screen = app.screen
        assert isinstance(screen, FairShareScreen)
        shown = " ".join(str(w.render()) for w in screen.query("Static"))
        assert "halving every 7 days" in shown and "Projects" in shown
        await pilot.press("q")
        await until(pilot, lambda: not isinstance(app.screen, FairShareScreen), what="closed")


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_fair_share_dialog(snap_compare, size) -> None:
    """`:fairshare`: each keypair's usage, part and factor, most used first; the projects below."""
    app = Dashboard(FakeClient(), clock=frozen_clock)

    async def before(pilot) -> None:
        await started(pilot, app)
        await pilot.press("colon", *"fairshare", "enter")
        await until(pilot, lambda: isinstance(app.screen, FairShareScreen), what="fair share")
        await pilot.pause(0.3)

    assert snap_compare(app, terminal_size=size, run_before=before)
