"""Docker kernels are confined: no capabilities, no new privileges, a read-only root filesystem, a
run folder they cannot write into, and a bounded scratch (/home/work, /tmp) of the configured type."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.nodeproc import Node, stop_removing_containers

STATUS = r"""
import json, resource
fields = dict(line.split(':', 1) for line in open('/proc/self/status').read().splitlines() if ':' in line)
print(json.dumps({k: fields[k].strip() for k in ('CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb', 'NoNewPrivs')}
                 | {'nofile': resource.getrlimit(resource.RLIMIT_NOFILE)[1]}))
"""

# what writing where gives inside a kernel: "ok" or the error's text
PROBE = r"""
import json, os
def attempt(path, size):
    try:
        with open(path, 'wb') as f:
            chunk = b'x' * (1 << 20)
            for _ in range(size >> 20):
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        return 'ok'
    except OSError as e:
        return e.strerror
    finally:
        if os.path.exists(path):
            os.unlink(path)
st = os.stat('/home/work')
print(json.dumps({
    'home': attempt('/home/work/big', 100 << 20),
    'tmp': attempt('/tmp/big', 100 << 20),
    'small': attempt('/home/work/small', 1 << 20),
    'rootfs': attempt('/big', 1 << 20),
    'etc': attempt('/etc/big', 1 << 20),
    'run': attempt('/opt/bai/run/big', 1 << 20),
    'home_owner': [st.st_uid, st.st_gid],
}))
"""


def du(path: Path) -> int:
    """Bytes allocated under a folder (what it takes on the disk)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def mounts_under(path: Path) -> list[str]:
    with open("/proc/self/mounts") as f:
        return [line.split()[1] for line in f if line.split()[1].startswith(str(path))]


def scratch_node(tmp_path_factory, kind: str, size: str = "64m") -> Iterator[Node]:
    node = Node(
        tmp_path_factory.mktemp(f"scratch-{kind}"),
        "docker",
        agent_config=f'scratch_type = "{kind}"\nscratch_size = "{size}"\n',
    ).start()
    yield node
    stop_removing_containers(node)
    for mount in mounts_under(node.state_dir):  # never leave a loop mount behind
        subprocess.run(["umount", "-l", mount], capture_output=True)


def needs_hostfile() -> None:
    if os.geteuid() != 0 or not Path("/dev/loop-control").exists():
        if os.environ.get("BAI_REQUIRE_DOCKER") == "1":
            pytest.fail("a hostfile scratch needs root and loop devices (CI has both)")
        pytest.skip("a hostfile scratch needs root and loop devices")


@pytest.fixture(scope="module")
def hostfile_node(python_image: str, tmp_path_factory) -> Iterator[Node]:
    needs_hostfile()
    yield from scratch_node(tmp_path_factory, "hostfile")


VOLUME_IMAGE = "bai-test-volume:latest"


@pytest.fixture(scope="module")
def volume_image(python_image: str) -> Iterator[str]:
    """The Python image with a VOLUME, which Docker would back with an unbounded volume of its own."""
    subprocess.run(
        ["docker", "build", "-q", "-t", VOLUME_IMAGE, "-"],
        input=f"FROM {python_image}\nVOLUME /data\n",
        text=True,
        check=True,
        capture_output=True,
    )
    yield VOLUME_IMAGE
    subprocess.run(["docker", "rmi", "-f", VOLUME_IMAGE], capture_output=True)


@pytest.fixture(scope="module")
def memory_node(python_image: str, tmp_path_factory) -> Iterator[Node]:
    yield from scratch_node(tmp_path_factory, "memory")


def run_json(node: Node, code: str) -> dict:
    result = node.cli("session", "run", "python", "-c", code, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_kernels_have_no_capabilities_and_no_new_privileges(docker_node: Node) -> None:
    status = run_json(docker_node, STATUS)
    for field in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert status[field] == "0000000000000000", (field, status)
    assert status["NoNewPrivs"] == "1"
    assert status["nofile"] == 8192  # [agent] nofile


def test_a_kernel_cannot_write_into_its_run_folder_nor_the_runner(docker_node: Node) -> None:
    """The run folder (the agent's socket) and the runner's folder (its module and bytecode, one folder on the node
    for every kernel) are mounted read-only: a kernel can change neither."""
    docker_node.cli("session", "create", "python", "--name", "confined", check=True)
    lib = docker_node.state_dir / "runner" / "lib"
    runner_files = {p: p.read_bytes() for p in sorted(lib.rglob("*")) if p.is_file()}
    assert {p.name for p in runner_files} >= {"_bai_runner.py", "_bai_runner.cpython-311.pyc"}
    try:
        kid = docker_node.json("session", "info", "confined")["kernels"][0]["id"]
        kdir = docker_node.state_dir / "kernels" / kid
        before = sorted(p.name for p in (kdir / "run").iterdir())
        code = (
            "import glob\n"
            "paths = ['/opt/bai/run/x', '/opt/bai/run/agent.sock.x', '/opt/bai/lib/new.py']\n"
            "paths += sorted(glob.glob('/opt/bai/lib/**/*.py*', recursive=True))\n"
            "for path in paths:\n"
            "    try:\n"
            "        open(path, 'a').write('x' * 1000)\n"
            "        print('wrote', path)\n"
            "    except OSError as e:\n"
            "        print('refused', path, e.strerror)\n"
        )
        out = docker_node.cli("session", "exec", "confined", "-c", code, check=True).stdout
        lines = out.splitlines()
        assert len(lines) == 3 + len(runner_files), out  # (each of the runner's files is there in the kernel)
        # (the runner's files: their owner's, the node's, before the mount's own refusal)
        assert all(line.startswith("refused") for line in lines), out
        assert all(line.endswith(("Read-only file system", "Permission denied")) for line in lines), out
        assert sum(line.endswith("Read-only file system") for line in lines) >= 3, out
        assert sorted(p.name for p in (kdir / "run").iterdir()) == before == ["agent.sock"]
        assert {p: p.read_bytes() for p in sorted(lib.rglob("*")) if p.is_file()} == runner_files
        mkdir = docker_node.cli("session", "exec", "confined", "-c", "import os; os.mkdir('/opt/bai/run/d')")
        assert mkdir.returncode != 0 and "Read-only file system" in mkdir.stderr
    finally:
        docker_node.cli("session", "destroy", "confined", check=True)


def test_output_to_the_containers_own_stdout_is_capped_on_the_nodes_disk(docker_node: Node) -> None:
    """Code can bypass the runner's capture and write to fd 1 of the kernel's first process (what Docker
    logs on the node's disk): 40 MB of it leaves at most about 1 MiB there."""
    docker_node.cli("session", "create", "python", "--name", "fd-one", check=True)
    try:
        container = docker_node.json("session", "info", "fd-one")["kernels"][0]["containerId"]
        code = "import os\nfor _ in range(40):\n    os.write(1, b'x' * 1048575 + b'\\n')\nprint('done')"
        assert docker_node.cli("session", "exec", "fd-one", "-c", code, check=True).stdout.strip() == "done"
        log_path = subprocess.run(
            ["docker", "inspect", "-f", "{{.LogPath}}", container], capture_output=True, text=True, check=True
        ).stdout.strip()
        assert Path(log_path).stat().st_size < 2 << 20
    finally:
        docker_node.cli("session", "destroy", "fd-one", check=True)


def wait_no_kernels(node: Node) -> None:
    """`session run` destroys in the background: wait until the kernels' folders and mounts are gone."""
    kernels = node.state_dir / "kernels"
    deadline = time.monotonic() + 15
    while (list(kernels.iterdir()) or mounts_under(kernels)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert mounts_under(kernels) == []
    assert list(kernels.iterdir()) == []


def test_hostfile_scratch_is_bounded_and_the_rest_read_only(hostfile_node: Node) -> None:
    assert "scratch   hostfile, 64 MiB per kernel (loop-mounted ext4)" in hostfile_node.banner
    hostfile_node.cli("session", "create", "python", "--name", "bounded", check=True)
    try:
        before = du(hostfile_node.state_dir)
        result = hostfile_node.cli("session", "exec", "bounded", "-c", PROBE, check=True)
        probe = json.loads(result.stdout)
        assert probe["home"] == "No space left on device", probe
        assert probe["tmp"] == "No space left on device", probe  # /tmp shares the bound
        assert probe["small"] == "ok"
        assert probe["rootfs"] == probe["etc"] == probe["run"] == "Read-only file system", probe
        assert probe["home_owner"] == [1000, 1000]
        # the node's state folder took at most the scratch's size, not the 200 MB written
        assert du(hostfile_node.state_dir) - before < 70 * 2**20
    finally:
        hostfile_node.cli("session", "destroy", "bounded", check=True)
    wait_no_kernels(hostfile_node)  # destroyed with its session: no mount, no file left


def volumes() -> set[str]:
    out = subprocess.run(["docker", "volume", "ls", "-q"], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_an_images_volume_is_bounded_by_the_scratch_too(volume_image: str, tmp_path_factory) -> None:
    needs_hostfile()
    node = next(scratch_node(tmp_path_factory, "hostfile"))  # started after the image exists
    try:
        before = volumes()
        code = PROBE.replace("/tmp/big", "/data/big")
        result = node.cli("session", "run", volume_image, "-c", code, timeout=120)
        assert result.returncode == 0, result.stderr
        probe = json.loads(result.stdout)
        assert probe["tmp"] == "No space left on device", probe  # /data: within the kernel's bound
        assert volumes() == before  # Docker made no volume of its own for it
    finally:
        node.stop()
        for mount in mounts_under(node.state_dir):
            subprocess.run(["umount", "-l", mount], capture_output=True)


def test_memory_scratch_is_bounded_and_dotfiles_still_land(memory_node: Node) -> None:
    assert "scratch   memory, 64 MiB tmpfs per kernel" in memory_node.banner
    memory_node.cli("dotfile", "add", ".config/bai-test/rc", "--data", "answer=42\n", check=True)
    try:
        probe = run_json(memory_node, PROBE)
        assert probe["home"] == probe["tmp"] == "No space left on device", probe
        assert probe["small"] == "ok"
        assert probe["rootfs"] == probe["etc"] == "Read-only file system", probe
        assert probe["home_owner"] == [1000, 1000]
        code = "import os; p = os.path.expanduser('~/.config/bai-test/rc'); print(open(p).read(), os.stat(p).st_uid)"
        result = memory_node.cli("session", "run", "python", "-c", code, timeout=120)
        assert result.returncode == 0 and "answer=42\n 1000" in result.stdout, result.stderr
    finally:
        memory_node.cli("dotfile", "rm", ".config/bai-test/rc", check=True)


def loop_devices(image: Path) -> str:
    return subprocess.run(["losetup", "-j", str(image)], capture_output=True, text=True).stdout.strip()


def test_scratch_lives_as_long_as_its_container_across_restarts(hostfile_node: Node) -> None:
    hostfile_node.cli("session", "create", "python", "--name", "keeper", check=True)
    hostfile_node.cli("session", "create", "python", "--name", "goner", check=True)
    hostfile_node.cli("session", "exec", "keeper", "-c", "open('/home/work/kept', 'w').write('kept')", check=True)
    goner = hostfile_node.json("session", "info", "goner")
    goner_dir = hostfile_node.state_dir / "kernels" / goner["kernels"][0]["id"]
    # mounted in the container only (not on the host), on a loop device that ends with the container
    assert mounts_under(hostfile_node.state_dir) == []
    assert loop_devices(goner_dir / "scratch.img")
    try:
        assert hostfile_node.stop() == 0
        subprocess.run(["docker", "rm", "-f", goner["containerId"]], check=True, capture_output=True)
        deadline = time.monotonic() + 5
        while loop_devices(goner_dir / "scratch.img") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not loop_devices(goner_dir / "scratch.img"), "the loop device outlived its container"
        hostfile_node.start()
        assert not goner_dir.exists()  # the agent removed the folder of the kernel that is gone
        out = hostfile_node.cli("session", "exec", "keeper", "-c", "print(open('/home/work/kept').read())", check=True)
        assert out.stdout == "kept\n"
    finally:
        hostfile_node.cli("session", "destroy", "keeper")
        hostfile_node.cli("session", "destroy", "goner")
    wait_no_kernels(hostfile_node)


def test_the_banner_says_which_bound_is_in_force(python_image: str, tmp_path: Path) -> None:
    node = Node(tmp_path, "docker", agent_config='scratch_type = "hostdir"\n').start()
    try:
        line = next(line for line in node.banner.splitlines() if line.startswith("  scratch "))
        assert "hostdir, UNBOUNDED" in line and "WARNING" in line
        assert "UNBOUNDED" in node.log_path.read_text()  # and the log has the warning
    finally:
        node.stop()
    bad = Node(tmp_path / "bad", "docker", agent_config='scratch_type = "disk"\n')
    with pytest.raises(AssertionError, match="scratch_type"):
        bad.start()
    caps = Node(tmp_path / "caps", "docker")
    labels = 'labels = { "bai.test" = "1" }\n'
    caps.config_file.write_text(
        caps.config_file.read_text().replace(labels, labels + 'cap_add = ["NET_BIND_SERVISE"]\n')
    )
    with pytest.raises(AssertionError, match="not a Linux capability"):
        caps.start()
