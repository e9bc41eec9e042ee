"""HTTP API of virtual folders and dotfiles, under Backend.AI's paths (reference spec §9).

Signed: `/folders…` and `/user-config/dotfiles`. Unsigned but token-bound (as Backend.AI's storage
proxy): `PATCH|HEAD /folders/_/tus/upload?token=…` (TUS 1.0 subset: always 204 on success) and
`GET /folders/_/download?token=…` (200 with Content-Length).
Parameters come from the JSON body when there is one, else from the query string (spec §2).
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from aiohttp import web

from bai.common.problems import Problem, invalid
from bai.node.manager.http import SETTINGS, read_json
from bai.node.manager.vfolders import fsops
from bai.node.manager.vfolders.service import OWNER, WRITE, VFolders

log = logging.getLogger("bai.vfolders")
VFOLDERS = web.AppKey("vfolders", VFolders)
PUBLIC_PATHS = {"/folders/_/tus/upload", "/folders/_/download"}
DOWNLOAD_CHUNK = 4 * 1024 * 1024
MAX_CHUNK = 64 * 1024 * 1024


def service(request: web.Request) -> VFolders:
    return request.app[VFOLDERS]


async def params(request: web.Request) -> dict[str, Any]:
    body = await read_json(request) if request.body_exists else {}
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    return {**request.query, **body}


def _bool(value: Any) -> bool:
    return value is True or str(value).lower() in ("1", "true", "yes")


async def folder_of(request: web.Request, need: str = "read", status: str = "ready") -> dict[str, Any]:
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


async def create(request: web.Request) -> web.Response:
    p = await params(request)
    svc = service(request)
    folder = await svc.create(request["access_key"], p.get("name"), p.get("host"), p.get("usage_mode") or "general")
    return web.json_response(await svc.describe(folder, with_usage=False), status=201)


async def list_folders(request: web.Request) -> web.Response:
    p = await params(request)
    svc = service(request)
    status = "trashed" if _bool(p.get("trash")) else "ready"
    everyone = request["is_admin"] and _bool(p.get("all"))
    rows = await svc.store.vfolders_of(None if everyone else request["access_key"], status)
    if _bool(p.get("shared")):
        rows = [r for r in rows if not r["is_owner"]]
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


async def share(request: web.Request) -> web.Response:
    p = await params(request)
    who = p.get("access_keys") or p.get("emails") or p.get("users")
    targets = await service(request).share(await folder_of(request, OWNER), who, p.get("permission") or "ro")
    return web.json_response({"shared_with": targets})


async def unshare(request: web.Request) -> web.Response:
    p = await params(request)
    who = p.get("access_keys") or p.get("emails") or p.get("users")
    targets = await service(request).share(await folder_of(request, OWNER), who, None)
    return web.json_response({"unshared_from": targets})


# -- files ---------------------------------------------------------------------------------------------


async def list_files(request: web.Request) -> web.Response:
    p = await params(request)
    folder = await folder_of(request)
    items = await service(request).fs(fsops.listdir, folder, str(p.get("path") or ""))
    return web.json_response({"items": items})


async def mkdir(request: web.Request) -> web.Response:
    p = await params(request)
    folder = await folder_of(request, WRITE)
    path = p.get("path")
    paths = path if isinstance(path, list) else [path]
    if not all(isinstance(x, str) for x in paths):
        raise invalid("path must be a path (or a list of paths) in the folder")
    svc = service(request)
    for one in paths:
        await svc.fs(
            fsops.mkdir, folder, one, parents=_bool(p.get("parents")), exist_ok=_bool(p.get("exist_ok")),
            uid=svc.uid, gid=svc.gid,
        )  # fmt: skip
    return web.Response(status=201)


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
    return web.Response(status=204)


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
    async for data in request.content.iter_any():
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
    fd, size, filename = await service(request).open_download(request.query.get("token", ""))
    try:
        response = web.StreamResponse(
            headers={
                "Content-Type": "application/octet-stream",
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


async def list_dotfiles(request: web.Request) -> web.Response:
    return web.json_response(await service(request).store.dotfiles(request["access_key"]))


async def put_dotfile(request: web.Request) -> web.Response:
    p = await params(request)
    path, data, permission = p.get("path"), p.get("data"), str(p.get("permission") or "644")
    if not isinstance(path, str) or not isinstance(data, str):
        raise invalid("give path (relative to the kernel's home, e.g. .bashrc) and data (the file's text)")
    try:
        fsops.clean_relpath(path)
    except fsops.PathRefused as e:
        raise invalid(str(e)) from None
    if len(data.encode()) > MAX_DOTFILE:
        raise invalid(f"a dotfile may be at most {MAX_DOTFILE} bytes")
    if len(permission) != 3 or any(c not in "01234567" for c in permission):
        raise invalid("permission is an octal mode such as 644 or 755")
    await service(request).store.put_dotfile(request["access_key"], path.strip("/"), data, permission)
    return web.Response(status=201)


async def delete_dotfile(request: web.Request) -> web.Response:
    p = await params(request)
    path = p.get("path")
    if not isinstance(path, str) or not await service(request).store.delete_dotfile(request["access_key"], path):
        raise Problem("object-not-found", "No such dotfile.", f"no dotfile {path!r}")
    return web.Response(status=204)


def add_vfolder_routes(app: web.Application, svc: VFolders) -> None:
    app[VFOLDERS] = svc
    app[SETTINGS].setdefault("public_paths", set()).update(PUBLIC_PATHS)
    r = app.router
    r.add_get("/folders/_/hosts", hosts)
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
    r.add_delete("/folders/{name}/delete-files", delete_files)
    r.add_post("/folders/{name}/request-upload", request_upload)
    r.add_post("/folders/{name}/request-download", request_download)
    r.add_get("/user-config/dotfiles", list_dotfiles)
    r.add_post("/user-config/dotfiles", put_dotfile)
    r.add_delete("/user-config/dotfiles", delete_dotfile)
