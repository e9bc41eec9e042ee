"""Multi-container ("cluster") sessions end to end: real `bai` processes, real Docker.

- single-node: three kernels on one agent, on the session's Docker network; each knows its place
  (BACKENDAI_CLUSTER_*), main1 reaches a server in sub2 on an arbitrary port, `exec` / `logs --kernel`
  reach the kernel named, and destroying removes the containers and the network.
- multi-node: a manager and two agents, the second on another Docker daemon (tests/dockerd2.py), each with
  room for one kernel, so a session of two must spread: main1 on one daemon, sub1 on the other, with no
  route out of their node; main1 reaches sub1:12345 through the agents' link (no host opens a port).
- ssh: in an image with sshd (packaging/build-kernel-image.sh sshd), `ssh sub1 hostname` from main1.
- a kernel that cannot start (its image is missing on the second daemon) cancels the session and leaves
  no container anywhere.

Like the other Docker tests: skipped without Docker, failed with BAI_REQUIRE_DOCKER=1 (as in CI).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator

import pytest

from bai.common.cluster import MULTI_NODE, NETWORK_PREFIX, SINGLE_NODE, cluster_environ, network_name
from tests.dockerd2 import copy_images
from tests.nodeproc import Cluster, Node, ensure_image, stop_removing_containers

pytestmark = [pytest.mark.docker, pytest.mark.xdist_group("cluster-e2e")]  # one worker: its nodes start once

SSHD_IMAGE = os.environ.get("BAI_TEST_SSHD_IMAGE", "bai-sshd:latest")
SESSION_LABELS = ("ai.backend.session-id", "bai.session")  # kernels; what else a session has (peer proxies)
KERNEL_LABEL = "ai.backend.kernel-id"

# a one-shot line server: answers the first line it gets with who it is and what it got, then closes
SERVER = """
import socket, threading
_srv = socket.create_server(({bind!r}, {port}))
def _serve():
    conn, _ = _srv.accept()
    with conn, conn.makefile('rb') as f:
        line = f.readline().strip()
        conn.sendall(b'reply from ' + socket.gethostname().encode() + b' to ' + line + b'\\n')
    _srv.close()
threading.Thread(target=_serve, daemon=True).start()
print('listening')
"""
CLIENT = """
import socket
with socket.create_connection(({host!r}, {port}), timeout=20) as c:
    c.sendall(b'hello from main1\\n')
    print(c.makefile('rb').readline().decode().strip())
"""
CLUSTER_VARS = "import json, os, socket; print(json.dumps({**{k: v for k, v in os.environ.items() \
if k.startswith('BACKENDAI_CLUSTER_')}, 'hostname': socket.gethostname()}))"


# -- helpers ------------------------------------------------------------------------------------------------


def docker(host: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", *(("-H", host) if host else ()), *args], capture_output=True, text=True, timeout=60
    )


def session_containers(host: str | None, session_id: str) -> list[str]:
    """Every container (any state) of the session on the daemon at `host` (None: the default one): its kernels
    and whatever else it runs there."""
    found: set[str] = set()
    for label in SESSION_LABELS:
        out = docker(host, "ps", "-aq", "--filter", f"label={label}={session_id}")
        assert out.returncode == 0, out.stderr
        found.update(out.stdout.split())
    return sorted(found)


def kernel_containers(host: str | None, session_id: str) -> list[str]:
    """The session's kernels on the daemon at `host`."""
    out = docker(
        host, "ps", "-aq", "--filter", f"label={SESSION_LABELS[0]}={session_id}", "--filter", f"label={KERNEL_LABEL}"
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def session_networks(host: str | None, session_id: str) -> list[str]:
    out = docker(host, "network", "ls", "--format", "{{.Name}}", "--filter", f"name={NETWORK_PREFIX}{session_id}")
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def no_route_out(host: str | None, container: str) -> bool:
    """Whether each network of the container is `none` or an internal one (no route out of the node)."""
    mode = inspect(host, container, "{{.HostConfig.NetworkMode}}")
    nets = set(json.loads(inspect(host, container, "{{json .NetworkSettings.Networks}}")) or {}) | {mode}
    return all(n == "none" or inspect_network(host, n, "{{.Internal}}") == "true" for n in nets)


def inspect_network(host: str | None, network: str, template: str) -> str:
    out = docker(host, "network", "inspect", "--format", template, network)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def inspect(host: str | None, container: str, template: str) -> str:
    out = docker(host, "inspect", "--format", template, container)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def eventually(check, what: str, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while not (result := check()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert result, f"{what} (after {timeout:g} s)"
    return result


def in_kernel(node, session: str, kernel: str, code: str, timeout: float = 60) -> str:
    """Run Python `code` in one kernel of the session; its stdout."""
    r = node.cli("session", "exec", session, "--kernel", kernel, "-c", code, timeout=timeout)
    assert r.returncode == 0, f"exec in {kernel} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
    return r.stdout


def create(node, image: str, name: str, size: int, mode: str = SINGLE_NODE, *extra: str) -> dict:
    return node.json(
        "session", "create", image, "--name", name, "--cluster-size", str(size), "--cluster-mode", mode, *extra
    )


def pass_message(node, session: str, server_kernel: str, bind: str, port: int) -> str:
    """Start a server in `server_kernel`, connect to it by name from main1; the reply main1 got."""
    assert in_kernel(node, session, server_kernel, SERVER.format(bind=bind, port=port)) == "listening\n"
    return in_kernel(node, session, "main1", CLIENT.format(host=server_kernel, port=port)).strip()


# -- fixtures -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def sshd_image(python_image: str) -> str:
    ensure_image("sshd", SSHD_IMAGE)
    return SSHD_IMAGE


@pytest.fixture(scope="module")
def single(python_image: str, tmp_path_factory) -> Iterator[Node]:
    """A combined node whose agent offers 8 cpus (so sessions of several kernels fit on a 2-core machine)."""
    node = Node(tmp_path_factory.mktemp("cluster-single"), "docker", agent_config='cpu = "8"\n').start()
    yield node
    stop_removing_containers(node)


@pytest.fixture(scope="module")
def trio(single: Node) -> Iterator[dict]:
    """A single-node session of three kernels, shared by the tests that only use it."""
    created = create(single, "python", "trio", 3, SINGLE_NODE, "--cpu", "0.5", "--mem", "256m")
    yield created
    single.cli("session", "destroy", "trio")


@pytest.fixture(scope="module")
def first_daemon_only(python_image: str) -> Iterator[str]:
    """An image only the default daemon has (a tag of the python image): a kernel on the second one fails."""
    tag = f"bai-e2e-first-daemon-only:{os.getpid()}"
    subprocess.run(["docker", "tag", python_image, tag], check=True, capture_output=True)
    yield tag
    docker(None, "image", "rm", tag)


@pytest.fixture(scope="module")
def multi(dockerd2: str, first_daemon_only: str, tmp_path_factory) -> Iterator[Cluster]:
    """A manager and two agents, each with cpu for one kernel: agent 0 on the default Docker daemon, agent 1
    on the second one."""
    cluster = Cluster(
        tmp_path_factory.mktemp("cluster-multi"),
        "docker",
        agents=2,
        agent_config='cpu = "1"\n',
        agent_env={1: {"DOCKER_HOST": dockerd2}},
    ).start()
    yield cluster
    stop_removing_containers(cluster)


# -- single-node --------------------------------------------------------------------------------------------


def test_single_node_kernels_know_their_place_and_share_the_sessions_network(single: Node, trio: dict) -> None:
    sid = trio["sessionId"]
    for rank, name in enumerate(("main1", "sub1", "sub2")):
        got = json.loads(in_kernel(single, "trio", name, CLUSTER_VARS))
        want = {k: v for k, v in cluster_environ(3, SINGLE_NODE, rank).items() if k.startswith("BACKENDAI_CLUSTER_")}
        assert got == {**want, "hostname": name}
    ids = kernel_containers(None, sid)
    assert len(ids) == 3
    assert sorted(inspect(None, c, "{{.Config.Hostname}}") for c in ids) == ["main1", "sub1", "sub2"]
    net = network_name(sid, single.agent_id)
    assert session_networks(None, sid) == [net]
    for c in ids:
        assert net in json.loads(inspect(None, c, "{{json .NetworkSettings.Networks}}"))
        assert no_route_out(None, c)


def test_single_node_main1_reaches_a_server_in_sub2_on_any_port(single: Node, trio: dict) -> None:
    assert pass_message(single, "trio", "sub2", "0.0.0.0", 23456) == "reply from sub2 to hello from main1"


def test_exec_and_logs_reach_the_kernel_named(single: Node, trio: dict) -> None:
    r = single.cli("session", "exec", "trio", "--kernel", "sub1", "--", "hostname", check=True)
    assert r.stdout.strip() == "sub1"
    in_kernel(single, "trio", "sub1", "print('marker-of-sub1')")
    in_kernel(single, "trio", "main1", "print('marker-of-main1')")

    def sub1_log() -> str:
        out = single.cli("session", "logs", "trio", "--kernel", "sub1", check=True).stdout
        return out if "marker-of-sub1" in out else ""

    assert "marker-of-main1" not in eventually(sub1_log, "sub1's output in `logs --kernel sub1`")


def test_destroy_removes_every_kernel_and_the_sessions_network(single: Node) -> None:
    sid = create(single, "python", "trio-end", 3, SINGLE_NODE, "--cpu", "0.5", "--mem", "256m")["sessionId"]
    assert len(kernel_containers(None, sid)) == 3
    assert session_networks(None, sid)
    single.cli("session", "destroy", "trio-end", check=True)
    eventually(lambda: not session_containers(None, sid), "the three containers are removed")
    eventually(lambda: not session_networks(None, sid), "the session's network is removed")


# -- multi-node ---------------------------------------------------------------------------------------------


def test_multi_node_session_spreads_over_two_daemons_and_talks_through_the_link(multi: Cluster, dockerd2: str) -> None:
    sid = create(multi, "python", "spread", 2, MULTI_NODE, "--cpu", "1")["sessionId"]
    try:
        here, there = kernel_containers(None, sid), kernel_containers(dockerd2, sid)
        assert len(here) == 1 and len(there) == 1, (here, there)
        names = {inspect(None, here[0], "{{.Config.Hostname}}"), inspect(dockerd2, there[0], "{{.Config.Hostname}}")}
        assert names == {"main1", "sub1"}
        # no route out of their node: the agents' link carries what they say to each other
        assert no_route_out(None, here[0]) and no_route_out(dockerd2, there[0])
        got = json.loads(in_kernel(multi, "spread", "sub1", CLUSTER_VARS))
        want = {k: v for k, v in cluster_environ(2, MULTI_NODE, 1).items() if k.startswith("BACKENDAI_CLUSTER_")}
        assert got == {**want, "hostname": "sub1"}
        assert pass_message(multi, "spread", "sub1", "0.0.0.0", 12345) == "reply from sub1 to hello from main1"
    finally:
        multi.cli("session", "destroy", "spread")
    for host, where in ((None, "the default daemon"), (dockerd2, "the second daemon")):
        eventually(lambda h=host: not session_containers(h, sid), f"the session's containers on {where} are removed")
        eventually(lambda h=host: not session_networks(h, sid), f"the session's network on {where} is removed")


def test_a_kernel_that_cannot_start_cancels_the_session_and_leaves_no_container(
    multi: Cluster, dockerd2: str, first_daemon_only: str
) -> None:
    r = multi.cli(
        "session", "create", first_daemon_only, "--name", "half", "--cluster-size", "2",
        "--cluster-mode", MULTI_NODE, "--cpu", "1",
    )  # fmt: skip
    assert r.returncode == 125, f"{r.returncode}\n{r.stdout}\n{r.stderr}"
    info = multi.json("session", "info", "half")
    assert info["status"] == "CANCELLED", info
    sid = info["id"]
    eventually(lambda: not session_containers(None, sid), "the kernel that started is removed")
    eventually(lambda: not session_containers(dockerd2, sid), "nothing is left on the second daemon")
    eventually(lambda: not session_networks(None, sid) and not session_networks(dockerd2, sid), "no network is left")
    # the slots are free again: a session that can start does
    again = create(multi, "python", "whole", 2, MULTI_NODE, "--cpu", "1")
    assert again["status"] == "RUNNING"
    multi.cli("session", "destroy", "whole", check=True)
    eventually(
        lambda: (
            not session_containers(None, again["sessionId"]) and not session_containers(dockerd2, again["sessionId"])
        ),
        "the second session's kernels are removed",
    )


# -- two agents on one Docker daemon -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shared_daemon(python_image: str, tmp_path_factory) -> Iterator[Cluster]:
    """A manager and two agents on the SAME Docker daemon, each with cpu for one kernel."""
    cluster = Cluster(tmp_path_factory.mktemp("cluster-shared"), "docker", agents=2, agent_config='cpu = "1"\n').start()
    yield cluster
    stop_removing_containers(cluster)


def test_two_agents_on_one_daemon_each_give_a_multi_node_session_a_network_of_its_own(shared_daemon: Cluster) -> None:
    """No "network … is ambiguous": each agent names the session's network for itself, makes and removes only it."""
    created = create(shared_daemon, "python", "shared", 2, MULTI_NODE, "--cpu", "1")
    assert created["status"] == "RUNNING", created
    sid = created["sessionId"]
    try:
        ids = [a.agent_id for a in shared_daemon.agents]
        assert sorted(session_networks(None, sid)) == sorted(network_name(sid, a) for a in ids)
        for agent_id in ids:
            assert inspect_network(None, network_name(sid, agent_id), '{{index .Labels "bai.agent"}}') == agent_id
        assert pass_message(shared_daemon, "shared", "sub1", "0.0.0.0", 12345) == "reply from sub1 to hello from main1"
    finally:
        shared_daemon.cli("session", "destroy", "shared")
    eventually(lambda: not session_containers(None, sid), "the session's kernels and proxies are removed")
    eventually(lambda: not session_networks(None, sid), "both agents' networks are removed")


# -- ssh ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [SINGLE_NODE, MULTI_NODE])
def test_ssh_from_main1_to_sub1_without_a_password(mode: str, sshd_image: str, request: pytest.FixtureRequest) -> None:
    if mode == SINGLE_NODE:
        node = request.getfixturevalue("single")
        extra = ("--cpu", "0.5", "--mem", "256m")
    else:
        node = request.getfixturevalue("multi")
        copy_images(request.getfixturevalue("dockerd2"), [sshd_image])
        extra = ("--cpu", "1")
    name = f"ssh-{mode}"
    create(node, sshd_image, name, 2, mode, *extra)
    try:
        # sshd starts with the kernel; allow it a moment to listen
        deadline = time.monotonic() + 15
        while True:
            r = node.cli("session", "exec", name, "--kernel", "main1", "--", "ssh", "sub1", "hostname", timeout=60)
            if r.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert r.returncode == 0, f"ssh sub1 hostname exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
        assert r.stdout.strip().splitlines()[-1] == "sub1", r.stdout
    finally:
        node.cli("session", "destroy", name)
