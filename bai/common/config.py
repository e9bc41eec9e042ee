"""Configuration: one TOML schema for every role, from the first file found, then CLI flags.

Looked up in order, the first that exists is used (and only it): ./bai.toml, ~/.config/bai/bai.toml,
/etc/bai/bai.toml. `BAI_CONFIG=PATH` names the one file instead. Values missing from the file come from
`DEFAULTS`; flags override both. An unknown key or a value of the wrong type stops the program with the
file, the key and what was expected. `load_with_sources` also says where each value came from.
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
        # role agent: tcp://HOST:PORT of the manager's link, or a list of them (several managers of one database)
        "manager": "",
        # serve the API over HTTPS (both needed; PEM files); clients verify it (`bai --ca FILE` for a
        # private CA)
        "tls_cert": "",
        "tls_key": "",
        # the HTTP API's connections (see bai/node/manager/http/server.py): seconds to send a complete
        # request head, seconds a kept-alive connection may wait for its next request, open connections
        # per client address and in all (0: derived from the open-file limit, which the node raises to
        # its hard limit at start)
        "http_header_timeout": 10.0,
        "http_idle_timeout": 60.0,
        "http_max_connections_per_peer": 512,
        "http_max_connections": 0,
    },
    "link": {
        "heartbeat_interval": 3.0,  # seconds between an agent's heartbeats
        "missed_heartbeats": 3,  # the manager marks an agent LOST after this many are missed
    },
    "images": {
        # `bai session run python ...` resolves the alias to this image.
        "aliases": {"python": "bai-python:3.11"},
        # registries images may be pulled from (nothing else is contacted): tables
        # [images.registries.NAME] with the keys of REGISTRY below
        "registries": {},
    },
    "agent": {
        "id": "",  # empty: derived from the host name and the state dir
        "scaling_group": "default",
        "cpu": "",  # capacity override; empty: from psutil
        "mem": "",
        "pids_limit": 4096,
        # docker: the per-kernel nofile ulimit (0 = the daemon's own; at most the daemon's hard limit).
        # nproc is never a ulimit (that would count every process of the kernel's uid on the node, so one
        # user's forks would fail another's); set below pids_limit it lowers each kernel's pids limit
        "nofile": 8192,
        "nproc": 32768,
        # docker: what a kernel can write (/home/work, /tmp, /var/tmp; the rest is read-only), per
        # kernel: hostfile (a loop-mounted ext4 file of scratch_size; root and loop devices needed),
        # memory (tmpfs of scratch_size, counted against the kernel's memory), hostdir (a plain folder:
        # UNBOUNDED), auto (hostfile where it works, else hostdir with a warning)
        "scratch_type": "auto",
        "scratch_size": "1g",
        "manager_key": "",  # role agent: the manager's public key (from `bai cluster join-info`)
        "join_token": "",  # role agent: the cluster's join token
        "start_timeout": 30.0,
        # docker: host ports (on 127.0.0.1 only) that kernels on a network that can publish (bridge or a
        # user-defined one; not none) publish their apps on, as Backend.AI's port pool
        "port_range": "30000-31000",
        "app_start_timeout": 60.0,  # seconds an app (Jupyter, ...) may take to listen after its first use
        "sim_start_delay": 0.05,
        "sim_apps": "",  # backend sim only: the apps simulated kernels offer (ai.backend.service-ports form)
        # NVIDIA GPUs (found through NVML) are offered as cuda.device (whole devices); with gpu_shares
        # also as cuda.shares (fractions of a device, e.g. 0.25)
        "gpu_shares": False,  # backend sim only: seconds a simulated kernel takes to start
        # user: who kernels run as in their containers ("" = the image's default user); bai's images
        # have the user work (1000:1000) owning /home/work, and virtual folders belong to it
        # cap_add: capabilities kernels keep (all others are dropped), e.g. ["NET_BIND_SERVICE"]
        "docker": {"network": "none", "labels": {}, "user": "1000:1000", "cap_add": []},
        # docker: kernels started ahead of their sessions, per image (an alias of [images] aliases or an
        # image name) -> how many to keep ready, e.g. "bai-python:3.11" = 2. Empty: python = 1 (a
        # workstation's default); python = 0 turns it off. Sessions with mounts, GPUs or another network
        # start cold
        "warm_pool": {},
        # whether ready warm kernels count against the slots the agent offers (their small limits each);
        # false: they hold no slots until a session takes one
        "warm_pool_reserve": False,
        # seconds between the statistics samples of the agent's kernels and host (KernelStats events)
        "stat_interval": 2.0,
    },
    "watcher": {
        # `bai watcher`: a small HTTP service beside an agent (a separate process, so it answers even
        # when the agent is stuck): status, drain / undrain, restart, metrics
        "listen": "127.0.0.1:6009",
        "token": "",  # empty: one is made at first start and kept in <state dir>/watcher.token (0600)
        "restart_command": "systemctl restart bai-agent",  # {pid} is the agent's process id
        "stale_after": 30.0,  # seconds without a status from the agent before it counts as stuck
    },
    "manager": {
        # the manager's database (see bai/common/dburl.py): "" = the embedded SQLite file <state dir>/bai.db;
        # sqlite:///ABS/PATH.db or a plain path = that SQLite file; postgresql://USER@HOST:PORT/DB?... (or
        # postgres://) = PostgreSQL, its password never in the URL: ?password_file=PATH or ?password_env=NAME
        # (or libpq's PGPASSWORD / PGPASSFILE / ~/.pgpass); other parameters (sslmode, ...) go to the driver
        "database": "",
        "tick": 10.0,  # seconds between scheduling rounds when no event wakes the dispatcher
        "hooks": [],  # modules with hook functions (see bai/node/manager/services/hooks.py)
        "hook_timeout": 2.0,
        "preparing_timeout": 60.0,  # a session still PREPARING after this long goes to ERROR
        "lost_grace": 30.0,  # after an agent is LOST, wait this long before its sessions get `agent-lost`
        # a session's output kept (bytes): beyond it the oldest is dropped, and one line first says how much
        "log_max_bytes": 16 * 1024 * 1024,
        "log_retention": "7d",  # the output of ended sessions is purged this long after (seconds or 90s, 12h, 7d)
        # statistics samples kept per live kernel (1-100000; 150 = about 5 minutes at a stat_interval of 2 s)
        "stat_history": 150,
        # an app tunnel (`bai session app`, `backend.ai app`) with no byte either way for this long is closed
        "app_idle_timeout": 3600.0,
        # fair share (scaling groups of policy multifactor): what each keypair's and project's sessions held is
        # counted as slot-seconds (a core 1, a GiB of memory 0.1, a GPU fair_share_gpu_weight) and halves every
        # fair_share_half_life (seconds or 12h, 7d)
        "fair_share_half_life": "7d",
        "fair_share_gpu_weight": 10.0,
        # the latest scheduling rounds kept for replay (`bai scheduler rounds|replay`): their snapshots and decisions;
        # 0 keeps none
        "scheduler_rounds_kept": 200,
    },
    # per scaling group: policy fifo | lifo | drf | multifactor, agent_selection dispersed | concentrated,
    # allowed_session_types, pending_timeout (seconds; 0 = wait forever), allowed_networks (what a
    # session may ask for as config.network besides "none"; unset = the agent's [agent.docker] network),
    # admin_allowed_networks (what admin keypairs may ask for besides); multifactor: the weights of a session's
    # score (priority, fair share, age up to max_age, size) and how many sessions that cannot start get a
    # reservation (-1: the default, 4; 0: no backfill protection); preemption (off unless true): a session that finds
    # no room may stop running preemptible sessions of a strictly lower priority, of at most preemptible_priority,
    # that have run preemption_min_runtime (ties: preemption_order oldest | newest first); a batch session is
    # requeued at once, an interactive one told preemption_grace before it ends
    "scaling_groups": {
        "default": {
            "policy": "fifo",
            "agent_selection": "dispersed",
            "allowed_session_types": ["interactive", "batch"],
            "pending_timeout": 0.0,
            "allowed_networks": [],
            "admin_allowed_networks": [],
            "weight_priority": 10000.0,
            "weight_fair_share": 1000.0,
            "weight_age": 500.0,
            "weight_size": 100.0,
            "max_age": "7d",
            "reservations": -1,
            "preemption": False,
            "preemptible_priority": 5,
            "preemption_order": "oldest",
            "preemption_min_runtime": 0,
            "preemption_grace": "60s",
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
        # the smallest kernel a session may ask for (each kernel); below it a create is a 400
        "min_kernel_cpu": "0.1",
        "min_kernel_mem": "32m",
    },
}


def config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "bai"


def data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "bai"


def config_files() -> list[Path]:
    """Where the configuration is looked for, in order: the first file that exists wins."""
    explicit = os.environ.get("BAI_CONFIG")
    if explicit:
        return [Path(explicit)]
    return [Path.cwd() / "bai.toml", config_dir() / "bai.toml", Path("/etc/bai/bai.toml")]


class ConfigError(Exception):
    """A configuration file or value bai cannot use."""


def merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


# tables whose keys are the user's own (values of one type), and the table of scaling groups, each of
# which follows the schema of `scaling_groups.default`
OPEN_TABLES: dict[str, type] = {
    "images.aliases": str,
    "agent.docker.labels": str,
    "vfolders.hosts": str,
    "agent.warm_pool": int,
}
GROUPS = "scaling_groups"
# durations: a number of seconds or a string such as "90s", "12h", "7d"
DURATIONS = {"manager.log_retention", "manager.fair_share_half_life"}
# numbers that must lie in (low, high]: seconds
RANGES: dict[str, tuple[float, float]] = {
    "agent.stat_interval": (0.0, 3600.0),
    "node.http_header_timeout": (0.0, 3600.0),
    "node.http_idle_timeout": (0.0, 86400.0),
    "manager.app_idle_timeout": (0.0, 7 * 86400.0),
}
# the manager's database: a path or URL that bai/common/dburl.py reads (no password in it)
DATABASE = "manager.database"
# an agent's managers: one tcp://HOST:PORT, or a non-empty list of them (several managers of one database)
MANAGERS = "node.manager"
# [images.registries.NAME]: url HOST[:PORT] or https://HOST[:PORT] (http:// = insecure); credentials
# (password or password_file) stay with the manager, which hands an agent what one pull needs
REGISTRIES = "images.registries"
REGISTRY: dict[str, Any] = {"url": "", "username": "", "password": "", "password_file": "", "insecure": False}


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, int):
        return "a whole number"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a table"
    return "a string"


def duration_seconds(value: Any) -> float:
    """A duration setting in seconds: a number of seconds, or a string such as "90s", "12h" or "7d"."""
    from bai.common.durations import parse_duration

    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"expected seconds or a duration string, got {value!r}")
    return parse_duration(str(value))


def _fits(value: Any, default: Any) -> bool:
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, int | float) and not isinstance(value, bool)
    if isinstance(default, list):
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if isinstance(default, dict):
        return isinstance(value, dict)
    return isinstance(value, str)


def check(data: Mapping[str, Any], file: Path, schema: Mapping[str, Any] = DEFAULTS, section: str = "") -> None:
    """Refuse unknown keys and values of the wrong type, naming the file, the key and what was expected."""
    for key, value in data.items():
        dotted = f"{section}.{key}" if section else key
        where = f"{file}: [{section}] {key}" if section else f"{file}: {key}"
        if dotted in OPEN_TABLES:
            kind = OPEN_TABLES[dotted]
            if not isinstance(value, dict) or not all(
                isinstance(v, kind) and not isinstance(v, bool) for v in value.values()
            ):
                if kind is int:
                    raise ConfigError(f'{where}: expected a table of whole numbers ("image" = 2)')
                raise ConfigError(f'{where}: expected a table of strings (name = "value")')
            continue
        if dotted == GROUPS:
            if not isinstance(value, dict) or not all(isinstance(g, dict) for g in value.values()):
                raise ConfigError(f"{where}: expected tables [scaling_groups.NAME]")
            for name, group in value.items():
                check(group, file, DEFAULTS[GROUPS]["default"], f"{GROUPS}.{name}")
            continue
        if dotted == REGISTRIES:
            if not isinstance(value, dict) or not all(isinstance(r, dict) for r in value.values()):
                raise ConfigError(f"{where}: expected tables [images.registries.NAME]")
            for name, reg in value.items():
                check(reg, file, REGISTRY, f"{REGISTRIES}.{name}")
                if not reg.get("url"):
                    raise ConfigError(f"{file}: [{REGISTRIES}.{name}] needs url (HOST[:PORT] or https://HOST[:PORT])")
            continue
        if dotted == MANAGERS and not isinstance(value, str):
            if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
                raise ConfigError(f'{where}: expected "tcp://HOST:PORT" or a non-empty list of them, got {value!r}')
            continue
        if dotted == DATABASE and isinstance(value, str):
            from bai.common.dburl import DatabaseURLError
            from bai.common.dburl import check as check_database

            try:
                check_database(value)
            except DatabaseURLError as e:
                raise ConfigError(f"{where}: {e}") from None
        if dotted in DURATIONS:
            try:
                duration_seconds(value)
            except ValueError:
                raise ConfigError(
                    f'{where}: expected seconds or a duration such as "12h" or "7d", got {value!r}'
                ) from None
            continue
        if key not in schema:
            expected = ", ".join(sorted(schema)) or "nothing"
            raise ConfigError(f"{where}: unknown key (expected one of: {expected})")
        default = schema[key]
        if not _fits(value, default):
            raise ConfigError(f"{where}: expected {_type_name(default)}, got {value!r}")
        if dotted in RANGES and not RANGES[dotted][0] < value <= RANGES[dotted][1]:
            low, high = RANGES[dotted]
            raise ConfigError(
                f"{where}: expected a number of seconds above {low:g} and at most {high:g}, got {value!r}"
            )
        if isinstance(default, dict):
            check(value, file, default, dotted)


def _leaves(data: Mapping[str, Any], section: str = "") -> list[str]:
    out = []
    for key, value in data.items():
        dotted = f"{section}.{key}" if section else key
        if isinstance(value, dict) and value:
            out.extend(_leaves(value, dotted))
        else:
            out.append(dotted)
    return out


def load_with_sources(
    overrides: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], list[Path], dict[str, str]]:
    """The configuration, the file it was read from ([] for none) and, per dotted key, its source:
    "default", the file's path, or "command line"."""
    cfg = copy.deepcopy(DEFAULTS)
    sources = dict.fromkeys(_leaves(DEFAULTS), "default")
    used: list[Path] = []
    for path in config_files():
        if not path.is_file():
            if os.environ.get("BAI_CONFIG"):
                raise ConfigError(f"config file {path} (from BAI_CONFIG) does not exist")
            continue
        try:
            with path.open("rb") as f:
                data = tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: {e}") from None
        except OSError as e:
            raise ConfigError(f"{path}: {e.strerror}") from None
        check(data, path)
        cfg = merge(cfg, data)
        sources.update(dict.fromkeys(_leaves(data), str(path)))
        used.append(path)
        break  # the first file found wins
    if overrides:
        cfg = merge(cfg, overrides)
        sources.update(dict.fromkeys(_leaves(overrides), "command line"))
    return cfg, used, sources


def load(overrides: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], list[Path]]:
    """The configuration and the file it was read from."""
    cfg, used, _ = load_with_sources(overrides)
    return cfg, used


def parse_hostport(value: str, flag: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{flag} wants HOST:PORT, got {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)
