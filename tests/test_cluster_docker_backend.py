"""Multi-container sessions on the agent's side: the Docker backend's session network (both modes), the peer
proxies that stand in for the kernels on other agents (multi-node), adoption and clean-up, and what the other
backends and the warm pool do with cluster kernels. The Docker tests drive a DockerBackend directly (no
manager, no agent)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import aiodocker
import pytest
from aiodocker.exceptions import DockerError
from aiodocker.networks import DockerNetwork

from bai.common.cluster import (
    CLUSTER_PORTS,
    MASTER_PORT,
    MULTI_NODE,
    SINGLE_NODE,
    agent_tag,
    cluster_environ,
    members,
    network_name,
)
from bai.node.agent import assignment, leftovers, runner_lib, warm_pool
from bai.node.agent.backends.base import KernelSpec, KernelStartError, kernel_env
from bai.node.agent.backends.docker import NO_ADDRESS_POOL, DockerBackend, cluster_from_labels, peer_container_name
from bai.node.agent.backends.local import LocalBackend
from bai.node.agent.backends.sim import SimBackend
from bai.node.agent.channel import RunnerChannel
from bai.node.agent.pool import WarmPool
from bai.node.agent.scratch import Scratch
from bai.node.link.messages import ClusterSpec
from bai.node.manager.rules.admission import NETWORK_NAME
from tests.nodeproc import BUSYBOX_IMAGE, PYTHON_IMAGE, ensure_image, require_docker

RUNNER = Path(__file__).resolve().parent.parent / "bai" / "node" / "agent" / "runner.py"
MiB = 2**20


def cluster_spec(
    session_id: str,
    size: int,
    rank: int,
    mode: str = SINGLE_NODE,
    image: str = PYTHON_IMAGE,
    agents: list[str] | None = None,
    **kw: Any,
) -> KernelSpec:
    """The spec of the kernel of `rank` in a session of `size`, as the agent builds it from CreateKernel
    (`agents`: each kernel's agent, by rank)."""
    me = members(size)[rank]
    hosts = [m.hostname for m in members(size)]
    cluster = ClusterSpec(
        size=size,
        mode=mode,
        rank=rank,
        local_rank=rank if mode == SINGLE_NODE else 0,
        network=network_name(session_id, (list(agents or []) + ["agent-c"] * size)[rank]),
        hosts=hosts,
        agents=list(agents or []),
    )
    return KernelSpec(
        kernel_id=f"{session_id}-{me.hostname}",
        session_id=session_id,
        session_name=f"name-{session_id}",
        access_key="AKTEST",
        image=image,
        slots={"cpu": Decimal(1), "mem": Decimal(256 * MiB)},
        environ=cluster_environ(size, mode, rank, cluster.local_rank),
        cluster_role=me.role,
        cluster_idx=me.idx,
        cluster=cluster,
        **kw,
    )


def new_session() -> str:
    return f"clt{os.getpid()}{secrets.token_hex(3)}"


def sink(kind: str, text: str) -> None:
    pass


# -- no daemon needed ---------------------------------------------------------------------------------


def test_single_node_config_puts_the_kernel_on_its_sessions_network_under_its_name(tmp_path: Path) -> None:
    backend = DockerBackend("agent-c", tmp_path, RUNNER)
    spec = cluster_spec("s1", 3, 2)
    config = backend._container_config(spec, tmp_path / "run")
    assert config["Hostname"] == "sub2"
    assert config["HostConfig"]["NetworkMode"] == network_name("s1", "agent-c")
    assert config["NetworkingConfig"] == {"EndpointsConfig": {network_name("s1", "agent-c"): {"Aliases": ["sub2"]}}}
    assert "ExtraHosts" not in config["HostConfig"]
    env = dict(e.split("=", 1) for e in config["Env"])
    assert env["BACKENDAI_CLUSTER_SIZE"] == "3" and env["BACKENDAI_CLUSTER_HOST"] == "sub2"
    assert not [k for k in env if k.startswith("BAI_CLUSTER_")]  # (the relay variables of old)
    assert cluster_from_labels(config["Labels"]) == spec.cluster  # adoption reads it back
    assert config["Labels"]["bai.cluster-role"] == "sub" and config["Labels"]["bai.cluster-idx"] == "2"
    # a kernel with a network of its own keeps it (its route out, its ports): the session's is joined besides
    bridged = backend._container_config(cluster_spec("s1", 3, 1, network="bridge"), tmp_path / "run")
    assert bridged["HostConfig"]["NetworkMode"] == "bridge"
    assert "NetworkingConfig" not in bridged
    # one kernel: no session network
    single = KernelSpec("k", "s", "n", "AK", PYTHON_IMAGE, {}, {})
    assert backend._container_config(single, tmp_path / "run")["HostConfig"]["NetworkMode"] == "none"
    assert backend.session_network(single) is None


def test_multi_node_config_puts_the_kernel_on_its_sessions_network_and_proxies_the_remote_ones(tmp_path: Path) -> None:
    backend = DockerBackend("agent-c", tmp_path, RUNNER, user="1000:1000", labels={"bai.test": "t"})
    spec = cluster_spec("s2", 3, 1, mode=MULTI_NODE, agents=["agent-c", "agent-c", "agent-d"])
    config = backend._container_config(spec, tmp_path / "run")
    host = config["HostConfig"]
    assert host["NetworkMode"] == network_name("s2", "agent-c")  # as a single-node kernel: its session's network
    assert config["NetworkingConfig"] == {"EndpointsConfig": {network_name("s2", "agent-c"): {"Aliases": ["sub1"]}}}
    assert "ExtraHosts" not in host
    env = dict(e.split("=", 1) for e in config["Env"])
    assert not [k for k in env if k.startswith("BAI_CLUSTER_")]  # its runner relays nothing
    assert env["BACKENDAI_CLUSTER_MODE"] == MULTI_NODE
    assert backend.session_network(spec) == network_name("s2", "agent-c")
    assert backend.remote_peers(spec) == ["sub2"]  # main1 is on this agent too: reached directly
    # the proxy for sub2: the runner in relay mode, through the socket of a kernel of the session here
    proxy = backend._peer_config(spec, network_name("s2", "agent-c"), "sub2", tmp_path / "k1" / "run")
    assert proxy["Image"] == spec.image and proxy["User"] == "1000:1000" and proxy["Hostname"] == "sub2"
    entry = proxy["Entrypoint"]
    assert entry[:2] == ["/bin/sh", "-c"] and "--relay" in entry[2] and "/opt/bai/run/agent.sock" in entry[2]
    assert entry[3:] == ["sh", "sub2", ",".join(map(str, CLUSTER_PORTS))]
    assert proxy["Labels"] == {"bai.test": "t", "bai.session": "s2", "bai.agent": "agent-c", "bai.peer": "sub2"}
    assert proxy["NetworkingConfig"] == {"EndpointsConfig": {network_name("s2", "agent-c"): {"Aliases": ["sub2"]}}}
    phost = proxy["HostConfig"]
    assert phost["Binds"] == [f"{RUNNER}:/opt/bai/runner.py:ro", f"{tmp_path / 'k1' / 'run'}:/opt/bai/run:ro"]
    assert phost["NetworkMode"] == network_name("s2", "agent-c") and phost["ReadonlyRootfs"] is True
    assert phost["CapDrop"] == ["ALL"] and phost["SecurityOpt"] == ["no-new-privileges"]
    assert phost["Memory"] == phost["MemorySwap"] == 64 * MiB and 0 < phost["NanoCpus"] <= 10**9
    assert 0 < phost["PidsLimit"] <= 1024
    assert peer_container_name("s2", "sub2", "agent-c") == "bai-peer-s2-sub2-" + agent_tag("agent-c")
    # no proxies: a single-node session, every kernel here, or agents unknown
    assert backend.remote_peers(cluster_spec("s2", 3, 1, agents=["x", "y", "z"])) == []
    assert backend.remote_peers(cluster_spec("s2", 2, 0, mode=MULTI_NODE, agents=["agent-c"] * 2)) == []
    assert backend.remote_peers(cluster_spec("s2", 2, 0, mode=MULTI_NODE)) == []


def test_host_networking_is_refused_for_cluster_kernels(tmp_path: Path) -> None:
    backend = DockerBackend("agent-c", tmp_path, RUNNER, network="host")
    for mode in (SINGLE_NODE, MULTI_NODE):
        with pytest.raises(KernelStartError, match="cannot use host networking"):
            backend._container_config(cluster_spec("s3", 2, 0, mode=mode), tmp_path / "run")
    one = KernelSpec("k", "s", "n", "AK", PYTHON_IMAGE, {}, {})
    assert backend._container_config(one, tmp_path / "run")["HostConfig"]["NetworkMode"] == "host"
    bad = cluster_spec("s3", 2, 0)
    assert bad.cluster is not None
    bad.cluster.network = "bridge"  # never a network bai did not make for the session
    with pytest.raises(KernelStartError, match="bai-cluster-"):
        DockerBackend("agent-c", tmp_path, RUNNER).check_cluster(bad)


def test_kernel_env_keeps_the_managers_cluster_variables() -> None:
    spec = cluster_spec("s4", 4, 3)
    env = kernel_env(spec)
    assert env["BACKENDAI_CLUSTER_SIZE"] == "4" and env["BACKENDAI_CLUSTER_HOSTS"] == "main1,sub1,sub2,sub3"
    assert env["BACKENDAI_CLUSTER_LOCAL_RANK"] == "3"
    spec.environ = {}  # without the manager's variables: the size still comes from the spec
    assert kernel_env(spec)["BACKENDAI_CLUSTER_SIZE"] == "4"
    spec.environ = {"BACKENDAI_CLUSTER_SIZE": "9"}  # the session's variables win
    assert kernel_env(spec)["BACKENDAI_CLUSTER_SIZE"] == "9"


def test_the_assignment_file_keeps_the_cluster_spec(tmp_path: Path) -> None:
    spec = cluster_spec("s5", 2, 1, mode=MULTI_NODE)
    assignment.write(tmp_path, spec, kernel_env(spec), assignment.READY)
    data = assignment.read(tmp_path)
    assert data is not None
    back = assignment.spec_of(data)
    assert back.cluster == spec.cluster and (back.cluster_role, back.cluster_idx) == ("sub", 1)
    plain = KernelSpec("k", "s", "n", "AK", PYTHON_IMAGE, {}, {})
    assignment.write(tmp_path, plain, {}, assignment.READY)
    data = assignment.read(tmp_path)
    assert data is not None and assignment.spec_of(data).cluster is None
    assert assignment.cluster_of({"size": "bad"}) is None  # unreadable: no cluster, never a crash
    assert assignment.cluster_of({"size": "2", "mode": SINGLE_NODE, "rank": 0}) is None
    assert assignment.cluster_of({"size": 2, "mode": SINGLE_NODE, "rank": 0, "hosts": [1]}) is None


async def test_local_backend_refuses_multi_container_sessions(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "kernels", RUNNER, 5.0)
    await backend.start()
    with pytest.raises(KernelStartError, match="multi-container sessions need a Docker agent"):
        await backend.create(cluster_spec("s6", 2, 0, image="python"), sink)
    assert not (tmp_path / "kernels" / "s6-main1").exists()


async def test_sim_backend_keeps_cluster_kernels_specs() -> None:
    backend = SimBackend(start_delay=0)
    kernels = await asyncio.gather(*(backend.create(cluster_spec("s7", 3, r, image="sim"), sink) for r in range(3)))
    assert [k.spec.cluster.rank for k in kernels if k.spec.cluster] == [0, 1, 2]
    assert kernels[2].spec.cluster_role == "sub" and kernels[2].spec.cluster_idx == 2
    await backend.close(kernels)


class _NoBackend:
    async def destroy(self, kernel: Any) -> None:
        pass


async def test_warm_pool_never_serves_a_cluster_kernel() -> None:
    main1 = cluster_spec("s8", 2, 0)
    assert warm_pool.cold_reason(main1, {PYTHON_IMAGE: 1}, "none") == "it is a kernel of a multi-container session"
    pool = WarmPool(_NoBackend(), {PYTHON_IMAGE: 1})  # type: ignore[arg-type]
    ready = object()
    pool.ready[PYTHON_IMAGE] = [ready]  # type: ignore[list-item]
    assert await pool.take(main1, "none", wait=0) is None
    assert pool.ready[PYTHON_IMAGE] == [ready]  # still the pool's
    one = KernelSpec("k", "s", "n", "AK", PYTHON_IMAGE, dict(main1.slots), {})
    assert await pool.take(one, "none", wait=0) is ready


# -- with Docker ----------------------------------------------------------------------------------------


@pytest.fixture
async def docker_backend(tmp_path: Path) -> AsyncIterator[DockerBackend]:
    """A started DockerBackend whose containers and networks carry a label of the test's own (removed at the end)."""
    require_docker()
    ensure_image("python", PYTHON_IMAGE)
    label = f"cluster-{os.getpid()}-{tmp_path.name}"
    backend = DockerBackend(
        f"agent-{secrets.token_hex(4)}",
        tmp_path / "kernels",
        RUNNER,
        labels={"bai.test": label},
        scratch=Scratch("memory", 64 * MiB),
        start_timeout=20,
        runner_lib=runner_lib.install(RUNNER.read_bytes(), tmp_path / "runner-lib"),  # as `bai node` starts kernels
    )
    await backend.start()
    assert backend.docker is not None
    backend.test_label = label  # type: ignore[attr-defined]
    try:
        yield backend
    finally:
        await backend.docker.close()  # (a test may have closed it: closing twice is fine)
        docker = aiodocker.Docker()
        try:
            filters = {"label": [f"bai.test={label}"]}
            for c in await docker.containers.list(all=True, filters=filters):
                await c.delete(force=True)
            for net in await docker.networks.list(filters=filters):
                with contextlib.suppress(DockerError):
                    await DockerNetwork(docker, net["Id"]).delete()
        finally:
            await docker.close()


async def exec_in(backend: DockerBackend, container_id: str, command: list[str], detach: bool = False) -> str:
    """Run `command` in the container; its stdout (AssertionError with its output when it fails)."""
    assert backend.docker is not None
    run = await backend.docker.containers.container(container_id).exec(command)
    if detach:
        await run.start(detach=True)
        return ""
    out, err = b"", b""
    async with run.start(detach=False) as stream:
        while (msg := await stream.read_out()) is not None:
            if msg.stream == 1:
                out += msg.data
            else:
                err += msg.data
    code = (await run.inspect()).get("ExitCode")
    assert code == 0, f"{command} exited {code}: {out.decode()} {err.decode()}"
    return out.decode()


async def network_of(backend: DockerBackend, name: str) -> dict[str, Any] | None:
    assert backend.docker is not None
    try:
        return await (await backend.docker.networks.get(name)).show()
    except DockerError as e:
        assert e.status == 404
        return None


SERVER = """
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 5555))
s.listen()
c, _ = s.accept()
c.sendall(c.recv(100).upper())
c.close()
"""

CLIENT = """
import socket, time
print(socket.gethostbyname("sub1"), socket.gethostbyname("sub2"))
deadline = time.monotonic() + 10
while True:
    try:
        c = socket.create_connection(("sub2", 5555), timeout=2)
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.05)
c.sendall(b"hello from main1")
print(c.recv(100).decode())
"""

PROBE = "import os; print(*(os.environ.get(k, '-') for k in ('BACKENDAI_CLUSTER_HOST', 'BACKENDAI_CLUSTER_SIZE', "
PROBE += "'BACKENDAI_CLUSTER_ROLE', 'BACKENDAI_CLUSTER_IDX', 'MASTER_ADDR', 'BACKENDAI_SESSION_ID')))"


@pytest.mark.docker
async def test_single_node_session_kernels_find_each_other_by_name_on_their_own_network(
    docker_backend: DockerBackend,
) -> None:
    backend = docker_backend
    assert backend.docker is not None
    session = new_session()
    net = network_name(session, backend.agent_id)
    made = 0
    create = backend.docker.networks.create

    async def counting_create(config: dict[str, Any]) -> Any:
        nonlocal made
        made += 1
        await asyncio.sleep(0.05)  # a slow daemon: the other kernels' creations come meanwhile
        return await create(config)

    backend.docker.networks.create = counting_create  # type: ignore[method-assign]
    # sub2 has a network of its own (bridge): it keeps it and joins the session's besides
    specs = [cluster_spec(session, 3, r, network="bridge" if r == 2 else None) for r in range(3)]
    kernels = await asyncio.gather(*(backend.create(s, sink) for s in specs))  # at once, as the manager does
    main1, sub1, sub2 = kernels
    assert made == 1  # created once, by whichever came first
    assert backend.docker is not None
    assert [n["Name"] for n in await backend.docker.networks.list(filters={"name": [net]})] == [net]
    info = await network_of(backend, net)
    assert info is not None and info["Internal"] is True and info["Driver"] == "bridge"
    assert info["Options"]["com.docker.network.bridge.inhibit_ipv4"] == "true"  # the host has no address on it
    assert info["Labels"]["bai.session"] == session and info["Labels"]["bai.agent"] == backend.agent_id
    assert info["Labels"]["bai.test"] == backend.test_label  # type: ignore[attr-defined]
    attached = {}
    for k in kernels:
        shown = await backend.docker.containers.container(k.container_id).show()
        attached[k.spec.cluster_role + str(k.spec.cluster_idx)] = set(shown["NetworkSettings"]["Networks"])
    assert attached == {"main1": {net}, "sub1": {net}, "sub2": {"bridge", net}}

    # a server on an arbitrary port in sub2; main1 resolves the others and talks to it
    await exec_in(backend, sub2.container_id or "", ["python3", "-c", SERVER], detach=True)
    probes = await asyncio.gather(
        exec_in(backend, main1.container_id or "", ["python3", "-c", CLIENT]),
        *(exec_in(backend, k.container_id or "", ["python3", "-c", PROBE]) for k in kernels),
    )
    addresses, answer = probes[0].splitlines()
    assert answer == "HELLO FROM MAIN1"
    sub1_ip, sub2_ip = addresses.split()
    assert sub1_ip == shown_ip(await backend.docker.containers.container(sub1.container_id).show(), net)
    assert sub2_ip == shown_ip(await backend.docker.containers.container(sub2.container_id).show(), net)
    assert [p.split() for p in probes[1:]] == [
        ["main1", "3", "main", "1", "main1", session],
        ["sub1", "3", "sub", "1", "main1", session],
        ["sub2", "3", "sub", "2", "main1", session],
    ]

    # the network stays while a kernel of the session is left, and goes with the last one
    await asyncio.gather(backend.destroy(main1), backend.destroy(sub2))
    assert await network_of(backend, net) is not None
    await backend.destroy(sub1)
    assert await network_of(backend, net) is None
    await backend.destroy(sub1)  # again: nothing more happens
    assert session not in backend._net_members and session not in backend._net_locks


def shown_ip(container: dict[str, Any], network: str) -> str:
    return container["NetworkSettings"]["Networks"][network]["IPAddress"]


PEER_CLIENT = f"""
import socket, time
app = socket.socket()
app.bind(("0.0.0.0", {MASTER_PORT}))  # the kernel's own namespace is free: PyTorch's rendezvous server binds so
app.listen()
print(socket.gethostbyname("sub1"))
deadline = time.monotonic() + 10
while True:
    try:
        c = socket.create_connection(("sub1", {MASTER_PORT}), timeout=5)
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.05)
c.sendall(b"hello sub1")
c.shutdown(socket.SHUT_WR)
got = b""
while True:
    data = c.recv(65536)
    if not data:
        break
    got += data
print(got.decode())
"""


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        pass


@pytest.mark.docker
async def test_a_multi_node_kernel_reaches_a_kernel_on_another_agent_through_its_peer_proxy(
    docker_backend: DockerBackend,
) -> None:
    """main1 here, sub1 on another agent: a peer proxy under sub1's name on the session's network takes
    sub1:PORT and hands it to the agent as main1's dial (here: spliced to an echo server on this host)."""
    backend = docker_backend
    assert backend.docker is not None
    session = new_session()
    net = network_name(session, backend.agent_id)
    dials: list[tuple[str, int]] = []

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"echo:")
        await _pipe(reader, writer)
        writer.close()

    async def on_dial(host: str, port: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        dials.append((host, port))
        far_reader, far_writer = await asyncio.open_connection("127.0.0.1", echo_port)
        await asyncio.gather(_pipe(reader, far_writer), _pipe(far_reader, writer))
        far_writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    echo_port = server.sockets[0].getsockname()[1]
    try:
        spec = cluster_spec(session, 2, 0, mode=MULTI_NODE, agents=[backend.agent_id, "elsewhere"])
        kernel = await backend.create(spec, sink)
        assert isinstance(kernel.channel, RunnerChannel)
        kernel.channel.on_dial = on_dial  # what the agent sets (agent.py _watch_exit)
        proxy = await backend.docker.containers.container(peer_container_name(session, "sub1", backend.agent_id)).show()
        assert proxy["State"]["Running"] is True
        assert proxy["Config"]["Labels"]["bai.peer"] == "sub1"
        assert proxy["Config"]["Labels"]["bai.session"] == session
        assert proxy["Config"]["Labels"]["bai.test"] == backend.test_label  # type: ignore[attr-defined]
        assert "sub1" in proxy["NetworkSettings"]["Networks"][net]["Aliases"]
        assert proxy["HostConfig"]["ReadonlyRootfs"] is True and proxy["HostConfig"]["Memory"] == 64 * MiB
        shown = await backend.docker.containers.container(kernel.container_id).show()
        assert set(shown["NetworkSettings"]["Networks"]) == {net}
        assert "ExtraHosts" not in shown["HostConfig"] or not shown["HostConfig"]["ExtraHosts"]

        out = await exec_in(backend, kernel.container_id or "", ["python3", "-c", PEER_CLIENT])
        address, answer = out.splitlines()
        assert address == shown_ip(proxy, net)  # sub1 is the proxy, by Docker's DNS
        assert answer == "echo:hello sub1"  # the app's bytes went both ways through the agent
        assert dials == [("sub1", MASTER_PORT)]

        await backend.destroy(kernel)  # the session's last kernel here: its proxy and network go
        with pytest.raises(DockerError) as gone:
            await backend.docker.containers.container(peer_container_name(session, "sub1", backend.agent_id)).show()
        assert gone.value.status == 404
        assert await network_of(backend, net) is None
        assert session not in backend._peers and session not in backend._net_members
    finally:
        server.close()


@pytest.mark.docker
async def test_a_multi_node_kernel_of_an_image_without_python_fails_saying_so(docker_backend: DockerBackend) -> None:
    ensure_image("busybox", BUSYBOX_IMAGE)
    session = new_session()
    agents = ["elsewhere", docker_backend.agent_id]
    spec = cluster_spec(session, 2, 1, mode=MULTI_NODE, image=BUSYBOX_IMAGE, agents=agents)
    with pytest.raises(KernelStartError, match="has no Python: a multi-node session's image needs one"):
        await docker_backend.create(spec, sink)
    assert docker_backend.docker is not None
    with pytest.raises(DockerError):
        await docker_backend.docker.containers.container(
            peer_container_name(session, "main1", docker_backend.agent_id)
        ).show()
    assert await network_of(docker_backend, network_name(session, docker_backend.agent_id)) is None


@pytest.mark.docker
async def test_a_failed_start_removes_the_network_it_made(docker_backend: DockerBackend) -> None:
    session = new_session()
    spec = cluster_spec(session, 2, 0, image="bai-no-such-image:0")
    with pytest.raises(KernelStartError, match="not found"):
        await docker_backend.create(spec, sink)
    assert await network_of(docker_backend, network_name(session, docker_backend.agent_id)) is None
    assert session not in docker_backend._net_members
    # a start cancelled (the manager gave up) while its network is being made: nothing is left either
    backend = docker_backend
    assert backend.docker is not None
    create = backend.docker.networks.create
    started = asyncio.Event()

    async def slow_create(config: dict[str, Any]) -> Any:
        started.set()
        await asyncio.sleep(0.3)
        return await create(config)

    backend.docker.networks.create = slow_create  # type: ignore[method-assign]
    session = new_session()
    task = asyncio.create_task(backend.create(cluster_spec(session, 2, 1), sink))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await network_of(backend, network_name(session, backend.agent_id)) is None
    assert session not in backend._net_members and session not in backend._net_locks
    assert not (backend.kernels_dir / f"{session}-sub1").exists()


@pytest.mark.docker
async def test_a_restarted_agent_adopts_cluster_kernels_and_removes_leftover_networks(
    docker_backend: DockerBackend, tmp_path: Path
) -> None:
    first = docker_backend
    assert first.docker is not None
    session, crashed, others = new_session(), new_session(), new_session()
    # a multi-node kernel (sub1) whose main1 is on another agent: its peer proxy stands in for main1 here
    spec = cluster_spec(session, 2, 1, mode=MULTI_NODE, agents=["elsewhere", first.agent_id])
    kernel = await first.create(spec, sink)
    labels = {"bai.test": first.test_label}  # type: ignore[attr-defined]
    # what an agent that died mid-session left: its network with a peer proxy on it (its kernel gone), and
    # another agent's network (not ours to remove)
    lost = cluster_spec(crashed, 2, 1, mode=MULTI_NODE, agents=["elsewhere", first.agent_id])
    (tmp_path / "lost").mkdir()
    proxies = await first._join_network(lost, tmp_path / "lost")
    assert proxies is not None
    await proxies
    await first.docker.networks.create(
        {
            "Name": network_name(others, "another-agent"),
            "Internal": True,
            "CheckDuplicate": True,
            "Labels": {**labels, "bai.agent": "another-agent", "bai.session": others},
        }
    )
    await first.close([kernel])  # the agent stops; its kernels keep running
    second = DockerBackend(
        first.agent_id, first.kernels_dir, RUNNER, labels=dict(first.labels), scratch=first.scratch, start_timeout=20
    )
    await second.start()
    try:
        adopted = await second.adopt(sink)
        assert [k.spec.kernel_id for k in adopted] == [spec.kernel_id]  # a proxy is no kernel
        again = adopted[0]
        assert again.spec.cluster == spec.cluster
        assert (again.spec.cluster_role, again.spec.cluster_idx) == ("sub", 1)
        assert await network_of(second, network_name(session, second.agent_id)) is not None  # in use: kept
        kept = await second.docker.containers.container(peer_container_name(session, "main1", second.agent_id)).show()
        assert kept["State"]["Running"] is True  # its session's proxy: kept
        assert await network_of(second, network_name(crashed, second.agent_id)) is None  # a leftover: removed
        with pytest.raises(DockerError):  # with its proxy
            await second.docker.containers.container(peer_container_name(crashed, "main1", second.agent_id)).show()
        assert await network_of(second, network_name(others, "another-agent")) is not None  # another agent's
        assert again.settled is not None
        await asyncio.wait_for(again.settled, 20)  # its runner came back
        await second.destroy(again)
        assert (
            await network_of(second, network_name(session, second.agent_id)) is None
        )  # it was the session's last kernel here
        with pytest.raises(DockerError):
            await second.docker.containers.container(peer_container_name(session, "main1", second.agent_id)).show()
    finally:
        await second.close([])


# -- agents sharing one daemon; a daemon without address pools ----------------------------------------------

POOLS_TAKEN = (
    "could not find an available, non-overlapping IPv4 address pool among the defaults to assign to the network"
)


def test_network_and_peer_names_are_each_agents_own_and_docker_safe() -> None:
    names = {network_name("s1", a) for a in ("agent-a", "agent-b", "Agent-A", "agent/a", "x" * 200, "")}
    assert len(names) == 6  # two agents never share a name, however alike their ids
    for name in names:
        assert NETWORK_NAME.match(name) and name.startswith("bai-cluster-s1-") and len(name) < 60
    assert peer_container_name("s1", "sub1", "agent-a") != peer_container_name("s1", "sub1", "agent-b")
    assert agent_tag("Agent_One.example.com:6001").startswith("agent_one.exampl-")


async def test_leftover_removal_never_touches_another_agents_network_even_if_listed() -> None:
    """The daemon is asked for this agent's networks by label; were its answer wider (another agent's network
    named alike, or a filter it ignores), nothing of the other agent's is removed."""
    deleted: list[str] = []

    class FakeNetwork:
        def __init__(self, docker: Any, net_id: str) -> None:
            self.id = net_id

        async def show(self) -> dict[str, Any]:
            return {"Containers": {}}

        async def delete(self) -> None:
            deleted.append(self.id)

    class FakeContainers:
        async def list(self, **kw: Any) -> list[Any]:
            theirs = SimpleNamespace(id="their-proxy", _container={"Labels": {"bai.agent": "agent-b", "bai.peer": "x"}})
            return [theirs]

    class FakeNetworks:
        async def list(self, **kw: Any) -> list[dict[str, Any]]:
            return [
                {"Name": network_name("s1", "agent-a"), "Id": "mine", "Labels": {"bai.agent": "agent-a"}},
                {"Name": network_name("s1", "agent-b"), "Id": "theirs", "Labels": {"bai.agent": "agent-b"}},
                {"Name": "bai-cluster-s1", "Id": "unlabelled", "Labels": {}},
            ]

    docker = SimpleNamespace(containers=FakeContainers(), networks=FakeNetworks())
    with mock.patch("aiodocker.networks.DockerNetwork", FakeNetwork):
        removed = await leftovers.remove_networks(docker, "agent-a")
    assert removed == [network_name("s1", "agent-a")] and deleted == ["mine"]


@pytest.mark.docker
async def test_a_daemon_without_a_free_address_pool_fails_the_start_saying_so(docker_backend: DockerBackend) -> None:
    backend = docker_backend
    assert backend.docker is not None

    async def no_pool(config: dict[str, Any]) -> Any:
        raise DockerError(400, POOLS_TAKEN)  # what Docker answers when every default-address-pool is taken

    backend.docker.networks.create = no_pool  # type: ignore[method-assign]
    session = new_session()
    with pytest.raises(KernelStartError) as err:
        await backend.create(cluster_spec(session, 2, 1), sink)
    assert str(err.value) == NO_ADDRESS_POOL
    assert "no free address pool for the session's network" in str(err.value)
    assert session not in backend._net_members and session not in backend._net_locks
    assert not await backend.docker.containers.list(all=True, filters={"label": [f"ai.backend.session-id={session}"]})


@pytest.mark.docker
async def test_two_agents_on_one_daemon_each_make_and_remove_only_their_own_network(
    docker_backend: DockerBackend, tmp_path: Path
) -> None:
    """A multi-node session whose two kernels land on two agents of the same daemon: two networks, one per agent
    (no "network is ambiguous"); one agent's end or restart leaves the other's network alone."""
    one = docker_backend
    assert one.docker is not None
    two = DockerBackend(
        f"agent-{secrets.token_hex(4)}", tmp_path / "two", RUNNER, labels=dict(one.labels), scratch=one.scratch,
        start_timeout=20,
    )  # fmt: skip
    await two.start()
    session = new_session()
    agents = [one.agent_id, two.agent_id]
    try:
        main1, sub1 = await asyncio.gather(
            one.create(cluster_spec(session, 2, 0, mode=MULTI_NODE, agents=agents), sink),
            two.create(cluster_spec(session, 2, 1, mode=MULTI_NODE, agents=agents), sink),
        )
        mine, theirs = network_name(session, one.agent_id), network_name(session, two.agent_id)
        net_one, net_two = await network_of(one, mine), await network_of(two, theirs)
        assert net_one is not None and net_two is not None and net_one["Id"] != net_two["Id"]
        assert net_one["Labels"]["bai.agent"] == one.agent_id and net_two["Labels"]["bai.agent"] == two.agent_id
        # each agent's proxy stands in for the other's kernel, under a name of its own
        for backend, peer in ((one, "sub1"), (two, "main1")):
            shown = await backend.docker.containers.container(  # type: ignore[union-attr]
                peer_container_name(session, peer, backend.agent_id)
            ).show()
            assert shown["State"]["Running"] is True
        # agent two restarts and adopts: agent one's network (in use or not) is not its to remove
        await two.close([sub1])
        again = DockerBackend(two.agent_id, two.kernels_dir, RUNNER, labels=dict(two.labels), scratch=two.scratch)
        await again.start()
        two = again
        adopted = await two.adopt(sink)
        assert [k.spec.kernel_id for k in adopted] == [sub1.spec.kernel_id]
        assert await network_of(one, mine) is not None and await network_of(two, theirs) is not None
        await one.destroy(main1)
        assert await network_of(one, mine) is None  # one's last kernel: its network goes
        assert await network_of(two, theirs) is not None  # two's stays with its kernel
        await two.destroy(adopted[0])
        assert await network_of(two, theirs) is None
    finally:
        await two.close([])
