"""Backend.AI's operator endpoints, answered from what bai has (reference spec §2):

PUT  /manager/status {"status": "frozen"|"running", "force_kill"}   freeze / unfreeze (admins)
GET  /manager/announcement, POST {"enabled", "message"}             the notice every client shows (admins set it)
POST /config/get {"key", "prefix"}      Backend.AI's etcd keys, read from bai's own configuration (admins)
GET  /resource/container-registries     the registries kernels may pull from (admins)
GET  /auth/my-ip                        the address the request came from
GET  /session/{ref}/abusing-report      what the agent reported as abuse: bai's agents report none

While the manager is frozen it refuses, with 503 `server-frozen`, what would start work or change who may do
what: creating sessions, folders and keypairs (the REST paths below, and GraphQL mutations); sessions already
running keep running and answer their owners (Backend.AI's maintenance mode). The state is this manager's: each
manager of a shared database is frozen on its own.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from bai.common.problems import Problem, invalid
from bai.common.slots import is_bytes_slot
from bai.common.status import ACTIVE_STATUSES
from bai.node.manager.http.context import SETTINGS, read_json, services_of, session_of

log = logging.getLogger("bai.maintenance")
MAX_ANNOUNCEMENT = 10_000
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# What a frozen manager refuses (method, path): what starts work or makes a folder; GraphQL mutations are refused
# in the GraphQL route (graphql_route.py asks `refuses_mutations`).
FROZEN_PATHS = (
    ("POST", "/session"),
    ("POST", "/session/_/create-from-template"),
    ("POST", "/session/_/create-cluster"),
    ("POST", "/folders"),
)


class ManagerFreeze:
    """Whether this manager is frozen (Backend.AI's `admin manager freeze`), and its announcement."""

    def __init__(self) -> None:
        self.frozen = False
        self.announcement: dict[str, Any] = {"enabled": False, "message": ""}

    def refuses(self, method: str, path: str) -> bool:
        if not self.frozen:
            return False
        clone = method == "POST" and path.startswith("/folders/") and path.endswith("/clone")
        return (method, path) in FROZEN_PATHS or clone


FREEZE = web.AppKey("freeze", ManagerFreeze)


def frozen_problem() -> Problem:
    return Problem(
        "server-frozen",
        "The server is frozen due to maintenance.",
        "the manager is frozen for maintenance (`bai cluster unfreeze` or `backend.ai admin manager unfreeze` "
        "ends it): running sessions still answer; nothing new starts",
        status=503,
    )


@web.middleware
async def refuse_while_frozen(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.app[FREEZE].refuses(request.method, request.path):
        raise frozen_problem()
    return await handler(request)


def _admin(request: web.Request, what: str) -> None:
    if not request["is_admin"]:
        raise Problem("insufficient-privilege", "Insufficient privilege.", f"only admins may {what}")


async def set_manager_status(request: web.Request) -> web.Response:
    _admin(request, "freeze or unfreeze the manager")
    body = await read_json(request)
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    status, force_kill = body.get("status"), body.get("force_kill", False)
    if status not in ("frozen", "running"):
        raise invalid("status must be 'frozen' or 'running'")
    if not isinstance(force_kill, bool):
        raise invalid("force_kill must be true or false")
    freeze = request.app[FREEZE]
    freeze.frozen = status == "frozen"
    log.warning("manager %s by %s", "frozen" if freeze.frozen else "unfrozen", request["access_key"])
    if freeze.frozen and force_kill:
        services = services_of(request)
        for row in await services.state.list_sessions(None, ACTIVE_STATUSES):
            try:
                await services.lifecycle.destroy(row, True, False)
            except Exception as e:  # (one session's end must not keep the others running)
                log.warning("freeze: session %s was not destroyed: %s", row.name, e)
    return web.Response(status=204)


async def get_announcement(request: web.Request) -> web.Response:
    return web.json_response(request.app[FREEZE].announcement)


async def set_announcement(request: web.Request) -> web.Response:
    _admin(request, "set the announcement")
    body = await read_json(request)
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    enabled, message = body.get("enabled", True), body.get("message")
    if not isinstance(enabled, bool):
        raise invalid("enabled must be true or false")
    if message is not None and (not isinstance(message, str) or len(message) > MAX_ANNOUNCEMENT):
        raise invalid(f"message must be text of at most {MAX_ANNOUNCEMENT} characters")
    state = request.app[FREEZE]
    if message is None:
        message = state.announcement["message"]  # (the stored one is kept: Backend.AI's)
    if enabled and not message:
        raise invalid("an enabled announcement needs a message")
    state.announcement = {"enabled": enabled, "message": message}
    return web.Response(status=204)


def config_keys(request: web.Request) -> dict[str, str]:
    """Backend.AI's etcd keys that have a meaning in bai, with bai's values (what `admin etcd get` shows)."""
    services = services_of(request)
    keys: dict[str, str] = {}
    for r in sorted(services.admission.registries.values(), key=lambda r: r.host):
        keys[f"config/docker/registry/{r.host}"] = ("http://" if r.insecure else "https://") + r.host
        keys[f"config/docker/registry/{r.host}/type"] = "docker"
    for name in ["cpu", "mem", *sorted(services.agents.known_slots - {"cpu", "mem"})]:
        keys[f"config/resource_slots/{name}"] = "bytes" if is_bytes_slot(name) else "count"
    if services.vfolders is not None:
        keys["volumes/default_host"] = services.vfolders.default_host
        for host, path in sorted(services.vfolders.hosts.items()):
            keys[f"volumes/{host}/path"] = str(path)
    keys["volumes/_types/user"] = ""
    keys["volumes/_types/group"] = ""
    keys["config/api/endpoint"] = f"{request.scheme}://{request.host}"
    keys["manager/status"] = "frozen" if request.app[FREEZE].frozen else "running"
    settings = request.app[SETTINGS]
    if isinstance(settings.get("cluster"), dict) and settings["cluster"].get("endpoint"):
        keys["config/link/endpoint"] = str(settings["cluster"]["endpoint"])
    return keys


def _nested(flat: dict[str, str], prefix: str) -> dict[str, Any]:
    """etcd's prefix read: the keys under `prefix` as nested objects (a key that is also a folder keeps its value
    as the folder's "" entry, as Backend.AI's etcd does)."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        rest = key[len(prefix) :].strip("/")
        if not rest:
            out[""] = value
            continue
        node = out
        *folders, leaf = rest.split("/")
        for part in folders:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {"": child} if child is not None else {}
                node[part] = child
            node = child
        if isinstance(node.get(leaf), dict):
            node[leaf][""] = value
        else:
            node[leaf] = value
    return out


async def config_get(request: web.Request) -> web.Response:
    _admin(request, "read the configuration")
    body = await read_json(request)
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    key, prefix = body.get("key"), body.get("prefix", False)
    if not isinstance(key, str) or len(key) > 1000:
        raise invalid("key must be a configuration key (text)")
    if not isinstance(prefix, bool):
        raise invalid("prefix must be true or false")
    flat = config_keys(request)
    key = key.strip("/")
    if prefix:
        under = {k: v for k, v in flat.items() if k == key or k.startswith(key + "/") or not key}
        return web.json_response({"result": _nested(under, key) if under else None})
    return web.json_response({"result": flat.get(key)})


async def config_write(request: web.Request) -> web.Response:
    _admin(request, "change the configuration")
    raise Problem(
        "not-implemented",
        "Not implemented.",
        f"{request.path}: bai keeps no etcd: its configuration is bai.toml (and `bai node` flags), read at start",
    )


async def container_registries(request: web.Request) -> web.Response:
    """Backend.AI's answer: each registry's name and its settings (`""` is its URL)."""
    _admin(request, "list the container registries")
    registries = services_of(request).admission.registries.values()
    return web.json_response(
        {
            r.host: {"": ("http://" if r.insecure else "https://") + r.host, "type": "docker", "project": []}
            for r in sorted(registries, key=lambda r: r.host)
        }
    )


async def my_ip(request: web.Request) -> web.Response:
    peer = request.transport.get_extra_info("peername") if request.transport is not None else None
    remote = str(peer[0]) if isinstance(peer, tuple) and peer else (request.remote or "")
    return web.json_response({"ip": remote, "forwarded_ip": request.headers.get("X-Forwarded-For")})


async def abusing_report(request: web.Request) -> web.Response:
    """Backend.AI's agents may report a kernel for abuse (a watcher plugin); bai's report none: `{}` for a session
    the caller may see."""
    await session_of(request, active_only=False)
    return web.json_response({})


def add_maintenance_routes(app: web.Application) -> None:
    app[FREEZE] = ManagerFreeze()
    r = app.router
    r.add_put("/manager/status", set_manager_status)
    r.add_get("/manager/announcement", get_announcement)
    r.add_post("/manager/announcement", set_announcement)
    r.add_post("/config/get", config_get)
    r.add_post("/config/set", config_write)
    r.add_post("/config/delete", config_write)
    r.add_get("/resource/container-registries", container_registries)
    r.add_get("/auth/my-ip", my_ip)
    r.add_get("/session/{ref}/abusing-report", abusing_report)
