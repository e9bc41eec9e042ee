"""Scheduling through the dispatcher's real round on the in-process harness (tests/harness.py): queue
order, fairness, why a session waits, drained agents, scaling groups, agent selection, GPUs, quotas."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from bai.common.problems import Problem
from bai.node.manager.state.records import PolicyFields
from tests.harness import Harness

NOW = datetime(2026, 1, 1, tzinfo=UTC)  # when these tests' writes are stamped


async def placed_on(h: Harness, name: str) -> str:
    return (await h.info(name))["agent"]


async def reason_of(h: Harness, name: str) -> str:
    return (await h.row(name)).status_info


async def test_a_full_agent_queues_in_order_and_an_ending_session_makes_room(tmp_path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("a1", cpu=2)
        names = ["q-one", "q-two", "q-three", "q-four"]
        for name in names:
            await h.create(name, cpu=1)
        await h.schedule()
        for name in names[:2]:
            await h.wait(name, "RUNNING")
        third, fourth = await h.info("q-three"), await h.info("q-four")
        assert third["status"] == fourth["status"] == "PENDING"
        assert third["statusInfo"] == fourth["statusInfo"] == "no-available-instances"
        assert (third["queuePosition"], fourth["queuePosition"]) == (1, 2)
        assert third["statusData"]["scheduler"]["msg"] == "no agent has room: best is a1 with cpu 0 free of 1 requested"
        woken = h.wakes
        await h.destroy("q-one")
        assert h.wakes > woken  # an ended session wakes the dispatcher: no waiting for its tick
        await h.schedule()
        await h.wait("q-three", "RUNNING")
        assert (await h.info("q-four"))["queuePosition"] == 1
        history = await h.store.scheduling_history((await h.row("q-three")).id)
        assert [e.outcome for e in history] == ["pending", "scheduled"]
        assert history[0].status_info == "no-available-instances" and history[1].agents == "a1"


async def test_lifo_takes_the_newest_first(tmp_path) -> None:
    async with Harness(tmp_path, config={"scaling_groups": {"default": {"policy": "lifo"}}}) as h:
        await h.add_agent("a1", cpu=1)
        for name in ("old-one", "mid-one", "new-one"):
            await h.create(name, cpu=1)
        await h.schedule()
        await h.wait("new-one", "RUNNING")
        assert [(await h.info(n))["queuePosition"] for n in ("mid-one", "old-one")] == [1, 2]


async def test_drf_lets_the_keypair_with_the_smaller_share_go_first(tmp_path) -> None:
    """Alice holds half the cluster and queued first; with DRF, Bob's sessions still go before hers
    (with FIFO, hers would)."""
    for policy, winner in (("drf", "bob"), ("fifo", "alice")):
        config = {"scaling_groups": {"default": {"policy": policy}}}
        async with Harness(tmp_path / policy, config=config) as h:
            await h.add_agent("a1", cpu=4, mem="16g")
            alice, bob = await h.keypair("alice"), await h.keypair("bob")
            for i in range(2):
                await h.create(f"alice-run-{i}", owner=alice)
            await h.schedule()
            for i in range(2):
                await h.wait(f"alice-run-{i}", "RUNNING")
            for i in range(2):
                await h.create(f"alice-more-{i}", owner=alice)
            for i in range(2):
                await h.create(f"bob-first-{i}", owner=bob)
            await h.schedule()
            prefix = {"bob": "bob-first", "alice": "alice-more"}
            for who, name in prefix.items():
                expected = "RUNNING" if who == winner else "PENDING"
                for i in range(2):
                    if expected == "RUNNING":
                        await h.wait(f"{name}-{i}", "RUNNING")
                    else:
                        assert await h.status(f"{name}-{i}") == "PENDING", (policy, name)


async def test_a_session_that_does_not_fit_now_waits_without_holding_up_the_rest(tmp_path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("a1", cpu=4, mem="2g")
        await h.run("holder", mem="1g")
        await h.create("huge", mem="2g")  # fits the agent, not now
        await h.create("small", mem="512m")
        await h.schedule()
        await h.wait("small", "RUNNING")  # past the one that waits
        info = await h.info("huge")
        assert (info["status"], info["statusInfo"], info["queuePosition"]) == ("PENDING", "no-available-instances", 1)
        assert "mem" in info["statusData"]["scheduler"]["msg"]
        await h.destroy("holder")
        await h.destroy("small")
        await h.schedule()
        await h.wait("huge", "RUNNING")


async def test_a_session_no_agent_could_ever_hold_is_refused_at_creation(tmp_path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("a1", cpu=2, mem="4g")
        with pytest.raises(Problem, match="No agent can ever hold|cpu=8"):
            await h.create("too-big", cpu=8)
        with pytest.raises(Problem, match="unknown resource slot 'cuda.device'"):
            await h.create("no-gpus", resources={"cuda.device": 1})
        assert await h.store.list_sessions(None, None) == []


async def test_drained_agents_take_no_new_sessions_and_keep_theirs(tmp_path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("a1", cpu=2)
        await h.add_agent("a2", cpu=2)
        await h.run("before-drain")
        first = await placed_on(h, "before-drain")
        other = "a2" if first == "a1" else "a1"
        await h.drain(first)
        for name in ("after-drain-1", "after-drain-2"):
            await h.run(name)
            assert await placed_on(h, name) == other
        await h.create("no-room")
        await h.schedule()
        info = await h.info("no-room")
        assert info["statusInfo"] == "no-available-instances"
        assert info["statusData"]["scheduler"]["msg"] == "no agent has room: best is " + (
            f"{other} with cpu 0 free of 1 requested"
        )
        assert await h.status("before-drain") == "RUNNING"  # draining ends nothing
        woken = h.wakes
        await h.drain(first, False)
        assert h.wakes > woken
        await h.schedule()
        await h.wait("no-room", "RUNNING")
        assert await placed_on(h, "no-room") == first
        await h.drain("a1")
        await h.drain("a2")
        await h.create("all-drained")
        await h.schedule()
        assert (await h.row("all-drained")).status_data["scheduler"]["msg"] == (
            "no schedulable agent in scaling group default"
        )


async def test_scaling_groups_keep_their_sessions_on_their_agents(tmp_path) -> None:
    config = {"scaling_groups": {"batch-only": {"allowed_session_types": ["batch"]}}}
    async with Harness(tmp_path, config=config) as h:
        await h.add_agent("general", cpu=8)
        await h.add_agent("gpu-box", cpu=8, group="gpus", gpus=2)
        await h.add_agent("batcher", cpu=8, group="batch-only")
        await h.run("plain")
        assert await placed_on(h, "plain") == "general"
        await h.run("on-gpus", group="gpus", resources={"cuda.device": 1})
        assert await placed_on(h, "on-gpus") == "gpu-box"
        assert (await h.run("a-job", group="batch-only", type="batch")).result == "SUCCESS"
        assert await placed_on(h, "a-job") == "batcher"
        await h.create("chat", group="batch-only")
        await h.schedule()
        info = await h.info("chat")
        assert (info["status"], info["statusInfo"]) == ("PENDING", "predicate-checks-failed")
        assert info["statusData"]["scheduler"]["msg"] == "scaling group batch-only does not allow interactive sessions"
        with pytest.raises(Problem, match="nowhere"):
            await h.create("lost-group", group="nowhere")


async def test_dispersed_spreads_sessions_and_concentrated_packs_them(tmp_path) -> None:
    for selection, spread in (("dispersed", {"a1", "a2", "a3"}), ("concentrated", {"a1"})):
        config = {"scaling_groups": {"default": {"agent_selection": selection}}}
        async with Harness(tmp_path / selection, config=config) as h:
            for agent in ("a1", "a2", "a3"):
                await h.add_agent(agent, cpu=4)
            for i in range(3):
                await h.run(f"spread-{i}")
            placed = {await placed_on(h, f"spread-{i}") for i in range(3)}
            if selection == "concentrated":
                assert len(placed) == 1
            else:
                assert placed == spread


async def test_gpu_sessions_get_whole_devices_until_none_is_left(tmp_path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("gpu-box", cpu=8, gpus=2)
        for name in ("gpu-one", "gpu-two"):
            await h.run(name, resources={"cuda.device": 1})
        devices = [(await h.info(n))["kernels"][0]["devices"] for n in ("gpu-one", "gpu-two")]
        assert sorted(d[0]["uuid"] for d in devices) == ["GPU-gpu-box-0", "GPU-gpu-box-1"]
        assert all(d[0]["share"] == "1" for d in devices)
        await h.create("gpu-three", resources={"cuda.device": 1})
        await h.schedule()
        info = await h.info("gpu-three")
        assert info["statusInfo"] == "no-available-instances"
        assert "cuda.device" in info["statusData"]["scheduler"]["msg"]
        await h.destroy("gpu-one")
        await h.schedule()
        await h.wait("gpu-three", "RUNNING")


async def test_a_keypair_at_its_session_limit_waits_until_the_limit_allows(tmp_path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("a1", cpu=8)
        alice = await h.keypair("alice", await h.policy("one-at-a-time", max_concurrent_sessions=1))
        await h.run("alice-1", owner=alice, cpu=0.5)
        await h.create("alice-2", owner=alice, cpu=0.5)
        await h.run("admin-2")  # other keypairs are not held back
        info = await h.info("alice-2")
        assert (info["status"], info["statusInfo"]) == ("PENDING", "predicate-checks-failed")
        assert info["statusData"]["scheduler"]["msg"] == f"keypair {alice} has 1/1 concurrent sessions"
        await h.store.save_policy("one-at-a-time", PolicyFields(max_concurrent_sessions=2), create=False, now=NOW)
        await h.schedule()
        await h.wait("alice-2", "RUNNING")


async def test_a_keypair_over_its_resource_limit_waits(tmp_path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("a1", cpu=8)
        capped = await h.keypair("capped", await h.policy("two-cpus", total_resource_slots={"cpu": "2"}))
        await h.run("capped-1", owner=capped, cpu=2)
        await h.create("capped-2", owner=capped, cpu=1)
        await h.schedule()
        info = await h.info("capped-2")
        assert info["statusInfo"] == "predicate-checks-failed"
        assert info["statusData"]["scheduler"]["msg"].startswith(f"keypair {capped} would use")
        await h.destroy("capped-1")
        await h.schedule()
        await h.wait("capped-2", "RUNNING")


async def test_the_dispatcher_loop_runs_a_round_when_woken_not_at_its_tick(tmp_path) -> None:
    async with Harness(tmp_path, config={"manager": {"tick": 3600.0}}) as h:
        h.start_dispatcher()
        await h.add_agent("a1", cpu=1)
        await h.create("woken-1")  # creating wakes it
        await h.wait("woken-1", "RUNNING")
        await h.create("woken-2")
        await h.until(lambda: reason_of(h, "woken-2"), what="a round looked at woken-2")
        assert await reason_of(h, "woken-2") == "no-available-instances"
        await h.destroy("woken-1")  # ending one wakes it again
        await h.wait("woken-2", "RUNNING")


async def test_gpu_shares_pack_fractions_onto_one_device(tmp_path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("gpu-box", cpu=8, gpus=2, gpu_shares=True)
        for name in ("half-one", "half-two"):
            await h.run(name, resources={"cuda.shares": "0.5"})
        devices = [(await h.info(n))["kernels"][0]["devices"] for n in ("half-one", "half-two")]
        assert devices[0] == devices[1] == [{"uuid": devices[0][0]["uuid"], "share": "0.5"}]  # the same device
        await h.run("whole-one", resources={"cuda.device": 1})  # the other device is still whole
        await h.create("half-three", resources={"cuda.shares": "0.5"})
        await h.schedule()
        assert await reason_of(h, "half-three") == "no-available-instances"
