"""Scheduling rounds over REST (superadmins: a round holds every session of the cluster): `GET /bai/scheduler/rounds`
(the latest kept, newest first; `limit` 1-500, `before` a round number) and `GET /bai/scheduler/rounds/{number}`
(its replay: see services/scheduler_rounds.py), what `bai scheduler rounds|replay` call; and fair share's
standings, `GET /bai/scheduler/fair-share` (`bai scheduler fair-share`, the dashboard's `:fairshare`): each keypair's
and project's decayed usage, its part of all the usage compared and its fair-share factor, as the next round ranks
them (superadmins see every one, a domain admin its domain's, a user its own keypairs and projects)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from bai.common.problems import Problem, invalid
from bai.node.manager.http.context import services_of
from bai.node.manager.rules.access import Actor, may_act_on_keypair, may_see_project
from bai.node.manager.services.fair_share import Standing
from bai.node.manager.services.scheduler_rounds import SchedulerRounds
from bai.node.manager.state.team_records import TeamDirectory

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


async def fair_share(request: web.Request) -> web.Response:
    services = services_of(request)
    if services.fair_share is None:
        raise Problem("not-implemented", "Not implemented.", "this manager keeps no fair-share usage")
    if request.query:
        raise invalid(f"fair share takes no parameters (not {sorted(request.query)[0][:40]!r})")
    actor = services.teams.actor(request["access_key"])
    directory = services.teams.directory
    now = services.clock.now()
    found = await services.fair_share.standings(now)
    return web.json_response(
        {
            "asOf": now.isoformat(),
            "halfLifeSeconds": services.fair_share.half_life,
            "gpuWeight": services.fair_share.gpu_weight,
            "compared": {"keypairs": len(found.keypairs), "projects": len(found.projects)},
            "keypairs": [
                _keypair_row(row, directory) for row in found.keypairs if _sees_keypair(actor, directory, row.key)
            ],
            "projects": [
                _project_row(row, directory) for row in found.projects if _sees_project(actor, directory, row.key)
            ],
        }
    )


def _sees_keypair(actor: Actor, directory: TeamDirectory, access_key: str) -> bool:
    """Its own user's keypairs, and those it may act on (a domain admin's domain's; any for a superadmin)."""
    owner = directory.user_of(access_key)
    mine = owner is not None and actor.user is not None and owner.uuid == actor.user.uuid
    return mine or may_act_on_keypair(directory, actor, access_key)


def _sees_project(actor: Actor, directory: TeamDirectory, project_id: str) -> bool:
    project = directory.projects.get(project_id)
    if project is None:
        return actor.is_superadmin
    return may_see_project(actor, project)


def _figures(row: Standing) -> dict[str, Any]:
    return {"usage": row.usage, "part": row.part, "factor": row.factor, "waiting": row.waiting}


def _keypair_row(row: Standing, directory: TeamDirectory) -> dict[str, Any]:
    owner = directory.user_of(row.key)
    return {"accessKey": row.key, "user": owner.email if owner is not None else None, **_figures(row)}


def _project_row(row: Standing, directory: TeamDirectory) -> dict[str, Any]:
    project = directory.projects.get(row.key)
    return {"projectId": row.key, "name": project.name if project is not None else None, **_figures(row)}


def add_scheduler_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/bai/scheduler/rounds", list_rounds)
    r.add_get("/bai/scheduler/rounds/{number}", replay_round)
    r.add_get("/bai/scheduler/fair-share", fair_share)
