"""The multifactor policy and backfill through the dispatcher's real round on the in-process harness: priorities
(bounded by the keypair's policy, changed while waiting), time limits (ended when they run out, and what backfill
plans with), reservations with their expected start in what a waiting session shows, fair-share usage that
outlives a manager restart, and the routes that set a priority (REST and Backend.AI's GraphQL mutation)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from bai.common.problems import Problem
from bai.node.manager.services.fair_share import standings
from tests.harness import Harness

MULTIFACTOR = {"scaling_groups": {"default": {"policy": "multifactor"}}}


async def test_priority_orders_the_queue_and_is_bounded_by_the_policy(tmp_path) -> None:
    async with Harness(tmp_path, config=MULTIFACTOR) as h:
        await h.add_agent("a1", cpu=1)
        await h.policy("low", max_priority=20)
        capped = await h.keypair("capped@example.com", "low")
        await h.create("mf-first", cpu=1)
        await h.schedule()
        await h.wait("mf-first", "RUNNING")
        old = await h.create("mf-old", cpu=1)  # priority 10 (the default)
        urgent = await h.create("mf-urgent", cpu=1, priority=90, owner=capped)
        assert (old.priority, urgent.priority) == (10, 20)  # 90 asked, its policy allows 20
        await h.create("mf-later", cpu=1, priority=50)
        await h.schedule()
        waiting = {r: await h.info(r) for r in ("mf-old", "mf-urgent", "mf-later")}
        positions = {r: w["queuePosition"] for r, w in waiting.items()}
        assert positions == {"mf-later": 1, "mf-urgent": 2, "mf-old": 3}, positions
        factors = waiting["mf-later"]["statusData"]["scheduler"]["factors"]
        # (the admin holds all the usage there is, with a share of one of the two keypairs waiting: 2^-2)
        assert factors["priority"] == 0.5 and factors["fair_share"] == 0.25 and factors["score"] > 5000
        # the owner raises one: as far as its policy allows; the admin (its owner here) to anything
        raised = await h.lifecycle.set_priority(await h.row("mf-urgent", capped), 100)
        assert raised.priority == 20
        raised = await h.lifecycle.set_priority(await h.row("mf-old"), 95, is_admin=True)
        assert raised.priority == 95
        await h.destroy("mf-first")
        await h.schedule()
        await h.wait("mf-old", "RUNNING")  # 95 now: first


async def test_a_blocked_session_is_reserved_with_its_expected_start_and_shorter_ones_backfill(tmp_path) -> None:
    async with Harness(tmp_path, config=MULTIFACTOR) as h:
        await h.add_agent("a1", cpu=4)
        await h.create("bf-running", cpu=3, timeLimit=3600)  # ends within the hour at the latest
        await h.schedule()
        running = await h.wait("bf-running", "RUNNING")
        await h.create("bf-big", cpu=4, priority=50, timeLimit=7200)
        await h.create("bf-short", cpu=1, timeLimit=600)  # done before bf-big could start: it may go first
        await h.create("bf-long", cpu=1, timeLimit=5 * 3600)  # would delay bf-big: waits
        await h.schedule()
        await h.wait("bf-short", "RUNNING")
        big = await h.info("bf-big")
        reservation = big["statusData"]["scheduler"]["reservation"]
        assert reservation["agents"] == ["a1"]
        assert (
            reservation["starts_at"]
            == (__import__("datetime").datetime.fromisoformat(running.started_at) + timedelta(seconds=3600)).isoformat()
        )
        assert "reserved: starts by" in big["statusData"]["scheduler"]["msg"]
        assert (await h.info("bf-long"))["status"] == "PENDING"
        # its time limit ends bf-short (the timers), as it would any session past its own
        h.clock.advance(601)
        await h.timers.sweep_limits(h.clock.now())
        ended = await h.wait("bf-short", "TERMINATED")
        assert ended.status_info == "time-limit"


async def test_fair_share_usage_is_kept_and_outlives_a_restart(tmp_path) -> None:
    config = {**MULTIFACTOR, "manager": {"fair_share_half_life": "1h"}}
    async with Harness(tmp_path, config=config) as h:
        await h.add_agent("a1", cpu=2)
        heavy = await h.keypair("heavy@example.com")
        light = await h.keypair("light@example.com")
        await h.create("fs-hog", cpu=2, owner=heavy)
        await h.schedule()
        await h.wait("fs-hog", "RUNNING")
        await h.create("fs-heavy-next", cpu=1, owner=heavy)
        h.clock.advance(1800)
        await h.schedule()  # half an hour of 2 cores charged to heavy
        await h.create("fs-light", cpu=1, owner=light)
        h.clock.advance(1)
        await h.schedule()
        heavy_next = (await h.info("fs-heavy-next", heavy))["statusData"]["scheduler"]["factors"]
        light_waiting = (await h.info("fs-light", light))["statusData"]["scheduler"]["factors"]
        assert light_waiting["fair_share"] == 1.0 and heavy_next["fair_share"] < 0.5
        assert (await h.info("fs-light", light))["queuePosition"] == 1  # the light user's, though it came later
        stored = await h.store.fair_share_usage()
        hog = stored[f"keypair:{heavy}"][0]
        assert 2 * 1800 * 0.7 < hog < 2 * 1800 * 1.1  # two cores for half an hour, decayed within that time
    async with Harness(tmp_path, config=config) as h:  # the same state folder: a restarted manager
        usage = await h.dispatcher.fair_share.advance(h.clock.now(), [])
        assert usage[f"keypair:{heavy}"] > 0 and f"keypair:{light}" not in usage


async def test_fair_share_standings_rank_the_heavy_user_first_before_and_after_a_restart(tmp_path) -> None:
    """What `bai scheduler fair-share` shows: the usage the rounds counted, decayed to now, each keypair's part and
    the factor the scheduler gives it; a keypair that only waits is compared with factor 1."""
    config = {**MULTIFACTOR, "manager": {"fair_share_half_life": "1h"}}
    async with Harness(tmp_path, config=config) as h:
        await h.add_agent("a1", cpu=2)
        heavy = await h.keypair("heavy@example.com")
        light = await h.keypair("light@example.com")
        await h.create("st-hog", cpu=2, owner=heavy)
        await h.schedule()
        await h.wait("st-hog", "RUNNING")
        h.clock.advance(3600)
        await h.schedule()  # an hour of 2 cores: 7,200 slot-seconds, about 5,000 once decayed over it
        await h.create("st-light", cpu=1, owner=light)
        fair = h.services.fair_share
        assert fair is not None
        usage = await fair.current(h.clock.now())
        ranked = standings(fair.keypairs(usage), {light: 1})
        assert [r.key for r in ranked] == [heavy, light]
        assert 7200 * 0.5 < ranked[0].usage < 7200 and ranked[0].part == 1.0 and ranked[0].factor == 0.25
        assert (ranked[1].usage, ranked[1].part, ranked[1].factor, ranked[1].waiting) == (0.0, 0.0, 1.0, 1)
        later = await fair.current(h.clock.now() + timedelta(hours=1))  # (decayed: nothing charged by reading)
        assert abs(later[f"keypair:{heavy}"] - usage[f"keypair:{heavy}"] / 2) < 1e-6
        before = usage[f"keypair:{heavy}"]
    async with Harness(tmp_path, config=config) as h:  # a restarted manager: what was stored, decayed since
        fair = h.services.fair_share
        assert fair is not None
        after = (await fair.current(h.clock.now()))[f"keypair:{heavy}"]
        assert 0 < after <= before * 1.000001


async def test_careless_priorities_and_time_limits_are_refused(tmp_path) -> None:
    async with Harness(tmp_path, config=MULTIFACTOR) as h:
        await h.add_agent("a1", cpu=1)
        for body in ({"priority": 101}, {"priority": -1}, {"priority": "high"}, {"priority": True}, {"priority": 1.5},
                     {"timeLimit": 0}, {"timeLimit": -5}, {"timeLimit": "1h"}, {"timeLimit": 1e12}):  # fmt: skip
            with pytest.raises(Problem) as refused:
                await h.create("careless", cpu=1, **body)
            assert refused.value.status == 400, body
        assert not await h.store.find_sessions("careless", h.admin, active_only=False)


async def test_what_is_held_while_nobody_waits_is_charged_too(tmp_path) -> None:
    config = {**MULTIFACTOR, "manager": {"fair_share_half_life": "7d"}}
    async with Harness(tmp_path, config=config) as h:
        await h.add_agent("a1", cpu=2)
        heavy = await h.keypair("alone@example.com")
        await h.create("fs-alone", cpu=2, owner=heavy)
        await h.schedule()
        await h.wait("fs-alone", "RUNNING")
        for _ in range(6):  # the dispatcher's tick: rounds with nothing waiting
            h.clock.advance(600)
            await h.schedule()
        usage = (await h.store.fair_share_usage())[f"keypair:{heavy}"][0]
        # two cores and a GiB (0.1 each) for an hour, a week's half-life: barely decayed
        assert (2 + 0.1) * 3600 * 0.99 < usage <= (2 + 0.1) * 3600, usage
