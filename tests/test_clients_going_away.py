"""Clients that go away, on a real docker node.

`bai session run` owns the session it created: a signal (Ctrl-C, SIGTERM, `timeout`) or an error ends
it (cancelled before it started, destroyed after) unless --keep, says so on stderr and exits 128 + the
signal's number; a session it found already there (get-or-create by name) is never its to end.
A client that drops an event stream, a followed log or a download is normal for the node: no ERROR and
no traceback in its log; an empty vfolder file downloads as an empty file.
"""

from __future__ import annotations

import json
import signal
import socket
import struct
import subprocess
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.nodeproc import Node, admin_keys, signed_request


def all_memory(node: Node) -> str:
    """All of the agent's memory: a session asking for it could run there (more would be refused at
    creation), but stays PENDING (no-available-instances) while another session holds some."""
    (agent,) = node.json("agent", "ls")
    return agent["availableSlots"]["mem"]


def info(node: Node, name: str) -> dict[str, Any] | None:
    result = node.cli("session", "info", name, "--json")
    return json.loads(result.stdout) if result.returncode == 0 else None


def wait_status(node: Node, name: str, statuses: set[str], timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        seen = info(node, name)
        if seen is not None and seen["status"] in statuses:
            return seen
        time.sleep(0.1)
    raise AssertionError(f"session {name} is not {statuses} after {timeout} s: {seen and seen['status']}")


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"`bai session run` did not end after the signal:\n{err}") from None
    return proc.returncode, err


def started_code(proc: subprocess.Popen[str]) -> None:
    """Wait until the code `run` started printed its first line."""
    assert proc.stdout is not None
    assert proc.stdout.readline() == "started\n"


SLEEPER = "import time\nprint('started', flush=True)\ntime.sleep(120)"


def signal_once_started(proc: subprocess.Popen[str], sig: int) -> tuple[int, str]:
    """Send `sig` once the code printed its first line; the exit status and stderr of `run`."""
    try:
        started_code(proc)
        proc.send_signal(sig)
        return finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()


# -- `bai session run` and the session it created -------------------------------------------------------


@pytest.mark.parametrize(
    ("sig", "code", "word"), [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")]
)
def test_a_signal_while_the_session_waits_cancels_it(docker_node: Node, sig: int, code: int, word: str) -> None:
    name, holder = f"pending-{sig}", f"holder-{sig}"
    docker_node.cli("session", "create", "python", "--name", holder, check=True)
    proc = docker_node.popen("session", "run", "python", "--name", name, "--mem", all_memory(docker_node), "-c", "1")
    try:
        wait_status(docker_node, name, {"PENDING"})
        time.sleep(0.5)  # `run` waits for it now
        proc.send_signal(sig)
        rc, err = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
        docker_node.cli("session", "destroy", name)
        docker_node.cli("session", "destroy", holder)
    assert rc == code, err
    assert f"bai: session {name} (" in err and f"cancelled ({word} before it started)" in err, err
    assert "Traceback" not in err
    assert wait_status(docker_node, name, {"CANCELLED"}, timeout=5)["statusInfo"] == "user-requested"


def test_a_signal_after_the_code_started_destroys_the_session(docker_node: Node) -> None:
    name = "ran-then-term"
    proc = docker_node.popen("session", "run", "python", "--name", name, "-c", SLEEPER)
    rc, err = signal_once_started(proc, signal.SIGTERM)
    assert rc == 143, err
    assert f"session {name} (" in err and "destroyed (terminated)" in err, err
    wait_status(docker_node, name, {"TERMINATED"})


def test_a_second_ctrl_c_stops_waiting_and_destroys_the_session(docker_node: Node) -> None:
    name = "ran-then-int"
    # the code ignores the first Ctrl-C (the kernel's interrupt), so only the second one ends the wait
    code = (
        "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nprint('started', flush=True)\n"
        "time.sleep(120)"
    )
    proc = docker_node.popen("session", "run", "python", "--name", name, "-c", code)
    try:
        started_code(proc)
        proc.send_signal(signal.SIGINT)
        time.sleep(1.0)
        assert proc.poll() is None, "the first Ctrl-C only interrupts the code"
        proc.send_signal(signal.SIGINT)
        rc, err = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 130, err
    assert "destroyed (interrupted)" in err, err
    wait_status(docker_node, name, {"TERMINATED"})


def test_keep_leaves_the_session_and_says_so(docker_node: Node) -> None:
    name = "kept-after-term"
    proc = docker_node.popen("session", "run", "python", "--keep", "--name", name, "-c", SLEEPER)
    try:
        started_code(proc)
        proc.send_signal(signal.SIGTERM)
        rc, err = finish(proc)
        assert rc == 143, err
        assert f"session {name} (" in err and "kept (terminated; --keep)" in err, err
        assert wait_status(docker_node, name, {"RUNNING"}, timeout=5)
        # and while it was waiting (for the memory the kept one holds): kept PENDING
        pending, mem = f"{name}-2", all_memory(docker_node)
        proc = docker_node.popen("session", "run", "python", "--keep", "--name", pending, "--mem", mem, "-c", "1")
        wait_status(docker_node, pending, {"PENDING"})
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        rc, err = finish(proc)
        assert rc == 130, err
        assert "kept (interrupted before it started; --keep): it is PENDING" in err, err
        assert info(docker_node, pending)["status"] == "PENDING"
    finally:
        if proc.poll() is None:
            proc.kill()
        docker_node.cli("session", "destroy", f"{name}-2")  # first: it would start once the memory is free
        docker_node.cli("session", "destroy", name)


def test_a_session_run_found_already_there_is_never_ended_by_it(docker_node: Node) -> None:
    name = "not-runs-own"
    docker_node.cli("session", "create", "python", "--name", name, check=True)
    try:
        done = docker_node.cli("session", "run", "python", "--name", name, "-c", "print('in a reused session')")
        assert done.returncode == 0 and done.stdout == "in a reused session\n", done.stderr
        assert info(docker_node, name)["status"] == "RUNNING", "run ended a session it did not create"
        proc = docker_node.popen("session", "run", "python", "--name", name, "-c", SLEEPER)
        rc, err = signal_once_started(proc, signal.SIGTERM)
        assert rc == 143, err
        assert "was there before this run: left as it is" in err, err
        assert info(docker_node, name)["status"] == "RUNNING"
    finally:
        docker_node.cli("session", "destroy", name, check=True)


# -- clients that drop a stream or a download ----------------------------------------------------------


def _raw_get(node: Node, path: str, signed: bool = True) -> socket.socket:
    """A GET sent on a plain socket (to drop it mid-stream); returns the socket once the answer began."""
    from bai import API_VERSION
    from bai.common import auth

    host = f"127.0.0.1:{node.port}"
    head = f"GET {path} HTTP/1.1\r\nHost: {host}\r\n"
    if signed:
        access_key, secret_key = admin_keys(node)
        date = auth.now_header()
        sig = auth.sign(secret_key, "GET", path, date, host, "application/octet-stream", API_VERSION)
        head += (
            f"Date: {date}\r\nX-BackendAI-Version: {API_VERSION}\r\nContent-Type: application/octet-stream\r\n"
            f"Authorization: {auth.authorization_header(access_key, sig)}\r\n"
        )
    sock = socket.create_connection(("127.0.0.1", node.port), timeout=30)
    sock.sendall((head + "\r\n").encode())
    first = sock.recv(64)
    assert first.startswith(b"HTTP/1.1 200"), first
    return sock


def _drop(sock: socket.socket) -> None:
    """Close abruptly: a reset, as a killed client's kernel sends."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def _log_since(node: Node, offset: int) -> str:
    return node.log_path.read_text()[offset:]


def _assert_quiet(text: str) -> None:
    bad = [line for line in text.splitlines() if " ERROR " in line or "Traceback" in line]
    assert not bad, "the node logged an error for a client that went away:\n" + text[-4000:]


def test_dropped_streams_are_not_errors(docker_node: Node) -> None:
    offset = len(docker_node.log_path.read_text())
    chatty = "chatty-batch"
    loop = "while true; do echo tick; sleep 0.2; done"
    docker_node.cli(
        "session", "create", "python", "--name", chatty, "--type", "batch", "--startup-command", loop, check=True
    )  # fmt: skip
    try:
        socks = [
            _raw_get(docker_node, "/events/session"),
            _raw_get(docker_node, "/bai/events"),
            _raw_get(docker_node, f"/session/{chatty}/logs?follow=true"),
            _raw_get(docker_node, f"/bai/events?topics=logs&session={chatty}"),
        ]
        for sock in socks:
            _drop(sock)
        # activity on every stream: events of another session, the batch's output
        docker_node.cli("session", "create", "python", "--name", "poke-events", check=True)
        docker_node.cli("session", "destroy", "poke-events", check=True)
        time.sleep(2.0)
    finally:
        docker_node.cli("session", "destroy", chatty, check=True)
    time.sleep(1.0)
    _assert_quiet(_log_since(docker_node, offset))
    assert docker_node.proc is not None and docker_node.proc.poll() is None


def test_empty_and_dropped_downloads_are_not_errors(docker_node: Node, tmp_path: Path) -> None:
    offset = len(docker_node.log_path.read_text())
    docker_node.cli("vfolder", "create", "gone-dl", check=True)
    (tmp_path / "empty").write_bytes(b"")
    (tmp_path / "big").write_bytes(b"x" * (32 << 20))
    for f in ("empty", "big"):
        docker_node.cli("vfolder", "upload", "gone-dl", str(tmp_path / f), check=True)
    dest = tmp_path / "dl"
    dest.mkdir()
    got = docker_node.cli("vfolder", "download", "gone-dl", "empty", "--dst", str(dest))
    assert got.returncode == 0, got.stderr
    assert (dest / "empty").read_bytes() == b""
    # a client that reads the start of a large file and goes away
    status, grant = signed_request(
        docker_node, "POST", "/folders/gone-dl/request-download", *admin_keys(docker_node), {"path": "big"}
    )
    assert status == 200, grant
    sock = _raw_get(docker_node, f"/folders/_/download?token={quote(grant['token'])}", signed=False)
    _drop(sock)
    time.sleep(1.0)
    # the node still serves downloads after both
    again = docker_node.cli("vfolder", "download", "gone-dl", "big", "--dst", str(dest))
    assert again.returncode == 0 and (dest / "big").stat().st_size == 32 << 20, again.stderr
    _assert_quiet(_log_since(docker_node, offset))
