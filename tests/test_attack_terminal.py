"""Terminals as an attacker uses them: open and close many, each leaving a command running (the review saw 30
opens/closes of `sleep 3600` leave 30 processes and 30 host ptys until the session ended), and send resize
frames no client sends (rows=10**30 killed a split cluster's stream). What must hold: when a terminal's
stream ends, its command and the jobs it started are gone and its pty is freed (counted host-wide in
/proc/sys/kernel/pty/nr); a bad resize is ignored and the terminal goes on.

Three levels: the local backend's pty (PtyProcess) served over an in-process stream, the whole node with a
real Docker kernel through the CLI (`bai session shell`), and the in-process harness's pretend shell."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bai.node.agent.terminal import PtyProcess, PtySession, serve, window_of, window_part
from bai.node.link.streams import InprocStream
from bai.node.link.wire import carried
from tests.harness import Harness
from tests.nodeproc import Node
from tests.test_terminal import Pty
from tests.test_terminal_inproc import shown


def ptys() -> int:
    return int(Path("/proc/sys/kernel/pty/nr").read_text())


def own_ptys() -> int:
    """The pty masters this process holds (host-wide counts move with other tests running meanwhile)."""
    held = 0
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            held += os.readlink(f"/proc/self/fd/{name}") == "/dev/ptmx"
    return held


def sleepers(marker: str) -> list[psutil.Process]:
    """This host's processes `sleep MARKER` (a number no other test sleeps)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if cmd[-1:] == [marker] and any(c.endswith("sleep") for c in cmd[:-1]):
            found.append(p)
    return found


async def until(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


def marker() -> str:
    return str(random.randrange(100000, 999999))


async def test_closed_local_terminals_leave_no_process_and_no_pty(tmp_path: Path) -> None:
    """30 terminals, each a shell with job control whose `sleep` job runs in a process group of its own (as an
    interactive shell's jobs do) and one more in the background; every client goes away: the processes and
    ptys are back to where they were, and none was left for the session's end."""
    n, mark = 30, marker()
    ptys_before, fds_before = own_ptys(), psutil.Process().num_fds()
    served = []
    clients = []
    for _ in range(n):
        terminal = await PtyProcess.start(
            ["/bin/sh", "-c", f"set -m; sleep {mark} & sleep {mark}; wait"], dict(os.environ), str(tmp_path), 24, 80
        )
        ours, theirs = InprocStream.pair(uuid.uuid4().hex)
        served.append(asyncio.create_task(serve(terminal, ours)))
        clients.append(theirs)
    await until(lambda: len(sleepers(mark)) == 2 * n, 10, "the terminals' commands did not start")
    assert own_ptys() >= ptys_before + n
    for client in clients:
        await client.close("the client went away")
    await asyncio.wait_for(asyncio.gather(*served), 10)  # each ended within the grace
    assert sleepers(mark) == []
    print(f"ptys {ptys_before} -> {own_ptys()}, fds {fds_before} -> {psutil.Process().num_fds()}")
    assert own_ptys() == ptys_before
    assert psutil.Process().num_fds() <= fds_before + 2


async def test_a_command_that_ignores_sighup_is_killed(tmp_path: Path) -> None:
    mark = marker()
    terminal = await PtyProcess.start(
        ["/bin/sh", "-c", f"trap '' HUP; sleep {mark} & trap '' HUP; wait"], dict(os.environ), str(tmp_path), 24, 80
    )
    await until(lambda: len(sleepers(mark)) == 1, 5, "no sleep")
    start = time.monotonic()
    await terminal.close()
    assert sleepers(mark) == [] and time.monotonic() - start < 3


async def test_the_session_of_a_terminal_is_only_its_own(tmp_path: Path) -> None:
    """Closing one terminal ends nothing of another one (same command, same session ids scheme)."""
    mark = marker()
    a = await PtyProcess.start(["sleep", mark], dict(os.environ), str(tmp_path), 24, 80)
    b = await PtyProcess.start(["sleep", mark], dict(os.environ), str(tmp_path), 24, 80)
    await until(lambda: len(sleepers(mark)) == 2, 5, "no sleeps")
    await a.close()
    assert [p.pid for p in sleepers(mark)] == [b.proc.pid]
    assert PtySession.of_leader(b.proc.pid, with_ns=False) == b.session
    await b.close()
    assert sleepers(mark) == []


@pytest.mark.parametrize(
    ("frame", "expected"),
    [
        ({"rows": 40, "cols": 120}, (40, 120)),
        ({"rows": 10**30, "cols": 80}, None),
        ({"rows": 0, "cols": 80}, None),
        ({"rows": -5, "cols": 80}, None),
        ({"rows": 1001, "cols": 80}, None),
        ({"rows": "40", "cols": 80}, None),
        ({"rows": 40.0, "cols": 80}, None),
        ({"rows": float("inf"), "cols": 80}, None),
        ({"rows": True, "cols": 80}, None),
        ({"rows": [40], "cols": 80}, None),
        ({"cols": 80}, None),
        ({}, None),
    ],
)
def test_window_of_a_resize_frame(frame: dict[str, Any], expected: tuple[int, int] | None) -> None:
    assert window_of(frame) == expected


@pytest.mark.parametrize(
    ("value", "expected"), [(40, 40), (10**30, 1000), (0, 1), (-(10**30), 1), ("40", 24), (40.5, 24), (True, 24)]
)
def test_a_terminals_first_size_is_clamped_or_the_default(value: object, expected: int) -> None:
    assert window_part(value, 24) == expected


def frame_values():
    return (
        st.integers()
        | st.floats(allow_nan=True, allow_infinity=True)
        | st.text(max_size=8)
        | st.none()
        | st.booleans()
        | st.lists(st.integers(), max_size=2)
        | st.binary(max_size=8)
    )


def travels(frame: dict[str, Any]) -> bool:
    """Whether msgpack (the link) can carry the frame."""
    try:
        carried(frame)
    except (OverflowError, TypeError, ValueError):
        return False
    return True


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.fixed_dictionaries(
            {"t": st.sampled_from(["resize", "in", "other", 5])},
            optional={"rows": frame_values(), "cols": frame_values(), "d": frame_values()},
        )
        | st.dictionaries(st.text(max_size=4), frame_values(), max_size=3),
        max_size=15,
    )
)
async def test_any_frames_leave_the_pty_working(tmp_path: Path, frames: list[dict[str, Any]]) -> None:
    """Whatever frames a client (or a manager) sends, the terminal neither raises nor ends; a good resize and
    keys after them still work."""
    terminal = await PtyProcess.start(["/bin/sh"], dict(os.environ), str(tmp_path), 24, 80)
    ours, theirs = InprocStream.pair(uuid.uuid4().hex)
    task = asyncio.create_task(serve(terminal, ours))
    try:
        for frame in frames:
            if frame.get("t") == "in" and not isinstance(frame.get("d"), bytes | str):
                pass  # (ignored by the terminal: sent all the same)
            elif frame.get("t") == "in":
                continue  # keystrokes would be typed into the shell: not this test's subject
            if not travels(frame):  # (an int over 64 bits): refused where it is sent, over either link
                with pytest.raises((OverflowError, TypeError, ValueError)):
                    await theirs.send(frame)
                continue
            await theirs.send(frame)
        await theirs.send({"t": "resize", "rows": 33, "cols": 77})
        await theirs.send({"t": "in", "d": b"stty size; echo ok-$((1+1))\n"})
        seen = await shown(theirs, b"ok-2")
        assert b"33 77" in seen
        assert not task.done()
    finally:
        await theirs.close("done")
        await asyncio.wait_for(task, 5)


async def test_a_huge_resize_on_the_harness_is_ignored(tmp_path: Path) -> None:
    """Through the manager and the agent (in-process link, pretend shell): rows=10**30 and friends are ignored,
    the stream lives, a good resize after them applies."""
    async with Harness(tmp_path) as h:
        await h.add_agent("a1")
        await h.create("term-huge")
        await h.schedule()
        row = await h.wait("term-huge", "RUNNING")
        stream = await h.ops.open_terminal(row, None, 24, 80)
        for bad in ({"rows": 10**30, "cols": 80}, {"rows": -1, "cols": 2**64}):  # msgpack carries 64 bits at most
            with pytest.raises(OverflowError):  # refused where it is sent, as over the ZeroMQ link
                await stream.send({"t": "resize", **bad})
        for bad in ({"rows": 2**63, "cols": 80}, {"rows": "x", "cols": None}, {"rows": -1, "cols": 2**64 - 1}, {}):
            await stream.send({"t": "resize", **bad})
        await stream.send({"t": "resize", "rows": 40, "cols": 120})
        await stream.send({"t": "in", "d": b"size\r"})
        await shown(stream, b"40 120")
        await stream.close("done")


async def test_opening_and_closing_terminals_never_uses_up_the_cap(tmp_path: Path) -> None:
    """Through the manager and the agent (pretend shell): 3 x MAX_TERMINALS terminals opened and closed one
    after another all open (only live ones count), and each closed one was ended (hung up)."""
    from bai.node.agent.agent import MAX_TERMINALS

    async with Harness(tmp_path) as h:
        node = await h.add_agent("a1")
        await h.create("term-churn")
        await h.schedule()
        row = await h.wait("term-churn", "RUNNING")
        for i in range(3 * MAX_TERMINALS):
            stream = await h.ops.open_terminal(row, None, 24, 80)
            await stream.send({"t": "in", "d": f"n{i}\r".encode()})
            await shown(stream, f"n{i}".encode())
            await stream.close("the client went away")
        await until(lambda: all(t.code == 129 for t in node.backend.terminals), 5, "a closed terminal still runs")
        assert len(node.backend.terminals) == 3 * MAX_TERMINALS
        await until(lambda: h.agent("a1")._terminals == {}, 5, "closed terminals still counted")


def kill_cli(term: Pty) -> None:
    with pytest.raises(ProcessLookupError):
        for _ in range(50):
            os.kill(term.pid, signal.SIGKILL)
            os.waitpid(term.pid, os.WNOHANG)
            time.sleep(0.02)
    os.close(term.fd)


def test_closed_docker_terminals_leave_no_process_and_no_pty(docker_node: Node) -> None:
    """A real Docker kernel: 12 terminals (`bai session shell`), half a shell running `sleep` as a job, half
    `sleep` as the command; every CLI is killed (the client goes away): within seconds no `sleep` is left and
    the host's pty count is back; a terminal opened afterwards works."""
    name = f"term-leak-{uuid.uuid4().hex[:6]}"
    docker_node.cli("session", "create", "python", "--name", name, check=True)
    mark = marker()
    try:
        before = ptys()
        terms = []
        for i in range(12):
            if i % 2:
                terms.append(Pty(docker_node, "session", "shell", name, "--", "sleep", mark))
            else:
                term = Pty(docker_node, "session", "shell", name)
                terms.append(term)
        for i, term in enumerate(terms):
            if not i % 2:
                term.prompt()
                term.type(f"sleep {mark}\r")
        deadline = time.monotonic() + 30
        while len(sleepers(mark)) < 12:
            assert time.monotonic() < deadline, f"{len(sleepers(mark))} of 12 terminals' sleeps started"
            time.sleep(0.1)
        peak = ptys()
        for term in terms:
            kill_cli(term)
        deadline = time.monotonic() + 15
        while sleepers(mark) or ptys() > before + 2:
            assert time.monotonic() < deadline, f"{len(sleepers(mark))} sleeps, ptys {before} -> {peak} -> {ptys()}"
            time.sleep(0.1)
        print(f"ptys {before} -> {peak} -> {ptys()}")
        again = Pty(docker_node, "session", "shell", name)
        again.prompt()
        again.type("echo fine=$((40+2)); exit 0\r")
        again.read_until("fine=42")
        assert again.wait() == 0
    finally:
        docker_node.cli("session", "destroy", name)
