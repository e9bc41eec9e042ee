"""The warm pool on real Docker: a warm kernel is indistinguishable from a cold one to the code inside,
survives agent restarts (as pool, or as its session's), shrinks with the configuration, goes with its image,
and shows in `bai agent ls`."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.nodeproc import Node, containers, stop_removing_containers

FAST_BEAT = "[link]\nheartbeat_interval = 0.3\n"

# what code sees, in every way it runs: Python in the runner, a command it starts, a shell
PROBE = r"""
import json, os, socket, subprocess
def sh(cmd):
    return subprocess.run(["/bin/sh", "-c", cmd], capture_output=True, text=True).stdout
def stat(path):
    try:
        st = os.stat(os.path.expanduser(path))
        return [oct(st.st_mode), st.st_uid, st.st_gid, open(os.path.expanduser(path)).read() if "rc" in path else ""]
    except OSError as e:
        return str(e)
def read(*paths):
    for p in paths:
        try:
            return open(p).read().strip()
        except OSError:
            pass
    return None
env_cmd = dict(line.split("=", 1) for line in sh("env").splitlines() if "=" in line)
print(json.dumps({
    "environ": dict(os.environ),
    "env_cmd": env_cmd,
    "hostname": [socket.gethostname(), sh("hostname").strip()],
    "pwd": [os.getcwd(), sh("pwd").strip()],
    "id": sh("id").strip(),
    "umask_ulimits": sh("umask; ulimit -n; ulimit -u").split(),
    "home": sorted(os.listdir(os.path.expanduser("~"))),
    "dotfiles": [stat("~/.config"), stat("~/.config/bai-test"), stat("~/.config/bai-test/rc")],
    "cgroup": {
        "cpu": read("/sys/fs/cgroup/cpu.max", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"),
        "cpu_period": read("/sys/fs/cgroup/cpu/cpu.cfs_period_us"),
        "mem": read("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"),
        "swap": read("/sys/fs/cgroup/memory.swap.max", "/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes"),
        "pids": read("/sys/fs/cgroup/pids.max", "/sys/fs/cgroup/pids/pids.max"),
    },
}))
"""
# values that differ between any two sessions by nature (the two nodes have their own keypairs)
PER_SESSION = {"BACKENDAI_SESSION_ID", "BACKENDAI_SESSION_NAME", "BACKENDAI_KERNEL_ID", "BACKENDAI_ACCESS_KEY"}


def status(node: Node) -> dict:
    path = node.state_dir / "agent-status.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def wait_warm(node: Node, image: str, count: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (status(node).get("warm") or {}).get(image, 0) == count:
            return
        time.sleep(0.1)
    raise AssertionError(
        f"the pool of {image} did not reach {count}: {status(node)}\n{node.log_path.read_text()[-3000:]}"
    )


def labels_of(container: str) -> dict[str, str]:
    out = subprocess.run(
        ["docker", "inspect", "--format", "{{json .Config.Labels}}", container],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


def recorded_limits(container: str) -> list[int]:
    """What Docker has recorded as the container's limits (`docker inspect`), once it says 384 MiB (a warm
    kernel's limits are in force at once, and recorded by Docker just after, in the background)."""
    deadline = time.monotonic() + 5
    while True:
        out = subprocess.run(
            ["docker", "inspect", "--format", "{{json .HostConfig}}", container], capture_output=True, text=True
        )
        host = json.loads(out.stdout)
        limits = [host["NanoCpus"], host["Memory"], host["MemorySwap"], host["PidsLimit"]]
        if limits[1] == 384 * 2**20 or time.monotonic() > deadline:
            return limits


def pooled_containers(node: Node) -> list[str]:
    out = subprocess.run(
        [
            "docker",
            "ps",
            "-q",
            "--no-trunc",
            "--filter",
            f"label=bai.agent-id={node.agent_id}",
            "--filter",
            "label=bai.warm-pool",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return sorted(out.stdout.split())


@pytest.fixture(scope="module")
def warm_node(python_image: str, tmp_path_factory) -> Node:
    node = Node(tmp_path_factory.mktemp("warm"), "docker", extra_config=FAST_BEAT, warm_pool={"python": 1}).start()
    yield node
    stop_removing_containers(node)


def probe(node: Node, name: str) -> tuple[dict, dict[str, str]]:
    node.cli("dotfile", "add", ".config/bai-test/rc", "--data", "answer=42\n", "--permission", "600", check=True)
    node.cli("session", "create", "python", "--name", name, "--cpu", "1", "--mem", "384m", check=True)
    try:
        info = node.json("session", "info", name)
        labels = labels_of(info["containerId"])
        out = node.cli("session", "exec", name, "-c", PROBE, check=True).stdout
        seen = json.loads(out)
        seen["recorded"] = recorded_limits(info["containerId"])
        return seen, labels
    finally:
        node.cli("session", "destroy", name, check=True)


def test_a_warm_kernel_is_indistinguishable_from_a_cold_one(warm_node: Node, tmp_path: Path) -> None:
    cold_node = Node(tmp_path / "cold", "docker", warm_pool={"python": 0}).start()
    try:
        cold, cold_labels = probe(cold_node, "cold")
    finally:
        stop_removing_containers(cold_node)
    wait_warm(warm_node, "bai-python:3.11", 1)
    warm, warm_labels = probe(warm_node, "warm")
    assert "bai.warm-pool" not in cold_labels
    assert warm_labels.get("bai.warm-pool") == "bai-python:3.11"  # it did come from the pool
    for seen in (cold, warm):
        assert seen["environ"]["BACKENDAI_SESSION_NAME"] in ("cold", "warm")
        for name in PER_SESSION:
            seen["environ"].pop(name)
            seen["env_cmd"].pop(name)
    assert warm["environ"] == cold["environ"]
    assert warm["env_cmd"] == cold["env_cmd"]
    assert warm == cold  # hostname, working directory, user, ulimits, home, and the cgroup limits
    assert cold["cgroup"]["mem"] == str(384 * 2**20)
    assert cold["recorded"][:3] == [10**9, 384 * 2**20, 384 * 2**20]
    assert cold["dotfiles"][2][1:] == [1000, 1000, "answer=42\n"]


def test_a_warm_kernel_gets_the_session_variables_in_every_path(warm_node: Node) -> None:
    wait_warm(warm_node, "bai-python:3.11", 1)
    code = (
        "import os, subprocess\n"
        "shell = subprocess.run(['sh', '-c', 'echo $GREETING'], capture_output=True, text=True).stdout.strip()\n"
        "print(os.environ['GREETING'], shell)"
    )
    result = warm_node.cli("session", "run", "python", "--env", "GREETING=hello", "-c", code, check=True)
    assert result.stdout == "hello hello\n"


def test_pool_survives_restarts_as_pool_and_as_sessions(tmp_path: Path, python_image: str) -> None:
    node = Node(tmp_path, "docker", extra_config=FAST_BEAT, warm_pool={"python": 1}).start()
    try:
        wait_warm(node, "bai-python:3.11", 1)
        [first] = pooled_containers(node)
        node.cli("session", "create", "python", "--name", "handed", check=True)
        node.cli("session", "exec", "handed", "-c", "state = 'kept'", check=True)
        handed = node.json("session", "info", "handed")["containerId"]
        assert handed == first  # the session took the warm kernel
        wait_warm(node, "bai-python:3.11", 1)  # and the pool refilled
        before = pooled_containers(node)
        assert len(before) == 2
        assert node.stop() == 0
        assert sorted(containers(f"bai.agent-id={node.agent_id}")) != []  # left running for the next start
        node.start()
        wait_warm(node, "bai-python:3.11", 1)
        assert pooled_containers(node) == before  # the same two: one session's, one pooled; nothing new
        out = node.cli(
            "session", "exec", "handed", "-c", "import os; print(state, os.environ['BACKENDAI_SESSION_NAME'])"
        )
        assert out.stdout == "kept handed\n", out.stderr
        # the re-adopted pooled kernel serves the next session, not the handed-over one
        node.cli("session", "create", "python", "--name", "second", check=True)
        second = node.json("session", "info", "second")["containerId"]
        assert second in before and second != handed
        for name in ("handed", "second"):
            node.cli("session", "destroy", name, check=True)
        # the pool shrinks when the configuration says so
        wait_warm(node, "bai-python:3.11", 1)
        assert node.stop() == 0
        text = node.config_file.read_text().replace('"python" = 1', '"python" = 0')
        node.config_file.write_text(text)
        node.start()
        deadline = time.monotonic() + 20
        while pooled_containers(node) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert pooled_containers(node) == []
    finally:
        stop_removing_containers(node)


def test_removing_an_image_removes_its_warm_kernels(tmp_path: Path, python_image: str) -> None:
    image = f"bai-wp-test:{tmp_path.name[-8:].lower().replace('_', '-')}"
    subprocess.run(["docker", "tag", python_image, image], check=True)
    node = Node(tmp_path, "docker", extra_config=FAST_BEAT, warm_pool={image: 1}).start()
    try:
        wait_warm(node, image, 1)
        listed = node.json("agent", "ls")
        assert listed[0]["warm"] == {image: 1}
        assert "warm 1" in node.cli("agent", "ls", check=True).stdout
        assert f"Warm      1 {image}" in node.cli("agent", "info", listed[0]["id"], check=True).stdout
        node.cli("image", "rm", image, check=True)
        assert pooled_containers(node) == []
        assert subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode != 0
        time.sleep(1.5)
        assert pooled_containers(node) == []  # not refilled: the image is gone
    finally:
        stop_removing_containers(node)
        subprocess.run(["docker", "rmi", image], capture_output=True)


def test_warm_kernels_follow_their_image_name_and_run_commands_without_python(
    tmp_path: Path, python_image: str, busybox_image: str
) -> None:
    image = f"bai-wp-retag:{tmp_path.name[-8:].lower().replace('_', '-')}"
    subprocess.run(["docker", "tag", python_image, image], check=True)
    node = Node(tmp_path, "docker", extra_config=FAST_BEAT, warm_pool={image: 1}).start()
    try:
        wait_warm(node, image, 1)
        [old] = pooled_containers(node)
        subprocess.run(["docker", "tag", busybox_image, image], check=True)  # the name now means another image
        deadline = time.monotonic() + 30
        while (now := pooled_containers(node)) in ([old], []) and time.monotonic() < deadline:
            time.sleep(0.2)
        [new] = now
        assert new != old
        wait_warm(node, image, 1)
        # a warm kernel without Python: its commands run through docker exec, with the session's variables
        out = node.cli("session", "run", "--name", "exec-warm", "--env", "GREETING=hi", image, "--", "sh", "-c",
                       "echo $GREETING $BACKENDAI_SESSION_NAME; hostname")  # fmt: skip
        assert out.stdout == "hi exec-warm\nmain1\n", out.stderr
    finally:
        stop_removing_containers(node)
        subprocess.run(["docker", "rmi", image], capture_output=True)


def test_a_pool_that_cannot_start_is_retried_with_back_off_and_harms_nothing(tmp_path: Path, python_image: str) -> None:
    node = Node(tmp_path, "docker", extra_config=FAST_BEAT, warm_pool={"bai-no-such-image:1": 2, "python": 0}).start()
    try:
        out = node.cli("session", "run", "python", "-c", "print(42)")
        assert out.stdout == "42\n", out.stderr
        time.sleep(2.0)  # tries at 0, 1 and 3 s: said once, not at every try
        said = node.log_path.read_text().count("could not start a warm kernel of bai-no-such-image:1")
        assert said == 1, node.log_path.read_text()[-2000:]
        assert (status(node).get("warm") or {}) == {"bai-no-such-image:1": 0}
        assert pooled_containers(node) == []
    finally:
        stop_removing_containers(node)
