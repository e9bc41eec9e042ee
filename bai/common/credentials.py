"""The keypair file the node writes and the CLI reads (mode 0600).

Each node keeps its admin keypair in its state folder (`STATE/credentials.toml`). The shared file
(~/.config/bai/credentials.toml) is what the CLI reads by default: the node of the default state folder
always writes it, as does a node of another state folder while no other running node's keys are in it.
So two nodes under one HOME do not overwrite each other: the CLI reaches the second with
`BAI_STATE_DIR=STATE` (or `bai --state-dir STATE …`), which reads that state folder's file instead.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

import tomli_w

from bai.common.config import config_dir, data_dir

FILE_NAME = "credentials.toml"
STATE_DIR_ENV = "BAI_STATE_DIR"


@dataclass(frozen=True)
class Credentials:
    """Where the CLI connects and with which keypair (saved by the node for local use)."""

    endpoint: str
    access_key: str
    secret_key: str


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
    keys = {"endpoint": creds.endpoint, "access_key": creds.access_key, "secret_key": creds.secret_key}
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
    """Credentials from BACKEND_* environment variables, else from the saved file (`credentials_path`)."""
    env = os.environ
    access = env.get("BACKEND_ACCESS_KEY") or env.get("SORNA_ACCESS_KEY")
    secret = env.get("BACKEND_SECRET_KEY") or env.get("SORNA_SECRET_KEY")
    endpoint = env.get("BACKEND_ENDPOINT") or env.get("SORNA_ENDPOINT")
    saved = None
    path = credentials_path()
    if path.is_file():
        with path.open("rb") as f:
            data = tomllib.load(f)
        saved = Credentials(data["endpoint"], data["access_key"], data["secret_key"])
    if access and secret:
        return Credentials(
            (endpoint or (saved.endpoint if saved else "http://127.0.0.1:8091")).split(",")[0],
            access,
            secret,
        )
    if saved and endpoint:
        return Credentials(endpoint.split(",")[0], saved.access_key, saved.secret_key)
    return saved
