"""The session lifecycle on the in-process harness (tests/harness.py): statuses and their reasons,
batch results, destroy, dependencies, reserved start times, time limits and hooks, in milliseconds."""

from __future__ import annotations

import asyncio
import re
import types

import pytest

from bai.node.manager.domain_errors import Conflict, Forbidden, Invalid, SessionNotFound
from tests.harness import Harness


async def test_a_session_goes_from_pending_to_terminated_and_every_step_is_recorded(tmp_path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("a1")
        with h.hubs.events.subscribe() as events:
            row = await h.create("lifecycle")
            assert row.status == "PENDING"
            await h.schedule()
            running = await h.wait("lifecycle", "RUNNING")
            assert h.kernels_on("a1") == {k.id for k in await h.store.kernels_of(running.id)}
            result = await h.execute("lifecycle", "print('hello', 42)")
            assert (result["status"], result["exitCode"]) == ("finished", 0)
            assert result["console"] == [["stdout", "hello 42\n"]]
            await h.destroy("lifecycle")
            seen = [events.get_nowait()[0] for _ in range(events.qsize())]
        assert await h.transitions("lifecycle") == [
            "PENDING",
            "SCHEDULED",
            "PREPARING",
            "RUNNING",
            "TERMINATING",
            "TERMINATED",
        ]
        assert seen == [
            "session_enqueued",
            "session_scheduled",
            "session_preparing",
            "session_started",
            "session_terminating",
            "session_terminated",
        ]
        info = await h.info("lifecycle")
        assert info["statusInfo"] == "user-requested"
        assert info["result"] == "SUCCESS"  # the last run's outcome
        assert info["occupiedSlots"] == {} and info["terminationTime"]
        assert h.kernels_on("a1") == set()  # the kernel is gone from the agent


async def test_a_batch_session_ends_by_itself_with_its_exit_code(tmp_path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("a1")
        failed = await h.run("batch-fail", type="batch", command="exit 3")
        assert (failed.status_info, failed.result) == ("task-failed", "FAILURE")
        info = await h.info("batch-fail")
        assert info["exitCode"] == 3 and info["statusData"] == {"exitCode": 3}
        ok = await h.run("batch-ok", type="batch", command="true")
        assert (ok.status_info, ok.result) == ("task-done", "SUCCESS")
        echoed = await h.run("batch-echo", type="batch", command="echo from batch")
        assert echoed.result == "SUCCESS"

        async def logged() -> bool:
            return await h.logs("batch-echo") == "from batch\n"

        await h.until(logged, what="the batch output is kept as the session's log")
        assert await h.transitions("batch-fail") == [
            "PENDING",
            "SCHEDULED",
            "PREPARING",
            "RUNNING",
            "TERMINATING",
            "TERMINATED",
        ]


async def test_destroying_a_pending_session_cancels_it_and_an_ended_one_cannot_be_destroyed(tmp_path) -> None:
    async with Harness(tmp_path) as h:
        await h.create("never-placed")  # no agent yet
        await h.destroy("never-placed")
        info = await h.info("never-placed")
        assert (info["status"], info["statusInfo"]) == ("CANCELLED", "user-requested")
        assert await h.transitions("never-placed") == ["PENDING", "CANCELLED"]
        await h.add_agent("a1")
        await h.schedule()
        assert await h.status("never-placed") == "CANCELLED"  # a round does not revive it
        assert h.kernels_on("a1") == set()
        with pytest.raises(SessionNotFound, match="does not exist"):  # by name: only live sessions are found
            await h.destroy("never-placed")
        with pytest.raises(Forbidden, match="the session is already CANCELLED"):
            await h.lifecycle.destroy(await h.row("never-placed"), forced=True)


async def test_a_session_being_created_is_destroyed_only_when_forced(tmp_path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("slow", start_delay=60)  # its kernels take a minute to start
        await h.create("starting")
        await h.schedule()
        await h.wait("starting", "PREPARING")
        await h.until(lambda: h.kernels_starting("slow"), what="the agent creates the kernel")
        with pytest.raises(Forbidden, match="PREPARING; wait, or destroy it with forced=true"):
            await h.destroy("starting")
        await h.destroy("starting", forced=True)
        await h.wait("starting", "TERMINATED")
        assert (await h.row("starting")).status_info == "force-terminated"


async def test_a_kernel_that_does_not_start_in_time_is_an_error_and_frees_its_slots(tmp_path) -> None:
    async with Harness(tmp_path, start_timeout=0.05) as h:
        await h.add_agent("slow", cpu=1, start_delay=60)
        await h.create("sluggish")
        await h.schedule()
        ended = await h.wait("sluggish", "TERMINATED")
        assert await h.transitions("sluggish") == ["PENDING", "SCHEDULED", "PREPARING", "ERROR", "TERMINATED"]
        assert ended.status_info == "failed-to-start"
        assert "did not start within 0.05 s" in ended.status_data["error"]["repr"]
        # its cpu is free again: the next session is placed
        h.nodes["slow"].backend.start_delay = 0
        h.lifecycle.start_timeout = 5.0
        await h.create("next-one")
        await h.schedule()
        await h.wait("next-one", "RUNNING")


async def test_a_session_stuck_starting_with_no_start_under_way_is_ended_by_the_timers(tmp_path) -> None:
    """What started it is gone (an error, a write that failed): past the preparing timeout and a grace the
    timers end it (CANCELLED, its kernels removed), with no write needed to have worked before."""
    from bai.node.manager.services.timers import STUCK_GRACE

    async with Harness(tmp_path, start_timeout=2.0) as h:
        await h.add_agent("a1", cpu=1)
        row = await h.create("orphaned")
        [kernel] = await h.store.kernels_of(row.id)
        await h.store.apply_round([(row.id, {kernel.id: "a1"})], [], [], [], h.clock.now())  # placed, its start lost
        assert await h.store.start_preparing(row.id, h.clock.now())
        h.timers.since = h.advance(5)  # as if the manager had started 5 s later: judged from then on
        h.advance(2.0 + STUCK_GRACE - 1)
        await h.sweep()
        assert await h.status("orphaned") == "PREPARING"  # not yet past its limit (as this manager saw it)
        h.advance(2)
        await h.sweep()
        ended = await h.wait("orphaned", "CANCELLED")
        assert ended.status_info == "failed-to-start"
        assert ended.status_data["error"]["name"] == "StartTimeout"
        assert "stayed PREPARING for more than 32 s" in ended.status_data["error"]["repr"]
        await h.run("takes-its-cpu", cpu=1)
        # a start under way is left to its own timeout
        h.nodes["a1"].backend.start_delay = 60
        await h.create("slow-one", cpu=1)
        h.advance(1)
        await h.destroy("takes-its-cpu")
        await h.schedule()
        await h.wait("slow-one", "PREPARING")
        h.advance(100)
        await h.sweep()
        assert await h.status("slow-one") == "PREPARING"


async def test_a_session_stuck_terminating_with_no_destroy_under_way_is_ended_by_the_timers(tmp_path) -> None:
    from bai.common.status import SessionStatus
    from bai.node.manager.services.timers import TERMINATING_LIMIT

    async with Harness(tmp_path) as h:
        await h.add_agent("a1", cpu=1)
        row = await h.run("half-destroyed", cpu=1)
        # its destroy went no further than TERMINATING (its task failed): the kernel runs, its slots are taken
        await h.lifecycle.transition(row.id, SessionStatus.TERMINATING, "user-requested", {})
        assert h.kernels_on("a1")
        h.advance(TERMINATING_LIMIT - 1)
        await h.sweep()
        assert await h.status("half-destroyed") == "TERMINATING"
        h.advance(2)
        await h.sweep()
        ended = await h.wait("half-destroyed", "TERMINATED")
        assert ended.status_info == "user-requested"
        assert h.kernels_on("a1") == set()
        await h.run("gets-its-cpu", cpu=1)


async def test_create_is_get_or_create_by_name(tmp_path) -> None:
    async with Harness(tmp_path) as h:
        first = await h.create("same-name")
        second = await h.create("same-name")
        assert first.id == second.id
        with pytest.raises(Conflict, match="already exists"):
            await h.create("same-name", image="other-image")


async def test_a_dependent_session_waits_for_success_and_is_cancelled_by_a_failure(tmp_path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("a1")
        await h.create("dep-first", type="batch", command="true")
        await h.create("dep-second", type="batch", command="echo second", depends=["dep-first"])
        await h.schedule()
        waiting = await h.info("dep-second")
        assert (waiting["status"], waiting["statusInfo"]) == ("PENDING", "predicate-checks-failed")
        assert "dep-first" in waiting["statusData"]["scheduler"]["msg"]
        assert [p["name"] for p in waiting["statusData"]["scheduler"]["failed_predicates"]] == ["dependencies"]
        first = await h.wait("dep-first", "TERMINATED")
        h.advance(1)
        await h.schedule()
        second = await h.wait("dep-second", "TERMINATED")
        assert second.result == "SUCCESS"
        assert first.terminated_at < (await h.info("dep-second"))["transitions"][1]["at"]  # scheduled after

        await h.run("dep-bad", type="batch", command="exit 1")
        await h.create("dep-orphan", type="batch", depends=["dep-bad"])
        await h.create("dep-grandchild", type="batch", depends=["dep-orphan"])
        await h.schedule()
        orphan = await h.info("dep-orphan")
        assert (orphan["status"], orphan["statusInfo"]) == ("CANCELLED", "dependency-failed")
        assert "dep-bad" in orphan["statusData"]["msg"]
        await h.schedule()  # and what depended on it, in the next round
        assert (await h.info("dep-grandchild"))["statusInfo"] == "dependency-failed"
        with pytest.raises(Invalid, match="cannot depend on 'nothing-here'"):
            await h.create("dep-nothing", type="batch", depends=["nothing-here"])


async def test_a_session_with_a_start_time_waits_for_it(tmp_path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("a1")
        await h.create("later", type="batch", starts_at="30s")
        await h.schedule()
        info = await h.info("later")
        assert (info["status"], info["statusInfo"]) == ("PENDING", "predicate-checks-failed")
        failed = info["statusData"]["scheduler"]["failed_predicates"]
        assert [p["name"] for p in failed] == ["reserved_time"] and "(in 30s)" in failed[0]["msg"]
        h.advance(20)
        await h.schedule()
        assert await h.status("later") == "PENDING"
        h.advance(11)
        await h.schedule()
        assert (await h.wait("later", "TERMINATED")).result == "SUCCESS"


async def test_a_session_pending_too_long_is_cancelled(tmp_path) -> None:
    async with Harness(tmp_path, config={"scaling_groups": {"default": {"pending_timeout": 60}}}) as h:
        await h.add_agent("a1", cpu=1)
        await h.run("holder")
        await h.create("waiter")
        await h.schedule()
        assert (await h.row("waiter")).status_info == "no-available-instances"
        h.advance(61)
        await h.schedule()
        waited = await h.info("waiter")
        assert (waited["status"], waited["statusInfo"]) == ("CANCELLED", "pending-timeout")
        assert "pending for more than 60 s" in waited["statusData"]["msg"]
        assert await h.status("holder") == "RUNNING"


async def test_idle_sessions_and_old_ones_are_ended_by_their_policy(tmp_path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("a1", cpu=8)
        idler = await h.keypair("idler", await h.policy("impatient", idle_timeout=60))
        brief = await h.keypair("brief", await h.policy("short-lived", max_session_lifetime=300))
        await h.create("idler-1", owner=idler)
        await h.create("idler-busy", owner=idler)
        await h.create("brief-1", owner=brief)
        await h.create("brief-batch", owner=brief, type="batch", command="sleep 3600")
        await h.create("admin-1")  # the default policy: no limits
        await h.schedule()
        for name in ("idler-1", "idler-busy", "brief-1", "brief-batch", "admin-1"):
            await h.wait(name, "RUNNING")
        h.advance(50)
        await h.execute("idler-1", "print('still here')")  # activity restarts the idle time
        running = await h.execute("idler-busy", "sleep 3600", mode="batch", flush=0.01)
        assert running["status"] == "continued"  # code runs: busy, never idle
        h.advance(50)
        await h.sweep()
        assert await h.status("idler-1") == "RUNNING"  # 50 s since its last run
        h.advance(20)
        await h.sweep()
        ended = await h.wait("idler-1", "TERMINATED")
        assert ended.status_info == "idle-timeout"
        assert await h.status("idler-busy") == "RUNNING"
        assert await h.status("brief-1") == "RUNNING"  # 120 s old
        h.advance(200)
        await h.sweep()
        for name in ("brief-1", "brief-batch"):  # a batch session has a lifetime too
            assert (await h.wait(name, "TERMINATED")).status_info == "idle-session-lifetime"
        assert await h.status("admin-1") == "RUNNING"
        assert await h.status("idler-busy") == "RUNNING"


REJECT = "no sessions named reject-* on this cluster"


async def test_hooks_reject_sessions_and_slow_ones_are_noted_not_waited_for(tmp_path) -> None:
    seen: list[tuple[str, str]] = []

    # coroutines: a plain function runs in a thread, which a loaded machine may not start within 0.05 s
    async def before_enqueue(session):
        if session["name"].startswith("reject"):
            return REJECT

    async def after_start(session):
        seen.append(("after_start", session["name"]))
        if session["name"].startswith("slowhook"):
            await asyncio.sleep(10)

    async def after_termination(session):
        seen.append(("after_termination", session["name"]))

    hook = types.SimpleNamespace(
        before_enqueue=before_enqueue, after_start=after_start, after_termination=after_termination
    )
    async with Harness(tmp_path, hooks=[("policy", hook)], hook_timeout=0.05) as h:
        await h.add_agent("a1")
        with pytest.raises(Forbidden, match=re.escape(f"{REJECT} (hook policy)")):
            await h.create("reject-me")
        assert await h.store.list_sessions(None, None) == []  # nothing was stored
        await h.run("slowhook-1")
        assert (await h.execute("slowhook-1", "print('fine')"))["console"] == [["stdout", "fine\n"]]
        await h.destroy("slowhook-1")
        await h.wait("slowhook-1", "TERMINATED")

        async def notes() -> list[str]:  # written in the background
            return (await h.info("slowhook-1"))["statusData"].get("hooks", [])

        assert await h.until(notes) == ["hook policy after_start timed out after 0.05 s"]
        await h.until(lambda: len(seen) == 2)
        assert seen == [("after_start", "slowhook-1"), ("after_termination", "slowhook-1")]
