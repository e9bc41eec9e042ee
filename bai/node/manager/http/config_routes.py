"""Backend.AI's configuration and manager endpoints the official client reads (`backend.ai admin
resource query-slots`, `admin resource docker-registries`, `admin resource vfolder-types`,
`admin manager status`):

GET /config/resource-slots      {slot: unit} of the slots the agents offer: "count" or "bytes"
GET /config/docker-registries   {registry host: its URL} of `[images.registries.*]` (no credentials)
GET /config/vfolder-types       the kinds of virtual folder there are: bai's are the user's own
GET /manager/status             {"status": "running", "active_sessions": N, "nodes": [...]} (admins)
"""

from __future__ import annotations

from aiohttp import web

from bai import __version__
from bai.common.problems import Problem
from bai.common.slots import is_bytes_slot
from bai.common.status import ACTIVE_STATUSES
from bai.node.manager.http.context import services_of


async def resource_slots(request: web.Request) -> web.Response:
    known = services_of(request).agents.known_slots
    names = ["cpu", "mem", *sorted(known - {"cpu", "mem"})]
    return web.json_response({name: "bytes" if is_bytes_slot(name) else "count" for name in names})


async def docker_registries(request: web.Request) -> web.Response:
    registries = services_of(request).admission.registries.values()
    return web.json_response(
        {r.host: ("http://" if r.insecure else "https://") + r.host for r in sorted(registries, key=lambda r: r.host)}
    )


async def vfolder_types(request: web.Request) -> web.Response:
    return web.json_response(["user"])


async def manager_status(request: web.Request) -> web.Response:
    if not request["is_admin"]:
        raise Problem("insufficient-privilege", "Insufficient privilege.", "only admin keypairs may do this")
    services = services_of(request)
    counts = await services.state.count_sessions_by_status()
    active = sum(n for status, n in counts.items() if status in {s.value for s in ACTIVE_STATUSES})
    leadership = services.leadership
    managers = await leadership.managers() if leadership is not None else []
    nodes = [
        {"id": m["id"], "num_proc": 1, "service_addr": m["api"], "heartbeat_timeout": None, "status": "running"}
        for m in managers
    ] or [
        {"id": "manager", "num_proc": 1, "service_addr": request.host, "heartbeat_timeout": None, "status": "running"}
    ]
    return web.json_response(
        {
            "nodes": nodes,
            "status": "running",
            "active_sessions": active,
            "version": __version__,
            # bai's: every manager of the database, which one leads and since when, and the database
            "managers": managers,
            "leader": leadership.leader if leadership is not None else None,
            "self": leadership.me.id if leadership is not None else None,
            "database": leadership.database if leadership is not None else None,
            "databaseError": leadership.database_error if leadership is not None else None,
        }
    )


def add_config_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/config/resource-slots", resource_slots)
    r.add_get("/config/docker-registries", docker_registries)
    r.add_get("/config/vfolder-types", vfolder_types)
    r.add_get("/manager/status", manager_status)
