"""Scheduling rounds over REST (superadmins: a round holds every session of the cluster): `GET /bai/scheduler/rounds`
(the latest kept, newest first; `limit` 1-500, `before` a round number) and `GET /bai/scheduler/rounds/{number}`
(its replay: see services/scheduler_rounds.py), what `bai scheduler rounds|replay` call."""

from __future__ import annotations

from aiohttp import web

from bai.common.problems import Problem, invalid
from bai.node.manager.http.context import services_of
from bai.node.manager.services.scheduler_rounds import SchedulerRounds

MAX_LIMIT = 500


def _rounds(request: web.Request) -> SchedulerRounds:
    services = services_of(request)
    if not services.teams.actor(request["access_key"]).is_superadmin:
        raise Problem("insufficient-privilege", "Insufficient privilege.", "only superadmins read scheduling rounds")
    if services.scheduler_rounds is None:
        raise Problem("not-implemented", "Not implemented.", "this manager keeps no scheduling rounds")
    return services.scheduler_rounds


def _whole(value: str, what: str, low: int, high: int) -> int:
    if not (value.isascii() and value.isdigit()) or not low <= int(value) <= high:
        raise invalid(f"{what} must be a whole number from {low} to {high}")
    return int(value)


async def list_rounds(request: web.Request) -> web.Response:
    rounds = _rounds(request)
    unknown = sorted(k[:40] for k in request.query if k not in ("limit", "before"))
    if unknown:
        raise invalid(f"the rounds' list takes limit and before (not {unknown[0]!r})")
    limit = _whole(request.query.get("limit", "20"), "limit", 1, MAX_LIMIT)
    before = request.query.get("before")
    return web.json_response(
        {"rounds": await rounds.list(limit, None if before is None else _whole(before, "before", 1, 2**62))}
    )


async def replay_round(request: web.Request) -> web.Response:
    rounds = _rounds(request)
    number = _whole(request.match_info["number"], "a round number", 1, 2**62)
    return web.json_response(await rounds.replay(number))


def add_scheduler_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/bai/scheduler/rounds", list_rounds)
    r.add_get("/bai/scheduler/rounds/{number}", replay_round)
