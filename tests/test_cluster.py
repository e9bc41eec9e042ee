"""A manager and agents as separate processes over the ZeroMQ link (CURVE) on 127.0.0.1."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import zmq

from tests.nodeproc import Cluster, containers_after_destroy, stop_removing_containers


@contextlib.contextmanager
def docker_cluster(base) -> Iterator[Cluster]:
    """A manager and one docker agent; whatever containers the test leaves are removed afterwards."""
    cluster = Cluster(base, "docker", agents=1).start()
    try:
        yield cluster
    finally:
        stop_removing_containers(cluster)


def wait_until(fn, timeout: float = 20.0, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


def agent_status(cluster: Cluster) -> dict[str, str]:
    return {a["id"]: a["status"] for a in cluster.json("agent", "ls")}


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    """A manager and 3 local-backend agents offering 2 cpu each."""
    cluster = Cluster(tmp_path_factory.mktemp("three"), "local", agents=3, agent_config='cpu = "2"\n').start()
    yield cluster
    cluster.stop()


def test_agents_register_and_sessions_spread(three: Cluster) -> None:
    assert wait_until(lambda: len(agent_status(three)) == 3)
    assert set(agent_status(three).values()) == {"ALIVE"}
    names = [f"spread-{i}" for i in range(3)]
    for name in names:
        three.cli("session", "create", "python", "--name", name, "--cpu", "1", check=True)
    try:
        placed = {three.json("session", "info", n)["agent"] for n in names}
        assert placed == {a.agent_id for a in three.agents}  # dispersed: one on each agent
        for name in names:  # and the code runs there, through the link
            out = three.cli("session", "exec", name, "-c", "import os; print(os.environ['BACKENDAI_SESSION_NAME'])")
            assert out.stdout == f"{name}\n"
    finally:
        for name in names:
            three.cli("session", "destroy", name)


def test_a_killed_agent_is_lost_its_sessions_say_why_and_work_goes_elsewhere(three: Cluster) -> None:
    three.cli("session", "create", "python", "--name", "on-victim", "--cpu", "2", check=True)
    placed_on = three.json("session", "info", "on-victim")["agent"]
    victim = next(a for a in three.agents if a.agent_id == placed_on)  # the agent that runs it dies
    victim.kill()
    started = time.monotonic()
    assert wait_until(lambda: agent_status(three).get(victim.agent_id) == "LOST", timeout=10)
    assert time.monotonic() - started < 8  # 3 missed heartbeats of 0.5 s, plus a check (and a loaded CI box)
    # new work goes to the agents that are left
    three.cli("session", "create", "python", "--name", "after-loss", "--cpu", "1", check=True)
    assert three.json("session", "info", "after-loss")["agent"] != victim.agent_id
    three.cli("session", "destroy", "after-loss", check=True)
    # after the grace period, the session on the lost agent says what happened
    lost = wait_until(lambda: (i := three.json("session", "info", "on-victim"))["status"] == "ERROR" and i, timeout=15)
    assert lost and lost["statusInfo"] == "agent-lost"
    # the agent comes back: it re-registers, reconciles, and the session ends with a reason
    index = three.agents.index(victim)
    three.agents[index] = victim.start()
    assert wait_until(lambda: agent_status(three).get(victim.agent_id) == "ALIVE", timeout=15)
    ended = wait_until(lambda: (i := three.json("session", "info", "on-victim"))["status"] == "TERMINATED" and i)
    assert ended and ended["statusInfo"] == "agent-termination"


def test_an_agent_with_a_wrong_token_cannot_join(three: Cluster) -> None:
    intruder = three.add_agent(99, token="not-the-token")
    with pytest.raises(AssertionError, match="refused"):
        intruder.start(timeout=30)
    assert "intruder" not in agent_status(three)
    assert intruder.agent_id not in agent_status(three)


def test_a_plain_socket_hears_nothing(three: Cluster) -> None:
    info = three.join_info()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(info["endpoint"].replace("tcp://", "tcp://", 1))
    try:
        sock.send_multipart([b"register", b"{}"])
        assert sock.poll(1000) == 0  # no CURVE handshake: nothing comes back
    finally:
        sock.close()
        ctx.term()


def test_the_manager_restarts_and_sessions_carry_on(tmp_path, python_image: str) -> None:
    with docker_cluster(tmp_path) as cluster:
        cluster.cli("session", "create", "python", "--name", "keeps-going", check=True)
        cluster.cli("session", "exec", "keeps-going", "-c", "counter = 41", check=True)
        cluster.manager.kill()  # kill -9 while the session runs
        cluster.manager.start()
        # the agent reconnects by itself; the session and its state are all there
        out = wait_until(
            lambda: (
                (r := cluster.cli("session", "exec", "keeps-going", "-c", "counter += 1; print(counter)")).returncode
                == 0
                and r
            ),
            timeout=20,
        )
        assert out and out.stdout == "42\n"
        assert cluster.json("session", "info", "keeps-going")["status"] == "RUNNING"
        cluster.cli("session", "destroy", "keeps-going", check=True)
        assert containers_after_destroy(cluster) == []


def test_a_restarted_docker_agent_readopts_its_containers(tmp_path, python_image: str) -> None:
    with docker_cluster(tmp_path) as cluster:
        cluster.cli("session", "create", "python", "--name", "adopted", check=True)
        cluster.cli("session", "exec", "adopted", "-c", "kept = 'state'", check=True)
        agent = cluster.agents[0]
        assert agent.stop() == 0  # the agent stops; its container keeps running
        assert agent.leftover_containers()
        cluster.agents[0] = agent.start()
        out = wait_until(
            lambda: (r := cluster.cli("session", "exec", "adopted", "-c", "print(kept)")).returncode == 0 and r,
            timeout=20,
        )
        assert out and out.stdout == "state\n"
        assert cluster.json("session", "info", "adopted")["status"] == "RUNNING"
        cluster.cli("session", "destroy", "adopted", check=True)
        assert containers_after_destroy(cluster) == []


def test_agent_flags_are_checked(three: Cluster, tmp_path) -> None:
    info = three.join_info()
    base = [sys.executable, "-m", "bai", "node", "--role", "agent", "--backend", "local", "--state-dir", str(tmp_path)]
    cases = [
        ([], "needs --manager"),
        (["--manager", info["endpoint"], "--manager-key", "x", "--join-token", "t"], "not a CURVE public key"),
        (["--manager", "nowhere", "--manager-key", info["manager_key"], "--join-token", "t"], "HOST:PORT"),
    ]
    for extra, message in cases:
        out = subprocess.run(base + extra, env=three.env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 1, extra
        assert message in out.stderr, (extra, out.stderr)
        assert "Traceback" not in out.stderr
