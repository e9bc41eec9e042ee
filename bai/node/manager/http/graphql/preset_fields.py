"""Backend.AI's resource presets in GraphQL: `resource_preset(name)`, `resource_presets`, and the superadmins'
`create_resource_preset`, `modify_resource_preset`, `delete_resource_preset` (ok / msg, as its mutations answer).
Every field calls `services/resource_presets.py`."""

from __future__ import annotations

from typing import Any

from graphql import GraphQLError, GraphQLField, GraphQLInputField, GraphQLInputObjectType
from graphql import GraphQLResolveInfo as Info

from bai.common.problems import Problem
from bai.node.manager.http.graphql.base import NN, B, BigInt, Context, JSONString, L, S, args_of, ctx, obj
from bai.node.manager.http.graphql.user_fields import mutation
from bai.node.manager.services.resource_presets import ResourcePresets
from bai.node.manager.state.preset_records import ResourcePreset

ResourcePresetType = obj(
    "ResourcePreset",
    lambda: {
        "id": S,
        "name": S,
        "resource_slots": JSONString,
        "shared_memory": BigInt,
        "scaling_group_name": S,
    },
)


def preset_item(p: ResourcePreset) -> dict[str, Any]:
    return {
        "id": p.name,
        "name": p.name,
        "resource_slots": dict(p.resource_slots),
        "shared_memory": p.shared_memory,
        "scaling_group_name": p.scaling_group,
    }


def _service(c: Context) -> ResourcePresets:
    if c.services.presets is None:
        raise Problem("not-implemented", "Not implemented.", "this manager keeps no resource presets")
    return c.services.presets


async def resolve_preset(_root: Any, info: Info, name: str) -> dict[str, Any] | None:
    try:
        return preset_item(await _service(ctx(info)).get(name))
    except Problem as p:
        if p.status == 404:
            return None
        raise GraphQLError(p.msg or p.title) from None


async def resolve_presets(_root: Any, info: Info, scaling_group_name: str | None = None) -> list[dict[str, Any]]:
    """Every preset; with `scaling_group_name`, those for that scaling group and for every one."""
    every = await _service(ctx(info)).list()
    return [
        preset_item(p) for p in every if scaling_group_name is None or p.scaling_group in (None, scaling_group_name)
    ]


async def _create(c: Context, a: dict[str, Any]) -> dict[str, Any]:
    return {"resource_preset": preset_item(await _service(c).create(c.actor, a["name"], a["props"]))}


async def _modify(c: Context, a: dict[str, Any]) -> None:
    await _service(c).modify(c.actor, a["name"], a["props"])


async def _delete(c: Context, a: dict[str, Any]) -> None:
    await _service(c).delete(c.actor, a["name"])


def _input(name: str, required: bool) -> GraphQLInputObjectType:
    slots = NN(JSONString) if required else JSONString
    fields = {"resource_slots": slots, "shared_memory": S, "scaling_group_name": S}
    if not required:
        fields["name"] = S
    return GraphQLInputObjectType(name, {k: GraphQLInputField(v) for k, v in fields.items()})


CreateInput = _input("CreateResourcePresetInput", True)
ModifyInput = _input("ModifyResourcePresetInput", False)
CreateResult = obj("CreateResourcePreset", lambda: {"ok": B, "msg": S, "resource_preset": ResourcePresetType})
OkMsg = obj("ResourcePresetMutationResult", lambda: {"ok": B, "msg": S})

QUERIES = {
    "resource_preset": GraphQLField(ResourcePresetType, args=args_of(name=NN(S)), resolve=resolve_preset),
    "resource_presets": GraphQLField(
        L(ResourcePresetType), args=args_of(scaling_group_name=S), resolve=resolve_presets
    ),
}
MUTATIONS = {
    "create_resource_preset": GraphQLField(
        CreateResult, args=args_of(name=NN(S), props=NN(CreateInput)), resolve=mutation(_create)
    ),
    "modify_resource_preset": GraphQLField(
        OkMsg, args=args_of(name=NN(S), props=NN(ModifyInput)), resolve=mutation(_modify)
    ),
    "delete_resource_preset": GraphQLField(OkMsg, args=args_of(name=NN(S)), resolve=mutation(_delete)),
}
