"""Multi-container sessions through their lifecycle, in the in-process harness (simulated kernels): every kernel
starts or none does, one kernel ending ends the session naming it, destroy removes every kernel, each kernel
gets its place in the cluster, the cluster's variables and the session's SSH keypair."""

from __future__ import annotations

import asyncio

import pytest

from bai.node.agent.backends.base import KernelStartError
from bai.node.manager.services.cluster_keys import ssh_config
from tests.harness import Harness


def _kernels_on(h: Harness, agent_id: str) -> dict[str, object]:
    """{kernel name: KernelSpec} of what the agent runs now."""
    return {f"{k.spec.cluster_role}{k.spec.cluster_idx}": k.spec for k in h.agent(agent_id).kernels.values()}


async def test_a_single_node_session_of_three_kernels_runs_on_one_agent_with_its_cluster_described(tmp_path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("small", cpu=2)
        await h.add_agent("big", cpu=8)
        row = await h.run("trio", cpu=2, clusterSize=3)
        assert row.cluster_size == 3
        specs = _kernels_on(h, "big")
        assert sorted(specs) == ["main1", "sub1", "sub2"]  # 6 cpu together: only "big" holds them
        assert not _kernels_on(h, "small")
        sub2 = specs["sub2"]
        env = sub2.environ
        assert env["BACKENDAI_CLUSTER_SIZE"] == "3"
        assert env["BACKENDAI_CLUSTER_HOSTS"] == "main1,sub1,sub2"
        assert env["BACKENDAI_CLUSTER_HOST"] == "sub2"
        assert env["BACKENDAI_CLUSTER_ROLE"] == "sub"
        assert env["BACKENDAI_CLUSTER_IDX"] == "2"
        assert env["BACKENDAI_CLUSTER_MODE"] == "single-node"
        assert env["BACKENDAI_CLUSTER_REPLICAS"] == "main:1,sub:2"
        assert sub2.cluster.network.startswith("bai-cluster-") and sub2.cluster.rank == 2
        assert sub2.cluster.local_rank == 2  # the third of the session's kernels on this agent
        # the session's keypair, the same in every kernel; its config names every kernel
        files = {d.path: d for d in sub2.dotfiles}
        assert files[".ssh/id_cluster"].data.startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
        assert files[".ssh/id_cluster"].mode == 0o600
        assert files[".ssh/authorized_keys"].data == files[".ssh/id_cluster.pub"].data
        assert files[".ssh/authorized_keys"].data.startswith("ssh-ed25519 ")
        assert files[".ssh/config"].data == ssh_config(["main1", "sub1", "sub2"])
        main_files = {d.path: d.data for d in specs["main1"].dotfiles}
        assert main_files[".ssh/id_cluster"] == files[".ssh/id_cluster"].data
        # slots are per kernel: the agent holds three kernels' worth
        info = await h.info("trio")
        kernels = await h.store.kernels_of(row.id)
        assert [f"{k.cluster_role}{k.cluster_idx}" for k in kernels] == ["main1", "sub1", "sub2"]
        assert {k.agent_id for k in kernels} == {"big"}
        assert info["status"] == "RUNNING"
        # a second session of that size no longer fits "big" (2 cpu left): it waits
        await h.create("trio-2", cpu=2, clusterSize=3)
        await h.schedule()
        assert await h.status("trio-2") == "PENDING"
        await h.destroy("trio")
        assert not _kernels_on(h, "big")
        await h.schedule()
        await h.wait("trio-2", "RUNNING")


async def test_a_multi_node_session_spreads_its_kernels_and_each_knows_its_local_rank(tmp_path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("a1", cpu=1)
        await h.add_agent("a2", cpu=1)
        await h.run("pair", cpu=1, clusterSize=2, clusterMode="multi-node")
        on1, on2 = _kernels_on(h, "a1"), _kernels_on(h, "a2")
        assert sorted([*on1, *on2]) == ["main1", "sub1"] and len(on1) == len(on2) == 1
        for spec in [*on1.values(), *on2.values()]:
            assert spec.cluster.mode == "multi-node" and spec.cluster.network.startswith("bai-cluster-")
            assert spec.cluster.hosts == ["main1", "sub1"] and sorted(spec.cluster.agents) == ["a1", "a2"]
            assert spec.environ["BACKENDAI_CLUSTER_MODE"] == "multi-node"
            assert spec.environ["LOCAL_RANK"] == "0"  # alone on its agent
        # execute goes to main1 unless told
        row = await h.row("pair")
        main = await h.reads.kernel_for(row, None)
        sub = await h.reads.kernel_for(row, "sub1")
        assert (main.cluster_role, sub.cluster_role) == ("main", "sub")
        assert main.agent_id != sub.agent_id
        with pytest.raises(Exception) as missing:
            await h.reads.kernel_for(row, "sub7")
        assert "main1, sub1" in str(missing.value)
        await h.destroy("pair")
        assert not _kernels_on(h, "a1") and not _kernels_on(h, "a2")
        assert await h.status("pair") == "TERMINATED"


async def test_a_kernel_that_cannot_start_cancels_the_session_naming_it_and_removes_the_others(tmp_path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("a1", cpu=1)
        bad = await h.add_agent("a2", cpu=1)
        started = asyncio.Event()

        async def refuse(spec, on_output):  # a2 cannot create its kernel (after a1 has created its own)
            await started.wait()
            raise KernelStartError("image 'python' not found on agent a2")

        original = h.nodes["a1"].backend.create

        async def create_then_signal(spec, on_output):
            kernel = await original(spec, on_output)
            started.set()
            return kernel

        h.nodes["a1"].backend.create = create_then_signal
        bad.backend.create = refuse
        await h.create("pair", cpu=1, clusterSize=2, clusterMode="multi-node")
        await h.schedule()
        row = await h.wait("pair", "CANCELLED")
        error = row.status_data["error"]
        assert row.status_info == "failed-to-start"
        on_a2 = "sub1" if error["kernel"] == "sub1" else "main1"
        assert error["repr"] == f"kernel {on_a2} on agent a2: image 'python' not found on agent a2"
        await h.until(lambda: not _kernels_on(h, "a1"), what="the kernel that started is removed")
        # the slots are free again
        bad.backend.create = original
        h.nodes["a1"].backend.create = original
        await h.create("again", cpu=1, clusterSize=2, clusterMode="multi-node")
        await h.schedule()
        await h.wait("again", "RUNNING")


async def test_one_kernel_ending_ends_the_session_naming_it_and_removes_the_rest(tmp_path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("a1", cpu=4)
        row = await h.run("trio", cpu=1, clusterSize=3)
        kernels = {f"{k.spec.cluster_role}{k.spec.cluster_idx}": k for k in h.agent("a1").kernels.values()}
        kernels["sub1"].set_exit(3)
        ended = await h.wait("trio", "TERMINATED")
        assert ended.status_data["kernel"] == "sub1"
        assert "kernel sub1 on agent a1 ended" in ended.status_data["msg"]
        await h.until(lambda: not h.agent("a1").kernels, what="the other kernels are removed")
        stored = {f"{k.cluster_role}{k.cluster_idx}": k for k in await h.store.kernels_of(row.id)}
        assert stored["sub1"].exit_code == 3
        assert {k.status for k in stored.values()} == {"TERMINATED"}


async def test_a_cluster_no_agent_set_can_hold_is_refused_with_the_shortfall(tmp_path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("a1", cpu=2)
        await h.add_agent("a2", cpu=1)
        with pytest.raises(Exception) as spread:
            await h.create("four", cpu=1, clusterSize=4, clusterMode="multi-node")
        assert "can hold 3 at most (a1: 2, a2: 1)" in str(spread.value)
        with pytest.raises(Exception) as single:
            await h.create("three", cpu=1, clusterSize=3)  # single-node: 3 cpu on one agent
        assert "3 kernels on one agent" in str(single.value)
        await h.create("fits", cpu=1, clusterSize=3, clusterMode="multi-node")
        await h.schedule()
        await h.wait("fits", "RUNNING")


async def test_a_restarted_agent_that_lost_a_kernel_ends_the_session_and_the_others_go(tmp_path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("a1", cpu=1)
        await h.add_agent("a2", cpu=1, keeps_kernels=True)
        await h.run("pair", cpu=1, clusterSize=2, clusterMode="multi-node")
        # a2 keeps its kernel over a restart: the session runs on
        await h.restart_agent("a2", keep_kernels=True)
        assert await h.status("pair") == "RUNNING"
        assert len(h.agent("a2").kernels) == 1
        # a1 comes back without its kernel: the session ends naming it, and a2's kernel is removed
        lost = next(iter(_kernels_on(h, "a1")))
        await h.restart_agent("a1", keep_kernels=False)
        row = await h.wait("pair", "TERMINATED")
        assert f"kernel {lost} was gone when agent a1 restarted" in row.status_data["msg"]
        await h.until(lambda: not h.agent("a2").kernels, what="the kernel on the other agent is removed")


async def test_a_batch_cluster_session_runs_its_command_on_main1_and_ends_every_kernel(tmp_path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("a1", cpu=4)
        row = await h.run("job-1", cpu=1, clusterSize=2, type="batch", command="exit 0")
        assert row.result == "SUCCESS"
        assert not h.agent("a1").kernels


async def test_without_ssh_keygen_a_cluster_session_starts_with_its_ssh_config_only(tmp_path, monkeypatch) -> None:
    import bai.node.manager.services.cluster_keys as keys

    monkeypatch.setattr(keys.shutil, "which", lambda name: None)
    async with Harness(tmp_path) as h:
        await h.add_agent("a1", cpu=4)
        await h.run("pair", cpu=1, clusterSize=2)
        for spec in _kernels_on(h, "a1").values():
            assert [d.path for d in spec.dotfiles] == [".ssh/config"]
