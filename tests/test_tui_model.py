"""The dashboard's pure parts: filters, the cluster model's order and totals, the bounded log buffer."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest

from bai.tui.model import ClusterModel, Filter, LogBuffer, wrap
from bai.tui.widgets import bar, compact

ROOT = Path(__file__).resolve().parents[1]


def session(name: str, status: str, created: str, **kw) -> dict:
    return {
        "id": f"id-{name}",
        "name": name,
        "status": status,
        "creationTime": created,
        "statusChanged": kw.pop("changed", created),
        "accessKey": kw.pop("owner", "AKIAADMIN"),
        "image": "python",
        "type": "INTERACTIVE",
        "reason": kw.pop("reason", ""),
        "agent": kw.pop("agent", None),
        **kw,
    }


def test_filter_words_status_owner_and_inversion() -> None:
    a = session("train-big", "PENDING", "2026-01-01T00:00:01", owner="AKIAUSER1", reason="no-available-instances")
    b = session("notebook", "RUNNING", "2026-01-01T00:00:02", agent="gpu-1")
    c = session("etl", "TERMINATED", "2026-01-01T00:00:03")
    rows = [a, b, c]
    assert [s["name"] for s in rows if Filter.parse("status:pending").match_session(s)] == ["train-big"]
    assert [s["name"] for s in rows if Filter.parse("status:finished").match_session(s)] == ["etl"]
    assert [s["name"] for s in rows if Filter.parse("status:running").match_session(s)] == ["notebook"]
    assert [s["name"] for s in rows if Filter.parse("owner:akiauser").match_session(s)] == ["train-big"]
    assert [s["name"] for s in rows if Filter.parse("gpu-1").match_session(s)] == ["notebook"]
    assert [s["name"] for s in rows if Filter.parse("!status:finished").match_session(s)] == ["train-big", "notebook"]
    assert [s["name"] for s in rows if Filter.parse("").match_session(s)] == ["train-big", "notebook", "etl"]
    assert Filter.parse("error timeout").match_text("ERROR: connect timeout")
    assert not Filter.parse("error timeout").match_text("error only")
    assert Filter.parse("!debug").match_text("info line") and not Filter.parse("!debug").match_text("a DEBUG line")


def test_sessions_pending_by_queue_then_running_then_newest_finished() -> None:
    model = ClusterModel()
    model.load_snapshot(
        {
            "sessions": [
                session("old-done", "TERMINATED", "2026-01-01T00:00:00", changed="2026-01-01T00:01:00"),
                session("new-done", "CANCELLED", "2026-01-01T00:00:01", changed="2026-01-01T00:05:00"),
                session("run-b", "RUNNING", "2026-01-01T00:00:05"),
                session("run-a", "RUNNING", "2026-01-01T00:00:02"),
                session("second", "PENDING", "2026-01-01T00:00:03", queuePosition=2),
                session("first", "PENDING", "2026-01-01T00:00:09", queuePosition=1),
            ],
            "agents": [],
        }
    )
    assert [s["name"] for s in model.session_rows()] == ["first", "second", "run-a", "run-b", "new-done", "old-done"]
    assert model.counts() == {"pending": 2, "running": 2, "finished": 2}
    before = model.version
    model.update_sessions([session("first", "RUNNING", "2026-01-01T00:00:09")])
    assert model.version > before
    assert [s["name"] for s in model.session_rows()][:3] == ["second", "run-a", "run-b"]


def test_only_the_newest_finished_sessions_are_kept() -> None:
    model = ClusterModel(keep_finished=3)
    done = [
        session(f"s{i}", "TERMINATED", f"2026-01-01T00:00:{i:02d}", changed=f"2026-01-01T00:01:{i:02d}")
        for i in range(6)
    ]
    model.load_snapshot({"sessions": [*done, session("live", "RUNNING", "2026-01-01T00:00:00")], "agents": []})
    assert sorted(model.sessions) == ["id-live", "id-s3", "id-s4", "id-s5"]


def test_cluster_totals_count_alive_agents_only() -> None:
    model = ClusterModel()
    model.load_snapshot(
        {
            "sessions": [],
            "agents": [
                {"id": "a", "status": "ALIVE", "availableSlots": {"cpu": "4", "mem": "1024"}, "occupiedSlots": {}},
                {
                    "id": "b",
                    "status": "ALIVE",
                    "availableSlots": {"cpu": "8", "mem": "1024", "cuda.device": "2"},
                    "occupiedSlots": {"cpu": "2.5", "cuda.device": "1"},
                },
                {"id": "c", "status": "LOST", "availableSlots": {"cpu": "16"}, "occupiedSlots": {"cpu": "16"}},
            ],
        }
    )
    cap, used, alive = model.totals()
    assert alive == 2
    assert cap == {"cpu": Decimal(12), "mem": Decimal(2048), "cuda.device": Decimal(2)}
    assert used == {"cpu": Decimal("2.5"), "cuda.device": Decimal(1)}
    assert model.slot_names() == ["cpu", "mem", "cuda.device"]
    assert [a["id"] for a in model.agent_rows()] == ["a", "b", "c"]


def test_log_buffer_joins_partial_lines_and_keeps_the_last_lines() -> None:
    buf = LogBuffer(max_lines=5)
    assert [line.text for line in buf.feed("one\ntw", "t1", seq=1)] == ["one"]
    assert buf.partial is not None and buf.partial.text == "tw"
    assert [line.text for line in buf.feed("o\nthree\n", "t2", seq=2)] == ["two", "three"]
    assert buf.partial is None and buf.last_seq == 2
    buf.feed("".join(f"line {i}\n" for i in range(10)), "t3", seq=3)
    assert [line.text for line in buf.lines] == [f"line {i}" for i in range(5, 10)]
    assert buf.first_index == 8 and buf.next_index == 13  # indexes keep counting past dropped lines
    buf.feed("no newline yet", None, seq=4)
    assert [line.text for line in buf.all_lines()][-1] == "no newline yet"


def test_wrap_and_slot_drawing() -> None:
    assert wrap("abcdefgh", 3) == ["abc", "def", "gh"]
    assert wrap("short", 10) == ["short"]
    assert compact("mem", Decimal(512 * 1024**2)) == "512M"
    assert compact("mem", Decimal(int(23.5 * 1024**3))) == "23.5G"
    assert compact("cpu", Decimal("0.50")) == "0.5"
    assert bar(Decimal(1), Decimal(2), 10).plain == "█████░░░░░"
    assert bar(Decimal(1), Decimal(1000), 10).plain == "█░░░░░░░░░"  # a little use still shows
    assert bar(Decimal(0), Decimal(0), 4).plain == "░░░░"


def test_detail_names_a_sessions_network_only_when_it_asked_for_one() -> None:
    import io
    from datetime import UTC, datetime

    from rich.console import Console

    from bai.tui.views import render_detail

    def text(s: dict) -> str:
        console = Console(width=120, record=True, file=io.StringIO())
        console.print(render_detail(s, None, datetime.now(UTC)))
        return console.export_text()

    base = session("web", "RUNNING", "2026-11-30T10:00:00+00:00", requestedSlots={}, kernels=[], mounts=[])
    assert "Network" not in text(base)
    assert any(line.split() == ["Network", "bridge"] for line in text({**base, "network": "bridge"}).splitlines())


# -- the views stand alone: attributes down, messages up, no import of the app -----------------------

TUI_MODULES = ("model", "tables", "widgets", "modals", "views", "session_views", "prompt", "logfile", "app")


def _tui_imports(name: str) -> set[str]:
    """The bai.tui modules a module of bai/tui imports, anywhere in it (under TYPE_CHECKING and in functions too)."""
    import ast

    tree = ast.parse((ROOT / "bai" / "tui" / f"{name}.py").read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        out |= {n.split(".")[2] for n in names if n.startswith("bai.tui.") and n.split(".")[2] in TUI_MODULES}
    return out - {name}


def test_no_import_circle_in_the_dashboard() -> None:
    graph = {name: _tui_imports(name) for name in TUI_MODULES}
    assert all("app" not in deps for name, deps in graph.items() if name != "app"), graph

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"import circle: {' -> '.join((*path, name))}"
        for dep in graph[name]:
            visit(dep, (*path, name))

    for name in TUI_MODULES:
        visit(name, ())


@pytest.mark.parametrize("name", [m for m in TUI_MODULES if m != "app"])
def test_each_view_module_imports_without_the_app(name: str) -> None:
    code = f"import sys, bai.tui.{name}; assert 'bai.tui.app' not in sys.modules, sorted(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


FIXED = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


def _model() -> ClusterModel:
    model = ClusterModel()
    model.load_snapshot(
        {
            "sessions": [
                session("train", "RUNNING", "2026-11-30T11:48:00+00:00", agent="agent-1", requestedSlots={"cpu": "2"}),
                session("waiting", "PENDING", "2026-11-30T11:59:30+00:00", queuePosition=1),
            ],
            "agents": [
                {
                    "id": "agent-1",
                    "status": "ALIVE",
                    "backend": "sim",
                    "scalingGroup": "default",
                    "lastSeen": "2026-11-30T11:59:58+00:00",
                    "availableSlots": {"cpu": "4", "mem": "8589934592"},
                    "occupiedSlots": {"cpu": "2", "mem": "0"},
                }
            ],
        }
    )
    return model


async def test_views_mount_in_a_bare_app_with_a_model_and_a_fixed_clock() -> None:
    from textual.app import App, ComposeResult

    from bai.tui.views import AgentsView, DetailView, SessionsView
    from tests.tui_support import plain

    model = _model()

    class Bare(App):
        def __init__(self) -> None:
            super().__init__()
            self.chosen: list[tuple[str, str]] = []

        def compose(self) -> ComposeResult:
            yield SessionsView(model, clock=lambda: FIXED, id="sessions")
            yield AgentsView(model, clock=lambda: FIXED, width=lambda: 100, id="agents")
            yield DetailView(clock=lambda: FIXED, id="detail")

        def on_sessions_view_chosen(self, message: SessionsView.Chosen) -> None:
            self.chosen.append(("session", message.session_id))

        def on_agents_view_chosen(self, message: AgentsView.Chosen) -> None:
            self.chosen.append(("agent", message.agent_id))

    app = Bare()
    async with app.run_test(size=(100, 30)) as pilot:
        sessions, agents = app.query_one(SessionsView), app.query_one(AgentsView)
        sessions.refresh_view()
        agents.refresh_view()
        assert sessions.sync.keys == ["id-waiting", "id-train"]
        ages = {key: str(cells[-2]) for key, cells in sessions.sync.cells.items()}
        assert ages == {"id-waiting": "30s", "id-train": "12m"}  # by the clock it was given
        assert "1 pending · 1 running · 0 finished" in plain(sessions.query_one("#sessions-summary"))
        assert agents.sync.keys == ["agent-1"] and "2s" in agents.sync.cells["agent-1"]
        assert "1/1 agents alive" in plain(agents.query_one("#agents-total"))

        # messages up: Enter on a row asks the app, which decides what to do
        sessions.query_one("#sessions-table").focus()
        await pilot.press("enter")
        agents.query_one("#agents-table").focus()
        await pilot.press("enter")
        await pilot.pause()
        assert app.chosen == [("session", "id-waiting"), ("agent", "agent-1")]

        detail = app.query_one(DetailView)
        detail.show("id-train", {**model.sessions["id-train"], "kernels": [], "mounts": []}, None)
        assert "since 12m ago" in plain(detail.query_one("#detail-body"))


async def test_the_agents_view_shows_warm_kernels_only_for_agents_with_a_pool() -> None:
    from textual.app import App, ComposeResult

    from bai.tui.views import AgentsView

    model = _model()
    warm = {**model.agents["agent-1"], "id": "agent-2", "backend": "docker", "warm": {"bai-python:3.11": 2}}
    model.update_agents([model.agents["agent-1"], warm])

    class Bare(App):
        def compose(self) -> ComposeResult:
            yield AgentsView(model, clock=lambda: FIXED, width=lambda: 100, id="agents")

    app = Bare()
    async with app.run_test(size=(100, 30)):
        agents = app.query_one(AgentsView)
        agents.refresh_view()
        cells = {key: [str(c) for c in row] for key, row in agents.sync.cells.items()}
        assert "warm 2" in cells["agent-2"]
        assert "warm 2" not in cells["agent-1"]
    # without any warm pool there is no such column (the dashboard's snapshots stay as they were)
    assert all("warm" not in c.key for c in AgentsView(_model(), clock=lambda: FIXED)._columns(100, ["cpu"]))
