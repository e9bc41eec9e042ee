"""Kernel images on the agents (bai's own endpoints, under /bai/; admins change them):

GET    /bai/images                     every image of every connected agent, with its aliases
POST   /bai/images/pull                {"image", "agent"?}: pull on one agent or on every Docker agent
DELETE /bai/images?image=X[&agent=A]   remove from one agent or from every agent that has it
GET    /bai/images/aliases             {alias: image} in effect ([images.aliases] and `bai image alias`)
PUT    /bai/images/aliases/{alias}     {"image"}: set (kept in the manager's database)
DELETE /bai/images/aliases/{alias}     remove one set with `bai image alias`
"""

from __future__ import annotations

from aiohttp import web

from bai.common.problems import Problem, invalid
from bai.node.manager.http.context import read_json, services_of
from bai.node.manager.services.image_catalogue import Images


def admin_only(request: web.Request) -> None:
    if not request["is_admin"]:
        raise Problem("insufficient-privilege", "Admins only.", "only an admin keypair may change images")


def images_of(request: web.Request) -> Images:
    return services_of(request).images


async def list_images(request: web.Request) -> web.Response:
    return web.json_response({"items": await images_of(request).list()})


async def pull(request: web.Request) -> web.Response:
    admin_only(request)
    body = await read_json(request)
    image = body.get("image") if isinstance(body, dict) else None
    if not isinstance(image, str) or not image:
        raise invalid("give the image to pull")
    agent = body.get("agent")
    if agent is not None and not isinstance(agent, str):
        raise invalid("agent must be an agent id")
    return web.json_response({"pulled": await images_of(request).pull(image, agent)})


async def remove(request: web.Request) -> web.Response:
    admin_only(request)
    image = request.query.get("image")
    if not image:
        raise invalid("give ?image=NAME")
    return web.json_response({"removed_from": await images_of(request).remove(image, request.query.get("agent"))})


async def aliases(request: web.Request) -> web.Response:
    return web.json_response(images_of(request).aliases)


async def set_alias(request: web.Request) -> web.Response:
    admin_only(request)
    alias = request.match_info["alias"]
    body = await read_json(request)
    image = body.get("image") if isinstance(body, dict) else None
    if not isinstance(image, str) or not image or "/" in alias or not alias:
        raise invalid("PUT /bai/images/aliases/ALIAS with {\"image\": IMAGE}; an alias has no '/'")
    await images_of(request).set_alias(alias, image)
    return web.json_response({alias: image})


async def remove_alias(request: web.Request) -> web.Response:
    admin_only(request)
    alias = request.match_info["alias"]
    if not await images_of(request).remove_alias(alias):  # (the configuration's own comes back)
        raise Problem("object-not-found", "No such alias.", f"no alias {alias!r} set with `bai image alias`")
    return web.Response(status=204)


def add_image_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/bai/images", list_images)
    r.add_post("/bai/images/pull", pull)
    r.add_delete("/bai/images", remove)
    r.add_get("/bai/images/aliases", aliases)
    r.add_put("/bai/images/aliases/{alias}", set_alias)
    r.add_delete("/bai/images/aliases/{alias}", remove_alias)
