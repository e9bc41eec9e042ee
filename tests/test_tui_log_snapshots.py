"""Pictures of the log view (ANSI colours, a tqdm-style progress bar collapsed to one line, run
separators) and of the header (the keypair's quota, the projects'; stale while the stream is down), at
80×24, 120×40 and 200×60, from a scripted manager (no node: the pictures depend on nothing else).

After a deliberate change: `pytest tests/test_tui_log_snapshots.py --snapshot-update`, then
`bash packaging/snapshots-to-png.sh` and look at build/snapshots/test_tui_log_snapshots/*.png."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bai.client.api import APIError
from bai.tui.app import Dashboard
from tests.tui_support import frozen_clock, until

SIZES = [(80, 24), (120, 40), (200, 60)]
SID = "3f2c9a10-0000-4000-8000-000000000001"
KID = "7b1d0c22-0000-4000-8000-000000000002"
TS = "2026-03-01T14:02:12+00:00"
QUOTA = {
    "accessKey": "AKIATESTADMIN0000000",
    "resourcePolicy": "default",
    "maxConcurrentSessions": 3,
    "concurrentSessions": 2,
    "totalResourceSlots": {"cpu": "4", "mem": str(8 * 2**30)},
    "defaultForUnspecified": "UNLIMITED",
    "occupiedSlots": {"cpu": "3", "mem": str(3 * 2**30)},
}

PROJECTS = {  # the header's per-project figures, cut where the line is full (the stale marker stays)
    "items": [
        {"name": "ml-team", "domain": "default", "sessions": 2, "occupied": {"cpu": "3", "cuda.device": "1"},
         "cap": {"cpu": "4", "cuda.device": "1"}},
        {"name": "default", "domain": "default", "sessions": 0, "occupied": {}, "cap": {}},
    ]
}  # fmt: skip


def run(n: int, start: str, end: str | None = None, code: int | None = None) -> dict[str, Any]:
    return {"kernelId": KID, "run": n, "startedAt": f"2026-03-01T{start}+00:00", "endedAt": end, "exitCode": code}


def script() -> list[tuple[str, dict[str, Any]]]:
    """The logs stream of a training session: three runs, colours, a progress bar in 25 chunks."""
    seq = 0
    events: list[tuple[str, dict[str, Any]]] = []

    def out(*texts: str) -> None:
        nonlocal seq
        chunks = []
        for text in texts:
            seq += 1
            chunks.append([seq, text, TS])
        events.append(("log", {"kernelId": KID, "chunks": chunks}))

    events.append(("run", run(1, "14:02:11")))
    out("\x1b[1mloading dataset\x1b[0m: 50000 images\n", "\x1b[32mINFO\x1b[0m  using 4 workers\n")
    events.append(("run", run(1, "14:02:11", TS, 0)))
    events.append(("run", run(2, "14:02:40")))
    out("\x1b[1mEpoch 1/3\x1b[0m\n")
    for n in range(0, 101, 4):  # tqdm: the bar redrawn after \r, one chunk each
        bar = "█" * (n // 10) + ("▌" if n % 10 >= 5 else "")
        out(f"\r{n:3d}%|{bar:<10}| {n}/100 [00:{n // 10:02d}<00:{(100 - n) // 10:02d}, 9.8it/s]")
    out("\n", "\x1b[32mINFO\x1b[0m  loss=\x1b[1m0.4213\x1b[0m acc=\x1b[1;32m0.871\x1b[0m\n")
    out("\x1b[33mWARNING\x1b[0m learning rate \x1b[4mwarm-up\x1b[0m skipped\n")
    out("\x1b[31mERROR\x1b[0m CUDA out of memory: tried to allocate \x1b[1m2.00 GiB\x1b[0m\n")
    events.append(("run", run(2, "14:02:40", TS, 1)))
    events.append(("run", run(3, "14:03:05")))
    out("\x1b[1mEpoch 1/3\x1b[0m (batch size 64)\n", "\r 12%|█▏        | 12/100 [00:01<00:09, 9.7it/s]")
    return events


class ScriptedClient:
    """The dashboard's calls, answered from a script; `drop` breaks the cluster stream (and reconnecting
    hangs)."""

    endpoint = "http://127.0.0.1:8091"

    def __init__(self) -> None:
        self.drop = asyncio.Event()
        self.connects = 0

    async def dashboard_events(self, topics: str = "sessions,agents", **kw: Any):
        if topics == "logs":
            for event in script():
                yield event
            await asyncio.Event().wait()
        self.connects += 1
        if self.connects > 1:  # reconnecting: the manager does not answer (the picture stays the same)
            await asyncio.Event().wait()
        yield "snapshot", {"now": TS, "sessions": [], "agents": []}
        await self.drop.wait()
        raise APIError(503, "Service Unavailable", "connection reset")

    async def request(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        return PROJECTS if path == "/bai/projects" else QUOTA


async def _logs_shown(pilot, app: Dashboard) -> None:
    await until(pilot, lambda: app.connected and app.query_one("#header").quota is not None, what="the quota")
    app.logs_view.reset(SID, "train-resnet")
    app.run_worker(app._follow_logs(SID), group="logs", exclusive=True)
    app.action_show("logs")
    await until(pilot, lambda: len(app.logs_view.buffer.runs) == 3, what="three runs")
    await pilot.pause(0.3)
    await pilot.wait_for_scheduled_animations()
    await pilot.pause(0.3)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_log_view_with_colours_progress_and_runs(snap_compare, size) -> None:
    app = Dashboard(ScriptedClient(), clock=frozen_clock)  # type: ignore[arg-type]

    async def before(pilot) -> None:
        await _logs_shown(pilot, app)

    assert snap_compare(app, terminal_size=size, run_before=before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_header_stale_while_disconnected(snap_compare, size) -> None:
    client = ScriptedClient()
    app = Dashboard(client, clock=frozen_clock)  # type: ignore[arg-type]

    async def before(pilot) -> None:
        await _logs_shown(pilot, app)
        client.drop.set()
        await until(pilot, lambda: "stale" in str(app.query_one("#header").render()), what="the stale marker")
        await pilot.pause(0.3)

    assert snap_compare(app, terminal_size=size, run_before=before)
