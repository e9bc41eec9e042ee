"""A request its keypair's resource policy can never allow is refused at creation (a 412 naming the limit and
the request), not left PENDING for ever `would use cpu 2 of its 1`; one within the limit that waits for the
keypair's other sessions to end still waits (bai/node/manager/rules/admission.py check_policy)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import pytest

from bai.common.problems import Problem
from bai.node.manager.rules.admission import check_policy
from bai.node.manager.state.records import new_policy
from tests.harness import Harness
from tests.nodeproc import Node

GiB = 2**30


@dataclass
class Asked:
    resources: dict[str, Decimal]
    cluster_size: int = 1


def asked(size: int = 1, **slots: str | int) -> Asked:
    return Asked({k.replace("_", "."): Decimal(v) for k, v in slots.items()}, size)


# -- the pure check --------------------------------------------------------------------------------------------


def test_more_of_a_slot_than_the_policy_allows_in_all_is_refused_naming_limit_and_request() -> None:
    policy = new_policy("small", total_resource_slots={"cpu": "1", "mem": str(4 * GiB)})
    problem = check_policy(policy, "AKX", asked(cpu=2, mem=GiB))
    assert isinstance(problem, Problem) and problem.status == 412 and problem.slug == "quota-exceeded"
    assert problem.msg is not None
    assert "asks for cpu 2" in problem.msg and "resource policy small" in problem.msg and "AKX" in problem.msg
    assert "(total_resource_slots): cpu 1;" in problem.msg and "could never start" in problem.msg
    assert "mem" not in problem.msg  # within the limit: not named
    assert problem.data == {
        "policy": "small",
        "requested": {"cpu": "2"},
        "limits": {"cpu": "1"},
        "default_for_unspecified": "UNLIMITED",
    }
    assert json.dumps(problem.body())


def test_every_slot_over_is_named_and_a_cluster_counts_all_its_kernels() -> None:
    policy = new_policy("small", total_resource_slots={"cpu": "1", "mem": str(GiB)})
    problem = check_policy(policy, "AKX", asked(3, cpu="0.5", mem=str(GiB // 2)))
    assert problem is not None and problem.msg is not None
    assert "asks for cpu 1.5, mem 1.5GiB (3 kernels of cpu 0.5, mem 512MiB each)" in problem.msg, problem.msg
    assert "cpu 1, mem 1GiB" in problem.msg
    assert check_policy(policy, "AKX", asked(2, cpu="0.5", mem=str(GiB // 2))) is None  # exactly the limit


def test_a_slot_the_policy_does_not_list_is_zero_when_limited_and_free_otherwise() -> None:
    listed = {"cpu": "4", "mem": str(8 * GiB)}
    limited = new_policy("strict", total_resource_slots=listed, default_for_unspecified="LIMITED")
    problem = check_policy(limited, "AKX", asked(cpu=1, mem=GiB, cuda_device=1))
    assert problem is not None and problem.msg is not None
    assert "cuda.device 0 (not listed; default_for_unspecified = LIMITED)" in problem.msg, problem.msg
    assert check_policy(limited, "AKX", asked(cpu=1, mem=GiB)) is None
    unlimited = new_policy("loose", total_resource_slots=listed)
    assert check_policy(unlimited, "AKX", asked(cpu=1, mem=GiB, cuda_device=8)) is None


def test_no_policy_no_limit_and_infinite_limits_refuse_nothing() -> None:
    big = asked(cpu=512, mem=1024 * GiB)
    assert check_policy(None, "AKX", big) is None
    assert check_policy(new_policy("default"), "AKX", big) is None
    assert check_policy(new_policy("inf", total_resource_slots={"cpu": "Infinity"}), "AKX", big) is None


# -- in-process: nothing is stored; a request within the limit still waits its turn ----------------------------


async def test_the_refused_request_stores_nothing_and_one_within_the_limit_waits(tmp_path: Path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("a1", cpu=8, mem="16g")
        capped = await h.keypair("capped", await h.policy("one-cpu", total_resource_slots={"cpu": "1"}))
        with pytest.raises(Problem) as refused:
            await h.create("too-big", owner=capped, cpu=2)
        assert refused.value.status == 412
        assert "asks for cpu 2" in str(refused.value) and "one-cpu" in str(refused.value)
        assert await h.store.find_sessions("too-big", capped, active_only=False) == []
        # the admin's own default policy limits nothing
        await h.create("admins-big", cpu=2)
        # within the limit: the first runs, the second waits for it (not refused: it fits once the first ends)
        await h.create("first", owner=capped, cpu=1)
        await h.schedule()
        await h.wait("first", "RUNNING")
        await h.create("second", owner=capped, cpu="0.5")
        await h.schedule()
        second = await h.info("second")
        assert second["status"] == "PENDING"
        assert second["statusData"]["scheduler"]["msg"].startswith(f"keypair {capped} would use")


async def test_a_policy_lowered_after_the_fact_is_judged_at_the_next_create(tmp_path: Path) -> None:
    from bai.node.manager.state.records import PolicyFields

    async with Harness(tmp_path) as h:
        await h.add_agent("a1", cpu=8, mem="16g")
        owner = await h.keypair("user", await h.policy("shrinks", total_resource_slots={"cpu": "4"}))
        await h.create("ok-then", owner=owner, cpu=2)
        await h.store.save_policy(
            "shrinks", PolicyFields(total_resource_slots={"cpu": "1"}), create=False, now=h.clock.now()
        )
        with pytest.raises(Problem):
            await h.create("not-now", owner=owner, cpu=2)


# -- the CLI shows the manager's message and exits non-zero -----------------------------------------------------


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    n = Node(tmp_path_factory.mktemp("policy-refusal"), "sim", agent_config='cpu = "4"\nmem = "8g"\n').start()
    yield n
    n.stop()


def test_the_cli_shows_the_refusal_and_exits_non_zero(node: Node) -> None:
    node.cli("policy", "create", "cli-one-cpu", "--slots", "cpu=1", check=True)
    keypair = node.json("keypair", "create", "--user", "carol", "--policy", "cli-one-cpu")
    for command in (("create",), ("create", "--detach"), ("run",)):
        extra = ("-c", "1") if command[0] == "run" else ()
        result = node.cli("session", *command, "python", "--name", "hopeless", "--cpu", "2", *extra, as_keypair=keypair)
        assert result.returncode == 1, (command, result.stderr)
        err = result.stderr
        assert err.startswith("bai: error: The request exceeds its keypair's resource policy."), err
        assert "asks for cpu 2" in err and "resource policy cli-one-cpu" in err and ": cpu 1;" in err, err
        assert "Traceback" not in err and result.stdout == ""
    assert node.cli("session", "info", "hopeless", as_keypair=keypair).returncode != 0  # nothing was queued
