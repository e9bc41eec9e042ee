"""The scheduler on a running node with small slots, through the real CLI and HTTP API: order, reasons,
policies, hooks, keypairs. Dependencies, reserved start times, time limits and the rest of the scheduling
logic are tested in-process (tests/test_lifecycle.py, tests/test_scheduling_inproc.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.nodeproc import Node

HOOK = """
import time

def before_enqueue(session):
    if session["name"].startswith("reject"):
        return "no sessions named reject-* on this cluster"
    if session["name"].startswith("slowhook"):
        time.sleep(5)

def after_start(session):
    if session["name"].startswith("slowhook"):
        time.sleep(5)
"""


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Node:
    """A local node whose agent offers 2 cpu, with a one-minute tick so only events drive scheduling."""
    base = tmp_path_factory.mktemp("small")
    (base / "hookmod").mkdir()
    (base / "hookmod" / "bai_test_hook.py").write_text(HOOK)
    node = Node(
        base,
        "local",
        extra_config='[manager]\ntick = 60.0\nhooks = ["bai_test_hook"]\nhook_timeout = 0.5\n',
        agent_config='cpu = "2"\nmem = "8g"\n',
    )
    node.env["PYTHONPATH"] = str(base / "hookmod")
    node.start()
    yield node
    node.stop()


def wait_for(node: Node, ref: str, check, timeout: float = 20, as_keypair=None) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        info = node.json("session", "info", ref, as_keypair=as_keypair)
        if check(info) or time.monotonic() > deadline:
            return info
        time.sleep(0.1)


def test_a_full_agent_queues_in_order_and_the_next_starts_when_one_ends(small: Node) -> None:
    names = ["q-one", "q-two", "q-three", "q-four"]
    for name in names:
        small.cli("session", "create", "python", "--name", name, "--cpu", "1", "--no-wait", check=True)
    try:
        for name in names[:2]:
            assert wait_for(small, name, lambda i: i["status"] == "RUNNING")["status"] == "RUNNING"
        third = wait_for(small, "q-three", lambda i: i["statusInfo"] == "no-available-instances")
        fourth = small.json("session", "info", "q-four")
        assert third["status"] == fourth["status"] == "PENDING"
        assert (third["queuePosition"], fourth["queuePosition"]) == (1, 2)
        assert "cpu" in third["statusData"]["scheduler"]["msg"]
        listing = small.cli("session", "ls", check=True).stdout
        assert "no-available-instances" in listing
        # the tick is a minute: q-three starts because q-one ended, not because time passed
        ended = time.monotonic()
        small.cli("session", "destroy", "q-one", check=True)
        assert wait_for(small, "q-three", lambda i: i["status"] == "RUNNING", timeout=10)["status"] == "RUNNING"
        assert time.monotonic() - ended < 10
        assert small.json("session", "info", "q-four")["status"] == "PENDING"
        explained = small.cli("session", "explain", "q-three", check=True).stdout
        assert "no-available-instances" in explained and "placed on" in explained
    finally:
        for name in names[1:]:
            small.cli("session", "destroy", name)


def test_batch_session_runs_to_completion_and_keeps_its_exit_code(small: Node) -> None:
    result = small.cli(
        "session",
        "create",
        "python",
        "--name",
        "batch-fail",
        "--type",
        "batch",
        "--startup-command",
        "echo from batch; exit 3",
        "--wait",
    )
    assert result.returncode == 3, result.stderr
    info = small.json("session", "info", "batch-fail")
    assert info["status"] == "TERMINATED"
    assert info["statusInfo"] == "task-failed"
    assert info["result"] == "FAILURE"
    assert info["exitCode"] == 3
    assert "from batch" in small.cli("session", "logs", "batch-fail", check=True).stdout
    ok = small.cli(
        "session", "create", "python", "--name", "batch-ok", "--type", "batch", "--startup-command", "true", "--wait"
    )
    assert ok.returncode == 0
    assert small.json("session", "info", "batch-ok")["result"] == "SUCCESS"


def test_keypairs_policies_and_privacy(small: Node) -> None:
    small.cli("policy", "create", "one-at-a-time", "--max-sessions", "1", check=True)
    alice = small.json("keypair", "create", "--user", "alice", "--policy", "one-at-a-time")
    bob = small.json("keypair", "create", "--user", "bob")
    small.cli("session", "create", "python", "--name", "alice-1", "--cpu", "0.5", check=True, as_keypair=alice)
    try:
        small.cli(
            "session",
            "create",
            "python",
            "--name",
            "alice-2",
            "--cpu",
            "0.5",
            "--no-wait",
            check=True,
            as_keypair=alice,
        )
        second = wait_for(small, "alice-2", lambda i: i["statusInfo"] == "predicate-checks-failed", as_keypair=alice)
        assert second["status"] == "PENDING"
        msg = second["statusData"]["scheduler"]["msg"]
        assert f"keypair {alice['accessKey']} has 1/1 concurrent sessions" in msg
        text = small.cli("session", "info", "alice-2", check=True, as_keypair=alice).stdout
        assert "concurrency" in text and "1/1 concurrent sessions" in text
        # bob sees nothing of alice's sessions, and cannot administer
        assert small.json("session", "ls", as_keypair=bob) == []
        missing = small.cli("session", "info", "alice-1", as_keypair=bob)
        assert missing.returncode == 1 and "No such session" in missing.stderr
        denied = small.cli("keypair", "ls", as_keypair=bob)
        assert denied.returncode == 1 and "privilege" in denied.stderr.lower()
        # the admin sees everyone's sessions
        assert {"alice-1", "alice-2"} <= {s["name"] for s in small.json("session", "ls")}
        # lifting the limit lets the waiting session start
        small.cli("policy", "update", "one-at-a-time", "--max-sessions", "2", check=True)
        small.cli("session", "destroy", "alice-1", check=True, as_keypair=alice)
        assert wait_for(small, "alice-2", lambda i: i["status"] == "RUNNING", as_keypair=alice)["status"] == "RUNNING"
    finally:
        small.cli("session", "destroy", "alice-1", as_keypair=alice)
        small.cli("session", "destroy", "alice-2", as_keypair=alice)


def test_hooks_reject_and_slow_hooks_do_not_stall(small: Node) -> None:
    rejected = small.cli("session", "create", "python", "--name", "reject-me")
    assert rejected.returncode == 1
    assert "no sessions named reject-* on this cluster" in rejected.stderr
    assert "reject-me" not in small.cli("session", "ls", "--all", check=True).stdout
    started = time.monotonic()
    small.cli("session", "create", "python", "--name", "slowhook-1", "--cpu", "0.5", check=True)
    assert time.monotonic() - started < 4  # the 5 s hook was cut off at its 0.5 s limit
    try:
        info = wait_for(small, "slowhook-1", lambda i: len(i["statusData"].get("hooks", [])) >= 2, timeout=5)
        notes = " ".join(info["statusData"]["hooks"])
        assert "before_enqueue timed out" in notes and "after_start timed out" in notes
        assert small.cli("session", "exec", "slowhook-1", "-c", "print('fine')", check=True).stdout == "fine\n"
    finally:
        small.cli("session", "destroy", "slowhook-1", check=True)


def test_bad_policy_and_keypair_input(small: Node) -> None:
    for args in (
        ["policy", "create", "bad", "--slots", "cpu=-1"],
        ["policy", "create", "bad", "--idle-timeout", "soon"],
        ["policy", "create", "bad", "--unspecified", "maybe"],
        ["session", "create", "python", "--type", "batch"],
        ["session", "create", "python", "--starts-at", "1h"],
    ):
        result = small.cli(*args)
        assert result.returncode == 2, args
    assert small.cli("keypair", "create", "--policy", "no-such-policy").returncode == 1
    assert "bad" not in small.cli("policy", "ls", check=True).stdout


def test_scaling_group_config_is_validated(tmp_path: Path) -> None:
    node = Node(tmp_path, "local", extra_config='[scaling_groups.default]\npolicy = "random"\n')
    with pytest.raises(AssertionError, match="policy must be fifo, lifo, drf or multifactor"):
        node.start(timeout=20)


def test_preparing_too_long_is_an_error_and_leaves_nothing(tmp_path: Path) -> None:
    slow = tmp_path / "slowstart"
    slow.mkdir(parents=True)
    (slow / "sitecustomize.py").write_text("import time\ntime.sleep(8)\n")  # the kernel's Python starts slowly
    node = Node(tmp_path / "node", "local", extra_config="[manager]\npreparing_timeout = 1.0\n").start()
    try:
        result = node.cli("session", "create", "python", "--name", "sluggish", "--env", f"PYTHONPATH={slow}")
        assert result.returncode == 125
        info = wait_for(node, "sluggish", lambda i: i["status"] == "TERMINATED", timeout=10)
        assert [t["status"] for t in info["transitions"]][-2:] == ["ERROR", "TERMINATED"]
        assert info["statusInfo"] == "failed-to-start"
        assert "did not start within 1 s" in info["statusData"]["error"]["repr"]
        # nothing of the kernel is left behind, and its slots are free again
        assert not (node.state_dir / "kernels" / info["kernels"][0]["id"]).exists()
        assert node.cli("session", "run", "python", "-c", "print('ok')", check=True).stdout == "ok\n"
    finally:
        node.stop()
