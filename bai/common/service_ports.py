"""Apps a kernel offers ("service ports", as Backend.AI calls them), declared by its image.

An image lists its apps in the label `ai.backend.service-ports`: a comma list of `name:proto:port` or
`name:proto:[p1,p2]`, proto `http`, `tcp`, `preopen` or `pty` (pty entries are skipped: the terminal is
its own endpoint). How an app starts is up to the kernel: the image's `/etc/backend.ai/service-defs/NAME.json`
(read by the runner inside the kernel), else the command bai knows for well-known apps (`KNOWN_COMMANDS`).

An app whose command or env names `{token}` is started with a secret of its own (the runner makes it, keeps
it for the kernel's life and answers it when asked to start the app): the manager shows it only to the
session's owner and admins, in the app's URL (`with_token`), so whoever else reaches the app's port gets
the app's own login refusal (Jupyter: 403 / its token page).

Pure: parsing, the shapes the API answers with, and the host-port pool's arithmetic.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

LABEL = "ai.backend.service-ports"
PROTOCOLS = ("http", "tcp", "preopen")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MIN_PORT, MAX_PORT = 1025, 65534  # Backend.AI's bounds for ports inside a kernel
TOKEN = re.compile(r"[A-Za-z0-9_-]{16,128}")  # an app's secret as the runner makes them (URL- and cookie-safe)

# How bai starts well-known apps when the image has no service definition for them ({ports[0]}: the port,
# {runtime_path}: the kernel's python)
KNOWN_COMMANDS: dict[str, list[str]] = {
    "jupyter": [
        *("{runtime_path}", "-m", "notebook", "--no-browser", "--ip=0.0.0.0", "--port={ports[0]}"),
        "--IdentityProvider.token={token}",
    ],
    "jupyterlab": [
        *("{runtime_path}", "-m", "jupyterlab", "--no-browser", "--ip=0.0.0.0", "--port={ports[0]}"),
        "--IdentityProvider.token={token}",
    ],
    "tensorboard": ["{runtime_path}", "-m", "tensorboard.main", "--bind_all", "--port={ports[0]}"],
    "ttyd": ["ttyd", "-p", "{ports[0]}", "/bin/sh"],
}


class ServicePortError(ValueError):
    """A label that does not parse; the message says which entry and why."""


@dataclass(frozen=True)
class ServicePort:
    """One app: its name, protocol, the port(s) it listens on in the kernel and, where published, the
    host ports they are published on (127.0.0.1 of the kernel's agent)."""

    name: str
    protocol: str
    container_ports: tuple[int, ...]
    host_ports: tuple[int, ...] = field(default=())

    def to_wire(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "protocol": self.protocol,
            "container_ports": list(self.container_ports),
            "host_ports": list(self.host_ports),
        }

    @classmethod
    def from_wire(cls, data: Any) -> ServicePort | None:
        """One as stored or sent; None for anything malformed (old or foreign data is skipped, not fatal)."""
        if not isinstance(data, dict):
            return None
        name, proto = data.get("name"), data.get("protocol")
        ports, hosts = data.get("container_ports"), data.get("host_ports") or []
        if not isinstance(name, str) or not isinstance(proto, str) or not isinstance(ports, list):
            return None
        if not all(isinstance(p, int) for p in ports) or not isinstance(hosts, list):
            return None
        return cls(name, proto, tuple(ports), tuple(h for h in hosts if isinstance(h, int)))

    @property
    def port(self) -> int:
        """The port a tunnel reaches (the first)."""
        return self.container_ports[0]


def parse(label: str | None) -> list[ServicePort]:
    """The apps a `ai.backend.service-ports` label declares, in its order (ServicePortError when it is
    malformed: an unknown protocol, a port out of range, a name or port used twice)."""
    out: list[ServicePort] = []
    if not label or not label.strip():
        return out
    names: set[str] = set()
    ports: set[int] = set()
    for entry in split_entries(label):
        parts = entry.split(":", 2)
        if len(parts) != 3:
            raise ServicePortError(f"{LABEL}: {entry!r} is not name:protocol:port")
        name, proto, spec = (p.strip() for p in parts)
        proto = proto.lower()
        if proto == "pty":
            continue
        if not NAME.fullmatch(name):
            raise ServicePortError(f"{LABEL}: {name!r} is not an app name (letters, digits, _ . -)")
        if proto not in PROTOCOLS:
            raise ServicePortError(f"{LABEL}: {entry!r}: the protocol must be one of {', '.join(PROTOCOLS)} or pty")
        numbers = parse_ports(entry, spec)
        if name in names:
            raise ServicePortError(f"{LABEL}: the app {name!r} is declared twice")
        for p in numbers:
            if p in ports:
                raise ServicePortError(f"{LABEL}: port {p} is declared twice")
            ports.add(p)
        names.add(name)
        out.append(ServicePort(name, proto, tuple(numbers)))
    return out


def split_entries(label: str) -> list[str]:
    """Entries split on commas outside [brackets]."""
    entries: list[str] = []
    depth = 0
    current: list[str] = []
    for ch in label:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(0, depth - 1)
        if ch == "," and depth == 0:
            entries.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    entries.append("".join(current).strip())
    return [e for e in entries if e]


def parse_ports(entry: str, spec: str) -> list[int]:
    if spec.startswith("[") and spec.endswith("]"):
        items = [s.strip() for s in spec[1:-1].split(",") if s.strip()]
    else:
        items = [spec]
    if not items:
        raise ServicePortError(f"{LABEL}: {entry!r} names no port")
    numbers = []
    for item in items:
        if not item.isdigit() or not MIN_PORT <= int(item) <= MAX_PORT:
            raise ServicePortError(f"{LABEL}: {entry!r}: ports are whole numbers from {MIN_PORT} to {MAX_PORT}")
        numbers.append(int(item))
    return numbers


def from_labels(labels: dict[str, str] | None) -> list[ServicePort]:
    """An image's apps; an image whose label is malformed offers none (the agent logs why)."""
    return parse((labels or {}).get(LABEL))


def loads(items: Any) -> list[ServicePort]:
    """Service ports as stored or sent (a list of to_wire dicts); malformed items are skipped."""
    if not isinstance(items, list):
        return []
    return [sp for sp in (ServicePort.from_wire(i) for i in items) if sp is not None]


def url_template(sp: ServicePort) -> str:
    if sp.name == "jupyterlab":
        return "{protocol}://{host}:{port}/lab"
    return "{protocol}://{host}:{port}/" if sp.protocol in ("http", "preopen") else "{protocol}://{host}:{port}"


def with_token(url: str, token: str) -> str:
    """`url` (or a url_template) with `token=TOKEN` in its query (any token there before replaced); `url`
    unchanged when there is no token."""
    if not token:
        return url
    base, _, fragment = url.partition("#")
    path, _, query = base.partition("?")
    params = [p for p in query.split("&") if p and not p.startswith("token=")]
    out = f"{path}?{'&'.join([*params, 'token=' + quote(token, safe='')])}"
    return f"{out}#{fragment}" if fragment else out


def to_api(sp: ServicePort, token: str = "") -> dict[str, Any]:
    """Backend.AI's `servicePorts` item (create reply, session info, `/stream/session/{ref}/apps`). With
    the app's `token` (only for its session's owner and admins) the url_template carries it, and so does
    the URL the official client prints."""
    item = {
        "name": sp.name,
        "protocol": sp.protocol,
        "ports": list(sp.container_ports),
        "url_template": with_token(url_template(sp), token),
        "allowed_arguments": {},
        "allowed_envs": {},
    }
    if token:
        item["token"] = token
    return item


def scheme(sp: ServicePort) -> str:
    """What a user opens the app with: http for web apps, tcp for others."""
    return "http" if sp.protocol in ("http", "preopen") else "tcp"


class PortPoolExhausted(Exception):
    """No host port is left in the agent's pool."""


class PortPool:
    """Host ports for publishing kernels' apps (`[agent] port_range`), taken and given back per kernel."""

    def __init__(self, first: int, last: int) -> None:
        if not 1 <= first <= last <= 65535:
            raise ValueError(f"[agent] port_range: {first}-{last} is not a range of ports")
        self.first, self.last = first, last
        self.held: dict[str, list[int]] = {}  # kernel id -> its host ports
        self._used: set[int] = set()
        self._next = first

    @property
    def size(self) -> int:
        return self.last - self.first + 1

    def take(self, kernel_id: str, count: int) -> list[int]:
        """`count` free ports for a kernel (PortPoolExhausted when fewer are left: none is taken)."""
        if count <= 0:
            return []
        if self.size - len(self._used) < count:
            raise PortPoolExhausted(
                f"the agent's port pool ({self.first}-{self.last}, [agent] port_range) has "
                f"{self.size - len(self._used)} free ports; this kernel's apps need {count}"
            )
        got: list[int] = []
        port = self._next
        while len(got) < count:
            if port not in self._used:
                got.append(port)
                self._used.add(port)
            port = self.first if port >= self.last else port + 1
        self._next = port
        self.held.setdefault(kernel_id, []).extend(got)
        return got

    def hold(self, kernel_id: str, ports: Iterable[int]) -> None:
        """Mark ports a kernel already has (one adopted after a restart) as taken."""
        for p in ports:
            if self.first <= p <= self.last and p not in self._used:
                self._used.add(p)
                self.held.setdefault(kernel_id, []).append(p)

    def release(self, kernel_id: str) -> None:
        for p in self.held.pop(kernel_id, []):
            self._used.discard(p)

    @property
    def free(self) -> int:
        return self.size - len(self._used)


def parse_range(text: str) -> tuple[int, int]:
    """`30000-31000` → (30000, 31000); ValueError with a sentence otherwise."""
    m = re.fullmatch(r"\s*(\d{1,5})\s*-\s*(\d{1,5})\s*", str(text))
    if not m or not 1 <= int(m[1]) <= int(m[2]) <= 65535:
        raise ValueError(f"[agent] port_range must look like 30000-31000, not {text!r}")
    return int(m[1]), int(m[2])
