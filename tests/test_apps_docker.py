"""Apps in real Docker kernels: bai-python:3.11 offers `web` (python -m http.server on /home/work, started
by its service definition on first use), reached through the tunnel on a combined node and a ZeroMQ split
cluster (kernels without any network), by bai's CLI and the official client; published on 127.0.0.1 from
the port pool when the kernel has a network that can publish, and a clear error when the pool is
exhausted; an app that cannot start says why with its output."""

from __future__ import annotations

import asyncio
import http.client
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.nodeproc import PYTHON_IMAGE, Cluster, Node, free_port, stop_removing_containers
from tests.test_official_client import Official, official_client
from tests.tui_support import node_client

SMALL = ("--cpu", "0.25", "--mem", "256m")  # three at once fit on a 2-core machine
BRIDGE = '[scaling_groups.default]\nallowed_networks = ["bridge"]\n'


def http_get(port: int, path: str, timeout: float = 30) -> tuple[int, bytes]:
    deadline = time.monotonic() + timeout
    while True:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read()
        except (ConnectionError, http.client.HTTPException, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
        finally:
            conn.close()


async def start(node, session: str, app: str) -> dict:
    client = node_client(node)
    try:
        return await client.start_app(session, app)
    finally:
        await client.close()


def open_app(node, name: str, app: str) -> tuple[subprocess.Popen[str], int, str]:
    port = free_port()
    proc = node.popen("session", "app", name, app, "--bind", f"127.0.0.1:{port}")
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    if not url:
        proc.kill()
        raise AssertionError(f"bai session app printed no URL: {proc.stderr.read()}")
    return proc, port, url


@pytest.fixture(scope="module")
def bridge_node(python_image, tmp_path_factory) -> Iterator[Node]:
    pool = 'port_range = "30700-30701"\n'
    node = Node(tmp_path_factory.mktemp("apps-bridge"), "docker", extra_config=BRIDGE, agent_config=pool).start()
    yield node
    stop_removing_containers(node)


@pytest.fixture(scope="module")
def docker_split(python_image, tmp_path_factory) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("apps-split"), "docker").start()
    yield cluster
    stop_removing_containers(cluster)


@pytest.mark.parametrize("where", ["combined", "split"])
def test_the_web_app_is_served_through_the_tunnel_from_a_kernel_without_network(
    where: str, docker_node: Node, docker_split: Cluster
) -> None:
    node = docker_node if where == "combined" else docker_split
    name = f"web-{where}-{uuid.uuid4().hex[:6]}"
    node.cli("session", "create", "--name", name, "python", check=True)
    try:
        info = node.json("session", "info", name)
        assert info["network"] is None  # the agent's default: none
        assert [(a["name"], a["ports"], a["hostPorts"]) for a in info["servicePorts"]] == [("web", [8080], [])]
        node.cli("session", "exec", name, "-c", "open('hello.txt','w').write('hello from the kernel')", check=True)
        proc, port, url = open_app(node, name, "web")
        try:
            # http.server has no login of its own: the URL carries the listener's token
            token = url.removeprefix(f"http://127.0.0.1:{port}/?token=")
            assert len(token) == 32 and url == f"http://127.0.0.1:{port}/?token={token}", url
            status, body = http_get(port, f"/hello.txt?token={token}")
            assert (status, body) == (200, b"hello from the kernel")
            status, listing = http_get(port, f"/?token={token}")
            assert status == 200 and b"hello.txt" in listing
            status, refused = http_get(port, "/hello.txt")  # another local process, without the token
            assert status == 403 and b"kernel" not in refused
        finally:
            node.cli("session", "destroy", name, check=True)
            code = proc.wait(30)
        assert code == 1 and f"session {name} ended" in proc.stderr.read()
    finally:
        node.cli("session", "destroy", name)


def test_the_official_client_reaches_a_docker_app(docker_node: Node, tmp_path: Path) -> None:
    bai_client = Official(official_client(), docker_node, tmp_path)
    name = f"web-official-{uuid.uuid4().hex[:6]}"
    out = bai_client("session", "create", "--name", name, PYTHON_IMAGE)
    assert "web" in out, out  # "This session provides the following app services: web"
    port = free_port()
    proc = bai_client.popen("app", name, "web", "-b", f"127.0.0.1:{port}")
    try:
        status, listing = http_get(port, "/")
        assert status == 200 and b"Directory listing" in listing
    finally:
        proc.terminate()
        proc.wait(20)
        docker_node.cli("session", "destroy", name, check=True)


@pytest.mark.xdist_group("apps-bridge")  # one worker, one bridge_node: its 2 host ports are fixed
def test_a_kernel_on_bridge_publishes_its_apps_on_loopback_from_the_pool(bridge_node: Node) -> None:
    name = f"web-bridge-{uuid.uuid4().hex[:6]}"
    bridge_node.cli("session", "create", "--name", name, "--network", "bridge", *SMALL, "python", check=True)
    try:
        (web,) = bridge_node.json("session", "info", name)["servicePorts"]
        assert web["hostPorts"] and 30700 <= web["hostPorts"][0] <= 30701
        out = bridge_node.cli("session", "apps", name, check=True).stdout
        assert f"127.0.0.1:{web['hostPorts'][0]}" in out
        started = asyncio.run(start(bridge_node, name, "web"))
        assert (started["app"], started["started"], started["token"]) == ("web", True, "")  # no secret of its own
        status, _ = http_get(web["hostPorts"][0], "/")
        assert status == 200
        kernel = bridge_node.json("session", "info", name)["kernels"][0]["id"]
        ports = subprocess.run(["docker", "port", f"bai-{kernel}"], capture_output=True, text=True).stdout
        assert ports.strip() == f"8080/tcp -> 127.0.0.1:{web['hostPorts'][0]}", ports  # loopback only
    finally:
        bridge_node.cli("session", "destroy", name, check=True)


@pytest.mark.xdist_group("apps-bridge")  # one worker, one bridge_node: its 2 host ports are fixed
def test_an_exhausted_port_pool_is_a_clear_error(bridge_node: Node) -> None:
    names = [f"pool-{i}-{uuid.uuid4().hex[:6]}" for i in range(3)]
    try:
        for n in names[:2]:  # the pool has 2 ports; each kernel's web app takes one
            bridge_node.cli("session", "create", "--name", n, "--network", "bridge", *SMALL, "python", check=True)
        out = bridge_node.cli("session", "create", "--name", names[2], "--network", "bridge", *SMALL, "python")
        assert out.returncode != 0
        text = bridge_node.cli("session", "info", names[2], check=True).stdout
        assert "port pool (30700-30701, [agent] port_range) has 0 free ports" in text, text
        listed = bridge_node.cli("session", "ls", "--all", check=True).stdout  # tables print brackets too
        assert "[agent] port_range" in listed, listed
        bridge_node.cli("session", "destroy", names[0], check=True)
        names.append(f"{names[2]}b")  # a freed port is given out again
        bridge_node.cli("session", "create", "--name", names[-1], "--network", "bridge", *SMALL, "python", check=True)
    finally:
        for n in names:
            bridge_node.cli("session", "destroy", n)


def test_an_app_that_cannot_start_says_why_with_its_output(docker_node: Node, tmp_path: Path) -> None:
    image = "bai-test-badapps:latest"
    bad = '{"command": ["/bin/sh", "-c", "echo cannot bind port {ports[0]}: boom >&2; exit 3"]}'
    dockerfile = (
        f"FROM {PYTHON_IMAGE}\n"
        "LABEL ai.backend.service-ports=ttyd:http:7681,bad:http:8099\n"
        f"RUN mkdir -p /etc/backend.ai/service-defs && echo '{bad}' > /etc/backend.ai/service-defs/bad.json\n"
    )
    build = ["docker", "build", "-q", "-t", image, "-"]
    built = subprocess.run(build, input=dockerfile, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    name = f"badapps-{uuid.uuid4().hex[:6]}"
    docker_node.cli("session", "create", "--name", name, image, check=True)  # built after the node started
    try:
        out = docker_node.cli("session", "app", name, "bad", timeout=120)
        assert out.returncode == 1
        assert "bad did not start: bad exited with code 3 while starting" in out.stderr, out.stderr
        assert "--- its output ---\ncannot bind port 8099: boom" in out.stderr  # the app's own words
        out = docker_node.cli("session", "app", name, "ttyd", timeout=120)  # bai's command; not in the image
        assert out.returncode == 1
        assert "ttyd did not start: cannot start ttyd: [Errno 2] No such file or directory: 'ttyd'" in out.stderr
    finally:
        docker_node.cli("session", "destroy", name, check=True)
        subprocess.run(["docker", "rmi", "-f", image], capture_output=True)
