"""The official client's session commands (`backend.ai-client==23.9.10`, unchanged) against a real bai node
with Docker kernels: `run FILE` without `--exec`, `run --build`, `run` on an image without Python, nested
uploads, and `session download | restart | rename | status-history | commit | show-graph`, `task-logs`, and
the SDK's ComputeSession calls behind them. The client exits 0 even when something fails: these tests read
what it prints and the node's state. Every test ends the sessions it made."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.nodeproc import Node, wait_status
from tests.test_official_client import Official, official_client


@pytest.fixture
def bai_client(docker_node: Node, tmp_path: Path) -> Official:
    return Official(official_client(), docker_node, tmp_path)


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def _session(node: Node, name: str, *extra: str) -> str:
    node.cli("session", "create", "python", "--name", name, *extra, check=True)
    return node.json("session", "info", name)["id"]


def _exec(node: Node, name: str, code: str) -> subprocess.CompletedProcess[str]:
    return node.cli("session", "exec", name, "-c", code)


def _gone(node: Node, *refs: str) -> None:
    for ref in refs:
        node.cli("session", "destroy", ref, "-f")


# -- run ----------------------------------------------------------------------------------------------------


def test_run_a_file_without_exec_runs_it(bai_client: Official, docker_node: Node) -> None:
    (bai_client.cwd / "hello.py").write_text("import sys\nprint('from hello.py', 6 * 7, sys.argv[0])\n")
    out = bai_client("run", "--rm", "python", "hello.py")
    assert "from hello.py 42 hello.py" in out, out
    assert "Build finished. (exit code = 0)" in out and "Execution finished. (exit code = 0)" in out, out
    (bai_client.cwd / "notes.txt").write_text("not a program\n")
    out = bai_client("run", "--rm", "python", "notes.txt")
    assert "cannot tell how to run this (notes.txt)" in out and "--exec" in out, out
    assert "exit code = 127" in out, out
    assert not [s for s in docker_node.json("session", "ls") if s["status"] == "RUNNING"]


def test_run_with_a_build_step(bai_client: Official) -> None:
    (bai_client.cwd / "prog.py").write_text("print('built:', open('built.txt').read().strip())\n")
    out = bai_client("run", "--rm", "--build", "echo made-by-build > built.txt", "python", "prog.py")
    assert "Build finished. (exit code = 0)" in out and "built: made-by-build" in out, out
    out = bai_client("run", "--rm", "--build", "echo compiling; exit 3", "python", "prog.py")
    assert "compiling" in out and "Build finished. (exit code = 3)" in out, out
    assert "the build failed" in out and "exit code = 127" in out and "built:" not in out, out


def test_run_code_on_an_image_without_python_is_a_shell_command(
    bai_client: Official, busybox_image: str, docker_node: Node
) -> None:
    out = bai_client("run", "--rm", busybox_image, "-c", 'echo hi from sh; echo "$((6 * 7))"')
    assert "hi from sh" in out and "42" in out and "exit code = 0" in out, out
    (bai_client.cwd / "job.sh").write_text("echo job ran in $(pwd)\n")
    out = bai_client("run", "--rm", busybox_image, "job.sh")
    assert "job ran in /home/work" in out, out
    (bai_client.cwd / "x.py").write_text("print(1)\n")
    out = bai_client("run", "--rm", busybox_image, "x.py")
    assert "has no Python" in out, out


def test_nested_uploads_keep_their_folders(bai_client: Official, docker_node: Node) -> None:
    (bai_client.cwd / "pkg" / "sub").mkdir(parents=True)
    (bai_client.cwd / "pkg" / "sub" / "values.py").write_text("VALUE = 7\n")
    (bai_client.cwd / "main.py").write_text("from pkg.sub.values import VALUE\nprint('value is', VALUE * 6)\n")
    name = _name("nest")
    out = bai_client("run", "-t", name, "python", "main.py", "pkg/sub/values.py")
    try:
        assert "value is 42" in out, out
        listed = docker_node.cli("session", "files", name, "pkg/sub", "--json", check=True).stdout
        assert "values.py" in listed and "%2F" not in listed, listed
        (bai_client.cwd / "pkg" / "sub" / "more.txt").write_text("more")
        out = bai_client("session", "upload", name, "pkg/sub/more.txt")
        assert "Uploaded" in out, out
        assert "more" in docker_node.cli("session", "exec", name, "-c", "print(open('pkg/sub/more.txt').read())").stdout
    finally:
        _gone(docker_node, name)


# -- session commands ------------------------------------------------------------------------------------


def test_session_download(bai_client: Official, docker_node: Node) -> None:
    name = _name("dl")
    _session(docker_node, name)
    try:
        made = _exec(
            docker_node,
            name,
            "import os; open('out.txt', 'w').write('result 42\\n'); os.makedirs('d/e', exist_ok=True);"
            "open('d/e/inner.txt', 'w').write('deep')",
        )
        assert made.returncode == 0, made.stderr
        out = bai_client("session", "download", name, "out.txt", "d")
        assert "Downloaded to" in out, out
        assert (bai_client.cwd / "out.txt").read_text() == "result 42\n"
        assert (bai_client.cwd / "d" / "e" / "inner.txt").read_text() == "deep"
        out = bai_client("session", "download", name, "missing.txt")
        assert "missing.txt: no such file or folder" in out, out
        out = bai_client("session", "download", name, "../../etc/passwd")
        assert "only files under /home/work" in out, out
        # bai's own CLI: the same endpoint
        dest = bai_client.cwd / "bai-dest"
        got = docker_node.cli("session", "download", name, "out.txt", "--dest", str(dest), check=True)
        assert (dest / "out.txt").read_text() == "result 42\n", got.stdout
    finally:
        _gone(docker_node, name)


def test_session_restart_keeps_the_session_with_a_fresh_namespace(bai_client: Official, docker_node: Node) -> None:
    name = _name("rs")
    sid = _session(docker_node, name)
    try:
        assert _exec(docker_node, name, "x = 41; open('kept.txt', 'w').write('kept')").returncode == 0
        assert _exec(docker_node, name, "print(x + 1)").stdout.strip() == "42"
        container = docker_node.json("session", "info", name)["containerId"]
        out = bai_client("session", "restart", name)
        assert "Done" in out, out
        info = docker_node.json("session", "info", name)
        assert info["id"] == sid and info["status"] == "RUNNING" and info["containerId"] == container, info
        statuses = [t["status"] for t in docker_node.json("session", "explain", name)["transitions"]]
        assert statuses[-2:] == ["RESTARTING", "RUNNING"], statuses
        after = _exec(docker_node, name, "print(x)")
        assert after.returncode == 1 and "NameError" in after.stderr, (after.stdout, after.stderr)
        assert _exec(docker_node, name, "print(open('kept.txt').read())").stdout.strip() == "kept"
        # bai's own CLI: the same endpoint
        assert "restarted" in docker_node.cli("session", "restart", name, check=True).stdout
        assert docker_node.json("session", "info", name)["status"] == "RUNNING"
    finally:
        _gone(docker_node, name)


def test_session_rename(bai_client: Official, docker_node: Node) -> None:
    old, new = _name("old"), _name("new")
    sid = _session(docker_node, old)
    try:
        out = bai_client("session", "rename", old, new)
        assert f"Session renamed to {new}." in out, out
        assert docker_node.json("session", "info", new)["id"] == sid
        out = bai_client("session", "rename", new, "no")
        assert "invalid session name" in out, out
        assert "renamed" in docker_node.cli("session", "rename", new, old, check=True).stdout
        assert docker_node.json("session", "info", old)["id"] == sid
    finally:
        _gone(docker_node, sid)


def test_session_status_history(bai_client: Official, docker_node: Node) -> None:
    name = _name("sh")
    _session(docker_node, name)
    try:
        out = bai_client("session", "status-history", name)
        assert "status_history:" in out and "'PENDING'" in out and "'RUNNING'" in out, out
        assert "Actual Resource Allocation Time" in out, out
    finally:
        _gone(docker_node, name)


def test_session_commit_makes_an_image(bai_client: Official, docker_node: Node) -> None:
    name = _name("cm")
    _session(docker_node, name)
    image = None
    try:
        out = bai_client("session", "commit", name)
        assert "Request to commit" in out and "rror" not in out, out
        images = [i["name"] for i in docker_node.json("image", "ls")]
        made = [i for i in images if i.startswith(f"bai-commit/{name}:")]
        assert len(made) == 1, images
        image = made[0]
        ran = docker_node.cli("session", "run", image, "-c", "print('from the committed image')")
        assert "from the committed image" in ran.stdout, (ran.stdout, ran.stderr)
        labels = subprocess.run(
            ["docker", "image", "inspect", "-f", "{{json .Config.Labels}}", image], capture_output=True, text=True
        ).stdout
        assert name not in labels, labels  # the kernel's own labels are not the image's
    finally:
        _gone(docker_node, name)
        if image is not None:
            subprocess.run(["docker", "rmi", "-f", image], capture_output=True)


def test_task_logs_of_a_batch_session(bai_client: Official, docker_node: Node) -> None:
    name = _name("task")
    docker_node.cli(
        "session", "create", "python", "--name", name, "--type", "batch",
        "--startup-command", "echo task line one; echo task line two", "--wait",
    )  # fmt: skip
    info = wait_status(docker_node, name, "TERMINATED", timeout=60)
    kernel_id = info["kernels"][0]["id"]
    out = bai_client("task-logs", kernel_id)
    assert "task line one\ntask line two" in out, out
    assert "task line two" in bai_client("task-logs", info["id"])  # its session id works too
    out = bai_client("task-logs", str(uuid.uuid4()))
    assert "Traceback" not in out and "No such session" in out, out


def test_show_graph_of_dependent_sessions(bai_client: Official, docker_node: Node) -> None:
    tag = uuid.uuid4().hex[:6]
    first, second = f"first-{tag}", f"second-{tag}"
    docker_node.cli(
        "session", "create", "python", "--name", first, "--type", "batch", "--startup-command", "true",
    )  # fmt: skip
    docker_node.cli(
        "session", "create", "python", "--name", second, "--type", "batch", "--startup-command", "true",
        "--depends", first, "--wait",
    )  # fmt: skip
    wait_status(docker_node, second, "TERMINATED", timeout=60)
    out = bai_client("session", "show-graph", second)
    assert "Traceback" not in out and "first" in out and "second" in out, out
    assert "TERMINATED" in out, out
    out = bai_client("session", "show-graph", "--table", second)
    assert first in out and second in out, out


# -- the SDK ------------------------------------------------------------------------------------------------

SDK = """
import asyncio, sys
from ai.backend.client.session import AsyncSession, Session

name, dest = sys.argv[1], sys.argv[2]
with Session() as api:
    session = api.ComputeSession(name)
    print("sync download", session.download(["out.txt"], dest)["file_names"])
    session.restart()
    print("sync restarted")
    session.rename(name + "-r")
    print("sync renamed")
    print("history", sorted(api.ComputeSession(name + "-r").get_status_history()["result"]))


async def main():
    async with AsyncSession() as api:
        session = api.ComputeSession(name + "-r")
        print("async download", (await session.download(["out.txt"], dest + "/async"))["file_names"])
        await session.restart()
        print("async restarted")
        await session.rename(name)
        print("async renamed")


asyncio.run(main())
"""


def test_sdk_download_restart_rename(bai_client: Official, docker_node: Node) -> None:
    name = _name("sdk")
    sid = _session(docker_node, name)
    try:
        assert _exec(docker_node, name, "open('out.txt', 'w').write('sdk bytes')").returncode == 0
        python = str(Path(bai_client.program).parent / "python")
        run = subprocess.run(
            [python, "-c", SDK, name, str(bai_client.cwd / "dl")],
            capture_output=True,
            text=True,
            env={**bai_client.env, "PYTHONDONTWRITEBYTECODE": "1", "PATH": os.environ.get("PATH", "/usr/bin")},
            cwd=bai_client.cwd,
            timeout=180,
        )
        out = run.stdout + run.stderr
        assert run.returncode == 0, out
        for line in ("sync download ['out.txt']", "sync restarted", "sync renamed", "async download ['out.txt']"):
            assert line in out, out
        assert "async restarted" in out and "async renamed" in out, out
        assert "'RESTARTING'" in out, out
        assert (bai_client.cwd / "dl" / "out.txt").read_text() == "sdk bytes"
        assert (bai_client.cwd / "dl" / "async" / "out.txt").read_text() == "sdk bytes"
        info = docker_node.json("session", "info", name)
        assert info["id"] == sid and info["status"] == "RUNNING", info
    finally:
        _gone(docker_node, sid)


# -- local kernels (bai's CLI: the same endpoints) ------------------------------------------------------------


@pytest.fixture(scope="module")
def local_node(tmp_path_factory) -> Iterator[Node]:
    node = Node(tmp_path_factory.mktemp("local-sessions"), "local").start()
    yield node
    node.stop()


def test_local_kernels_restart_download_rename_and_refuse_commit(local_node: Node, tmp_path: Path) -> None:
    name = _name("loc")
    sid = _session(local_node, name)
    try:
        assert _exec(local_node, name, "x = 1; open('f.txt', 'w').write('local bytes')").returncode == 0
        assert "restarted" in local_node.cli("session", "restart", name, check=True).stdout
        after = _exec(local_node, name, "print(x)")
        assert "NameError" in after.stderr, after.stderr
        local_node.cli("session", "download", name, "f.txt", "--dest", str(tmp_path), check=True)
        assert (tmp_path / "f.txt").read_text() == "local bytes"
        new = _name("loc2")
        local_node.cli("session", "rename", name, new, check=True)
        assert local_node.json("session", "info", new)["id"] == sid
        refused = local_node.cli("session", "commit", new)
        assert refused.returncode == 1 and "only Docker kernels can be saved as images" in refused.stderr, refused
    finally:
        _gone(local_node, sid)


# -- pure parts (no node) -----------------------------------------------------------------------------------


def test_batch_plan_chooses_by_the_uploaded_files() -> None:
    from bai.node.agent.batch import NoCommand, plan

    client = {"clean": "*", "build": "*", "buildLog": False, "exec": "*"}  # the official client's run FILE
    assert plan("", client, ["x.py"], True) == [("clean", ""), ("build", ""), ("exec", "python3 x.py")]
    assert plan("", client, ["notes.txt", "a b.sh"], False)[-1] == ("exec", "sh 'a b.sh'")
    assert plan("", client, ["main.c", "Makefile"], True)[1:] == [("build", "make"), ("exec", "./main")]
    assert plan("", client, ["src/p.c"], True)[1:] == [("build", "cc -O2 -o ./src/p src/p.c"), ("exec", "./src/p")]
    assert plan("", {"exec": "*"}, ["p.c"], True) == [("exec", "cc -O2 -o ./p p.c && ./p")]  # bai's CLI
    assert plan("", {"exec": "ls -l"}, [], False) == [("exec", "ls -l")]
    assert plan("", {**client, "build": "make all", "exec": "./go"}, [], True)[1:] == [
        ("build", "make all"),
        ("exec", "./go"),
    ]
    assert plan("", client, [], True)[-1] == ("exec", "python3 main.py")  # Backend.AI's Python runner
    with pytest.raises(NoCommand, match="cannot tell how to run this"):
        plan("", client, ["data.csv"], True)
    with pytest.raises(NoCommand, match="has no Python"):
        plan("", client, ["x.py"], False)


def test_download_paths_stay_in_the_home() -> None:
    from bai.node.agent.download import DownloadError, kernel_path

    assert kernel_path("out.txt") == "/home/work/out.txt"
    assert kernel_path("/home/work/d/") == "/home/work/d"
    assert kernel_path("a/../b") == "/home/work/b"
    for bad in ("../x", "/etc/passwd", "/home/workx", "", "a\0b"):
        with pytest.raises(DownloadError):
            kernel_path(bad)
