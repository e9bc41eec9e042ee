"""`bai node`: start the roles this process plays (for now: `all`, a whole cluster in one process)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import logging
import signal
import socket
import sys
from importlib import resources
from pathlib import Path
from typing import Any

from aiohttp import web

from bai import __version__
from bai.common import credentials
from bai.common.auth import Keypair
from bai.common.config import ConfigError, data_dir, parse_hostport
from bai.common.slots import format_slots

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


async def choose_backend(cfg: dict[str, Any], agent_id: str, state_dir: Path, runner: Path):
    from bai.node.agent.backends.docker import DockerBackend, DockerUnavailable, docker_available
    from bai.node.agent.backends.local import LocalBackend

    agent_cfg = cfg["agent"]
    wanted = cfg["node"]["backend"]
    if wanted not in ("auto", "docker", "local"):
        raise NodeError(f"unknown backend {wanted!r}: use auto, docker or local (--backend)")
    kernels_dir = state_dir / "kernels"
    if wanted == "auto":
        wanted = "docker" if await docker_available() else "local"
    if wanted == "docker":
        backend = DockerBackend(
            agent_id,
            kernels_dir,
            runner,
            network=agent_cfg["docker"]["network"],
            pids_limit=int(agent_cfg["pids_limit"]),
            labels={str(k): str(v) for k, v in agent_cfg["docker"]["labels"].items()},
            start_timeout=float(agent_cfg["start_timeout"]),
        )
        try:
            await backend.start()
        except DockerUnavailable as e:
            raise NodeError(f"{e} (use --backend local to run kernels as local processes)") from None
        return backend, "docker (kernels are containers)"
    backend = LocalBackend(kernels_dir, runner, float(agent_cfg["start_timeout"]))
    await backend.start()
    import getpass

    return (
        backend,
        f"local (no Docker: kernels run UNSANDBOXED as local processes of user {getpass.getuser()})",
    )


async def run_node(cfg: dict[str, Any]) -> None:
    from bai.node.agent.agent import Agent
    from bai.node.agent.resources import discover_slots
    from bai.node.link.inproc import InprocHub
    from bai.node.manager.api import make_app
    from bai.node.manager.dispatcher import Dispatcher, scaling_groups
    from bai.node.manager.hooks import Hooks
    from bai.node.manager.registry import Registry
    from bai.node.manager.store import Store
    from bai.node.manager.timers import Timers

    node = cfg["node"]
    if node["role"] != "all":
        raise NodeError(f"role {node['role']!r} is not available yet: only --role all runs in this version")
    try:
        host, port = parse_hostport(node["listen"], "--listen")
    except ConfigError as e:
        raise NodeError(str(e)) from None
    state_dir = Path(node["state_dir"] or data_dir()).expanduser().resolve()
    state_dir.mkdir(parents=True, exist_ok=True)

    store = await Store.open(state_dir / "bai.db")
    # what to stop, in this order, on the way out: requests first, the database last
    shutdown_order = ("http", "timers", "dispatcher", "registry", "agent", "link", "store")
    stops: dict[str, Any] = {"store": store.close}
    try:
        fresh = Keypair.generate()
        access_key, secret_key = await store.ensure_admin_keypair(fresh.access_key, fresh.secret_key)
        hub = InprocHub()
        try:
            hooks = Hooks.load(list(cfg["manager"]["hooks"]), float(cfg["manager"]["hook_timeout"]))
        except ImportError as e:
            raise NodeError(f"cannot load a hook named in [manager] hooks: {e}") from None
        registry = Registry(store, hub.manager, float(cfg["manager"]["preparing_timeout"]), hooks)
        try:
            groups, pending_timeouts = scaling_groups(cfg)
        except ValueError as e:
            raise NodeError(str(e)) from None
        dispatcher = Dispatcher(registry, groups, pending_timeouts, tick=float(cfg["manager"]["tick"]))
        timers = Timers(registry)
        await hub.manager.start(registry)
        stops["link"] = hub.manager.close
        stops["registry"] = registry.close
        settings = {
            "keypairs": await store.keypairs(),
            "default_resources": {
                "cpu": str(cfg["session"]["default_cpu"]),
                "mem": str(cfg["session"]["default_mem"]),
            },
            "image_aliases": dict(cfg["images"]["aliases"]),
        }
        app = make_app(registry, settings)
        # a short shutdown timeout: open execution streams and waiting creates end with the node
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=2.0)
        await runner.setup()
        stops["http"] = runner.cleanup
        try:
            await web.TCPSite(runner, host, port, reuse_address=True).start()
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise NodeError(
                    f"port {port} on {host} is already in use; choose another with --listen HOST:PORT"
                ) from None
            raise NodeError(f"cannot listen on {host}:{port}: {e.strerror}") from None
        shown_host = host if host not in ("0.0.0.0", "::", "") else "127.0.0.1"
        endpoint = f"http://{shown_host}:{port}"
        cred_path = credentials.save(credentials.Credentials(endpoint, access_key, secret_key))

        agent_id = (
            cfg["agent"]["id"] or f"{socket.gethostname()}-{hashlib.sha1(str(state_dir).encode()).hexdigest()[:6]}"
        )
        runner_path = install_runner(state_dir)
        backend, backend_text = await choose_backend(cfg, agent_id, state_dir, runner_path)
        slots = discover_slots(str(cfg["agent"]["cpu"]), str(cfg["agent"]["mem"]))
        agent = Agent(agent_id, backend, hub.agent_link(agent_id), slots, cfg["agent"]["scaling_group"])
        await agent.start()
        stops["agent"] = agent.stop
        dispatcher.start()
        stops["dispatcher"] = dispatcher.stop
        timers.start()
        stops["timers"] = timers.stop

        say(f"bai node {__version__} (role all: manager and agent in one process)")
        say(f"  endpoint  {endpoint}")
        say(f"  state     {state_dir}")
        say(f"  backend   {backend_text}")
        say(f"  agent     {agent_id}: {format_slots(slots)}")
        say(f"  keypair   {access_key} (saved to {cred_path})")
        say("ready; Ctrl-C stops the node")

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        say("stopping…")
    finally:
        for step in shutdown_order:
            if step in stops:
                with contextlib.suppress(Exception):
                    await stops[step]()


def main(cfg: dict[str, Any], verbose: bool = False) -> int:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        asyncio.run(run_node(cfg))
    except NodeError as e:
        print(f"bai node: {e}", file=sys.stderr)
        return 1
    say("stopped")
    return 0
