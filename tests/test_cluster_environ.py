"""The names and variables of a multi-container session's kernels (Backend.AI's BACKENDAI_CLUSTER_*)."""

from __future__ import annotations

import json

import pytest

from bai.common.cluster import CLUSTER_PORTS, MASTER_PORT, MAX_CLUSTER_SIZE, SSH_PORT, cluster_environ, members


def test_kernels_are_main1_then_sub1_to_sub_n() -> None:
    assert [m.hostname for m in members(4)] == ["main1", "sub1", "sub2", "sub3"]
    assert [m.hostname for m in members(1)] == ["main1"]
    assert [(m.role, m.idx, m.rank) for m in members(3)] == [("main", 1, 0), ("sub", 1, 1), ("sub", 2, 2)]


@pytest.mark.parametrize("size", [0, -1, MAX_CLUSTER_SIZE + 1, True, 2.0, "2", None])
def test_a_size_out_of_range_is_refused(size) -> None:
    with pytest.raises(ValueError, match="kernels"):
        members(size)


def test_each_kernel_learns_the_cluster_and_itself() -> None:
    env = cluster_environ(4, "multi-node", 2)
    assert env["BACKENDAI_CLUSTER_SIZE"] == "4"
    assert env["BACKENDAI_CLUSTER_HOSTS"] == "main1,sub1,sub2,sub3"
    assert env["BACKENDAI_CLUSTER_REPLICAS"] == "main:1,sub:3"
    assert (env["BACKENDAI_CLUSTER_HOST"], env["BACKENDAI_CLUSTER_ROLE"], env["BACKENDAI_CLUSTER_IDX"]) == (
        "sub2", "sub", "2",
    )  # fmt: skip
    assert env["BACKENDAI_CLUSTER_LOCAL_RANK"] == env["WORLD_RANK"] == "2"
    assert env["BACKENDAI_CLUSTER_MODE"] == "multi-node" and env["MASTER_ADDR"] == "main1"
    tf = json.loads(env["TF_CONFIG"])
    assert tf["task"] == {"type": "worker", "index": 2} and tf["cluster"]["worker"][0] == "main1:12345"
    main = cluster_environ(1, "single-node", 0)
    assert main["BACKENDAI_CLUSTER_REPLICAS"] == "main:1" and main["BACKENDAI_CLUSTER_HOST"] == "main1"


@pytest.mark.parametrize(("mode", "rank"), [("both", 0), ("single-node", 3), ("single-node", -1)])
def test_a_bad_mode_or_rank_is_refused(mode: str, rank: int) -> None:
    with pytest.raises(ValueError):
        cluster_environ(3, mode, rank)


def test_the_runners_relay_ports_are_the_clusters() -> None:
    """The runner imports nothing of bai: its relay mode's default ports repeat CLUSTER_PORTS."""
    from bai.node.agent import runner

    assert runner._parse_ports(runner.CLUSTER_PORTS) == sorted(CLUSTER_PORTS)
    assert (runner.SSH_PORT, runner.MASTER_PORT) == (SSH_PORT, MASTER_PORT)
