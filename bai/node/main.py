"""`bai node`: start the roles this process plays (for now: `all`, a whole cluster in one process)."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import logging
import os
import secrets
import shlex
import signal
import socket
import sys
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from bai import __version__
from bai.common import credentials
from bai.common.auth import Keypair
from bai.common.config import ConfigError, data_dir, parse_hostport
from bai.common.present import slots_text
from bai.common.service_ports import parse_range
from bai.common.slots import to_wire

if TYPE_CHECKING:
    import ssl

    from bai.node.agent.backends.base import Backend
    from bai.node.link.base import AgentLink, ManagerLink
    from bai.node.link.fanout import FanoutAgentLink
    from bai.node.link.zmq import ZmqAgentLink
    from bai.node.manager.services.vfolder_service import VFolders

log = logging.getLogger("bai.node")


class NodeError(Exception):
    """A start-up failure with a one-line message for the user."""


def say(text: str) -> None:
    print(text, flush=True)


def install_runner(state_dir: Path) -> Path:
    """Copy the runner out of the package (which may be a zipapp) so it can be mounted."""
    target = state_dir / "runner" / "runner.py"
    target.parent.mkdir(parents=True, exist_ok=True)
    source = resources.files("bai.node.agent").joinpath("runner.py").read_bytes()
    if not target.exists() or target.read_bytes() != source:
        tmp = target.with_suffix(".tmp")
        tmp.write_bytes(source)
        tmp.chmod(0o644)
        tmp.replace(target)
    return target


async def choose_backend(cfg: dict[str, Any], agent_id: str, state_dir: Path, runner: Path) -> tuple[Backend, str]:
    from bai.node.agent.backends.docker import DockerBackend, DockerUnavailable, docker_available
    from bai.node.agent.backends.local import LocalBackend

    agent_cfg = cfg["agent"]
    wanted = cfg["node"]["backend"]
    if wanted not in ("auto", "docker", "local", "sim"):
        raise NodeError(f"unknown backend {wanted!r}: use auto, docker or local (--backend)")
    if wanted == "sim":  # kernels only in memory: for scale tests and benchmarks
        from bai.node.agent.backends.sim import SimBackend

        sim = SimBackend(start_delay=float(agent_cfg["sim_start_delay"]), apps=str(agent_cfg["sim_apps"]))
        return sim, "sim (simulated kernels)"
    kernels_dir = state_dir / "kernels"
    if wanted == "auto":
        wanted = "docker" if await docker_available() else "local"
    if wanted == "docker":
        from bai.node.agent import runner_lib, scratch

        # the runner as a module with its bytecode: kernels whose Python is this one skip compiling it
        lib = await asyncio.to_thread(runner_lib.install, runner.read_bytes(), runner.parent / "lib")
        try:
            kernel_scratch = await asyncio.to_thread(
                scratch.choose, str(agent_cfg["scratch_type"]), str(agent_cfg["scratch_size"]), kernels_dir
            )
            docker = DockerBackend(
                agent_id,
                kernels_dir,
                runner,
                network=agent_cfg["docker"]["network"],
                pids_limit=int(agent_cfg["pids_limit"]),
                labels={str(k): str(v) for k, v in agent_cfg["docker"]["labels"].items()},
                start_timeout=float(agent_cfg["start_timeout"]),
                user=str(agent_cfg["docker"]["user"]),
                cap_add=[str(c) for c in agent_cfg["docker"]["cap_add"]],
                nofile=int(agent_cfg["nofile"]),
                nproc=int(agent_cfg["nproc"]),
                scratch=kernel_scratch,
                port_range=parse_range(str(agent_cfg["port_range"])),
                runner_lib=lib,
            )
        except (scratch.ScratchError, ValueError) as e:
            raise NodeError(str(e)) from None
        try:
            await docker.start()
        except DockerUnavailable as e:
            raise NodeError(f"{e} (use --backend local to run kernels as local processes)") from None
        return docker, "docker (kernels are containers)"
    local = LocalBackend(kernels_dir, runner, float(agent_cfg["start_timeout"]))
    await local.start()
    import getpass

    return (
        local,
        f"local (no Docker: kernels run UNSANDBOXED as local processes of user {getpass.getuser()})",
    )


def vfolder_hosts(cfg: dict[str, Any], state_dir: Path) -> dict[str, Path]:
    """The vfolder hosts of the configuration, `local` defaulting to <state dir>/vfolders."""
    hosts = {"local": state_dir / "vfolders"}
    for name, path in (cfg["vfolders"]["hosts"] or {}).items():
        hosts[str(name)] = Path(str(path)).expanduser().resolve()
    return hosts


def state_dir_of(cfg: dict[str, Any]) -> Path:
    state_dir = Path(cfg["node"]["state_dir"] or data_dir()).expanduser().resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    return state_dir


async def _sweep_uploads(vfolders: VFolders) -> None:
    while True:
        await vfolders.sweep()
        await asyncio.sleep(600)


def tls_context(cfg: dict[str, Any]) -> ssl.SSLContext | None:
    """The server's TLS context from [node] tls_cert / tls_key, or None for plain HTTP."""
    cert, key = str(cfg["node"]["tls_cert"]), str(cfg["node"]["tls_key"])
    if not cert and not key:
        return None
    if not cert or not key:
        raise NodeError("HTTPS needs both --tls-cert and --tls-key")
    import ssl

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(Path(cert).expanduser(), Path(key).expanduser())
    except (OSError, ssl.SSLError) as e:
        raise NodeError(f"cannot use the TLS certificate {cert} with key {key}: {e}") from None
    return context


def is_loopback(host: str) -> bool:
    """Whether a listen address is reachable from this machine only."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name or a wildcard: assume it is reachable from elsewhere


def hostport(value: str, flag: str) -> tuple[str, int]:
    try:
        return parse_hostport(value.removeprefix("tcp://"), flag)
    except ConfigError as e:
        raise NodeError(str(e)) from None


async def open_store(cfg: dict[str, Any], state_dir: Path, log_max_bytes: int) -> Any:
    """The manager's state where `[manager] database` says (the embedded SQLite file by default), its schema
    brought to this bai's version; NodeError, with a line that names the database (never its password), when
    it cannot be opened."""
    from bai.common.dburl import DatabaseURLError, locate, redact
    from bai.node.manager.state import SchemaTooNew, StateError, Store

    try:
        where = locate(str(cfg["manager"]["database"]), state_dir)
    except DatabaseURLError as e:
        raise NodeError(f"[manager] database: {e}") from None
    try:
        if where.engine == "postgresql":
            from bai.node.manager.state.postgres import PgStore

            store: Any = await PgStore.open_url(where.dsn, where.shown, log_max_bytes=log_max_bytes)
        else:
            assert where.path is not None
            store = await Store.open(where.path, log_max_bytes=log_max_bytes)
    except (SchemaTooNew, StateError) as e:
        raise NodeError(redact(str(e))) from None
    log.info("the manager's database: %s", where.shown)
    return store


async def start_leadership(
    cfg: dict[str, Any], store: Any, manager: Any, endpoint: str, cluster: dict[str, str] | None
) -> Any:
    """Which manager of the database runs the scheduling rounds, the timers and the agents' reconciliation
    (services/leadership.py): with PostgreSQL, the holder of the leader lease, the others relaying what
    changes to each other (services/cluster_events.py); with SQLite, this one, always."""
    from bai import __version__
    from bai.node.manager.services.leadership import Leadership
    from bai.node.manager.state.postgres.cluster_queries import ManagerInfo

    host = socket.gethostname()
    me = ManagerInfo(
        f"{host}-{secrets.token_hex(3)}", host, endpoint, (cluster or {}).get("endpoint", "in-process"),
        os.getpid(), __version__,
    )  # fmt: skip
    events = manager.agent_events
    services = manager.services
    shared = hasattr(store, "renew_lease")  # (PostgreSQL: several managers may share the database)
    if shared:  # a scheduling round is stored only while this manager holds the lease (state/postgres/db.py fence)
        store.db.fence_holder = me.id

    async def lead() -> None:
        if shared:  # (before the first round: a start of this leader's own is not taken for the last one's)
            await events.take_over()
        manager.dispatcher.start()
        manager.timers.start()

    async def follow() -> None:
        await manager.dispatcher.stop()
        await manager.timers.stop()

    lease: Any = None  # the lease's own connection (PostgreSQL): its renewals never wait behind this one's work
    if shared:
        from bai.node.manager.state.postgres.cluster_queries import Cluster
        from bai.node.manager.state.postgres.db import PgDatabase

        lease = await PgDatabase.open_beside(store.db, "lease")
    leadership = Leadership(
        Cluster(lease) if shared else None, me, store.db.shown, lead, follow, closing=lease.close if lease else None
    )
    events.leading = leadership.holds  # (not once its lease may have expired: see Leadership.holds)
    manager.dispatcher.may_act = leadership.holds
    manager.timers.may_act = leadership.holds
    services.leadership = leadership
    if shared:
        from bai.node.manager.services.cluster_events import ClusterEvents
        from bai.node.manager.state.postgres.notify import Notifier
        from bai.node.manager.state.sqlite.team_queries import TEAM_TABLE_NAMES

        notifier = Notifier(store.db, store.db.dsn, store.db.shown)

        async def keypairs() -> None:  # (and the teams, which say which keypairs may sign)
            store._limits_changed()
            await store.load_teams()

        async def dotfiles() -> None:
            def clear(_conn: Any) -> None:
                store.db.dotfile_owners = None

            await store.db.run(clear)

        caches = {
            "keypairs": keypairs, "resource_policies": keypairs, "dotfiles": dotfiles,
            "image_aliases": services.images.load, **dict.fromkeys(TEAM_TABLE_NAMES, keypairs),
        }  # fmt: skip
        relay = ClusterEvents(me.id, services.hubs, manager.wake, store.get_session, notifier.send, caches)
        relay.attach()
        notifier.start(relay.received)
        manager.background.spawn(_stop_on_close(notifier, relay), "cluster-events")
    await leadership.start()
    return leadership


async def _stop_on_close(notifier: Any, relay: Any) -> None:
    try:
        await asyncio.Event().wait()
    finally:
        notifier.stop()
        await relay.close()


async def start_manager(
    cfg: dict[str, Any],
    state_dir: Path,
    link: ManagerLink,
    stops: dict[str, Any],
    cluster: dict[str, str] | None = None,
) -> list[str]:
    """The manager's parts: store, services (sessions, agents, images, …), dispatcher, timers, HTTP API.
    Returns banner lines."""
    from bai.common.clock import Clock
    from bai.node.manager.build import build_manager
    from bai.node.manager.http.app import make_app
    from bai.node.manager.http.server import HttpLimits, LimitedTCPSite, raise_nofile
    from bai.node.manager.services.hooks import Hooks
    from bai.node.manager.services.timers import log_settings
    from bai.node.manager.services.vfolder_service import VFolders

    host, port = hostport(cfg["node"]["listen"], "--listen")
    try:
        log_max_bytes, log_retention = log_settings(cfg)
    except ValueError as e:
        raise NodeError(str(e)) from None
    store = await open_store(cfg, state_dir, log_max_bytes)
    stops["store"] = store.close
    fresh = Keypair.generate()
    access_key, secret_key = await store.ensure_admin_keypair(fresh.access_key, fresh.secret_key, Clock().now())
    try:
        hooks = Hooks.load(list(cfg["manager"]["hooks"]), float(cfg["manager"]["hook_timeout"]))
    except ImportError as e:
        raise NodeError(f"cannot load a hook named in [manager] hooks: {e}") from None
    owner = {k: int(cfg["vfolders"][k]) for k in ("kernel_uid", "kernel_gid")}
    as_root = os.geteuid() == 0
    try:
        vfolders = VFolders(
            store,
            vfolder_hosts(cfg, state_dir),
            str(cfg["vfolders"]["default_host"]),
            owner["kernel_uid"] if as_root and owner["kernel_uid"] >= 0 else None,
            owner["kernel_gid"] if as_root and owner["kernel_gid"] >= 0 else None,
        )
    except (ValueError, OSError) as e:
        raise NodeError(f"[vfolders]: {e}") from None
    try:
        manager = await build_manager(cfg, store, link, vfolders, hooks, log_retention=log_retention)
    except ValueError as e:  # a bad scaling group, network or registry
        raise NodeError(str(e)) from None
    stops["background"] = manager.background.close
    manager.background.spawn(_sweep_uploads(vfolders), "vfolder-sweeper")
    services = manager.services
    settings: dict[str, Any] = {  # the HTTP app's settings (make_app)
        "default_resources": {"cpu": str(cfg["session"]["default_cpu"]), "mem": str(cfg["session"]["default_mem"])},
        "cluster": cluster,
        "app_idle_timeout": float(cfg["manager"]["app_idle_timeout"]),
    }
    try:
        limits = HttpLimits.from_config(cfg["node"])
    except ValueError as e:
        raise NodeError(str(e)) from None
    nofile, _ = raise_nofile()  # every connection, kernel stream and store handle is a file descriptor
    limits.resolve(nofile)
    log.info(
        "HTTP limits: %d connections (%d per address), header timeout %g s, idle timeout %g s (open files %d)",
        limits.max_connections,
        limits.max_connections_per_peer,
        limits.header_timeout,
        limits.idle_timeout,
        nofile,
    )
    # a short shutdown timeout: open execution streams and waiting creates end with the node
    runner = web.AppRunner(make_app(services, settings), access_log=None, handle_signals=False, shutdown_timeout=2.0)
    await runner.setup()
    stops["http"] = runner.cleanup
    try:
        site = LimitedTCPSite(
            runner, host, port, limits=limits, reuse_address=True, ssl_context=tls_context(cfg), backlog=1024
        )
        await site.start()
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise NodeError(
                f"port {port} on {host} is already in use; choose another with --listen HOST:PORT"
            ) from None
        raise NodeError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    try:
        await link.start(manager.agent_events)
    except OSError as e:
        raise NodeError(
            f"the agent link cannot listen: {e} (choose another address with --link-listen HOST:PORT)"
        ) from None
    stops["link"] = link.close
    endpoint = api_endpoint(cfg, host, port)
    leadership = await start_leadership(cfg, store, manager, endpoint, cluster)
    stops["leadership"] = leadership.stop
    lines = [f"  endpoint  {endpoint}", f"  state     {state_dir}"]
    if store.db.shown != str(state_dir / "bai.db"):
        lines.append(f"  database  {store.db.shown}")
    if not cfg["node"]["tls_cert"] and not is_loopback(host):
        warning = (
            f"listening on {host} without TLS: requests and answers can be read and altered on the wire "
            "(the Backend.AI protocol signs no bodies); use --tls-cert/--tls-key"
        )
        log.warning(warning)
        lines.append(f"  WARNING   {warning}")
    if settings["cluster"]:
        lines.append(
            f"  link      {settings['cluster']['endpoint']} (agents: `bai cluster join-info` says how to join)"
        )
    lines += _save_credentials(credentials.Credentials(endpoint, access_key, secret_key), state_dir)
    return lines


def api_endpoint(cfg: dict[str, Any], host: str, port: int) -> str:
    """The URL clients on this host reach the API at (a wildcard address: the loopback one)."""
    shown_host = host if host not in ("0.0.0.0", "::", "") else "127.0.0.1"
    return f"{'https' if cfg['node']['tls_cert'] else 'http'}://{shown_host}:{port}"


def _save_credentials(creds: credentials.Credentials, state_dir: Path) -> list[str]:
    """Save the admin keypair in the state folder (and the shared file when it may); banner lines that say
    where, and how the CLI finds keys the shared file does not hold."""
    from bai.common import nodefile

    owner = credentials.shared_owner()
    owner_runs = owner is not None and owner != state_dir and nodefile.running(owner) is not None
    own, shared = credentials.save_for_node(creds, state_dir, owner_runs)
    if shared is not None:
        return [f"  keypair   {creds.access_key} (saved to {shared})"]
    return [
        f"  keypair   {creds.access_key} (saved to {own}; {credentials.shared_path()} holds the node of {owner})",
        f"  client    export BAI_STATE_DIR={shlex.quote(str(state_dir))}   (or: bai --state-dir {state_dir} …)",
    ]


def _write_node_file(state_dir: Path, role: str, endpoint: str) -> None:
    from datetime import UTC, datetime

    from bai.common import nodefile

    started = datetime.now(UTC).isoformat(timespec="seconds")
    info = {"pid": os.getpid(), "role": role, "endpoint": endpoint, "started": started, "version": __version__}
    nodefile.write(state_dir, {**info, "state_dir": str(state_dir)})


async def start_agent(
    cfg: dict[str, Any], state_dir: Path, make_link: Callable[[str], AgentLink], stops: dict[str, Any]
) -> list[str]:
    """The agent's parts: backend, slots, link to the manager. Returns banner lines."""
    from bai.node.agent.agent import Agent
    from bai.node.agent.resources import discover_slots

    agent_id = cfg["agent"]["id"] or f"{socket.gethostname()}-{hashlib.sha1(str(state_dir).encode()).hexdigest()[:6]}"
    runner_path = install_runner(state_dir)
    backend, backend_text = await choose_backend(cfg, agent_id, state_dir, runner_path)
    slots = discover_slots(str(cfg["agent"]["cpu"]), str(cfg["agent"]["mem"]))
    from decimal import Decimal

    from bai.common.gpus import DEVICE, SHARES
    from bai.node.agent.gpus import NVML
    from bai.node.agent.warm_pool import targets_of

    try:
        warm = targets_of(cfg["agent"]["warm_pool"], cfg["images"]["aliases"], backend.name)
    except ValueError as e:
        raise NodeError(str(e)) from None
    nvml = NVML()
    if nvml.gpus:
        slots[DEVICE] = Decimal(len(nvml.gpus))
        if cfg["agent"]["gpu_shares"]:
            slots[SHARES] = Decimal(len(nvml.gpus))
    agent = Agent(
        agent_id,
        backend,
        make_link(agent_id),
        slots,
        cfg["agent"]["scaling_group"],
        vfolder_hosts(cfg, state_dir),
        state_dir,
        nvml,
        app_start_timeout=float(cfg["agent"]["app_start_timeout"]),
        warm_pool=warm,
        warm_pool_reserve=bool(cfg["agent"]["warm_pool_reserve"]),
        default_network=str(cfg["agent"]["docker"]["network"]),
        stat_interval=float(cfg["agent"]["stat_interval"]),
    )
    await agent.start()
    stops["agent"] = agent.stop
    gpus = ", ".join(f"{g.index}: {g.name} ({g.memory_total / 2**30:.0f} GiB)" for g in nvml.gpus)
    gpu_line = f"  gpus      {gpus}" if nvml.gpus else f"  gpus      none ({nvml.error or 'no devices'})"
    lines = [f"  backend   {backend_text}", f"  agent     {agent_id}: {slots_text(to_wire(slots))}", gpu_line]
    if warm:
        pooled = ", ".join(f"{image} x{n}" for image, n in sorted(warm.items()))
        counted = "counted against the slots" if cfg["agent"]["warm_pool_reserve"] else "not counted in the slots"
        lines.append(f"  warm      {pooled} ({counted})")
    if backend.scratch is not None:  # what a kernel can write, and how much
        lines.append(f"  scratch   {backend.scratch.describe()}")
    elif backend.name == "local":
        lines.append("  scratch   none: local kernels write wherever the node's user can")
    return lines


def zmq_agent_link_factory(cfg: dict[str, Any]) -> Callable[[str], ZmqAgentLink | FanoutAgentLink]:
    """How the agent links to its managers: `[node] manager` (one tcp://HOST:PORT, or a list: several managers
    of one database) with `[agent] manager_key` (one key for all, or a list: one per manager, in order). One
    manager: a plain ZmqAgentLink; several: a FanoutAgentLink over one ZmqAgentLink each."""
    from functools import partial

    from bai.node.link.fanout import FanoutAgentLink
    from bai.node.link.zmq import ZmqAgentLink

    given, given_keys = cfg["node"]["manager"], cfg["agent"]["manager_key"]
    managers = [given] if isinstance(given, str) else list(given)
    keys = [given_keys] if isinstance(given_keys, str) else list(given_keys)
    token = cfg["agent"]["join_token"]
    if not managers or not keys or not all(managers) or not all(keys) or not token:
        raise NodeError(
            "an agent needs --manager tcp://HOST:PORT, --manager-key and --join-token "
            "(run `bai cluster join-info` where the manager runs)"
        )
    if len(keys) not in (1, len(managers)):
        raise NodeError(
            f"{len(managers)} managers but {len(keys)} manager keys: give --manager-key once (the managers of one "
            "database share it) or once per --manager, in the same order"
        )
    endpoints = []
    for manager in managers:
        host, port = hostport(manager, "--manager")
        endpoints.append(f"tcp://{host}:{port}")
    if len(set(endpoints)) < len(endpoints):
        raise NodeError(f"a manager is named twice: {', '.join(managers)}")
    from zmq.utils import z85

    for key in keys:
        try:
            if len(key) != 40 or len(z85.decode(key)) != 32:
                raise ValueError
        except ValueError:
            raise NodeError(
                "--manager-key is not a CURVE public key (40 characters, as `bai cluster join-info` prints it)"
            ) from None
    interval = float(cfg["link"]["heartbeat_interval"])
    if len(endpoints) == 1:
        endpoint, key = endpoints[0], keys[0]
        return lambda agent_id: ZmqAgentLink(agent_id, endpoint, key, token, heartbeat_interval=interval)
    keyed = list(zip(endpoints, keys * len(endpoints) if len(keys) == 1 else keys, strict=True))
    return lambda agent_id: FanoutAgentLink(
        [partial(ZmqAgentLink, agent_id, ep, key, token, heartbeat_interval=interval) for ep, key in keyed],
        names=endpoints,
    )


async def run_node(cfg: dict[str, Any]) -> None:
    role = cfg["node"]["role"]
    if role not in ("all", "manager", "agent"):
        raise NodeError(f"unknown role {role!r}: use all, manager or agent (--role)")
    if role == "agent" and cfg["node"]["backend"] == "auto":
        cfg["node"]["backend"] = "docker"  # agents run containers unless told to use local processes
    state_dir = state_dir_of(cfg)
    # what to stop, in this order, on the way out: requests first, the database last
    shutdown_order = ("http", "leadership", "background", "agent", "link", "store")  # (leadership: rounds, timers)
    stops: dict[str, Any] = {}
    # from the start: a signal while starting cancels the start (an agent may wait long for its manager)
    # and still ends in the clean shutdown below; once ready, it ends the wait
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    starting = asyncio.current_task()

    def on_signal() -> None:
        stop.set()
        if starting is not None and not starting.done() and not ready.is_set():
            starting.cancel()

    ready = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    try:
        lines: list[str] = []
        if role == "all":
            from bai.node.link.inproc import InprocHub

            hub = InprocHub(float(cfg["link"]["heartbeat_interval"]))
            lines += await start_manager(cfg, state_dir, hub.manager, stops)
            lines += await start_agent(cfg, state_dir, hub.agent_link, stops)
            title = "role all: manager and agent in one process"
        elif role == "manager":
            from bai.node.link.keys import load_or_create
            from bai.node.link.zmq import ZmqManagerLink

            host, port = hostport(cfg["node"]["link_listen"], "--link-listen")
            timeout = float(cfg["link"]["heartbeat_interval"]) * int(cfg["link"]["missed_heartbeats"])
            secrets = load_or_create(state_dir)
            link = ZmqManagerLink(f"tcp://{host}:{port}", secrets, heartbeat_timeout=timeout)
            shown = host if host not in ("0.0.0.0", "::", "") else socket.gethostname()
            cluster = {
                "endpoint": f"tcp://{shown}:{port}",
                "manager_key": secrets.public_key,
                "join_token": secrets.join_token,
            }
            lines += await start_manager(cfg, state_dir, link, stops, cluster)
            title = "role manager"
        else:
            from bai.node.link.zmq import LinkRefused, LinkUnavailable

            try:
                lines += await start_agent(cfg, state_dir, zmq_agent_link_factory(cfg), stops)
            except LinkRefused as e:
                raise NodeError(f"the manager refused this agent: {e}") from None
            except LinkUnavailable as e:
                given = cfg["node"]["manager"]
                where = ", ".join(given) if isinstance(given, list) else given
                raise NodeError(f"no manager answered at {where}: {e}") from None
            managers = cfg["node"]["manager"]
            lines.append(f"  manager   {managers if isinstance(managers, str) else ', '.join(managers)}")
            title = "role agent"

        say(f"bai node {__version__} ({title})")
        for line in lines:
            say(line)
        say("ready; Ctrl-C (or `bai node stop` beside it) stops the node")
        endpoint = "" if role == "agent" else api_endpoint(cfg, *hostport(cfg["node"]["listen"], "--listen"))
        _write_node_file(state_dir, role, endpoint)
        ready.set()
        log.info("node %s ready (%s): %s", __version__, title, "; ".join(line.strip() for line in lines))

        await stop.wait()
        say("stopping…")
    finally:
        from bai.common import nodefile

        nodefile.remove(state_dir, os.getpid())
        for step in shutdown_order:
            if step in stops:
                try:
                    await stops[step]()
                except Exception as e:  # the next steps still run; say what may be left behind
                    what = f"{type(e).__name__}: {e}"
                    log.warning("stopping the %s failed (%s); what it held may be left behind", step, what)


def main(cfg: dict[str, Any], verbose: bool = False, log_format: str = "human", debug: bool = False) -> int:
    from bai.common import logs

    logs.setup(log_format, verbose, debug)
    try:
        asyncio.run(run_node(cfg))
    except asyncio.CancelledError:  # stopped while starting; the parts already up were shut down
        say("stopped before it was ready")
        return 0
    except NodeError as e:
        print(f"bai node: {e}", file=sys.stderr)
        return 1
    say("stopped")
    return 0
