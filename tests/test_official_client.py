"""The official Backend.AI client (`backend.ai-client==23.9.10`), unchanged, against a real bai node with
Docker kernels. The client exits 0 even when something fails, so these tests read its output and the
node's state (reference spec §0).

The client lives in its own virtualenv (Python 3.11, `yarl<1.17.1`): `.venv-bac/` in the checkout (what
`.ci/run` installs) or `$BAI_OFFICIAL_CLIENT` (the path of its `backend.ai` program).
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import threading
import time
import tomllib
import uuid
from pathlib import Path

import pytest

from tests.nodeproc import ROOT, Node


def official_client() -> str:
    path = os.environ.get("BAI_OFFICIAL_CLIENT") or str(ROOT / ".venv-bac" / "bin" / "backend.ai")
    if Path(path).is_file():
        return path
    reason = f"the official client is not installed at {path} (see .ci/run: backend.ai-client==23.9.10)"
    if os.environ.get("BAI_REQUIRE_DOCKER") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def official_client26() -> str:
    """The 26.9 client's `backend.ai` (`$BAI_OFFICIAL_CLIENT26` or `.venv-bac26/`: backend.ai-client==26.9.6 on
    Python 3.13, what `.ci/run` installs); missing, it fails the test in CI (`BAI_REQUIRE_DOCKER=1`), else skips."""
    path = os.environ.get("BAI_OFFICIAL_CLIENT26") or str(ROOT / ".venv-bac26" / "bin" / "backend.ai")
    if Path(path).is_file():
        return path
    reason = f"the official client 26.9 is not installed at {path} (.ci/run: backend.ai-client==26.9.6, Python 3.13)"
    if os.environ.get("BAI_REQUIRE_DOCKER") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


class Official:
    """Runs `backend.ai …` with the node's keypair, as `eval "$(bai client-env)"` would set it up."""

    def __init__(self, program: str, node: Node, cwd: Path) -> None:
        self.program = program
        creds = tomllib.loads((Path(node.env["XDG_CONFIG_HOME"]) / "bai" / "credentials.toml").read_text())
        exports = node.cli("client-env", check=True).stdout
        assert f"export BACKEND_ACCESS_KEY={creds['access_key']}" in exports
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(cwd),
            "LANG": "C.UTF-8",
            "BACKEND_ENDPOINT": node.endpoint,
            "BACKEND_ACCESS_KEY": creds["access_key"],
            "BACKEND_SECRET_KEY": creds["secret_key"],
        }
        self.cwd = cwd

    def __call__(self, *args: str, input: str | None = None, timeout: float = 120) -> str:
        """The command's output (stdout, then stderr), given `input` on stdin, run as a fork of a process that
        imported the client already (tests/official_forks.py: the same entry point, without its 1.1 s of imports
        each time); as the program itself while that process is busy (a command run beside another) or cannot
        start."""
        forks = _forks_of(self.program)
        if forks is not None and forks.lock.acquire(blocking=False):
            try:
                return forks.run(self.program, args, self.env, self.cwd, timeout, input)
            finally:
                forks.lock.release()
        return self.exec(*args, input=input, timeout=timeout)

    def exec(self, *args: str, input: str | None = None, timeout: float = 120) -> str:
        """The command's output, run as the installed program, a process of its own."""
        out = subprocess.run(
            [self.program, *args], capture_output=True, text=True, env=self.env, cwd=self.cwd, timeout=timeout,
            input=input,
        )  # fmt: skip
        return out.stdout + out.stderr

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [self.program, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=self.env,
            cwd=self.cwd,
        )


class _Forks:
    """One tests/official_forks.py process of this test process (see there), run by the client's interpreter."""

    def __init__(self, python: str) -> None:
        self.lock = threading.Lock()
        self.proc = subprocess.Popen(
            [python, str(Path(__file__).with_name("official_forks.py"))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        ready = json.loads(self.proc.stdout.readline() or "{}")
        if ready.get("ready") is not True:
            raise RuntimeError("the official client's fork server did not start")
        self.folder = Path(ready["folder"])  # (its own: it removes it when its stdin ends, however this one ends)
        atexit.register(self.stop)

    def run(
        self, program: str, args: tuple[str, ...], env: dict[str, str], cwd: Path, timeout: float, input: str | None
    ) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        out, err, given = self.folder / "out", self.folder / "err", self.folder / "in"
        given.write_text(input or "")
        request = {"program": program, "args": list(args), "env": env, "cwd": str(cwd), "timeout": timeout}
        request |= {"out": str(out), "err": str(err), "in": str(given) if input is not None else os.devnull}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer = json.loads(self.proc.stdout.readline())
        text = out.read_text(errors="replace") + err.read_text(errors="replace")
        if answer.get("timeout"):
            raise subprocess.TimeoutExpired([program, *args], timeout, output=text)
        return text

    def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()  # (it ends, and removes its folder)
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_forks: dict[str, _Forks | None] = {}


def _forks_of(program: str) -> _Forks | None:
    """The fork server for `program`'s interpreter (started on first use), or None where there is none."""
    if program not in _forks:
        python = Path(program).with_name("python")
        wanted = os.environ.get("BAI_OFFICIAL_FORKS") != "0"  # ("0": every command as the program itself)
        try:
            _forks[program] = _Forks(str(python)) if wanted and python.exists() and sys.platform == "linux" else None
        except (OSError, RuntimeError, ValueError):
            _forks[program] = None
    forks = _forks[program]
    if forks is not None and forks.proc.poll() is not None:  # (it died: the program itself from now on)
        _forks[program] = forks = None
    return forks


@pytest.fixture
def bai_client(docker_node: Node, tmp_path: Path) -> Official:
    return Official(official_client(), docker_node, tmp_path)


def test_config_shows_the_node(bai_client: Official, docker_node: Node) -> None:
    out = bai_client.exec("config")  # (the installed program itself, as a user runs it)
    assert docker_node.endpoint in out and bai_client.env["BACKEND_ACCESS_KEY"] in out
    assert bai_client("config") == out  # (a fork of the process that imported it: the same command)


def test_run_prints_the_output(bai_client: Official, docker_node: Node) -> None:
    out = bai_client("run", "--rm", "python", "-c", "print(6 * 7)")
    assert "42" in out and "exit code = 0" in out, out
    assert not [s for s in docker_node.json("session", "ls") if s["status"] == "RUNNING"]


def test_run_uploads_files_and_runs_a_batch_command(bai_client: Official) -> None:
    (bai_client.cwd / "main.py").write_text("import sys\nprint('from a file on', sys.platform)\n")
    out = bai_client("run", "--rm", "--exec", "python main.py", "python", "main.py")
    assert "from a file on linux" in out, out


def test_image_references_resolve_and_unknown_ones_say_so(bai_client: Official) -> None:
    out = bai_client("run", "--rm", "cr.backend.ai/stable/python:3.9-ubuntu20.04", "-c", "print('resolved')")
    assert "resolved" in out, out
    out = bai_client("run", "--rm", "no-such-image:1.0", "-c", "print(1)")
    assert "no agent has the image 'no-such-image:1.0'" in out, out


def test_session_create_ps_info_logs_ls_destroy(bai_client: Official, docker_node: Node) -> None:
    name = "oc-" + uuid.uuid4().hex[:6]
    out = bai_client("session", "create", "-t", name, "python")
    assert "is created and ready" in out, out
    sid = docker_node.json("session", "info", name)["id"]
    assert name in bai_client("ps")
    info = bai_client("session", "info", sid)
    assert name in info and "RUNNING" in info, info
    docker_node.cli(
        "session", "exec", name, "-c", "open('made-here.txt', 'w').write('x'); print('log line 7')", check=True
    )
    # (the agent ships output every 50 ms: the last line is stored a moment after the exec answers)
    logs = ""
    for _ in range(50):
        logs = bai_client("session", "logs", name)
        if "log line 7" in logs:
            break
        time.sleep(0.1)
    assert "log line 7" in logs, logs
    assert "made-here.txt" in bai_client("session", "ls", name)
    bai_client("session", "destroy", name)
    assert docker_node.json("session", "info", sid)["status"] == "TERMINATED"


def test_session_events_stream(bai_client: Official, docker_node: Node) -> None:
    name = "ev-" + uuid.uuid4().hex[:6]
    docker_node.cli("session", "create", "python", "--name", name, check=True)
    events = bai_client.popen("session", "events", name)
    try:
        time.sleep(5)  # subscribed (the client imports for a second or more, longer on a busy machine)
        docker_node.cli("session", "destroy", name, check=True)
        deadline = time.monotonic() + 30
        seen = ""
        assert events.stdout is not None
        os.set_blocking(events.stdout.fileno(), False)
        while "session_terminated" not in seen and time.monotonic() < deadline:
            try:
                chunk = os.read(events.stdout.fileno(), 65536)
            except BlockingIOError:
                chunk = b""
            seen += chunk.decode(errors="replace")
            time.sleep(0.2)
        assert "session_terminating" in seen and "session_terminated" in seen, seen
    finally:
        events.kill()
        events.wait()


def test_vfolder_round_trip(bai_client: Official, docker_node: Node) -> None:
    assert "Default vfolder host: local" in bai_client("vfolder", "list-hosts")
    name = "ocvf-" + uuid.uuid4().hex[:6]
    assert f'Virtual folder "{name}" is created' in bai_client("vfolder", "create", name, "local")
    assert name in bai_client("vfolder", "list")
    assert "Owner: True" in bai_client("vfolder", "info", name)
    payload = os.urandom(3 * 1024 * 1024 + 17)
    (bai_client.cwd / "blob.bin").write_bytes(payload)
    (bai_client.cwd / "empty.txt").write_bytes(b"")
    assert "Done" in bai_client("vfolder", "upload", name, "blob.bin", "empty.txt")
    (bai_client.cwd / "back").mkdir()
    out = bai_client("vfolder", "download", name, "blob.bin", "empty.txt", "--base-dir", "back")
    assert "Done" in out, out
    assert (bai_client.cwd / "back" / "blob.bin").read_bytes() == payload
    assert (bai_client.cwd / "back" / "empty.txt").read_bytes() == b""
    listed = {f["name"]: f["size"] for f in docker_node.json("vfolder", "ls-files", name)}
    assert listed == {"blob.bin": len(payload), "empty.txt": 0}
