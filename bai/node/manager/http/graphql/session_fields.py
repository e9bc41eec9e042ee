"""Compute sessions and their containers (kernels): `compute_session`, `compute_session_list`,
`compute_container`, `compute_container_list` (and bai's older `session`)."""

from __future__ import annotations

import json
from typing import Any

from graphql import (
    GraphQLArgument,
    GraphQLError,
    GraphQLField,
    GraphQLInputField,
    GraphQLInputObjectType,
    GraphQLObjectType,
    GraphQLResolveInfo,
)

from bai.common.problems import Problem
from bai.common.status import SessionStatus, statuses_named
from bai.node.manager.http.graphql.base import (
    NN,
    UUID,
    B,
    BigInt,
    DateTime,
    I,
    JSONString,
    L,
    S,
    args_of,
    ctx,
    emails_by_access_key,
    field_names,
    list_of,
    obj,
    page,
    page_args,
)
from bai.node.manager.http.graphql.limits import QueryRefused
from bai.node.manager.http.represent import SessionView, session_graphql
from bai.node.manager.http.requests import parse_priority
from bai.node.manager.rules.access import may_act_on_keypair
from bai.node.manager.state.records import Session

DEFAULT_LIST_STATUSES = "PENDING,SCHEDULED,PULLING,PREPARING,RUNNING,RUNNING_DEGRADED,PREEMPTED,TERMINATING,ERROR"

ComputeContainer = obj(
    "ComputeContainer",
    lambda: {
        "id": UUID,
        "idx": I,
        "role": S,
        "hostname": S,
        "kernel_id": UUID,
        "cluster_idx": I,
        "local_rank": I,
        "cluster_role": S,
        "cluster_hostname": S,
        "session_id": UUID,
        "image": S,
        "architecture": S,
        "registry": S,
        "status": S,
        "status_changed": DateTime,
        "status_info": S,
        "status_data": JSONString,
        "created_at": DateTime,
        "terminated_at": DateTime,
        "starts_at": DateTime,
        "scheduled_at": DateTime,
        "abusing_report": JSONString,
        "agent": S,
        "agent_addr": S,
        "container_id": S,
        "resource_opts": JSONString,
        "occupied_slots": JSONString,
        "occupied_shares": JSONString,
        "live_stat": JSONString,
        "last_stat": JSONString,
        "preopen_ports": L(I),
        "service_ports": JSONString,
        "exit_code": I,
    },
)

ComputeSession: GraphQLObjectType = obj(
    "ComputeSession",
    lambda: {
        "id": UUID,
        "session_id": UUID,
        "main_kernel_id": UUID,
        "tag": S,
        "name": S,
        "type": S,
        "session_type": S,
        "main_kernel_role": S,
        "image": S,
        "architecture": S,
        "registry": S,
        "cluster_template": S,
        "cluster_mode": S,
        "cluster_size": I,
        "domain_name": S,
        "group_name": S,
        "group_id": S,
        "user_email": S,
        "full_name": S,
        "user_id": S,
        "access_key": S,
        "created_user_email": S,
        "created_user_id": S,
        "status": S,
        "status_changed": DateTime,
        "status_info": S,
        "status_data": JSONString,
        "status_history": JSONString,
        "created_at": DateTime,
        "started_at": DateTime,
        "terminated_at": DateTime,
        "starts_at": DateTime,
        "scheduled_at": DateTime,
        "startup_command": S,
        "result": S,
        "commit_status": S,
        "abusing_reports": L(JSONString),
        "idle_checks": JSONString,
        "agent_ids": L(S),
        "resource_opts": JSONString,
        "scaling_group": S,
        "service_ports": JSONString,
        "mounts": L(S),
        "vfolder_mounts": L(S),
        "occupying_slots": JSONString,
        "occupied_slots": JSONString,
        "requested_slots": JSONString,
        "priority": I,  # 0-100: the multifactor scheduling policy's priority factor
        "is_preemptible": B,  # whether preemption may stop it (Backend.AI's)
        "num_queries": BigInt,
        "queue_position": I,
        "inference_metrics": JSONString,
        "containers": L(ComputeContainer),
        "kernels": L(ComputeContainer),
        "dependencies": L(ComputeSession),  # the sessions it depends on (id, name and status)
    },
)
ComputeSessionList = list_of("ComputeSessionList", ComputeSession)
ComputeContainerList = list_of("ComputeContainerList", ComputeContainer)
SESSION_FIELDS = field_names(ComputeSession)
CONTAINER_FIELDS = field_names(ComputeContainer)


def _container_extras(kernel: dict[str, Any]) -> dict[str, Any]:
    return {
        **kernel,
        "idx": kernel["cluster_idx"],
        "role": kernel["cluster_role"],
        "hostname": kernel["cluster_hostname"],
        "kernel_id": kernel["id"],
        # its index in the whole session (main1 0, sub1 1 …), as BACKENDAI_CLUSTER_LOCAL_RANK
        "local_rank": 0 if kernel["cluster_role"] == "main" else kernel["cluster_idx"],
        "abusing_report": None,
    }


def _session_item(item: dict[str, Any], row: Session, users: dict[str, str]) -> dict[str, Any]:
    """bai's projection (`SessionView.to_graphql`) and what Backend.AI 23.09 adds to a ComputeSession."""
    email = users.get(row.access_key)
    item.update(
        {
            "main_kernel_role": "MAIN",
            "registry": item["containers"][0]["registry"] if item["containers"] else None,
            "cluster_template": None,
            "user_email": email,
            "created_user_email": email,
            "created_user_id": item["user_id"],
            "scheduled_at": None,
            "resource_opts": json.dumps({}),
            "mounts": [m["name"] for m in row.config.get("mounts") or []],
            "vfolder_mounts": [m["name"] for m in row.config.get("mounts") or []],
            "abusing_reports": [],
            "commit_status": None,
            "status_history": None,
            "num_queries": 0,
            "priority": row.priority,
            "is_preemptible": row.config.get("preemptible", True) is not False,
            "queue_position": None,
            "inference_metrics": None,
            "containers": [_container_extras(k) for k in item["containers"]],
            "kernels": [_container_extras(k) for k in item["kernels"]],
        }
    )
    return item


async def _items(info: GraphQLResolveInfo, rows: list[Session]) -> list[dict[str, Any]]:
    services = ctx(info).services
    kernels = await services.state.kernels_of_many([r.id for r in rows])  # one read, not one per session
    users = await emails_by_access_key(ctx(info))
    return [_session_item(await session_graphql(services, r, kernels.get(r.id, [])), r, users) for r in rows]


def _statuses(text: str | None) -> list[SessionStatus]:
    try:
        return statuses_named(text or DEFAULT_LIST_STATUSES)
    except ValueError as e:
        raise QueryRefused(f"status: {e}") from None


async def resolve_session_list(_root: Any, info: GraphQLResolveInfo, **args: Any) -> dict[str, Any]:
    c = ctx(info)
    statuses = _statuses(args.get("status"))
    actor, named = c.actor, args.get("access_key")
    domain_admin = actor.is_domain_admin and named in (None, "")
    if c.is_admin or domain_admin:
        owner = named or None  # (a domain admin: every session of its domain, below)
    elif named and may_act_on_keypair(c.services.teams.directory, actor, named):
        owner = named
    else:
        owner = c.access_key
    rows = await c.services.state.list_sessions(owner, statuses)
    if domain_admin:
        rows = [r for r in rows if r.domain_name == actor.domain]
    if args.get("domain_name"):
        rows = [r for r in rows if r.domain_name == args["domain_name"]]
    if args.get("group_id") or args.get("project_id"):
        project = str(args.get("group_id") or args.get("project_id"))
        rows = [r for r in rows if r.project_id == project]
    rows.sort(key=lambda r: r.created_at, reverse=True)  # newest first, as Backend.AI lists
    if args.get("filter") or args.get("order"):
        return page(await _items(info, rows), args, SESSION_FIELDS)
    limit, offset = args.get("limit") or 20, args.get("offset") or 0
    paged = rows[offset : offset + limit]
    return {"items": await _items(info, paged), "total_count": len(rows)}


async def resolve_session(_root: Any, info: GraphQLResolveInfo, **args: Any) -> dict[str, Any] | None:
    c = ctx(info)
    name = info.field_name
    ref = args.get("id") or args.get("session_id")
    if not ref:
        raise QueryRefused(f"{name} needs an id (a string)")
    rows = await c.services.state.find_sessions(ref, None if c.is_admin else c.access_key, active_only=False)
    exact = [r for r in rows if r.id == ref]
    return (await _items(info, exact[:1]))[0] if exact else None


async def _kernel_items(info: GraphQLResolveInfo, row: Session) -> list[dict[str, Any]]:
    services = ctx(info).services
    kernels = await services.state.kernels_of(row.id)
    view = SessionView(row, kernels, services.stats, services.teams.directory.projects)
    return [_container_extras(view.graphql_kernel(k)) for k in kernels]


async def resolve_container(_root: Any, info: GraphQLResolveInfo, **args: Any) -> dict[str, Any] | None:
    c = ctx(info)
    kernel_id = args.get("id")
    if not kernel_id:
        raise QueryRefused("compute_container needs an id (a string)")
    kernel = await c.services.state.get_kernel(kernel_id)
    if kernel is None:
        return None
    row = await c.services.state.get_session(kernel.session_id)
    if row is None or not c.is_admin and row.access_key != c.access_key:
        return None
    return next((k for k in await _kernel_items(info, row) if k["id"] == kernel_id), None)


async def resolve_container_list(_root: Any, info: GraphQLResolveInfo, **args: Any) -> dict[str, Any]:
    c = ctx(info)
    session_id = args.get("session_id")
    if not session_id:
        raise QueryRefused("compute_container_list needs a session_id (a string)")
    rows = await c.services.state.find_sessions(session_id, None if c.is_admin else c.access_key, active_only=False)
    exact = [r for r in rows if r.id == session_id]
    items = await _kernel_items(info, exact[0]) if exact else []
    if args.get("role"):
        items = [k for k in items if k["cluster_role"].lower() == args["role"].lower()]
    return page(items, args, CONTAINER_FIELDS)


async def containers_on_agent(info: GraphQLResolveInfo, agent_id: str, status: str | None) -> list[dict[str, Any]]:
    """The kernels an agent runs (of active sessions), for `Agent.compute_containers`."""
    services = ctx(info).services
    rows = await ctx(info).cached("active-sessions", lambda: services.state.list_sessions(None, _statuses(None)))
    kernels = await services.state.kernels_of_many([r.id for r in rows])
    out = []
    for row in rows:
        view = SessionView(row, kernels.get(row.id, []), services.stats, services.teams.directory.projects)
        for k in view.kernels:
            if k.agent_id == agent_id and (status is None or k.status == status.upper()):
                out.append(_container_extras(view.graphql_kernel(k)))
    return out


ModifyComputeSessionInput = GraphQLInputObjectType(
    "ModifyComputeSessionInput",
    {
        "id": GraphQLInputField(NN(S)),  # the session's id (or Backend.AI's global id of it)
        "name": GraphQLInputField(S),
        "priority": GraphQLInputField(I),
        "clientMutationId": GraphQLInputField(S),
    },
)
ModifiedSession = obj("ModifiedComputeSession", lambda: {"name": S, "priority": I, "id": S})
ModifyComputeSessionPayload = obj(
    "ModifyComputeSessionPayload", lambda: {"item": ModifiedSession, "clientMutationId": S}
)


def _session_id_of(global_or_plain: str) -> str:
    """A session id as given: plain, or Backend.AI's global id (base64 of "ComputeSessionNode:ID")."""
    import base64
    import binascii

    try:
        decoded = base64.b64decode(global_or_plain, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return global_or_plain
    kind, sep, rest = decoded.partition(":")
    return rest if sep and kind.endswith("Node") else global_or_plain


async def resolve_modify_session(_root: Any, info: GraphQLResolveInfo, input: dict[str, Any]) -> dict[str, Any]:
    """Backend.AI's modify_compute_session (Relay): a live session's name and priority, by its owner (within its
    policy's max_priority) or an admin."""
    c = ctx(info)
    ref = _session_id_of(str(input["id"]))
    rows = await c.services.state.find_sessions(ref, None if c.is_admin else c.access_key, active_only=False)
    row = next((r for r in rows if r.id == ref), None)
    if row is None:
        raise GraphQLError(f"no session {ref!r} of yours")
    try:
        if input.get("name") is not None:
            row = await c.services.kernel_ops.rename(row, input["name"])
        if input.get("priority") is not None:
            row = await c.services.lifecycle.set_priority(row, parse_priority(input["priority"]), c.is_admin)
    except Problem as p:
        raise GraphQLError(p.msg or p.title) from None
    return {
        "item": {"id": row.id, "name": row.name, "priority": row.priority},
        "clientMutationId": input.get("clientMutationId"),
    }


MUTATIONS = {
    "modify_compute_session": GraphQLField(
        ModifyComputeSessionPayload,
        args={"input": GraphQLArgument(NN(ModifyComputeSessionInput))},
        resolve=resolve_modify_session,
    ),
}

QUERIES = {
    "compute_session_list": GraphQLField(
        ComputeSessionList,
        args=page_args(status=S, access_key=S, domain_name=S, group_id=UUID, include_ancestors=B, project_id=UUID),
        resolve=resolve_session_list,
    ),
    "compute_session": GraphQLField(
        ComputeSession,
        args=args_of(id=UUID, domain_name=S, access_key=S, project_id=UUID),
        resolve=resolve_session,
    ),
    "session": GraphQLField(
        ComputeSession,
        args=args_of(id=UUID, session_id=S, domain_name=S, access_key=S),
        resolve=resolve_session,
    ),
    "compute_container": GraphQLField(ComputeContainer, args=args_of(id=UUID), resolve=resolve_container),
    "compute_container_list": GraphQLField(
        ComputeContainerList,
        args=page_args(session_id=GraphQLArgument(S), role=S),
        resolve=resolve_container_list,
    ),
}
