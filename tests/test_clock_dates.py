"""One clock: the harness's time limits, grace periods, retention and reserved start times follow the manager's
injected clock whatever date it says (here 2020 and 2040, far from the machine's own date), and every stamp
the state keeps of a session is the clock's time. A wall-clock read anywhere in the manager makes these fail
(the store's stamps once disagreed with the timers' clock: an idle session of 2020 never ended)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bai.common.clock import Clock, ManualClock
from tests.harness import Harness

DATES = [datetime(2020, 1, 1, tzinfo=UTC), datetime(2040, 6, 1, 12, 30, tzinfo=UTC)]


@pytest.fixture(params=DATES, ids=lambda d: d.date().isoformat())
def start(request: pytest.FixtureRequest) -> datetime:
    when: datetime = request.param
    return when


def _at(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp)


async def test_an_idle_session_ends_after_its_idle_timeout(tmp_path: Path, start: datetime) -> None:
    async with Harness(tmp_path, start=start) as h:
        await h.add_agent("a1")
        idler = await h.keypair("idler", await h.policy("impatient", idle_timeout=60))
        await h.run("idle-one", owner=idler)
        h.advance(50)
        await h.sweep()
        assert await h.status("idle-one") == "RUNNING"
        h.advance(20)  # 70 s since it started running
        await h.sweep()
        assert (await h.wait("idle-one", "TERMINATED")).status_info == "idle-timeout"


async def test_a_session_ends_at_its_policys_lifetime(tmp_path: Path, start: datetime) -> None:
    async with Harness(tmp_path, start=start) as h:
        await h.add_agent("a1")
        brief = await h.keypair("brief", await h.policy("short-lived", max_session_lifetime=300))
        await h.run("brief-one", owner=brief)
        h.advance(290)
        await h.execute("brief-one", "print('busy')")  # activity does not extend a lifetime
        await h.sweep()
        assert await h.status("brief-one") == "RUNNING"
        h.advance(20)
        await h.sweep()
        assert (await h.wait("brief-one", "TERMINATED")).status_info == "idle-session-lifetime"


async def test_a_session_pending_past_the_groups_timeout_is_cancelled(tmp_path: Path, start: datetime) -> None:
    config = {"scaling_groups": {"default": {"pending_timeout": 60}}}
    async with Harness(tmp_path, config=config, start=start) as h:
        await h.add_agent("a1", cpu=1)
        await h.run("holder")
        await h.create("waiter")
        await h.schedule()
        h.advance(50)
        await h.schedule()
        assert await h.status("waiter") == "PENDING"
        h.advance(11)
        await h.schedule()
        waited = await h.info("waiter")
        assert (waited["status"], waited["statusInfo"]) == ("CANCELLED", "pending-timeout")
        assert await h.status("holder") == "RUNNING"


async def test_a_lost_agents_grace_runs_out_when_the_clock_says_so(tmp_path: Path, start: datetime) -> None:
    async with Harness(tmp_path, lost_grace=60, start=start) as h:
        await h.add_agent("a1")
        await h.run("on-lost")
        await h.lose_agent("a1", wait_grace=False)
        h.advance(59)
        await h.schedule()  # (the loop turns: nothing ends before the clock says so)
        assert h.in_grace("a1")
        assert await h.status("on-lost") == "RUNNING"
        h.advance(2)
        await h.grace_over("a1")
        lost = await h.wait("on-lost", "ERROR")
        assert lost.status_info == "agent-lost"
        assert _at(lost.status_changed) == h.clock.now()


async def test_logs_are_purged_once_their_retention_has_passed(tmp_path: Path, start: datetime) -> None:
    async with Harness(tmp_path, start=start) as h:
        h.timers.log_retention = 3600.0
        await h.add_agent("a1")
        ended = await h.run("says-hello", type="batch", command="echo hello")
        assert _at(ended.terminated_at) == h.clock.now()
        await h.until(lambda: h.logs("says-hello"), what="the batch output stored")
        h.advance(3500)
        assert await h.timers.sweep_logs(h.clock.now()) == []
        assert "hello" in await h.logs("says-hello")
        h.advance(200)
        assert len(await h.timers.sweep_logs(h.clock.now())) == 1
        assert await h.logs("says-hello") == ""


async def test_a_reserved_start_time_is_the_clocks(tmp_path: Path, start: datetime) -> None:
    async with Harness(tmp_path, start=start) as h:
        await h.add_agent("a1")
        await h.create("in-30s", type="batch", starts_at="30s")  # relative: from the clock's now
        await h.create("at-one", type="batch", starts_at=(start + timedelta(hours=1)).isoformat())  # absolute
        await h.schedule()
        assert (await h.status("in-30s"), await h.status("at-one")) == ("PENDING", "PENDING")
        h.advance(31)
        await h.schedule()
        assert (await h.wait("in-30s", "TERMINATED")).result == "SUCCESS"
        assert await h.status("at-one") == "PENDING"
        h.advance(3600)
        await h.schedule()
        assert (await h.wait("at-one", "TERMINATED")).result == "SUCCESS"


async def test_every_stamp_of_a_session_is_the_clocks_time(tmp_path: Path, start: datetime) -> None:
    async with Harness(tmp_path, start=start) as h:
        await h.add_agent("a1")
        created = await h.create("stamped")
        assert _at(created.created_at) == start
        scheduled_at = h.advance(5)
        await h.schedule()
        running = await h.wait("stamped", "RUNNING")
        assert _at(running.status_changed) == scheduled_at
        ended_at = h.advance(7)
        await h.destroy("stamped")
        ended = await h.wait("stamped", "TERMINATED")
        assert _at(ended.terminated_at) == _at(ended.status_changed) == ended_at
        info = await h.info("stamped")
        times = [_at(t["at"]) for t in info["transitions"]]
        assert times[0] == start and times[-1] == ended_at
        assert all(start <= t <= ended_at for t in times)
        assert info["age"] == round((ended_at - start).total_seconds() * 1000)  # ms, as of the clock's now
        history = await h.store.scheduling_history(created.id)
        assert history and all(start <= _at(row.first_at) <= scheduled_at for row in history)


async def test_a_manual_clocks_sleepers_wake_when_it_is_moved_to_their_time(start: datetime) -> None:
    clock = ManualClock(start)
    woken: list[str] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep_until(start + timedelta(seconds=seconds))
        woken.append(name)

    tasks = [asyncio.create_task(sleeper(name, s)) for name, s in (("b", 20), ("a", 10), ("c", 30), ("gone", 15))]
    await asyncio.sleep(0.01)
    assert woken == []  # real time passing moves nothing
    tasks[3].cancel()
    clock.advance(15)
    await asyncio.sleep(0)
    assert woken == ["a"]
    clock.current = start + timedelta(seconds=30)  # (set, as well as advanced)
    await asyncio.gather(*tasks[:3])
    assert woken == ["a", "b", "c"]
    await clock.sleep_until(start)  # a time that has come: at once


async def test_the_system_clock_sleeps_until_the_time_has_come() -> None:
    clock = Clock()
    began = time.monotonic()
    await clock.sleep_until(clock.now() + timedelta(seconds=0.05))
    assert time.monotonic() - began >= 0.045
    assert clock.now().tzinfo is UTC
