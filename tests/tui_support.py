"""Helpers for the dashboard tests: wait on the app, and a client wrapper that makes pictures repeatable.

`StableClient` passes every call to a real `bai.client.Client` talking to a real node, and rewrites
only what differs from run to run — session and kernel ids (uuid4), access keys, host names, container
ids and timestamps — into values derived from names and a frozen clock. Statuses, queue positions,
reasons, slots and log text are the node's own.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from bai.client.api import Client

FROZEN = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
NAMESPACE = uuid.UUID("6ba7b810-9dad-11d1-80b4-00c04fd430c8")
ACCESS_KEY = "AKIATESTADMIN0000000"
UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")

# how long before the frozen clock each kind of timestamp is shown
AGO = {
    "creationTime": timedelta(minutes=12),
    "created_at": timedelta(minutes=12),
    "startedAt": timedelta(minutes=11, seconds=58),  # after 2 s in the queue
    "started_at": timedelta(minutes=11, seconds=58),
    "statusChanged": timedelta(minutes=7),
    "terminationTime": timedelta(minutes=3),
    "lastSeen": timedelta(seconds=2),
    "firstContact": timedelta(hours=2),
    "first_at": timedelta(minutes=11),
    "last_at": timedelta(minutes=10),
    "last_try": timedelta(minutes=10),
    "now": timedelta(0),
}


def session_usage(s: dict[str, Any]) -> dict[str, Any] | None:
    """Fixed live figures of a session that reached an agent (none before): a quarter of a core, 64 MiB."""
    if not s.get("agent"):
        return None
    return {
        "at": _iso(timedelta(seconds=2)), "cpuPct": 25.0, "cpuMs": 1500, "memBytes": 64 << 20,
        "memPeakBytes": 80 << 20, "netRxBytes": 0, "netTxBytes": 0, "ioReadBytes": 4 << 20, "ioWriteBytes": 0,
        "pids": 3,
    }  # fmt: skip


def agent_usage(a: dict[str, Any]) -> dict[str, Any]:
    """Fixed figures of an agent's host: one and a half of 4 cores busy, 3 of 16 GiB used."""
    return {
        "at": _iso(timedelta(seconds=1)),
        "cpuPct": 150.0,
        "cpuCount": 4,
        "memBytes": 3 << 30,
        "memTotalBytes": 16 << 30,
    }


def frozen_clock() -> datetime:
    return FROZEN


def _iso(delta: timedelta) -> str:
    return (FROZEN - delta).isoformat()


class StableClient:
    """A `Client` whose answers carry repeatable ids and times (see the module docstring)."""

    def __init__(self, real: Client) -> None:
        self.real = real
        self.endpoint = "http://127.0.0.1:8091"
        self.ids: dict[str, str] = {}  # real id -> stable id
        self.back: dict[str, str] = {}  # stable id -> real id
        self.hosts: dict[str, str] = {}

    # -- rewriting ----------------------------------------------------------------------------------

    def _id(self, real: str, seed: str) -> str:
        if real not in self.ids:
            stable = str(uuid.uuid5(NAMESPACE, seed))
            self.ids[real] = stable
            self.back[stable] = real
        return self.ids[real]

    def _session(self, s: dict[str, Any]) -> dict[str, Any]:
        s = dict(s)
        name = s.get("name") or s.get("sessionName")
        for key in ("id", "sessionId"):
            if key in s:
                s[key] = self._id(s[key], f"session/{name}")
        if "kernels" in s:
            kernels = []
            for i, k in enumerate(s["kernels"]):
                if isinstance(k, str):
                    kernels.append(self._id(k, f"kernel/{name}/{i}"))
                else:
                    k = dict(k, id=self._id(k["id"], f"kernel/{name}/{i}"))
                    if k.get("containerId"):
                        k["containerId"] = uuid.uuid5(NAMESPACE, f"container/{name}/{i}").hex
                    kernels.append(k)
            s["kernels"] = kernels
        if s.get("containerId"):
            s["containerId"] = uuid.uuid5(NAMESPACE, f"container/{name}/0").hex
        for key in ("accessKey", "ownerAccessKey"):
            if key in s:
                s[key] = ACCESS_KEY
        for key, ago in AGO.items():
            if s.get(key):
                s[key] = _iso(ago)
        if s.get("transitions"):
            s["transitions"] = [
                dict(t, at=_iso(AGO["creationTime"] - timedelta(seconds=i))) for i, t in enumerate(s["transitions"])
            ]
        if "usage" in s:  # live figures (and whether a first sample came yet) differ from run to run
            s["usage"] = session_usage(s)
        scheduler = (s.get("statusData") or {}).get("scheduler")
        if isinstance(scheduler, dict) and "round" in scheduler:  # (how many rounds ran depends on timing)
            s["statusData"] = {**s["statusData"], "scheduler": {**scheduler, "round": 42}}
        if "history" in s:  # how many rounds saw the same decision depends on timing: show one
            s["history"] = [{**h, "rounds": 1, "first_at": _iso(AGO["first_at"]), "last_at": ""} for h in s["history"]]
        return self._scrub(s)

    def _agent(self, a: dict[str, Any]) -> dict[str, Any]:
        a = dict(a)
        if "hostname" in a:
            a["hostname"] = self.hosts.setdefault(a["id"], f"host-{a['id'].rsplit('-', 1)[-1]}")
        for key, ago in AGO.items():
            if a.get(key):
                a[key] = _iso(ago)
        if "version" in a:
            a["version"] = "0.0.0"
        if "usage" in a:
            a["usage"] = agent_usage(a)
        return a

    # -- the calls the dashboard makes ------------------------------------------------------------

    async def dashboard_events(self, topics: str = "sessions,agents", session: str | None = None, **kw):
        if session is not None:
            session = self.back.get(session, session)
        async for name, data in self.real.dashboard_events(topics=topics, session=session, **kw):
            yield name, self._event(name, data)

    def _scrub(self, value: Any) -> Any:
        """Real ids quoted inside messages (e.g. "session flaky-job (<uuid>) ended …") become stable ones."""
        if isinstance(value, str):
            return UUID_RE.sub(lambda m: self.ids.get(m.group(0), m.group(0)), value)
        if isinstance(value, list):
            return [self._scrub(v) for v in value]
        if isinstance(value, dict):
            return {k: self._scrub(v) for k, v in value.items()}
        return value

    def _event(self, name: str, data: dict[str, Any]) -> dict[str, Any]:
        if name == "snapshot":
            for s in data["sessions"]:  # every id first: messages may name sessions listed later
                self._id(s["id"], f"session/{s['name']}")
            return {
                "now": _iso(AGO["now"]),
                "sessions": [self._session(s) for s in data["sessions"]],
                "agents": [self._agent(a) for a in data["agents"]],
            }
        if name == "sessions":
            return {"items": [self._session(s) for s in data["items"]]}
        if name == "agents":
            return {"items": [self._agent(a) for a in data["items"]]}
        if name == "usage":  # the figures are fixed: those the snapshot showed already
            return {"sessions": {}, "agents": {}}
        if name == "run":  # a run's separator: its kernel's stable id, times before the frozen clock
            out = dict(data, kernelId=self.ids.get(data["kernelId"], data["kernelId"]))
            out["startedAt"] = _iso(timedelta(minutes=2))
            out["endedAt"] = data.get("endedAt") and _iso(timedelta(minutes=1))
            return out
        if name in ("log", "log_end"):
            out = dict(data, kernelId=self.ids.get(data["kernelId"], data["kernelId"]))
            if "chunks" in out:
                out["chunks"] = [[seq, text, _iso(timedelta(minutes=1))] for seq, text, _ in out["chunks"]]
            return out
        return data

    async def request(self, method: str, path: str, **kw: Any) -> Any:
        """What the dashboard asks otherwise: its keypair's quota (`/bai/quota`, the header), stable key."""
        answer = await self.real.request(method, path, **kw)
        if path == "/bai/quota":
            answer = dict(answer, accessKey=ACCESS_KEY)
        return answer

    async def get_session(self, ref: str) -> dict[str, Any]:
        return self._session(await self.real.get_session(self.back.get(ref, ref)))

    async def history(self, ref: str) -> dict[str, Any]:
        return self._session(await self.real.history(self.back.get(ref, ref)))

    async def destroy_session(self, ref: str, **kw: Any) -> dict[str, Any]:
        return await self.real.destroy_session(self.back.get(ref, ref), **kw)


async def until(pilot, check: Callable[[], bool], timeout: float = 15.0, what: str = "condition") -> None:
    """Let the app run until `check()` holds (it reads the app's state), or fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.05)


async def collect(stream: AsyncIterator[tuple[str, dict]], stop: Callable[[str, dict], bool], timeout: float = 15):
    """Events of a stream until `stop(name, data)` is true (that event included)."""
    out = []

    async def go() -> None:
        async for name, data in stream:
            out.append((name, data))
            if stop(name, data):
                return

    await asyncio.wait_for(go(), timeout)
    return out


def node_client(node, as_keypair: dict[str, str] | None = None) -> Client:
    """A client of a test node: its admin keypair (saved by the node), or another keypair."""
    import tomllib
    from pathlib import Path

    from bai.common.credentials import Credentials

    if as_keypair is not None:
        return Client(Credentials(node.endpoint, as_keypair["accessKey"], as_keypair["secretKey"]))
    path = Path(node.env["XDG_CONFIG_HOME"]) / "bai" / "credentials.toml"
    data = tomllib.loads(path.read_text())
    return Client(Credentials(node.endpoint, data["access_key"], data["secret_key"]))


def plain(widget) -> str:
    """The text a Static shows (its content drawn by rich, without styles)."""
    from rich.console import Console

    console = Console(width=200, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(widget.content)
    return console.export_text()
