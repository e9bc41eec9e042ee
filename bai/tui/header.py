"""The dashboard's header: who you are and your quota, and whether what it shows is stale.

    AKIA…XYZ  sessions 2/3  cpu 3/4  mem 3.0/8 GiB                       ⚠ stale 12s — reconnecting

The figures come from `GET /bai/quota` (bai/node/manager/http/quota.py: the keypair's resource policy and
what its sessions hold now), fetched when the dashboard connects, when its sessions change (at most
every `REFRESH_MIN` seconds) and every `REFRESH_EVERY` seconds. While the dashboard's stream is
disconnected (the app reconnects by itself: `Dashboard._follow_cluster`) the header says for how long
the data has been stale.
"""

from __future__ import annotations

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


def header_text(
    access_key: str, quota: dict[str, Any] | None, stale: float | None, width: int, error: str | None = None
) -> Text:
    """The header line, `width` cells: key and figures on the left, the stale marker on the right."""
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
    manager = (quota or {}).get("manager") or {}
    if manager.get("leader") and manager.get("self") and stale is None:  # (several managers share one database)
        if manager["leader"] != manager["self"]:
            shown = Text(f"via {manager['self']} · leader {manager['leader']}", style="dim")
            pad = width - text.cell_len - shown.cell_len
            if pad >= 2:
                text.append(" " * pad)
                text.append_text(shown)
    if stale is not None:
        marker = Text(f"⚠ stale {int(stale)}s — reconnecting", style="bold yellow")
        pad = width - text.cell_len - marker.cell_len
        text.append(" " * max(2, pad))
        text.append_text(marker)
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
            self.quota = await self.client.request("GET", "/bai/quota")
            self.error = None
        except Exception as e:  # noqa: BLE001 (an old manager, a network error: the header says so)
            self.error = str(getattr(e, "msg", None) or e)[:60]
        finally:
            self._fetching = False
        self.draw()

    def draw(self) -> None:
        width = max(1, (self.size.width or self.app.size.width or 80) - 2)
        self.update(header_text(self.access_key, self.quota, self.stale_seconds(), width, self.error))


def _loop_time() -> float:
    import asyncio

    return asyncio.get_running_loop().time()
