"""The manager's link secrets: its CURVE key pair and the cluster's join token.

Kept under `STATE_DIR/link/`: `manager.key_secret` (0600), `manager.key` (the public key agents need) and
`join-token` (0600). Created on first use, read afterwards, so a restarted manager keeps its identity and
its agents reconnect by themselves.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import zmq

log = logging.getLogger("bai.link")

SECRET_KEY_FILE = "manager.key_secret"
PUBLIC_KEY_FILE = "manager.key"
TOKEN_FILE = "join-token"
Z85_KEY_LENGTH = 40  # a 32-byte CURVE key in z85 text


@dataclass(frozen=True)
class ManagerSecrets:
    """The manager's CURVE key pair and the agents' join token."""

    public_key: str  # z85 text, given to agents
    secret_key: str  # z85 text, never leaves the manager
    join_token: str  # what an agent must present to register

    def __repr__(self) -> str:  # keep secrets out of logs and tracebacks
        return f"ManagerSecrets(public_key={self.public_key!r}, secret_key=…, join_token=…)"


def _write(path: Path, text: str, mode: int) -> None:
    """Write atomically (temp file + rename) with `mode` from the start."""
    tmp = path.with_name(f".{path.name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
    os.replace(tmp, path)


def _read(path: Path, secret: bool) -> str:
    if secret and path.stat().st_mode & 0o077:
        log.warning("%s is readable by other users; it should be mode 0600", path)
    return path.read_text().strip()


def _check_key(text: str, path: Path) -> str:
    if len(text) != Z85_KEY_LENGTH:
        raise ValueError(f"{path} does not hold a CURVE key (expected {Z85_KEY_LENGTH} z85 characters)")
    return text


def load_or_create(state_dir: Path) -> ManagerSecrets:
    """The manager's key pair and join token, created under `state_dir/link/` on first call."""
    directory = Path(state_dir) / "link"
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    secret_path, public_path = directory / SECRET_KEY_FILE, directory / PUBLIC_KEY_FILE
    token_path = directory / TOKEN_FILE

    if secret_path.exists():
        secret_key = _check_key(_read(secret_path, secret=True), secret_path)
        public_key = zmq.curve_public(secret_key.encode("ascii")).decode("ascii")
        if not public_path.exists() or _read(public_path, secret=False) != public_key:
            _write(public_path, public_key, 0o644)  # derived from the secret: the secret wins
    else:
        public, secret = zmq.curve_keypair()
        public_key, secret_key = public.decode("ascii"), secret.decode("ascii")
        _write(secret_path, secret_key, 0o600)
        _write(public_path, public_key, 0o644)
        log.info("created the manager's link key pair in %s", directory)

    if token_path.exists():
        join_token = _read(token_path, secret=True)
        if not join_token:
            raise ValueError(f"{token_path} is empty; delete it to make a new join token")
    else:
        join_token = secrets.token_urlsafe(24)
        _write(token_path, join_token, 0o600)
        log.info("created the cluster's join token in %s", token_path)

    return ManagerSecrets(public_key=public_key, secret_key=secret_key, join_token=join_token)


__all__ = ["ManagerSecrets", "load_or_create"]
