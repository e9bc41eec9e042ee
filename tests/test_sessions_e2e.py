"""Sessions end to end through the real CLI against a real node, on both kernel backends.

What travels the data path (output, input, interrupts, logs) runs on every node of the matrix (each backend,
in one process and over the ZeroMQ link); the rest on two of them, which between them have each backend and
each link (`EACH_ONCE`)."""

from __future__ import annotations

import signal
import time
from datetime import UTC, datetime

import pytest

from tests.nodeproc import Node, wait_status

EACH_ONCE = pytest.mark.parametrize("node", ["local", "docker-zmq"], indirect=True)


def test_run_prints_output_and_exits_zero(node: Node) -> None:
    result = node.cli("session", "run", "python", "-c", "print(42)")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "42\n"


@EACH_ONCE
def test_exit_codes_follow_the_code(node: Node) -> None:
    crashed = node.cli("session", "run", "python", "-c", "1/0")
    assert crashed.returncode == 1
    assert "ZeroDivisionError" in crashed.stderr
    assert node.cli("session", "run", "python", "-c", "raise SystemExit(3)").returncode == 3
    assert node.cli("session", "run", "python", "-c", "exit(3)").returncode == 3


def test_stdout_and_stderr_stay_apart(node: Node) -> None:
    result = node.cli("session", "run", "python", "-c", "import sys; print('out'); print('err', file=sys.stderr)")
    assert result.stdout == "out\n"
    assert "err\n" in result.stderr


def test_output_streams_before_the_code_ends(node: Node) -> None:
    proc = node.popen(
        "session",
        "run",
        "python",
        "-q",
        "-c",
        "import time\nprint('before', flush=True)\ntime.sleep(3)\nprint('after')",
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()
    got_first = time.monotonic()
    second = proc.stdout.readline()
    got_second = time.monotonic()
    assert proc.wait(60) == 0
    assert (first, second) == ("before\n", "after\n")
    # 'before' reached us while the kernel still slept: well before 'after'
    assert got_second - got_first >= 2.0


@EACH_ONCE
def test_namespace_persists_across_executions(node: Node) -> None:
    name = f"ns-{node.backend}"
    node.cli("session", "create", "python", "--name", name, check=True)
    try:
        assert node.cli("session", "exec", name, "-c", "x = 41", check=True).stdout == ""
        assert node.cli("session", "exec", name, "-c", "x += 1; print(x)", check=True).stdout == "42\n"
    finally:
        node.cli("session", "destroy", name, check=True)


def test_input_reaches_waiting_code(node: Node) -> None:
    result = node.cli("session", "run", "python", "-c", "name = input('who? ')\nprint('hello', name)", input="bob\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "who? hello bob\n"


def test_input_at_the_end_of_stdin_raises_eof_error(node: Node) -> None:
    """As Python does: input() at the end of input raises EOFError (it returned '' before)."""
    code = (
        "first = input()\n"
        "try:\n"
        "    input()\n"
        "except EOFError:\n"
        "    print('EOF after', repr(first))\n"
        "else:\n"
        "    print('no EOF')\n"
    )
    result = node.cli("session", "run", "python", "-c", code, input="only line\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "EOF after 'only line'\n"
    bare = node.cli("session", "run", "python", "-c", "input()", input="")
    assert bare.returncode == 1 and "EOFError" in bare.stdout + bare.stderr


def test_interrupt_stops_running_code(node: Node) -> None:
    proc = node.popen(
        "session", "run", "python", "-q", "-c", "import time\nprint('go', flush=True)\ntime.sleep(60)\nprint('never')"
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == "go\n"
    started = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert time.monotonic() - started < 15
    assert proc.returncode == 130
    assert "never" not in out
    assert "KeyboardInterrupt" in err


@EACH_ONCE
def test_batch_command(node: Node) -> None:
    result = node.cli("session", "run", "python", "--", "sh", "-c", "echo hi; echo oops >&2; exit 4")
    assert result.returncode == 4
    assert result.stdout == "hi\n"
    assert "oops" in result.stderr


@EACH_ONCE
def test_run_a_file(node: Node, tmp_path) -> None:
    script = tmp_path / "job.py"
    script.write_text("import os\nprint('cwd has', sorted(os.listdir('.')))\n")
    result = node.cli("session", "run", "python", str(script))
    assert result.returncode == 0, result.stderr
    assert "job.py" in result.stdout


@EACH_ONCE
def test_env_reaches_the_kernel(node: Node) -> None:
    result = node.cli(
        "session",
        "run",
        "python",
        "--env",
        "GREETING=hi there",
        "-c",
        "import os; print(os.environ['GREETING'], os.environ['BACKENDAI_SESSION_NAME'])",
        "--name",
        f"env-{node.backend}",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"hi there env-{node.backend}\n"


@EACH_ONCE
def test_logs_outlive_the_session(node: Node) -> None:
    name = f"logs-{node.backend}"
    node.cli("session", "run", "python", "--name", name, "-c", "print('kept in the log')", check=True)
    info = wait_status(node, name, "TERMINATED")  # `run` lets the manager finish the clean-up
    assert info["statusInfo"] == "user-requested"
    assert "kept in the log" in node.cli("session", "logs", name, check=True).stdout


def test_logs_follow_streams_until_the_end(node: Node) -> None:
    name = f"follow-{node.backend}"
    node.cli("session", "create", "python", "--name", name, check=True)
    follower = node.popen("session", "logs", "-f", name)
    runner = node.popen(
        "session",
        "exec",
        name,
        "-c",
        "import time\nfor i in range(3):\n print('tick', i, flush=True)\n time.sleep(0.3)",
    )
    assert runner.wait(60) == 0
    assert follower.stdout is not None
    seen = [follower.stdout.readline() for _ in range(3)]
    assert seen == ["tick 0\n", "tick 1\n", "tick 2\n"]
    node.cli("session", "destroy", name, check=True)
    follower.wait(30)  # follow ends when the session does
    assert follower.returncode == 0


@EACH_ONCE
def test_destroy_while_running(node: Node) -> None:
    name = f"busy-{node.backend}"
    node.cli("session", "create", "python", "--name", name, check=True)
    runner = node.popen("session", "exec", name, "-c", "import time\nprint('working', flush=True)\ntime.sleep(120)")
    assert runner.stdout is not None
    assert runner.stdout.readline() == "working\n"
    node.cli("session", "destroy", name, check=True)
    assert runner.wait(30) != 0  # the execution ended with the session
    info = node.json("session", "info", name)
    assert info["status"] == "TERMINATED"
    assert [t["status"] for t in info["transitions"]] == [
        "PENDING",
        "SCHEDULED",
        "PREPARING",
        "RUNNING",
        "TERMINATING",
        "TERMINATED",
    ]


@EACH_ONCE
def test_create_is_get_or_create_by_name(node: Node) -> None:
    name = f"same-{node.backend}"
    first = node.json("session", "create", "python", "--name", name)
    second = node.json("session", "create", "python", "--name", name)
    try:
        assert first["sessionId"] == second["sessionId"]
        listed = [s for s in node.json("session", "ls") if s["name"] == name]
        assert len(listed) == 1
    finally:
        node.cli("session", "destroy", name, check=True)


@EACH_ONCE
def test_unknown_image_is_refused_or_cancels_with_a_reason(node: Node) -> None:
    name = f"noimg-{node.backend}"
    result = node.cli("session", "run", "nope", "--name", name, "-c", "print(1)")
    if node.backend == "docker":  # every agent must have the image: refused before a session exists
        assert result.returncode == 1
        assert "no agent has the image 'nope'" in result.stderr and "bai-python:3.11" in result.stderr
        assert node.cli("session", "info", name).returncode != 0
        return
    assert result.returncode == 125
    assert "could not start" in result.stderr
    info = node.json("session", "info", name)
    assert info["status"] == "CANCELLED"
    assert info["statusInfo"] == "failed-to-start"
    assert "nope" in info["statusData"]["error"]["repr"]
    text = node.cli("session", "info", name, check=True).stdout
    assert "failed-to-start" in text and "'nope'" in text
    assert name not in [s["name"] for s in node.json("session", "ls")]  # nothing left running


@EACH_ONCE
def test_ls_and_info_show_sessions(node: Node) -> None:
    name = f"shown-{node.backend}"
    node.cli("session", "create", "python", "--name", name, "--cpu", "0.5", "--mem", "300m", check=True)
    try:
        table = node.cli("session", "ls", check=True).stdout
        assert name in table and "RUNNING" in table
        info = node.json("session", "info", name)
        assert info["requestedSlots"] == {"cpu": "0.5", "mem": str(300 * 1024 * 1024)}
        assert info["agent"] == node.agent_id
        text = node.cli("session", "info", name, check=True).stdout
        assert "RUNNING" in text and "cpu 0.5" in text
    finally:
        node.cli("session", "destroy", name, check=True)
    assert name in node.cli("session", "ls", "--all", check=True).stdout
    assert name not in node.cli("session", "ls", check=True).stdout


@EACH_ONCE
def test_agent_and_image_listing(node: Node) -> None:
    agents = node.json("agent", "ls")
    assert [a["id"] for a in agents] == [node.agent_id]
    assert agents[0]["status"] == "ALIVE" and agents[0]["backend"] == node.backend
    seen = datetime.fromisoformat(agents[0]["lastSeen"])
    assert (datetime.now(UTC) - seen).total_seconds() < 10  # heartbeats keep it fresh, on both links
    assert int(agents[0]["availableSlots"]["cpu"]) >= 1
    images = node.json("image", "ls")
    assert images and all(i["agent"] == node.agent_id for i in images)
    if node.backend == "docker":
        assert any(i["name"] == "bai-python:3.11" or "python" in i["aliases"] for i in images)


@EACH_ONCE
def test_kernel_that_cannot_start_cancels_the_session(node: Node) -> None:
    # a broken PYTHONHOME makes the kernel's Python die at start, in a container or as a process
    name = f"dies-{node.backend}"
    result = node.cli("session", "run", "python", "--name", name, "--env", "PYTHONHOME=/nonexistent", "-c", "1")
    assert result.returncode == 125
    info = node.json("session", "info", name)
    assert info["status"] == "CANCELLED"
    assert info["statusInfo"] == "failed-to-start"
    assert info["statusData"]["error"]["repr"]
    assert "PREPARING" in [t["status"] for t in info["transitions"]]


@EACH_ONCE
def test_kernel_that_exits_mid_run_ends_the_session(node: Node) -> None:
    name = f"exits-{node.backend}"
    result = node.cli(
        "session", "run", "python", "--name", name, "-c", "import os\nprint('bye', flush=True)\nos._exit(5)"
    )
    assert result.returncode == 5
    assert result.stdout == "bye\n"
    info = wait_status(node, name, "TERMINATED")
    assert info["statusInfo"] == "self-terminated"
    assert info["exitCode"] == 5


@EACH_ONCE
def test_a_session_that_does_not_fit_waits_and_says_why(node: Node) -> None:
    big, small, holder = f"huge-{node.backend}", f"small-{node.backend}", f"holder-{node.backend}"
    # all of the agent's memory while another session holds some: it fits the agent, not now (a request
    # more than any agent has is refused at creation instead)
    (agent,) = node.json("agent", "ls")
    all_mem = agent["availableSlots"]["mem"]
    node.cli("session", "create", "python", "--name", holder, check=True)
    node.cli("session", "create", "python", "--name", big, "--mem", all_mem, "--no-wait", check=True)
    try:
        info = wait_status(node, big, "PENDING")
        deadline = time.monotonic() + 10
        while not info["statusInfo"] and time.monotonic() < deadline:
            time.sleep(0.1)
            info = node.json("session", "info", big)
        assert info["statusInfo"] == "no-available-instances"
        assert "mem" in info["statusData"]["scheduler"]["msg"]
        assert info["queuePosition"] == 1
        text = node.cli("session", "info", big, check=True).stdout
        assert "no-available-instances" in text and "position 1" in text
        # the session that cannot start does not hold up the one behind it
        assert node.cli("session", "run", "python", "--name", small, "-c", "print('past it')").stdout == "past it\n"
        assert node.json("session", "info", big)["status"] == "PENDING"
        # `run` without a terminal says why it waits
        waiting = node.popen("session", "run", "python", "--name", f"{big}-2", "--mem", all_mem, "-c", "1")
        assert waiting.stderr is not None
        line = waiting.stderr.readline()
        waiting.kill()
        waiting.wait()
        assert "PENDING" in line and "no-available-instances" in line
    finally:
        node.cli("session", "destroy", f"{big}-2")
        node.cli("session", "destroy", big, check=True)
        node.cli("session", "destroy", holder)
    info = node.json("session", "info", big)
    assert info["status"] == "CANCELLED" and info["statusInfo"] == "user-requested"


@EACH_ONCE
def test_events_follow_a_session_to_its_end(node: Node) -> None:
    name = f"watched-{node.backend}"
    node.cli("session", "create", "python", "--name", name, "--no-wait", check=True)
    watcher = node.popen("session", "events", name)
    time.sleep(1.0)  # let the watcher subscribe
    wait_status(node, name, "RUNNING")
    node.cli("session", "destroy", name, check=True)
    out, err = watcher.communicate(timeout=30)
    assert watcher.returncode == 0, err
    events = [line.split()[2] for line in out.splitlines()]
    assert events[-2:] == ["session_terminating", "session_terminated"]
    assert "user-requested" in out.splitlines()[-1]
