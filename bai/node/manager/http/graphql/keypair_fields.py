"""Keypairs and keypair resource policies: `keypair`, `keypairs`, `keypair_list`,
`keypair_resource_policy`, `keypair_resource_policies`, and their create / modify / delete mutations
(admins; a user sees their own keypair and its policy)."""

from __future__ import annotations

import json
from typing import Any

from graphql import GraphQLArgument, GraphQLError, GraphQLField, GraphQLInputField, GraphQLInputObjectType
from graphql import GraphQLResolveInfo as Info

from bai.common import auth, safejson
from bai.common.cluster import MAX_CLUSTER_SIZE
from bai.common.problems import Problem
from bai.common.status import ACTIVE_STATUSES
from bai.node.manager.http.admin_routes import parse_policy
from bai.node.manager.http.context import STREAMS
from bai.node.manager.http.graphql.base import (
    DEFAULT_DOMAIN,
    DEFAULT_GROUP,
    NN,
    UUID,
    B,
    BigInt,
    Context,
    DateTime,
    F,
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
    require_admin,
    user_uuid,
)
from bai.node.manager.services.accounts import email_of
from bai.node.manager.state import POLICY_FIELDS, UnknownPolicy
from bai.node.manager.state.records import Keypair, NewKeypair, Policy, PolicyFields
from bai.node.manager.state.team_records import TeamDirectory


async def resolve_concurrency_used(keypair: dict[str, Any], info: Info) -> int:
    sessions = await ctx(info).services.state.list_sessions(keypair["access_key"], ACTIVE_STATUSES)
    return len(sessions)


UserInfo = obj("UserInfo", lambda: {"email": S, "full_name": S})
KeyPair = obj(
    "KeyPair",
    lambda: {
        "id": S,
        "user_id": S,
        "full_name": S,
        "email": S,
        "user_info": UserInfo,
        "projects": L(S),
        "access_key": S,
        "secret_key": S,
        "is_active": B,
        "is_admin": B,
        "resource_policy": S,
        "created_at": DateTime,
        "modified_at": DateTime,
        "last_used": DateTime,
        "rate_limit": I,
        "num_queries": I,
        "user": UUID,
        "domain_name": S,
        "ssh_public_key": S,
        "ssh_private_key": S,
        "dotfiles": S,
        "bootstrap_script": S,
        "concurrency_limit": I,
        "concurrency_used": GraphQLField(I, resolve=resolve_concurrency_used),
    },
)
KeyPairList = list_of("KeyPairList", KeyPair)
KEYPAIR_FIELDS = field_names(KeyPair)

KeyPairResourcePolicy = obj(
    "KeyPairResourcePolicy",
    lambda: {
        "name": S,
        "created_at": DateTime,
        "default_for_unspecified": S,
        "total_resource_slots": JSONString,
        "max_session_lifetime": I,
        "max_concurrent_sessions": I,
        "max_containers_per_session": I,
        "idle_timeout": BigInt,
        "max_vfolder_count": I,
        "max_vfolder_size": BigInt,
        "allowed_vfolder_hosts": JSONString,
        "max_concurrent_sftp_sessions": I,
        "max_pending_session_count": I,
        "max_pending_session_resource_slots": JSONString,
        "max_priority": I,  # the highest priority its keypairs' sessions may have (0-100)
        # bai's idle detection by utilisation (null: not checked)
        "idle_cpu_pct": F,
        "idle_gpu_pct": F,
        "idle_window": F,
        # bai: sessions of several kernels a keypair may hold at once (each holds a Docker network); 0 = unlimited
        "max_session_networks": I,
    },
)


def keypair_item(row: Keypair, teams: TeamDirectory | None = None) -> dict[str, Any]:
    """A keypair as Backend.AI's `KeyPair`, with its user's email, name, domain and projects (`teams`)."""
    user = teams.users.get(row.user_uuid) if teams is not None else None
    email = user.email if user is not None else email_of(row.user_id)
    full_name = (user.full_name or None) if user is not None else None
    return {
        "id": row.access_key,
        "user_id": email,  # (Backend.AI's keypairs name their user by email: the same as `admin user list` prints)
        "full_name": full_name,
        "email": email,
        "user_info": {"email": email, "full_name": full_name},
        "projects": [p.name for p in teams.projects_of(user.uuid)] if teams is not None and user else [DEFAULT_GROUP],
        "access_key": row.access_key,
        "secret_key": row.secret_key,
        "is_active": row.is_active,
        "is_admin": row.is_admin,
        "resource_policy": row.resource_policy,
        "created_at": row.created_at,
        "modified_at": None,
        "last_used": None,
        "rate_limit": None,
        "num_queries": 0,
        "user": row.user_uuid or user_uuid(row.user_id),
        "domain_name": user.domain_name if user is not None else DEFAULT_DOMAIN,
        "ssh_public_key": None,
        "ssh_private_key": None,
        "dotfiles": None,
        "bootstrap_script": None,
        "concurrency_limit": None,
    }


def policy_item(row: Policy) -> dict[str, Any]:
    return {
        "name": row.name,
        "created_at": row.created_at,
        "default_for_unspecified": row.default_for_unspecified,
        "total_resource_slots": json.dumps(row.total_resource_slots or {}),
        "max_session_lifetime": int(row.max_session_lifetime or 0),
        "max_concurrent_sessions": row.max_concurrent_sessions,
        "max_containers_per_session": MAX_CLUSTER_SIZE,  # no per-policy limit in bai: the largest session
        "idle_timeout": int(row.idle_timeout or 0),
        "max_vfolder_count": row.max_vfolder_count or 0,
        "max_vfolder_size": row.max_vfolder_size or 0,
        "allowed_vfolder_hosts": None,
        "max_concurrent_sftp_sessions": None,
        # Backend.AI's null is no limit (bai stores 0)
        "max_pending_session_count": row.max_pending_session_count or None,
        "max_pending_session_resource_slots": None,
        "max_priority": row.max_priority,
        "idle_cpu_pct": row.idle_cpu_pct,
        "idle_gpu_pct": row.idle_gpu_pct,
        "idle_window": row.idle_window,
        "max_session_networks": row.max_session_networks,
    }


async def _keypairs(c: Context, args: dict[str, Any]) -> list[dict[str, Any]]:
    """Every keypair an admin may see (only one's own for a user), filtered by `email` / `is_active`."""
    rows = list((await c.services.accounts.keypairs(active_only=False)).values())
    if not c.is_admin:
        rows = [r for r in rows if r.access_key == c.access_key]
    if args.get("is_active") is not None:
        rows = [r for r in rows if r.is_active == args["is_active"]]
    items = [keypair_item(r, c.services.teams.directory) for r in rows]
    if args.get("email") is not None:
        items = [i for i in items if args["email"] in (i["user_id"], i["email"])]
    return items


async def resolve_keypair(_root: Any, info: Info, **args: Any) -> dict[str, Any] | None:
    c = ctx(info)
    access_key = args.get("access_key") or c.access_key
    if access_key == c.access_key:
        return keypair_item(c.keypair(), c.services.teams.directory)
    require_admin(info)
    row = await c.services.accounts.keypair(access_key)
    return keypair_item(row, c.services.teams.directory) if row else None


async def resolve_keypairs(_root: Any, info: Info, **args: Any) -> list[dict[str, Any]]:
    return await _keypairs(ctx(info), args)


async def resolve_keypair_list(_root: Any, info: Info, **args: Any) -> dict[str, Any]:
    return page(await _keypairs(ctx(info), args), args, KEYPAIR_FIELDS)


async def resolve_policy(_root: Any, info: Info, **args: Any) -> dict[str, Any] | None:
    c = ctx(info)
    own = c.keypair().resource_policy
    name = args.get("name") or own
    if name != own:
        require_admin(info)
    row = await c.services.accounts.policy(name)
    return policy_item(row) if row else None


async def resolve_policies(_root: Any, info: Info, **args: Any) -> list[dict[str, Any]]:
    c = ctx(info)
    rows = list((await c.services.accounts.policies()).values())
    if not c.is_admin:
        own = c.keypair().resource_policy
        rows = [r for r in rows if r.name == own]
    return [policy_item(r) for r in rows]


# -- mutations -----------------------------------------------------------------------------------------


def _failed(msg: str) -> dict[str, Any]:
    return {"ok": False, "msg": msg}


async def create_keypair(_root: Any, info: Info, **args: Any) -> dict[str, Any]:
    c = require_admin(info)
    user_id, props = args["user_id"].strip(), args.get("props") or {}
    if not user_id or "\0" in user_id:
        return _failed("user_id must be a non-empty string")
    fresh = auth.Keypair.generate()
    row = NewKeypair(
        fresh.access_key,
        fresh.secret_key,
        user_id,
        bool(props.get("is_admin") or False),
        props.get("resource_policy") or "default",
    )
    try:
        await c.services.accounts.create_keypair(row)
    except UnknownPolicy as e:
        return _failed(str(e))
    if props.get("is_active") is False:
        await c.services.accounts.update_keypair(fresh.access_key, is_active=False)
    created = await c.services.accounts.keypair(fresh.access_key)
    if created is None:  # (removed meanwhile)
        return _failed(f"no keypair {fresh.access_key}")
    return {"ok": True, "msg": "success", "keypair": keypair_item(created, c.services.teams.directory)}


async def modify_keypair(_root: Any, info: Info, **args: Any) -> dict[str, Any]:
    c = require_admin(info)
    access_key, props = args["access_key"], args.get("props") or {}
    policy: str | None = props.get("resource_policy")
    is_admin: bool | None = None
    is_active: bool | None = None
    if props.get("is_admin") is not None:
        if access_key == c.access_key and not props["is_admin"]:
            return _failed("you cannot take admin rights from the keypair you are using")
        is_admin = bool(props["is_admin"])
    if props.get("is_active") is not None:
        if access_key == c.access_key and not props["is_active"]:
            return _failed("you cannot deactivate the keypair you are using")
        is_active = bool(props["is_active"])
    if policy is None and is_admin is None and is_active is None:
        return {"ok": True, "msg": "nothing to change (bai keeps no rate limit or concurrency limit per keypair)"}
    try:
        found = await c.services.accounts.update_keypair(
            access_key, resource_policy=policy, is_active=is_active, is_admin=is_admin
        )
    except UnknownPolicy as e:
        return _failed(str(e))
    if not found:
        return _failed(f"no keypair {access_key}")
    if is_active is False:  # a deactivated keypair signs nothing more: its open streams end now
        c.request.app[STREAMS].close_all(access_key)
    return {"ok": True, "msg": "success"}


async def delete_keypair(_root: Any, info: Info, **args: Any) -> dict[str, Any]:
    c = require_admin(info)
    access_key = args["access_key"]
    if access_key == c.access_key:
        return _failed("you cannot delete the keypair you are using")
    active = await c.services.state.list_sessions(access_key, ACTIVE_STATUSES)
    if active:
        return _failed(f"keypair {access_key} has {len(active)} active session(s): terminate them first")
    if not await c.services.accounts.delete_keypair(access_key):
        return _failed(f"no keypair {access_key}")
    c.request.app[STREAMS].close_all(access_key)
    return {"ok": True, "msg": "success"}


NULLABLE = frozenset({"idle_cpu_pct", "idle_gpu_pct", "max_pending_session_count", "max_priority"})
NULL_IS = {"max_pending_session_count": 0}  # Backend.AI's null (no limit) as bai stores it


def _policy_fields(props: dict[str, Any], *, partial: bool) -> dict[str, Any]:
    """The props bai keeps, validated as the REST admin API validates them (a Problem otherwise)."""
    # (null turns a utilisation threshold off and the pending-session bound to unlimited; other fields given
    # as null are left as they are)
    body = {k: v for k, v in props.items() if k in POLICY_FIELDS and (v is not None or k in NULLABLE)}
    body.update({k: NULL_IS[k] for k, v in body.items() if v is None and k in NULL_IS})
    if isinstance(body.get("total_resource_slots"), str):
        try:
            body["total_resource_slots"] = safejson.loads(body["total_resource_slots"], what="total_resource_slots")
        except ValueError:
            raise Problem("invalid-api-params", "Invalid.", "total_resource_slots must be a JSON object") from None
    return parse_policy({"name": "-", **body}, partial=partial)


async def create_policy(_root: Any, info: Info, **args: Any) -> dict[str, Any]:
    c = require_admin(info)
    name = args["name"].strip()
    if not name:
        return _failed("a policy needs a name")
    try:
        fields = PolicyFields(**_policy_fields(args.get("props") or {}, partial=True))
    except Problem as e:
        return _failed(e.msg or e.title)
    if not await c.services.accounts.save_policy(name, fields, create=True):
        return _failed(f"resource policy {name!r} already exists")
    row = await c.services.accounts.policy(name)
    if row is None:  # (removed meanwhile)
        return _failed(f"no resource policy {name!r}")
    return {"ok": True, "msg": "success", "resource_policy": policy_item(row)}


async def modify_policy(_root: Any, info: Info, **args: Any) -> dict[str, Any]:
    c = require_admin(info)
    try:
        fields = PolicyFields(**_policy_fields(args.get("props") or {}, partial=True))
    except Problem as e:
        return _failed(e.msg or e.title)
    if not await c.services.accounts.save_policy(args["name"], fields, create=False):
        return _failed(f"no resource policy {args['name']!r}")
    return {"ok": True, "msg": "success"}


async def delete_policy(_root: Any, info: Info, **args: Any) -> dict[str, Any]:
    c = require_admin(info)
    why = await c.services.accounts.delete_policy(args["name"])
    return _failed(why) if why else {"ok": True, "msg": "success"}


def _input(name: str, fields: dict[str, Any]) -> GraphQLInputObjectType:
    return GraphQLInputObjectType(name, {k: GraphQLInputField(v) for k, v in fields.items()})


KeyPairInput = _input(
    "KeyPairInput", {"is_active": B, "is_admin": B, "resource_policy": S, "concurrency_limit": I, "rate_limit": I}
)
ModifyKeyPairInput = _input(
    "ModifyKeyPairInput",
    {"is_active": B, "is_admin": B, "resource_policy": S, "concurrency_limit": I, "rate_limit": I},
)
_POLICY_INPUT = {
    "default_for_unspecified": S,
    "total_resource_slots": JSONString,
    "max_session_lifetime": I,
    "max_concurrent_sessions": I,
    "max_concurrent_sftp_sessions": I,
    "max_containers_per_session": I,
    "idle_timeout": BigInt,
    "allowed_vfolder_hosts": JSONString,
    "max_vfolder_count": I,
    "max_vfolder_size": BigInt,
    "max_pending_session_count": I,
    "max_pending_session_resource_slots": JSONString,
    "max_priority": I,
    "idle_cpu_pct": F,
    "idle_gpu_pct": F,
    "idle_window": F,
    "max_session_networks": I,
}
CreatePolicyInput = _input("CreateKeyPairResourcePolicyInput", _POLICY_INPUT)
ModifyPolicyInput = _input("ModifyKeyPairResourcePolicyInput", _POLICY_INPUT)

CreateKeyPair = obj("CreateKeyPair", lambda: {"ok": B, "msg": S, "keypair": KeyPair})
OkMsg = obj("SimpleMutationResult", lambda: {"ok": B, "msg": S})
CreatePolicy = obj("CreateKeyPairResourcePolicy", lambda: {"ok": B, "msg": S, "resource_policy": KeyPairResourcePolicy})

QUERIES = {
    "keypair": GraphQLField(KeyPair, args=args_of(domain_name=S, access_key=S), resolve=resolve_keypair),
    "keypairs": GraphQLField(L(KeyPair), args=args_of(domain_name=S, email=S, is_active=B), resolve=resolve_keypairs),
    "keypair_list": GraphQLField(
        KeyPairList, args=page_args(domain_name=S, email=S, is_active=B), resolve=resolve_keypair_list
    ),
    "keypair_resource_policy": GraphQLField(KeyPairResourcePolicy, args=args_of(name=S), resolve=resolve_policy),
    "keypair_resource_policies": GraphQLField(L(KeyPairResourcePolicy), resolve=resolve_policies),
}

MUTATIONS = {
    "create_keypair": GraphQLField(
        CreateKeyPair,
        args={"user_id": GraphQLArgument(NN(S)), "props": GraphQLArgument(NN(KeyPairInput))},
        resolve=create_keypair,
    ),
    "modify_keypair": GraphQLField(
        OkMsg,
        args={"access_key": GraphQLArgument(NN(S)), "props": GraphQLArgument(NN(ModifyKeyPairInput))},
        resolve=modify_keypair,
    ),
    "delete_keypair": GraphQLField(OkMsg, args={"access_key": GraphQLArgument(NN(S))}, resolve=delete_keypair),
    "create_keypair_resource_policy": GraphQLField(
        CreatePolicy,
        args={"name": GraphQLArgument(NN(S)), "props": GraphQLArgument(NN(CreatePolicyInput))},
        resolve=create_policy,
    ),
    "modify_keypair_resource_policy": GraphQLField(
        OkMsg,
        args={"name": GraphQLArgument(NN(S)), "props": GraphQLArgument(NN(ModifyPolicyInput))},
        resolve=modify_policy,
    ),
    "delete_keypair_resource_policy": GraphQLField(OkMsg, args={"name": GraphQLArgument(NN(S))}, resolve=delete_policy),
}

__all__ = ["MUTATIONS", "QUERIES", "GraphQLError"]
