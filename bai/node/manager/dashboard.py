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
import json
from typing import Any

from aiohttp import web

from bai.common.present import reason, utc_now
from bai.common.problems import invalid
from bai.common.status import ACTIVE_STATUSES, DEAD_STATUSES, SessionStatus
from bai.node.manager.http import services_of, session_of
from bai.node.manager.represent import agent_items
from bai.node.manager.services import Services
from bai.node.manager.sessions import Sessions

TOPICS = {"sessions", "agents", "logs"}
AGENTS_INTERVAL = 1.0
KEEPALIVE = 15.0


def dashboard_row(row: dict[str, Any], kernels: list[dict[str, Any]]) -> dict[str, Any]:
    """What the dashboard shows of a session: small, and free of fields that change every round."""
    main = next((k for k in kernels if k["cluster_role"] == "main"), kernels[0] if kernels else None)
    data = dict(row["status_data"] or {})
    scheduler = dict(data.get("scheduler") or {})
    scheduler.pop("retries", None)
    scheduler.pop("last_try", None)
    scheduler.pop("passed_predicates", None)
    if scheduler:
        data["scheduler"] = scheduler
    exit_code = main["exit_code"] if main else None
    if exit_code is None:
        exit_code = data.get("exitCode")
    return {
        "id": row["id"],
        "name": row["name"],
        "accessKey": row["access_key"],
        "image": row["image"],
        "type": row["type"].upper(),
        "status": row["status"],
        "statusInfo": row["status_info"],
        "statusData": data,
        "reason": reason({"statusInfo": row["status_info"], "statusData": data}),
        "queuePosition": scheduler.get("position") if row["status"] == SessionStatus.PENDING else None,
        "agent": main["agent_id"] if main else None,
        "kernels": [k["id"] for k in kernels],
        "requestedSlots": row["requested_slots"],
        "scalingGroup": row["scaling_group"],
        "creationTime": row["created_at"],
        "statusChanged": row["status_changed"],
        "terminationTime": row["terminated_at"],
        "exitCode": exit_code,
        "result": row["result"],
    }


class _Stream:
    """One client's SSE response; writes from several tasks go out whole and in order."""

    def __init__(self, response: web.StreamResponse) -> None:
        self.response = response
        self.lock = asyncio.Lock()

    async def send(self, name: str, data: Any) -> None:
        payload = f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()
        async with self.lock:
            await self.response.write(payload)

    async def keepalive(self) -> None:
        while True:
            await asyncio.sleep(KEEPALIVE)
            async with self.lock:
                await self.response.write(b": keep-alive\n\n")


async def _rows(sessions: Sessions, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    kernels = await sessions.kernels_of_many([s["id"] for s in rows])
    return [dashboard_row(s, kernels.get(s["id"], [])) for s in rows]


async def _cluster(services: Services, stream: _Stream, owner: str | None, finished: int, interval: float) -> None:
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
        if name in ("pending_updated", "run_finished"):
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

        await _all(pump(session_q, on_session), pump(change_q, on_change), sessions_out(), agents_out())


async def _logs(
    services: Services, stream: _Stream, session: dict[str, Any], kernel_id: str, tail: int, after: int | None
) -> None:
    logs, sessions = services.logs, services.sessions
    start = after if after is not None else await logs.tail_start(kernel_id, tail)
    over = lambda: sessions.session_over(session["id"])  # noqa: E731
    async for chunks in logs.follow(kernel_id, over, start, limit=2000):
        await stream.send("log", {"kernelId": kernel_id, "chunks": chunks})
    await stream.send("log_end", {"kernelId": kernel_id})


async def _all(*coros) -> None:
    """Run until one of them ends or fails (then cancel the rest); re-raise a failure."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task


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
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    stream = _Stream(response)
    if "logs" in topics:
        coros.append(_logs(services, stream, session, kernel_id, tail, after))
    else:
        coros.append(_cluster(services, stream, owner, finished, interval))
    with contextlib.suppress(ConnectionError):  # the client went away: normal
        await _all(stream.keepalive(), *coros)
        if "logs" in topics:
            await response.write_eof()
    return response


def add_dashboard_routes(app: web.Application) -> None:
    app.router.add_get("/bai/events", dashboard_events)
