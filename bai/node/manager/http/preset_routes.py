"""Resource presets over REST: Backend.AI's `GET /resource/presets` and `POST /resource/check-presets` (`GET` too:
its parameters in the query), and bai's `/bai/presets` (list, make; `/bai/presets/{name}`: read, change, remove) that
the CLI uses. Every route calls `services/resource_presets.py`, which reads the input and says who may."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from bai.common.problems import Problem, invalid
from bai.node.manager.http.context import read_json, services_of
from bai.node.manager.rules.access import Actor
from bai.node.manager.rules.presets import shown
from bai.node.manager.services.resource_presets import ResourcePresets


def _presets(request: web.Request) -> tuple[ResourcePresets, Actor]:
    services = services_of(request)
    if services.presets is None:
        raise Problem("not-implemented", "Not implemented.", "this manager keeps no resource presets")
    return services.presets, services.teams.actor(request["access_key"])


async def _body(request: web.Request) -> dict[str, Any]:
    body = await read_json(request)  # ({} when there is none)
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    return body


async def list_presets(request: web.Request) -> web.Response:
    presets, _ = _presets(request)
    return web.json_response({"presets": [shown(p) for p in await presets.list()]})


async def check_presets(request: web.Request) -> web.Response:
    presets, actor = _presets(request)
    params: dict[str, Any] = {**request.query, **await _body(request)}
    unknown = sorted(str(k)[:40] for k in params if k not in ("group", "scaling_group"))
    if unknown:
        raise invalid(f"check-presets takes group and scaling_group (not {unknown[0]!r})")
    return web.json_response(await presets.check(actor, params.get("group"), params.get("scaling_group")))


async def bai_list(request: web.Request) -> web.Response:
    presets, _ = _presets(request)
    return web.json_response([shown(p) for p in await presets.list()])


async def bai_create(request: web.Request) -> web.Response:
    presets, actor = _presets(request)
    body = await _body(request)
    props = {k: v for k, v in body.items() if k != "name"}
    return web.json_response(shown(await presets.create(actor, body.get("name"), props)), status=201)


async def bai_get(request: web.Request) -> web.Response:
    presets, _ = _presets(request)
    return web.json_response(shown(await presets.get(request.match_info["name"])))


async def bai_update(request: web.Request) -> web.Response:
    presets, actor = _presets(request)
    body = await _body(request)
    return web.json_response(shown(await presets.modify(actor, request.match_info["name"], body)))


async def bai_delete(request: web.Request) -> web.Response:
    presets, actor = _presets(request)
    return web.json_response(shown(await presets.delete(actor, request.match_info["name"])))


def add_preset_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/resource/presets", list_presets)
    r.add_post("/resource/check-presets", check_presets)
    r.add_get("/resource/check-presets", check_presets)
    r.add_get("/bai/presets", bai_list)
    r.add_post("/bai/presets", bai_create)
    r.add_get("/bai/presets/{name}", bai_get)
    r.add_patch("/bai/presets/{name}", bai_update)
    r.add_delete("/bai/presets/{name}", bai_delete)
