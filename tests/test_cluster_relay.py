"""Kernels of a multi-node cluster session reaching each other by name: the runner's relay mode (a peer
proxy: runner.py "Relay mode") and its dial connections (channel.py), the agent joining two of its own kernels
directly or asking the manager (agent.py `dial`, apps.py), and the manager piping the two agents' streams
(manager/peers.py), with its refusals. Kernels here are runner processes (--connect), relay-mode runners
dialling through a kernel's socket, or fake channels whose tunnels reach a TCP echo server on this host; the
link is the in-process one. (The peer proxies as containers: test_cluster_docker_backend.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bai.common.background import Background
from bai.common.cluster import MASTER_PORT, SSH_PORT
from bai.node.agent.agent import Agent
from bai.node.agent.backends.base import Kernel, KernelSpec
from bai.node.agent.backends.sim import SimBackend
from bai.node.agent.channel import Channel, RunnerChannel
from bai.node.link.inproc import InprocHub
from bai.node.link.messages import PeerDial
from bai.node.link.streams import LinkStream
from bai.node.manager.services.agent_events import AgentEvents
from bai.node.manager.services.peers import PeerRelay
from bai.node.manager.state import records
from tests.nodeproc import free_port
from tests.records import a_kernel, a_session

RUNNER = Path(__file__).resolve().parent.parent / "bai" / "node" / "agent" / "runner.py"
PYTHON = os.environ.get("BAI_RUNNER_PYTHON", sys.executable)
SESSION, OTHER_SESSION = "s-1", "s-2"
STAMP = "2026-01-01T00:00:00+00:00"  # when the fake store's sessions and kernels were made


def cluster_port() -> int:
    """One of the cluster's ports that can be listened on (0.0.0.0) here."""
    for port in random.sample(range(MASTER_PORT, MASTER_PORT + 20), 20):
        try:
            with socket.socket() as a:
                a.bind(("0.0.0.0", port))
            return port
        except OSError:
            continue
    pytest.skip("no port of the cluster's is free here")


def free_ports(n: int) -> list[int]:
    """`n` different TCP ports free here now, on every address."""
    ports: list[int] = []
    while len(ports) < n:
        port = free_port("0.0.0.0")
        if port not in ports:
            ports.append(port)
    return ports


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """ "echo:", then every byte back; its EOF after the client's."""
    try:
        writer.write(b"echo:")
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.write_eof()
        await writer.drain()
    finally:
        writer.close()


@contextlib.asynccontextmanager
async def echo_server(port: int = 0) -> AsyncIterator[int]:
    server = await asyncio.start_server(echo, "127.0.0.1", port)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


async def talk(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes) -> bytes:
    """Send `data`, shut our writing down, read everything back until EOF."""
    writer.write(data)
    await writer.drain()
    reply = await asyncio.wait_for(reader.readexactly(len(data) + 5), 10)
    writer.write_eof()
    rest = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return reply + rest


@contextlib.asynccontextmanager
async def runner(tmp_path: Path, env: dict[str, str], name: str = "k") -> AsyncIterator[RunnerChannel]:
    """A runner process (--connect) with these variables, and the channel it connected to."""
    folder = tmp_path / name
    workdir = folder / "work"
    workdir.mkdir(parents=True)
    channel = RunnerChannel(folder / "agent.sock", lambda kind, text: None)
    await channel.listen()
    proc = await asyncio.create_subprocess_exec(
        *[PYTHON, "-u", str(RUNNER), "--connect", str(folder / "agent.sock"), "--workdir", str(workdir)],
        env={**os.environ, **env},
    )
    try:
        await channel.wait_connected(asyncio.get_running_loop().time() + 10)
        yield channel
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 10)
        await channel.close()


async def connect_when_listening(address: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the runner's relay listener (it starts in a thread of the runner's: wait for it)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return await asyncio.open_connection(address, port)
        except OSError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def relay(
    tmp_path: Path, name: str, ports: str, folder: str = "k"
) -> AsyncIterator[tuple[RunnerChannel, asyncio.subprocess.Process]]:
    """A peer proxy: a relay-mode runner for kernel `name` dialling through the socket of a kernel's channel
    (listening, no runner connected: the proxy only dials)."""
    where = tmp_path / folder
    where.mkdir(parents=True, exist_ok=True)
    channel = RunnerChannel(where / "agent.sock", lambda kind, text: None)
    await channel.listen()
    argv = [PYTHON, "-u", str(RUNNER), "--relay", name, "--connect", str(where / "agent.sock"), "--ports", ports]
    proc = await asyncio.create_subprocess_exec(*argv, stderr=subprocess.PIPE)
    try:
        yield channel, proc
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 10)
        await channel.close()


# -- the runner ---------------------------------------------------------------------------------------


async def test_relay_mode_dials_each_connection_through_the_kernels_socket(tmp_path: Path) -> None:
    first, second = free_ports(2)
    dials: list[tuple[str, int]] = []

    async def on_dial(host: str, port: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        dials.append((host, port))
        await echo(reader, writer)

    async with relay(tmp_path, "sub1", f"{first},x-y,70000,{second}") as (channel, proc):
        channel.on_dial = on_dial
        # it listens on every address: through loopback here, through the session's network in a container
        assert await talk(*await connect_when_listening("127.0.0.1", first), b"hello") == b"echo:hello"
        conns = await asyncio.gather(*(connect_when_listening("127.0.0.1", second) for _ in range(5)))
        replies = await asyncio.gather(*(talk(r, w, b"x" * 100_000) for r, w in conns))  # at once, both ways
        assert replies == [b"echo:" + b"x" * 100_000] * 5
        assert sorted(dials) == sorted([("sub1", first)] + [("sub1", second)] * 5)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 10) == 0
        assert proc.stderr is not None
        notes = (await proc.stderr.read()).decode()
        assert "--ports: skipped 'x-y'" in notes and "--ports: skipped '70000'" in notes


async def test_relay_mode_closes_a_dial_nobody_takes_and_lives_on(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    async with relay(tmp_path, "main1", str(port)) as (channel, proc):
        reader, writer = await connect_when_listening("127.0.0.1", port)  # no on_dial: the channel closes it
        assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()
        await channel.close()  # the agent's socket is gone (the kernel was destroyed): refused, never an exit
        reader, writer = await connect_when_listening("127.0.0.1", port)
        assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()
        assert proc.returncode is None


def test_relay_mode_refuses_bad_arguments(tmp_path: Path) -> None:
    sock = str(tmp_path / "agent.sock")
    cases = {
        "needs --connect": ["--relay", "sub1", "--socket", sock],
        "not a kernel's name": ["--relay", "../x", "--connect", sock],
        "names no ports": ["--relay", "sub1", "--connect", sock, "--ports", "x,0"],
    }
    for why, args in cases.items():
        done = subprocess.run([PYTHON, str(RUNNER), *args], capture_output=True, text=True, timeout=10)
        assert done.returncode == 2 and why in done.stderr, (why, done.stderr)
    (port,) = free_ports(1)
    with socket.socket() as taken:  # its only port is taken: nothing to do, exit 1
        taken.bind(("0.0.0.0", port))
        taken.listen()
        argv = [PYTHON, str(RUNNER), "--relay", "sub1", "--connect", sock, "--ports", str(port)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    assert done.returncode == 1 and "no port to listen on" in done.stderr


async def test_a_kernels_runner_leaves_every_address_to_its_apps(tmp_path: Path) -> None:
    """A cluster kernel's runner listens on nothing (the old relay variables are ignored): its apps bind any
    port on every address, as PyTorch's rendezvous server on MASTER_PORT does."""
    port = cluster_port()
    env = {"BAI_CLUSTER_PEERS": "sub1=127.0.1.2", "BAI_CLUSTER_PORTS": str(port)}  # (no sshd here: size 1)
    async with runner(tmp_path, env):
        await asyncio.sleep(0.2)
        with socket.socket() as app:
            app.bind(("0.0.0.0", port))
            app.listen()


def _sshd_pids(marker: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if marker in Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(entry))
    return pids


@pytest.mark.skipif(not os.access("/usr/sbin/sshd", os.X_OK) or not shutil.which("ssh-keygen"), reason="no sshd")
async def test_runner_starts_sshd_once(tmp_path: Path) -> None:
    with socket.socket() as probe:
        try:
            probe.bind(("0.0.0.0", SSH_PORT))
        except OSError:
            pytest.skip(f"port {SSH_PORT} is taken here")
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "BACKENDAI_CLUSTER_SIZE": "2"}
    marker = str(home / ".bai-runner")
    try:
        async with runner(tmp_path, env) as channel:
            deadline = time.monotonic() + 20
            while True:
                try:
                    reader, writer = await asyncio.open_connection("127.0.0.1", SSH_PORT)
                    break
                except OSError:
                    assert time.monotonic() < deadline, "sshd did not listen"
                    await asyncio.sleep(0.1)
            assert (await asyncio.wait_for(reader.readline(), 10)).startswith(b"SSH-2.0")
            writer.close()
            assert (home / ".bai-runner" / "ssh_host_ed25519_key").exists()
            daemons = _sshd_pids(marker)
            assert len(daemons) == 1
            with socket.socket() as probe, pytest.raises(OSError):  # it listens on every address
                probe.bind(("0.0.0.0", SSH_PORT))
            await channel.restart(10)
            await asyncio.sleep(1.0)  # the new runner looked (and found it listening)
            assert _sshd_pids(marker) == daemons
    finally:
        for pid in _sshd_pids(marker):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)


# -- agents and the manager ---------------------------------------------------------------------------


class TunnelChannel(Channel):
    """A kernel whose ports are this host's (`ports` maps a kernel port to the host's)."""

    def __init__(self, ports: dict[int, int]) -> None:
        super().__init__(lambda kind, text: None)
        self.ports = ports
        self.opened: list[int] = []

    async def open_tunnel(self, port: int, timeout: float = 10.0) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        self.opened.append(port)
        return await asyncio.open_connection("127.0.0.1", self.ports.get(port, port))


class FakeStore:
    """What PeerRelay reads of the store."""

    def __init__(self) -> None:
        self.kernels: dict[str, records.Kernel] = {}
        self.sessions: dict[str, records.Session] = {}

    async def get_kernel(self, kernel_id: str) -> records.Kernel | None:
        return self.kernels.get(kernel_id)

    async def get_session(self, session_id: str) -> records.Session | None:
        return self.sessions.get(session_id)

    async def kernels_of(self, session_id: str) -> list[records.Kernel]:
        return [k for k in self.kernels.values() if k.session_id == session_id]


class Cluster:
    """Agents on an in-process link to a manager that has only its PeerRelay (and AgentEvents routing to it)."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.hub = InprocHub()
        self.store = FakeStore()
        self.background = Background(logging.getLogger("test"))
        self.relay = PeerRelay(self.hub.manager, self.store, self.background)  # type: ignore[arg-type]
        self.agents: dict[str, Agent] = {}

    async def start(self) -> None:
        events = AgentEvents(
            None,  # type: ignore[arg-type]
            None,  # type: ignore[arg-type]
            None,
            lambda: None,  # type: ignore[arg-type]
            self.background,
            stats=SimpleNamespace(),  # type: ignore[arg-type]
            peers=self.relay,
        )
        await self.hub.manager.start(events)

    def agent(self, agent_id: str) -> Agent:
        if agent_id not in self.agents:
            agent = Agent(agent_id, SimBackend(), self.hub.agent_link(agent_id), {})  # type: ignore[arg-type]
            self.agents[agent_id] = agent
            self.hub.manager.agents[agent_id] = agent
        return self.agents[agent_id]

    def session(self, session_id: str, status: str = "RUNNING") -> None:
        self.store.sessions[session_id] = a_session(
            id=session_id, name=session_id, image="img", type="INTERACTIVE", status=status, created_at=STAMP,
            status_changed=STAMP, seq=len(self.store.sessions) + 1,
        )  # fmt: skip

    def kernel(self, agent_id: str, kernel_id: str, name: str, channel: Channel, session_id: str = SESSION) -> Kernel:
        role, idx = ("main", 1) if name == "main1" else ("sub", int(name[3:]))
        spec = KernelSpec(kernel_id, session_id, session_id, "AK", "img", {"cpu": Decimal(1)}, {}, role, idx)
        kernel = Kernel(spec=spec, channel=channel, run_dir=self.tmp_path)
        agent = self.agent(agent_id)
        agent.kernels[kernel_id] = kernel
        agent._watch_exit(kernel)
        session = self.store.sessions.get(session_id)
        self.store.kernels[kernel_id] = a_kernel(
            id=kernel_id, session_id=session_id, cluster_role=role, cluster_idx=idx, image="img", agent_id=agent_id,
            status=session.status if session is not None else "RUNNING", status_changed=STAMP, created_at=STAMP,
        )  # fmt: skip
        return kernel

    async def close(self) -> None:
        await self.hub.manager.close()
        await self.background.close()


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path)
    await c.start()
    try:
        yield c
    finally:
        await c.close()


async def dial(agent: Agent, kernel: Kernel, host: str, port: int) -> tuple[asyncio.Task[None], socket.socket]:
    """A connection of `kernel` to host:port as its runner hands it over (one end of a socket pair: the app's
    end is returned, blocking)."""
    ours, theirs = socket.socketpair()
    reader, writer = await asyncio.open_connection(sock=theirs)

    async def run() -> None:
        try:
            await agent.dial(kernel, host, port, reader, writer)
        finally:
            writer.close()

    return asyncio.create_task(run()), ours


async def app_talk(sock: socket.socket, data: bytes) -> bytes:
    """The app's side of `dial`'s connection: `talk`."""
    reader, writer = await asyncio.open_connection(sock=sock)
    return await talk(reader, writer, data)


async def test_a_kernel_reaches_a_kernel_on_another_agent_through_the_manager(cluster: Cluster) -> None:
    cluster.session(SESSION)
    async with echo_server() as port:
        main = cluster.kernel("a1", "k-main", "main1", TunnelChannel({}))
        far = TunnelChannel({MASTER_PORT: port})
        cluster.kernel("a2", "k-sub", "sub1", far)
        task, app = await dial(cluster.agents["a1"], main, "sub1", MASTER_PORT)
        assert await app_talk(app, b"x" * 100_000) == b"echo:" + b"x" * 100_000
        await asyncio.wait_for(task, 10)
        assert far.opened == [MASTER_PORT]
    assert not cluster.relay.active  # the relay ended with the connection


async def test_a_kernel_reaches_a_kernel_on_its_own_agent_directly(cluster: Cluster) -> None:
    async with echo_server() as port:
        main = cluster.kernel("a1", "k-main", "main1", TunnelChannel({}))
        near = TunnelChannel({SSH_PORT: port})
        cluster.kernel("a1", "k-sub", "sub1", near)
        # the manager knows no session here: only the agent itself can have joined them
        task, app = await dial(cluster.agents["a1"], main, "sub1", SSH_PORT)
        assert await app_talk(app, b"ssh") == b"echo:ssh"
        await asyncio.wait_for(task, 10)
        assert near.opened == [SSH_PORT]


@pytest.mark.parametrize("where", ["local", "remote"])
async def test_peer_proxy_to_kernel_end_to_end(cluster: Cluster, tmp_path: Path, where: str) -> None:
    """An app connects to sub1:PORT (the peer proxy for sub1, dialling through main1's socket): proxy -> agent
    (as main1's dial) -> (manager ->) sub1."""
    cluster.session(SESSION)
    port = cluster_port()
    async with echo_server() as echo_port, relay(tmp_path, "sub1", str(port)) as (channel, _):
        cluster.kernel("a1", "k-main", "main1", channel)
        target = TunnelChannel({port: echo_port})
        cluster.kernel("a1" if where == "local" else "a2", "k-sub", "sub1", target)
        assert await talk(*await connect_when_listening("127.0.0.1", port), b"hi") == b"echo:hi"
        assert target.opened == [port]


async def _dial_via_manager(agent: Agent, event: PeerDial) -> tuple[LinkStream, str]:
    """Ask the manager as `dial` does; the stream and error it answers with."""
    fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    agent._dials[event.dial_id] = fut
    await agent.link.emit(event.name, event.to_wire())
    stream, error, done = await asyncio.wait_for(fut, 10)
    done.set()
    return stream, error


async def test_the_manager_refuses_what_it_may_not_relay(cluster: Cluster) -> None:
    cluster.session(SESSION)
    cluster.session(OTHER_SESSION)
    cluster.session("s-3", status="TERMINATING")
    target = TunnelChannel({})
    cluster.kernel("a1", "k-main", "main1", TunnelChannel({}))
    cluster.kernel("a2", "k-sub", "sub1", target)
    cluster.kernel("a2", "k-other", "sub2", TunnelChannel({}), session_id=OTHER_SESSION)
    cluster.kernel("a1", "k-ending", "main1", TunnelChannel({}), session_id="s-3")
    cluster.kernel("a2", "k-ending-sub", "sub1", TunnelChannel({}), session_id="s-3")
    a1 = cluster.agents["a1"]
    cases = {
        "port": (PeerDial("d1", "k-main", "sub1", 8080), "not one a cluster's kernels reach"),
        "other session": (PeerDial("d2", "k-main", "sub2", MASTER_PORT), "no other kernel named 'sub2'"),
        "itself": (PeerDial("d3", "k-main", "main1", MASTER_PORT), "no other kernel named"),
        "not its agent": (PeerDial("d4", "k-sub", "main1", MASTER_PORT), "is not on agent a1"),
        "unknown kernel": (PeerDial("d5", "k-nobody", "sub1", MASTER_PORT), "no kernel k-nobody"),
        "not running": (PeerDial("d6", "k-ending", "sub1", MASTER_PORT), "is TERMINATING"),
        "bad name": (PeerDial("d7", "k-main", "../etc", MASTER_PORT), "no other kernel named"),
    }
    for what, (event, reason) in cases.items():
        stream, error = await _dial_via_manager(a1, event)
        assert reason in error, what
        assert await asyncio.wait_for(stream.receive(), 10) is None, what
    assert target.opened == []


async def test_a_peer_tunnel_reaches_only_cluster_ports(cluster: Cluster) -> None:
    target = TunnelChannel({})
    cluster.kernel("a2", "k-sub", "sub1", target)
    stream = await cluster.hub.manager.open_stream("a2", "peer-tunnel", {"kernel_id": "k-sub", "port": 22})
    assert await asyncio.wait_for(stream.receive(), 10) is None
    assert "not one a cluster's kernels reach" in (stream.closed_reason or "")
    assert target.opened == []


async def test_the_agent_refuses_other_ports_and_gives_up_without_an_answer(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    main = cluster.kernel("a1", "k-main", "main1", TunnelChannel({}))
    a1 = cluster.agents["a1"]
    task, app = await dial(a1, main, "sub1", 22)  # not a cluster port: closed at once, nothing asked
    await asyncio.wait_for(task, 10)
    assert await app_talk_eof(app)
    # the manager never answers (no relay wired): the connection ends after DIAL_TIMEOUT
    cluster.relay.dial = lambda agent_id, event: None  # type: ignore[method-assign]
    monkeypatch.setattr("bai.node.agent.agent.DIAL_TIMEOUT", 0.2)
    task, app = await dial(a1, main, "sub1", MASTER_PORT)
    await asyncio.wait_for(task, 10)
    assert await app_talk_eof(app)
    assert not a1._dials


async def app_talk_eof(sock: socket.socket) -> bool:
    """The app's end of a connection that was closed without data: True."""
    reader, writer = await asyncio.open_connection(sock=sock)
    try:
        return await asyncio.wait_for(reader.read(), 10) == b""
    finally:
        writer.close()
