"""What only the Docker backend does: enforced limits, isolation, images without Python, re-adoption."""

from __future__ import annotations

import json
import subprocess
import time

from tests.nodeproc import Node, containers_after_destroy, stop_removing_containers

READ_LIMITS = r"""
import os
def first(*paths):
    for p in paths:
        if os.path.exists(p):
            return open(p).read().strip()
v2 = os.path.exists('/sys/fs/cgroup/cgroup.controllers')
if v2:
    quota, period = open('/sys/fs/cgroup/cpu.max').read().split()
    mem = open('/sys/fs/cgroup/memory.max').read().strip()
    pids = open('/sys/fs/cgroup/pids.max').read().strip()
else:
    quota = open('/sys/fs/cgroup/cpu/cpu.cfs_quota_us').read().strip()
    period = open('/sys/fs/cgroup/cpu/cpu.cfs_period_us').read().strip()
    mem = open('/sys/fs/cgroup/memory/memory.limit_in_bytes').read().strip()
    pids = open('/sys/fs/cgroup/pids/pids.max').read().strip()
import json
print(json.dumps({"cpu": int(quota) / int(period), "mem": int(mem), "pids": pids,
                  "nets": sorted(os.listdir('/sys/class/net'))}))
"""


def test_limits_are_enforced_inside_the_container(docker_node: Node) -> None:
    result = docker_node.cli("session", "run", "python", "--cpu", "0.5", "--mem", "256m", "-c", READ_LIMITS)
    assert result.returncode == 0, result.stderr
    limits = json.loads(result.stdout)
    assert limits["cpu"] == 0.5
    assert limits["mem"] == 256 * 1024 * 1024
    assert limits["pids"] == "4096"
    assert limits["nets"] == ["lo"]  # --network none


MY_RUNNER = r"""
import pathlib, sys
pathlib.Path("runner.py").write_text("WHO = 'mine'\n")
import runner
print(runner.WHO, sys.modules["_bai_runner"].__cached__)
"""


def test_the_runner_is_loaded_from_its_bytecode_and_a_users_runner_module_stays_importable(docker_node: Node) -> None:
    """`bai node` mounts the runner as a module with its bytecode (bai/node/agent/runner_lib.py): the kernel's Python
    (3.11, as the node's) loads it, under a name of its own, so the user's runner.py in /home/work is theirs."""
    result = docker_node.cli("session", "run", "python", "-c", MY_RUNNER)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["mine", "/opt/bai/lib/__pycache__/_bai_runner.cpython-311.pyc"]


def test_memory_limit_kills_a_hog(docker_node: Node) -> None:
    hog = "chunks = []\nwhile True:\n    chunks.append(bytearray(16 * 1024 * 1024))"
    result = docker_node.cli("session", "run", "python", "--mem", "128m", "-c", hog, timeout=120)
    assert result.returncode != 0
    assert "MemoryError" in result.stderr or result.returncode == 137


def test_containers_carry_session_labels(docker_node: Node) -> None:
    name = "labelled"
    created = docker_node.json("session", "create", "python", "--name", name)
    try:
        info = docker_node.json("session", "info", name)
        container = info["containerId"]
        labels = json.loads(
            subprocess.run(
                ["docker", "inspect", "--format", "{{json .Config.Labels}}", container],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        assert labels["ai.backend.session-id"] == created["sessionId"]
        assert labels["ai.backend.kernel-id"] == info["kernels"][0]["id"]
        assert labels["bai.agent-id"] == docker_node.agent_id
    finally:
        docker_node.cli("session", "destroy", name, check=True)
    # destroy kills the kernel at once and removes its container just after, in the background
    deadline = time.monotonic() + 10
    while (gone := subprocess.run(["docker", "inspect", container], capture_output=True)).returncode == 0:
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert gone.returncode != 0  # destroy removed the container


def test_image_without_python_runs_commands(docker_node: Node, busybox_image: str) -> None:
    result = docker_node.cli("session", "run", busybox_image, "--", "echo", "hi")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "hi\n"
    failing = docker_node.cli("session", "run", busybox_image, "--", "sh", "-c", "exit 7")
    assert failing.returncode == 7
    # code for an image without Python is a shell command, as Backend.AI's non-Python runners take it
    query = docker_node.cli("session", "run", busybox_image, "-c", "echo from -c; exit 3")
    assert (query.returncode, query.stdout) == (3, "from -c\n"), query.stderr


def test_a_restart_keeps_sessions_and_their_kernels(tmp_path, python_image: str) -> None:
    node = Node(tmp_path, "docker").start()
    try:
        node.cli("session", "create", "python", "--name", "survivor", check=True)
        node.cli("session", "exec", "survivor", "-c", "state = 'kept'", check=True)
        node.cli("session", "create", "python", "--name", "victim", check=True)
        victim = node.json("session", "info", "victim")["containerId"]
        assert node.stop() == 0
        subprocess.run(["docker", "rm", "-f", victim], check=True, capture_output=True)
        node.start()
        assert node.cli("session", "exec", "survivor", "-c", "print(state)", check=True).stdout == "kept\n"
        info = node.json("session", "info", "victim")
        assert info["status"] == "TERMINATED"
        assert info["statusInfo"] == "agent-termination"
        node.cli("session", "destroy", "survivor", check=True)
        assert containers_after_destroy(node) == []
    finally:
        stop_removing_containers(node)


def test_unknown_containers_of_the_agent_are_removed_on_start(tmp_path, python_image: str) -> None:
    node = Node(tmp_path, "docker")
    stray = subprocess.run(
        [
            "docker",
            "run",
            "-d",
            "--network",
            "none",
            "--label",
            f"bai.agent-id={node.agent_id}",
            "--label",
            "bai.test=1",
            "--label",
            "ai.backend.kernel-id=00000000-0000-4000-8000-000000000000",
            python_image,
            "sleep",
            "300",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    try:
        node.start()
        assert subprocess.run(["docker", "inspect", stray], capture_output=True).returncode != 0
    finally:
        node.stop()
        subprocess.run(["docker", "rm", "-f", stray], capture_output=True)
