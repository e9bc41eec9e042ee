"""Preemption through the dispatcher's real round on the in-process harness: a batch session requeued with its exit
noted, an interactive one told first and ended at the end of its grace period (or left alone when the notice is no
longer needed), PREEMPTED in both histories with who and why, and the sessions preemption never touches."""

from __future__ import annotations

from tests.harness import Harness

PREEMPT = {"scaling_groups": {"default": {"policy": "multifactor", "preemption": True, "preemption_grace": "30s"}}}


async def test_a_batch_session_is_requeued_with_its_exit_noted_and_runs_again(tmp_path) -> None:
    async with Harness(tmp_path, config=PREEMPT) as h:
        await h.add_agent("a1", cpu=2)
        await h.create("pre-batch", cpu=2, type="batch", command="sleep 3600", priority=1)
        await h.schedule()
        await h.wait("pre-batch", "RUNNING")
        await h.create("pre-urgent", cpu=2, priority=80)
        await h.schedule()
        requeued = await h.wait("pre-batch", "PENDING")
        note = requeued.status_data["preemption"]
        assert note["byName"] == "pre-urgent" and note["byPriority"] == 80 and note["requeued"] is True
        assert note["exitCode"] == 130  # its command was interrupted (SIGINT) and its exit noted
        assert "preempted by pre-urgent (priority 80)" in note["msg"]
        assert (await h.transitions("pre-batch"))[-3:] == ["RUNNING", "PREEMPTED", "PENDING"]
        history = (await h.store.scheduling_history(requeued.id))[-1]
        assert history.outcome == "preempted" and "pre-urgent" in history.msg
        await h.schedule()
        await h.wait("pre-urgent", "RUNNING")
        waiting = await h.info("pre-batch")  # it waits again, with how it was preempted in sight
        assert waiting["status"] == "PENDING" and waiting["statusData"]["preemption"]["byName"] == "pre-urgent"
        assert waiting["startedAt"] is None  # its next start counts afresh (time limits, backfill)
        await h.destroy("pre-urgent")
        await h.schedule()
        await h.wait("pre-batch", "RUNNING")  # requeued: its kernel made afresh on an agent


async def test_an_interactive_session_is_told_first_and_ended_after_its_grace(tmp_path) -> None:
    async with Harness(tmp_path, config=PREEMPT) as h:
        await h.add_agent("a1", cpu=2)
        await h.create("pre-notebook", cpu=2, priority=2)
        await h.schedule()
        await h.wait("pre-notebook", "RUNNING")
        await h.create("pre-train", cpu=2, priority=60)
        await h.schedule()
        told = await h.row("pre-notebook")
        assert (told.status, told.status_info) == ("RUNNING", "preempting")
        assert told.status_data["preemption"]["byName"] == "pre-train"
        assert "30 s notice" in told.status_data["preemption"]["msg"]
        train = await h.info("pre-train")
        assert "preempting pre-notebook on a1" in train["statusData"]["scheduler"]["msg"]
        h.advance(10)
        await h.schedule()  # within the grace: nothing more happens (and nobody else is stopped)
        assert (await h.row("pre-notebook")).status == "RUNNING"
        h.advance(25)
        await h.schedule()
        ended = await h.wait("pre-notebook", "TERMINATED")
        assert ended.status_info == "preempted" and ended.status_data["preemption"]["byName"] == "pre-train"
        assert "PREEMPTED" in await h.transitions("pre-notebook")
        await h.schedule()
        await h.wait("pre-train", "RUNNING")


async def test_a_notice_no_longer_needed_is_withdrawn(tmp_path) -> None:
    async with Harness(tmp_path, config=PREEMPT) as h:
        await h.add_agent("a1", cpu=2)
        await h.create("pre-keep", cpu=2, priority=2)
        await h.schedule()
        await h.wait("pre-keep", "RUNNING")
        await h.create("pre-hurry", cpu=2, priority=60)
        await h.schedule()
        assert (await h.row("pre-keep")).status_info == "preempting"
        await h.destroy("pre-hurry")  # the session it was to make room for is cancelled
        await h.schedule()
        kept = await h.row("pre-keep")
        assert (kept.status, kept.status_info) == ("RUNNING", "") and "preemption" not in kept.status_data
        h.advance(60)
        await h.schedule()
        assert (await h.row("pre-keep")).status == "RUNNING"


async def test_what_preemption_never_touches(tmp_path) -> None:
    async with Harness(tmp_path, config=PREEMPT) as h:
        await h.add_agent("a1", cpu=4)
        await h.policy("small", total_resource_slots={"cpu": "1"})
        limited = await h.keypair("limited@example.com", "small")
        await h.create("pre-optout", cpu=1, priority=1, preemptible=False)  # its owner said no
        await h.create("pre-important", cpu=1, priority=6)  # above preemptible_priority (5)
        await h.create("pre-peer", cpu=1, priority=1)
        await h.create("pre-own", cpu=1, priority=3, owner=limited)  # all its policy allows it
        await h.schedule()
        for name, owner in (("pre-optout", None), ("pre-important", None), ("pre-peer", None), ("pre-own", limited)):
            await h.wait(name, "RUNNING", owner=owner)
        assert (await h.info("pre-optout"))["preemptible"] is False
        # equal priority never preempts; a session its own policy holds back preempts nobody, its own sessions
        # included
        await h.create("pre-equal", cpu=1, priority=1)
        await h.create("pre-limited", cpu=1, priority=90, owner=limited)
        await h.schedule()
        assert (await h.row("pre-peer")).status_info == ""
        assert (await h.row("pre-own", limited)).status_info == ""
        assert (await h.info("pre-limited", limited))["statusInfo"] == "predicate-checks-failed"
        # a session of a higher priority with room to gain preempts one that may be preempted (the lowest
        # priority: pre-peer), and nobody else
        await h.create("pre-vip", cpu=1, priority=50)
        await h.schedule()
        told = {n: (await h.row(n)).status_info for n in ("pre-optout", "pre-important", "pre-peer")}
        assert told == {"pre-optout": "", "pre-important": "", "pre-peer": "preempting"}, told
        assert (await h.row("pre-own", limited)).status_info == ""


async def test_preemption_is_off_unless_the_scaling_group_says_so(tmp_path) -> None:
    async with Harness(tmp_path, config={"scaling_groups": {"default": {"policy": "multifactor"}}}) as h:
        await h.add_agent("a1", cpu=1)
        await h.create("off-low", cpu=1, priority=0, type="batch", command="sleep 3600")
        await h.schedule()
        await h.wait("off-low", "RUNNING")
        await h.create("off-high", cpu=1, priority=100)
        await h.schedule()
        assert (await h.row("off-low")).status == "RUNNING"
        assert (await h.info("off-high"))["statusInfo"] == "no-available-instances"
