"""HTTP API of virtual folders and dotfiles, under Backend.AI's paths (reference spec §9).

Signed: `/folders…` and `/user-config/dotfiles`. Unsigned but token-bound (as Backend.AI's storage
proxy): `PATCH|HEAD /folders/_/tus/upload?token=…` (TUS 1.0 subset: always 204 on success) and
`GET /folders/_/download?token=…` (200 with Content-Length).
Parameters come from the JSON body when there is one, else from the query string (spec §2).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import stat
import uuid
from datetime import datetime
from typing import Any

import msgspec
from aiohttp import web

from bai.common.problems import Problem, invalid
from bai.node.manager.http.context import SETTINGS, body_chunk, read_json, services_of
from bai.node.manager.services import vfolder_fs as fsops
from bai.node.manager.services.accounts import Accounts
from bai.node.manager.services.vfolder_service import OWNER, WRITE, VFolders
from bai.node.manager.state.records import Dotfile, SeenVFolder

log = logging.getLogger("bai.vfolders")
VFOLDERS = web.AppKey("vfolders", VFolders)
PUBLIC_PATHS = {"/folders/_/tus/upload", "/folders/_/download"}
DOWNLOAD_CHUNK = 4 * 1024 * 1024
MAX_CHUNK = 64 * 1024 * 1024
MAX_MKDIR_PATHS = 1000


def service(request: web.Request) -> VFolders:
    return request.app[VFOLDERS]


async def params(request: web.Request) -> dict[str, Any]:
    body = await read_json(request) if request.body_exists else {}
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    return {**request.query, **body}


def _bool(value: Any) -> bool:
    return value is True or str(value).lower() in ("1", "true", "yes")


def accounts(request: web.Request) -> Accounts:
    return services_of(request).accounts


async def folder_of(request: web.Request, need: str = "read", status: str = "ready") -> SeenVFolder:
    return await service(request).resolve(
        request.match_info["name"], request["access_key"], request["is_admin"], need, status
    )


def base_url(request: web.Request) -> str:
    return f"{request.scheme}://{request.host}"


# -- folders -------------------------------------------------------------------------------------------


async def hosts(request: web.Request) -> web.Response:
    svc = service(request)
    return web.json_response(
        {
            "default": svc.default_host,
            "allowed": sorted(svc.hosts),
            "volume_info": {name: {"backend": "vfs", "capabilities": ["quota"]} for name in svc.hosts},
        }
    )


async def all_hosts(request: web.Request) -> web.Response:
    """Backend.AI's superadmin listing of every host (bai: admins)."""
    admin_only(request, "list every vfolder host")
    svc = service(request)
    return web.json_response({"default": svc.default_host, "allowed": sorted(svc.hosts)})


async def allowed_types(request: web.Request) -> web.Response:
    return web.json_response(["user", "group"])  # a user's folders, and its projects' (Backend.AI's groups)


def admin_only(request: web.Request, what: str) -> None:
    if not request["is_admin"]:
        raise Problem("insufficient-privilege", "Insufficient privilege.", f"only admins may {what}")


def no_groups(what: str) -> Problem:
    """A request for a group's (project's) or domain's thing bai does not keep: a 400, never a 5xx (an input may not
    make the server look broken)."""
    return invalid(f"{what}: bai keeps none (dotfiles are a keypair's)")


async def create(request: web.Request) -> web.Response:
    p = await params(request)
    svc = service(request)
    if p.get("unmanaged_path") not in (None, ""):
        raise Problem("not-implemented", "Not implemented.", "unmanaged folders: bai keeps every folder on a host")
    cloneable = p.get("cloneable")
    folder = await svc.create(
        request["access_key"],
        p.get("name"),
        p.get("host"),
        p.get("usage_mode") or "general",
        p.get("permission") or "rw",
        False if cloneable is None else _bool(cloneable) if isinstance(cloneable, str) else cloneable,
        project=p.get("group"),
    )
    return web.json_response(await svc.describe(folder, with_usage=False), status=201)


async def folder_by_id(request: web.Request, status: str = "ready") -> SeenVFolder:
    """The folder a body's `id` names (Backend.AI's clients since 24.x name folders by id: `/folders/_/id` first),
    as the caller sees it; only its owner (or an admin) may act on it this way."""
    p = await params(request)
    ref = p.get("id", p.get("vfolder_id"))
    if not isinstance(ref, str) or not ref:
        raise invalid("id must be a folder's id")
    return await service(request).resolve(
        ref.replace("-", "").lower(), request["access_key"], request["is_admin"], OWNER, status
    )


async def id_of(request: web.Request) -> web.Response:
    """`GET /folders/_/id` `{"name"}` → `{"id"}` (a UUID): the id of a folder the caller can see by that name, in the
    trash too (so `vfolder restore NAME` and `purge NAME` find it)."""
    p = await params(request)
    name = p.get("name", p.get("vfolder_name"))
    if not isinstance(name, str) or not name:
        raise invalid("name must be a folder's name")
    svc = service(request)
    try:
        folder = await svc.resolve(name, request["access_key"], request["is_admin"])
    except Problem as ready_problem:
        if ready_problem.slug != "object-not-found":
            raise
        try:
            folder = await svc.resolve(name, request["access_key"], request["is_admin"], status="trashed")
        except Problem:
            raise ready_problem from None
    return web.json_response({"id": str(uuid.UUID(hex=folder.id)), "name": folder.name})


async def delete_by_id(request: web.Request) -> web.Response:
    """`DELETE /folders {"id"}`: to the trash, as by name (the owner, or an admin)."""
    await service(request).trash(await folder_by_id(request))
    return web.Response(status=204)


async def restore_by_id(request: web.Request) -> web.Response:
    """`POST /folders/restore-from-trash-bin {"id"}`: out of the trash."""
    await service(request).restore(await folder_by_id(request, "trashed"))
    return web.Response(status=204)


async def purge_by_id(request: web.Request) -> web.Response:
    """`POST /folders/delete-from-trash-bin` and `POST /folders/purge` `{"id"}`: a trashed folder and its files, gone
    (Backend.AI deletes the files first and forgets the row on purge; bai does both at once, so either call ends
    it)."""
    await service(request).purge(await folder_by_id(request, "trashed"))
    return web.Response(status=204)


async def force_delete(request: web.Request) -> web.Response:
    """`DELETE /folders/{id}/force`: remove a folder and its files at once, past the trash (its owner or an admin)."""
    svc = service(request)
    folder = await folder_of(request, OWNER)
    await svc.trash(folder)
    await svc.purge(msgspec.structs.replace(folder, status="trashed"))
    return web.Response(status=204)


async def clone(request: web.Request) -> web.Response:
    p = await params(request)
    svc = service(request)
    folder = await svc.clone(await folder_of(request), request["access_key"], p)
    return web.json_response(await svc.describe(folder, with_usage=False), status=201)  # (no bgtask_id: done)


async def update_options(request: web.Request) -> web.Response:
    p = await params(request)
    cloneable = p.get("cloneable")
    if isinstance(cloneable, str):
        cloneable = _bool(cloneable)
    await service(request).update_options(await folder_of(request, OWNER), p.get("permission"), cloneable)
    return web.json_response({}, status=201)


async def list_folders(request: web.Request) -> web.Response:
    p = await params(request)
    svc = service(request)
    status = "trashed" if _bool(p.get("trash")) else "ready"
    everyone = request["is_admin"] and _bool(p.get("all"))
    rows = await svc.visible(request["access_key"], everyone, status)
    if _bool(p.get("shared")):
        rows = [r for r in rows if not r.is_owner]
    return web.json_response([await svc.describe(r, with_usage=False) for r in rows])


async def info(request: web.Request) -> web.Response:
    return web.json_response(await service(request).describe(await folder_of(request)))


async def trash(request: web.Request) -> web.Response:
    await service(request).trash(await folder_of(request, OWNER))
    return web.Response(status=204)


async def restore(request: web.Request) -> web.Response:
    await service(request).restore(await folder_of(request, OWNER, "trashed"))
    return web.Response(status=204)


async def purge(request: web.Request) -> web.Response:
    await service(request).purge(await folder_of(request, OWNER, "trashed"))
    return web.Response(status=204)


async def rename(request: web.Request) -> web.Response:
    p = await params(request)
    await service(request).rename(await folder_of(request, OWNER), p.get("new_name"))
    return web.Response(status=204)


def _who(p: dict[str, Any]) -> Any:
    return p.get("access_keys") or p.get("emails") or p.get("users") or p.get("user_ids") or p.get("userIDs")


def _names(who: Any) -> list[str]:
    return list(dict.fromkeys([who] if isinstance(who, str) else who))


async def share(request: web.Request) -> web.Response:
    """Share at once (bai lets owners share their folders; Backend.AI only admins, and only group folders).
    `shared_emails` (what the official client prints) are the names as given, `shared_with` the keypairs."""
    p = await params(request)
    who = _who(p)
    targets = await service(request).share(await folder_of(request, OWNER), who, p.get("permission") or "ro")
    return web.json_response({"shared_with": targets, "shared_emails": _names(who)}, status=201)


async def unshare(request: web.Request) -> web.Response:
    p = await params(request)
    who = _who(p)
    targets = await service(request).share(await folder_of(request, OWNER), who, None)
    return web.json_response({"unshared_from": targets, "unshared_emails": _names(who)})


async def leave(request: web.Request) -> web.Response:
    p = await params(request)
    svc = service(request)
    folder = await folder_of(request)
    who = request["access_key"]
    other = p.get("shared_user_uuid") or p.get("sharedUserUuid")
    if other not in (None, ""):
        targets = await svc.keypairs_named(other)
        if targets != [who]:
            admin_only(request, "make another keypair leave a folder")
        for ak in targets:
            await svc.leave(folder, ak)
    else:
        await svc.leave(folder, who)
    return web.json_response({"msg": "left the shared virtual folder"})


# -- invitations ---------------------------------------------------------------------------------------


async def invite(request: web.Request) -> web.Response:
    p = await params(request)
    svc = service(request)
    folder = await folder_of(request, OWNER)
    perm = p.get("perm") or p.get("permission") or "rw"
    invited = await svc.invite(folder, request["access_key"], _who(p), perm)
    return web.json_response({"invited_ids": invited}, status=201)


async def invitations(request: web.Request) -> web.Response:
    return web.json_response({"invitations": await service(request).invitations(request["access_key"])})


async def sent_invitations(request: web.Request) -> web.Response:
    return web.json_response({"invitations": await service(request).invitations(request["access_key"], sent=True)})


async def accept_invitation(request: web.Request) -> web.Response:
    p = await params(request)
    await service(request).answer_invitation(request["access_key"], p.get("inv_id"), accept=True)
    return web.json_response({})


async def delete_invitation(request: web.Request) -> web.Response:
    p = await params(request)
    await service(request).answer_invitation(request["access_key"], p.get("inv_id"), accept=False)
    return web.json_response({})


# -- admins: every share ----------------------------------------------------------------------------------


async def list_shared(request: web.Request) -> web.Response:
    p = await params(request)
    admin_only(request, "list every shared folder")
    svc = service(request)
    folder_id = p.get("vfolder_id") or p.get("vfolderId")
    if folder_id is not None and not isinstance(folder_id, str):
        raise invalid("vfolder_id must be a folder's id")
    rows = await svc.all_shares(folder_id.replace("-", "") if folder_id else None)
    shared = [
        {
            "vfolder_id": r.vfolder_id,
            "vfolder_name": r.name,
            "status": r.status,
            "owner": r.owner,
            "type": "user",
            "shared_to": {"uuid": r.access_key, "email": await svc.email_of_keypair(r.access_key)},
            "perm": r.permission,
        }
        for r in rows
    ]
    return web.json_response({"shared": shared})


async def update_shared(request: web.Request) -> web.Response:
    p = await params(request)
    admin_only(request, "change another keypair's share")
    svc = service(request)
    if not isinstance(p.get("vfolder"), str) or not p["vfolder"]:
        raise invalid("vfolder must be a folder's id")
    folder = await svc.resolve(p["vfolder"].replace("-", ""), request["access_key"], True, OWNER)
    perm = p.get("perm", p.get("permission"))
    targets = await svc.keypairs_named(p.get("user"), but=folder.owner)
    shared = await svc.shares_of(folder)
    if perm is not None and (missing := [ak for ak in targets if ak not in shared]):
        raise invalid(f"folder {folder.name!r} is not shared with {', '.join(missing)}: share it first")
    await svc.share(folder, targets, perm)
    return web.json_response({"msg": "shared vfolder permission updated"})


async def change_ownership(request: web.Request) -> web.Response:
    p = await params(request)
    admin_only(request, "give a folder to another keypair")
    svc = service(request)
    if not isinstance(p.get("vfolder"), str) or not p["vfolder"]:
        raise invalid("vfolder must be a folder's id")
    folder = await svc.resolve(p["vfolder"].replace("-", ""), request["access_key"], True, OWNER)
    await svc.change_owner(folder, p.get("user_email"))
    return web.json_response({})


# -- files ---------------------------------------------------------------------------------------------


async def list_files(request: web.Request) -> web.Response:
    p = await params(request)
    folder = await folder_of(request)
    items = await service(request).fs(fsops.listdir, folder, str(p.get("path") or ""))
    return web.json_response({"items": items, "files": json.dumps([_legacy_entry(i) for i in items])})


_TYPE_BITS = {"file": stat.S_IFREG, "dir": stat.S_IFDIR, "symlink": stat.S_IFLNK}


def _legacy_entry(item: dict[str, Any]) -> dict[str, Any]:
    """An entry as Backend.AI's `files` (a JSON string, what the 23.9 client's `vfolder ls` reads)."""
    mtime = datetime.fromisoformat(item["modified"]).timestamp()
    mode = _TYPE_BITS.get(item["type"], 0) | int(item["mode"], 8)
    return {"filename": item["name"], "size": item["size"], "mode": stat.filemode(mode), "ctime": mtime,
            "atime": 0, "mtime": mtime}  # fmt: skip


async def mkdir(request: web.Request) -> web.Response:
    p = await params(request)
    folder = await folder_of(request, WRITE)
    path = p.get("path")
    paths = path if isinstance(path, list) else [path]
    if not all(isinstance(x, str) for x in paths):
        raise invalid("path must be a path (or a list of paths) in the folder")
    if not paths or len(paths) > MAX_MKDIR_PATHS:
        raise invalid(f"path: between 1 and {MAX_MKDIR_PATHS} paths")
    svc = service(request)
    success: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    first_problem: Problem | None = None
    for one in paths:
        try:
            await svc.fs(
                fsops.mkdir, folder, one, parents=_bool(p.get("parents")), exist_ok=_bool(p.get("exist_ok")),
                uid=svc.uid, gid=svc.gid,
            )  # fmt: skip
        except Problem as e:
            first_problem = first_problem or e
            failed.append({"item": one, "msg": e.msg or e.title})
        else:
            success.append({"item": one, "msg": None})
    if not success and first_problem is not None:
        raise first_problem  # (nothing made: the problem itself, as for one path)
    # Backend.AI's answer (26.x prints it): what was made and what was not, 207 when some failed
    return web.json_response({"results": {"success": success, "failed": failed}}, status=207 if failed else 201)


async def rename_file(request: web.Request) -> web.Response:
    p = await params(request)
    folder = await folder_of(request, WRITE)
    src = p.get("target_path")
    new_path = p.get("new_path")
    if new_path is None and isinstance(p.get("new_name"), str) and isinstance(src, str):
        if "/" in p["new_name"]:
            raise invalid("new_name is a name, not a path (use new_path to move)")
        new_path = src.rstrip("/").rpartition("/")[0] + "/" + p["new_name"] if "/" in src else p["new_name"]
    if not isinstance(src, str) or not isinstance(new_path, str):
        raise invalid("give target_path and new_name (or new_path)")
    await service(request).fs(fsops.rename, folder, src, new_path)
    return web.json_response({})


async def move_file(request: web.Request) -> web.Response:
    """Backend.AI's move-file: into dst when it is a folder; a file in the way is replaced."""
    p = await params(request)
    folder = await folder_of(request, WRITE)
    src, dst = p.get("src"), p.get("dst")
    if not isinstance(src, str) or not isinstance(dst, str):
        raise invalid("give src and dst, paths in the folder")
    moved_to = await service(request).fs(fsops.move, folder, src, dst)
    return web.json_response({"path": moved_to})


async def delete_files(request: web.Request) -> web.Response:
    p = await params(request)
    folder = await folder_of(request, WRITE)
    files = p.get("files")
    if not isinstance(files, list) or not files or not all(isinstance(f, str) for f in files):
        raise invalid("files must be a list of paths in the folder")
    removed = await service(request).fs(fsops.delete, folder, files, recursive=_bool(p.get("recursive")))
    return web.json_response({"removed": removed})


async def request_upload(request: web.Request) -> web.Response:
    p = await params(request)
    folder = await folder_of(request, WRITE)
    token = await service(request).request_upload(folder, p.get("path"), p.get("size"))
    return web.json_response({"token": token, "url": f"{base_url(request)}/folders/_/tus/upload"})


async def request_download(request: web.Request) -> web.Response:
    p = await params(request)
    token = await service(request).request_download(await folder_of(request), p.get("path"))
    return web.json_response({"token": token, "url": f"{base_url(request)}/folders/_/download"})


# -- transfers (unsigned, token-bound) -------------------------------------------------------------------


async def tus_patch(request: web.Request) -> web.Response:
    token = request.query.get("token", "")
    try:
        offset = int(request.headers.get("Upload-Offset", "0"))
    except ValueError:
        raise invalid("Upload-Offset must be a number") from None
    svc = service(request)
    size = offset
    parts: list[bytes] = []
    held = 0
    while data := await body_chunk(request.content.readany):  # a body that stalls is a 408
        parts.append(data)
        held += len(data)
        if size - offset + held > MAX_CHUNK:
            raise invalid(f"a chunk may be at most {MAX_CHUNK} bytes")
        if held >= 8 * 1024 * 1024:  # write as it comes: a 16 MiB chunk need not sit in memory
            size = await svc.append(token, b"".join(parts), size)
            parts, held = [], 0
    if parts or size == offset:
        size = await svc.append(token, b"".join(parts), size)
    return web.Response(status=204, headers={"Upload-Offset": str(size), "Tus-Resumable": "1.0.0"})


async def tus_head(request: web.Request) -> web.Response:
    offset, length = await service(request).upload_offset(request.query.get("token", ""))
    headers = {"Upload-Offset": str(offset), "Upload-Length": str(length), "Tus-Resumable": "1.0.0"}
    return web.Response(status=200, headers=headers)


async def download(request: web.Request) -> web.StreamResponse:
    fd, size, filename, content_type = await service(request).open_download(request.query.get("token", ""))
    try:
        response = web.StreamResponse(
            headers={
                "Content-Type": content_type,
                "Content-Disposition": f'attachment;filename="{filename}"',
            }
        )
        response.content_length = size
        await response.prepare(request)
        try:
            if size > 0:  # (sendfile refuses a count of 0: an empty file is the headers alone)
                transport = request.transport
                if transport is None:
                    raise ConnectionResetError("the connection is closed")
                with os.fdopen(os.dup(fd), "rb", buffering=0) as fobj:
                    try:  # the kernel copies the file to the socket (no pass through Python)
                        await asyncio.get_running_loop().sendfile(transport, fobj, 0, size)
                    except (NotImplementedError, RuntimeError):
                        await _send_by_reading(response, fd, size)
            await response.write_eof()
        except ConnectionError as e:  # the client went away mid-download: normal, nothing to report
            log.debug("download of %s broke off: the client went away (%s)", filename, e)
            if request.transport is not None:
                request.transport.close()
        return response
    finally:
        os.close(fd)


async def _send_by_reading(response: web.StreamResponse, fd: int, size: int) -> None:
    offset = 0
    while offset < size:
        data = await asyncio.to_thread(os.pread, fd, min(DOWNLOAD_CHUNK, size - offset), offset)
        if not data:
            break  # the file shrank meanwhile: the client sees a short body
        await response.write(data)
        offset += len(data)


# -- dotfiles --------------------------------------------------------------------------------------------

MAX_DOTFILE = 64 * 1024


async def dotfile_owner(request: web.Request, p: dict[str, Any]) -> str:
    """Whose dotfiles: the caller's, or (admins only) the keypair named by `owner_access_key`."""
    owner = p.get("owner_access_key") or p.get("onwer_access_key")  # (the 23.9 client's list has the typo)
    if owner in (None, "", request["access_key"]):
        return str(request["access_key"])
    if not isinstance(owner, str):
        raise invalid("owner_access_key must be an access key")
    if not request["is_admin"]:
        raise Problem("generic-forbidden", "Forbidden.", "only admins may act on another keypair's dotfiles")
    if await accounts(request).keypair(owner) is None:
        raise invalid(f"owner_access_key: no keypair {owner}")
    return owner


def _dotfile_fields(p: dict[str, Any]) -> tuple[str, str, str]:
    path, data, permission = p.get("path"), p.get("data"), str(p.get("permission") or "644")
    if not isinstance(path, str) or not isinstance(data, str):
        raise invalid("give path (relative to the kernel's home, e.g. .bashrc) and data (the file's text)")
    try:
        fsops.clean_relpath(path)
    except fsops.PathRefused as e:
        raise invalid(str(e)) from None
    if len(data.encode(errors="surrogatepass")) > MAX_DOTFILE:
        raise invalid(f"a dotfile may be at most {MAX_DOTFILE} bytes")
    if len(permission) != 3 or any(c not in "01234567" for c in permission):
        raise invalid("permission is an octal mode such as 644 or 755")
    return path.strip("/"), data, permission


def no_dotfile(path: Any) -> Problem:
    return Problem("object-not-found", "No such dotfile.", f"no dotfile {path!r}")


async def list_dotfiles(request: web.Request) -> web.Response:
    """All of a keypair's dotfiles; with `path`, that one (Backend.AI's `dotfile get`)."""
    p = await params(request)
    owner = await dotfile_owner(request, p)
    rows = await accounts(request).dotfiles(owner)
    path = p.get("path")
    if path in (None, ""):
        return web.json_response([dotfile_json(row) for row in rows])
    if not isinstance(path, str):
        raise invalid("path must be a dotfile's path")
    for row in rows:
        if row.path == path.strip("/"):
            return web.json_response({**dotfile_json(row), "perm": row.permission})
    raise no_dotfile(path)


def dotfile_json(row: Dotfile) -> dict[str, Any]:
    return {"path": row.path, "data": row.data, "permission": row.permission}


async def put_dotfile(request: web.Request) -> web.Response:
    """Create a dotfile (bai: or replace it, as `bai dotfile add` does; Backend.AI refuses a second one)."""
    p = await params(request)
    owner = await dotfile_owner(request, p)
    path, data, permission = _dotfile_fields(p)
    await accounts(request).put_dotfile(owner, path, data, permission)
    return web.json_response({})


async def update_dotfile(request: web.Request) -> web.Response:
    p = await params(request)
    owner = await dotfile_owner(request, p)
    path, data, permission = _dotfile_fields(p)
    if not any(row.path == path for row in await accounts(request).dotfiles(owner)):
        raise no_dotfile(path)
    await accounts(request).put_dotfile(owner, path, data, permission)
    return web.json_response({})


async def delete_dotfile(request: web.Request) -> web.Response:
    p = await params(request)
    owner = await dotfile_owner(request, p)
    path = p.get("path")
    if not isinstance(path, str) or not await accounts(request).delete_dotfile(owner, path.strip("/")):
        raise no_dotfile(path)
    return web.json_response({"success": True})


async def group_dotfiles(request: web.Request) -> web.Response:
    raise no_groups("group and domain dotfiles")


async def mounts(request: web.Request) -> web.Response:
    """`GET /folders/_/mounts` (admins): where each host's folders live. bai mounts nothing: a host is a directory
    of the manager's (`[vfolders] hosts`), and kernels bind folders from there; agents have no mounts of their own."""
    admin_only(request, "list the hosts' mounts")
    svc = service(request)
    listed = [[name, str(path)] for name, path in sorted(svc.hosts.items())]
    return web.json_response({"manager": {"success": True, "mounts": listed, "message": ""}, "agents": {}})


async def not_offered(request: web.Request) -> web.Response:
    why = (
        "invitations are sent, listed, accepted, rejected and canceled; not changed"
        if request.path.startswith("/folders/invitations/")
        else "no storage proxies to mount, measure or configure: a host is a directory in [vfolders] hosts"
    )
    msg = f"{request.method} {request.path}: bai does not offer it ({why})"
    raise Problem("not-implemented", "Not implemented.", msg)


def add_vfolder_routes(app: web.Application, svc: VFolders) -> None:
    app[VFOLDERS] = svc
    app[SETTINGS].setdefault("public_paths", set()).update(PUBLIC_PATHS)
    r = app.router
    r.add_get("/folders/_/hosts", hosts)
    for path in ("/folders/_/all_hosts", "/folders/_/all-hosts"):
        r.add_get(path, all_hosts)
    for path in ("/folders/_/allowed_types", "/folders/_/allowed-types"):
        r.add_get(path, allowed_types)
    r.add_get("/folders/_/shared", list_shared)
    r.add_post("/folders/_/shared", update_shared)
    r.add_post("/folders/_/change-ownership", change_ownership)
    r.add_get("/folders/invitations/list", invitations)
    for path in ("/folders/invitations/list-sent", "/folders/invitations/list_sent"):
        r.add_get(path, sent_invitations)
    r.add_post("/folders/invitations/accept", accept_invitation)
    r.add_delete("/folders/invitations/delete", delete_invitation)
    r.add_get("/folders/_/id", id_of)
    r.add_delete("/folders", delete_by_id)
    r.add_post("/folders/restore-from-trash-bin", restore_by_id)
    r.add_post("/folders/delete-from-trash-bin", purge_by_id)
    r.add_post("/folders/purge", purge_by_id)
    r.add_delete("/folders/{name}/force", force_delete)
    r.add_patch("/folders/_/tus/upload", tus_patch)
    r.add_head("/folders/_/tus/upload", tus_head)
    r.add_get("/folders/_/download", download, allow_head=False)
    r.add_post("/folders", create)
    r.add_get("/folders", list_folders)
    r.add_get("/folders/{name}", info)
    r.add_delete("/folders/{name}", trash)
    r.add_post("/bai/folders/{name}/restore", restore)
    r.add_post("/bai/folders/{name}/purge", purge)
    r.add_post("/folders/{name}/rename", rename)
    r.add_post("/folders/{name}/share", share)
    r.add_delete("/folders/{name}/unshare", unshare)
    r.add_get("/folders/{name}/files", list_files)
    r.add_post("/folders/{name}/mkdir", mkdir)
    r.add_post("/folders/{name}/rename-file", rename_file)
    r.add_post("/folders/{name}/rename_file", rename_file)
    r.add_post("/folders/{name}/move-file", move_file)
    r.add_delete("/folders/{name}/delete-files", delete_files)
    r.add_delete("/folders/{name}/delete_files", delete_files)
    r.add_post("/folders/{name}/invite", invite)
    r.add_post("/folders/{name}/leave", leave)
    r.add_post("/folders/{name}/clone", clone)
    r.add_post("/folders/{name}/update-options", update_options)
    r.add_post("/folders/{name}/request-upload", request_upload)
    r.add_post("/folders/{name}/request-download", request_download)
    r.add_get("/user-config/dotfiles", list_dotfiles)
    r.add_post("/user-config/dotfiles", put_dotfile)
    r.add_patch("/user-config/dotfiles", update_dotfile)
    r.add_delete("/user-config/dotfiles", delete_dotfile)
    for path in ("/group-config/dotfiles", "/domain-config/dotfiles"):
        r.add_route("*", path, group_dotfiles)
    r.add_get("/folders/_/mounts", mounts)
    for path in ("/folders/_/fstab", "/folders/_/mounts", "/folders/_/perf-metric", "/folders/_/used-bytes"):
        r.add_route("*", path, not_offered)
    r.add_route("*", "/folders/invitations/{rest:.*}", not_offered)  # (after the real ones: update, …)
