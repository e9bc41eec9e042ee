"""Configuration: TOML files merged in order of precedence, then CLI flags.

Files, lowest precedence first: /etc/bai/bai.toml, ~/.config/bai/bai.toml, ./bai.toml.
`BAI_CONFIG=PATH` replaces that list with one file.
"""

from __future__ import annotations

import copy
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

DEFAULTS: dict[str, Any] = {
    "node": {
        "role": "all",
        "listen": "127.0.0.1:8091",
        "state_dir": "",  # empty: $XDG_DATA_HOME/bai or ~/.local/share/bai
        "backend": "auto",  # auto | docker | local (agents of a cluster: docker unless told)
        "link_listen": "127.0.0.1:5002",  # role manager: where agents connect
        "manager": "",  # role agent: tcp://HOST:PORT of the manager's link
    },
    "link": {
        "heartbeat_interval": 3.0,  # seconds between an agent's heartbeats
        "missed_heartbeats": 3,  # the manager marks an agent LOST after this many are missed
    },
    "images": {
        # `bai session run python ...` resolves the alias to this image.
        "aliases": {"python": "bai-python:3.11"},
    },
    "agent": {
        "id": "",  # empty: derived from the host name and the state dir
        "scaling_group": "default",
        "cpu": "",  # capacity override; empty: from psutil
        "mem": "",
        "pids_limit": 4096,
        "manager_key": "",  # role agent: the manager's public key (from `bai cluster join-info`)
        "join_token": "",  # role agent: the cluster's join token
        "start_timeout": 30.0,
        # user: who kernels run as in their containers ("" = the image's default user); bai's images
        # have the user work (1000:1000) owning /home/work, and virtual folders belong to it
        "docker": {"network": "none", "labels": {}, "user": "1000:1000"},
    },
    "manager": {
        "tick": 10.0,  # seconds between scheduling rounds when no event wakes the dispatcher
        "hooks": [],  # modules with hook functions (see bai/node/manager/hooks.py)
        "hook_timeout": 2.0,
        "preparing_timeout": 60.0,  # a session still PREPARING after this long goes to ERROR
        "lost_grace": 30.0,  # after an agent is LOST, wait this long before its sessions get `agent-lost`
    },
    # per scaling group: policy fifo | lifo | drf, agent_selection dispersed | concentrated,
    # allowed_session_types, pending_timeout (seconds; 0 = wait forever)
    "scaling_groups": {
        "default": {
            "policy": "fifo",
            "agent_selection": "dispersed",
            "allowed_session_types": ["interactive", "batch"],
            "pending_timeout": 0.0,
        },
    },
    "vfolders": {
        # named roots of virtual folders; in a cluster every node must see each at the same path.
        # `local` defaults to <state dir>/vfolders when not set here
        "hosts": {},
        "default_host": "local",
        # folders and uploaded files belong to the kernels' user (uid 1000 in bai's images) when the
        # node runs as root, so kernels can write in them; -1 leaves ownership alone
        "kernel_uid": 1000,
        "kernel_gid": 1000,
    },
    "session": {
        # what a session gets when it asks for nothing
        "default_cpu": "1",
        "default_mem": "1g",
    },
}


def config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "bai"


def data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "bai"


def config_files() -> list[Path]:
    explicit = os.environ.get("BAI_CONFIG")
    if explicit:
        return [Path(explicit)]
    return [Path("/etc/bai/bai.toml"), config_dir() / "bai.toml", Path.cwd() / "bai.toml"]


class ConfigError(Exception):
    pass


def merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def load(overrides: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], list[Path]]:
    """Return the merged configuration and the files it was read from."""
    cfg = copy.deepcopy(DEFAULTS)
    used = []
    for path in config_files():
        if not path.is_file():
            if os.environ.get("BAI_CONFIG"):
                raise ConfigError(f"config file {path} (from BAI_CONFIG) does not exist")
            continue
        try:
            with path.open("rb") as f:
                cfg = merge(cfg, tomllib.load(f))
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: {e}") from None
        used.append(path)
    if overrides:
        cfg = merge(cfg, overrides)
    return cfg, used


def parse_hostport(value: str, flag: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{flag} wants HOST:PORT, got {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)
