"""An agent that restarted re-attaches to the runs its kernel's runner kept (channel.py `adopt_runs` and records
that name their run): the run that was going stays one run under its id, runs started after the restart wait
behind it and never see its output, and the end of a run that finished meanwhile is there for its client."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.test_runs_in_one_session import FakeChannel


def rec(kind: str, run_id: str, **fields: Any) -> dict[str, Any]:
    return {"t": kind, "id": run_id, **fields}


async def test_the_run_going_in_the_kernel_is_adopted_and_a_new_one_waits_behind_it() -> None:
    ch = FakeChannel()
    ch.adopt_runs({"t": "hello", "busy": True, "job": {"id": "old", "kind": "query"}, "queued": [], "done": []})
    assert ch.run_id == "old"
    await ch.start_run("new", "query", "print(1)")
    assert ch.started == []  # not sent to the kernel: the old run has it
    waiting = (await ch.next_result("new", 0.05)).to_api()
    assert waiting["status"] == "continued" and waiting["queue"] == {"behind": "old", "ahead": 1}
    ch.feed(rec("stdout", "old", d="long 7\n"))
    ch.feed(rec("stdout", "new", d="stray\n"))  # (a record naming the waiting run before it ran: its own)
    got = (await ch.next_result("old", 0.05)).to_api()
    assert got["console"] == [["stdout", "long 7\n"]]
    ch.feed(rec("finished", "old", exit=4))
    end = (await ch.next_result("old", 0.05)).to_api()
    assert (end["status"], end["exitCode"]) == ("finished", 4)
    assert ch.started == ["print(1)"]  # now the new run starts
    ch.feed(rec("stdout", "new", d="1\n"))
    ch.feed(rec("finished", "new", exit=0))
    mine = (await ch.next_result("new", 0.05)).to_api()
    assert mine["console"] == [["stdout", "stray\n1\n"]] and mine["exitCode"] == 0


async def test_records_of_a_run_nobody_knew_make_it_a_run_and_a_finished_one_is_kept_for_its_client() -> None:
    ch = FakeChannel()
    ch.adopt_runs({"t": "hello", "busy": False, "job": None, "queued": [], "done": [["earlier", 3], ["bad"]]})
    ended = (await ch.next_result("earlier", 0.05)).to_api()
    assert (ended["status"], ended["exitCode"]) == ("finished", 3)
    # a job that ended while no agent listened: its records come after the hello, naming it
    ch.feed(rec("stdout", "b1", d="done\n"))
    ch.feed(rec("finished", "b1", exit=0))
    got = (await ch.next_result("b1", 0.05)).to_api()
    assert got["console"] == [["stdout", "done\n"]] and got["status"] == "finished"
    assert ch.run_id is None
    await ch.start_run("next", "query", "x")
    assert ch.started == ["x"]  # the kernel is free


async def test_a_client_asking_for_a_run_whose_records_follow_the_hello_waits_for_them() -> None:
    """The hello names the runs whose records it sends next (one ended while no agent listened): a client
    that asks before they arrive (a batch session's follower, right after the agent came back) gets them."""
    ch = FakeChannel()
    ch.adopt_runs({"t": "hello", "busy": False, "job": None, "queued": [], "done": [], "backlog": ["b1", 7]})
    asking = asyncio.ensure_future(ch.next_result("b1", 2.0, after=1))
    await asyncio.sleep(0.05)
    assert not asking.done()  # not "no run b1 in this kernel"
    ch.feed(rec("stdout", "b1", d="after\n"))
    ch.feed(rec("finished", "b1", exit=3))
    got = (await asking).to_api()
    assert (got["status"], got["exitCode"], got["console"]) == ("finished", 3, [["stdout", "after\n"]])
    await ch.start_run("next", "query", "x")
    assert ch.started == ["x"]  # the kernel is free after it


async def test_jobs_waiting_in_the_kernel_are_not_sent_again_and_keep_their_order() -> None:
    ch = FakeChannel()
    ch.adopt_runs({"job": {"id": "a", "kind": "batch"}, "queued": ["b", "c"], "done": []})
    await ch.start_run("d", "query", "mine")
    ch.feed(rec("finished", "a", exit=0))
    assert ch.run_id == "b" and ch.started == []  # b was queued in the kernel already
    ch.feed(rec("finished", "b", exit=0))
    ch.feed(rec("finished", "c", exit=0))
    await asyncio.sleep(0)  # (a run is started in a task of its own)
    assert ch.run_id == "d" and ch.started == ["mine"]


async def test_a_hello_of_odd_shapes_adopts_nothing_and_breaks_nothing() -> None:
    ch = FakeChannel()
    for hello in (
        {"job": "x", "queued": "y", "done": 5},
        {"job": {"id": 5}, "queued": [1, None, "z" * 65], "done": [[1, 2], "x", ["ok", "not a code"]]},
        {"job": {"id": "z" * 65}},
    ):
        ch.adopt_runs(hello)
    assert ch.run_id is None and list(ch.waiting) == []
    ended = (await ch.next_result("ok", 0.05)).to_api()
    assert ended["exitCode"] == 1  # an exit code that is not one counts as a failure
    await ch.start_run("r", "query", "q")
    assert ch.started == ["q"]


async def test_a_busy_runner_older_than_run_ids_keeps_its_job_apart_from_new_runs() -> None:
    ch = FakeChannel()
    ch.adopt_runs({"t": "hello", "busy": True})  # (no "job": a runner of an earlier bai)
    earlier = ch.run_id
    assert earlier is not None and earlier.startswith("earlier-")
    await ch.start_run("new", "query", "print(1)")
    assert ch.started == []
    ch.feed({"t": "stdout", "d": "old output\n"})  # (its records name no run)
    ch.feed({"t": "finished", "exit": 0})
    await asyncio.sleep(0)
    assert ch.started == ["print(1)"]
    ch.feed({"t": "stdout", "d": "1\n"})
    ch.feed({"t": "finished", "exit": 0})
    mine = (await ch.next_result("new", 0.05)).to_api()
    assert mine["console"] == [["stdout", "1\n"]]


async def test_a_caller_that_missed_answers_gets_them_again_and_a_read_end_is_kept() -> None:
    ch = FakeChannel()
    await ch.start_run("r", "query", "loop()")
    ch.feed(rec("stdout", "r", d="0\n"))
    first = await ch.next_result("r", 0.05)
    assert first.seq == 1 and first.console == [["stdout", "0\n"]]
    ch.feed(rec("stdout", "r", d="1\n"))
    lost = await ch.next_result("r", 0.05)  # (an answer to a manager that stopped: nobody read it)
    assert lost.seq == 2
    ch.feed(rec("stdout", "r", d="2\n"))
    ch.feed(rec("finished", "r", exit=4))
    lost_end = await ch.next_result("r", 0.05)
    assert (lost_end.status, lost_end.exit_code) == ("finished", 4)
    # the client re-attaches saying it saw answer 1: it gets the rest, the end included, in order
    again = await ch.next_result("r", 0.05, after=first.seq)
    assert again.console == [["stdout", "1\n2\n"]] and (again.status, again.exit_code) == ("finished", 4)
    seen_all = await ch.next_result("r", 0.05, after=again.seq)  # it saw everything: the end again, no output
    assert (seen_all.status, seen_all.exit_code, seen_all.console) == ("finished", 4, [])
    await ch.start_run("r", "query", "loop()")  # a start said again is not a second run
    assert ch.started == ["loop()"]
    try:
        await ch.next_result("r", 0.05)  # (without `after`: as before, a run whose end was read is gone)
    except Exception as e:  # noqa: BLE001
        assert "no run r" in str(e)
    else:
        raise AssertionError("a plain poll of a finished run answered")


async def test_kept_answers_are_bounded() -> None:
    from bai.node.agent.channel import KEEP_ANSWER_CHARS

    ch = FakeChannel()
    await ch.start_run("big", "query", "flood()")
    for _ in range(12):
        ch.feed(rec("stdout", "big", d="x" * 100_000))
        await ch.next_result("big", 0.05)
    kept = ch.runs["big"].answers
    assert sum(len(t) for a in kept for _, t in a.console) <= KEEP_ANSWER_CHARS
    assert kept[-1].seq == 12  # the newest kept


async def test_a_kernel_naming_endless_runs_makes_the_agent_hold_a_bounded_number() -> None:
    from bai.node.agent.channel import MAX_WAITING

    ch = FakeChannel()
    for i in range(10 * MAX_WAITING):
        ch.feed(rec("stdout", f"made-up-{i}", d="x\n"))
    assert len(ch.runs) <= MAX_WAITING
    assert sum(text == "x\n" for _, text in ch.log) == 10 * MAX_WAITING  # (all of it still in the kernel's log)


async def test_a_kernel_saying_hello_again_and_again_makes_the_agent_hold_a_bounded_number_of_runs() -> None:
    ch = FakeChannel()
    for i in range(100):  # a kernel that reconnects with fresh names each time
        names = [f"h{i}-{k}" for k in range(40)]
        ch.adopt_runs({"t": "hello", "busy": False, "job": None, "queued": names[:20], "backlog": names[20:]})
    assert sum(r.adopted and r.state != "finished" for r in ch.runs.values()) <= 32  # (MAX_WAITING)
