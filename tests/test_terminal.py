"""A terminal in a kernel: `bai session shell` driven through a real pseudo-terminal (as a user's terminal
would), on every node kind (Docker and local kernels, combined and split over ZeroMQ), an image with only
/bin/sh, and Backend.AI's own client's `stream_pty`."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.nodeproc import BUSYBOX_IMAGE, Node
from tests.test_official_client import Official, official_client


class Pty:
    """`bai ARGS` on a pseudo-terminal of `rows` × `cols`: type into it, read what it shows."""

    def __init__(self, node: Node, *args: str, rows: int = 24, cols: int = 80) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the CLI, with the pty as its terminal
            try:
                fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))  # before the CLI looks
                os.chdir(node.base)
                os.execve(sys.executable, [sys.executable, "-m", "bai", *args], node.env)
            finally:
                os._exit(127)
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.seen = b""
        self.code: int | None = None

    def read_until(self, text: str, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        while text.encode() not in self.seen:
            left = deadline - time.monotonic()
            if left <= 0 or not self._read(left):
                raise AssertionError(f"{text!r} not shown; the terminal shows:\n{self.seen.decode(errors='replace')}")
        return self.seen.decode(errors="replace")

    def prompt(self, timeout: float = 30) -> None:
        """Wait for the shell's first words (its prompt), then for it to stop talking: ready for input."""
        deadline = time.monotonic() + timeout
        while not self.seen.strip():
            if time.monotonic() > deadline or not self._read(deadline - time.monotonic()):
                raise AssertionError("the shell showed nothing")
        quiet = len(self.seen)
        while True:
            self._read(0.3)
            if len(self.seen) == quiet:
                return
            quiet = len(self.seen)

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], min(timeout, 0.5))
        if not ready:
            return True
        try:
            data = os.read(self.fd, 65536)
        except OSError:  # the CLI exited (EIO)
            return False
        if not data:
            return False
        self.seen += data
        return True

    def type(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def resize(self, rows: int, cols: int) -> None:
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def wait(self, timeout: float = 30) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._read(0.1)
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                while self._read(0.05):  # what is left to show
                    if not select.select([self.fd], [], [], 0)[0]:
                        break
                os.close(self.fd)
                self.code = os.waitstatus_to_exitcode(status)
                return self.code
        os.kill(self.pid, 9)
        raise AssertionError(f"the CLI did not end; the terminal shows:\n{self.seen.decode(errors='replace')}")


@pytest.fixture
def session(node: Node) -> Iterator[str]:
    name = f"term-{node.backend}-{uuid.uuid4().hex[:6]}"
    node.cli("session", "create", "python", "--name", name, check=True)
    yield name
    node.cli("session", "destroy", name)


def test_a_shell_runs_commands_and_its_exit_status_is_the_clis(node: Node, session: str) -> None:
    term = Pty(node, "session", "shell", session)
    term.prompt()
    term.type("echo answer=$((6 * 7)); tty\r")
    shown = term.read_until("answer=42")
    term.read_until("/dev/pts/")  # the shell has a real terminal
    term.type("exit 3\r")
    assert term.wait() == 3, shown


def test_the_window_size_follows_and_ctrl_c_reaches_the_kernel(node: Node, session: str) -> None:
    term = Pty(node, "session", "shell", session, rows=30, cols=100)
    term.prompt()
    term.type("stty size\r")
    term.read_until("30 100")
    term.resize(40, 120)  # the CLI gets SIGWINCH and passes the new size on
    time.sleep(0.5)
    term.type("stty size\r")
    term.read_until("40 120")
    term.type("sleep 60; echo not-$((0))-interrupted\r")
    time.sleep(1.0)
    term.type("\x03")  # Ctrl-C: the foreground `sleep` in the kernel is interrupted, not the CLI
    term.type("echo status=$?\r")
    term.read_until("status=130")
    assert "not-0-interrupted" not in term.seen.decode(errors="replace")
    term.type("(exit 7); exit\r")
    assert term.wait() == 7  # the shell's status: that of its last command


def test_a_command_instead_of_the_shell_and_piped_input(node: Node, session: str) -> None:
    run = node.cli("session", "shell", session, "--", "sh", "-c", "read line; echo got:$line; exit 5", input="hi\n")
    assert run.returncode == 5, run.stderr
    assert "got:hi" in run.stdout


def test_no_terminal_in_a_session_that_is_not_running(node: Node) -> None:
    name = f"noterm-{node.backend}-{uuid.uuid4().hex[:6]}"
    node.cli("session", "create", "python", "--type", "batch", "--startup-command", "true", "--name", name, "--wait")
    result = node.cli("session", "shell", name)
    assert result.returncode == 1 and "needs a running session" in result.stderr


def test_an_image_with_only_sh(docker_node: Node, busybox_image: str) -> None:
    name = f"term-bb-{uuid.uuid4().hex[:6]}"
    docker_node.cli("session", "create", BUSYBOX_IMAGE, "--name", name, check=True)
    try:
        term = Pty(docker_node, "session", "shell", name)
        term.prompt()
        term.type("echo shell=$0\r")
        term.read_until("shell=sh")
        term.type("exit 4\r")
        assert term.wait() == 4
    finally:
        docker_node.cli("session", "destroy", name)


STREAM_PTY = """
import asyncio, base64, json, sys
from ai.backend.client.session import AsyncSession

async def main():
    async with AsyncSession() as api:
        async with api.ComputeSession(sys.argv[1]).stream_pty() as stream:
            # (StreamPty.resize() of 23.9 fails on its own attribute: send the same frame directly)
            await stream.send_str(json.dumps({"type": "resize", "rows": 20, "cols": 60}))
            keys = base64.b64encode(b"stty size; echo via-$((40+2))\\r").decode()
            await stream.send_str(json.dumps({"type": "stdin", "chars": keys}))
            seen = b""
            async for msg in stream:
                frame = json.loads(msg.data)
                if frame["type"] == "out":
                    seen += base64.b64decode(frame["data"])
                if b"via-42" in seen and b"20 60" in seen:
                    break
            print(seen.decode(errors="replace"))

asyncio.run(main())
"""


def test_the_official_clients_stream_pty(docker_node: Node, tmp_path: Path) -> None:
    program = official_client()
    client = Official(program, docker_node, tmp_path)
    name = f"term-bac-{uuid.uuid4().hex[:6]}"
    docker_node.cli("session", "create", "python", "--name", name, check=True)
    try:
        run = subprocess.run(
            [str(Path(program).parent / "python"), "-c", STREAM_PTY, name],
            capture_output=True,
            text=True,
            env=client.env,
            timeout=60,
        )
        assert run.returncode == 0, run.stderr
        assert "via-42" in run.stdout and "20 60" in run.stdout
    finally:
        docker_node.cli("session", "destroy", name)


def test_the_terminal_ends_with_its_session_and_says_why(node: Node) -> None:
    name = f"term-end-{node.backend}-{uuid.uuid4().hex[:6]}"
    node.cli("session", "create", "python", "--name", name, check=True)
    term = Pty(node, "session", "shell", name)
    term.prompt()
    node.cli("session", "destroy", name, check=True)
    assert term.wait() == 1
    assert f"session {name} ended (user-requested)" in term.seen.decode(errors="replace")
