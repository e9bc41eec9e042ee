"""The dashboard's live stream, `GET /bai/events` (Server-Sent Events; a bai extension, not Backend.AI's).

`topics=sessions,agents` (the default):
  `snapshot`  first, once: {"now", "sessions": [...], "agents": [...]} — every active session, the most
              recently finished ones (`finished`, default 100) and every agent.
  `sessions`  {"items": [...]}: sessions whose dashboard row changed (lifecycle events, and the
              scheduler's queue position or pending reason after each round), coalesced every
              `interval` seconds (default 0.25) and read back from the store, so a row is never older
              than the snapshot it follows.
  `agents`    {"items": [...]}: agents whose row changed (join, loss, heartbeat, slots occupied by
              kernels), at most once a second.
`topics=logs&session=REF[&kernel=ID][&tail=N | &after=SEQ]`:
  `log`       {"kernelId", "chunks": [[seq, text, stored-at], ...]}: the kernel's output, starting with
              about its last N lines (default 10000) or after chunk SEQ (to resume after a reconnect),
              then live; many chunks per event under load.
  `log_end`   {"kernelId"}: the kernel is gone and everything it printed was sent.
Users see their own sessions only; agents are visible to everyone (as `GET /agents`). A comment line
every 15 s keeps idle connections open.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from aiohttp import web

from bai.common.present import utc_now
from bai.common.problems import invalid
from bai.common.status import ACTIVE_STATUSES, DEAD_STATUSES
from bai.node.manager.http import services_of, session_of
from bai.node.manager.represent import SessionView, agent_items
from bai.node.manager.services import Services
from bai.node.manager.sessions import Sessions
from bai.node.manager.sse import EventStream, first_of

TOPICS = {"sessions", "agents", "logs"}
AGENTS_INTERVAL = 1.0


def dashboard_row(row: dict[str, Any], kernels: list[dict[str, Any]]) -> dict[str, Any]:
    """What the dashboard shows of a session (the TUI reads it): see `SessionView.to_dashboard`."""
    return SessionView(row, kernels).to_dashboard()


async def _rows(sessions: Sessions, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    kernels = await sessions.kernels_of_many([s["id"] for s in rows])
    return [dashboard_row(s, kernels.get(s["id"], [])) for s in rows]


async def _cluster(services: Services, stream: EventStream, owner: str | None, finished: int, interval: float) -> None:
    """The snapshot, then changed sessions and agents until the client goes away."""
    sessions = services.sessions
    dirty: set[str] = set()
    agents_dirty = asyncio.Event()
    wake = asyncio.Event()

    def on_session(name: str, row: dict[str, Any]) -> None:
        if owner is None or row["access_key"] == owner:
            dirty.add(row["id"])
            wake.set()
        agents_dirty.set()  # placing and ending kernels changes what agents have free

    def on_change(name: str, payload: dict[str, Any]) -> None:
        if name in ("pending_updated", "run_finished", "session_renamed"):
            dirty.update(payload["ids"])
            wake.set()
        else:
            agents_dirty.set()

    with services.hubs.events.subscribe() as session_q, services.hubs.changes.subscribe() as change_q:
        active = await sessions.list(owner, ACTIVE_STATUSES)
        done = await sessions.list(owner, DEAD_STATUSES, limit=finished, newest=True)
        sent_sessions = {r["id"]: r for r in await _rows(sessions, active + done)}
        agents = await agent_items(services.agents)
        sent_agents = {a["id"]: a for a in agents}
        await stream.send(
            "snapshot",
            {"now": utc_now().isoformat(), "sessions": list(sent_sessions.values()), "agents": agents},
        )

        async def pump(queue: asyncio.Queue, handler) -> None:
            while True:
                handler(*await queue.get())

        async def sessions_out() -> None:
            while True:
                await wake.wait()
                await asyncio.sleep(interval)  # coalesce what else happens meanwhile
                wake.clear()
                ids = list(dirty)
                dirty.clear()
                changed = []
                rows = [r for r in await sessions.by_ids(ids) if owner is None or r["access_key"] == owner]
                for item in await _rows(sessions, rows):
                    if sent_sessions.get(item["id"]) != item:
                        sent_sessions[item["id"]] = item
                        changed.append(item)
                if changed:
                    await stream.send("sessions", {"items": changed})

        async def agents_out() -> None:
            while True:
                await agents_dirty.wait()
                await asyncio.sleep(AGENTS_INTERVAL)
                agents_dirty.clear()
                changed = []
                for item in await agent_items(services.agents):
                    if sent_agents.get(item["id"]) != item:
                        sent_agents[item["id"]] = item
                        changed.append(item)
                if changed:
                    await stream.send("agents", {"items": changed})

        await first_of(pump(session_q, on_session), pump(change_q, on_change), sessions_out(), agents_out())


async def _logs(
    services: Services, stream: EventStream, session: dict[str, Any], kernel_id: str, tail: int, after: int | None
) -> None:
    logs, sessions = services.logs, services.sessions
    start = after if after is not None else await logs.tail_start(kernel_id, tail)
    over = lambda: sessions.session_over(session["id"])  # noqa: E731
    async for chunks in logs.follow(kernel_id, over, start, limit=2000):
        await stream.send("log", {"kernelId": kernel_id, "chunks": chunks})
    await stream.send("log_end", {"kernelId": kernel_id})


def _int(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise invalid(f"{name} must be a whole number") from None
    if not low <= value <= high:
        raise invalid(f"{name} must be between {low} and {high}")
    return value


async def dashboard_events(request: web.Request) -> web.StreamResponse:
    services = services_of(request)
    topics = {t.strip() for t in request.query.get("topics", "sessions,agents").split(",") if t.strip()}
    if not topics or topics - TOPICS:
        raise invalid(f"topics must be some of {', '.join(sorted(TOPICS))} (comma-separated)")
    if "logs" in topics and topics != {"logs"}:
        raise invalid("the logs topic goes on a stream of its own (topics=logs&session=REF)")
    owner = None if request["is_admin"] else request["access_key"]
    finished = _int(request, "finished", 100, 0, 10000)
    tail = _int(request, "tail", 10000, 0, 1_000_000)
    after = _int(request, "after", -1, 0, 2**63 - 1) if "after" in request.query else None
    try:
        interval = float(request.query.get("interval", "0.25"))
    except ValueError:
        raise invalid("interval must be a number of seconds") from None
    interval = min(max(interval, 0.01), 5.0)
    coros = []
    if "logs" in topics:
        ref = request.query.get("session")
        if not ref:
            raise invalid("the logs topic needs session=NAME-OR-ID")
        session = await session_of(request, ref, active_only=False)
        kernels = await services.sessions.kernels_of(session["id"])
        kernel_id = request.query.get("kernel")
        if kernel_id is None:
            kernel_id = (await services.sessions.main_kernel(session))["id"]
        elif kernel_id not in {k["id"] for k in kernels}:
            raise invalid(f"kernel {kernel_id} is not one of session {session['name']}'s kernels")
    stream = await EventStream.open(request)
    if "logs" in topics:
        coros.append(_logs(services, stream, session, kernel_id, tail, after))
    else:
        coros.append(_cluster(services, stream, owner, finished, interval))
    if await stream.serve(*coros) and "logs" in topics:
        with contextlib.suppress(ConnectionError):  # the client went away: normal
            await stream.end()
    return stream.response


def add_dashboard_routes(app: web.Application) -> None:
    app.router.add_get("/bai/events", dashboard_events)
