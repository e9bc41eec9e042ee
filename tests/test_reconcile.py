"""Agents that stop, restart, vanish and come back, on the in-process harness (tests/harness.py): what
the manager makes of their kernels when they register again, and of their sessions while they are away."""

from __future__ import annotations

from tests.harness import Harness
from tests.nodeproc import containers_after_destroy


async def test_an_agent_that_restarts_with_its_kernels_keeps_its_sessions_running(tmp_path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("a1")
        await h.run("keeps-going")
        kernels = h.kernels_on("a1")
        await h.restart_agent("a1", keep_kernels=True)
        assert await h.agent_statuses() == {"a1": "ALIVE"}
        assert h.kernels_on("a1") == kernels  # adopted, nothing destroyed
        assert await h.transitions("keeps-going") == ["PENDING", "SCHEDULED", "PREPARING", "RUNNING"]
        result = await h.execute("keeps-going", "print('still here')")
        assert result["console"] == [["stdout", "still here\n"]]
        await h.destroy("keeps-going")
        assert h.kernels_on("a1") == set()


async def test_an_agent_that_restarts_without_its_kernels_ends_their_sessions(tmp_path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("a1", cpu=2)
        await h.run("was-running")
        await h.restart_agent("a1", keep_kernels=False)
        ended = await h.wait("was-running", "TERMINATED")
        assert ended.status_info == "agent-termination"
        assert ended.status_data == {"msg": "the kernel was gone when agent a1 restarted"}
        # its slots are free again
        await h.run("after-restart", cpu=2)


async def test_a_stopped_agent_is_terminated_and_its_sessions_wait_for_it(tmp_path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("a1", keeps_kernels=True)  # its kernels outlive it, as containers do
        await h.run("on-a1")
        await h.add_agent("a2")
        await h.stop_agent("a1")
        assert await h.agent_statuses() == {"a1": "TERMINATED", "a2": "ALIVE"}
        assert await h.status("on-a1") == "RUNNING"
        await h.run("elsewhere")
        assert (await h.info("elsewhere"))["agent"] == "a2"  # a stopped agent takes nothing
        await h.start_agent("a1")
        assert await h.status("on-a1") == "RUNNING"
        assert (await h.execute("on-a1", "print(1)"))["exitCode"] == 0


async def test_a_lost_agent_that_comes_back_within_the_grace_period_keeps_its_sessions(tmp_path) -> None:
    async with Harness(tmp_path, lost_grace=60) as h:
        await h.add_agent("a1")
        await h.run("patient")
        await h.lose_agent("a1", wait_grace=False)
        assert await h.agent_statuses() == {"a1": "LOST"}
        assert h.in_grace("a1")
        await h.start_agent("a1", keep_kernels=True)
        assert await h.agent_statuses() == {"a1": "ALIVE"}
        assert await h.status("patient") == "RUNNING"
        assert not h.in_grace("a1")  # the grace period no longer runs out
        assert (await h.execute("patient", "print('back')"))["console"] == [["stdout", "back\n"]]


async def test_a_lost_agent_ends_its_sessions_in_error_after_the_grace_period(tmp_path) -> None:
    async with Harness(tmp_path, lost_grace=0.01) as h:
        await h.add_agent("victim", cpu=2)
        await h.add_agent("spare", cpu=2)
        await h.run("on-victim", cpu=2)
        victim = (await h.info("on-victim"))["agent"]
        spare = "spare" if victim == "victim" else "victim"
        await h.lose_agent(victim)
        assert await h.agent_statuses() == {victim: "LOST", spare: "ALIVE"}
        # new work goes to the agent that is left
        await h.run("after-loss", cpu=1)
        assert (await h.info("after-loss"))["agent"] == spare
        lost = await h.wait("on-victim", "ERROR")
        assert lost.status_info == "agent-lost"
        assert f"agent {victim} stopped heartbeating" in lost.status_data["msg"]
        # it comes back (its kernels died with it): the session ends with a reason, its slots are free
        await h.start_agent(victim, keep_kernels=False)
        ended = await h.wait("on-victim", "TERMINATED")
        assert ended.status_info == "agent-termination"
        assert await h.transitions("on-victim") == [
            "PENDING",
            "SCHEDULED",
            "PREPARING",
            "RUNNING",
            "ERROR",
            "TERMINATED",
        ]
        await h.run("on-victim-again", cpu=2)


async def test_kernels_the_manager_does_not_know_are_removed_when_their_agent_registers(tmp_path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("a1", keeps_kernels=True)
        await h.run("destroyed-meanwhile")
        kept = h.kernels_on("a1")
        await h.stop_agent("a1")
        await h.destroy("destroyed-meanwhile")  # the agent cannot be told: the session ends anyway
        assert (await h.row("destroyed-meanwhile")).status == "TERMINATED"
        assert h.kernels_on("a1") == kept  # still there, unknown to the manager now
        await h.start_agent("a1")
        assert h.kernels_on("a1") == set()  # the join answer told the agent to remove it


async def test_a_session_starting_on_an_agent_that_restarts_is_cancelled(tmp_path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("a1", start_delay=60)  # the kernel takes a minute to start
        await h.create("interrupted")
        await h.schedule()
        await h.until(lambda: h.kernels_starting("a1"), what="the agent creates the kernel")
        await h.restart_agent("a1", keep_kernels=False)
        cancelled = await h.wait("interrupted", "CANCELLED")
        assert cancelled.status_info == "failed-to-start"
        assert cancelled.status_data["error"]["name"] == "AgentRestarted"


# -- for real: a docker agent killed, its containers running on (finding 7 of the review) ---------------------


def test_a_session_lost_with_a_killed_docker_agent_is_forced_to_an_end_and_its_container_goes(
    tmp_path, python_image: str
) -> None:
    """The agent is killed (its containers run on) and its sessions end in ERROR (agent-lost): `destroy` is a 403
    that says to use --force, `destroy --force` ends one (TERMINATED) at once; when the agent comes back, that
    one's container and the container of the other ERROR session are removed (the other one TERMINATED), and
    the slots are free."""
    import time

    from tests.test_cluster import docker_cluster, wait_until

    with docker_cluster(tmp_path) as cluster:
        for name in ("forced-end", "ends-on-return"):
            cluster.cli("session", "create", "python", "--name", name, check=True)
        agent = cluster.agents[0]
        assert len(agent.leftover_containers()) == 2
        agent.kill()  # kill -9: the containers run on

        def status(name: str) -> str:
            return cluster.json("session", "info", name)["status"]

        assert wait_until(lambda: status("forced-end") == status("ends-on-return") == "ERROR", timeout=20)
        refused = cluster.cli("session", "destroy", "forced-end")
        assert refused.returncode != 0 and "forced" in refused.stderr and "ERROR" in refused.stderr, refused
        started = time.monotonic()
        cluster.cli("session", "destroy", "--force", "forced-end", check=True)  # the agent is away: at once
        assert time.monotonic() - started < 10
        ended = cluster.json("session", "info", "forced-end")
        assert (ended["status"], ended["statusInfo"]) == ("TERMINATED", "force-terminated"), ended
        assert len(agent.leftover_containers()) == 2  # nobody could tell the agent yet
        cluster.agents[0] = agent.start()
        assert wait_until(lambda: status("ends-on-return") == "TERMINATED", timeout=20)
        assert cluster.json("session", "info", "ends-on-return")["statusInfo"] == "agent-lost"
        assert containers_after_destroy(cluster) == []
        cluster.cli("session", "create", "python", "--name", "after-them", check=True)
        cluster.cli("session", "destroy", "after-them", check=True)
