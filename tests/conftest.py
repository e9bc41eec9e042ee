from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from tests.nodeproc import (
    BUSYBOX_IMAGE,
    PYTHON_IMAGE,
    Cluster,
    Node,
    ensure_image,
    require_docker,
    stop_removing_containers,
)

# every session test runs on both kernel backends, over both links (in-process, and ZeroMQ between
# a manager process and an agent process)
NODES = ["docker", "local", "docker-zmq", "local-zmq"]


@pytest.fixture(scope="session")
def python_image() -> str:
    require_docker()
    ensure_image("python", PYTHON_IMAGE)
    return PYTHON_IMAGE


@pytest.fixture(scope="session")
def busybox_image() -> str:
    require_docker()
    ensure_image("busybox", BUSYBOX_IMAGE)
    return BUSYBOX_IMAGE


def _node_for(kind: str, request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[Node]:
    backend, _, link = kind.partition("-")
    if backend == "docker":
        request.getfixturevalue("python_image")
    base = tmp_path_factory.mktemp(f"node-{kind}")
    node = Cluster(base, backend).start() if link == "zmq" else Node(base, backend).start()
    yield node
    stop_removing_containers(node)


@pytest.fixture(scope="module", params=NODES)
def node(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[Node]:
    """A running combined node, once per backend; shared by the tests of a module."""
    yield from _node_for(request.param, request, tmp_path_factory)


@pytest.fixture(scope="module")
def docker_node(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[Node]:
    yield from _node_for("docker", request, tmp_path_factory)


@pytest.fixture(autouse=True)
def no_leftover_containers(request: pytest.FixtureRequest) -> Iterator[None]:
    """After every test that used a docker node, none of its containers may be left."""
    yield
    for name in ("node", "docker_node"):
        if name in request.fixturenames:
            node: Node = request.getfixturevalue(name)
            if node.proc is not None:
                # `session run` lets the manager finish destroying in the background: allow it a moment
                deadline = time.monotonic() + 15
                while (left := node.leftover_containers()) and time.monotonic() < deadline:
                    time.sleep(0.2)
                assert not left, f"containers left behind by the test: {left}"


@pytest.fixture(scope="session")
def dockerd2(python_image: str, tmp_path_factory) -> Iterator[str]:
    """A second Docker daemon (tests/dockerd2.py) holding the python image: its DOCKER_HOST URL. Shared by the
    xdist workers of a run; started once, stopped (its containers removed) when the last one is done."""
    from tests.dockerd2 import shared_dockerd, unavailable

    reason = unavailable()
    if reason is not None:
        if os.environ.get("BAI_REQUIRE_DOCKER") == "1":
            pytest.fail(f"BAI_REQUIRE_DOCKER=1 but {reason}")
        pytest.skip(reason)
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # common to the workers
    with shared_dockerd(root, [python_image]) as daemon:
        yield daemon.host
