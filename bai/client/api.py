"""`bai.client`: the one Python client of the bai API (signing, streaming, errors).

The CLI and the dashboard use only this module to talk to a manager. Plain requests go through the
standard library's http.client (in a worker thread), which imports in a few milliseconds; the WebSocket
of streaming execution is bai.client.wsclient's (asyncio's streams). aiohttp (about 150-300 ms to import)
is loaded only for uploads, downloads of a session's files, terminals and app tunnels; `overlap_import`
imports it while a first request is under way.

A client may be given several managers (`Credentials.endpoints`, see bai.client.endpoints): a request that
cannot connect tries the next ones; one that broke after it was sent is retried there only when it is a
GET or HEAD (a POST might otherwise run twice), and the next request starts there anyway. HTTP error
answers are answers. A broken session event stream or followed log goes on through the next manager
(the log from where it broke); the dashboard's stream and streaming runs re-attach themselves.
"""

from __future__ import annotations

import codecs
import http.client
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote, urlencode, urlsplit

from bai import API_VERSION
from bai.client.endpoints import Endpoint, Endpoints
from bai.common import auth
from bai.common.credentials import Credentials

if TYPE_CHECKING:
    import aiohttp
    import yarl

    from bai.client.wsclient import HandshakeRefused, WebSocket

T = TypeVar("T")
SAFE_METHODS = ("GET", "HEAD")  # retried on the next manager after a break: they change nothing
CONNECT_TIMEOUT = 10.0  # seconds to open a connection to a manager before trying the next one
LOG_CATCH_UP_PAGE = 1 << 20  # bytes a page of the log a resumed follow reads up to where it broke


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


BROKEN = (OSError, http.client.HTTPException)  # what a connection raises when it breaks mid-way


class _Lines:
    """The lines of a streamed response, read with read1: HTTPResponse.readline takes a connection that
    closed between two chunks for the stream's end, read1 raises IncompleteRead."""

    def __init__(self, resp: http.client.HTTPResponse) -> None:
        self.resp = resp
        self.buf = b""

    def readline(self) -> bytes:
        while (end := self.buf.find(b"\n")) < 0:
            more = self.resp.read1(65536)
            if not more:
                line, self.buf = self.buf, b""
                return line
            self.buf += more
        line, self.buf = self.buf[: end + 1], self.buf[end + 1 :]
        return line


def _read_event(resp: _Lines) -> list[bytes]:
    """The lines of the next Server-Sent Event, up to its blank line (one thread hop per event);
    an empty list at the end of the stream."""
    lines: list[bytes] = []
    while line := resp.readline():
        if line in (b"\n", b"\r\n"):
            if lines:
                return lines
            continue
        lines.append(line)
    return lines


def _ref(ref: str) -> str:
    """A name, email or id as one segment of a path (an email may hold /, ? or #)."""
    return quote(ref, safe="@+")


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


def _refusal(e: HandshakeRefused, refused: str) -> APIError:
    """The APIError of a refused WebSocket upgrade: the manager's problem when its body is one."""
    text = e.body.decode(errors="replace")
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if isinstance(body, dict) and body.get("title"):
        return _error_from(e.status, e.reason, text)
    return APIError(e.status, refused, f"HTTP {e.status} {e.reason}".strip())


# the paths that take owner_access_key: a session's endpoints, the session list, session events
OWNER_SCOPED = ("/session", "/bai/session/", "/stream/session/", "/events/session")


class Client:
    """bai's asynchronous API client: signed requests, streams, uploads and downloads."""

    def __init__(self, creds: Credentials) -> None:
        self.creds = creds
        try:
            self.ends = Endpoints(creds.endpoints)
        except ValueError as e:
            raise APIError(0, f"bad endpoint {str(e)!r}", "use http://HOST:PORT") from None
        self._http: aiohttp.ClientSession | None = None
        self._ssl: Any = None
        # admins: act on this keypair's sessions (Backend.AI's owner_access_key), names included
        self.owner: str | None = None
        # plain requests block the calling thread instead of a worker's (no event loop needed): for one
        # request from the CLI (bai.cli.common.call_now); streams, uploads and WebSockets still need one
        self.blocking = False

    @property
    def endpoint(self) -> str:
        """The URL of the manager in use now (the first given, until it stops answering)."""
        return self.ends.current.url

    @property
    def endpoints(self) -> tuple[str, ...]:
        return tuple(e.url for e in self.ends.all)

    @property
    def scheme(self) -> str:
        return self.ends.current.scheme

    @property
    def host(self) -> str:
        return self.ends.current.host

    @property
    def prefix(self) -> str:
        return self.ends.current.prefix

    @property
    def on_move(self) -> Callable[[str, str], None] | None:
        """Told (old URL, new URL) once each time the client moves to another manager (from any thread)."""
        return self.ends.on_move

    @on_move.setter
    def on_move(self, fn: Callable[[str, str], None] | None) -> None:
        self.ends.on_move = fn

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def http(self) -> aiohttp.ClientSession:
        import aiohttp

        if self._http is None:
            https = any(e.scheme == "https" for e in self.ends.all)
            connector = aiohttp.TCPConnector(ssl=self.ssl_context) if https else None
            self._http = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10), connector=connector
            )
        return self._http

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()

    # -- plumbing ----------------------------------------------------------------------------------

    def _headers(
        self, method: str, path: str, ctype: str, send_ctype: bool = True, host: str | None = None
    ) -> dict[str, str]:
        """Signed headers of a request to `path` (the full path) of the manager at `host` [the current one]."""
        date = auth.now_header()
        signature = auth.sign(self.creds.secret_key, method, path, date, host or self.host, ctype, API_VERSION)
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
        """The path and query of a request, without the endpoint's own path (`Endpoint.prefix`)."""
        if self.owner and path.startswith(OWNER_SCOPED):
            params = {**(params or {}), "owner_access_key": self.owner}
        query = urlencode({k: v for k, v in (params or {}).items() if v is not None})
        return path + (f"?{query}" if query else "")

    def _unreachable(self, e: Exception, endpoint: str | None = None) -> APIError:
        import ssl

        endpoint = endpoint or self.endpoint
        if isinstance(e, ssl.SSLCertVerificationError):
            hint = f"{e.verify_message}: trust its CA with `bai --ca FILE` (or BACKEND_CA_FILE)"
            return APIError(0, f"the manager at {endpoint} has a certificate bai does not trust", hint)
        return APIError(0, f"cannot reach the manager at {endpoint}", str(e) or type(e).__name__)

    def _none_answered(self, failures: list[tuple[int, Exception]]) -> APIError:
        """The error when no manager could be reached: each one tried, and why."""
        if len(failures) == 1:
            i, e = failures[0]
            return self._unreachable(e, self.ends[i].url)
        why = "; ".join(f"{self.ends[i].url}: {str(e) or type(e).__name__}" for i, e in failures)
        return APIError(0, f"cannot reach the manager at {self.ends.names([i for i, _ in failures])}", why)

    def _broke_off(self, what: str, e: Exception) -> APIError:
        if isinstance(e, OSError):
            return self._unreachable(e)
        return APIError(0, f"the {what} broke off", str(e) or type(e).__name__)

    def _sent_but_broke(self, method: str, endpoint: str, e: Exception) -> APIError:
        """A request that is not retried (it may have been done) broke after it was sent."""
        return APIError(
            0,
            f"the manager at {endpoint} broke off the {method} request",
            f"{str(e) or type(e).__name__}; it may or may not have been done"
            " (the next request goes to the next manager)",
        )

    @property
    def ssl_context(self):
        """The TLS context for an https:// manager: the system's CAs, or BACKEND_CA_FILE (`bai --ca`)."""
        if self._ssl is None:
            import ssl

            self._ssl = ssl.create_default_context(cafile=os.environ.get("BACKEND_CA_FILE") or None)
        return self._ssl

    def _connect_to(self, ep: Endpoint) -> http.client.HTTPConnection:
        """A connection to `ep`, made (OSError when it cannot be: refused, timed out, no such host)."""
        conn: http.client.HTTPConnection
        if ep.scheme == "https":
            conn = http.client.HTTPSConnection(ep.host, timeout=CONNECT_TIMEOUT, context=self.ssl_context)
        else:
            conn = http.client.HTTPConnection(ep.host, timeout=CONNECT_TIMEOUT)
        try:
            conn.connect()
        except BaseException:
            conn.close()
            raise
        if conn.sock is not None:
            conn.sock.settimeout(None)  # a long stream may be quiet for a long time
        return conn

    def _connect(self) -> tuple[int, http.client.HTTPConnection]:
        """A connection to the first manager that takes one (from the current one on)."""
        failures: list[tuple[int, Exception]] = []
        for i in self.ends.order():
            try:
                return i, self._connect_to(self.ends[i])
            except OSError as e:
                failures.append((i, e))
        raise self._none_answered(failures)

    def _send(self, method: str, rel: str, body: bytes | None, ctype: str) -> tuple[int, http.client.HTTPResponse]:
        """Send a signed request (`rel`: path and query) and return (which manager answered, its response)
        once the headers are in (blocking). Tries the managers in order as the module says."""
        failures: list[tuple[int, Exception]] = []
        for i in self.ends.order():
            ep = self.ends[i]
            try:
                conn = self._connect_to(ep)
            except OSError as e:
                failures.append((i, e))
                continue
            full = ep.prefix + rel
            try:
                conn.request(method, full, body=body, headers=self._headers(method, full, ctype, host=ep.host))
                resp = conn.getresponse()
            except BROKEN as e:
                conn.close()
                self.ends.broke(i)
                if method not in SAFE_METHODS:
                    raise self._sent_but_broke(method, ep.url, e) from None
                failures.append((i, e))
                continue
            self.ends.answered(i)
            if resp.status >= 400:
                text = resp.read().decode(errors="replace")
                conn.close()
                raise _error_from(resp.status, resp.reason, text)
            return i, resp
        raise self._none_answered(failures)

    def _open(self, method: str, rel: str, body: bytes | None, ctype: str) -> http.client.HTTPResponse:
        """Send a signed request and return the response once its headers are in (blocking)."""
        return self._send(method, rel, body, ctype)[1]

    def _call(self, method: str, full: str, body: bytes | None, ctype: str) -> Any:
        for tries_left in range(len(self.ends) - 1, -1, -1):
            i, resp = self._send(method, full, body, ctype)
            try:
                data = resp.read()
            except BROKEN as e:  # the answer broke off: a GET is asked again of the next manager
                self.ends.broke(i)
                if method in SAFE_METHODS and tries_left:
                    continue
                raise self._broke_off("answer", e) from None
            finally:
                resp.close()
            return json.loads(data) if data and resp.status != 204 else None
        raise AssertionError("unreachable")

    async def _aio(
        self,
        method: str,
        rel: str,
        ctype: str,
        send: Callable[[yarl.URL, dict[str, str]], Awaitable[T]],
        send_ctype: bool = False,
    ) -> T:
        """`send(url, signed headers)` through aiohttp, trying the managers in order as the module says;
        `send` turns error answers into APIErrors (they are answers: no other manager is tried)."""
        import aiohttp
        import yarl

        failures: list[tuple[int, Exception]] = []
        for i in self.ends.order():
            ep = self.ends[i]
            full = ep.prefix + rel
            headers = self._headers(method, full, ctype, send_ctype=send_ctype, host=ep.host)
            url = yarl.URL(f"{ep.scheme}://{ep.host}{full}", encoded=True)  # as signed: not re-quoted
            try:
                result = await send(url, headers)
            except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as e:
                failures.append((i, e))
                continue
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as e:
                self.ends.broke(i)
                if method not in SAFE_METHODS:
                    raise self._sent_but_broke(method, ep.url, e) from None
                failures.append((i, e))
                continue
            except APIError:
                self.ends.answered(i)
                raise
            self.ends.answered(i)
            return result
        raise self._none_answered(failures)

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
        for key in ("group", "domain"):  # the project (name or id) and its domain; the manager's defaults if not given
            if kw.get(key):
                body[key] = kw[key]
        if kw.get("priority") is not None:
            body["priority"] = kw["priority"]
        if kw.get("time_limit") is not None:
            body["timeLimit"] = kw["time_limit"]
        if kw.get("preemptible") is False:
            body["preemptible"] = False
        return await self.request("POST", "/session", json_body=body)

    async def set_priority(self, ref: str, priority: int) -> dict[str, Any]:
        """A live session's scheduling priority (0-100; lowered to your policy's max_priority): the session."""
        return await self.request("POST", f"/session/{ref}/priority", json_body={"priority": priority})

    # -- session templates (Backend.AI's /template/session) --

    async def create_templates(self, payload: str, group: str | None = None) -> list[dict[str, Any]]:
        """Store the templates of `payload` (YAML or JSON text): `[{"id", "user"}]`."""
        body: dict[str, Any] = {"payload": payload}
        if group:
            body["group"] = group
        return await self.request("POST", "/template/session", json_body=body)

    async def list_templates(self, all: bool = False) -> list[dict[str, Any]]:
        return await self.request("GET", "/template/session", params={"all": "true" if all else None})

    async def get_template(self, template_id: str) -> dict[str, Any]:
        return await self.request("GET", f"/template/session/{quote(template_id, safe='')}")

    async def update_template(self, template_id: str, payload: str) -> dict[str, Any]:
        path = f"/template/session/{quote(template_id, safe='')}"
        return await self.request("PUT", path, json_body={"payload": payload})

    async def delete_template(self, template_id: str) -> dict[str, Any]:
        return await self.request("DELETE", f"/template/session/{quote(template_id, safe='')}")

    async def create_from_template(self, template_id: str, overrides: dict[str, Any]) -> dict[str, Any]:
        """A session from a template, the fields of `overrides` (a create request's) on top of the template's."""
        body = {**overrides, "template_id": template_id}
        return await self.request("POST", "/session/_/create-from-template", json_body=body)

    # -- scheduling rounds kept for replay (superadmins) --

    async def scheduler_rounds(self, limit: int = 20, before: int | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit}
        if before is not None:
            params["before"] = before
        return await self.request("GET", "/bai/scheduler/rounds", params=params)

    async def replay_round(self, number: int) -> dict[str, Any]:
        return await self.request("GET", f"/bai/scheduler/rounds/{number}")

    async def fair_share(self) -> dict[str, Any]:
        """Fair share's standings: each keypair's and project's decayed usage, part and factor (those one may see)."""
        return await self.request("GET", "/bai/scheduler/fair-share")

    # -- resource presets (Backend.AI's /resource/presets, /resource/check-presets; bai's /bai/presets) --

    async def presets(self) -> list[dict[str, Any]]:
        """Every resource preset: `{name, resource_slots, shared_memory, scaling_group_name}`."""
        return await self.request("GET", "/bai/presets")

    async def preset(self, name: str) -> dict[str, Any]:
        return await self.request("GET", f"/bai/presets/{quote(name, safe='')}")

    async def check_presets(self, group: str | None = None, scaling_group: str | None = None) -> dict[str, Any]:
        """What the caller may still take, in a project and scaling group, and which presets fit now."""
        body = {k: v for k, v in (("group", group), ("scaling_group", scaling_group)) if v}
        return await self.request("POST", "/resource/check-presets", json_body=body)

    async def create_preset(self, name: str, **fields: Any) -> dict[str, Any]:
        """fields: resource_slots ({slot: amount}), shared_memory (a size), scaling_group_name."""
        body = {"name": name, **{k: v for k, v in fields.items() if v is not None}}
        return await self.request("POST", "/bai/presets", json_body=body)

    async def update_preset(self, preset: str, **fields: Any) -> dict[str, Any]:
        """fields: name (a new one), resource_slots, shared_memory, scaling_group_name ("": every group)."""
        body = {k: v for k, v in fields.items() if v is not None}
        return await self.request("PATCH", f"/bai/presets/{quote(preset, safe='')}", json_body=body)

    async def delete_preset(self, name: str) -> dict[str, Any]:
        return await self.request("DELETE", f"/bai/presets/{quote(name, safe='')}")

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
        """A session's output as it comes, until the session ends. With several managers a broken stream
        goes on through the next one from where it broke: the log is read as from cursor `since` (after
        `tail` lines, read first as a page), and the bytes already shown are skipped in pages of it."""
        since = None
        if tail is not None and len(self.ends) > 1:
            page = await self.log_page(ref, tail=tail, since_time=since_time, kernel=kernel)
            yield page["logs"]
            if page.get("purged"):
                return
            tail, since = None, page["next"]
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        idle_breaks = 0
        while True:
            params = {"follow": "true", "tail": tail, "since": since, "sinceTime": since_time, "kernel": kernel}
            i, resp = await _in_thread(
                self._send, "GET", self._path(f"/session/{ref}/logs", params), None, "text/plain"
            )
            got = 0  # bytes of this stream, after `since`
            try:
                while chunk := await _in_thread(resp.read1, 65536):
                    got += len(chunk)
                    yield decoder.decode(chunk)
                return
            except BROKEN as e:
                self.ends.broke(i)
                idle_breaks = 0 if got else idle_breaks + 1
                if len(self.ends) == 1 or idle_breaks > len(self.ends):
                    raise self._unreachable(e, self.ends[i].url) from None
            finally:
                _abort(resp)
            since, rest = await self._log_after(ref, since or 0, got, since_time, kernel)
            if rest:
                yield decoder.decode(rest)

    async def _log_after(
        self, ref: str, since: int, skip: int, since_time: str | None, kernel: str | None
    ) -> tuple[int, bytes]:
        """Where a followed log that broke after `skip` bytes (after cursor `since`) goes on: (the cursor
        to follow from, the bytes after the first `skip` up to it), read in pages."""
        rest = b""
        while True:
            page = await self.log_page(ref, since=since, limit=LOG_CATCH_UP_PAGE, since_time=since_time, kernel=kernel)
            data = page["logs"].encode() if not page.get("purged") else b""
            since = page["next"]
            if skip < len(data):
                rest += data[skip:]
            skip = max(0, skip - len(data))
            if not page.get("more") or page.get("purged"):
                return since, rest

    async def events(self, ref: str | None = None, until_end: bool = True) -> AsyncIterator[tuple[str, dict]]:
        """Session lifecycle events (Server-Sent Events) as (event name, data). With several managers a
        broken stream goes on through the next one (the events of the moment between are not seen again;
        a session that ended meanwhile has its final event sent at once)."""
        params = {"sessionName": ref, "scope": "session", "follow": "false" if until_end and ref else None}
        async for item in self._sse(self._path("/events/session", params), resume=True):
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

    async def _sse(self, full: str, resume: bool = False) -> AsyncIterator[tuple[str, dict]]:
        """Read Server-Sent Events; each event's data is JSON. Reading happens in a worker thread. A broken
        stream makes the next request start at the next manager; with `resume` (and several managers) the
        stream is opened again there (it goes on; an error when it breaks again at once everywhere)."""
        idle_breaks = 0
        while True:
            i, resp = await _in_thread(self._send, "GET", full, None, "application/octet-stream")
            name, data = "message", []
            seen = False
            reader = _Lines(resp)
            try:
                while True:
                    lines = await _in_thread(_read_event, reader)
                    if not lines:
                        return
                    for line in lines:
                        text = line.decode().rstrip("\r\n")
                        if text.startswith("event:"):
                            name = text[6:].strip()
                        elif text.startswith("data:"):
                            data.append(text[5:].strip())
                    if data:
                        seen = True
                        yield name, json.loads("\n".join(data))
                    name, data = "message", []
            except BROKEN as e:
                self.ends.broke(i)
                idle_breaks = 0 if seen else idle_breaks + 1
                if not resume or len(self.ends) == 1 or idle_breaks > len(self.ends):
                    raise self._unreachable(e, self.ends[i].url) from None
            finally:
                _abort(resp)

    async def upload(self, ref: str, files: list[tuple[str, bytes]]) -> None:
        import aiohttp

        async def send(url: yarl.URL, headers: dict[str, str]) -> None:
            form = aiohttp.FormData()  # (a form is sent once: a fresh one for each manager tried)
            for name, content in files:
                form.add_field("src", content, filename=name, content_type="application/octet-stream")
            async with self.http.post(url, data=form, headers=headers) as resp:
                if resp.status >= 400:
                    raise _error_from(resp.status, resp.reason or "", await resp.text())

        await self._aio("POST", self._path(f"/session/{ref}/upload", None), "multipart/form-data", send)

    async def download(self, ref: str, paths: list[str]) -> list[bytes]:
        """Files of a session's kernel (Backend.AI's `session download`): one tar archive per path."""
        import aiohttp

        body = json.dumps({"files": paths}).encode()

        async def send(url: yarl.URL, headers: dict[str, str]) -> list[bytes]:
            async with self.http.get(url, data=body, headers=headers) as resp:
                if resp.status >= 400:
                    raise _error_from(resp.status, resp.reason or "", await resp.text())
                reader = aiohttp.MultipartReader.from_response(resp)
                archives = []
                while (part := await reader.next()) is not None:
                    archives.append(bytes(await part.read(decode=False)))
                return archives

        return await self._aio("GET", self._path(f"/session/{ref}/download", None), "application/json", send, True)

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

    # -- teams: users, projects (Backend.AI's groups), domains, scaling groups ----------------------------

    async def users(
        self, domain: str | None = None, project: str | None = None, status: str | None = None
    ) -> list[dict[str, Any]]:
        params = {"domain": domain, "project": project, "status": status}
        return (await self.request("GET", "/bai/users", params=params))["items"]

    async def user(self, ref: str) -> dict[str, Any]:
        """A user by email, username or uuid."""
        return await self.request("GET", f"/bai/users/{_ref(ref)}")

    async def create_user(self, email: str, password: str, **fields: Any) -> dict[str, Any]:
        """fields: username, full_name, role, status, domain, projects (names or ids), resource_policy,
        need_password_change, description."""
        body = {"email": email, "password": password, **{k: v for k, v in fields.items() if v is not None}}
        return await self.request("POST", "/bai/users", json_body=body)

    async def update_user(self, ref: str, **fields: Any) -> dict[str, Any]:
        """fields: as create_user's (not email nor domain), is_active; projects replaces the memberships."""
        return await self.request("PATCH", f"/bai/users/{_ref(ref)}", json_body=fields)

    async def delete_user(self, ref: str, purge: bool = False) -> dict[str, Any]:
        """Deleted (its keypairs stop at once), or with purge gone for good ({"purged": true})."""
        params = {"purge": "true" if purge else None}
        return await self.request("DELETE", f"/bai/users/{_ref(ref)}", params=params)

    async def projects(self, domain: str | None = None) -> list[dict[str, Any]]:
        """Projects with their usage (sessions, occupied, cap)."""
        return (await self.request("GET", "/bai/projects", params={"domain": domain}))["items"]

    async def project(self, ref: str, domain: str | None = None) -> dict[str, Any]:
        """A project by id, or by name in `domain` (the caller's by default), with its usage and members."""
        return await self.request("GET", f"/bai/projects/{_ref(ref)}", params={"domain": domain})

    async def create_project(self, name: str, **fields: Any) -> dict[str, Any]:
        """fields: domain, description, total_resource_slots, resource_policy, is_active."""
        body = {"name": name, **{k: v for k, v in fields.items() if v is not None}}
        return await self.request("POST", "/bai/projects", json_body=body)

    async def update_project(self, ref: str, domain: str | None = None, **fields: Any) -> dict[str, Any]:
        """fields: name, description, total_resource_slots, resource_policy, is_active."""
        path = f"/bai/projects/{_ref(ref)}"
        return await self.request("PATCH", path, json_body=fields, params={"domain": domain})

    async def delete_project(self, ref: str, domain: str | None = None, purge: bool = False) -> dict[str, Any]:
        """Deactivated, or with purge gone for good ({"purged": true})."""
        params = {"domain": domain, "purge": "true" if purge else None}
        return await self.request("DELETE", f"/bai/projects/{_ref(ref)}", params=params)

    async def change_members(
        self, ref: str, add: list[str] | None = None, remove: list[str] | None = None, domain: str | None = None
    ) -> dict[str, Any]:
        """Add and/or remove users (emails, usernames or ids) of a project; the project with its members."""
        body = {k: v for k, v in (("add", add), ("remove", remove)) if v}
        path = f"/bai/projects/{_ref(ref)}/members"
        return await self.request("POST", path, json_body=body, params={"domain": domain})

    async def domains(self) -> list[dict[str, Any]]:
        return (await self.request("GET", "/bai/domains"))["items"]

    async def create_domain(self, name: str, **fields: Any) -> dict[str, Any]:
        """fields: description, total_resource_slots, is_active."""
        body = {"name": name, **{k: v for k, v in fields.items() if v is not None}}
        return await self.request("POST", "/bai/domains", json_body=body)

    async def update_domain(self, name: str, **fields: Any) -> dict[str, Any]:
        return await self.request("PATCH", f"/bai/domains/{_ref(name)}", json_body=fields)

    async def delete_domain(self, name: str, purge: bool = False) -> dict[str, Any]:
        """Deactivated, or with purge (an empty domain) gone for good ({"purged": true})."""
        params = {"purge": "true" if purge else None}
        return await self.request("DELETE", f"/bai/domains/{_ref(name)}", params=params)

    async def scaling_groups(self, project: str | None = None) -> list[dict[str, Any]]:
        """Scaling groups and where they may be used (superadmins: all; others: those open to them)."""
        return (await self.request("GET", "/bai/scaling-groups", params={"project": project}))["items"]

    async def associate_scaling_group(self, name: str, kind: str, target: str, remove: bool = False) -> dict[str, Any]:
        """Open (or with remove close) a scaling group to a domain, a project or a keypair (`kind`); the
        scaling group with `changed`."""
        body: dict[str, Any] = {kind: target}
        if remove:
            body["remove"] = True
        return await self.request("POST", f"/bai/scaling-groups/{_ref(name)}/associations", json_body=body)

    async def available_scaling_groups(self, project: str | None = None) -> list[str]:
        """Backend.AI's get-available: the names of the scaling groups the caller may use in a project."""
        found = await self.request("GET", "/scaling-groups", params={"group": project})
        return [g["name"] for g in found["scaling_groups"]]

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
            i, conn = self._connect()
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
            except BROKEN as e:
                self.ends.broke(i)
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
            i, conn = self._connect()
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
            except BROKEN as e:
                self.ends.broke(i)
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
        params: dict[str, Any] = {"rows": rows, "cols": cols, "kernel": kernel}
        if command:
            params["command"] = json.dumps(command)
        return await self._websocket(
            self._path(f"/stream/session/{session_id}/pty", params), "cannot open the terminal"
        )

    async def _websocket(self, rel: str, refused: str) -> aiohttp.ClientWebSocketResponse:
        """A WebSocket to `rel` (path and query) of the first manager that answers; `refused`: the error's
        title when the manager refuses it without saying why."""
        import aiohttp

        async def send(url: yarl.URL, headers: dict[str, str]) -> aiohttp.ClientWebSocketResponse:
            try:
                return await self.http.ws_connect(url, headers=headers, autoping=True, max_msg_size=0)
            except aiohttp.WSServerHandshakeError as e:
                raise APIError(e.status, e.message or refused) from None

        return await self._aio("GET", rel, "application/octet-stream", send)

    async def websocket(self, rel: str, refused: str) -> WebSocket:
        """A WebSocket of bai.client.wsclient (no aiohttp) to `rel` (path and query) of the first manager that
        answers, its upgrade request signed as any request; `refused`: the error's title when the manager
        refuses it without saying why. Managers are tried as the module says (a GET: one that broke during
        the handshake too)."""
        from bai.client import wsclient

        failures: list[tuple[int, Exception]] = []
        for i in self.ends.order():
            ep = self.ends[i]
            parts = urlsplit(ep.url)
            full = ep.prefix + rel
            signed = self._headers("GET", full, "application/octet-stream", send_ctype=False, host=ep.host)
            headers = {"Host": ep.host, **signed}
            tls = self.ssl_context if ep.scheme == "https" else None
            try:
                reader, writer = await wsclient.open_stream(
                    parts.hostname or "", parts.port or (443 if tls else 80), ssl=tls, timeout=CONNECT_TIMEOUT
                )
            except OSError as e:  # (TimeoutError too)
                failures.append((i, e))
                continue
            try:
                ws = await wsclient.handshake(reader, writer, full, headers)
            except BaseException as e:
                writer.close()
                if isinstance(e, wsclient.HandshakeRefused):
                    self.ends.answered(i)
                    raise _refusal(e, refused) from None
                if isinstance(e, wsclient.HandshakeError):
                    self.ends.answered(i)
                    raise APIError(0, f"the WebSocket handshake with the manager at {ep.url} failed:", str(e)) from None
                if not isinstance(e, OSError):
                    raise
                self.ends.broke(i)  # (it broke during the handshake: a GET, tried at the next one)
                failures.append((i, e))
                continue
            self.ends.answered(i)
            return ws
        raise self._none_answered(failures)

    async def apps(self, ref: str) -> list[dict[str, Any]]:
        """The session's apps (Backend.AI's `servicePorts` items, with bai's `host_ports`)."""
        return await self.request("GET", f"/stream/session/{ref}/apps")

    async def start_app(self, ref: str, app: str) -> dict[str, Any]:
        """Start an app unless it runs: {"app", "started"} (an APIError with its output when it fails)."""
        return await self.request("POST", f"/stream/session/{ref}/apps/{app}/start")

    async def app_tunnel(self, session_id: str, app: str) -> aiohttp.ClientWebSocketResponse:
        """A WebSocket carrying one TCP connection to the app (`GET /stream/session/{id}/tcpproxy`)."""
        rel = self._path(f"/stream/session/{session_id}/tcpproxy", {"app": app})
        return await self._websocket(rel, f"cannot reach the app {app}")


class ExecStream:
    """One streaming execution over the WebSocket (bai.client.wsclient's): `start`, then iterate frames;
    `send_input` on waiting-input."""

    def __init__(self, client: Client, session_id: str, kernel: str | None = None) -> None:
        self.client = client
        self.session_id = session_id
        self.kernel = kernel
        self.ws: WebSocket | None = None
        self._index = 0  # the manager it is open to

    async def __aenter__(self) -> ExecStream:
        client = self.client
        rel = client._path(f"/stream/session/{self.session_id}/execute", None)
        self.ws = await client.websocket(rel, "cannot open the execution stream")
        self._index = client.ends.order()[0]  # the one that answered (it is the current one now)
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
        await self.ws.send_text(json.dumps(first))

    async def send_input(self, text: str) -> None:
        assert self.ws is not None
        await self.ws.send_text(text)

    async def send_eof(self) -> None:
        """The input has ended (an empty binary frame, a bai extension): the code's input() raises EOFError."""
        assert self.ws is not None
        await self.ws.send_bytes(b"")

    async def frames(self) -> AsyncIterator[dict[str, Any]]:
        from bai.client.wsclient import Opcode, ProtocolError

        assert self.ws is not None
        try:
            async for msg in self.ws:
                if msg.kind == Opcode.TEXT:
                    assert isinstance(msg.data, str)
                    frame = json.loads(msg.data)
                    yield frame
                    if frame.get("status") in ("finished", "error"):
                        return
        except ProtocolError:
            pass  # (the connection was failed with a close code saying why)
        # the stream ended before the run did (a caller re-attaches): the next request tries the next manager
        self.client.ends.broke(self._index)
