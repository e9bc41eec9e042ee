"""Pictures of a cluster session (three kernels on three agents, issue 20) in the detail view at 80×24,
120×40 and 200×60: each kernel's name, agent, status and live CPU and memory come first, so that the
narrowest screen keeps them. The made-up cluster of tests/tui_fake.py with `cluster=True`, a frozen clock.

After a deliberate change: `pytest tests/test_tui_cluster_snapshots.py --snapshot-update`, then look at the
pictures (`bash packaging/snapshots-to-png.sh`) before committing them.
"""

from __future__ import annotations

import pytest
from rich.console import Console

from bai.tui.app import Dashboard
from bai.tui.views import kernels_table
from tests.tui_fake import FakeClient, cluster_session, detail_of
from tests.tui_support import frozen_clock, until

SIZES = [(80, 24), (120, 40), (200, 60)]


def _text(renderable, width: int) -> str:
    console = Console(width=width, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_the_kernels_table_of_a_cluster_session_names_each_kernel() -> None:
    text = _text(kernels_table(detail_of(cluster_session())), 80)
    lines = text.splitlines()
    assert lines[0].startswith("Kernels (3, multi-node)")
    assert lines[1].split()[:5] == ["NAME", "AGENT", "STATUS", "CPU", "MEM"]
    assert lines[2].split()[:5] == ["main1", "agent-1", "RUNNING", "96%", "1.4G"]
    assert lines[3].split()[:5] == ["sub1", "agent-2", "RUNNING", "188%", "2.2G"]
    assert lines[4].split()[:5] == ["sub2", "agent-10", "RUNNING", "–", "–"]


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_detail_of_a_cluster_session(snap_compare, size) -> None:
    app = Dashboard(FakeClient(cluster=True), clock=frozen_clock)

    async def before(pilot) -> None:
        await until(pilot, lambda: len(app.sessions_view.sync.keys) == 12, what="the sessions drawn")
        app.sessions_view.filter = app.sessions_view.filter.parse("name:dist-train")
        app.sessions_view.refresh_view()
        await pilot.press("d")  # which kernel: Enter takes main1, highlighted first
        await until(pilot, lambda: type(app.screen).__name__ == "KernelScreen", what="the kernel picker")
        await pilot.press("enter")
        await until(pilot, lambda: app.detail_view.detail is not None, what="the details")
        await pilot.pause(0.3)
        app.detail_view.query_one("#detail-scroll").scroll_end(animate=False)  # the kernels in view at 80×24
        await pilot.pause(0.2)

    assert snap_compare(app, terminal_size=size, run_before=before)
