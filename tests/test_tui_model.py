"""The dashboard's pure parts: filters, the cluster model's order and totals, the bounded log buffer."""

from __future__ import annotations

from decimal import Decimal

from bai.tui.model import ClusterModel, Filter, LogBuffer, wrap
from bai.tui.widgets import bar, compact


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
