"""`POST /admin/gql`: the queries of the official client's `ps`, `session list` and `session info`."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from bai.common.problems import PROBLEM_BASE, invalid
from bai.common.status import SessionStatus
from bai.node.manager.gql import (
    Field,
    GraphQLError,
    QueryRefused,
    page_arguments,
    parse,
    project,
    str_argument,
)
from bai.node.manager.http import SETTINGS, read_json, services_of
from bai.node.manager.represent import session_graphql

DEFAULT_LIST_STATUSES = "PENDING,SCHEDULED,PULLING,PREPARING,RUNNING,RUNNING_DEGRADED,TERMINATING,ERROR"


async def resolve(request: web.Request, f: Field, variables: dict[str, Any]) -> Any:
    services = services_of(request)
    sessions = services.sessions
    access_key, is_admin = request["access_key"], request["is_admin"]
    if f.name == "keypair":
        kp = request.app[SETTINGS]["keypairs"][access_key]
        return {
            "user_id": kp["user_id"],
            "access_key": kp["access_key"],
            "secret_key": kp["secret_key"],
            "is_active": bool(kp["is_active"]),
            "is_admin": bool(kp["is_admin"]),
            "resource_policy": kp["resource_policy"],
            "created_at": kp["created_at"],
        }
    if f.name == "compute_session_list":
        limit, offset = page_arguments(f, variables)
        statuses_text = str_argument(f, "status", variables) or DEFAULT_LIST_STATUSES
        try:
            statuses = [SessionStatus(s.strip().upper()) for s in statuses_text.split(",") if s.strip()]
        except ValueError as e:
            raise QueryRefused(f"status: {e}") from None
        owner = str_argument(f, "access_key", variables) if is_admin else access_key
        rows = await sessions.list(owner, statuses)
        rows.sort(key=lambda r: r["created_at"], reverse=True)  # newest first, as Backend.AI lists
        page = rows[offset : offset + limit]
        kernels = await sessions.kernels_of_many([r["id"] for r in page])  # one read, not one per session
        items = [await session_graphql(sessions, r, kernels.get(r["id"], [])) for r in page]
        return {"items": items, "total_count": len(rows)}
    if f.name in ("compute_session", "session"):
        ref = str_argument(f, "id", variables) or str_argument(f, "session_id", variables)
        if not ref:
            raise QueryRefused(f"{f.name} needs an id (a string)")
        rows = await sessions.find(ref, None if is_admin else access_key, active_only=False)
        exact = [r for r in rows if r["id"] == ref]
        return await session_graphql(sessions, exact[0]) if exact else None
    if f.name == "vfolder_list":
        limit, offset = page_arguments(f, variables)
        if services.vfolders is None:
            return {"items": [], "total_count": 0}
        rows = await services.vfolders.visible(access_key, False)
        page = rows[offset : offset + limit]
        return {"items": [vfolder_item(r) for r in page], "total_count": len(rows)}
    raise GraphQLError(f"Cannot query field '{f.name}' on type 'Queries'")


def vfolder_item(row: dict[str, Any]) -> dict[str, Any]:
    """A folder with the field names of Backend.AI's `VirtualFolder` GraphQL type."""
    return {
        "id": row["id"],
        "host": row["host"],
        "name": row["name"],
        "created_at": row["created_at"],
        "creator": row["owner"],
        "user": row["owner"],
        "group": None,
        "group_name": None,
        "permission": row["permission"],
        "ownership_type": "user",
        "usage_mode": row["usage_mode"],
        "status": row["status"],
        "is_owner": bool(row["is_owner"]),
        "cloneable": False,
        "max_files": 0,
        "max_size": 0,
    }


def refused(e: GraphQLError) -> web.Response:
    """A 400 problem for a refused query (it does not parse or exceeds a bound: refused before anything
    runs; or a resolver's argument is invalid): `type`/`title`/`msg` as every refusal of the manager
    (Backend.AI's `graphql-error`), with `data: null` and `errors` as a GraphQL answer has them."""
    body = {
        "type": PROBLEM_BASE + "graphql-error",
        "title": "GraphQL-generated error.",
        "msg": str(e),
        "data": None,
        "errors": [{"message": str(e)}],
    }
    return web.json_response(body, status=400, content_type="application/problem+json")


async def graphql(request: web.Request) -> web.Response:
    body = await read_json(request)
    if not isinstance(body, dict) or not isinstance(body.get("query"), str):
        raise invalid("a GraphQL request is a JSON object with a query string")
    variables = body.get("variables")
    if variables is None:
        variables = {}
    elif not isinstance(variables, dict):
        raise invalid("variables must be a JSON object")
    try:
        fields = parse(body["query"])  # every bound is checked here, before any resolver runs
    except GraphQLError as e:  # a syntax error too: nothing ran
        return refused(e)
    try:
        data = {}
        for f in fields:
            data[f.alias] = project(await resolve(request, f, variables), f.selections)
    except QueryRefused as e:
        return refused(e)
    except GraphQLError as e:
        return web.json_response({"data": None, "errors": [{"message": str(e)}]})
    return web.json_response({"data": data})


def add_graphql_routes(app: web.Application) -> None:
    app.router.add_post("/admin/gql", graphql)
    app.router.add_post("/admin/graphql", graphql)
