"""Users, the domain, the group (project) and scaling groups, as Backend.AI shows them.

bai has no user accounts of its own: each keypair's user id is a user (its email the user id when it
has an "@", else `USER@bai.local`); there is one domain, "default", and one group, "default", that
every user belongs to. Scaling groups are those of the configuration (`[scaling_groups]`) and those
agents registered with."""

from __future__ import annotations

import json
from typing import Any

from graphql import GraphQLArgument, GraphQLField
from graphql import GraphQLResolveInfo as Info

from bai.node.manager.http.graphql.base import (
    DEFAULT_DOMAIN,
    DEFAULT_GROUP,
    DEFAULT_GROUP_ID,
    ID,
    NN,
    UUID,
    B,
    Context,
    DateTime,
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
    require_admin,
    user_uuid,
)
from bai.node.manager.http.represent import agent_items
from bai.node.manager.services.accounts import email_of

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

Domain = obj(
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
ScalingGroup = obj(
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


async def _users(c: Context) -> list[dict[str, Any]]:
    """One user per distinct user id of the keypairs (its first keypair is its main one)."""
    rows = (await c.services.accounts.keypairs(active_only=False)).values()
    users: dict[str, dict[str, Any]] = {}
    for r in rows:
        uid = r.user_id
        if uid not in users:
            users[uid] = {
                "id": user_uuid(uid),
                "uuid": user_uuid(uid),
                "username": uid,
                "email": email_of(uid),
                "need_password_change": False,
                "full_name": None,
                "description": None,
                "is_active": False,
                "status": "inactive",
                "status_info": None,
                "created_at": r.created_at,
                "modified_at": None,
                "domain_name": DEFAULT_DOMAIN,
                "role": "user",
                "resource_policy": "default",
                "allowed_client_ip": None,
                "totp_activated": False,
                "totp_activated_at": None,
                "sudo_session_enabled": False,
                "main_access_key": r.access_key,
                "groups": [{"id": DEFAULT_GROUP_ID, "name": DEFAULT_GROUP}],
                "_access_keys": [],
            }
        user = users[uid]
        user["_access_keys"].append(r.access_key)
        if r.is_active:
            user["is_active"], user["status"] = True, "active"
        if r.is_admin:
            user["role"] = "superadmin"
    return list(users.values())


def _visible(c: Context, users: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return users if c.is_admin else [u for u in users if c.access_key in u["_access_keys"]]


def _filtered(users: list[dict[str, Any]], args: dict[str, Any]) -> list[dict[str, Any]]:
    if args.get("status"):
        users = [u for u in users if u["status"] == args["status"].lower()]
    if args.get("is_active") is not None:
        users = [u for u in users if u["is_active"] == args["is_active"]]
    if args.get("group_id") and args["group_id"] not in (DEFAULT_GROUP_ID, DEFAULT_GROUP):
        return []
    if args.get("domain_name") and args["domain_name"] != DEFAULT_DOMAIN:
        return []
    return users


def _public(user: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in user.items() if not k.startswith("_")}


async def resolve_user(_root: Any, info: Info, **args: Any) -> dict[str, Any] | None:
    c = ctx(info)
    users = await _users(c)
    email = args.get("email")
    if email is None:
        mine = [u for u in users if c.access_key in u["_access_keys"]]
        return _public(mine[0]) if mine else None
    found = [u for u in users if email in (u["email"], u["username"])]
    if found and c.access_key not in found[0]["_access_keys"]:
        require_admin(info)
    return _public(found[0]) if found else None


async def resolve_user_from_uuid(_root: Any, info: Info, **args: Any) -> dict[str, Any] | None:
    c = ctx(info)
    found = [u for u in await _users(c) if u["uuid"] == args.get("user_id")]
    if found and c.access_key not in found[0]["_access_keys"]:
        require_admin(info)
    return _public(found[0]) if found else None


async def resolve_users(_root: Any, info: Info, **args: Any) -> list[dict[str, Any]]:
    c = require_admin(info)
    return [_public(u) for u in _filtered(await _users(c), args)]


async def resolve_user_list(_root: Any, info: Info, **args: Any) -> dict[str, Any]:
    c = require_admin(info)
    return page([_public(u) for u in _filtered(_visible(c, await _users(c)), args)], args, USER_FIELDS)


# -- the domain, the group -------------------------------------------------------------------------------


def _vfolder_hosts(c: Context) -> str:
    hosts = sorted(c.services.vfolders.hosts) if c.services.vfolders is not None else []
    return json.dumps({h: ["create-vfolder", "mount-in-session", "upload-file", "download-file"] for h in hosts})


async def _scaling_group_names(c: Context) -> list[str]:
    return [g["name"] for g in await _scaling_groups(c)]


async def _domain(c: Context) -> dict[str, Any]:
    return {
        "name": DEFAULT_DOMAIN,
        "description": "bai's one domain",
        "is_active": True,
        "created_at": None,
        "modified_at": None,
        "total_resource_slots": json.dumps({}),
        "allowed_vfolder_hosts": _vfolder_hosts(c),
        "allowed_docker_registries": sorted(r.host for r in c.services.admission.registries.values()),
        "integration_id": None,
        "scaling_groups": await _scaling_group_names(c),
    }


async def _group(c: Context) -> dict[str, Any]:
    return {
        "id": DEFAULT_GROUP_ID,
        "name": DEFAULT_GROUP,
        "type": "GENERAL",
        "description": "bai's one group (project): every user is in it",
        "is_active": True,
        "created_at": None,
        "modified_at": None,
        "domain_name": DEFAULT_DOMAIN,
        "total_resource_slots": json.dumps({}),
        "allowed_vfolder_hosts": _vfolder_hosts(c),
        "integration_id": None,
        "resource_policy": None,
        "scaling_groups": await _scaling_group_names(c),
    }


async def resolve_domain(_root: Any, info: Info, **args: Any) -> dict[str, Any] | None:
    c = ctx(info)
    return await _domain(c) if args.get("name") in (None, DEFAULT_DOMAIN) else None


async def resolve_domains(_root: Any, info: Info, **args: Any) -> list[dict[str, Any]]:
    c = require_admin(info)
    return [await _domain(c)] if args.get("is_active") in (None, True) else []


def _group_matches(args: dict[str, Any]) -> bool:
    return args.get("domain_name") in (None, DEFAULT_DOMAIN) and args.get("is_active") in (None, True)


async def resolve_group(_root: Any, info: Info, **args: Any) -> dict[str, Any] | None:
    c = ctx(info)
    if args.get("id") in (DEFAULT_GROUP_ID, DEFAULT_GROUP) and _group_matches(args):
        return await _group(c)
    return None


async def resolve_groups(_root: Any, info: Info, **args: Any) -> list[dict[str, Any]]:
    c = ctx(info)
    return [await _group(c)] if _group_matches(args) else []


async def resolve_groups_by_name(_root: Any, info: Info, **args: Any) -> list[dict[str, Any]]:
    c = ctx(info)
    return [await _group(c)] if args.get("name") == DEFAULT_GROUP and _group_matches(args) else []


# -- scaling groups ----------------------------------------------------------------------------------------


async def _scaling_groups(c: Context) -> list[dict[str, Any]]:
    """The configuration's scaling groups and any an agent registered with, by name."""
    names = set(c.services.admission.groups)
    names.update(a["scalingGroup"] for a in await c.cached("agents", lambda: agent_items(c.services.agents)))
    return [
        {
            "name": name,
            "description": None,
            "is_active": True,
            "is_public": True,
            "created_at": None,
            "wsproxy_addr": None,
            "wsproxy_api_token": None,
            "driver": None,
            "driver_opts": json.dumps({}),
            "scheduler": None,  # the dispatcher's (per `[scaling_groups.NAME] policy`), not shown here
            "scheduler_opts": json.dumps({}),
            "use_host_network": False,
        }
        for name in sorted(names)
    ]


async def resolve_scaling_group(_root: Any, info: Info, **args: Any) -> dict[str, Any] | None:
    c = ctx(info)
    return next((g for g in await _scaling_groups(c) if g["name"] == args.get("name")), None)


async def resolve_scaling_groups(_root: Any, info: Info, **args: Any) -> list[dict[str, Any]]:
    c = ctx(info)
    groups = await _scaling_groups(c)
    if args.get("name"):
        groups = [g for g in groups if g["name"] == args["name"]]
    return groups if args.get("is_active") in (None, True) else []


QUERIES = {
    "user": GraphQLField(User, args=args_of(domain_name=S, email=S), resolve=resolve_user),
    "user_from_uuid": GraphQLField(User, args=args_of(domain_name=S, user_id=ID), resolve=resolve_user_from_uuid),
    "users": GraphQLField(
        L(User), args=args_of(domain_name=S, group_id=UUID, is_active=B, status=S), resolve=resolve_users
    ),
    "user_list": GraphQLField(
        UserList, args=page_args(domain_name=S, group_id=UUID, is_active=B, status=S), resolve=resolve_user_list
    ),
    "domain": GraphQLField(Domain, args=args_of(name=S), resolve=resolve_domain),
    "domains": GraphQLField(L(Domain), args=args_of(is_active=B), resolve=resolve_domains),
    "group": GraphQLField(
        Group, args={"id": GraphQLArgument(NN(UUID)), "domain_name": GraphQLArgument(S)}, resolve=resolve_group
    ),
    "groups": GraphQLField(L(Group), args=args_of(domain_name=S, is_active=B, type=L(S)), resolve=resolve_groups),
    "groups_by_name": GraphQLField(
        L(Group),
        args={"name": GraphQLArgument(NN(S)), "domain_name": GraphQLArgument(S)},
        resolve=resolve_groups_by_name,
    ),
    "scaling_group": GraphQLField(ScalingGroup, args=args_of(name=S), resolve=resolve_scaling_group),
    "scaling_groups": GraphQLField(L(ScalingGroup), args=args_of(name=S, is_active=B), resolve=resolve_scaling_groups),
    "scaling_groups_for_domain": GraphQLField(
        L(ScalingGroup), args=args_of(domain=NN(S), is_active=B), resolve=resolve_scaling_groups
    ),
    "scaling_groups_for_user_group": GraphQLField(
        L(ScalingGroup), args=args_of(user_group=NN(S), is_active=B), resolve=resolve_scaling_groups
    ),
    "scaling_groups_for_keypair": GraphQLField(
        L(ScalingGroup), args=args_of(access_key=NN(S), is_active=B), resolve=resolve_scaling_groups
    ),
}
