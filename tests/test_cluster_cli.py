"""`bai session` and cluster sessions (issue 20): `create` / `run` with `--cluster-size N --cluster-mode MODE`
(Backend.AI's client's option names), `exec` / `logs` / `shell` with `--kernel`, and `info` listing every
kernel, in text and --json. Bad values stop the CLI before it asks the manager (typer's validation).

The option checks need no node; the rest run against a `bai node` with the simulated backend."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from bai.cli.main import app
from bai.common.cluster import MAX_CLUSTER_SIZE
from tests.nodeproc import Node

SMALL = ("--cpu", "0.25", "--mem", "128m")
KERNEL_KEYS = {"id", "name", "clusterRole", "clusterIdx", "agent", "status", "containerId", "exitCode", "usage"}


@pytest.mark.parametrize(
    "args,words",
    [
        (["--cluster-size", "0"], "--cluster-size"),
        (["--cluster-size", str(MAX_CLUSTER_SIZE + 1)], "--cluster-size"),
        (["--cluster-size", "two"], "--cluster-size"),
        (["--cluster-size", "1.5"], "--cluster-size"),
        (["--cluster-mode", "sideways"], "single-node or multi-node"),
    ],
)
@pytest.mark.parametrize("command", ["create", "run"])
def test_bad_cluster_options_exit_non_zero_with_a_message(command: str, args: list[str], words: str) -> None:
    extra = ["-c", "print(1)"] if command == "run" else []
    result = CliRunner().invoke(app, ["session", command, "python", *args, *extra])
    assert result.exit_code == 2, result.output
    assert words in result.output, result.output


def test_the_options_are_in_the_help() -> None:
    for command in ("create", "run"):
        out = CliRunner().invoke(app, ["session", command, "--help"], env={"COLUMNS": "200"}).output
        assert "--cluster-size" in out and "--cluster-mode" in out, out
    for command in ("exec", "logs", "shell"):
        out = CliRunner().invoke(app, ["session", command, "--help"], env={"COLUMNS": "200"}).output
        assert "--kernel" in out, out


def test_files_go_to_the_main_kernel_only(tmp_path) -> None:
    script = tmp_path / "job.py"
    script.write_text("print(1)\n")
    result = CliRunner().invoke(app, ["session", "exec", "some-session", str(script), "--kernel", "sub1"])
    assert result.exit_code == 2 and "main kernel" in result.output, result.output


# -- against a node (these need the manager's multi-kernel lifecycle: every kernel of a session starts) ---


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> Iterator[Node]:
    node = Node(tmp_path_factory.mktemp("cluster-cli"), "sim").start()
    yield node
    node.stop()


def test_create_info_exec_logs_of_a_cluster_session(node: Node) -> None:
    name = "cli-trio"
    made = json.loads(
        node.cli(
            "session", "create", "python", "--name", name, *SMALL,
            "--cluster-size", "3", "--cluster-mode", "MULTI_NODE", "--json", check=True,
        ).stdout
    )  # fmt: skip
    assert made["status"] == "RUNNING", made
    info = node.json("session", "info", name)
    assert (info["clusterSize"], info["clusterMode"]) == (3, "multi-node")
    kernels = info["kernels"]
    assert [k["name"] for k in kernels] == ["main1", "sub1", "sub2"]
    for k in kernels:  # --json keys are camelCase, as the rest of --json
        assert KERNEL_KEYS <= set(k)
        assert k["status"] == "RUNNING" and k["agent"]

    text = node.cli("session", "info", name, check=True).stdout
    assert "Cluster     3 kernels, multi-node" in text, text
    for k in kernels:
        line = next(line for line in text.splitlines() if line.startswith("Kernel") and k["id"] in line)
        assert k["name"] in line and "RUNNING" in line and k["agent"] in line, line

    out = node.cli("session", "exec", name, "--kernel", "sub2", "-c", "print('from-sub2')", check=True)
    assert "from-sub2" in out.stdout
    node.cli("session", "exec", name, "-c", "print('from-main')", check=True)
    missing = node.cli("session", "exec", name, "--kernel", "sub7", "-c", "print(1)")
    assert missing.returncode != 0 and "main1, sub1, sub2" in missing.stderr, missing

    def logs(*args: str) -> str:
        deadline = time.monotonic() + 10
        while True:
            text = node.cli("session", "logs", name, *args, check=True).stdout
            if "from-" in text or time.monotonic() > deadline:
                return text
            time.sleep(0.1)

    assert "from-sub2" in logs("--kernel", "sub2") and "from-main" not in logs("--kernel", "sub2")
    assert "from-main" in logs() and "from-sub2" not in logs()
    assert "from-sub2" in logs("--kernel", kernels[2]["id"][:8])  # an id prefix names a kernel too
    bad = node.cli("session", "logs", name, "--kernel", "sub9")
    assert bad.returncode != 0 and "sub9" in bad.stderr, bad

    shell = node.cli("session", "shell", name, "--kernel", "sub1", input="exit 4\n")  # the sim's pretend shell
    assert shell.returncode == 4, shell
    shell = node.cli("session", "shell", name, "--kernel", "sub9", input="exit 4\n")
    assert shell.returncode not in (0, 4) and "main1, sub1, sub2" in shell.stderr, shell
    node.cli("session", "destroy", name, check=True)


def test_run_in_a_cluster_session(node: Node) -> None:
    out = node.cli("session", "run", "python", *SMALL, "--cluster-size", "2", "-c", "print('ran')", check=True)
    assert "ran" in out.stdout, out
