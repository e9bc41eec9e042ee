"""The dashboard's header: who you are and your quota, what each project holds, and whether what it shows
is stale.

    AKIA…XYZ  sessions 2/3  cpu 3/4  mem 3.0/8 GiB │ ml-team 8/8 GPU · 12/16 CPU │ de…  ⚠ stale 12s

The figures come from `GET /bai/quota` (bai/node/manager/http/quota.py: the keypair's resource policy and
what its sessions hold now) and `GET /bai/projects` (the projects the caller may see, what their live
sessions hold and their caps: `held/cap` of a capped slot, else what is held; the project the sessions
view shows first), fetched when the dashboard connects, when its sessions change (at most every
`REFRESH_MIN` seconds) and every `REFRESH_EVERY` seconds; what does not fit is cut, never wrapped. While
the dashboard's stream is disconnected (the app reconnects by itself: `Dashboard._follow_cluster`) the
header says for how long the data has been stale.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime
from decimal import Decimal
from typing import Any

from rich.text import Text
from textual.widgets import Static

from bai.common.slots import from_wire, is_bytes_slot

GiB = Decimal(1024**3)
REFRESH_EVERY = 10.0  # seconds
REFRESH_MIN = 1.0  # seconds between fetches when sessions change
UNLIMITED = "∞"
PROJECT_SEPARATOR = " │ "
# how a project's slots are named in the header, in this order; other slots follow by name
PROJECT_SLOTS = {"cuda.device": "GPU", "cuda.shares": "fGPU", "cpu": "CPU", "mem": "GiB"}


def short_key(access_key: str) -> str:
    """AKIA…XYZ: the first four and last three characters of an access key."""
    return access_key if len(access_key) <= 10 else f"{access_key[:4]}…{access_key[-3:]}"


def _amount(name: str, value: Decimal, used: bool) -> str:
    if is_bytes_slot(name):
        value = value / GiB
        if used:
            return f"{value:.1f}"
    text = f"{value.normalize():f}"
    return text


def _colour(used: Decimal, limit: Decimal | None) -> str:
    if limit is None or limit <= 0:
        return "red" if limit is not None and used > 0 else ""
    share = used / limit
    return "bold red" if share >= 1 else "yellow" if share >= Decimal("0.7") else "green"


def quota_parts(quota: dict[str, Any]) -> list[tuple[str, str]]:
    """(text, style) of each figure: `sessions 2/3`, then cpu, mem and any other slot limited or used."""
    parts: list[tuple[str, str]] = []
    most = int(quota.get("maxConcurrentSessions") or 0)
    count = int(quota.get("concurrentSessions") or 0)
    parts.append((f"sessions {count}/{most or UNLIMITED}", _colour(Decimal(count), Decimal(most) if most else None)))
    networks = int(quota.get("sessionNetworks") or 0)  # sessions of several kernels: shown while any is held
    if networks:
        cap = int(quota.get("maxSessionNetworks") or 0)
        parts.append(
            (f"networks {networks}/{cap or UNLIMITED}", _colour(Decimal(networks), Decimal(cap) if cap else None))
        )
    queued = int(quota.get("pendingSessions") or 0)  # sessions waiting: shown while any waits
    if queued:
        cap = int(quota.get("maxPendingSessions") or 0)
        parts.append((f"queued {queued}/{cap or UNLIMITED}", _colour(Decimal(queued), Decimal(cap) if cap else None)))
    limits = from_wire(quota.get("totalResourceSlots"))
    used = from_wire(quota.get("occupiedSlots"))
    limited = quota.get("defaultForUnspecified") == "LIMITED"
    names = [n for n in ("cpu", "mem") if n in limits or n in used or not limits]
    names += sorted((limits.keys() | used.keys()) - {"cpu", "mem"})
    for name in names:
        have = used.get(name, Decimal(0))
        limit = limits.get(name, Decimal(0) if limited else None)
        if limit is not None and not limit.is_finite():
            limit = None
        shown = f"{name} {_amount(name, have, True)}/"
        shown += _amount(name, limit, False) if limit is not None else UNLIMITED
        if is_bytes_slot(name):
            shown += " GiB"
        parts.append((shown, _colour(have, limit)))
    return parts


def _slot_order(name: str) -> tuple[int, str]:
    """Accelerators first (what teams wait for), then any other slot, then cpu and mem."""
    return {"cuda.device": 0, "cuda.shares": 1, "cpu": 3, "mem": 4}.get(name, 2), name


def project_text(project: dict[str, Any], selected: bool = False) -> Text:
    """`ml-team 8/8 GPU · 12/16 CPU · 5.0 GiB`: what the project's live sessions hold of each slot, against
    its cap where it has one (coloured as the quota's figures); `idle` when they hold nothing and it has
    no cap. `selected`: the project the sessions view shows (its name lit)."""
    text = Text()
    text.append(str(project.get("name") or "?"), style="bold reverse" if selected else "bold")
    held = from_wire(project.get("occupied"))
    caps = {k: v for k, v in from_wire(project.get("cap")).items() if v.is_finite()}
    names = sorted({n for n, v in held.items() if v} | caps.keys(), key=_slot_order)
    if not names:
        text.append(" idle", style="dim")
    for i, name in enumerate(names):
        have, cap = held.get(name, Decimal(0)), caps.get(name)
        shown = _amount(name, have, True)
        if cap is not None:
            shown += "/" + _amount(name, cap, False)
        text.append(" · " if i else " ")
        text.append(f"{shown} {PROJECT_SLOTS.get(name, name)}", style=_colour(have, cap) if cap is not None else "")
    return text


def projects_text(projects: list[dict[str, Any]], selected: str | None = None, room: int = 1 << 16) -> Text:
    """The projects' `project_text`, apart, in at most `room` cells: the selected one first, then those with
    live sessions, then the others (by name within each). Whole ones while they fit; then the next one cut
    (…) when a name and a figure still fit, else a `…` that says there are more."""

    def order(p: dict[str, Any]) -> tuple[int, str]:
        name = str(p.get("name") or "")
        return (0 if name == selected else 1 if int(p.get("sessions") or 0) else 2), name

    text = Text()
    for i, project in enumerate(sorted(projects, key=order)):
        part = project_text(project, project.get("name") == selected)
        gap = len(PROJECT_SEPARATOR) if i else 0
        left = room - text.cell_len - gap
        if part.cell_len > left:
            if left >= 12:
                part.truncate(left, overflow="ellipsis")
            elif i:
                if room - text.cell_len >= 2:
                    text.append(" …", style="dim")
                break
            else:
                part.truncate(max(1, left), overflow="ellipsis")
            if i:
                text.append(PROJECT_SEPARATOR, style="dim")
            text.append_text(part)
            break
        if i:
            text.append(PROJECT_SEPARATOR, style="dim")
        text.append_text(part)
    return text


def header_text(
    access_key: str,
    quota: dict[str, Any] | None,
    stale: float | None,
    width: int,
    error: str | None = None,
    projects: list[dict[str, Any]] | None = None,
    selected: str | None = None,
) -> Text:
    """The header line, `width` cells: key and figures on the left, then the projects' (cut where the line
    is full), the stale marker on the right."""
    text = Text()
    text.append(short_key(access_key), style="bold")
    if quota is not None:
        for part, style in quota_parts(quota):
            text.append("  ")
            text.append(part, style=style)
    elif error:
        text.append(f"  quota unknown: {error}", style="dim")
    else:
        text.append("  quota …", style="dim")
    right: Text | None = None  # what the right end says: the stale marker, or which manager answers
    manager = (quota or {}).get("manager") or {}
    if manager.get("leader") and manager.get("self") and stale is None:  # (several managers share one database)
        if manager["leader"] != manager["self"]:
            right = Text(f"via {manager['self']} · leader {manager['leader']}", style="dim")
            if width - text.cell_len - right.cell_len < 2:
                right = None
    if (quota or {}).get("frozen") and stale is None:
        right = Text("❄ frozen", style="bold cyan")  # (the manager: nothing new starts, `bai cluster unfreeze`)
    if stale is not None:
        right = Text(f"⚠ stale {int(stale)}s — reconnecting", style="bold yellow")
    notice = (quota or {}).get("announcement")
    if isinstance(notice, str) and notice.strip():  # the operator's announcement, before the projects
        room = width - text.cell_len - 4 - (right.cell_len + 2 if right is not None else 0)
        if room >= 8:
            said = Text("📣 " + " ".join(notice.split()), style="bold magenta")
            said.truncate(room, overflow="ellipsis")
            text.append("  ")
            text.append_text(said)
    if projects:
        room = width - text.cell_len - len(PROJECT_SEPARATOR) - (right.cell_len + 2 if right is not None else 0)
        if room >= 12:  # a name and a figure at least
            shown = projects_text(projects, selected, room)
            text.append(PROJECT_SEPARATOR, style="dim")
            text.append_text(shown)
    if right is not None:
        text.append(" " * max(2, width - text.cell_len - right.cell_len))
        text.append_text(right)
    text.truncate(max(1, width), overflow="ellipsis")
    return text


class Header(Static):
    """One line under the top bar: `header_text` of the latest quota, redrawn by `tick()`."""

    DEFAULT_CSS = """
    Header { height: 1; padding: 0 1; background: $boost; }
    """

    def __init__(self, client: Any, clock: Callable[[], datetime], **kw: Any) -> None:
        super().__init__(**kw)
        self.client = client
        self.clock = clock
        self.quota: dict[str, Any] | None = None
        self.error: str | None = None
        self.projects: list[dict[str, Any]] | None = None  # `GET /bai/projects` (None: not known)
        self.projects_supported = True  # False once the manager answered 404 (a manager without teams)
        self.selected_project: str | None = None  # the project the sessions view shows (None: all)
        self.stale_since: datetime | None = None  # when the stream broke (None: connected)
        self._fetched = 0.0  # loop time of the last fetch
        self._fetching = False
        self._version: Any = None

    @property
    def access_key(self) -> str:
        quota = self.quota or {}
        return quota.get("accessKey") or getattr(getattr(self.client, "creds", None), "access_key", "") or "?"

    def sync(self, stale: bool, version: Any = None) -> None:
        """The app's state, whenever it draws its top bar: whether its stream is down after having been
        up (stale), and the version of its sessions (a change may change the quota's use)."""
        if stale:
            self.disconnected()
        elif self.stale_since is not None:
            self.connected()
        else:
            self.tick(version)

    def connected(self) -> None:
        self.stale_since = None
        self.refresh_quota()
        self.draw()

    def disconnected(self) -> None:
        if self.stale_since is None:
            self.stale_since = self.clock()
        self.draw()

    def stale_seconds(self) -> float | None:
        if self.stale_since is None:
            return None
        return max(0.0, (self.clock() - self.stale_since).total_seconds())

    def tick(self, version: Any = None) -> None:
        """Once a second: redraw (the stale counter), fetch the quota when due or when sessions changed."""
        now = _loop_time()
        changed = version != self._version
        if self.stale_since is None and (
            now - self._fetched >= REFRESH_EVERY or (changed and now - self._fetched >= REFRESH_MIN)
        ):
            self._version = version
            self.refresh_quota()
        self.draw()

    def refresh_quota(self) -> None:
        if self._fetching or not self.is_mounted or not hasattr(self.client, "request"):
            return
        self._fetching = True
        self._fetched = _loop_time()
        self.run_worker(self._fetch(), group="quota", exclusive=True)

    async def _fetch(self) -> None:
        try:
            await asyncio.gather(self._fetch_quota(), self._fetch_projects())
        finally:
            self._fetching = False
        self.draw()

    async def _fetch_quota(self) -> None:
        try:
            self.quota = await self.client.request("GET", "/bai/quota")
            self.error = None
        except Exception as e:  # noqa: BLE001 (an old manager, a network error: the header says so)
            self.error = str(getattr(e, "msg", None) or e)[:60]

    async def _fetch_projects(self) -> None:
        """The projects and their usage; kept as they were when the call fails (the quota's error says why
        the manager does not answer), dropped for good when the manager knows no `/bai/projects`."""
        if not self.projects_supported:
            return
        try:
            if hasattr(self.client, "projects"):
                items = await self.client.projects()
            else:
                items = (await self.client.request("GET", "/bai/projects"))["items"]
        except Exception as e:  # noqa: BLE001
            if getattr(e, "status", None) in (404, 405):
                self.projects_supported, self.projects = False, None
            return
        self.projects = [p for p in items if isinstance(p, dict)] if isinstance(items, list) else None

    def project_names(self) -> list[str]:
        return [str(p["name"]) for p in self.projects or [] if p.get("name")]

    def select_project(self, name: str | None) -> None:
        self.selected_project = name
        self.draw()

    def draw(self) -> None:
        width = self.size.width or max(1, (self.app.size.width or 80) - 2)  # (its size: within its padding)
        self.update(
            header_text(
                self.access_key,
                self.quota,
                self.stale_seconds(),
                width,
                self.error,
                self.projects,
                self.selected_project,
            )
        )


def _loop_time() -> float:
    return asyncio.get_running_loop().time()
