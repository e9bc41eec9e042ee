"""What the API's handler modules share: app keys, JSON bodies, problem responses."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from bai.common.problems import Problem, invalid
from bai.node.manager.registry import Registry

REGISTRY = web.AppKey("registry", Registry)
SETTINGS = web.AppKey("settings", dict)


def problem_response(p: Problem) -> web.Response:
    return web.json_response(p.body(), status=p.status, content_type="application/problem+json")


async def read_json(request: web.Request) -> Any:
    if not request.body_exists:
        return {}
    try:
        return await request.json()
    except ValueError:
        raise invalid("the request body is not valid JSON") from None


def registry_of(request: web.Request) -> Registry:
    return request.app[REGISTRY]
