"""Kernel images on the agents (bai's own endpoints, under /bai/; admins change them):

GET    /bai/images                     every image of every connected agent, with its aliases
POST   /bai/images/pull                {"image", "agent"?}: pull on one agent or on every Docker agent
DELETE /bai/images?image=X[&agent=A]   remove from one agent or from every agent that has it
GET    /bai/images/aliases             {alias: image} in effect ([images.aliases] and `bai image alias`)
PUT    /bai/images/aliases/{alias}     {"image"}: set (kept in the manager's database)
DELETE /bai/images/aliases/{alias}     remove one set with `bai image alias`
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from bai.common import images as imagelib
from bai.common.problems import Problem, invalid
from bai.node.link.base import AgentUnavailable, RemoteError
from bai.node.manager.http import SETTINGS, read_json, registry_of
from bai.node.manager.registry import PULL_TIMEOUT, Registry


def admin_only(request: web.Request) -> None:
    if not request["is_admin"]:
        raise Problem("insufficient-privilege", "Admins only.", "only an admin keypair may change images")


async def refresh_images(registry: Registry) -> list[dict[str, Any]]:
    """Ask every connected agent for its images (and remember their labels for the scheduler)."""
    items = []
    for agent_id in sorted(registry.link.connected()):
        for image in await registry.link.call(agent_id, "images", {}, timeout=30):
            registry.image_labels[image["name"]] = image.get("labels") or {}
            items.append({**image, "agent": agent_id})
    return items


def _targets(registry: Registry, agent: Any) -> list[str]:
    connected = registry.link.connected()
    if agent:
        if agent not in connected:
            raise invalid(f"no connected agent {agent!r}")
        return [agent]
    return sorted(a for a in connected if registry.agent_backends.get(a) == "docker")


async def list_images(request: web.Request) -> web.Response:
    aliases = request.app[SETTINGS]["image_aliases"]
    items = [
        {**image, "aliases": sorted(a for a, t in aliases.items() if t == image["name"])}
        for image in await refresh_images(registry_of(request))
    ]
    return web.json_response({"items": items})


async def pull(request: web.Request) -> web.Response:
    admin_only(request)
    body = await read_json(request)
    image = body.get("image") if isinstance(body, dict) else None
    if not isinstance(image, str) or not image:
        raise invalid("give the image to pull")
    registry = registry_of(request)
    # only from a configured registry (a name without one is Docker Hub's: docker.io), checked before
    # anything connects anywhere; the registry's credentials go to the agent for this pull only
    source = image if imagelib.registry_of(image) else f"docker.io/{image}"
    grant = registry.pull_grant(source)
    targets = _targets(registry, body.get("agent"))
    if not targets:
        raise invalid("no Docker agent is connected to pull it")
    done = []
    args = {"image": source, "auth": grant["auth"] if grant else None}
    for agent_id in targets:
        try:
            result = await registry.link.call(agent_id, "pull_image", args, timeout=PULL_TIMEOUT)
        except (RemoteError, AgentUnavailable) as e:
            raise Problem("generic-bad-request", "Pull failed.", f"agent {agent_id}: {e}") from None
        registry.image_labels[image] = result.get("labels") or {}
        done.append({"agent": agent_id, **result})
    return web.json_response({"pulled": done})


async def remove(request: web.Request) -> web.Response:
    admin_only(request)
    image = request.query.get("image")
    if not image:
        raise invalid("give ?image=NAME")
    registry = registry_of(request)
    have = [i["agent"] for i in await refresh_images(registry) if i["name"] == image]
    agent = request.query.get("agent")
    targets = [agent] if agent else have
    if not targets or (agent and agent not in have):
        raise Problem("object-not-found", "No such image.", f"no agent has the image {image!r}")
    for agent_id in targets:
        try:
            await registry.link.call(agent_id, "remove_image", {"image": image}, timeout=120)
        except (RemoteError, AgentUnavailable) as e:
            raise Problem("generic-bad-request", "Remove failed.", f"agent {agent_id}: {e}") from None
    if not [i for i in await refresh_images(registry) if i["name"] == image]:
        registry.image_labels.pop(image, None)
    return web.json_response({"removed_from": targets})


async def aliases(request: web.Request) -> web.Response:
    return web.json_response(request.app[SETTINGS]["image_aliases"])


async def set_alias(request: web.Request) -> web.Response:
    admin_only(request)
    alias = request.match_info["alias"]
    body = await read_json(request)
    image = body.get("image") if isinstance(body, dict) else None
    if not isinstance(image, str) or not image or "/" in alias or not alias:
        raise invalid("PUT /bai/images/aliases/ALIAS with {\"image\": IMAGE}; an alias has no '/'")
    await registry_of(request).store.set_image_alias(alias, image)
    request.app[SETTINGS]["image_aliases"][alias] = image
    return web.json_response({alias: image})


async def remove_alias(request: web.Request) -> web.Response:
    admin_only(request)
    alias = request.match_info["alias"]
    if not await registry_of(request).store.set_image_alias(alias, None):
        raise Problem("object-not-found", "No such alias.", f"no alias {alias!r} set with `bai image alias`")
    settings = request.app[SETTINGS]
    settings["image_aliases"].pop(alias, None)
    if alias in settings.get("config_aliases", {}):  # the configuration's own comes back
        settings["image_aliases"][alias] = settings["config_aliases"][alias]
    return web.Response(status=204)


def add_image_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/bai/images", list_images)
    r.add_post("/bai/images/pull", pull)
    r.add_delete("/bai/images", remove)
    r.add_get("/bai/images/aliases", aliases)
    r.add_put("/bai/images/aliases/{alias}", set_alias)
    r.add_delete("/bai/images/aliases/{alias}", remove_alias)
