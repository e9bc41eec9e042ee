"""Two managers on one PostgreSQL database, with an agent that dials both (real processes, ZeroMQ, a real
PostgreSQL server): both serve the API for every session, one leads (runs the scheduling rounds), and when
the leader is killed (-9) while sessions are being created, the other takes the lead within 10 s; every
session a client was told exists is there exactly once, none runs twice, the running ones answer exec through
the surviving manager, and new sessions are scheduled by it.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from tests import pgserver
from tests.nodeproc import LINK_CONFIG, Node, free_port

pytestmark = pytest.mark.timeout(240)


def _manager(base: Path, url: str) -> tuple[Node, int]:
    link = free_port()
    node = Node(
        base, "local", extra_config=LINK_CONFIG, role="manager",
        args=("--link-listen", f"127.0.0.1:{link}", "--database", url),
    )  # fmt: skip
    return node, link


def _status(node: Node) -> dict:
    return node.json("manager", "ls")


def _wait(what, timeout: float, step: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        time.sleep(step)
    return what()


def _sessions(node: Node) -> list[dict]:
    return node.json("session", "ls", "-a")


@pytest.fixture
def two_managers(tmp_path: Path):
    url = pgserver.shared().new_database("failover")
    first, first_link = _manager(tmp_path / "m1", url)
    first.start()
    second, second_link = _manager(tmp_path / "m2", url)
    # managers of one database share the link's key and join token (README: copy STATE/link/)
    shutil.copytree(first.state_dir / "link", second.state_dir / "link")
    second.start()
    info = first.json("cluster", "join-info")
    agent = Node(
        tmp_path / "agent", "local", extra_config=LINK_CONFIG, role="agent", agent_config='cpu = "64"\nmem = "64g"\n',
        args=("--manager", f"tcp://127.0.0.1:{first_link}", "--manager", f"tcp://127.0.0.1:{second_link}",
              "--manager-key", info["manager_key"], "--join-token", info["join_token"]),
    )  # fmt: skip
    agent.start()
    yield first, second, agent
    for node in (agent, second, first):
        node.stop()


def test_the_follower_takes_the_lead_and_nothing_is_lost_or_run_twice(two_managers) -> None:
    first, second, agent = two_managers
    status = _status(second)
    assert len(status["managers"]) == 2 and status["leader"] != status["self"]  # the first one leads
    assert "postgresql://" in status["database"] and "password" not in json.dumps(status)
    # the agent is reachable from both managers
    assert _wait(lambda: all(n.json("agent", "ls") for n in (first, second)), 20)

    # sessions created through the follower are scheduled by the leader and run; exec works through both
    for i in range(6):
        second.cli("session", "create", "python", "--name", f"before-{i}", check=True, timeout=60)
    assert (
        first.cli("session", "exec", "before-0", "--", "python", "-c", "print(40+2)", check=True).stdout.strip() == "42"
    )
    assert (
        second.cli("session", "exec", "before-1", "--", "python", "-c", "print(6*7)", check=True).stdout.strip() == "42"
    )

    # creates under way through the follower while the leader is killed
    accepted: list[str] = []
    stop = threading.Event()

    def create() -> None:
        i = 0
        while not stop.is_set():
            name = f"during-{i}"
            result = second.cli("session", "create", "python", "--name", name, "--detach", timeout=60)
            if result.returncode == 0:
                accepted.append(name)
            i += 1

    creator = threading.Thread(target=create)
    creator.start()
    time.sleep(1.5)
    first.kill()
    killed = time.monotonic()
    took = _wait(lambda: _status(second)["leader"] == _status(second)["self"] and time.monotonic() - killed, 15)
    assert took and took <= 10, f"the follower took the lead after {took} s"
    time.sleep(2)
    stop.set()
    creator.join(90)
    assert accepted, "no create was accepted"

    # every accepted session is there exactly once; sessions stop waiting (the new leader schedules them)
    def settled() -> list[dict] | None:
        rows = _sessions(second)
        waiting = [r for r in rows if r["status"] in ("PENDING", "SCHEDULED")]
        return None if waiting else rows

    rows = _wait(settled, 60, 0.5)
    assert rows, (
        f"sessions still wait: {[r['name'] for r in _sessions(second) if r['status'] in ('PENDING', 'SCHEDULED')]}"
    )
    names = Counter(r["name"] for r in rows)
    assert all(n == 1 for n in names.values()), names
    missing = [n for n in [*(f"before-{i}" for i in range(6)), *accepted] if n not in names]
    assert not missing, missing

    # the kernels that ran before the kill keep running and answer through the survivor; none started twice
    for i in range(6):
        out = second.cli("session", "exec", f"before-{i}", "--", "python", "-c", "print('alive')", check=True)
        assert out.stdout.strip() == "alive"
    for row in second.json("session", "ls"):
        info = second.json("session", "info", row["name"])
        live = [k for k in info["kernels"] if k["status"] not in ("TERMINATED", "CANCELLED", "ERROR")]
        assert len(live) <= 1, info["kernels"]

    # a new session is scheduled by the new leader; the old one comes back as a follower
    second.cli("session", "create", "python", "--name", "after-kill", check=True, timeout=60)
    assert (
        second.cli("session", "exec", "after-kill", "--", "python", "-c", "print(1)", check=True).stdout.strip() == "1"
    )
    first.start()
    status = _wait(lambda: (s := _status(first)) and sum(m["alive"] for m in s["managers"]) == 2 and s, 20)
    assert status and status["leader"] != status["self"]
