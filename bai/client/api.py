"""`bai.client`: the one Python client of the bai API (signing, streaming, errors).

The CLI and the dashboard use only this module to talk to a manager.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlencode, urlsplit

import aiohttp

from bai import API_VERSION
from bai.common import auth
from bai.common.credentials import Credentials


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


class Client:
    def __init__(self, creds: Credentials, timeout: float | None = None) -> None:
        self.creds = creds
        self.endpoint = creds.endpoint.rstrip("/")
        parts = urlsplit(self.endpoint)
        self.host = parts.netloc
        self.prefix = parts.path.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=10)
        self._http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def http(self) -> aiohttp.ClientSession:
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=self._timeout)
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
        query = urlencode({k: v for k, v in (params or {}).items() if v is not None})
        return self.prefix + path + (f"?{query}" if query else "")

    async def _raise_for(self, resp: aiohttp.ClientResponse) -> None:
        if resp.status < 400:
            return
        text = await resp.text()
        try:
            body = json.loads(text)
            raise APIError(
                resp.status,
                body.get("title", resp.reason or ""),
                body.get("msg"),
                body.get("type", "").rsplit("/", 1)[-1],
                body.get("data"),
            )
        except ValueError:
            raise APIError(resp.status, resp.reason or "error", text[:500]) from None

    async def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: dict[str, Any] | None = None,
        data: Any = None,
        ctype: str | None = None,
    ) -> Any:
        full = self._path(path, params)
        body: Any = data
        if json_body is not None:
            ctype, body = "application/json", json.dumps(json_body)
        elif ctype is None:
            ctype = "text/plain"
        headers = self._headers(method, full, ctype, send_ctype=data is None)
        try:
            async with self.http.request(
                method, self.endpoint + full[len(self.prefix) :], data=body, headers=headers
            ) as resp:
                await self._raise_for(resp)
                if resp.status == 204:
                    return None
                return await resp.json(content_type=None)
        except aiohttp.ClientConnectionError as e:
            raise APIError(0, f"cannot reach the manager at {self.endpoint}", str(e)) from None

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
            },
            "enqueueOnly": kw.get("enqueue_only", False),
            "maxWaitSeconds": kw.get("max_wait", 0),
            "reuseIfExists": True,
            "startupCommand": kw.get("startup_command"),
            "clusterSize": 1,
        }
        return await self.request("POST", "/session", json_body=body)

    async def get_session(self, ref: str) -> dict[str, Any]:
        return await self.request("GET", f"/session/{ref}")

    async def list_sessions(self, all: bool = False, status: str | None = None) -> list[dict[str, Any]]:
        params = {"all": "true" if all else None, "status": status}
        return (await self.request("GET", "/session", params=params))["items"]

    async def destroy_session(self, ref: str, forced: bool = False) -> dict[str, Any]:
        return await self.request("DELETE", f"/session/{ref}", params={"forced": "true" if forced else None})

    async def interrupt(self, ref: str) -> None:
        await self.request("POST", f"/session/{ref}/interrupt")

    async def logs(self, ref: str) -> str:
        return (await self.request("GET", f"/session/{ref}/logs"))["result"]["logs"]

    async def follow_logs(self, ref: str) -> AsyncIterator[str]:
        full = self._path(f"/session/{ref}/logs", {"follow": "true"})
        headers = self._headers("GET", full, "text/plain")
        try:
            async with self.http.get(
                self.endpoint + full[len(self.prefix) :],
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            ) as resp:
                await self._raise_for(resp)
                decoder = __import__("codecs").getincrementaldecoder("utf-8")("replace")
                async for chunk in resp.content.iter_any():
                    yield decoder.decode(chunk)
        except aiohttp.ClientConnectionError as e:
            raise APIError(0, f"cannot reach the manager at {self.endpoint}", str(e)) from None

    async def upload(self, ref: str, files: list[tuple[str, bytes]]) -> None:
        form = aiohttp.FormData()
        for name, content in files:
            form.add_field("src", content, filename=name, content_type="application/octet-stream")
        await self.request("POST", f"/session/{ref}/upload", data=form, ctype="multipart/form-data")

    async def agents(self) -> list[dict[str, Any]]:
        return (await self.request("GET", "/agents"))["items"]

    async def images(self) -> list[dict[str, Any]]:
        return (await self.request("GET", "/images"))["items"]

    def execute(self, session_id: str) -> ExecStream:
        return ExecStream(self, session_id)


class ExecStream:
    """One streaming execution over the WebSocket: `start`, then iterate frames; `send_input` on waiting-input."""

    def __init__(self, client: Client, session_id: str) -> None:
        self.client = client
        self.session_id = session_id
        self.ws: aiohttp.ClientWebSocketResponse | None = None

    async def __aenter__(self) -> ExecStream:
        full = self.client._path(f"/stream/session/{self.session_id}/execute", None)
        headers = self.client._headers("GET", full, "application/octet-stream", send_ctype=False)
        url = self.client.endpoint + full[len(self.client.prefix) :]
        try:
            self.ws = await self.client.http.ws_connect(url, headers=headers, autoping=True, max_msg_size=0)
        except aiohttp.WSServerHandshakeError as e:
            raise APIError(e.status, e.message or "cannot open the execution stream") from None
        except aiohttp.ClientConnectionError as e:
            raise APIError(0, f"cannot reach the manager at {self.client.endpoint}", str(e)) from None
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.ws is not None:
            await self.ws.close()

    async def start(self, mode: str, code: str = "", options: dict[str, Any] | None = None) -> None:
        assert self.ws is not None
        await self.ws.send_str(json.dumps({"code": code, "mode": mode, "options": options or {}}))

    async def send_input(self, text: str) -> None:
        assert self.ws is not None
        await self.ws.send_str(text)

    async def frames(self) -> AsyncIterator[dict[str, Any]]:
        assert self.ws is not None
        async for msg in self.ws:
            if msg.type == aiohttp.WSMsgType.TEXT:
                frame = json.loads(msg.data)
                yield frame
                if frame.get("status") in ("finished", "error"):
                    return
            elif msg.type in (aiohttp.WSMsgType.ERROR, aiohttp.WSMsgType.CLOSE):
                return
