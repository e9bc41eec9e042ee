"""Runs in one session are served one at a time, in arrival order, and kept apart by run id: a second run
waits its turn (and says behind which run), sees only its own output, an interrupt reaches only the run
that asked, and a run cancelled while it waits leaves the queue. Over the CLI (WebSocket), the polling
API and the official client."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from bai.node.agent.channel import MAX_WAITING, Channel, ChannelError
from tests.nodeproc import Node, admin_keys, signed_request
from tests.test_official_client import Official, official_client

# -- the channel: queue and routing (no kernel) ----------------------------------------------------------


class FakeChannel(Channel):
    """A channel whose kernel is the test: it records what was started, interrupted and typed."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []
        super().__init__(lambda kind, text: self.log.append((kind, text)))
        self.started: list[str] = []
        self.interrupts = 0
        self.inputs: list[str] = []

    async def _start(self, mode: str, code: str) -> None:
        self.started.append(code)

    async def send_input(self, data: str) -> None:
        self.inputs.append(data)

    async def interrupt(self) -> None:
        self.interrupts += 1


def out(text: str) -> dict[str, Any]:
    return {"t": "stdout", "d": text}


def finished(code: int = 0) -> dict[str, Any]:
    return {"t": "finished", "exit": code}


def run(coro):
    return asyncio.run(coro)


async def next_result(ch: Channel, run_id: str, flush: float) -> dict[str, Any]:
    """The result as the API shows it, plus whether the run was cancelled while it waited."""
    result = await ch.next_result(run_id, flush)
    return {**result.to_api(), "cancelled": result.cancelled}


def test_a_second_run_waits_and_each_run_sees_only_its_own_output() -> None:
    async def go() -> None:
        ch = FakeChannel()
        await ch.start_run("r1", "query", "first()")
        await ch.start_run("r2", "query", "second()")
        assert ch.started == ["first()"]  # the second has not reached the kernel
        ch.feed(out("from the first\n"))
        waiting = await next_result(ch, "r2", 0.05)
        assert waiting["status"] == "continued" and waiting["console"] == []
        assert waiting["queue"] == {"behind": "r1", "ahead": 1}
        first = await next_result(ch, "r1", 0.05)
        assert first["console"] == [["stdout", "from the first\n"]] and "queue" not in first
        ch.feed(out("more of the first\n"))
        ch.feed(finished(0))
        await asyncio.sleep(0)  # the next run starts in the background
        assert ch.started == ["first()", "second()"]
        ch.feed(out("from the second\n"))
        ch.feed(finished(3))
        second = await next_result(ch, "r2", 0.05)
        assert second["console"] == [["stdout", "from the second\n"]]
        assert (second["status"], second["exitCode"]) == ("finished", 3)
        first = await next_result(ch, "r1", 0.05)
        assert first["console"] == [["stdout", "more of the first\n"]]
        assert (first["status"], first["exitCode"]) == ("finished", 0)
        assert ch.runs == {}  # both ends were read: nothing kept

    run(go())


def test_runs_start_in_arrival_order_and_say_how_many_are_ahead() -> None:
    async def go() -> None:
        ch = FakeChannel()
        for i in range(4):
            await ch.start_run(f"r{i}", "query", f"code{i}")
        assert [(await next_result(ch, f"r{i}", 0.01))["queue"] for i in (1, 2, 3)] == [
            {"behind": "r0", "ahead": 1},
            {"behind": "r0", "ahead": 2},
            {"behind": "r0", "ahead": 3},
        ]
        for _ in range(4):
            ch.feed(finished())
            await asyncio.sleep(0)
        assert ch.started == ["code0", "code1", "code2", "code3"]

    run(go())


def test_interrupting_a_waiting_run_removes_it_and_leaves_the_running_one_alone() -> None:
    async def go() -> None:
        ch = FakeChannel()
        await ch.start_run("r1", "query", "long()")
        await ch.start_run("r2", "query", "cancelled()")
        await ch.start_run("r3", "query", "third()")
        assert await ch.interrupt_run("r2") is True
        assert ch.interrupts == 0  # the running run was not touched
        ended = await next_result(ch, "r2", 0.05)
        assert (ended["status"], ended["exitCode"], ended["cancelled"]) == ("finished", 130, True)
        assert "cancelled before it ran" in ended["console"][0][1]
        assert (await next_result(ch, "r3", 0.01))["queue"] == {"behind": "r1", "ahead": 1}
        ch.feed(finished())
        await asyncio.sleep(0)
        assert ch.started == ["long()", "third()"]  # the cancelled code never ran
        assert await ch.interrupt_run("r2") is False  # gone

    run(go())


def test_an_interrupt_naming_the_running_run_or_none_reaches_it() -> None:
    async def go() -> None:
        ch = FakeChannel()
        await ch.start_run("r1", "query", "long()")
        await ch.start_run("r2", "query", "next()")
        assert await ch.interrupt_run("r1") is True
        assert await ch.interrupt_run(None) is True  # Backend.AI's interrupt: the running run
        assert ch.interrupts == 2
        assert await ch.interrupt_run("nobody") is False
        ch.feed(finished())
        ch.feed(finished())
        await asyncio.sleep(0)
        assert await ch.interrupt_run(None) is False  # nothing runs

    run(go())


def test_input_reaches_only_the_running_run() -> None:
    async def go() -> None:
        ch = FakeChannel()
        await ch.start_run("r1", "query", "input()")
        await ch.start_run("r2", "query", "input()")
        ch.check_running("r1")
        with pytest.raises(ChannelError, match="r2 is not running"):
            ch.check_running("r2")

    run(go())


def test_the_queue_is_bounded_and_a_lost_kernel_ends_every_run() -> None:
    async def go() -> None:
        ch = FakeChannel()
        await ch.start_run("running", "query", "x")
        for i in range(MAX_WAITING):
            await ch.start_run(f"w{i}", "query", "x")
        with pytest.raises(ChannelError, match="already waiting"):
            await ch.start_run("one-too-many", "query", "x")
        ch.lost("\n[the kernel was destroyed]\n")
        for rid in ["running", "w0", f"w{MAX_WAITING - 1}"]:
            result = await next_result(ch, rid, 0.01)
            assert (result["status"], result["exitCode"]) == ("finished", 137)
            assert "destroyed" in result["console"][0][1]
        assert ch.started == ["x"]  # nothing started after the kernel went away

    run(go())


def test_a_run_nobody_reads_keeps_a_bounded_amount_of_output() -> None:
    async def go() -> None:
        ch = FakeChannel()
        await ch.start_run("r1", "query", "spam()")
        chunk = "x" * 1024 * 1024
        for _ in range(20):
            ch.feed(out(chunk))
        ch.feed(finished())
        result = await next_result(ch, "r1", 0.05)
        text = "".join(part[1] for part in result["console"])
        assert len(text) < 9 * 1024 * 1024 and "output dropped" in text
        assert len(ch.log) == 20  # the kernel's log got everything

    run(go())


# -- end to end --------------------------------------------------------------------------------------------

LOOP = "import time\nfor i in range(200):\n    print('first', i, flush=True)\n    time.sleep(0.05)\nprint('first done')"
# the first run of the queue test: it prints, then waits for a line the test sends once the others are queued
HOLD = "for i in range(5):\n    print('first', i, flush=True)\ninput()\nprint('first done')"


def _read_until(stream, text: str, timeout: float = 30) -> str:
    """Lines of `stream` up to the one containing `text`."""
    seen = ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            break
        seen += line
        if text in line:
            return seen
    raise AssertionError(f"{text!r} not seen; got:\n{seen[-2000:]}")


def test_a_second_exec_waits_behind_the_first_and_ctrl_c_leaves_the_first_alone(node: Node) -> None:
    name = f"queue-{node.backend}-{uuid.uuid4().hex[:6]}"
    node.cli("session", "create", "python", "--name", name, check=True)
    first = node.popen("session", "exec", name, "-c", HOLD)
    try:
        assert first.stdout is not None and first.stderr is not None
        _read_until(first.stdout, "first 1")
        # a second run: it waits, says behind which run, and prints only its own output
        second = node.popen("session", "exec", name, "-c", "print('second')")
        assert second.stderr is not None and second.stdout is not None
        said = _read_until(second.stderr, "waiting behind run")
        assert "one run at a time" in said
        # a third one, interrupted while it waits: it leaves the queue; the first goes on
        third = node.popen("session", "exec", name, "-c", "print('third ran')")
        assert third.stderr is not None
        _read_until(third.stderr, "waiting behind run")
        third.send_signal(signal.SIGINT)
        _, third_err = third.communicate(timeout=30)
        assert third.returncode == 130, third_err
        assert "cancelled before it ran" in third_err
        # SIGTERM on the second while it waits: it goes away; the first is not interrupted
        fourth = node.popen("session", "exec", name, "-c", "print('fourth')")
        assert fourth.stderr is not None
        _read_until(fourth.stderr, "waiting behind run")
        fourth.send_signal(signal.SIGTERM)
        fourth.wait(30)
        rest, err = first.communicate("go\n", timeout=90)  # the first run goes on (its input) and ends
        assert first.returncode == 0, err
        assert "KeyboardInterrupt" not in err and "first done" in rest
        assert "second" not in rest and "third" not in rest and "fourth" not in rest
        out2, err2 = second.communicate(timeout=60)
        assert second.returncode == 0, err2
        assert out2 == "second\n"
        logs = node.cli("session", "logs", name, check=True).stdout
        assert "third ran" not in logs and "fourth" not in logs  # the cancelled runs never ran
    finally:
        for proc in (first,):
            if proc.poll() is None:
                proc.kill()
        node.cli("session", "destroy", name)


def _execute(node: Node, ak: str, sk: str, sid: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    status, data = signed_request(node, "POST", f"/session/{sid}", ak, sk, body)
    return status, data


def _poll_until_finished(node: Node, ak: str, sk: str, sid: str, run_id: str) -> tuple[str, int | None]:
    text = ""
    for _ in range(200):
        status, data = _execute(node, ak, sk, sid, {"mode": "continue", "runId": run_id, "code": ""})
        assert status == 200, data
        result = data["result"]
        text += "".join(part[1] for part in result["console"])
        if result["status"] == "finished":
            return text, result["exitCode"]
    raise AssertionError(f"run {run_id} did not finish: {text[-500:]}")


def test_polling_runs_queue_and_an_interrupt_names_its_run(docker_node: Node) -> None:
    node = docker_node
    ak, sk = admin_keys(node)
    name = f"poll-{uuid.uuid4().hex[:6]}"
    sid = node.json("session", "create", "python", "--name", name)["sessionId"]
    try:
        status, data = _execute(node, ak, sk, sid, {"mode": "query", "runId": "long", "code": LOOP})
        assert status == 200, data
        status, data = _execute(node, ak, sk, sid, {"mode": "query", "runId": "short", "code": "print('short')"})
        assert status == 200, data
        assert data["result"]["status"] == "continued" and data["result"]["queue"]["behind"] == "long"
        assert all("first" not in part[1] for part in data["result"]["console"])
        status, data = _execute(node, ak, sk, sid, {"mode": "query", "runId": "doomed", "code": "print('doomed')"})
        assert status == 200 and data["result"]["queue"]["ahead"] == 2
        # interrupting a waiting run (by its id) cancels it and only it
        status, _ = signed_request(node, "POST", f"/session/{sid}/interrupt", ak, sk, {"runId": "doomed"})
        assert status == 204
        status, data = signed_request(node, "POST", f"/session/{sid}/interrupt", ak, sk, {"runId": "nope"})
        assert status == 404 and "no run nope" in data["msg"]
        status, data = signed_request(node, "POST", f"/session/{sid}/interrupt", ak, sk, {"runId": {"x": 1}})
        assert status == 400
        text, code = _poll_until_finished(node, ak, sk, sid, "doomed")
        assert code == 130 and "cancelled before it ran" in text
        # the short one runs once the long one ends; each sees only its own output
        status, _ = signed_request(node, "POST", f"/session/{sid}/interrupt", ak, sk, {"runId": "long"})
        assert status == 204
        text, code = _poll_until_finished(node, ak, sk, sid, "long")
        assert "KeyboardInterrupt" in text and "short" not in text and code != 0
        text, code = _poll_until_finished(node, ak, sk, sid, "short")
        assert (text, code) == ("short\n", 0)
    finally:
        node.cli("session", "destroy", name)


SDK_POLL = """
import json, sys
from ai.backend.client.session import Session
with Session() as api:
    session = api.ComputeSession(sys.argv[1])
    results = [session.execute("sdk-run", "print('from the sdk')", mode="query")]
    while results[-1]["status"] != "finished":
        results.append(session.execute("sdk-run", "", mode="continue"))
print(json.dumps(results))
"""


def test_the_official_client_waits_its_turn_too(docker_node: Node, tmp_path) -> None:
    program = official_client()
    client = Official(program, docker_node, tmp_path)
    name = f"bac-q-{uuid.uuid4().hex[:6]}"
    docker_node.cli("session", "create", "python", "--name", name, check=True)
    first = docker_node.popen("session", "exec", name, "-c", LOOP)
    try:
        assert first.stdout is not None
        _read_until(first.stdout, "first 1")
        cli = client.popen("run", "-t", name, "python", "-c", "print('from the official cli')")
        sdk = subprocess.Popen(
            [str(Path(program).parent / "python"), "-c", SDK_POLL, name],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=client.env,
        )
        cli_out, _ = cli.communicate(timeout=120)
        sdk_out, sdk_err = sdk.communicate(timeout=120)
        rest, err = first.communicate(timeout=90)
        assert first.returncode == 0, err
        assert "from the official cli" in cli_out and "first" not in cli_out
        assert sdk.returncode == 0, sdk_err
        results = json.loads(sdk_out)
        assert any(r.get("queue") for r in results)  # it waited (the client just polls on)
        printed = "".join(part[1] for r in results for part in r["console"])
        assert printed == "from the sdk\n" and results[-1]["exitCode"] == 0
        assert "from the official cli" not in rest and "from the sdk" not in rest
    finally:
        if first.poll() is None:
            first.kill()
        docker_node.cli("session", "destroy", name)
