"""Correct under misuse: a kernel killed for memory says so; kernels caught starting by a node killed
with -9 come back with their Python."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from bai.common.present import reason
from tests.nodeproc import Node, stop_removing_containers

HOG = "chunks = []\nwhile True:\n    chunks.append(bytearray(16 * 1024 * 1024))"
STARTING = {"PENDING", "SCHEDULED", "PREPARING", "PULLING"}
OOM_MSG = "the kernel ran out of memory (limit 128 MiB) and was killed"


def test_a_kernel_killed_for_memory_says_so(docker_node: Node) -> None:
    run = docker_node.cli("session", "run", "python", "--mem", "128m", "--name", "memhog", "-c", HOG, timeout=120)
    assert run.returncode == 137, run.stderr
    assert OOM_MSG in run.stderr  # the run itself says why it ended
    info = docker_node.json("session", "info", "memhog")
    assert info["status"] == "TERMINATED"
    assert info["statusInfo"] == "out-of-memory"  # the API
    assert info["statusData"]["exitCode"] == 137
    assert info["statusData"]["msg"] == OOM_MSG
    assert OOM_MSG in reason(info)  # what the dashboard and the TUI show
    assert OOM_MSG in docker_node.cli("session", "info", "memhog", check=True).stdout  # the CLI


def test_a_command_killed_for_memory_ends_its_run_saying_so(docker_node: Node) -> None:
    """A batch command is a child of the runner: the OOM killer takes it and the kernel lives on."""
    docker_node.cli("session", "create", "python", "--mem", "128m", "--name", "childhog", check=True)
    try:
        run = docker_node.cli("session", "exec", "childhog", "--", "python3", "-c", HOG, timeout=120)
        assert run.returncode == 137, run.stderr
        assert "ran out of memory (limit 128 MiB)" in run.stderr
        assert docker_node.json("session", "info", "childhog")["status"] == "RUNNING"
        ok = docker_node.cli("session", "exec", "childhog", "--", "sh", "-c", "exit 137")
        assert ok.returncode == 137
        assert "out of memory" not in ok.stderr  # only a real OOM kill is called one
    finally:
        docker_node.cli("session", "destroy", "childhog")


def test_a_local_kernel_gets_a_memory_error(tmp_path) -> None:
    """Local kernels have an address-space limit (RLIMIT_AS), no cgroup: allocations fail with
    MemoryError in the code, and the kernel lives on."""
    node = Node(tmp_path, "local").start()
    try:
        node.cli("session", "create", "python", "--mem", "256m", "--name", "lhog", check=True)
        run = node.cli("session", "exec", "lhog", "-c", HOG, timeout=120)
        assert run.returncode == 1
        assert "MemoryError" in run.stderr
        assert node.cli("session", "exec", "lhog", "-c", "print(1)", check=True).stdout == "1\n"
    finally:
        node.stop()


def _container_pid(container: str) -> int:
    out = subprocess.run(
        ["docker", "inspect", "--format", "{{.State.Pid}}", container], capture_output=True, text=True, check=True
    )
    return int(out.stdout)


def test_a_runner_slow_to_come_back_is_waited_for(tmp_path, python_image: str) -> None:
    """The node dies; its kernel's runner does not reconnect for a while (as one still starting): adoption
    waits for it (up to the start timeout) instead of giving the kernel up."""
    node = Node(tmp_path, "docker").start()
    pid = 0
    try:
        node.cli("session", "create", "python", "--name", "slow", check=True)
        container = node.json("session", "info", "slow")["containerId"]
        node.kill()
        pid = _container_pid(container)
        os.kill(pid, signal.SIGSTOP)  # the runner cannot connect: the container still counts as running
        node.start()
        pending = node.popen("session", "exec", "slow", "-c", "print(1)")
        time.sleep(7)
        os.kill(pid, signal.SIGCONT)
        out, err = pending.communicate(timeout=60)
        assert pending.returncode == 0, err
        assert out == "1\n"
        assert node.json("session", "info", "slow")["status"] == "RUNNING"
    finally:
        if pid and _alive(pid):
            os.kill(pid, signal.SIGCONT)
        _destroy_all(node, ["slow"])
        stop_removing_containers(node)


def test_an_image_without_python_adopted_before_its_marker_keeps_commands(tmp_path, busybox_image: str) -> None:
    """Killed before the agent saw the no-Python line: adoption reads the log rather than dropping it."""
    node = Node(tmp_path, "docker").start()
    try:
        node.cli("session", "create", busybox_image, "--name", "bare", check=True)
        kid = node.json("session", "info", "bare")["kernels"][0]["id"]
        node.kill()
        (node.state_dir / "kernels" / kid / "exec-channel").unlink()
        node.start()
        run = node.cli("session", "exec", "bare", "--", "echo", "hi")
        assert run.returncode == 0, run.stderr
        assert run.stdout == "hi\n"
    finally:
        _destroy_all(node, ["bare"])
        stop_removing_containers(node)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _destroy_all(node: Node, names: list[str]) -> None:
    """Destroy the sessions (their scratch mounts go with them), whatever state they are in."""
    if node.proc is None:
        return
    for p in [node.popen("session", "destroy", n) for n in names]:
        p.communicate(timeout=60)


def _sessions(node: Node) -> dict[str, dict]:
    return {s["name"]: s for s in json.loads(node.cli("session", "ls", "--all", "--json", check=True).stdout)}


@pytest.mark.timeout(300)
def test_a_node_killed_during_ten_creates_gets_python_back_in_each(tmp_path, python_image: str) -> None:
    node = Node(tmp_path, "docker").start()
    names = [f"kill{i}" for i in range(10)]
    try:
        creates = [
            node.popen("session", "create", "python", "--cpu", "0.1", "--mem", "128m", "--name", n, "--no-wait")
            for n in names
        ]
        for p in creates:
            _, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
        # kill -9 as soon as kernels are being started: some created, one at least started (on a loaded machine
        # containers are created well before they run: a kill before any runs leaves nothing to survive)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and len(node.leftover_containers()) < 3:
            time.sleep(0.02)
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and not _running_containers(node):
            time.sleep(0.02)
        node.kill()
        caught = len(node.leftover_containers())
        node.start()
        deadline = time.monotonic() + 90
        while True:
            sessions = _sessions(node)
            if all(sessions[n]["status"] not in STARTING for n in names) or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        running = [n for n in names if sessions[n]["status"] == "RUNNING"]
        summary = {n: (sessions[n]["status"], reason(sessions[n])) for n in names}
        for n in names:
            assert sessions[n]["status"] not in STARTING, summary
            if n not in running:  # ended: with a reason a user can read
                assert reason(node.json("session", "info", n)), sessions[n]
        assert running, f"none of the sessions survived ({caught} containers were there at the kill)"
        for n in running:
            run = node.cli("session", "exec", n, "-c", "print(1)")
            assert (run.returncode, run.stdout) == (0, "1\n"), f"{n}: {run.stderr}"
    finally:
        _destroy_all(node, names)
        stop_removing_containers(node)


def _running_containers(node: Node) -> list[str]:
    """This node's containers that run now (not only created)."""
    out = subprocess.run(
        ["docker", "ps", "-q", "--filter", f"label=bai.agent-id={node.agent_id}", "--filter", "status=running"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()
