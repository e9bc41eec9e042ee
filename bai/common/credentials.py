"""The keypair file the node writes and the CLI reads (~/.config/bai/credentials.toml, mode 0600)."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

import tomli_w

from bai.common.config import config_dir


@dataclass(frozen=True)
class Credentials:
    """Where the CLI connects and with which keypair (saved by the node for local use)."""

    endpoint: str
    access_key: str
    secret_key: str


def credentials_path() -> Path:
    return config_dir() / "credentials.toml"


def save(creds: Credentials, path: Path | None = None) -> Path:
    path = path or credentials_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    keys = {"endpoint": creds.endpoint, "access_key": creds.access_key, "secret_key": creds.secret_key}
    text = "# written by `bai node`: the admin keypair of this node\n" + tomli_w.dumps(keys)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path


def load() -> Credentials | None:
    """Credentials from BACKEND_* environment variables, else from the saved file."""
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
