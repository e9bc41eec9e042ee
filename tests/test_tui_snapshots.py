"""Pictures of every dashboard view at 80×24, 120×40 and 200×60 (pytest-textual-snapshot).

Taken from real nodes: a manager with three simulated agents (the `sim` backend, whose kernels offer
apps) holding running, pending, finished and cancelled sessions, and a local-backend node whose batch
kernel printed a log.
The dashboard runs with a frozen clock, through `StableClient`, which replaces only what changes from
run to run (uuids, access keys, host names, timestamps); see tests/tui_support.py.

After a deliberate change of a view: `pytest tests/test_tui_snapshots.py --snapshot-update`, then look at
the pictures (`bash packaging/snapshots-to-png.sh` converts them to PNG) before committing them.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import pytest

from bai.cli.apps import Forward, app_url, open_forward
from bai.tui.app import Dashboard
from bai.tui.modals import AppsScreen, PresetsScreen
from tests.nodeproc import Cluster, Node
from tests.tui_support import StableClient, frozen_clock, node_client, until

SIZES = [(80, 24), (120, 40), (200, 60)]
# the sim backend's kernels offer these apps (echo servers behind them)
AGENT_CONFIG = 'cpu = "4"\nmem = "8g"\nsim_apps = "jupyterlab:http:8090,tensorboard:http:6006,sshd:tcp:2200"\n'
SESSIONS = 8


@pytest.fixture(scope="module")
def sim_cluster(tmp_path_factory) -> Iterator[Cluster]:
    cluster = Cluster(
        tmp_path_factory.mktemp("snap"),
        "sim",
        agents=3,
        agent_config=AGENT_CONFIG,
        agent_ids=["agent-1", "agent-2", "agent-3"],
    ).start()

    def create(*args: str, check: bool = True) -> None:
        cluster.cli("session", "create", *args, check=check)

    create("--name", "train-resnet", "--cpu", "2", "--mem", "2g", "sim")
    create("--name", "notebook-ana", "--cpu", "1", "--mem", "1g", "sim")
    create("--name", "etl-nightly", "--type", "batch", "--startup-command", "echo done", "--wait", "sim")
    create("--name", "flaky-job", "--type", "batch", "--startup-command", "exit 3", "--wait", "sim", check=False)
    create(
        "--name", "report-after-flaky", "--type", "batch", "--startup-command", "true", "--depends", "flaky-job",
        "--no-wait", "sim",
    )  # fmt: skip
    # every agent busy, none full: big-sweep wants all 4 cores of one (more than any agent has is refused)
    create("--name", "tensorboard", "--cpu", "1", "sim")
    create("--name", "big-sweep", "--cpu", "4", "--no-wait", "sim")
    create(
        "--name", "after-notebook", "--type", "batch", "--startup-command", "true", "--depends", "notebook-ana",
        "--no-wait", "sim",
    )  # fmt: skip
    # resource presets (the :presets dialog): one fits an agent's room now, the other would need a whole agent
    cluster.cli("preset", "add", "small", "--cpu", "1", "--mem", "1g", "--shared-memory", "64m", check=True)
    cluster.cli("preset", "add", "whole-agent", "--cpu", "4", "--mem", "8g", check=True)
    # steady state: the cancelled one is cancelled and both waiting ones have a queue position
    for _ in range(100):
        items = {s["name"]: s for s in cluster.json("session", "ls", "--all")}
        if items.get("report-after-flaky", {}).get("status") == "CANCELLED" and all(
            (items[n].get("statusData") or {}).get("scheduler") for n in ("big-sweep", "after-notebook")
        ):
            break
        time.sleep(0.1)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def log_node(tmp_path_factory) -> Iterator[Node]:
    node = Node(tmp_path_factory.mktemp("snap-logs"), "local").start()
    # short enough to fit 80×24 without scrolling: Textual sometimes draws a scroll bar's thumb from a
    # layout one frame old, which would make the pictures differ while showing the same lines
    script = (
        'echo "loading dataset: 50000 images"; '
        "for e in $(seq 1 15); do "
        'echo "epoch $e/15 loss=0.$((900 - e * 17)) acc=0.$((40 + e)) lr=0.001 gpu_mem=7.31GiB"; done; '
        'echo "WARNING: validation set smaller than expected (4096 < 5000)"; echo "saved checkpoint to /home/work/out"'
    )
    node.cli(
        "session", "create", "--name", "train-log", "--type", "batch", "--startup-command", script, "--wait",
        "python", check=True,
    )  # fmt: skip
    yield node
    node.stop()


class AppsClient(StableClient):
    """StableClient with the calls `f` makes (the ids it gets are the stable ones)."""

    async def apps(self, ref: str) -> list[dict[str, Any]]:
        return await self.real.apps(self.back.get(ref, ref))

    async def start_app(self, ref: str, app: str) -> dict[str, Any]:
        return await self.real.start_app(self.back.get(ref, ref), app)

    async def app_tunnel(self, session_id: str, app: str):
        return await self.real.app_tunnel(self.back.get(session_id, session_id), app)

    async def check_presets(self, group: str | None = None, scaling_group: str | None = None) -> dict[str, Any]:
        return await self.real.check_presets(group, scaling_group)


def dashboard(node) -> Dashboard:
    client = AppsClient(node_client(node))

    async def forwarder(session: dict[str, Any], app: dict[str, Any]) -> Forward:
        """The real forward, on any free port; its URL names the app's own port, as when that is free."""
        forward = await open_forward(client, session, app, "127.0.0.1", 0)
        return dataclasses.replace(forward, url=app_url(app, "127.0.0.1", app["ports"][0]))

    return Dashboard(client, clock=frozen_clock, forwarder=forwarder)


async def _loaded(pilot, app: Dashboard, sessions: int) -> None:
    await until(pilot, lambda: app.connected and len(app.model.sessions) >= sessions, what="the snapshot")
    await until(pilot, lambda: len(app.sessions_view.sync.keys) >= sessions, what="the sessions drawn")


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_sessions_view(snap_compare, sim_cluster: Cluster, size) -> None:
    app = dashboard(sim_cluster)

    async def before(pilot) -> None:
        await _loaded(pilot, app, SESSIONS)
        await pilot.pause(0.5)

    assert snap_compare(app, terminal_size=size, run_before=before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_agents_view(snap_compare, sim_cluster: Cluster, size) -> None:
    app = dashboard(sim_cluster)

    async def before(pilot) -> None:
        await _loaded(pilot, app, SESSIONS)
        await until(pilot, lambda: len(app.model.agents) == 3, what="three agents")
        await pilot.press("1")
        await pilot.pause(0.5)

    assert snap_compare(app, terminal_size=size, run_before=before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_detail_view(snap_compare, sim_cluster: Cluster, size) -> None:
    """A session that waits for another one: its blocking predicate and the scheduler's decisions."""
    app = dashboard(sim_cluster)

    async def before(pilot) -> None:
        await _loaded(pilot, app, SESSIONS)
        app.sessions_view.filter = app.sessions_view.filter.parse("after-notebook")
        app.sessions_view.refresh_view()
        await pilot.press("d")
        await until(pilot, lambda: app.detail_view.detail is not None, what="the details")
        await pilot.pause(0.5)

    assert snap_compare(app, terminal_size=size, run_before=before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_detail_view_with_apps(snap_compare, sim_cluster: Cluster, size) -> None:
    """A running session's apps, one of them forwarded with f (its local URL next to it)."""
    app = dashboard(sim_cluster)

    async def before(pilot) -> None:
        await _loaded(pilot, app, SESSIONS)
        app.sessions_view.filter = app.sessions_view.filter.parse("notebook-ana status:running")
        app.sessions_view.refresh_view()
        await pilot.press("d")
        await until(pilot, lambda: app.detail_view.detail is not None, what="the details")
        await pilot.press("f")
        await until(pilot, lambda: isinstance(app.screen, AppsScreen), what="the apps dialog")
        await pilot.press("enter")  # the first: jupyterlab
        await until(pilot, lambda: len(app.forward_urls) == 1, what="the forward")
        app.clear_notifications()  # the toasts said so; the picture shows the view
        await pilot.pause(0.5)

    assert snap_compare(app, terminal_size=size, run_before=before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_logs_view(snap_compare, log_node: Node, size) -> None:
    app = dashboard(log_node)

    async def before(pilot) -> None:
        await _loaded(pilot, app, 1)
        await pilot.press("l")
        await until(pilot, lambda: app.logs_view.buffer.ended, what="the end of the log")
        await pilot.wait_for_scheduled_animations()
        await pilot.pause(0.5)

    assert snap_compare(app, terminal_size=size, run_before=before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_presets_dialog(snap_compare, sim_cluster: Cluster, size) -> None:
    """`:presets`: each resource preset, whether it would start now, and what the keypair may still take."""
    app = dashboard(sim_cluster)

    async def before(pilot) -> None:
        await _loaded(pilot, app, SESSIONS)
        await pilot.press("colon")
        await pilot.press(*"presets", "enter")
        await until(pilot, lambda: isinstance(app.screen, PresetsScreen), what="the presets dialog")
        await pilot.pause(0.5)

    assert snap_compare(app, terminal_size=size, run_before=before)
