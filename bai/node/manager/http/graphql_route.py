"""`POST /admin/gql` (and `/admin/graphql`): Backend.AI's GraphQL API, with graphql-core.

A request is bounded before it runs (`graphql.limits`: its text, nesting, root fields, fields in all,
every argument's type and range): a refusal is a 400 problem that is also a GraphQL answer (`data:
null`, `errors`). A query that parses within bounds but does not fit the schema answers GraphQL's way,
200 with `errors`; so do resolvers' errors ("insufficient privilege" for a user asking what only
admins may see). Objects carry exactly the requested fields, in the requested order (the official
client zips column names with `item.values()`): graphql-core's execution does that.
"""

from __future__ import annotations

import inspect
from typing import Any

from aiohttp import web
from graphql import (
    ExecutionResult,
    GraphQLError,
    OperationDefinitionNode,
    OperationType,
    OverlappingFieldsCanBeMergedRule,
    execute,
    specified_rules,
    validate,
)

from bai.common.problems import PROBLEM_BASE, invalid
from bai.node.manager.http.context import read_json
from bai.node.manager.http.graphql.base import Context
from bai.node.manager.http.graphql.limits import QueryRefused, check_arguments, parse_bounded
from bai.node.manager.http.graphql.schema import SCHEMA
from bai.node.manager.http.maintenance_routes import FREEZE, frozen_problem

# every rule of the specification but one: whether fields of one response name can be merged costs
# time quadratic in their number (half a second for 500 fields of one name); without it, graphql-core
# merges them and runs the first one's arguments
RULES = [rule for rule in specified_rules if rule is not OverlappingFieldsCanBeMergedRule]


# Backend.AI fields bai does not offer, and why (said instead of graphql-core's "Cannot query field")
UNSUPPORTED = {
    "groups_by_name_and_domain": "ask groups_by_name with domain_name",
    "rescan_images": "bai has no registry catalogue to scan: agents report their images (`bai image pull` pulls)",
    "forget_image": "remove images with `bai image rm`",
    "vfolder_host_permissions": "bai keeps no per-host folder permissions: every user may use every host",
    **dict.fromkeys(
        ("set_quota_scope", "unset_quota_scope"),
        "a folder's size limit is its owner's resource policy's max_vfolder_size "
        "(`backend.ai admin keypair-resource-policy update --max-vfolder-size`)",
    ),
    **dict.fromkeys(
        ("create_network", "modify_network", "delete_network"),
        "bai makes no networks to share between sessions: each session has its own",
    ),
    **dict.fromkeys(
        ("endpoint", "endpoint_list", "routing", "routing_list", "endpoint_token", "endpoint_token_list"),
        "bai has no model services (Backend.AI's inference endpoints); run a server in a session and open it "
        "with `bai session app`",
    ),
}


def _unsupported(document: Any) -> list[dict[str, str]]:
    """What the request asks of Backend.AI that bai does not offer, each with the reason."""
    out = []
    for definition in document.definitions:
        for selection in getattr(getattr(definition, "selection_set", None), "selections", None) or ():
            name = getattr(getattr(selection, "name", None), "value", None)
            if name in UNSUPPORTED:
                out.append({"message": f"{name}: {UNSUPPORTED[name]}"})
    return out


def refused(e: GraphQLError) -> web.Response:
    """A 400 problem for a refused query (it does not parse or exceeds a bound: refused before anything
    runs; or an argument is invalid): `type`/`title`/`msg` as every refusal of the manager
    (Backend.AI's `graphql-error`, whose `data` is the list of errors: both official clients print it, and crash on
    anything else), and `errors` as a GraphQL answer has them."""
    errors = [{"message": e.message}]
    body = {
        "type": PROBLEM_BASE + "graphql-error",
        "title": "GraphQL-generated error.",
        "msg": e.message,
        "data": errors,
        "errors": errors,
    }
    return web.json_response(body, status=400, content_type="application/problem+json")


def _refusal(result: ExecutionResult) -> GraphQLError | None:
    """The error that refuses the whole request: an argument a resolver found invalid, or variables
    that do not fit their declared types (graphql-core reports those before anything runs)."""
    for error in result.errors or []:
        if isinstance(error.original_error, QueryRefused):
            return error.original_error
    if result.data is None and result.errors and all(not e.path for e in result.errors):
        first = result.errors[0]
        return QueryRefused(first.message) if first.message.startswith("Variable ") else None
    return None


async def run(request: web.Request, query: str, variables: dict[str, Any]) -> web.Response:
    try:
        document = parse_bounded(query)  # every bound of the text is checked here, before anything runs
        check_arguments(SCHEMA, document, variables)
    except QueryRefused as e:
        return refused(e)
    errors = validate(SCHEMA, document, RULES)
    if errors:
        reasons = _unsupported(document)
        return web.json_response({"data": None, "errors": reasons or [e.formatted for e in errors]})
    if request.app[FREEZE].frozen and any(
        isinstance(d, OperationDefinitionNode) and d.operation == OperationType.MUTATION for d in document.definitions
    ):
        raise frozen_problem()  # (a frozen manager changes nothing: maintenance_routes.py)
    result = execute(SCHEMA, document, context_value=Context(request), variable_values=variables)
    if inspect.isawaitable(result):
        result = await result
    assert isinstance(result, ExecutionResult)
    if (refusal := _refusal(result)) is not None:
        return refused(refusal)
    body: dict[str, Any] = {"data": result.data}
    if result.errors:
        body["errors"] = [e.formatted for e in result.errors]
    return web.json_response(body)


async def graphql(request: web.Request) -> web.Response:
    body = await read_json(request)
    if not isinstance(body, dict) or not isinstance(body.get("query"), str):
        raise invalid("a GraphQL request is a JSON object with a query string")
    variables = body.get("variables")
    if variables is None:
        variables = {}
    elif not isinstance(variables, dict):
        raise invalid("variables must be a JSON object")
    return await run(request, body["query"], variables)


def add_graphql_routes(app: web.Application) -> None:
    app.router.add_post("/admin/gql", graphql)
    app.router.add_post("/admin/graphql", graphql)
