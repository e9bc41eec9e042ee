"""Backend.AI's inter-container networks (`networks`, `network`: Relay style, what `backend.ai network list` asks)
and storage quota scopes (`quota_scope`: what `backend.ai admin quota-scope get` asks).

bai makes no networks to share between sessions: each session has its own (a cluster session's kernels reach each
other on it), so `networks` is an empty connection and `network` is null. A quota scope is a user's or a project's
folders on one host: bai reports their usage; its limit is per folder (the owner's resource policy's
`max_vfolder_size`), so `hard_limit_bytes` is that, or null when there is none."""

from __future__ import annotations

import asyncio
from typing import Any

from graphql import GraphQLArgument, GraphQLError, GraphQLField
from graphql import GraphQLResolveInfo as Info

from bai.node.manager.http.graphql.base import NN, B, BigInt, DateTime, I, JSONString, L, S, ctx, obj
from bai.node.manager.services import vfolder_fs as fsops

Network = obj(
    "Network",
    lambda: {
        "id": NN(S),
        "row_id": S,
        "name": S,
        "ref_name": S,
        "driver": S,
        "domain_name": S,
        "project": S,
        "options": JSONString,
        "created_at": DateTime,
        "updated_at": DateTime,
    },
)
NetworkEdge = obj("NetworkEdge", lambda: {"node": Network, "cursor": NN(S)})
NetworkPageInfo = obj(
    "NetworkPageInfo", lambda: {"hasNextPage": NN(B), "hasPreviousPage": NN(B), "startCursor": S, "endCursor": S}
)
NetworkConnection = obj(
    "NetworkConnection", lambda: {"edges": NN(L(NetworkEdge)), "count": I, "pageInfo": NN(NetworkPageInfo)}
)

QuotaDetails = obj("QuotaDetails", lambda: {"usage_bytes": BigInt, "usage_count": BigInt, "hard_limit_bytes": BigInt})
QuotaScope = obj(
    "QuotaScope",
    lambda: {"id": NN(S), "quota_scope_id": NN(S), "storage_host_name": NN(S), "details": NN(QuotaDetails)},
)


async def resolve_networks(_root: Any, info: Info, **_args: Any) -> dict[str, Any]:
    no_page = {"hasNextPage": False, "hasPreviousPage": False, "startCursor": None, "endCursor": None}
    return {"edges": [], "count": 0, "pageInfo": no_page}


async def resolve_network(_root: Any, info: Info, **_args: Any) -> None:
    return None


def _uuid_text(text: str) -> str:
    return text.replace("-", "").lower()


async def resolve_quota_scope(_root: Any, info: Info, storage_host_name: str, quota_scope_id: str) -> dict[str, Any]:
    """`user:<uuid>` or `project:<uuid>` on a host: the usage of that user's (or project's) folders there. A user
    sees its own scope and its projects'; admins every scope."""
    c = ctx(info)
    vfolders = c.services.vfolders
    if vfolders is None or storage_host_name not in vfolders.hosts:
        raise GraphQLError(f"no storage host {storage_host_name!r}")
    kind, _, ref = quota_scope_id.partition(":")
    directory = c.services.teams.directory
    actor = c.actor
    keypairs = await c.services.accounts.keypairs(active_only=False)
    if kind == "user":
        user = next((u for u in directory.users.values() if _uuid_text(u.uuid) == _uuid_text(ref)), None)
        if user is None:
            raise GraphQLError(f"no user {ref!r}")
        if not (c.is_admin or (actor.user is not None and actor.user.uuid == user.uuid)):
            raise GraphQLError("insufficient privilege: a user sees only its own quota scope")
        owners = {ak for ak, kp in keypairs.items() if _uuid_text(kp.user_uuid) == _uuid_text(user.uuid)}
        policy_of = next((kp.resource_policy for kp in keypairs.values() if kp.user_uuid == user.uuid), "default")
    elif kind == "project":
        project = next((p for p in directory.projects.values() if _uuid_text(p.id) == _uuid_text(ref)), None)
        if project is None:
            raise GraphQLError(f"no project {ref!r}")
        if not (c.is_admin or project.id in actor.projects):
            raise GraphQLError("insufficient privilege: a user sees only its projects' quota scopes")
        owners = {f"project:{project.id}"}
        policy_of = "default"
    else:
        raise GraphQLError("quota_scope_id is user:<user uuid> or project:<project uuid>")
    every = await vfolders.visible(c.access_key, True)
    folders = [f for f in every if f.owner in owners and f.host == storage_host_name]
    used = files = 0
    for folder in folders:
        b, n = await asyncio.to_thread(fsops.usage, vfolders.path_of(folder))
        used, files = used + b, files + n
    policy = (await c.services.accounts.policies()).get(policy_of)
    limit = policy.max_vfolder_size if policy is not None and policy.max_vfolder_size > 0 else None
    details = {"usage_bytes": used, "usage_count": files, "hard_limit_bytes": limit}
    return {
        "id": f"{storage_host_name}/{quota_scope_id}",
        "quota_scope_id": quota_scope_id,
        "storage_host_name": storage_host_name,
        "details": details,
    }


_RELAY_ARGS = {
    name: GraphQLArgument(t)
    for name, t in {"first": I, "last": I, "offset": I, "after": S, "before": S, "filter": S, "order": S}.items()
}
QUERIES = {
    "networks": GraphQLField(NetworkConnection, args=_RELAY_ARGS, resolve=resolve_networks),
    "network": GraphQLField(Network, args={"id": GraphQLArgument(NN(S))}, resolve=resolve_network),
    "quota_scope": GraphQLField(
        QuotaScope,
        args={"storage_host_name": GraphQLArgument(NN(S)), "quota_scope_id": GraphQLArgument(NN(S))},
        resolve=resolve_quota_scope,
    ),
}
