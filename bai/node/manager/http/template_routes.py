"""Backend.AI's session templates: `POST|GET /template/session`, `GET|PUT|DELETE /template/session/{template_id}`,
and `POST /session/_/create-from-template` (the template's create request, the request's fields on top, then the
normal create path). Every route calls `services/session_templates.py`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import yaml
from aiohttp import web

from bai.common.problems import Problem, invalid
from bai.node.manager.http.context import caller_of, read_json, services_of
from bai.node.manager.services.session_templates import SessionTemplates, TemplateCaller

CreateAnswer = Callable[[web.Request, Any], Awaitable[web.Response]]  # app.create_answer: a create body answered


def _templates(request: web.Request, body: Any = None) -> tuple[SessionTemplates, TemplateCaller]:
    templates = services_of(request).templates
    if templates is None:
        raise Problem("not-implemented", "Not implemented.", "this manager keeps no session templates")
    caller = caller_of(request, body)
    return templates, TemplateCaller(caller.access_key, caller.is_admin, caller.owner)


async def _body(request: web.Request) -> dict[str, Any]:
    body = await read_json(request)
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    return body


def _first(body: dict[str, Any], *names: str) -> Any:
    return next((body[n] for n in names if body.get(n) is not None), None)


def _flag(value: Any, what: str) -> bool:
    if value is None or isinstance(value, bool):
        return bool(value)
    if isinstance(value, str) and value.lower() in ("", "0", "1", "true", "false", "yes", "no"):
        return value.lower() in ("1", "true", "yes")
    raise invalid(f"{what} is true or false")


async def create_templates(request: web.Request) -> web.Response:
    body = await _body(request)
    templates, caller = _templates(request, body)
    if "payload" not in body:
        raise invalid("payload is required: the text (YAML or JSON) of a template or of a list of them")
    created = await templates.create(
        caller,
        body["payload"],
        domain=_first(body, "domain", "domainName", "domain_name"),
        group=_first(body, "group", "groupName", "group_name", "group_id", "groupId"),
    )
    return web.json_response(created)


async def list_templates(request: web.Request) -> web.Response:
    body = await read_json(request)  # (the official client sends `all` as a JSON body of its GET)
    if not isinstance(body, dict):
        body = {}
    templates, caller = _templates(request)
    everyone = _flag(request.query.get("all", body.get("all")), "all")
    return web.json_response(await templates.list(caller, everyone))


async def get_template(request: web.Request) -> web.Response:
    templates, caller = _templates(request)
    fmt = request.query.get("format") or "json"
    if fmt not in ("yaml", "json"):
        raise invalid('format is "yaml" or "json"')
    shown = await templates.shown(caller, request.match_info["template_id"])
    if fmt == "yaml":
        text = yaml.safe_dump(shown, sort_keys=False, allow_unicode=True)
        return web.Response(text=text, content_type="text/yaml")
    return web.json_response(shown)


async def update_template(request: web.Request) -> web.Response:
    body = await _body(request)
    templates, caller = _templates(request, body)
    if "payload" not in body:
        raise invalid("payload is required: the text (YAML or JSON) of the template")
    group = _first(body, "group", "groupName", "group_name", "group_id", "groupId")
    await templates.replace(caller, request.match_info["template_id"], body["payload"], group)
    return web.json_response({"success": True})


async def delete_template(request: web.Request) -> web.Response:
    templates, caller = _templates(request)
    await templates.delete(caller, request.match_info["template_id"])
    return web.json_response({"success": True})


def add_template_routes(app: web.Application, create_answer: CreateAnswer) -> None:
    """The routes; `create_answer` answers a create request's body as `POST /session` does."""

    async def create_from_template(request: web.Request) -> web.Response:
        body = await _body(request)
        templates, caller = _templates(request, body)
        return await create_answer(request, await templates.create_body(caller, body))

    r = app.router
    r.add_post("/template/session", create_templates)
    r.add_get("/template/session", list_templates)
    r.add_get("/template/session/{template_id}", get_template)
    r.add_put("/template/session/{template_id}", update_template)
    r.add_delete("/template/session/{template_id}", delete_template)
    r.add_post("/session/_/create-from-template", create_from_template)
