"""A request no agent could ever hold is refused at creation, not queued forever; one that fits an agent
that is busy still waits, with its reason (bai/node/manager/rules/placeable.py, requests.parse_create)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from bai.client.api import APIError
from bai.common.problems import Problem
from bai.node.manager.http.requests import parse_create
from bai.node.manager.rules.placeable import fits_ever, unplaceable
from tests.nodeproc import Node, wait_status
from tests.tui_support import node_client

GiB = 1024**3
KNOWN = {"cpu", "mem", "cuda.device", "cuda.shares"}
DEFAULTS = {"cpu": "1", "mem": "512m"}


def agent(aid: str, group: str = "default", status: str = "ALIVE", **slots: str) -> dict[str, Any]:
    return {
        "id": aid,
        "scaling_group": group,
        "status": status,
        "slots": {k.replace("_", "."): v for k, v in slots.items()},
    }


def req(**slots: str | int) -> dict[str, Decimal]:
    return {k.replace("_", "."): Decimal(v) for k, v in slots.items()}


# -- the pure check --------------------------------------------------------------------------------


def test_a_request_larger_than_every_agent_is_refused_naming_the_largest() -> None:
    agents = [agent("a-small", cpu="2", mem=str(8 * GiB)), agent("b-big", cpu="4", mem=str(16 * GiB))]
    problem = unplaceable(req(cpu=64, mem=GiB), "default", agents)
    assert isinstance(problem, Problem) and problem.status == 400
    assert problem.msg is not None
    assert "scaling group default" in problem.msg and "cpu=64" in problem.msg
    assert "b-big" in problem.msg and "cpu=4, mem=16GiB" in problem.msg and "a-small" not in problem.msg
    assert problem.data == {
        "scaling_group": "default",
        "requested": {"cpu": "64", "mem": str(GiB)},
        "short": ["cpu"],
        "largest_agent": {"id": "b-big", "slots": {"cpu": "4", "mem": str(16 * GiB)}},
    }
    assert json.dumps(problem.body())  # the API can send it


def test_a_request_that_fits_some_agent_at_full_capacity_passes() -> None:
    agents = [agent("a", cpu="2", mem=str(8 * GiB)), agent("b", cpu="8", mem=str(GiB))]
    assert unplaceable(req(cpu=2, mem=8 * GiB), "default", agents) is None  # exactly a's total
    assert unplaceable(req(cpu=8, mem=GiB), "default", agents) is None
    assert unplaceable(req(cpu="0.001"), "default", agents) is None


def test_every_slot_must_fit_on_one_and_the_same_agent() -> None:
    # a has the cpu, b the memory: neither holds both
    agents = [agent("a", cpu="8", mem=str(GiB)), agent("b", cpu="1", mem=str(64 * GiB))]
    problem = unplaceable(req(cpu=4, mem=32 * GiB), "default", agents)
    assert problem is not None and problem.msg is not None
    assert "can ever hold" in problem.msg


def test_only_alive_agents_of_the_group_count_and_a_group_without_any_refuses_nothing() -> None:
    agents = [
        agent("gone", status="LOST", cpu="64", mem=str(64 * GiB)),
        agent("done", status="TERMINATED", cpu="64", mem=str(64 * GiB)),
        agent("gpu-host", group="gpu", cpu="64", mem=str(64 * GiB)),
        agent("small", cpu="2", mem=str(4 * GiB)),
    ]
    problem = unplaceable(req(cpu=64), "default", agents)
    assert problem is not None and problem.msg is not None and "small" in problem.msg
    assert "its only agent" in problem.msg
    assert unplaceable(req(cpu=64), "gpu", agents) is None
    # nothing alive in the group (yet): the session waits for an agent to join, as before
    assert unplaceable(req(cpu=1000), "empty", agents) is None
    assert unplaceable(req(cpu=1000), "default", agents[:2]) is None
    assert unplaceable(req(cpu=1000), "default", []) is None


def test_a_slot_no_agent_offers_is_a_shortfall() -> None:
    problem = unplaceable(req(cuda_device=1), "default", [agent("cpu-only", cpu="2", mem=str(GiB))])
    assert problem is not None and problem.msg is not None
    assert "cuda.device=1" in problem.msg and "cpu=2, mem=1GiB" in problem.msg


def test_gpus_must_pack_onto_the_devices_when_they_are_known() -> None:
    host = agent("g", cpu="8", mem=str(8 * GiB), cuda_device="1", cuda_shares="1")
    gpus = {"g": {"devices": [{"index": 0, "uuid": "GPU-0"}]}}
    # one whole device plus half of another: the slots fit (1 <= 1, 0.5 <= 1), one GPU cannot hold it
    both = req(cuda_device=1, cuda_shares="0.5")
    assert fits_ever(both, {k: Decimal(v) for k, v in host["slots"].items()})  # without device knowledge
    problem = unplaceable(both, "default", [host], gpus)
    assert problem is not None and problem.msg is not None and "on 1 GPU(s)" in problem.msg
    assert unplaceable(req(cuda_shares="0.5"), "default", [host], gpus) is None
    assert unplaceable(req(cuda_device=1), "default", [host], gpus) is None


def test_kernels_sharing_one_agent_add_up() -> None:
    agents = [agent("a", cpu="4", mem=str(8 * GiB))]
    assert unplaceable(req(cpu=2), "default", agents, kernels=2) is None
    problem = unplaceable(req(cpu=2), "default", agents, kernels=3)
    assert problem is not None and problem.msg is not None
    assert "cpu=6" in problem.msg and "3 kernels on one agent" in problem.msg


def test_a_drained_agent_still_counts() -> None:
    # drained agents stay ALIVE in the store (only their heartbeats say they take nothing new)
    assert unplaceable(req(cpu=2), "default", [agent("drained", cpu="2", mem=str(GiB))]) is None


# -- parsing: amounts no kernel could be given --------------------------------------------------------


def parse_resources(resources: dict[str, Any]):
    body = {"image": "python", "config": {"resources": resources}}
    return parse_create(body, KNOWN, DEFAULTS, {}, datetime.now(UTC))


@pytest.mark.parametrize(
    ("resources", "words"),
    [
        ({"mem": "inf"}, ("config.resources.mem", "finite")),
        ({"mem": "Infinity"}, ("config.resources.mem", "finite")),
        ({"mem": float("inf")}, ("config.resources.mem", "finite")),
        ({"mem": "nan"}, ("config.resources.mem",)),
        ({"mem": float("nan")}, ("config.resources.mem",)),
        ({"mem": -1}, ("config.resources.mem", "negative")),
        ({"mem": "-1g"}, ("config.resources.mem",)),
        ({"mem": "0.5"}, ("config.resources.mem", "whole number of bytes")),
        ({"mem": 10**40}, ("config.resources.mem", "too large")),
        ({"mem": "100000000000p"}, ("config.resources.mem", "too large")),
        ({"mem": 1e308}, ("config.resources.mem",)),
        ({"cpu": "inf"}, ("config.resources.cpu", "finite")),
        ({"cpu": float("inf")}, ("config.resources.cpu", "finite")),
        ({"cpu": "nan"}, ("config.resources.cpu", "finite")),
        ({"cpu": 1e308}, ("config.resources.cpu", "too large")),
        ({"cpu": "1e20"}, ("config.resources.cpu", "too large")),
        ({"cpu": -2}, ("config.resources.cpu", "negative")),
        ({"cpu": "0.0001"}, ("config.resources.cpu", "below the smallest unit", "0.001")),
        ({"cpu": 1e-9}, ("config.resources.cpu", "below the smallest unit")),
        ({"cpu": True}, ("config.resources.cpu",)),
        ({"cpu": [1]}, ("config.resources.cpu",)),
        ({"cuda.device": "0.5"}, ("config.resources.cuda.device", "whole number of devices")),
        ({"cuda.device": "inf"}, ("config.resources.cuda.device", "finite")),
        ({"cuda.shares": "0.0004"}, ("config.resources.cuda.shares", "below the smallest unit")),
        ({"cuda.shares": -0.5}, ("config.resources.cuda.shares", "negative")),
        ({"cuda.shares": "Infinity"}, ("config.resources.cuda.shares", "finite")),
    ],
    ids=repr,
)
def test_amounts_no_kernel_could_be_given_are_a_400_naming_the_field(resources: dict[str, Any], words) -> None:
    with pytest.raises(Problem) as err:
        parse_resources(resources)
    assert err.value.status == 400 and err.value.slug == "invalid-api-params"
    for word in words:
        assert word in (err.value.msg or ""), err.value.msg


def test_usual_amounts_still_parse() -> None:
    got = parse_resources({"cpu": "0.001", "mem": "1", "cuda.device": 2, "cuda.shares": "0.25"}).resources
    assert got == {
        "cpu": Decimal("0.001"),
        "mem": Decimal(1),
        "cuda.device": Decimal(2),
        "cuda.shares": Decimal("0.25"),
    }
    # 0 (or nothing) still means "the default"
    assert parse_resources({"cpu": 0, "mem": ""}).resources == {"cpu": Decimal(1), "mem": Decimal(512 * 1024**2)}


# -- against a node ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_node(tmp_path_factory) -> Iterator[Node]:
    node = Node(tmp_path_factory.mktemp("unplaceable"), "local", agent_config='cpu = "2"\nmem = "4g"\n').start()
    yield node
    node.stop()


def test_cli_create_of_more_cpu_than_any_agent_has_fails_naming_the_largest(small_node: Node) -> None:
    result = small_node.cli("session", "create", "python", "--name", "too-big", "--cpu", "64", "--no-wait")
    assert result.returncode != 0
    said = result.stdout + result.stderr
    assert "cpu=64" in said and small_node.agent_id in said and "cpu=2, mem=4GiB" in said, said
    assert "too-big" not in small_node.cli("session", "ls", "--all", check=True).stdout  # nothing stored


async def test_api_refuses_what_can_never_fit_and_mem_inf(small_node: Node) -> None:
    client = node_client(small_node)
    body = {"image": "python", "name": "api-big", "enqueueOnly": True, "config": {"resources": {"mem": "64g"}}}
    with pytest.raises(APIError) as err:
        await client.request("POST", "/session", json_body=body)
    assert err.value.status == 400 and "mem=64GiB" in (err.value.msg or "")
    body["config"] = {"resources": {"mem": "inf"}}
    with pytest.raises(APIError) as err:
        await client.request("POST", "/session", json_body=body)
    assert err.value.status == 400 and "config.resources.mem" in (err.value.msg or "")


def test_a_request_that_fits_a_busy_agent_still_waits_with_its_reason(small_node: Node) -> None:
    small_node.cli("session", "create", "python", "--name", "cpu-hog", "--cpu", "2", check=True)
    try:
        small_node.cli("session", "create", "python", "--name", "waiter", "--cpu", "1", "--no-wait", check=True)
        info = wait_status(small_node, "waiter", "PENDING")
        for _ in range(100):
            if info["statusInfo"]:
                break
            info = wait_status(small_node, "waiter", "PENDING")
        assert info["statusInfo"] == "no-available-instances"
        assert "cpu" in info["statusData"]["scheduler"]["msg"]
        small_node.cli("session", "destroy", "cpu-hog", check=True)
        wait_status(small_node, "waiter", "RUNNING", timeout=30)  # the agent freed up: it starts
    finally:
        small_node.cli("session", "destroy", "waiter")
        small_node.cli("session", "destroy", "cpu-hog")
