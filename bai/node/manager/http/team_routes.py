"""REST routes of teams: Backend.AI's `GET /scaling-groups` (the scaling groups open to the caller in a project), and
bai's own (`/bai/users`, `/bai/projects`, `/bai/domains`, `/bai/scaling-groups`) that the CLI and the dashboard use.
Every route calls `services/teams.py`, which validates the input and asks the rules whether the caller may."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from bai.common import slots as slotlib
from bai.common.problems import invalid
from bai.node.manager.http.context import read_json, services_of
from bai.node.manager.http.represent import agent_items
from bai.node.manager.rules.access import Actor
from bai.node.manager.services.teams import ProjectUsage, Teams
from bai.node.manager.state.team_records import Domain, Project, ScalingGroup, User


def _teams(request: web.Request) -> tuple[Teams, Actor]:
    teams = services_of(request).teams
    return teams, teams.actor(request["access_key"])


async def _known_groups(request: web.Request) -> set[str]:
    services = services_of(request)
    return set(services.admission.groups) | {a["scalingGroup"] for a in await agent_items(services.agents)}


async def _body(request: web.Request) -> dict[str, Any]:
    body = await read_json(request)
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    return body


def _purge(request: web.Request) -> bool:
    value = request.query.get("purge", "")
    if value not in ("", "0", "1", "true", "false"):
        raise invalid("purge is true or false")
    return value in ("1", "true")


# -- as the records are shown ---------------------------------------------------------------------------------


def user_json(teams: Teams, u: User) -> dict[str, Any]:
    return {
        "uuid": u.uuid,
        "email": u.email,
        "username": u.username,
        "fullName": u.full_name,
        "description": u.description,
        "role": u.role,
        "status": u.status,
        "domain": u.domain_name,
        "resourcePolicy": u.resource_policy,
        "projects": [p.name for p in teams.projects_of(u)],
        "accessKeys": teams.directory.keys_of(u.uuid),
        "createdAt": u.created_at,
        "modifiedAt": u.modified_at,
    }


def project_json(p: Project, usage: ProjectUsage | None = None, members: list[User] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": p.id,
        "name": p.name,
        "domain": p.domain_name,
        "description": p.description,
        "isActive": p.is_active,
        "totalResourceSlots": p.total_resource_slots,
        "resourcePolicy": p.resource_policy,
        "createdAt": p.created_at,
    }
    if usage is not None:
        out["sessions"] = usage.sessions
        out["occupied"] = slotlib.to_wire(usage.occupied)
        out["cap"] = slotlib.to_wire(usage.cap)
    if members is not None:
        out["members"] = [u.email for u in members]
    return out


def domain_json(d: Domain) -> dict[str, Any]:
    return {
        "name": d.name,
        "description": d.description,
        "isActive": d.is_active,
        "totalResourceSlots": d.total_resource_slots,
        "createdAt": d.created_at,
    }


def scaling_group_json(teams: Teams, g: ScalingGroup) -> dict[str, Any]:
    links = teams.directory.associations.get(g.name)
    projects = teams.directory.projects
    return {
        "name": g.name,
        "description": g.description,
        "isActive": g.is_active,
        "isPublic": g.is_public,
        "domains": sorted(links.domains) if links else [],
        "projects": sorted(projects[p].name if p in projects else p for p in links.projects) if links else [],
        "keypairs": sorted(links.keypairs) if links else [],
        "open": links is None or links.empty,  # open to everyone
    }


# -- Backend.AI's -----------------------------------------------------------------------------------------


async def available_scaling_groups(request: web.Request) -> web.Response:
    """`GET /scaling-groups?group=NAME|ID`: the scaling groups the caller's sessions in that project may use."""
    teams, actor = _teams(request)
    group = request.query.get("group") or None
    names = teams.available_scaling_groups(actor, group, await _known_groups(request))
    return web.json_response({"scaling_groups": [{"name": n} for n in names]})


# -- users -----------------------------------------------------------------------------------------------


async def list_users(request: web.Request) -> web.Response:
    teams, actor = _teams(request)
    project = request.query.get("project")
    project_id = teams.project(actor, project, request.query.get("domain")).id if project else None
    users = teams.users(actor, request.query.get("domain"), project_id, request.query.get("status"))
    return web.json_response({"items": [user_json(teams, u) for u in users]})


async def get_user(request: web.Request) -> web.Response:
    teams, actor = _teams(request)
    return web.json_response(user_json(teams, teams.user(actor, request.match_info["ref"])))


async def create_user(request: web.Request) -> web.Response:
    teams, actor = _teams(request)
    body = await _body(request)
    props = {k: v for k, v in body.items() if k != "email"}
    if "projects" in props:
        props["group_ids"] = props.pop("projects")
    if "domain" in props:
        props["domain_name"] = props.pop("domain")
    user = await teams.create_user(actor, body.get("email"), props)
    return web.json_response(user_json(teams, user), status=201)


async def update_user(request: web.Request) -> web.Response:
    teams, actor = _teams(request)
    props = dict(await _body(request))
    if "projects" in props:
        props["group_ids"] = props.pop("projects")
    user = await teams.modify_user(actor, request.match_info["ref"], props)
    return web.json_response(user_json(teams, user))


async def delete_user(request: web.Request) -> web.Response:
    teams, actor = _teams(request)
    if _purge(request):
        await teams.purge_user(actor, request.match_info["ref"])
        return web.json_response({"purged": True})
    return web.json_response(user_json(teams, await teams.delete_user(actor, request.match_info["ref"])))


# -- projects --------------------------------------------------------------------------------------------


async def list_projects(request: web.Request) -> web.Response:
    teams, actor = _teams(request)
    domain = request.query.get("domain")
    usage = [u for u in await teams.usage(actor) if domain is None or u.project.domain_name == domain]
    return web.json_response({"items": [project_json(u.project, u) for u in usage]})


async def get_project(request: web.Request) -> web.Response:
    teams, actor = _teams(request)
    project = teams.project(actor, request.match_info["ref"], request.query.get("domain"))
    usage = next((u for u in await teams.usage(actor) if u.project.id == project.id), None)
    return web.json_response(project_json(project, usage, teams.members(actor, project)))


async def create_project(request: web.Request) -> web.Response:
    teams, actor = _teams(request)
    body = await _body(request)
    props = {k: v for k, v in body.items() if k != "name"}
    if "domain" in props:
        props["domain_name"] = props.pop("domain")
    project = await teams.create_project(actor, body.get("name"), props)
    return web.json_response(project_json(project), status=201)


async def update_project(request: web.Request) -> web.Response:
    teams, actor = _teams(request)
    project = teams.project(actor, request.match_info["ref"], request.query.get("domain"))
    project = await teams.modify_project(actor, project.id, await _body(request))
    return web.json_response(project_json(project))


async def delete_project(request: web.Request) -> web.Response:
    teams, actor = _teams(request)
    project = teams.project(actor, request.match_info["ref"], request.query.get("domain"))
    if _purge(request):
        await teams.purge_project(actor, project.id)
        return web.json_response({"purged": True})
    return web.json_response(project_json(await teams.delete_project(actor, project.id)))


async def change_members(request: web.Request) -> web.Response:
    """`POST /bai/projects/{ref}/members` `{"add": [users], "remove": [users]}` (emails, usernames or ids)."""
    teams, actor = _teams(request)
    project = teams.project(actor, request.match_info["ref"], request.query.get("domain"))
    body = await _body(request)
    if set(body) - {"add", "remove"} or not body:
        raise invalid("give add and/or remove: lists of users")
    for key, add in (("add", True), ("remove", False)):
        if key in body:
            if not isinstance(body[key], list):
                raise invalid(f"{key} must be a list of users")
            await teams.set_members(actor, project.id, body[key], add)
    return web.json_response(project_json(teams.project(actor, project.id), members=teams.members(actor, project)))


# -- domains and scaling groups --------------------------------------------------------------------------


async def list_domains(request: web.Request) -> web.Response:
    teams, actor = _teams(request)
    return web.json_response({"items": [domain_json(d) for d in teams.domains(actor)]})


async def create_domain(request: web.Request) -> web.Response:
    teams, actor = _teams(request)
    body = await _body(request)
    domain = await teams.create_domain(actor, body.get("name"), {k: v for k, v in body.items() if k != "name"})
    return web.json_response(domain_json(domain), status=201)


async def update_domain(request: web.Request) -> web.Response:
    teams, actor = _teams(request)
    domain = await teams.modify_domain(actor, request.match_info["name"], await _body(request))
    return web.json_response(domain_json(domain))


async def delete_domain(request: web.Request) -> web.Response:
    teams, actor = _teams(request)
    if _purge(request):
        await teams.purge_domain(actor, request.match_info["name"])
        return web.json_response({"purged": True})
    return web.json_response(domain_json(await teams.delete_domain(actor, request.match_info["name"])))


async def list_scaling_groups(request: web.Request) -> web.Response:
    teams, actor = _teams(request)
    names = teams.scaling_group_names(await _known_groups(request))
    if not actor.is_superadmin:
        names = teams.available_scaling_groups(actor, request.query.get("project") or None, names)
    return web.json_response({"items": [scaling_group_json(teams, teams.scaling_group(n)) for n in names]})


async def associate(request: web.Request) -> web.Response:
    """`POST /bai/scaling-groups/{name}/associations` `{"domain" | "project" | "keypair": NAME, "remove": false}`."""
    teams, actor = _teams(request)
    body = await _body(request)
    kinds = [k for k in ("domain", "project", "keypair") if k in body]
    if len(kinds) != 1 or set(body) - {"domain", "project", "keypair", "remove"}:
        raise invalid("give one of domain, project or keypair (and remove: true to close the scaling group to it)")
    remove = body.get("remove", False)
    if not isinstance(remove, bool):
        raise invalid("remove is true or false")
    name = request.match_info["name"]
    changed = await teams.associate(actor, name, kinds[0], body[kinds[0]], not remove, await _known_groups(request))
    return web.json_response({**scaling_group_json(teams, teams.scaling_group(name)), "changed": changed})


async def authorize(request: web.Request) -> web.Response:
    """Backend.AI's `POST /auth/authorize` (unsigned): a user's keypair for its email (or username) and password,
    `{"type": "keypair", "domain", "username", "password"}`."""
    body = await _body(request)
    if body.get("type", "keypair") != "keypair":
        raise invalid("type must be keypair")
    user, keypair = await services_of(request).teams.authorize(
        body.get("domain"), body.get("username"), body.get("password")
    )
    data = {
        "access_key": keypair.access_key,
        "secret_key": keypair.secret_key,
        "role": user.role,
        "status": user.status,
    }
    return web.json_response({"data": data})


async def update_password(request: web.Request) -> web.Response:
    """Backend.AI's `POST /auth/update-password` `{"old_password", "new_password", "new_password2"}`."""
    teams, actor = _teams(request)
    body = await _body(request)
    await teams.change_password(actor, body.get("old_password"), body.get("new_password"), body.get("new_password2"))
    return web.json_response({"error_msg": ""})


def add_team_routes(app: web.Application) -> None:
    r = app.router
    r.add_post("/auth/authorize", authorize)
    r.add_post("/auth/update-password", update_password)
    r.add_get("/scaling-groups", available_scaling_groups)
    r.add_get("/bai/users", list_users)
    r.add_post("/bai/users", create_user)
    r.add_get("/bai/users/{ref}", get_user)
    r.add_patch("/bai/users/{ref}", update_user)
    r.add_delete("/bai/users/{ref}", delete_user)
    r.add_get("/bai/projects", list_projects)
    r.add_post("/bai/projects", create_project)
    r.add_get("/bai/projects/{ref}", get_project)
    r.add_patch("/bai/projects/{ref}", update_project)
    r.add_delete("/bai/projects/{ref}", delete_project)
    r.add_post("/bai/projects/{ref}/members", change_members)
    r.add_get("/bai/domains", list_domains)
    r.add_post("/bai/domains", create_domain)
    r.add_patch("/bai/domains/{name}", update_domain)
    r.add_delete("/bai/domains/{name}", delete_domain)
    r.add_get("/bai/scaling-groups", list_scaling_groups)
    r.add_post("/bai/scaling-groups/{name}/associations", associate)
