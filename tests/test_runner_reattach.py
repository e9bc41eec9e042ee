"""A runner outlives its agent: each job's records carry the job's run id, what a job says while no agent is
connected is kept (bounded) and sent after the next hello, and the hello names the job running, the jobs waiting
and the last that ended, so that an agent that restarted re-attaches to them (runner.py's protocol)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.test_runner import Client, RunnerProc


@pytest.fixture
def runner(tmp_path: Path):
    work = tmp_path / "work"
    work.mkdir()
    r = RunnerProc(str(tmp_path / "runner.sock"), work)
    yield r
    r.stop()


def _until(client: Client, job_id: str, timeout: float = 15.0) -> list[dict]:
    """Records up to the `finished` of job `job_id`."""
    records = []
    while True:
        msg = client.recv(timeout)
        records.append(msg)
        if msg["t"] == "finished" and msg.get("id") == job_id:
            return records


def _out(records: list[dict], job_id: str) -> str:
    return "".join(m["d"] for m in records if m["t"] == "stdout" and m.get("id") == job_id)


def test_each_record_of_a_job_names_its_run_and_a_job_without_an_id_has_none(runner: RunnerProc) -> None:
    c = runner.client
    c.send(op="query", code="print('a'); input('? ')", id="run-1")
    seen = []
    while (msg := c.recv())["t"] != "waiting-input":
        seen.append(msg)
    assert "".join(m["d"] for m in seen) == "a\n? " and all(m["id"] == "run-1" for m in seen)
    assert msg["id"] == "run-1"
    c.send(op="input", data="x")
    assert _until(c, "run-1")[-1] == {"t": "finished", "exit": 0, "id": "run-1"}
    out, _, code, events = c.query("print('b')")
    assert (out, code) == ("b\n", 0) and all("id" not in m for m in events)
    c.send(op="query", code="print(1)", id="x" * 65)  # not an id: the job has none
    assert all("id" not in m for m in _until_finished(c))


def _until_finished(c: Client) -> list[dict]:
    return c.until_finished()[3]


def test_a_job_running_while_the_agent_is_away_is_named_in_the_hello_and_loses_no_output(
    runner: RunnerProc,
) -> None:
    c = runner.client
    code = "import time\nfor i in range(12):\n    print(i, flush=True); time.sleep(0.1)\nraise SystemExit(4)"
    c.send(op="query", code=code, id="long")
    c.send(op="batch", cmd="echo second", id="next")
    before = ""
    while before != "0\n":
        msg = c.recv()
        assert msg["t"] == "stdout" and msg["id"] == "long"
        before += msg["d"]
    runner.client.close()  # the agent goes away
    time.sleep(0.5)
    c = runner.reconnect()
    hello = runner.hello
    assert hello["busy"] is True
    assert hello["job"] == {"id": "long", "kind": "query"} and hello["queued"] == ["next"]
    records = _until(c, "next")
    assert _out(records, "long") == "".join(f"{i}\n" for i in range(1, 12))  # nothing made meanwhile is lost
    assert {"t": "finished", "exit": 4, "id": "long"} in records
    assert _out(records, "next") == "second\n"  # the job waiting ran after it, as its own


def test_a_job_that_ended_while_the_agent_was_away_is_said_after_the_hello_then_remembered(
    runner: RunnerProc,
) -> None:
    c = runner.client
    c.send(op="batch", cmd="sleep 0.3; echo done; exit 3", id="b1")
    runner.client.close()
    time.sleep(1.0)  # it ends meanwhile
    c = runner.reconnect()
    assert runner.hello["job"] is None and runner.hello["busy"] is False
    assert runner.hello["backlog"] == ["b1"]  # named before its records follow
    records = _until(c, "b1", timeout=5)
    assert _out(records, "b1") == "done\n" and records[-1]["exit"] == 3
    runner.reconnect()  # an agent after that one: the end is in the hello, not sent again
    assert runner.hello["done"] == [["b1", 3]] and runner.hello["backlog"] == []
    runner.client.send(op="ping")
    assert runner.client.recv() == {"t": "pong"}


def test_what_is_kept_while_nobody_listens_is_bounded_and_says_what_it_dropped(runner: RunnerProc) -> None:
    c = runner.client
    c.send(op="query", code="import time; time.sleep(0.3)\nfor i in range(3000): print('x' * 1000)", id="flood")
    runner.client.close()
    time.sleep(2.5)
    c = runner.reconnect()
    size = 0
    records = []
    while True:
        msg = c.recv()
        records.append(msg)
        size += len(json.dumps(msg))
        if msg["t"] == "finished":
            break
    assert size < 1.2 * 1024 * 1024  # 3 MB were written: at most about 1 MiB kept
    assert "bytes of output were dropped while the agent was away" in records[0]["d"]
    assert records[-1] == {"t": "finished", "exit": 0, "id": "flood"}
    assert records[-3]["d"] == "x" * 1000 and records[-2]["d"] == "\n"  # the newest output is what is kept


def test_an_interrupt_for_another_run_leaves_the_running_one_alone(runner: RunnerProc) -> None:
    c = runner.client
    c.send(op="query", code="import time\nprint('up', flush=True)\ntime.sleep(1.5)\nprint('slept')", id="mine")
    assert _first_line(c) == "up\n"
    c.send(op="interrupt", id="someone-else")
    records = _until(c, "mine")
    assert _out(records, "mine") == "slept\n" and records[-1]["exit"] == 0
    c.send(op="query", code="import time\nprint('up', flush=True)\ntime.sleep(30)", id="again")
    assert _first_line(c) == "up\n"
    c.send(op="interrupt", id="again")
    assert _until(c, "again")[-1]["exit"] == 130


def _first_line(c: Client) -> str:
    text = ""
    while not text.endswith("\n"):
        text += c.recv()["d"]
    return text
