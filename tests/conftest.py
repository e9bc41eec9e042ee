from __future__ import annotations

import os
import signal
import sys
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

# bytecode for the node and CLI processes the tests start (thousands of them): a machine that sets
# PYTHONDONTWRITEBYTECODE would compile bai's modules afresh in each (about 0.25 s of CPU), which users, who
# have bytecode, never do. (__pycache__ folders are ignored by git.)
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

# Ctrl-C for the programs the tests start (a terminal's ^C, the official client interrupting its proxy): a run
# started in the background by a shell without job control (`(pytest &)`, `nohup … &` from a script) has SIGINT
# ignored, and every program started from it would inherit that and never see one (Python installs its
# KeyboardInterrupt handler only where SIGINT is not ignored). A user's terminal gives programs SIGINT as it is.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# the modules whose tests drive the manager through tests/harness.py: each of their tests runs on both state
# engines (SQLite, and a database of the tests' own PostgreSQL server: tests/pgserver.py)
BOTH_ENGINES = {
    "test_apps_service", "test_attack_http", "test_attack_terminal", "test_clock_dates", "test_cluster_lifecycle",
    "test_create_burst", "test_forced_end", "test_idle_utilization", "test_lifecycle", "test_link_messages_typed",
    "test_owner_limits", "test_pending_limit", "test_policy_refusal", "test_projection", "test_reconcile",
    "test_scheduling_inproc", "test_scheduling_preemption", "test_scheduler_replay", "test_stats_agent",
    "test_stats_manager", "test_status_sweep", "test_terminal_inproc",
}  # fmt: skip


def _uses_harness(metafunc: pytest.Metafunc) -> bool:
    """Whether a test builds a Harness, itself or through a fixture of its module (the others, real nodes,
    would only run twice against the same state)."""
    import inspect

    for obj in [metafunc.function, *(getattr(metafunc.module, n, None) for n in metafunc.fixturenames)]:
        target = getattr(obj, "__wrapped__", obj)
        if callable(target):
            try:
                if "Harness(" in inspect.getsource(target):
                    return True
            except (OSError, TypeError):
                continue
    return False


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if (
        "state_engine" in metafunc.fixturenames
        and metafunc.module.__name__.rpartition(".")[2] in BOTH_ENGINES
        and _uses_harness(metafunc)
        and metafunc.definition.get_closest_marker("sqlite_only") is None
    ):
        metafunc.parametrize("state_engine", ["sqlite", "postgresql"], indirect=True)


@pytest.fixture(autouse=True)
def state_engine(request: pytest.FixtureRequest) -> Iterator[str]:
    """The state engine a Harness made by this test uses (both, for the modules of BOTH_ENGINES)."""
    from tests import harness

    engine = getattr(request, "param", "sqlite")
    harness.ENGINE = engine
    yield engine
    harness.ENGINE = "sqlite"


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
