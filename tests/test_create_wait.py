"""`bai session create` waits with a bound and says what it leaves behind; `run` says what its clean-up did;
a reused session (get-or-create by name) says how it differs from what was asked.

On a real `bai node` (sim backend: one agent of 2 cpus) and the real CLI. A session that holds 1.5 cpus keeps
the next 1.9-cpu one PENDING (no agent has room now; the agent could hold it, so it is not refused)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from bai.cli.reuse import differences
from tests.nodeproc import Node

WAITER_CPU = "1.9"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    n = Node(tmp_path_factory.mktemp("create-wait"), "sim", agent_config='cpu = "2"\nmem = "8g"\n').start()
    n.cli("session", "create", "python", "--name", "holder", "--cpu", "1.5", check=True)
    yield n
    n.stop()


def info(node: Node, name: str) -> dict[str, Any]:
    return json.loads(node.cli("session", "info", name, "--json", check=True).stdout)


def wait_status(node: Node, name: str, statuses: set[str], timeout: float = 20) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    seen: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        result = node.cli("session", "info", name, "--json")
        if result.returncode == 0:
            seen = json.loads(result.stdout)
            if seen["status"] in statuses:
                return seen
        time.sleep(0.1)
    raise AssertionError(f"session {name} is not {statuses} after {timeout} s: {seen and seen['status']}")


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"the command did not end after the signal:\n{err}") from None
    return proc.returncode, err


def destroy(node: Node, name: str) -> None:
    node.cli("session", "destroy", name)


# -- create: a bounded wait, and what it leaves behind --------------------------------------------------------


def test_timeout_gives_up_saying_the_session_is_still_queued_and_how_to_end_it(node: Node) -> None:
    name = "waits-bounded"
    try:
        started = time.monotonic()
        result = node.cli("session", "create", "python", "--name", name, "--cpu", WAITER_CPU, "--timeout", "1.5")
        took = time.monotonic() - started
        assert result.returncode == 124, result.stderr
        assert took < 10, took
        err = result.stderr
        assert "stopped waiting after 1.5 s (--timeout)" in err, err
        assert f"session {name} (" in err and re.search(r"is still queued \(PENDING, number \d+ in the queue: ", err), (
            err
        )
        assert "no agent has room" in err, err  # the reason it waits
        assert f"end it with `bai session destroy {name}`" in err, err
        assert "Traceback" not in err
        assert result.stdout == ""
        assert info(node, name)["status"] == "PENDING"  # left as it is: create does not own its end
    finally:
        destroy(node, name)


def test_a_timeout_that_is_not_reached_changes_nothing(node: Node) -> None:
    name = "fits-in-time"
    try:
        result = node.cli("session", "create", "python", "--name", name, "--cpu", "0.2", "--timeout", "30")
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"session {name} (") and result.stdout.endswith("is RUNNING\n")
    finally:
        destroy(node, name)


@pytest.mark.parametrize("flag", ["--detach", "--no-wait"])
def test_detach_returns_at_once_with_the_queued_session(node: Node, flag: str) -> None:
    name = f"detached{flag.replace('-', '_')}"
    try:
        started = time.monotonic()
        result = node.cli("session", "create", "python", "--name", name, "--cpu", WAITER_CPU, flag)
        assert time.monotonic() - started < 10
        assert result.returncode == 0, result.stderr
        (line,) = result.stdout.splitlines()
        assert line.startswith(f"session {name} (") and line.endswith(") is PENDING"), line
        assert info(node, name)["id"] in line
    finally:
        destroy(node, name)


def test_bad_wait_options_are_refused(node: Node) -> None:
    for args in (["--timeout", "0"], ["--timeout", "-3"], ["--detach", "--timeout", "5"]):
        result = node.cli("session", "create", "python", "--name", "never-made", *args)
        assert result.returncode == 2, (args, result.stderr)
        assert "--timeout" in result.stderr or "--detach" in result.stderr, result.stderr
    assert node.cli("session", "info", "never-made").returncode != 0


@pytest.mark.parametrize(
    ("sig", "code", "word"), [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")]
)
def test_a_signal_while_create_waits_leaves_the_session_queued_and_says_so(
    node: Node, sig: int, code: int, word: str
) -> None:
    name = f"create-sig-{sig}"
    proc = node.popen("session", "create", "python", "--name", name, "--cpu", WAITER_CPU)
    try:
        wait_status(node, name, {"PENDING"})
        time.sleep(0.5)  # create waits for it now
        proc.send_signal(sig)
        rc, err = finish(proc)
        assert rc == code, err
        assert f"bai: {word} while waiting: session {name} (" in err, err
        assert "is still queued (PENDING" in err and f"end it with `bai session destroy {name}`" in err, err
        assert "Traceback" not in err
        assert info(node, name)["status"] == "PENDING"
    finally:
        if proc.poll() is None:
            proc.kill()
        destroy(node, name)


# -- run: the session it owns, and what really became of it ----------------------------------------------------


@pytest.mark.parametrize("twice", [False, True])
def test_sigterm_while_run_waits_cancels_its_session_and_says_what_became_of_it(node: Node, twice: bool) -> None:
    """`timeout` signals its command and then its process group: the same signal twice at once is one."""
    name = f"run-term-{int(twice)}"
    proc = node.popen("session", "run", "python", "--name", name, "--cpu", WAITER_CPU, "-c", "1")
    try:
        wait_status(node, name, {"PENDING"})
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        if twice:
            proc.send_signal(signal.SIGTERM)
        rc, err = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 143, err
    assert f"bai: session {name} (" in err and "cancelled (terminated before it started)" in err, err
    assert "may still exist" not in err and "clean-up stopped" not in err, err
    assert info(node, name)["status"] == "CANCELLED"


# -- get-or-create: a reused session says how it differs -------------------------------------------------------


def test_a_reused_session_says_it_was_reused_and_how_it_differs(node: Node) -> None:
    name = "dev1"
    node.cli("session", "create", "python", "--name", name, "--cpu", "0.2", "--env", "A=1", check=True)
    try:
        again = node.cli("session", "create", "python", "--name", name, "--cpu", "0.3", "--mem", "1g", "-e", "A=2")
        assert again.returncode == 0, again.stderr
        assert again.stdout.startswith(f"session {name} (") and again.stdout.endswith("is RUNNING\n")
        err = again.stderr
        assert f"bai: session {name} (" in err and "already existed (RUNNING) and was reused, not created" in err, err
        assert "cpu 0.2 (asked 0.3)" in err and "mem 512MiB (asked 1GiB)" in err and "A=1 (asked A=2)" in err, err
        assert f"`bai session destroy {name}`" in err
        same = node.cli("session", "create", "python", "--name", name, "--cpu", "0.2")
        assert same.returncode == 0 and "was reused, not created: it has what was asked" in same.stderr, same.stderr
        detached = node.cli("session", "create", "python", "--name", name, "--cpu", "1", "--detach")
        assert "cpu 0.2 (asked 1)" in detached.stderr, detached.stderr
        assert info(node, name)["requestedSlots"]["cpu"] == "0.2"  # still the old session
    finally:
        destroy(node, name)


def test_differences_compare_every_field_the_session_shows() -> None:
    shown = {
        "type": "INTERACTIVE",
        "requestedSlots": {"cpu": "1", "mem": str(2 * 2**30)},  # two kernels together
        "clusterSize": 2,
        "clusterMode": "single-node",
        "environ": {"A": "1"},
        "network": None,
        "scalingGroup": "default",
        "mounts": [{"name": "data", "target": "/home/work/data", "readOnly": False}],
    }
    same = {
        "type": "interactive",
        "resources": {"cpu": "0.5", "mem": "1g"},
        "cluster_size": 2,
        "cluster_mode": "single-node",
        "environ": {"A": "1"},
        "mounts": {"mounts": ["data"], "mount_map": {}, "mount_options": {}},
    }
    assert differences(same, shown) == []
    other = {
        "type": "batch",
        "resources": {"cpu": "2", "cuda.device": "1"},
        "cluster_size": 3,
        "cluster_mode": "multi-node",
        "environ": {"A": "2", "B": "x"},
        "network": "bridge",
        "scaling_group": "gpu",
        "mounts": {"mounts": ["data", "more"], "mount_map": {}, "mount_options": {"data": {"permission": "ro"}}},
    }
    assert differences(other, shown) == [
        "type interactive (asked batch)",
        "cpu 0.5 (asked 2)",
        "cuda.device none (asked 1)",
        "2 kernel(s) (asked --cluster-size 3)",
        "cluster mode single-node (asked multi-node)",
        "A=1 (asked A=2)",
        "no B in its environment (asked B=x)",
        "network the agents default (asked bridge)",
        "scaling group default (asked gpu)",
        "folder data writable (asked read-only)",
        "folder more not mounted (asked --mount more)",
    ]


# -- in-process: signals, and what is said once the clean-up was stopped --------------------------------------


class FakeClient:
    """Answers get_session with `status` (None: the manager cannot be reached)."""

    def __init__(self, status: str | None) -> None:
        self.status = status

    async def get_session(self, ref: str) -> dict[str, Any]:
        from bai.client.api import APIError

        if self.status is None:
            raise APIError(0, "cannot reach the manager at http://127.0.0.1:1")
        return {"id": ref, "status": self.status, "statusInfo": "", "statusData": {}, "queuePosition": 3}


def owned_session(name: str = "job1") -> Any:
    from bai.cli.session import Owned

    owned = Owned(name)
    owned.note({"sessionId": "sid-1", "status": "PENDING", "created": True})
    return owned


@pytest.mark.parametrize(
    ("status", "said"),
    [
        ("CANCELLED", "bai: session job1 (sid-1): clean-up stopped; it is CANCELLED\n"),
        ("TERMINATING", "bai: session job1 (sid-1): clean-up stopped; it is TERMINATING\n"),
        (
            "PENDING",
            "bai: session job1 (sid-1): clean-up stopped; it is still queued (PENDING, number 3 in the queue): "
            "end it with `bai session destroy job1`\n",
        ),
        (
            None,
            "bai: session job1 (sid-1): clean-up stopped, it may still exist: see `bai session info job1`; "
            "end it with `bai session destroy job1`\n",
        ),
    ],
)
async def test_a_stopped_clean_up_says_what_the_session_is_and_may_still_exist_only_when_unknown(
    capsys: pytest.CaptureFixture[str], status: str | None, said: str
) -> None:
    from bai.cli.session import _say_stopped_clean_up

    await _say_stopped_clean_up(FakeClient(status), owned_session())
    assert capsys.readouterr().err == said


@pytest.mark.parametrize(
    ("status", "said"),
    [
        ("CANCELLED", "cancelled"),
        ("TERMINATED", "destroyed"),
        ("ERROR", "ended (ERROR)"),
        ("PENDING", "is still PENDING after the destroy: end it with `bai session destroy job1`"),
        (None, "was told to end, but its status could not be read (see `bai session info job1`)"),
    ],
)
def test_what_run_says_after_its_destroy_follows_the_status_read_then(status: str | None, said: str) -> None:
    from bai.cli.session import _after_destroy

    assert _after_destroy(None if status is None else {"status": status}, "job1") == said


async def test_the_same_signal_twice_at_once_is_one_and_a_later_one_counts() -> None:
    import asyncio

    from bai.cli.session import SAME_SIGNAL, Signals

    cancels = 0

    async def waiter() -> None:
        nonlocal cancels
        with Signals() as signals:
            for _ in range(3):
                try:
                    await asyncio.sleep(10)
                except asyncio.CancelledError:
                    cancels += 1
            assert signals.received == signal.SIGTERM and signals.exit_code == 143

    task = asyncio.ensure_future(waiter())
    await asyncio.sleep(0.05)
    signals_of = task.get_coro().cr_frame.f_locals["signals"]  # type: ignore[union-attr]
    signals_of._handle(signal.SIGTERM)
    signals_of._handle(signal.SIGTERM)  # delivered twice (`timeout`: its command, then its process group)
    await asyncio.sleep(0.05)
    assert cancels == 1
    await asyncio.sleep(SAME_SIGNAL)
    signals_of._handle(signal.SIGTERM)  # the user's second signal
    await asyncio.sleep(0.05)
    assert cancels == 2
    signals_of._handle(signal.SIGINT)  # another signal is never the same one
    await task
    assert cancels == 3


@pytest.mark.parametrize(
    ("status", "how"),
    [("PENDING", "bai session destroy job1"), ("PULLING", "bai session destroy --force job1")],
)
async def test_a_stopped_wait_names_the_command_that_ends_the_session_in_its_status(
    capsys: pytest.CaptureFixture[str], status: str, how: str
) -> None:
    from bai.cli.session import say_left_waiting

    await say_left_waiting(FakeClient(status), owned_session(), "interrupted while waiting")
    err = capsys.readouterr().err
    assert err.startswith("bai: interrupted while waiting: session job1 (sid-1) is still "), err
    assert err.endswith(f": end it with `{how}`\n"), err
