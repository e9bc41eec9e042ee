"""What every domain of the schema shares: scalars, the request's context, privilege, paged lists,
and the filter / order of Backend.AI's paginated lists (`minilang`)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiohttp import web
from graphql import (
    GraphQLArgument,
    GraphQLBoolean,
    GraphQLError,
    GraphQLField,
    GraphQLFloat,
    GraphQLID,
    GraphQLInt,
    GraphQLList,
    GraphQLNonNull,
    GraphQLObjectType,
    GraphQLOutputType,
    GraphQLResolveInfo,
    GraphQLScalarType,
    GraphQLString,
)
from graphql.language import StringValueNode, ValueNode

from bai.common import safejson
from bai.node.manager.http.context import SETTINGS, services_of
from bai.node.manager.http.graphql import minilang
from bai.node.manager.rules.access import Actor
from bai.node.manager.services import Services
from bai.node.manager.state.records import Keypair
from bai.node.manager.state.team_records import DEFAULT_DOMAIN as DEFAULT_DOMAIN
from bai.node.manager.state.team_records import DEFAULT_PROJECT, DEFAULT_PROJECT_ID, email_of
from bai.node.manager.state.team_records import user_uuid as user_uuid

DEFAULT_GROUP = DEFAULT_PROJECT
DEFAULT_GROUP_ID = DEFAULT_PROJECT_ID

Cached = TypeVar("Cached")  # what a request-wide cache entry holds


# -- scalars -------------------------------------------------------------------------------------------


def _string_literal(node: ValueNode, _variables: Any = None) -> str:
    if isinstance(node, StringValueNode):
        return node.value
    raise GraphQLError("expected a string")


def _parse_json(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return safejson.loads(value, what="a JSONString")
        except ValueError as e:
            raise GraphQLError(f"not a JSON string: {value[:40]!r} ({e})") from None
    return value


def _serialize_json(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _parse_uuid(value: Any) -> str:
    if not isinstance(value, str):
        raise GraphQLError("a UUID is a string")
    return value


def _parse_bigint(value: Any) -> int:
    if isinstance(value, bool):
        raise GraphQLError("BigInt cannot represent a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit() and len(value) < 30:
        return int(value)
    raise GraphQLError(f"BigInt cannot represent {str(value)[:40]!r}")


def _bigint_literal(node: ValueNode, _variables: Any = None) -> int:
    value = getattr(node, "value", None)
    if isinstance(value, str) and len(value) < 30:
        return _parse_bigint(value)
    raise GraphQLError("expected an integer")


def _json_literal(node: ValueNode, _variables: Any = None) -> Any:
    return _parse_json(_string_literal(node))


UUID = GraphQLScalarType("UUID", serialize=str, parse_value=_parse_uuid, parse_literal=_string_literal)
JSONString = GraphQLScalarType(
    "JSONString", serialize=_serialize_json, parse_value=_parse_json, parse_literal=_json_literal
)
DateTime = GraphQLScalarType("DateTime", serialize=str, parse_value=str, parse_literal=_string_literal)
BigInt = GraphQLScalarType(
    "BigInt", serialize=lambda v: int(v), parse_value=_parse_bigint, parse_literal=_bigint_literal
)

S, I, B, F = GraphQLString, GraphQLInt, GraphQLBoolean, GraphQLFloat  # noqa: E741 - short, as in a schema
ID = GraphQLID


def L(t: Any) -> GraphQLList[Any]:  # noqa: N802 - reads as the type it is
    return GraphQLList(t)


def NN(t: Any) -> GraphQLNonNull[Any]:  # noqa: N802
    return GraphQLNonNull(t)


# -- the request ---------------------------------------------------------------------------------------


@dataclass
class Context:
    """What resolvers work with: the services, who asks, and a cache for the request."""

    request: web.Request
    cache: dict[str, Any] = field(default_factory=dict)

    @property
    def services(self) -> Services:
        return services_of(self.request)

    @property
    def access_key(self) -> str:
        return str(self.request["access_key"])

    @property
    def is_admin(self) -> bool:
        return bool(self.request["is_admin"])

    @property
    def settings(self) -> dict[str, Any]:
        return self.request.app[SETTINGS]

    @property
    def actor(self) -> Actor:
        """Who asks, as the rules of teams see it (`rules/access.py`)."""
        if "actor" not in self.cache:
            self.cache["actor"] = self.services.teams.actor_for(self.keypair())
        actor: Actor = self.cache["actor"]
        return actor

    def keypair(self) -> Keypair:
        """The caller's keypair (it signed the request: it is active)."""
        keypair = self.services.accounts.active_keypair(self.access_key)
        if keypair is None:  # (deactivated or removed since the request was authenticated)
            raise GraphQLError(f"keypair {self.access_key} does not exist or is inactive")
        return keypair

    async def cached(self, key: str, make: Callable[[], Awaitable[Cached]]) -> Cached:
        if key not in self.cache:
            self.cache[key] = await make()
        value: Cached = self.cache[key]  # what `make` gave for this key
        return value


def ctx(info: GraphQLResolveInfo) -> Context:
    context: Context = info.context
    return context


def require_admin(info: GraphQLResolveInfo) -> Context:
    """The context, for an admin; a GraphQL error for anyone else."""
    c = ctx(info)
    if not c.is_admin:
        raise GraphQLError("insufficient privilege: only admin keypairs may do this")
    return c


# -- objects and paged lists ---------------------------------------------------------------------------


def obj(name: str, fields: Callable[[], dict[str, Any]], description: str | None = None) -> GraphQLObjectType:
    """An object type from {field: type or GraphQLField} (a thunk, so types may refer to each other)."""

    def thunk() -> dict[str, GraphQLField]:
        return {k: v if isinstance(v, GraphQLField) else GraphQLField(v) for k, v in fields().items()}

    return GraphQLObjectType(name, thunk, description=description)


def list_of(name: str, item: GraphQLOutputType) -> GraphQLObjectType:
    """Backend.AI's paginated list: `{items, total_count}`."""
    return GraphQLObjectType(name, lambda: {"items": GraphQLField(NN(L(item))), "total_count": GraphQLField(NN(I))})


def page_args(**more: Any) -> dict[str, GraphQLArgument]:
    """`limit` and `offset` (checked by limits.check_arguments), `filter`, `order` and more."""
    args = {
        "limit": GraphQLArgument(I, default_value=20),
        "offset": GraphQLArgument(I, default_value=0),
        "filter": GraphQLArgument(S),
        "order": GraphQLArgument(S),
    }
    for k, v in more.items():
        args[k] = v if isinstance(v, GraphQLArgument) else GraphQLArgument(v)
    return args


def args_of(**kw: Any) -> dict[str, GraphQLArgument]:
    return {k: v if isinstance(v, GraphQLArgument) else GraphQLArgument(v) for k, v in kw.items()}


def page(
    items: list[dict[str, Any]],
    args: dict[str, Any],
    fields: set[str] | None = None,
    default_order: str | None = None,
) -> dict[str, Any]:
    """Filter (`filter`), sort (`order`, else `default_order`) and page (`limit`, `offset`) items that
    are already projected (their keys are the type's field names)."""
    names = fields if fields is not None else (set(items[0]) if items else set())
    try:
        if args.get("filter"):
            predicate = minilang.parse_filter(args["filter"], names)
            items = [i for i in items if predicate(i)]
        order = args.get("order") or default_order
        if order:
            items = minilang.sort(items, minilang.parse_order(order, names))
    except minilang.MinilangError as e:
        raise GraphQLError(str(e)) from None
    limit = args.get("limit")
    offset = args.get("offset") or 0
    limit = 20 if limit is None else limit
    return {"items": items[offset : offset + limit], "total_count": len(items)}


def field_names(t: GraphQLObjectType) -> set[str]:
    return set(t.fields)


async def emails_by_access_key(c: Context) -> dict[str, str]:
    """Access key -> the email of its user, as `user_list` prints it (every keypair, read once per request)."""

    async def read() -> dict[str, str]:
        rows = await c.services.accounts.keypairs(active_only=False)
        users = c.services.teams.directory.users
        return {ak: users[r.user_uuid].email if r.user_uuid in users else email_of(r.user_id) for ak, r in rows.items()}

    return await c.cached("emails", read)
