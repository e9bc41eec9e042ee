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
  `usage`     {"sessions": {id: usage}, "agents": {id: usage}}: the live figures (bai/common/stats.py
              `usage`) of the sessions and agents whose figures changed, at most once per `[agent]
              stat_interval`. Session and agent rows carry their `usage` too (null before a first
              sample); a row is not sent again for a change of its figures alone.
`topics=logs&session=REF[&kernel=ID][&tail=N | &after=SEQ]`:
  `log`       {"kernelId", "chunks": [[seq, text, stored-at], ...]}: the kernel's output, starting with
              about its last N lines (default 10000) or after chunk SEQ (to resume after a reconnect),
              then live; many chunks per event under load.
  `run`       {"kernelId", "run": N, "startedAt", "endedAt": null | ISO, "exitCode": null | int}: a run (an
              execution of code: `session exec` / `run`, a batch session's command) of the kernel,
              numbered from 1 in its session. It comes between the output stored before the run
              started and the output after, so a client draws its separator where the event comes;
              it comes again, with the same number, when the run ends. Runs the manager knows (it keeps
              them in memory: not across its restarts) of the lines sent are sent, and the last one
              that started before them (resuming `after=SEQ`: only if it may have ended since).
  `log_end`   {"kernelId"}: the kernel is gone and everything it printed was sent.
Users see their own sessions only; agents are visible to everyone (as `GET /agents`). A comment line
every 15 s keeps idle connections open.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from bisect import bisect_right
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from aiohttp import web

from bai.common.present import utc_now
from bai.common.problems import invalid
from bai.common.status import ACTIVE_STATUSES, DEAD_STATUSES
from bai.node.manager.http.context import services_of, session_of
from bai.node.manager.http.represent import SessionView, agent_items
from bai.node.manager.http.sse import EventStream, first_of
from bai.node.manager.services import Services
from bai.node.manager.services.hubs import Subscription
from bai.node.manager.services.runs import Run
from bai.node.manager.services.stats_book import StatsBook
from bai.node.manager.state.records import Kernel, Session
from bai.node.manager.state.team_records import Project

TOPICS = {"sessions", "agents", "logs"}
AGENTS_INTERVAL = 1.0
T = TypeVar("T")


def dashboard_row(
    row: Session, kernels: list[Kernel], stats: StatsBook | None = None, projects: Mapping[str, Project] | None = None
) -> dict[str, Any]:
    """What the dashboard shows of a session (the TUI reads it): see `SessionView.to_dashboard`."""
    return SessionView(row, kernels, stats, projects).to_dashboard()


async def _rows(services: Services, rows: list[Session]) -> list[dict[str, Any]]:
    kernels = await services.state.kernels_of_many([s.id for s in rows])
    projects = services.teams.directory.projects
    return [dashboard_row(s, kernels.get(s.id, []), services.stats, projects) for s in rows]


async def _pump(queue: Subscription[T], handler: Callable[[str, T], None]) -> None:
    """Hand each event of a subscription to `handler`, as it comes."""
    while True:
        handler(*await queue.get())


def _figures(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """A `usage` without its time: what a change of figures is judged by."""
    return {k: v for k, v in usage.items() if k != "at"} if usage else None


def _same_row(sent: dict[str, Any] | None, item: dict[str, Any]) -> bool:
    """Whether a row differs from the one sent only in its figures (the `usage` event carries those)."""
    return sent is not None and {**sent, "usage": None} == {**item, "usage": None}


async def _cluster(services: Services, stream: EventStream, owner: str | None, finished: int, interval: float) -> None:
    """The snapshot, then changed sessions and agents until the client goes away."""
    state = services.state
    dirty: set[str] = set()
    agents_dirty = asyncio.Event()
    wake = asyncio.Event()

    def on_session(name: str, row: Session) -> None:
        if owner is None or row.access_key == owner:
            dirty.add(row.id)
            wake.set()
        agents_dirty.set()  # placing and ending kernels changes what agents have free

    def on_change(name: str, payload: dict[str, Any]) -> None:
        if name in ("pending_updated", "run_finished", "session_renamed"):
            dirty.update(payload["ids"])
            wake.set()
        else:
            agents_dirty.set()

    with services.hubs.events.subscribe() as session_q, services.hubs.changes.subscribe() as change_q:
        active = await state.list_sessions(owner, ACTIVE_STATUSES)
        done = await state.list_sessions(owner, DEAD_STATUSES, limit=finished, newest=True)
        sent_sessions = {r["id"]: r for r in await _rows(services, active + done)}
        book = services.stats
        seen = book.version  # the figures the snapshot shows
        agents = await agent_items(services.agents, book)
        sent_agents = {a["id"]: a for a in agents}
        await stream.send(
            "snapshot",
            {"now": utc_now().isoformat(), "sessions": list(sent_sessions.values()), "agents": agents},
        )

        async def sessions_out() -> None:
            while True:
                await wake.wait()
                await asyncio.sleep(interval)  # coalesce what else happens meanwhile
                wake.clear()
                ids = list(dirty)
                dirty.clear()
                changed = []
                rows = [r for r in await state.sessions_by_ids(ids) if owner is None or r.access_key == owner]
                for item in await _rows(services, rows):
                    if not _same_row(sent_sessions.get(item["id"]), item):
                        changed.append(item)
                    sent_sessions[item["id"]] = item
                if changed:
                    await stream.send("sessions", {"items": changed})

        async def agents_out() -> None:
            while True:
                await agents_dirty.wait()
                await asyncio.sleep(AGENTS_INTERVAL)
                agents_dirty.clear()
                changed = []
                for item in await agent_items(services.agents, book):
                    if not _same_row(sent_agents.get(item["id"]), item):
                        changed.append(item)
                    sent_agents[item["id"]] = item
                if changed:
                    await stream.send("agents", {"items": changed})

        async def usage_out() -> None:
            nonlocal seen
            while True:
                await asyncio.sleep(book.interval)
                if book.version == seen:
                    continue
                ids, seen = book.sessions_changed_since(seen), book.version
                session_usage = {}
                for sid in ids:
                    if owner is not None and book.owner_of(sid) != owner:
                        continue
                    usage = book.session_usage(sid)
                    sent = sent_sessions.get(sid)
                    if sent is None or _figures(sent.get("usage")) != _figures(usage):
                        session_usage[sid] = usage
                        if sent is not None:
                            sent_sessions[sid] = {**sent, "usage": usage}
                agent_usage = {}
                for aid, usage in book.agent_usages().items():
                    sent = sent_agents.get(aid)
                    if sent is not None and _figures(sent.get("usage")) != _figures(usage):
                        agent_usage[aid] = usage
                        sent_agents[aid] = {**sent, "usage": usage}
                if session_usage or agent_usage:
                    await stream.send("usage", {"sessions": session_usage, "agents": agent_usage})

        await first_of(
            _pump(session_q, on_session), _pump(change_q, on_change), sessions_out(), agents_out(), usage_out()
        )


async def _logs(
    services: Services, stream: EventStream, session: Session, kernel_id: str, tail: int, after: int | None
) -> None:
    logs, reads = services.logs, services.reads
    start = after if after is not None else await logs.tail_start(kernel_id, tail)
    resumed_at = None  # resuming: when the client's last chunk was stored (it knows of runs ended before)
    if after is not None:
        last, _ = await logs.page(kernel_id, after - 1, 1)
        resumed_at = last[0][2] if last and last[0][0] == after else None
    marks = _RunMarks(services.runs.of, session.id, kernel_id, start, resumed_at)

    async def send_runs(before: int | None) -> None:
        for item in marks.due(before):
            await stream.send("run", item)

    async def over() -> bool:
        # called when every stored chunk was sent (a run's start or end wakes the follower): runs go out
        await send_runs(None)
        return await reads.session_over(session.id)

    async for chunks in logs.follow(kernel_id, over, start, limit=2000):
        seqs = [c[0] for c in chunks]
        pos = 0
        while pos < len(chunks):  # each run's event between the chunks stored before it and those after
            await send_runs(seqs[pos])
            limit = marks.next_after()
            end = len(chunks) if limit is None else bisect_right(seqs, limit, pos)
            await stream.send("log", {"kernelId": kernel_id, "chunks": chunks[pos:end]})
            pos = end
    await send_runs(None)
    await stream.send("log_end", {"kernelId": kernel_id})


class _RunMarks:
    """The `run` events of one logs stream: which are due, given how far the output sent has come."""

    def __init__(
        self,
        runs_of: Callable[[str, str], list[Run]],
        session_id: str,
        kernel_id: str,
        start: int,
        resumed_at: str | None = None,
    ) -> None:
        self.runs_of, self.session_id, self.kernel_id, self.start = runs_of, session_id, kernel_id, start
        self.resumed_at = resumed_at
        self.sent: dict[int, dict[str, Any]] = {}  # run number -> its event as last sent

    def _runs(self) -> list[Run]:
        runs = self.runs_of(self.session_id, self.kernel_id)
        # of the runs that started before the first chunk sent, only the last (its output may follow);
        # resuming, only if the client may not know its end (it had its event, and any end before its last chunk)
        before = sum(1 for r in runs if r.after < self.start)
        if before and self.resumed_at is not None:
            last = runs[before - 1]
            if last.ended_at is not None and last.ended_at <= self.resumed_at:
                return runs[before:]
        return runs[max(0, before - 1) :]

    def due(self, before: int | None) -> list[dict[str, Any]]:
        """Runs not sent yet that started before chunk `before` (None: all of them), and runs sent whose
        end is news; in order."""
        out = []
        for run in self._runs():
            if run.number not in self.sent and before is not None and run.after >= before:
                break
            item = run.event(self.kernel_id)
            if self.sent.get(run.number) != item:
                self.sent[run.number] = item
                out.append(item)
        return out

    def next_after(self) -> int | None:
        """Where the first run not sent yet starts (its `after` seq); None: every run was sent."""
        return next((r.after for r in self._runs() if r.number not in self.sent), None)


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
    if not math.isfinite(interval):  # nan would pass min/max and reach asyncio.sleep
        raise invalid("interval must be a number of seconds")
    interval = min(max(interval, 0.01), 5.0)
    coros = []
    if "logs" in topics:
        ref = request.query.get("session")
        if not ref:
            raise invalid("the logs topic needs session=NAME-OR-ID")
        session = await session_of(request, ref, active_only=False)
        # the main kernel's unless `kernel` names another (main1, sub1, an id or an id prefix)
        kernel_id = (await services.reads.kernel_for(session, request.query.get("kernel"))).id
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
