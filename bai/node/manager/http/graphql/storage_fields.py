"""Storage volumes (bai's vfolder hosts: `storage_volume`, `storage_volume_list`, admins) and virtual
folders (`vfolder_list`: the caller's own and those shared with them)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Awaitable, Callable
from typing import Any

from graphql import GraphQLArgument, GraphQLField
from graphql import GraphQLResolveInfo as Info

from bai.node.manager.http.graphql.base import (
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
    ctx,
    emails_by_access_key,
    field_names,
    list_of,
    obj,
    page,
    page_args,
    require_admin,
)
from bai.node.manager.services.vfolder_service import shown_permission
from bai.node.manager.state.records import SeenVFolder

StorageVolume = obj(
    "StorageVolume",
    lambda: {
        "id": S,
        "backend": S,
        "fsprefix": S,
        "path": S,
        "capabilities": L(S),
        "hardware_metadata": JSONString,
        "performance_metric": JSONString,
        "usage": JSONString,
    },
)
StorageVolumeList = list_of("StorageVolumeList", StorageVolume)
VOLUME_FIELDS = field_names(StorageVolume)

VirtualFolder = obj(
    "VirtualFolder",
    lambda: {
        "id": UUID,
        "host": S,
        "quota_scope_id": S,
        "name": S,
        "user": UUID,
        "user_email": S,
        "group": UUID,
        "group_name": S,
        "creator": S,
        "domain_name": S,
        "unmanaged_path": S,
        "usage_mode": S,
        "permission": S,
        "ownership_type": S,
        "max_files": I,
        "max_size": BigInt,
        "created_at": DateTime,
        "last_used": DateTime,
        "num_files": I,
        "cur_size": BigInt,
        "cloneable": B,
        "status": S,
        "is_owner": B,
    },
)
VirtualFolderList = list_of("VirtualFolderList", VirtualFolder)
VFOLDER_FIELDS = field_names(VirtualFolder)


def _volumes(c: Context) -> list[dict[str, Any]]:
    vfolders = c.services.vfolders
    if vfolders is None:
        return []
    out = []
    for name, root in sorted(vfolders.hosts.items()):
        try:
            du = shutil.disk_usage(root)
            usage = json.dumps({"capacity_bytes": du.total, "used_bytes": du.used})
        except OSError:
            usage = None
        out.append(
            {
                "id": name,
                "backend": "vfs",
                "fsprefix": ".",
                "path": str(root),
                "capabilities": ["vfolder", "quota"],
                "hardware_metadata": json.dumps({}),
                "performance_metric": json.dumps({}),
                "usage": usage,
            }
        )
    return out


async def resolve_volume(_root: Any, info: Info, **args: Any) -> dict[str, Any] | None:
    c = require_admin(info)
    return next((v for v in _volumes(c) if v["id"] == args.get("id")), None)


async def resolve_volume_list(_root: Any, info: Info, **args: Any) -> dict[str, Any]:
    c = require_admin(info)
    return page(_volumes(c), args, VOLUME_FIELDS)


def vfolder_item(
    row: SeenVFolder, projects: dict[str, Any] | None = None, emails: dict[str, str] | None = None
) -> dict[str, Any]:
    """A folder with the field names of Backend.AI's `VirtualFolder` GraphQL type (`projects`: by id, to name its
    project; `emails`: by access key, to name its owner as Backend.AI does, by email)."""
    project = (projects or {}).get(row.project_id) if row.project_id else None
    email = (emails or {}).get(row.owner)
    return {
        "id": row.id,
        "host": row.host,
        "quota_scope_id": None,
        "name": row.name,
        "created_at": row.created_at,
        "creator": email or row.owner,
        "user": row.owner,
        "user_email": email,
        "group": row.project_id,
        "group_name": project.name if project is not None else None,
        "domain_name": "default",
        "unmanaged_path": None,
        "permission": shown_permission(row),
        "ownership_type": "group" if row.project_id else "user",
        "usage_mode": row.usage_mode,
        "status": row.status,
        "is_owner": row.is_owner,
        "cloneable": row.cloneable,
        "max_files": 0,
        "max_size": 0,
        "last_used": None,
        "num_files": None,
        "cur_size": None,
    }


def folder_list(which: str) -> Callable[..., Awaitable[dict[str, Any]]]:
    """A resolver of folders: `all` (the caller's own, shared with them and of their projects; a superadmin's:
    every folder), `own`, `invited` (shared with them by others), `project` (their projects')."""

    async def resolve(_root: Any, info: Info, **args: Any) -> dict[str, Any]:
        c = ctx(info)
        if c.services.vfolders is None:
            return {"items": [], "total_count": 0}
        everyone = which == "all" and c.actor.is_superadmin
        rows = await c.services.vfolders.visible(c.access_key, everyone)
        if which == "project":
            rows = [r for r in rows if r.project_id is not None]
        elif which != "all":
            rows = [r for r in rows if r.project_id is None and r.is_owner == (which == "own")]
        if args.get("group_id"):
            rows = [r for r in rows if r.project_id == str(args["group_id"])]
        projects = c.services.teams.directory.projects
        emails = await emails_by_access_key(c)
        return page([vfolder_item(r, projects, emails) for r in rows], args, VFOLDER_FIELDS)

    return resolve


resolve_vfolder_list = folder_list("all")


QUERIES = {
    "storage_volume": GraphQLField(StorageVolume, args={"id": GraphQLArgument(NN(S))}, resolve=resolve_volume),
    "storage_volume_list": GraphQLField(StorageVolumeList, args=page_args(), resolve=resolve_volume_list),
    "vfolder_list": GraphQLField(
        VirtualFolderList,
        args=page_args(domain_name=S, group_id=UUID, access_key=S),
        resolve=resolve_vfolder_list,
    ),
    **{
        f"vfolder_{which}_list": GraphQLField(VirtualFolderList, args=page_args(), resolve=folder_list(which))
        for which in ("own", "invited", "project")
    },
}
