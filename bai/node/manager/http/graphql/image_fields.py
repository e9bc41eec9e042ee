"""Images: `image`, `images` (what the connected agents have, with their aliases) and the mutations
`alias_image` / `dealias_image` (admins)."""

from __future__ import annotations

import contextlib
from typing import Any

from graphql import GraphQLArgument, GraphQLField, GraphQLResolveInfo

from bai.common import images as imagelib
from bai.node.link.base import AgentUnavailable, RemoteError
from bai.node.manager.http.graphql.base import (
    NN,
    B,
    BigInt,
    L,
    S,
    args_of,
    ctx,
    obj,
    require_admin,
)

KVPair = obj("KVPair", lambda: {"key": S, "value": S})
ResourceLimit = obj("ResourceLimit", lambda: {"key": S, "min": S, "max": S})
Image = obj(
    "Image",
    lambda: {
        "id": S,
        "name": S,
        "humanized_name": S,
        "tag": S,
        "registry": S,
        "architecture": S,
        "is_local": B,
        "digest": S,
        "labels": L(KVPair),
        "aliases": L(S),
        "size_bytes": BigInt,
        "resource_limits": L(ResourceLimit),
        "supported_accelerators": L(S),
        "installed": B,
        "installed_agents": L(S),
        "hash": S,
        # bai's own: the reference a session names
        "reference": S,
    },
)
ImageMutationResult = obj("ImageMutationResult", lambda: {"ok": B, "msg": S, "task_id": S})


def split_reference(ref: str) -> tuple[str, str, str]:
    """(registry, name, tag) of an image reference; bai's local images are in registry "local"."""
    registry = imagelib.registry_of(ref)
    rest = ref[len(registry) + 1 :] if registry else ref
    name, _, tag = rest.rpartition(":") if ":" in rest.rsplit("/", 1)[-1] else (rest, "", "latest")
    return registry or "local", name, tag


async def _images(info: GraphQLResolveInfo) -> list[dict[str, Any]]:
    images = ctx(info).services.images
    found: dict[str, dict[str, Any]] = {}
    with contextlib.suppress(AgentUnavailable, RemoteError, TimeoutError):
        for item in await images.list():
            ref = item["name"]
            if ref not in found:
                registry, name, tag = split_reference(ref)
                labels = item.get("labels") or {}
                found[ref] = {
                    "id": item.get("id") or ref,
                    "name": name,
                    "humanized_name": ref,
                    "tag": tag,
                    "registry": registry,
                    "architecture": "x86_64",
                    "is_local": registry == "local",
                    "digest": item.get("id"),
                    "labels": [{"key": k, "value": str(v)} for k, v in sorted(labels.items())],
                    "aliases": item.get("aliases") or [],
                    "size_bytes": int(item.get("size") or 0),
                    "resource_limits": [],
                    "supported_accelerators": ["cuda"] if any("cuda" in k for k in labels) else [],
                    "installed": True,
                    "installed_agents": [],
                    "hash": item.get("id"),
                    "reference": ref,
                }
            found[ref]["installed_agents"].append(item["agent"])
    return sorted(found.values(), key=lambda i: i["reference"])


async def resolve_images(_root: Any, info: GraphQLResolveInfo, **args: Any) -> list[dict[str, Any]]:
    items = await _images(info)
    if args.get("is_installed") is False:
        return []
    return items


async def resolve_image(_root: Any, info: GraphQLResolveInfo, **args: Any) -> dict[str, Any] | None:
    ref = args.get("reference") or ""
    aliases = ctx(info).services.images.aliases
    target = aliases.get(ref, ref)
    return next((i for i in await _images(info) if target in (i["reference"], i["id"])), None)


async def alias_image(_root: Any, info: GraphQLResolveInfo, **args: Any) -> dict[str, Any]:
    c = require_admin(info)
    alias, target = args["alias"], args["target"]
    if not alias or "/" in alias or not target:
        return {"ok": False, "msg": "an alias is a name without '/', and the target an image reference"}
    await c.services.images.set_alias(alias, target)
    return {"ok": True, "msg": "success"}


async def dealias_image(_root: Any, info: GraphQLResolveInfo, **args: Any) -> dict[str, Any]:
    c = require_admin(info)
    if not await c.services.images.remove_alias(args["alias"]):
        return {"ok": False, "msg": f"no alias {args['alias']!r} set with `bai image alias` or alias_image"}
    return {"ok": True, "msg": "success"}


QUERIES = {
    "image": GraphQLField(
        Image, args={"reference": GraphQLArgument(NN(S)), "architecture": GraphQLArgument(S)}, resolve=resolve_image
    ),
    "images": GraphQLField(
        L(Image),
        args=args_of(is_installed=B, is_operation=B, image_filters=L(S)),
        resolve=resolve_images,
    ),
}

MUTATIONS = {
    "alias_image": GraphQLField(
        ImageMutationResult,
        args={"alias": GraphQLArgument(NN(S)), "target": GraphQLArgument(NN(S)), "architecture": GraphQLArgument(S)},
        resolve=alias_image,
    ),
    "dealias_image": GraphQLField(
        ImageMutationResult,
        args={"alias": GraphQLArgument(NN(S)), "architecture": GraphQLArgument(S)},
        resolve=dealias_image,
    ),
}
