"""The keypair file the node writes and the CLI reads (mode 0600).

Each node keeps its admin keypair in its state folder (`STATE/credentials.toml`). The shared file
(~/.config/bai/credentials.toml) is what the CLI reads by default: the node of the default state folder
always writes it, as does a node of another state folder while no other running node's keys are in it.
So two nodes under one HOME do not overwrite each other: the CLI reaches the second with
`BAI_STATE_DIR=STATE` (or `bai --state-dir STATE …`), which reads that state folder's file instead.

Several managers of one database each serve the whole API: a client may be given all of them, as the
file's `endpoint = ["http://A:8091", "http://B:8091"]` or `BACKEND_ENDPOINT=http://A:8091,http://B:8091`
(the official client's form); it uses the first that answers (bai.client.endpoints).
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import tomli_w

from bai.common.config import config_dir, data_dir

FILE_NAME = "credentials.toml"
STATE_DIR_ENV = "BAI_STATE_DIR"


class BadEndpoint(ValueError):
    """An endpoint that is not http(s)://HOST:PORT (its message names the entry and where it came from)."""


@dataclass(frozen=True)
class Credentials:
    """Where the CLI connects and with which keypair (saved by the node for local use).

    `endpoints`: every manager the client may use, in order (empty when made with one `endpoint`: then
    just that one); `endpoint` is the first of them."""

    endpoint: str
    access_key: str
    secret_key: str
    endpoints: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.endpoints:
            object.__setattr__(self, "endpoints", (self.endpoint,))
        elif self.endpoint != self.endpoints[0]:
            object.__setattr__(self, "endpoint", self.endpoints[0])


def parse_endpoints(value: object, origin: str = "endpoint") -> tuple[str, ...]:
    """The manager URLs of `value`: one URL, several separated by commas, or a list of them (TOML's), each
    http(s)://HOST:PORT (a path after it is kept; a trailing / is dropped). BadEndpoint names a bad entry
    and `origin` (where the value came from)."""
    if isinstance(value, str):
        items: list[Any] = value.split(",")
    elif isinstance(value, list | tuple):
        items = list(value)
    else:
        raise BadEndpoint(f"{origin}: wants a URL or a list of URLs, got {value!r}")
    found = []
    for item in items:
        if not isinstance(item, str):
            raise BadEndpoint(f"{origin}: {item!r} is not a URL (use http://HOST:PORT)")
        url = item.strip().rstrip("/")
        if not url:
            continue
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            parts, port = None, None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or port is None:
            raise BadEndpoint(f"{origin}: bad endpoint {item.strip()!r} (use http://HOST:PORT or https://HOST:PORT)")
        if parts.query or parts.fragment:
            raise BadEndpoint(f"{origin}: bad endpoint {item.strip()!r} (no ?query or #fragment: http://HOST:PORT)")
        found.append(url)
    if not found:
        raise BadEndpoint(f"{origin}: no endpoint given (use http://HOST:PORT, several separated by commas)")
    return tuple(found)


def with_endpoints(creds: Credentials, value: object, origin: str = "--endpoint") -> Credentials:
    """`creds` with the endpoints of `value` (as parse_endpoints reads it) instead of its own."""
    urls = parse_endpoints(value, origin)
    return Credentials(urls[0], creds.access_key, creds.secret_key, urls)


def shared_path() -> Path:
    """~/.config/bai/credentials.toml (under $XDG_CONFIG_HOME when set)."""
    return config_dir() / FILE_NAME


def chosen_state_dir() -> Path | None:
    """The state folder BAI_STATE_DIR names (None when it is not set)."""
    value = os.environ.get(STATE_DIR_ENV)
    return Path(value).expanduser().resolve() if value else None


def credentials_path() -> Path:
    """The file the CLI reads: the state folder's when BAI_STATE_DIR is set, else the shared one."""
    state_dir = chosen_state_dir()
    return state_dir / FILE_NAME if state_dir is not None else shared_path()


def save(creds: Credentials, path: Path | None = None, state_dir: Path | None = None) -> Path:
    """Write `creds` to `path` [the shared file] atomically, readable by its owner only; `state_dir`: the
    node's state folder, noted in the file (the shared file names whose keys it holds)."""
    path = path or shared_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    endpoint: str | list[str] = creds.endpoint if len(creds.endpoints) == 1 else list(creds.endpoints)
    keys = {"endpoint": endpoint, "access_key": creds.access_key, "secret_key": creds.secret_key}
    if state_dir is not None:
        keys["state_dir"] = str(state_dir)
    text = "# written by `bai node`: the admin keypair of this node\n" + tomli_w.dumps(keys)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path


def save_for_node(creds: Credentials, state_dir: Path, owner_runs: bool) -> tuple[Path, Path | None]:
    """Save a node's keypair in its state folder, and in the shared file unless that holds the keys of
    another state folder's node that still runs (`owner_runs`: whether it does; the default state folder's
    node always writes it). Returns (the state folder's file, the shared file or None if left alone)."""
    own = save(creds, state_dir / FILE_NAME, state_dir)
    owner = shared_owner()
    if state_dir == default_state_dir() or owner is None or owner == state_dir or not owner_runs:
        return own, save(creds, shared_path(), state_dir)
    return own, None


def shared_owner() -> Path | None:
    """The state folder whose node wrote the shared file (None: no file, or one that does not say)."""
    data = _read(shared_path())
    value = data.get("state_dir") if data else None
    return Path(value) if isinstance(value, str) and value else None


def default_state_dir() -> Path:
    return data_dir().expanduser().resolve()


def _read(path: Path) -> dict[str, object] | None:
    if not path.is_file():
        return None
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError):
        return None


def load() -> Credentials | None:
    """Credentials from BACKEND_* environment variables, else from the saved file (`credentials_path`).

    BadEndpoint when an endpoint (BACKEND_ENDPOINT's or the file's) is not http(s)://HOST:PORT."""
    env = os.environ
    access = env.get("BACKEND_ACCESS_KEY") or env.get("SORNA_ACCESS_KEY")
    secret = env.get("BACKEND_SECRET_KEY") or env.get("SORNA_SECRET_KEY")
    env_name = "BACKEND_ENDPOINT" if env.get("BACKEND_ENDPOINT") else "SORNA_ENDPOINT"
    endpoint = env.get(env_name)
    urls = parse_endpoints(endpoint, env_name) if endpoint else None
    saved = None
    path = credentials_path()
    if path.is_file():
        with path.open("rb") as f:
            data = tomllib.load(f)
        keys = (data.get("access_key"), data.get("secret_key"))
        if not all(isinstance(k, str) and k for k in keys):
            raise BadEndpoint(f"{path}: wants access_key and secret_key")
        saved_urls = parse_endpoints(data.get("endpoint"), f"{path}: endpoint") if urls is None else urls
        saved = Credentials(saved_urls[0], str(keys[0]), str(keys[1]), saved_urls)
    if access and secret:
        urls = urls or (saved.endpoints if saved else ("http://127.0.0.1:8091",))
        return Credentials(urls[0], access, secret, urls)
    return saved
