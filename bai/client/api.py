"""`bai.client`: the one Python client of the bai API (signing, streaming, errors).

The CLI and the dashboard use only this module to talk to a manager. Plain requests go through the
standard library's http.client (in a worker thread), which imports in a few milliseconds; aiohttp
(about 150 ms to import) is loaded only for the WebSocket of streaming execution and for uploads;
`overlap_import` imports it while a first request is under way.
"""

from __future__ import annotations

import codecs
import http.client
import json
import os
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode, urlsplit

from bai import API_VERSION
from bai.common import auth
from bai.common.credentials import Credentials

if TYPE_CHECKING:
    import aiohttp


async def overlap_import(first_request) -> Any:
    """Await `first_request` while aiohttp imports (it is only needed after that request).

    The request runs in a worker thread that needs no further imports, so the import in this
    thread does not wait on import locks and mostly overlaps the request's wait for the manager.
    """
    import asyncio

    task = asyncio.ensure_future(first_request)
    await asyncio.sleep(0)  # let the task hand its request to the worker thread
    import aiohttp  # noqa: F401

    return await task


async def _in_thread(fn, *args: Any) -> Any:
    """`asyncio.to_thread`; asyncio (about 25 ms to import) is imported when first needed, so a
    blocking client (`Client.blocking`) that only makes plain requests never imports it."""
    import asyncio

    return await asyncio.to_thread(fn, *args)


class APIError(Exception):
    """An error answer of the API (its problem body) or a failure to reach it."""

    def __init__(self, status: int, title: str, msg: str | None = None, slug: str = "", data: Any = None) -> None:
        super().__init__(msg or title)
        self.status = status
        self.title = title
        self.msg = msg
        self.slug = slug
        self.data = data

    def __str__(self) -> str:
        return f"{self.title} {self.msg}" if self.msg and self.msg != self.title else self.title


def _error_from(status: int, reason: str, text: str) -> APIError:
    try:
        body = json.loads(text)
        return APIError(
            status,
            body.get("title", reason),
            body.get("msg"),
            body.get("type", "").rsplit("/", 1)[-1],
            body.get("data"),
        )
    except (ValueError, AttributeError):
        return APIError(status, reason or "error", text[:500])


def _read_event(resp: http.client.HTTPResponse) -> list[bytes]:
    """The lines of the next Server-Sent Event, up to its blank line (one thread hop per event);
    an empty list at the end of the stream."""
    lines = []
    while line := resp.readline():
        if line in (b"\n", b"\r\n"):
            if lines:
                return lines
            continue
        lines.append(line)
    return lines


BAI_FOLDER_ACTIONS = {"restore", "purge"}


def _token_target(grant: dict[str, str]) -> str:
    """The path and query of a transfer URL the manager handed out with its token."""
    return f"{urlsplit(grant['url']).path}?{urlencode({'token': grant['token']})}"


def _abort(resp: http.client.HTTPResponse) -> None:
    """Close a streaming response now, even while a worker thread is blocked reading it: shutting the
    socket down wakes that read (a plain close does not), so the thread ends and the program can exit."""
    import socket

    raw = getattr(resp.fp, "raw", None)
    sock = getattr(raw, "_sock", None)
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
    resp.close()


# the paths that take owner_access_key: a session's endpoints, the session list, session events
OWNER_SCOPED = ("/session", "/bai/session/", "/stream/session/", "/events/session")


class Client:
    """bai's asynchronous API client: signed requests, streams, uploads and downloads."""

    def __init__(self, creds: Credentials) -> None:
        self.creds = creds
        self.endpoint = creds.endpoint.rstrip("/")
        parts = urlsplit(self.endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise APIError(0, f"bad endpoint {creds.endpoint!r}", "use http://HOST:PORT")
        self.scheme = parts.scheme
        self.host = parts.netloc
        self.prefix = parts.path.rstrip("/")
        self._http: aiohttp.ClientSession | None = None
        self._ssl: Any = None
        # admins: act on this keypair's sessions (Backend.AI's owner_access_key), names included
        self.owner: str | None = None
        # plain requests block the calling thread instead of a worker's (no event loop needed): for one
        # request from the CLI (bai.cli.common.call_now); streams, uploads and WebSockets still need one
        self.blocking = False

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def http(self) -> aiohttp.ClientSession:
        import aiohttp

        if self._http is None:
            connector = aiohttp.TCPConnector(ssl=self.ssl_context) if self.scheme == "https" else None
            self._http = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10), connector=connector
            )
        return self._http

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()

    # -- plumbing ----------------------------------------------------------------------------------

    def _headers(self, method: str, path: str, ctype: str, send_ctype: bool = True) -> dict[str, str]:
        date = auth.now_header()
        signature = auth.sign(self.creds.secret_key, method, path, date, self.host, ctype, API_VERSION)
        headers = {
            "Date": date,
            "X-BackendAI-Version": API_VERSION,
            "X-BackendAI-Domain": "default",
            "Authorization": auth.authorization_header(self.creds.access_key, signature),
        }
        if send_ctype:
            headers["Content-Type"] = ctype
        return headers

    def _path(self, path: str, params: dict[str, Any] | None) -> str:
        if self.owner and path.startswith(OWNER_SCOPED):
            params = {**(params or {}), "owner_access_key": self.owner}
        query = urlencode({k: v for k, v in (params or {}).items() if v is not None})
        return self.prefix + path + (f"?{query}" if query else "")

    def _url(self, full_path: str) -> str:
        return f"{self.scheme}://{self.host}{full_path}"

    def _unreachable(self, e: Exception) -> APIError:
        import ssl

        if isinstance(e, ssl.SSLCertVerificationError):
            hint = f"{e.verify_message}: trust its CA with `bai --ca FILE` (or BACKEND_CA_FILE)"
            return APIError(0, f"the manager at {self.endpoint} has a certificate bai does not trust", hint)
        return APIError(0, f"cannot reach the manager at {self.endpoint}", str(e))

    def _broke_off(self, what: str, e: Exception) -> APIError:
        if isinstance(e, OSError):
            return self._unreachable(e)
        return APIError(0, f"the {what} broke off", str(e) or type(e).__name__)

    @property
    def ssl_context(self):
        """The TLS context for an https:// manager: the system's CAs, or BACKEND_CA_FILE (`bai --ca`)."""
        if self._ssl is None:
            import ssl

            self._ssl = ssl.create_default_context(cafile=os.environ.get("BACKEND_CA_FILE") or None)
        return self._ssl

    def _connect(self) -> http.client.HTTPConnection:
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, timeout=None, context=self.ssl_context)
        return http.client.HTTPConnection(self.host, timeout=None)

    def _open(self, method: str, full: str, body: bytes | None, ctype: str) -> http.client.HTTPResponse:
        """Send a signed request and return the response once its headers are in (blocking)."""
        conn = self._connect()
        try:
            conn.request(method, full, body=body, headers=self._headers(method, full, ctype))
            resp = conn.getresponse()
        except OSError as e:
            conn.close()
            raise self._unreachable(e) from None
        if resp.status >= 400:
            text = resp.read().decode(errors="replace")
            conn.close()
            raise _error_from(resp.status, resp.reason, text)
        return resp

    def _call(self, method: str, full: str, body: bytes | None, ctype: str) -> Any:
        resp = self._open(method, full, body, ctype)
        try:
            data = resp.read()
        finally:
            resp.close()
        return json.loads(data) if data and resp.status != 204 else None

    async def request(
        self, method: str, path: str, *, json_body: Any = None, params: dict[str, Any] | None = None
    ) -> Any:
        full = self._path(path, params)
        body = json.dumps(json_body).encode() if json_body is not None else None
        ctype = "application/json" if json_body is not None else "text/plain"
        if self.blocking:
            return self._call(method, full, body, ctype)
        return await _in_thread(self._call, method, full, body, ctype)

    # -- API -----------------------------------------------------------------------------------------

    async def hello(self) -> dict[str, Any]:
        return await self.request("GET", "/")

    async def create_session(self, image: str, **kw: Any) -> dict[str, Any]:
        body = {
            "name": kw.get("name"),
            "image": image,
            "type": kw.get("type", "interactive"),
            "config": {
                "resources": kw.get("resources") or {},
                "environ": kw.get("environ") or {},
                "network": kw.get("network"),
                "scalingGroup": kw.get("scaling_group"),
                **(kw.get("mounts") or {}),  # mounts, mount_map, mount_options (bai.common.mounts.mount_config)
            },
            "enqueueOnly": kw.get("enqueue_only", False),
            "maxWaitSeconds": kw.get("max_wait", 0),
            "reuseIfExists": True,
            "startupCommand": kw.get("startup_command"),
            "starts_at": kw.get("starts_at"),
            "dependencies": kw.get("depends") or [],
            "clusterSize": kw.get("cluster_size") or 1,
            "clusterMode": kw.get("cluster_mode") or "single-node",
        }
        return await self.request("POST", "/session", json_body=body)

    async def get_session(self, ref: str) -> dict[str, Any]:
        return await self.request("GET", f"/session/{ref}")

    async def list_sessions(self, all: bool = False, status: str | None = None) -> list[dict[str, Any]]:
        params = {"all": "true" if all else None, "status": status}
        return (await self.request("GET", "/session", params=params))["items"]

    async def destroy_session(self, ref: str, forced: bool = False, wait: bool = True) -> dict[str, Any]:
        """Destroy a session; with wait=False the manager answers at once and finishes in the background."""
        params = {"forced": "true" if forced else None, "wait": None if wait else "false"}
        return await self.request("DELETE", f"/session/{ref}", params=params)

    async def history(self, ref: str) -> dict[str, Any]:
        return await self.request("GET", f"/bai/session/{ref}/history")

    async def interrupt(self, ref: str, run_id: str | None = None) -> None:
        """Interrupt run `run_id` (one still waiting leaves the queue), else whatever runs in the session."""
        await self.request("POST", f"/session/{ref}/interrupt", json_body={"runId": run_id} if run_id else None)

    async def logs(self, ref: str, tail: int | None = None, kernel: str | None = None) -> str:
        return (await self.log_page(ref, tail=tail, kernel=kernel))["logs"]

    async def log_page(
        self,
        ref: str,
        *,
        tail: int | None = None,
        since: int | None = None,
        limit: int | None = None,
        since_time: str | None = None,
        kernel: str | None = None,
    ) -> dict[str, Any]:
        """{"logs": text, "next": cursor for `since`, "more": bool[, "purged": true]}. `since_time`: only output
        stored from then on (a duration before now such as `10m`, or an ISO 8601 time). `kernel`: which kernel
        of a cluster session (main1, sub1 …, or a kernel id; the main kernel's when None)."""
        params = {"tail": tail, "since": since, "limit": limit, "sinceTime": since_time, "kernel": kernel}
        return (await self.request("GET", f"/session/{ref}/logs", params=params))["result"]

    async def follow_logs(
        self, ref: str, tail: int | None = None, since_time: str | None = None, kernel: str | None = None
    ) -> AsyncIterator[str]:
        params = {"follow": "true", "tail": tail, "sinceTime": since_time, "kernel": kernel}
        full = self._path(f"/session/{ref}/logs", params)
        resp = await _in_thread(self._open, "GET", full, None, "text/plain")
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        try:
            while chunk := await _in_thread(resp.read1, 65536):
                yield decoder.decode(chunk)
        except OSError as e:
            raise self._unreachable(e) from None
        finally:
            _abort(resp)

    async def events(self, ref: str | None = None, until_end: bool = True) -> AsyncIterator[tuple[str, dict]]:
        """Session lifecycle events (Server-Sent Events) as (event name, data)."""
        params = {"sessionName": ref, "scope": "session", "follow": "false" if until_end and ref else None}
        async for item in self._sse(self._path("/events/session", params)):
            yield item

    async def dashboard_events(
        self,
        topics: str = "sessions,agents",
        session: str | None = None,
        kernel: str | None = None,
        tail: int | None = None,
        after: int | None = None,
        finished: int | None = None,
    ) -> AsyncIterator[tuple[str, dict]]:
        """The dashboard stream `GET /bai/events` (see bai/node/manager/http/dashboard.py) as (event name, data):
        a snapshot of sessions and agents, then what changes; or (topics="logs") a kernel's output."""
        params = {
            "topics": topics,
            "session": session,
            "kernel": kernel,
            "tail": tail,
            "after": after,
            "finished": finished,
        }
        async for item in self._sse(self._path("/bai/events", params)):
            yield item

    async def _sse(self, full: str) -> AsyncIterator[tuple[str, dict]]:
        """Read Server-Sent Events; each event's data is JSON. Reading happens in a worker thread."""
        resp = await _in_thread(self._open, "GET", full, None, "application/octet-stream")
        name, data = "message", []
        try:
            while True:
                lines = await _in_thread(_read_event, resp)
                if not lines:
                    return
                for line in lines:
                    text = line.decode().rstrip("\r\n")
                    if text.startswith("event:"):
                        name = text[6:].strip()
                    elif text.startswith("data:"):
                        data.append(text[5:].strip())
                if data:
                    yield name, json.loads("\n".join(data))
                name, data = "message", []
        except OSError as e:
            raise self._unreachable(e) from None
        finally:
            _abort(resp)

    async def upload(self, ref: str, files: list[tuple[str, bytes]]) -> None:
        import aiohttp

        form = aiohttp.FormData()
        for name, content in files:
            form.add_field("src", content, filename=name, content_type="application/octet-stream")
        full = self._path(f"/session/{ref}/upload", None)
        headers = self._headers("POST", full, "multipart/form-data", send_ctype=False)
        try:
            async with self.http.post(self._url(full), data=form, headers=headers) as resp:
                if resp.status >= 400:
                    raise _error_from(resp.status, resp.reason or "", await resp.text())
        except aiohttp.ClientConnectionError as e:
            raise self._unreachable(e) from None

    async def download(self, ref: str, paths: list[str]) -> list[bytes]:
        """Files of a session's kernel (Backend.AI's `session download`): one tar archive per path."""
        import aiohttp

        full = self._path(f"/session/{ref}/download", None)
        body = json.dumps({"files": paths}).encode()
        headers = self._headers("GET", full, "application/json")
        try:
            async with self.http.get(self._url(full), data=body, headers=headers) as resp:
                if resp.status >= 400:
                    raise _error_from(resp.status, resp.reason or "", await resp.text())
                reader = aiohttp.MultipartReader.from_response(resp)
                archives = []
                while (part := await reader.next()) is not None:
                    archives.append(bytes(await part.read(decode=False)))
                return archives
        except aiohttp.ClientConnectionError as e:
            raise self._unreachable(e) from None

    async def restart_session(self, ref: str) -> None:
        """Restart a session's kernel (a fresh Python namespace; the session stays)."""
        await self.request("PATCH", f"/session/{ref}")

    async def rename_session(self, ref: str, name: str) -> None:
        await self.request("POST", f"/session/{ref}/rename", params={"name": name})

    async def commit_session(self, ref: str, image: str | None = None) -> dict[str, Any]:
        """Save a session's kernel as an image on its agent; the image (name, id, size, agent)."""
        return await self.request("POST", f"/session/{ref}/commit", params={"image": image})

    async def list_files(self, ref: str, path: str = "/home/work") -> dict[str, Any]:
        """A folder inside a session's kernel: files (a JSON string, as Backend.AI sends it), errors, abspath."""
        return await self.request("GET", f"/session/{ref}/files", params={"path": path})

    async def keypairs(self) -> list[dict[str, Any]]:
        return (await self.request("GET", "/bai/admin/keypairs"))["items"]

    async def create_keypair(self, user_id: str, is_admin: bool = False, policy: str | None = None) -> dict[str, Any]:
        body = {"user_id": user_id, "is_admin": is_admin, "resource_policy": policy}
        return await self.request("POST", "/bai/admin/keypairs", json_body=body)

    async def update_keypair(self, access_key: str, **fields: Any) -> dict[str, Any]:
        return await self.request("PATCH", f"/bai/admin/keypairs/{access_key}", json_body=fields)

    async def policies(self) -> list[dict[str, Any]]:
        return (await self.request("GET", "/bai/admin/policies"))["items"]

    async def create_policy(self, name: str, **fields: Any) -> dict[str, Any]:
        return await self.request("POST", "/bai/admin/policies", json_body={"name": name, **fields})

    async def update_policy(self, name: str, **fields: Any) -> dict[str, Any]:
        return await self.request("PATCH", f"/bai/admin/policies/{name}", json_body=fields)

    async def cluster(self) -> dict[str, Any]:
        return await self.request("GET", "/bai/admin/cluster")

    async def manager_status(self) -> dict[str, Any]:
        return await self.request("GET", "/manager/status")

    async def agents(self) -> list[dict[str, Any]]:
        return (await self.request("GET", "/bai/agents"))["items"]

    async def images(self) -> list[dict[str, Any]]:
        return (await self.request("GET", "/bai/images"))["items"]

    async def pull_image(self, image: str, agent: str | None = None) -> list[dict[str, Any]]:
        body = {"image": image, "agent": agent}
        return (await self.request("POST", "/bai/images/pull", json_body=body))["pulled"]

    async def remove_image(self, image: str, agent: str | None = None) -> list[str]:
        params = {"image": image, "agent": agent}
        return (await self.request("DELETE", "/bai/images", params=params))["removed_from"]

    async def image_aliases(self) -> dict[str, str]:
        return await self.request("GET", "/bai/images/aliases")

    async def set_image_alias(self, alias: str, image: str | None) -> None:
        if image is None:
            await self.request("DELETE", f"/bai/images/aliases/{alias}")
        else:
            await self.request("PUT", f"/bai/images/aliases/{alias}", json_body={"image": image})

    # -- virtual folders and dotfiles (reference spec §9) -------------------------------------------

    async def vfolder_hosts(self) -> dict[str, Any]:
        return await self.request("GET", "/folders/_/hosts")

    async def create_vfolder(
        self,
        name: str,
        host: str | None = None,
        usage_mode: str = "general",
        permission: str = "rw",
        cloneable: bool = False,
    ) -> dict[str, Any]:
        body = {"name": name, "host": host, "usage_mode": usage_mode, "permission": permission, "quota": "0"}
        return await self.request("POST", "/folders", json_body={**body, "cloneable": cloneable})

    async def vfolder_invitations(self, sent: bool = False) -> list[dict[str, Any]]:
        path = "/folders/invitations/list-sent" if sent else "/folders/invitations/list"
        return (await self.request("GET", path))["invitations"]

    async def answer_vfolder_invitation(self, invitation_id: str, accept: bool) -> None:
        """Accept or reject an invitation to a folder (the inviter's reject cancels it)."""
        method, path = ("POST", "accept") if accept else ("DELETE", "delete")
        await self.request(method, f"/folders/invitations/{path}", json_body={"inv_id": invitation_id})

    async def vfolders(self, shared: bool = False, trash: bool = False, all: bool = False) -> list[dict[str, Any]]:
        params = {"shared": "true" if shared else None, "trash": "true" if trash else None}
        params["all"] = "true" if all else None
        return await self.request("GET", "/folders", params=params)

    async def vfolder(self, name: str) -> dict[str, Any]:
        return await self.request("GET", f"/folders/{name}")

    async def vfolder_action(self, name: str, action: str, method: str = "POST", **body: Any) -> Any:
        """rename (new_name), restore, purge, share / unshare (access_keys, permission), mkdir (path,
        parents, exist_ok), rename-file (target_path, new_path), move-file (src, dst), delete-files (files,
        recursive), clone (target_name, target_host, permission, cloneable), invite (user_ids, perm), leave,
        update-options (permission, cloneable)."""
        prefix = "/bai" if action in BAI_FOLDER_ACTIONS else ""  # bai's own, where Backend.AI has none
        return await self.request(method, f"{prefix}/folders/{name}/{action}", json_body=body or None)

    async def delete_vfolder(self, name: str) -> None:
        await self.request("DELETE", f"/folders/{name}")

    async def vfolder_files(self, name: str, path: str = "") -> list[dict[str, Any]]:
        return (await self.request("GET", f"/folders/{name}/files", params={"path": path or None}))["items"]

    async def upload_file(self, name: str, source: Any, path: str, progress=None, chunk: int = 16 << 20) -> int:
        """Upload a local file (a Path) to `path` in the folder; `progress(n)` is told of every chunk sent.
        The file appears in the folder only when every byte has arrived."""
        size = source.stat().st_size
        grant = await self.request("POST", f"/folders/{name}/request-upload", json_body={"path": path, "size": size})
        if size == 0:
            return 0
        target = _token_target(grant)

        def send() -> int:
            conn = self._connect()
            offset = 0
            try:
                with source.open("rb") as f:
                    while data := f.read(chunk):
                        headers = {
                            "Tus-Resumable": "1.0.0",
                            "Upload-Offset": str(offset),
                            "Content-Type": "application/offset+octet-stream",
                        }
                        conn.request("PATCH", target, body=data, headers=headers)
                        resp = conn.getresponse()
                        text = resp.read().decode(errors="replace")
                        if resp.status != 204:
                            raise _error_from(resp.status, resp.reason, text)
                        offset = int(resp.headers.get("Upload-Offset", offset + len(data)))
                        if progress is not None:
                            progress(len(data))
            except (http.client.HTTPException, OSError) as e:
                raise self._broke_off("upload", e) from None
            finally:
                conn.close()
            return offset

        return await _in_thread(send)

    async def download_file(self, name: str, path: str, dest: Any, progress=None) -> int:
        """Download a file of the folder to `dest` (a Path; written under a temporary name, then renamed)."""
        grant = await self.request("POST", f"/folders/{name}/request-download", json_body={"path": path})
        target = _token_target(grant)

        def fetch() -> int:
            conn = self._connect()
            tmp = dest.with_name(f".{dest.name}.part")
            received = 0
            try:
                conn.request("GET", target)
                resp = conn.getresponse()
                if resp.status != 200:
                    raise _error_from(resp.status, resp.reason, resp.read().decode(errors="replace"))
                buf = bytearray(8 << 20)
                view = memoryview(buf)
                with tmp.open("wb") as f:
                    while n := resp.readinto(buf):  # into one buffer: three times read()'s speed
                        f.write(view[:n])
                        received += n
                        if progress is not None:
                            progress(n)
                if resp.length not in (None, 0):
                    raise APIError(0, "the download ended early", f"{received} bytes received")
                tmp.replace(dest)
            except (http.client.HTTPException, OSError) as e:
                raise self._broke_off("download", e) from None
            finally:
                conn.close()
                tmp.unlink(missing_ok=True)
            return received

        return await _in_thread(fetch)

    async def dotfiles(self) -> list[dict[str, Any]]:
        return await self.request("GET", "/user-config/dotfiles")

    async def put_dotfile(self, path: str, data: str, permission: str = "644") -> None:
        body = {"path": path, "data": data, "permission": permission}
        await self.request("POST", "/user-config/dotfiles", json_body=body)

    async def delete_dotfile(self, path: str) -> None:
        await self.request("DELETE", "/user-config/dotfiles", params={"path": path})

    def execute(self, session_id: str, kernel: str | None = None) -> ExecStream:
        """A streaming run in the session's kernel `kernel` (main1, sub1 … or an id; the main one when None)."""
        return ExecStream(self, session_id, kernel)

    async def terminal(
        self,
        session_id: str,
        command: list[str] | None = None,
        rows: int = 24,
        cols: int = 80,
        kernel: str | None = None,
    ) -> aiohttp.ClientWebSocketResponse:
        """A WebSocket to a terminal in the session (`GET /stream/session/{id}/pty`, Backend.AI's frames), in its
        kernel `kernel` (main1, sub1 … or an id; the main one when None)."""
        import aiohttp
        import yarl

        params: dict[str, Any] = {"rows": rows, "cols": cols, "kernel": kernel}
        if command:
            params["command"] = json.dumps(command)
        full = self._path(f"/stream/session/{session_id}/pty", params)
        headers = self._headers("GET", full, "application/octet-stream", send_ctype=False)
        url = yarl.URL(self._url(full), encoded=True)  # as signed: not re-quoted
        try:
            return await self.http.ws_connect(url, headers=headers, autoping=True, max_msg_size=0)
        except aiohttp.WSServerHandshakeError as e:
            raise APIError(e.status, e.message or "cannot open the terminal") from None
        except aiohttp.ClientConnectionError as e:
            raise self._unreachable(e) from None

    async def apps(self, ref: str) -> list[dict[str, Any]]:
        """The session's apps (Backend.AI's `servicePorts` items, with bai's `host_ports`)."""
        return await self.request("GET", f"/stream/session/{ref}/apps")

    async def start_app(self, ref: str, app: str) -> dict[str, Any]:
        """Start an app unless it runs: {"app", "started"} (an APIError with its output when it fails)."""
        return await self.request("POST", f"/stream/session/{ref}/apps/{app}/start")

    async def app_tunnel(self, session_id: str, app: str) -> aiohttp.ClientWebSocketResponse:
        """A WebSocket carrying one TCP connection to the app (`GET /stream/session/{id}/tcpproxy`)."""
        import aiohttp
        import yarl

        full = self._path(f"/stream/session/{session_id}/tcpproxy", {"app": app})
        headers = self._headers("GET", full, "application/octet-stream", send_ctype=False)
        url = yarl.URL(self._url(full), encoded=True)  # as signed: not re-quoted
        try:
            return await self.http.ws_connect(url, headers=headers, autoping=True, max_msg_size=0)
        except aiohttp.WSServerHandshakeError as e:
            raise APIError(e.status, e.message or f"cannot reach the app {app}") from None
        except aiohttp.ClientConnectionError as e:
            raise self._unreachable(e) from None


class ExecStream:
    """One streaming execution over the WebSocket: `start`, then iterate frames; `send_input` on waiting-input."""

    def __init__(self, client: Client, session_id: str, kernel: str | None = None) -> None:
        self.client = client
        self.session_id = session_id
        self.kernel = kernel
        self.ws: aiohttp.ClientWebSocketResponse | None = None

    async def __aenter__(self) -> ExecStream:
        import aiohttp

        client = self.client
        full = client._path(f"/stream/session/{self.session_id}/execute", None)
        headers = client._headers("GET", full, "application/octet-stream", send_ctype=False)
        try:
            self.ws = await client.http.ws_connect(client._url(full), headers=headers, autoping=True, max_msg_size=0)
        except aiohttp.WSServerHandshakeError as e:
            raise APIError(e.status, e.message or "cannot open the execution stream") from None
        except aiohttp.ClientConnectionError as e:
            raise client._unreachable(e) from None
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.ws is not None:
            await self.ws.close()

    async def start(
        self,
        mode: str,
        code: str = "",
        options: dict[str, Any] | None = None,
        run_id: str | None = None,
        after: int | None = None,
    ) -> None:
        """Send the code; `run_id` names the run (to interrupt just it), else the manager picks one. Re-attaching
        (mode continue): `after`, the `seq` of the last frame seen (the output after it comes again)."""
        assert self.ws is not None
        first: dict[str, Any] = {"code": code, "mode": mode, "options": options or {}}
        if run_id is not None:
            first["runId"] = run_id
        if after is not None:
            first["after"] = after
        if self.kernel is not None:
            first["kernel"] = self.kernel
        await self.ws.send_str(json.dumps(first))

    async def send_input(self, text: str) -> None:
        assert self.ws is not None
        await self.ws.send_str(text)

    async def send_eof(self) -> None:
        """The input has ended (an empty binary frame, a bai extension): the code's input() raises EOFError."""
        assert self.ws is not None
        await self.ws.send_bytes(b"")

    async def frames(self) -> AsyncIterator[dict[str, Any]]:
        import aiohttp

        assert self.ws is not None
        async for msg in self.ws:
            if msg.type == aiohttp.WSMsgType.TEXT:
                frame = json.loads(msg.data)
                yield frame
                if frame.get("status") in ("finished", "error"):
                    return
            elif msg.type in (aiohttp.WSMsgType.ERROR, aiohttp.WSMsgType.CLOSE):
                return
