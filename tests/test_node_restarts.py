"""Restarting a node in the middle of work loses no run (real `bai node` processes on Docker kernels): each node
kind is stopped (SIGTERM) and started again while a batch session's command, an exec, a terminal and an app
tunnel are going, and each outcome is checked:

- a combined node (`--role all`);
- a manager process alone, its agent process staying up (it registers again);
- an agent process alone, its manager staying up (an exec's stream stays open across it).

A batch session ends with its command's real exit code and its output made while the node was down; an exec's
client re-attaches to its run (or, across an agent restart, never lost it) and exits with the run's code; an exec
started just after the restart waits behind that run and prints its own output only; a terminal open across the
restart ends with a clear message (no hang) and a new one works; an app is reached again through a new forward."""

from __future__ import annotations

import re
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from tests.nodeproc import Cluster, Node, stop_removing_containers, wait_status
from tests.test_apps_docker import http_get, open_app
from tests.test_terminal import Pty

SMALL = ("--cpu", "0.25", "--mem", "256m")
COUNTER = "import time\nfor i in range(12):\n    print(i, flush=True)\n    time.sleep(1)\nraise SystemExit(4)"


@dataclass
class Target:
    """Where the CLI talks (a combined node or a cluster's manager) and how the part under test restarts."""

    where: str
    api: Node | Cluster
    stop: Callable[[], None]
    start: Callable[[], None]


@pytest.fixture(scope="module")
def combined(python_image: str, tmp_path_factory) -> Iterator[Node]:
    node = Node(tmp_path_factory.mktemp("restart-combined"), "docker").start()
    yield node
    stop_removing_containers(node)


@pytest.fixture(scope="module")
def split(python_image: str, tmp_path_factory) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("restart-split"), "docker").start()
    yield cluster
    stop_removing_containers(cluster)


def _target(where: str, request: pytest.FixtureRequest) -> Target:
    if where == "combined":
        node: Node = request.getfixturevalue("combined")
        return Target(where, node, lambda: _sigterm(node), lambda: _start(node))
    cluster: Cluster = request.getfixturevalue("split")
    part = cluster.manager if where == "manager" else cluster.agents[0]
    return Target(where, cluster, lambda: _sigterm(part), lambda: _start(part))


def _sigterm(node: Node) -> None:
    code = node.stop()
    assert code in (0, -15), f"the node's exit code after SIGTERM: {code}\n{node.log_path.read_text()[-3000:]}"


def _start(node: Node) -> None:
    port = node.port
    node.start()
    assert node.port == port, "the node came back on another port"  # (a client's endpoint would be stale)


@pytest.fixture
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    """The node kind `request.param` names (see `kinds`); whatever the test left stopped is started again."""
    t = _target(request.param, request)
    yield t
    for part in [t.api] if isinstance(t.api, Node) else [t.api.manager, *t.api.agents]:
        if part.proc is None:  # a failed restart: back for the next test
            part.start()


def kinds(**known_bugs: str) -> pytest.MarkDecorator:
    """Each node kind restarting; the kinds in `known_bugs` fail for the reason given (xfail, strict)."""
    return pytest.mark.parametrize(
        "target",
        [
            pytest.param(k, marks=pytest.mark.xfail(strict=True, raises=AssertionError, reason=known_bugs[k]))
            if k in known_bugs
            else k
            for k in ("combined", "manager", "agent")
        ],
        indirect=True,
    )


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def _wait_for(what: str, fn: Callable[[], object], timeout: float = 20.0, interval: float = 0.1) -> object:
    deadline = time.monotonic() + timeout
    while not (value := fn()):
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        time.sleep(interval)
    return value


def _logs(api: Node | Cluster, name: str) -> str:
    return api.cli("session", "logs", name).stdout


class Lines:
    """A process's stdout and stderr, read as they come (a thread each), so that the test can wait on them."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.out: list[str] = []
        self.err: list[str] = []
        self._threads = [
            threading.Thread(target=self._pump, args=(proc.stdout, self.out), daemon=True),
            threading.Thread(target=self._pump, args=(proc.stderr, self.err), daemon=True),
        ]
        for t in self._threads:
            t.start()

    @staticmethod
    def _pump(stream, into: list[str]) -> None:
        for line in stream:
            into.append(line)

    def wait(self, timeout: float = 60) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"the client did not end:\n{self.stdout}\n{self.stderr}") from None
        for t in self._threads:
            t.join(5)
        return code

    @property
    def stdout(self) -> str:
        return "".join(self.out)

    @property
    def stderr(self) -> str:
        return "".join(self.err)


# (seconds from 'before') one command ends while the node is down, silently; the other prints while it is down
# and ends a moment later, after the node is back or about then
BATCH = {
    0: ("echo before; sleep 3; exit 0", "SUCCESS", "task-done", ["before"]),
    3: ("echo before; sleep 3; echo after; sleep 1; exit 3", "FAILURE", "task-failed", ["before", "after"]),
}


@kinds()
def test_a_batch_session_ends_with_its_commands_exit_code_after_a_restart(target: Target) -> None:
    api = target.api
    names = {code: _name(f"batch{code}-{target.where}") for code in BATCH}
    for code, name in names.items():
        api.cli(
            "session", "create", "python", *SMALL, "--name", name, "--type", "batch",
            "--startup-command", BATCH[code][0], check=True,
        )  # fmt: skip
    try:
        _wait_for("both commands printed 'before'", lambda: all("before" in _logs(api, n) for n in names.values()))
        began = time.monotonic()
        target.stop()
        time.sleep(max(0.0, began + 3.5 - time.monotonic()))  # the node is down at 3 s from 'before'
        target.start()
        back = time.monotonic()
        ended = {code: wait_status(api, name, "TERMINATED", timeout=20) for code, name in names.items()}
        assert time.monotonic() - back < 15, "the sessions took long to end after the restart"
        for code, (_, result, info, lines) in BATCH.items():
            row = ended[code]
            said = (row["result"], row["statusInfo"], row["statusData"])
            assert said == (result, info, {"exitCode": code}), said  # (no msg: "the batch command's run was lost")
            log = _logs(api, names[code])
            assert log.splitlines() == lines, log
    finally:
        for name in names.values():
            api.cli("session", "destroy", name)


@kinds()
def test_an_exec_goes_on_across_a_restart_and_the_next_waits_behind_it(target: Target) -> None:
    api = target.api
    name = _name(f"exec-{target.where}")
    api.cli("session", "create", "python", *SMALL, "--name", name, check=True)
    try:
        first = Lines(api.popen("session", "exec", name, "-c", COUNTER))
        _wait_for("the first run printed 2", lambda: "2\n" in first.out)
        target.stop()
        target.start()
        second = Lines(api.popen("session", "exec", name, "-c", "print('second run')"))
        assert first.wait(60) == 4, first.stderr
        assert second.wait(60) == 0, second.stderr
        assert first.stdout == "".join(f"{i}\n" for i in range(12)), first.stdout  # each line once, in order
        run = re.search(r"re-attached to run (\S+)", first.stderr)
        if target.where == "agent":  # the manager kept the client's stream open while its agent was away
            assert "re-attach" not in first.stderr, first.stderr
        else:
            assert "re-attaching to it" in first.stderr and run, first.stderr
        assert "[waiting behind run " in second.stderr, second.stderr
        if run:
            assert f"[waiting behind run {run.group(1)}" in second.stderr, second.stderr
        assert second.stdout == "second run\n", second.stdout  # never the first run's lines
        assert api.json("session", "info", name)["status"] == "RUNNING"
    finally:
        api.cli("session", "destroy", name)


@kinds()
def test_a_terminal_open_across_a_restart_ends_saying_so_and_a_new_one_works(target: Target) -> None:
    t = target
    api = t.api
    name = _name(f"term-{t.where}")
    api.cli("session", "create", "python", *SMALL, "--name", name, check=True)
    try:
        term = Pty(api, "session", "shell", name)
        term.prompt()
        term.type("echo first=$((1 + 1))\r")
        term.read_until("first=2")
        t.stop()
        code = term.wait(20)
        shown = term.seen.decode(errors="replace")
        assert code != 0 and "bai: the terminal" in shown, (code, shown)
        t.start()
        assert api.json("session", "info", name)["status"] == "RUNNING"
        # a terminal opened before the agent has registered with a restarted manager is refused (503, which the
        # CLI shows as "bai: error: Invalid response status"; reported): an exec waits for the agent, so once
        # one has run the node is back for a terminal too
        api.cli("session", "exec", name, "-c", "pass", check=True)
        again = Pty(api, "session", "shell", name)
        again.prompt()
        again.type("echo second=$((2 + 2)); exit 6\r")
        again.read_until("second=4")
        assert again.wait() == 6
        assert api.json("session", "info", name)["status"] == "RUNNING"
    finally:
        api.cli("session", "destroy", name)


@kinds()
def test_an_app_is_reached_again_after_a_restart(target: Target) -> None:
    t = target
    api = t.api
    name = _name(f"app-{t.where}")
    api.cli("session", "create", "python", *SMALL, "--name", name, check=True)
    try:
        api.cli("session", "exec", name, "-c", "open('hello.txt', 'w').write('still here')", check=True)
        proc, port, url = open_app(api, name, "web")
        token = url.rsplit("token=", 1)[1]
        try:
            assert http_get(port, f"/hello.txt?token={token}") == (200, b"still here")
            t.stop()
            t.start()
            # the forward outlived the restart: a new connection through it reaches the app again
            assert http_get(port, f"/hello.txt?token={token}", timeout=20) == (200, b"still here")
            assert proc.poll() is None
        finally:
            proc.terminate()
            proc.wait(20)
        proc, port, url = open_app(api, name, "web")  # and a new forward does
        try:
            token = url.rsplit("token=", 1)[1]
            assert http_get(port, f"/hello.txt?token={token}") == (200, b"still here")
        finally:
            proc.terminate()
            proc.wait(20)
    finally:
        api.cli("session", "destroy", name)
