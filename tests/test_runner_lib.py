"""The runner as a module with its bytecode (bai/node/agent/runner_lib.py): what `install` writes, that a kernel whose
Python is the node's loads the bytecode instead of compiling the runner, that any other Python still starts it from
the source, and that a Docker kernel started this way runs code and leaves a user's own `runner` module importable."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from bai.node.agent import runner_lib
from tests.nodeproc import PYTHON_IMAGE, ensure_image, require_docker

RUNNER = Path(__file__).resolve().parent.parent / "bai" / "node" / "agent" / "runner.py"


def test_install_writes_the_module_and_a_checked_hash_bytecode_of_it(tmp_path: Path) -> None:
    source = RUNNER.read_bytes()
    lib = runner_lib.install(source, tmp_path / "lib")
    module = lib / "_bai_runner.py"
    pyc = lib / "__pycache__" / f"_bai_runner.{sys.implementation.cache_tag}.pyc"
    assert module.read_bytes() == source
    data = pyc.read_bytes()
    assert data[:4] == importlib.util.MAGIC_NUMBER
    assert int.from_bytes(data[4:8], "little") == 0b11  # hash-based, checked against the source
    assert data[8:16] == importlib.util.source_hash(source)
    # readable by a kernel of any user, written by nobody but the node
    assert module.stat().st_mode & 0o777 == 0o644 and pyc.stat().st_mode & 0o777 == 0o644
    assert lib.stat().st_mode & 0o777 == 0o755 and pyc.parent.stat().st_mode & 0o777 == 0o755


def test_install_again_keeps_what_is_current_and_replaces_what_is_not(tmp_path: Path) -> None:
    lib = runner_lib.install(b"X = 1\n", tmp_path / "lib")
    pyc = runner_lib.bytecode_path(lib)
    first = pyc.stat().st_mtime_ns, pyc.stat().st_ino
    runner_lib.install(b"X = 1\n", lib)
    assert (pyc.stat().st_mtime_ns, pyc.stat().st_ino) == first  # nothing rewritten
    runner_lib.install(b"X = 2\n", lib)  # a new bai's runner
    assert (lib / "_bai_runner.py").read_bytes() == b"X = 2\n"
    assert pyc.read_bytes()[8:16] == importlib.util.source_hash(b"X = 2\n")
    pyc.unlink()  # (lost): made again
    runner_lib.install(b"X = 2\n", lib)
    assert pyc.exists()
    assert not list(lib.rglob("*.tmp"))


def test_the_module_start_runs_the_runner_from_its_bytecode(tmp_path: Path) -> None:
    """`START` with this Python (the kernel's, in this test) imports the runner from the bytecode, and gets to its
    argument parsing (--help) as the script does."""
    lib = runner_lib.install(RUNNER.read_bytes(), tmp_path / "lib")
    code = runner_lib.START.replace(runner_lib.MOUNT, str(lib))
    out = subprocess.run([sys.executable, "-v", "-c", code, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "bai kernel runner" in out.stdout and "--connect" in out.stdout
    assert f"code object from '{runner_lib.bytecode_path(lib)}'" in out.stderr  # not compiled from the source


@pytest.mark.docker
def test_a_kernel_image_loads_the_bytecode_when_its_python_is_the_nodes_and_compiles_otherwise(tmp_path: Path) -> None:
    require_docker()
    ensure_image("python", PYTHON_IMAGE)
    lib = runner_lib.install(RUNNER.read_bytes(), tmp_path / "lib")
    probe = "import sys; print(sys.implementation.cache_tag)"
    tag = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--label", "bai.test=runner-lib", PYTHON_IMAGE, "python3", "-c",
         probe],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout.strip()  # fmt: skip
    out = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--read-only", "--label", "bai.test=runner-lib",
         "-v", f"{lib}:{runner_lib.MOUNT}:ro", PYTHON_IMAGE, "python3", "-v", "-c", runner_lib.START, "--help"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert "bai kernel runner" in out.stdout
    from_bytecode = f"code object from '{runner_lib.MOUNT}/__pycache__/_bai_runner.{tag}.pyc'" in out.stderr
    # the test image's Python is the node's (3.11 both, in CI): the bytecode is used; any other compiles the source
    assert from_bytecode == (tag == sys.implementation.cache_tag), (tag, out.stderr[-1500:])
