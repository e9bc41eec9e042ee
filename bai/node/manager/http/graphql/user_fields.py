"""Users, domains, groups (projects), scaling groups and the resource policies of users and projects, as Backend.AI
shows and changes them: queries and mutations over `services/teams.py`, which validates every input and asks the
rules (`rules/access.py`) whether the caller may. A query of something the caller may not see answers as for
something that does not exist (null, or a shorter list); a mutation that fails answers `ok: false` and why."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from graphql import GraphQLArgument, GraphQLError, GraphQLField, GraphQLInputField, GraphQLInputObjectType
from graphql import GraphQLResolveInfo as Info

from bai.common.problems import Problem
from bai.node.manager.http.graphql.base import (
    ID,
    NN,
    UUID,
    B,
    BigInt,
    Context,
    DateTime,
    I,
    JSONString,
    L,
    S,
    args_of,
    ctx,
    field_names,
    list_of,
    obj,
    page,
    page_args,
)
from bai.node.manager.http.represent import agent_items
from bai.node.manager.state.team_records import Domain, Project, ProjectPolicy, ScalingGroup, UserPolicy
from bai.node.manager.state.team_records import User as UserRecord

UserGroup = obj("UserGroup", lambda: {"id": UUID, "name": S})
User = obj(
    "User",
    lambda: {
        "id": UUID,
        "uuid": UUID,
        "username": S,
        "email": S,
        "need_password_change": B,
        "full_name": S,
        "description": S,
        "is_active": B,
        "status": S,
        "status_info": S,
        "created_at": DateTime,
        "modified_at": DateTime,
        "domain_name": S,
        "role": S,
        "resource_policy": S,
        "allowed_client_ip": L(S),
        "totp_activated": B,
        "totp_activated_at": DateTime,
        "sudo_session_enabled": B,
        "main_access_key": S,
        "groups": L(UserGroup),
    },
)
UserList = list_of("UserList", User)
USER_FIELDS = field_names(User)

Domain_ = obj(
    "Domain",
    lambda: {
        "name": S,
        "description": S,
        "is_active": B,
        "created_at": DateTime,
        "modified_at": DateTime,
        "total_resource_slots": JSONString,
        "allowed_vfolder_hosts": JSONString,
        "allowed_docker_registries": L(S),
        "integration_id": S,
        "scaling_groups": L(S),
    },
)
Group = obj(
    "Group",
    lambda: {
        "id": UUID,
        "name": S,
        "type": S,
        "description": S,
        "is_active": B,
        "created_at": DateTime,
        "modified_at": DateTime,
        "domain_name": S,
        "total_resource_slots": JSONString,
        "allowed_vfolder_hosts": JSONString,
        "integration_id": S,
        "resource_policy": S,
        "scaling_groups": L(S),
    },
)
ScalingGroupType = obj(
    "ScalingGroup",
    lambda: {
        "name": S,
        "description": S,
        "is_active": B,
        "is_public": B,
        "created_at": DateTime,
        "wsproxy_addr": S,
        "wsproxy_api_token": S,
        "driver": S,
        "driver_opts": JSONString,
        "scheduler": S,
        "scheduler_opts": JSONString,
        "use_host_network": B,
    },
)


UserResourcePolicy = obj(
    "UserResourcePolicy",
    lambda: {
        "id": ID,
        "name": S,
        "created_at": DateTime,
        "max_vfolder_count": I,
        "max_quota_scope_size": BigInt,
        "max_vfolder_size": BigInt,
        "max_session_count_per_model_session": I,
        "max_customized_image_count": I,
    },
)
ProjectResourcePolicy = obj(
    "ProjectResourcePolicy",
    lambda: {
        "id": ID,
        "name": S,
        "created_at": DateTime,
        "max_vfolder_count": I,
        "max_quota_scope_size": BigInt,
        "max_vfolder_size": BigInt,
        "max_network_count": I,
        "total_resource_slots": JSONString,
    },
)


# -- items, as the types show them ------------------------------------------------------------------------


def user_item(c: Context, u: UserRecord) -> dict[str, Any]:
    keys = c.services.teams.directory.keys_of(u.uuid)
    return {
        "id": u.uuid,
        "uuid": u.uuid,
        "username": u.username,
        "email": u.email,
        "need_password_change": u.need_password_change,
        "full_name": u.full_name,
        "description": u.description,
        "is_active": u.is_active,
        "status": u.status,
        "status_info": u.status_info or None,
        "created_at": u.created_at,
        "modified_at": u.modified_at,
        "domain_name": u.domain_name,
        "role": u.role,
        "resource_policy": u.resource_policy,
        "allowed_client_ip": None,
        "totp_activated": False,
        "totp_activated_at": None,
        "sudo_session_enabled": False,
        "main_access_key": keys[0] if keys else None,
        "groups": [{"id": p.id, "name": p.name} for p in c.services.teams.projects_of(u)],
    }


def _hosts(c: Context, allowed: dict[str, list[str]]) -> str:
    if allowed:
        return json.dumps(allowed)
    hosts = sorted(c.services.vfolders.hosts) if c.services.vfolders is not None else []
    return json.dumps({h: ["create-vfolder", "mount-in-session", "upload-file", "download-file"] for h in hosts})


async def _open_groups(c: Context, kind: str, target: str) -> list[str]:
    """The scaling groups open to a domain, project (id) or keypair: associated with it, or with nothing."""
    teams = c.services.teams.directory
    out = []
    for name in await _scaling_group_names(c):
        links = teams.associations.get(name)
        if links is None or links.empty or target in getattr(links, f"{kind}s"):
            out.append(name)
    return out


async def domain_item(c: Context, d: Domain) -> dict[str, Any]:
    return {
        "name": d.name,
        "description": d.description,
        "is_active": d.is_active,
        "created_at": d.created_at,
        "modified_at": d.modified_at,
        "total_resource_slots": json.dumps(d.total_resource_slots),
        "allowed_vfolder_hosts": _hosts(c, d.allowed_vfolder_hosts),
        "allowed_docker_registries": d.allowed_docker_registries
        or sorted(r.host for r in c.services.admission.registries.values()),
        "integration_id": None,
        "scaling_groups": await _open_groups(c, "domain", d.name),
    }


async def group_item(c: Context, p: Project) -> dict[str, Any]:
    return {
        "id": p.id,
        "name": p.name,
        "type": "GENERAL",
        "description": p.description,
        "is_active": p.is_active,
        "created_at": p.created_at,
        "modified_at": p.modified_at,
        "domain_name": p.domain_name,
        "total_resource_slots": json.dumps(p.total_resource_slots),
        "allowed_vfolder_hosts": _hosts(c, p.allowed_vfolder_hosts),
        "integration_id": None,
        "resource_policy": p.resource_policy,
        "scaling_groups": await _open_groups(c, "project", p.id),
    }


def _user_policy_item(p: UserPolicy) -> dict[str, Any]:
    return {"id": p.name, **{f: getattr(p, f) for f in p.__struct_fields__}, "max_vfolder_size": p.max_quota_scope_size}


def _project_policy_item(p: ProjectPolicy) -> dict[str, Any]:
    item = {"id": p.name, **{f: getattr(p, f) for f in p.__struct_fields__}, "max_vfolder_size": p.max_quota_scope_size}
    item["total_resource_slots"] = json.dumps(p.total_resource_slots)
    return item


async def _scaling_group_names(c: Context) -> list[str]:
    """The stored scaling groups, the configuration's and those agents registered with."""
    known = set(c.services.admission.groups)
    known.update(a["scalingGroup"] for a in await c.cached("agents", lambda: agent_items(c.services.agents)))
    return c.services.teams.scaling_group_names(known)


def scaling_group_item(g: ScalingGroup) -> dict[str, Any]:
    return {
        "name": g.name,
        "description": g.description or None,
        "is_active": g.is_active,
        "is_public": g.is_public,
        "created_at": g.created_at or None,
        "wsproxy_addr": None,
        "wsproxy_api_token": None,
        "driver": "static",
        "driver_opts": json.dumps({}),
        "scheduler": None,  # the dispatcher's (per `[scaling_groups.NAME] policy`), not shown here
        "scheduler_opts": json.dumps({}),
        "use_host_network": False,
    }


async def _scaling_groups(c: Context) -> list[dict[str, Any]]:
    return [scaling_group_item(c.services.teams.scaling_group(n)) for n in await _scaling_group_names(c)]


def _absent(call: Callable[[], Any]) -> Any:
    """A read of one record: None where the caller may not see it or it does not exist."""
    try:
        return call()
    except Problem as p:
        if p.status in (403, 404):
            return None
        raise GraphQLError(p.msg or p.title) from None


# -- queries -------------------------------------------------------------------------------------------------


async def resolve_user(_root: Any, info: Info, **args: Any) -> dict[str, Any] | None:
    c = ctx(info)
    if args.get("email") is None:
        return user_item(c, c.actor.user) if c.actor.user is not None else None
    found = _absent(lambda: c.services.teams.user(c.actor, args["email"]))
    return user_item(c, found) if found is not None else None


async def resolve_user_from_uuid(_root: Any, info: Info, **args: Any) -> dict[str, Any] | None:
    c = ctx(info)
    if args.get("user_id") is None:
        return user_item(c, c.actor.user) if c.actor.user is not None else None
    found = _absent(lambda: c.services.teams.user(c.actor, str(args["user_id"])))
    return user_item(c, found) if found is not None else None


def _users(c: Context, args: dict[str, Any]) -> list[dict[str, Any]]:
    teams = c.services.teams
    project = None
    if args.get("group_id"):
        found = _absent(lambda: teams.project(c.actor, str(args["group_id"])))
        if found is None:
            return []
        project = found.id
    status = args.get("status")
    found = _absent(lambda: teams.users(c.actor, args.get("domain_name"), project, status or None))
    users = found or []
    if args.get("is_active") is not None:
        users = [u for u in users if u.is_active == args["is_active"]]
    return [user_item(c, u) for u in users]


def _admin(info: Info) -> Context:
    """The context of a superadmin or a domain admin (lists of users are theirs, as in Backend.AI)."""
    c = ctx(info)
    if not (c.actor.is_superadmin or c.actor.is_domain_admin):
        raise GraphQLError("insufficient privilege: only admins list users")
    return c


async def resolve_users(_root: Any, info: Info, **args: Any) -> list[dict[str, Any]]:
    return _users(_admin(info), args)


async def resolve_user_list(_root: Any, info: Info, **args: Any) -> dict[str, Any]:
    return page(_users(_admin(info), args), args, USER_FIELDS)


async def resolve_domain(_root: Any, info: Info, **args: Any) -> dict[str, Any] | None:
    c = ctx(info)
    found = _absent(lambda: c.services.teams.domain(c.actor, args.get("name") or c.actor.domain))
    return await domain_item(c, found) if found is not None else None


async def resolve_domains(_root: Any, info: Info, **args: Any) -> list[dict[str, Any]]:
    c = ctx(info)
    rows = c.services.teams.domains(c.actor)
    if args.get("is_active") is not None:
        rows = [d for d in rows if d.is_active == args["is_active"]]
    return [await domain_item(c, d) for d in rows]


async def resolve_group(_root: Any, info: Info, **args: Any) -> dict[str, Any] | None:
    c = ctx(info)
    found = _absent(lambda: c.services.teams.project(c.actor, str(args["id"]), args.get("domain_name")))
    if found is None or args.get("is_active") not in (None, found.is_active):
        return None
    return await group_item(c, found)


async def resolve_groups(_root: Any, info: Info, **args: Any) -> list[dict[str, Any]]:
    c = ctx(info)
    rows = c.services.teams.projects(c.actor, args.get("domain_name"), args.get("is_active"))
    return [await group_item(c, p) for p in rows]


async def resolve_groups_by_name(_root: Any, info: Info, **args: Any) -> list[dict[str, Any]]:
    c = ctx(info)
    rows = c.services.teams.projects(c.actor, args.get("domain_name"))
    return [await group_item(c, p) for p in rows if p.name == args.get("name")]


async def resolve_scaling_group(_root: Any, info: Info, **args: Any) -> dict[str, Any] | None:
    c = ctx(info)
    return next((g for g in await _scaling_groups(c) if g["name"] == args.get("name")), None)


async def resolve_scaling_groups(_root: Any, info: Info, **args: Any) -> list[dict[str, Any]]:
    c = ctx(info)
    groups = await _scaling_groups(c)
    if args.get("name"):
        groups = [g for g in groups if g["name"] == args["name"]]
    if args.get("is_active") is not None:
        groups = [g for g in groups if g["is_active"] == args["is_active"]]
    return groups


async def _sgroups_open_to(info: Info, kind: str, target: str | None, is_active: bool | None) -> list[dict[str, Any]]:
    """The scaling groups open to a domain, project (id) or keypair the caller may see (None: none)."""
    if target is None:
        return []
    names = set(await _open_groups(ctx(info), kind, target))
    return [g for g in await resolve_scaling_groups(None, info, is_active=is_active) if g["name"] in names]


async def resolve_sgroups_for_domain(_root: Any, info: Info, **args: Any) -> list[dict[str, Any]]:
    c = ctx(info)
    found = _absent(lambda: c.services.teams.domain(c.actor, args["domain"]))
    return await _sgroups_open_to(info, "domain", found.name if found else None, args.get("is_active"))


async def resolve_sgroups_for_project(_root: Any, info: Info, **args: Any) -> list[dict[str, Any]]:
    c = ctx(info)
    found = _absent(lambda: c.services.teams.project(c.actor, str(args["user_group"])))
    return await _sgroups_open_to(info, "project", found.id if found else None, args.get("is_active"))


async def resolve_sgroups_for_keypair(_root: Any, info: Info, **args: Any) -> list[dict[str, Any]]:
    c = ctx(info)
    key = args["access_key"]
    seen = key == c.access_key or c.actor.is_superadmin
    return await _sgroups_open_to(info, "keypair", key if seen else None, args.get("is_active"))


async def resolve_user_policy(_root: Any, info: Info, **args: Any) -> dict[str, Any] | None:
    c = ctx(info)
    name = args.get("name") or (c.actor.user.resource_policy if c.actor.user is not None else "default")
    return next((_user_policy_item(p) for p in c.services.teams.user_policies(c.actor) if p.name == name), None)


async def resolve_user_policies(_root: Any, info: Info, **args: Any) -> list[dict[str, Any]]:
    c = ctx(info)
    return [_user_policy_item(p) for p in c.services.teams.user_policies(c.actor)]


async def resolve_project_policy(_root: Any, info: Info, **args: Any) -> dict[str, Any] | None:
    c = ctx(info)
    return next(
        (_project_policy_item(p) for p in c.services.teams.project_policies(c.actor) if p.name == args["name"]), None
    )


async def resolve_project_policies(_root: Any, info: Info, **args: Any) -> list[dict[str, Any]]:
    c = ctx(info)
    return [_project_policy_item(p) for p in c.services.teams.project_policies(c.actor)]


# -- mutations -----------------------------------------------------------------------------------------------


def mutation(act: Callable[[Context, dict[str, Any]], Awaitable[dict[str, Any] | None]]) -> Callable[..., Any]:
    """A mutation's resolver: `act`'s fields with ok / msg; a Problem of the service answers ok false and why."""

    async def resolve(_root: Any, info: Info, **args: Any) -> dict[str, Any]:
        c = ctx(info)
        try:
            more = await act(c, args)
        except Problem as p:
            return {"ok": False, "msg": p.msg}
        return {"ok": True, "msg": "success", **(more or {})}

    return resolve


async def _known(c: Context) -> set[str]:
    return set(await _scaling_group_names(c))


async def _create_user(c: Context, a: dict[str, Any]) -> dict[str, Any]:
    return {"user": user_item(c, await c.services.teams.create_user(c.actor, a["email"], a["props"]))}


async def _modify_user(c: Context, a: dict[str, Any]) -> dict[str, Any]:
    return {"user": user_item(c, await c.services.teams.modify_user(c.actor, a["email"], a["props"]))}


async def _delete_user(c: Context, a: dict[str, Any]) -> None:
    await c.services.teams.delete_user(c.actor, a["email"])


async def _purge_user(c: Context, a: dict[str, Any]) -> None:
    await c.services.teams.purge_user(c.actor, a["email"])


async def _create_group(c: Context, a: dict[str, Any]) -> dict[str, Any]:
    return {"group": await group_item(c, await c.services.teams.create_project(c.actor, a["name"], a["props"]))}


async def _modify_group(c: Context, a: dict[str, Any]) -> dict[str, Any]:
    return {"group": await group_item(c, await c.services.teams.modify_project(c.actor, str(a["gid"]), a["props"]))}


async def _delete_group(c: Context, a: dict[str, Any]) -> None:
    await c.services.teams.delete_project(c.actor, str(a["gid"]))


async def _purge_group(c: Context, a: dict[str, Any]) -> None:
    await c.services.teams.purge_project(c.actor, str(a["gid"]))


async def _create_domain(c: Context, a: dict[str, Any]) -> dict[str, Any]:
    return {"domain": await domain_item(c, await c.services.teams.create_domain(c.actor, a["name"], a["props"]))}


async def _modify_domain(c: Context, a: dict[str, Any]) -> dict[str, Any]:
    props = dict(a["props"])
    if props.get("name") not in (None, a["name"]):
        raise Problem("generic-bad-request", "Bad request.", "bai does not rename domains")
    props.pop("name", None)
    return {"domain": await domain_item(c, await c.services.teams.modify_domain(c.actor, a["name"], props))}


async def _delete_domain(c: Context, a: dict[str, Any]) -> None:
    await c.services.teams.delete_domain(c.actor, a["name"])


async def _purge_domain(c: Context, a: dict[str, Any]) -> None:
    await c.services.teams.purge_domain(c.actor, a["name"])


async def _create_sgroup(c: Context, a: dict[str, Any]) -> dict[str, Any]:
    row = await c.services.teams.create_scaling_group(c.actor, a["name"], a["props"])
    return {"scaling_group": scaling_group_item(row)}


async def _modify_sgroup(c: Context, a: dict[str, Any]) -> None:
    await c.services.teams.modify_scaling_group(c.actor, a["name"], a["props"], await _known(c))


async def _delete_sgroup(c: Context, a: dict[str, Any]) -> None:
    await c.services.teams.delete_scaling_group(c.actor, a["name"])


def _link(kind: str, arg: str, linked: bool) -> Callable[[Context, dict[str, Any]], Awaitable[None]]:
    async def act(c: Context, a: dict[str, Any]) -> None:
        await c.services.teams.associate(c.actor, a["scaling_group"], kind, str(a[arg]), linked, await _known(c))

    return act


def _unlink_all(kind: str, arg: str) -> Callable[[Context, dict[str, Any]], Awaitable[None]]:
    async def act(c: Context, a: dict[str, Any]) -> None:
        target = str(a[arg])
        if kind == "project":
            target = c.services.teams.project(c.actor, target).id
        for group, links in list(c.services.teams.directory.associations.items()):
            if target in getattr(links, f"{kind}s"):
                await c.services.teams.associate(c.actor, group, kind, target, False, await _known(c))

    return act


def _policy(cls: type[Any], create: bool) -> Callable[[Context, dict[str, Any]], Awaitable[dict[str, Any] | None]]:
    item = _user_policy_item if cls is UserPolicy else _project_policy_item

    async def act(c: Context, a: dict[str, Any]) -> dict[str, Any] | None:
        props = dict(a["props"])
        if "max_vfolder_size" in props:  # (Backend.AI's older name of the quota)
            props.setdefault("max_quota_scope_size", props.pop("max_vfolder_size"))
        row = await c.services.teams.save_policy(c.actor, cls, a["name"], props, create=create)
        return {"resource_policy": item(row)} if create else None

    return act


def _delete_policy(cls: type[Any]) -> Callable[[Context, dict[str, Any]], Awaitable[None]]:
    async def act(c: Context, a: dict[str, Any]) -> None:
        await c.services.teams.delete_policy(c.actor, cls, a["name"])

    return act


def _input(name: str, fields: dict[str, Any]) -> GraphQLInputObjectType:
    return GraphQLInputObjectType(name, {k: GraphQLInputField(v) for k, v in fields.items()})


_USER_INPUT = {
    "username": S, "password": S, "need_password_change": B, "full_name": S, "description": S, "is_active": B,
    "status": S, "domain_name": S, "role": S, "group_ids": L(S), "allowed_client_ip": L(S), "totp_activated": B,
    "resource_policy": S, "sudo_session_enabled": B, "main_access_key": S, "container_uid": I,
    "container_main_gid": I, "container_gids": L(I),
}  # fmt: skip
_GROUP_INPUT = {
    "type": S, "description": S, "is_active": B, "domain_name": S, "total_resource_slots": JSONString,
    "allowed_vfolder_hosts": JSONString, "integration_id": S, "resource_policy": S, "container_registry": JSONString,
}  # fmt: skip
_DOMAIN_INPUT = {
    "name": S, "description": S, "is_active": B, "total_resource_slots": JSONString,
    "allowed_vfolder_hosts": JSONString, "allowed_docker_registries": L(S), "integration_id": S, "dotfiles": S,
}  # fmt: skip
_SGROUP_INPUT = {
    "description": S, "is_active": B, "is_public": B, "wsproxy_addr": S, "wsproxy_api_token": S, "driver": S,
    "driver_opts": JSONString, "scheduler": S, "scheduler_opts": JSONString, "use_host_network": B,
}  # fmt: skip
_USER_POLICY_INPUT = {
    "max_vfolder_count": I, "max_quota_scope_size": BigInt, "max_vfolder_size": BigInt,
    "max_session_count_per_model_session": I, "max_customized_image_count": I,
}  # fmt: skip
_PROJECT_POLICY_INPUT = {
    "max_vfolder_count": I, "max_quota_scope_size": BigInt, "max_vfolder_size": BigInt, "max_network_count": I,
    "total_resource_slots": JSONString,
}  # fmt: skip

UserInput = _input("UserInput", _USER_INPUT)
ModifyUserInput = _input("ModifyUserInput", _USER_INPUT)
PurgeUserInput = _input("PurgeUserInput", {"purge_shared_vfolders": B, "delegate_endpoint_ownership": B})
GroupInput = _input("GroupInput", _GROUP_INPUT)
ModifyGroupInput = _input("ModifyGroupInput", {**_GROUP_INPUT, "name": S, "user_update_mode": S, "user_uuids": L(S)})
DomainInput = _input("DomainInput", {k: v for k, v in _DOMAIN_INPUT.items() if k != "name"})
ModifyDomainInput = _input("ModifyDomainInput", _DOMAIN_INPUT)
ScalingGroupInput = _input("CreateScalingGroupInput", _SGROUP_INPUT)
ModifyScalingGroupInput = _input("ModifyScalingGroupInput", _SGROUP_INPUT)
UserPolicyInput = _input("CreateUserResourcePolicyInput", _USER_POLICY_INPUT)
ModifyUserPolicyInput = _input("ModifyUserResourcePolicyInput", _USER_POLICY_INPUT)
ProjectPolicyInput = _input("CreateProjectResourcePolicyInput", _PROJECT_POLICY_INPUT)
ModifyProjectPolicyInput = _input("ModifyProjectResourcePolicyInput", _PROJECT_POLICY_INPUT)

OkMsg = obj("TeamMutationResult", lambda: {"ok": B, "msg": S})
UserResult = obj("CreateUser", lambda: {"ok": B, "msg": S, "user": User})
ModifyUserResult = obj("ModifyUser", lambda: {"ok": B, "msg": S, "user": User})
GroupResult = obj("CreateGroup", lambda: {"ok": B, "msg": S, "group": Group})
ModifyGroupResult = obj("ModifyGroup", lambda: {"ok": B, "msg": S, "group": Group})
DomainResult = obj("CreateDomain", lambda: {"ok": B, "msg": S, "domain": Domain_})
ModifyDomainResult = obj("ModifyDomain", lambda: {"ok": B, "msg": S, "domain": Domain_})
SgroupResult = obj("CreateScalingGroup", lambda: {"ok": B, "msg": S, "scaling_group": ScalingGroupType})
UserPolicyResult = obj("CreateUserResourcePolicy", lambda: {"ok": B, "msg": S, "resource_policy": UserResourcePolicy})
ProjectPolicyResult = obj(
    "CreateProjectResourcePolicy", lambda: {"ok": B, "msg": S, "resource_policy": ProjectResourcePolicy}
)


def _m(result: Any, resolve: Any, **args: Any) -> GraphQLField:
    return GraphQLField(result, args={k: GraphQLArgument(v) for k, v in args.items()}, resolve=mutation(resolve))


_SG_DOMAIN = {"scaling_group": NN(S), "domain": NN(S)}
_SG_GROUP = {"scaling_group": NN(S), "user_group": NN(UUID)}
_SG_KEYPAIR = {"scaling_group": NN(S), "access_key": NN(S)}

MUTATIONS = {
    "create_user": _m(UserResult, _create_user, email=NN(S), props=NN(UserInput)),
    "modify_user": _m(ModifyUserResult, _modify_user, email=NN(S), props=NN(ModifyUserInput)),
    "delete_user": _m(OkMsg, _delete_user, email=NN(S)),
    "purge_user": _m(OkMsg, _purge_user, email=NN(S), props=PurgeUserInput),
    "create_group": _m(GroupResult, _create_group, name=NN(S), props=NN(GroupInput)),
    "modify_group": _m(ModifyGroupResult, _modify_group, gid=NN(UUID), props=NN(ModifyGroupInput)),
    "delete_group": _m(OkMsg, _delete_group, gid=NN(UUID)),
    "purge_group": _m(OkMsg, _purge_group, gid=NN(UUID)),
    "create_domain": _m(DomainResult, _create_domain, name=NN(S), props=NN(DomainInput)),
    "modify_domain": _m(ModifyDomainResult, _modify_domain, name=NN(S), props=NN(ModifyDomainInput)),
    "delete_domain": _m(OkMsg, _delete_domain, name=NN(S)),
    "purge_domain": _m(OkMsg, _purge_domain, name=NN(S)),
    "create_scaling_group": _m(SgroupResult, _create_sgroup, name=NN(S), props=NN(ScalingGroupInput)),
    "modify_scaling_group": _m(OkMsg, _modify_sgroup, name=NN(S), props=NN(ModifyScalingGroupInput)),
    "delete_scaling_group": _m(OkMsg, _delete_sgroup, name=NN(S)),
    "associate_scaling_group_with_domain": _m(OkMsg, _link("domain", "domain", True), **_SG_DOMAIN),
    "disassociate_scaling_group_with_domain": _m(OkMsg, _link("domain", "domain", False), **_SG_DOMAIN),
    "associate_scaling_group_with_user_group": _m(OkMsg, _link("project", "user_group", True), **_SG_GROUP),
    "disassociate_scaling_group_with_user_group": _m(OkMsg, _link("project", "user_group", False), **_SG_GROUP),
    "associate_scaling_group_with_keypair": _m(OkMsg, _link("keypair", "access_key", True), **_SG_KEYPAIR),
    "disassociate_scaling_group_with_keypair": _m(OkMsg, _link("keypair", "access_key", False), **_SG_KEYPAIR),
    "disassociate_all_scaling_groups_with_domain": _m(OkMsg, _unlink_all("domain", "domain"), domain=NN(S)),
    "disassociate_all_scaling_groups_with_group": _m(OkMsg, _unlink_all("project", "user_group"), user_group=NN(UUID)),
    "create_user_resource_policy": _m(
        UserPolicyResult, _policy(UserPolicy, True), name=NN(S), props=NN(UserPolicyInput)
    ),
    "modify_user_resource_policy": _m(OkMsg, _policy(UserPolicy, False), name=NN(S), props=NN(ModifyUserPolicyInput)),
    "delete_user_resource_policy": _m(OkMsg, _delete_policy(UserPolicy), name=NN(S)),
    "create_project_resource_policy": _m(
        ProjectPolicyResult, _policy(ProjectPolicy, True), name=NN(S), props=NN(ProjectPolicyInput)
    ),
    "modify_project_resource_policy": _m(
        OkMsg, _policy(ProjectPolicy, False), name=NN(S), props=NN(ModifyProjectPolicyInput)
    ),
    "delete_project_resource_policy": _m(OkMsg, _delete_policy(ProjectPolicy), name=NN(S)),
}

QUERIES = {
    "user": GraphQLField(User, args=args_of(domain_name=S, email=S), resolve=resolve_user),
    "user_from_uuid": GraphQLField(User, args=args_of(domain_name=S, user_id=ID), resolve=resolve_user_from_uuid),
    "users": GraphQLField(
        L(User), args=args_of(domain_name=S, group_id=UUID, is_active=B, status=S), resolve=resolve_users
    ),
    "user_list": GraphQLField(
        UserList, args=page_args(domain_name=S, group_id=UUID, is_active=B, status=S), resolve=resolve_user_list
    ),
    "domain": GraphQLField(Domain_, args=args_of(name=S), resolve=resolve_domain),
    "domains": GraphQLField(L(Domain_), args=args_of(is_active=B), resolve=resolve_domains),
    "group": GraphQLField(
        Group,
        args={"id": GraphQLArgument(NN(UUID)), "domain_name": GraphQLArgument(S), "is_active": GraphQLArgument(B)},
        resolve=resolve_group,
    ),
    "groups": GraphQLField(L(Group), args=args_of(domain_name=S, is_active=B, type=L(S)), resolve=resolve_groups),
    "groups_by_name": GraphQLField(
        L(Group),
        args={"name": GraphQLArgument(NN(S)), "domain_name": GraphQLArgument(S)},
        resolve=resolve_groups_by_name,
    ),
    "scaling_group": GraphQLField(ScalingGroupType, args=args_of(name=S), resolve=resolve_scaling_group),
    "scaling_groups": GraphQLField(
        L(ScalingGroupType), args=args_of(name=S, is_active=B), resolve=resolve_scaling_groups
    ),
    "scaling_groups_for_domain": GraphQLField(
        L(ScalingGroupType), args=args_of(domain=NN(S), is_active=B), resolve=resolve_sgroups_for_domain
    ),
    "scaling_groups_for_user_group": GraphQLField(
        L(ScalingGroupType), args=args_of(user_group=NN(S), is_active=B), resolve=resolve_sgroups_for_project
    ),
    "scaling_groups_for_keypair": GraphQLField(
        L(ScalingGroupType), args=args_of(access_key=NN(S), is_active=B), resolve=resolve_sgroups_for_keypair
    ),
    "user_resource_policy": GraphQLField(UserResourcePolicy, args=args_of(name=S), resolve=resolve_user_policy),
    "user_resource_policies": GraphQLField(L(UserResourcePolicy), resolve=resolve_user_policies),
    "project_resource_policy": GraphQLField(
        ProjectResourcePolicy, args=args_of(name=NN(S)), resolve=resolve_project_policy
    ),
    "project_resource_policies": GraphQLField(L(ProjectResourcePolicy), resolve=resolve_project_policies),
}
