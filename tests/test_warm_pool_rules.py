"""The warm pool's rules (bai/node/agent/warm_pool.py), without I/O, and its assignment file."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from bai.node.agent import assignment, warm_pool
from bai.node.agent.backends.base import KernelSpec, Mount
from bai.node.agent.warm_pool import cold_reason, excess, refill, reserved, retry_delay, targets_of

ALIASES = {"python": "bai-python:3.11"}


def spec(**kw) -> KernelSpec:
    base = dict(
        kernel_id="k1",
        session_id="s1",
        session_name="n",
        access_key="AK",
        image="bai-python:3.11",
        slots={"cpu": Decimal(1), "mem": Decimal(2**30)},
        environ={},
    )
    base.update(kw)
    return KernelSpec(**base)


def test_targets_default_to_one_python_kernel_on_docker_only() -> None:
    assert targets_of({}, ALIASES, "docker") == {"bai-python:3.11": 1}
    assert targets_of(None, ALIASES, "docker") == {"bai-python:3.11": 1}
    assert targets_of({}, ALIASES, "local") == {}
    assert targets_of({"python": 3}, ALIASES, "sim") == {}


def test_targets_resolve_aliases_and_drop_zeros() -> None:
    assert targets_of({"python": 0}, ALIASES, "docker") == {}
    assert targets_of({"python": 1, "bai-python:3.11": 3, "other:1": 2}, ALIASES, "docker") == {
        "bai-python:3.11": 3,
        "other:1": 2,
    }
    for bad in (-1, warm_pool.MAX_PER_IMAGE + 1, True):
        with pytest.raises(ValueError):
            targets_of({"python": bad}, ALIASES, "docker")


def test_eligibility() -> None:
    pooled = {"bai-python:3.11": 2}
    assert cold_reason(spec(), pooled, "none") is None
    assert cold_reason(spec(network="none"), pooled, "none") is None
    assert cold_reason(spec(environ={"MY_VAR": "1"}), pooled, "none") is None
    assert "no warm pool" in cold_reason(spec(image="other:1"), pooled, "none")
    assert "mounts" in cold_reason(spec(mounts=[Mount("/x", "/home/work/x", False)]), pooled, "none")
    assert "devices" in cold_reason(
        spec(slots={"cpu": Decimal(1), "mem": Decimal(1), "cuda.device": 1}), pooled, "none"
    )
    assert "devices" in cold_reason(spec(gpus=[("GPU-1", Decimal(1))]), pooled, "none")
    assert "limit" in cold_reason(spec(slots={"cpu": Decimal(1)}), pooled, "none")
    assert "network" in cold_reason(spec(network="bridge"), pooled, "none")
    assert "main kernel" in cold_reason(spec(cluster_role="sub", cluster_idx=2), pooled, "none")
    for name in ("PYTHONPATH", "LD_PRELOAD", "LANG", "LC_ALL", "PATH", "HOME", "TZ"):
        assert name in cold_reason(spec(environ={name: "x"}), pooled, "none")


def test_refill_largest_shortfall_first_within_parallel_limit() -> None:
    targets = {"a": 3, "b": 1}
    assert refill(targets, {}, {}, {}, 0.0, 1) == ["a"]
    assert refill(targets, {}, {}, {}, 0.0, 2) == ["a", "a"]
    assert refill(targets, {"a": 2}, {}, {}, 0.0, 2) == ["a", "b"]
    assert refill(targets, {"a": 3, "b": 1}, {}, {}, 0.0, 2) == []
    assert refill(targets, {}, {"a": 1}, {}, 0.0, 1) == []  # one in flight already
    assert refill(targets, {"a": 2}, {"a": 1}, {}, 0.0, 2) == ["b"]  # in flight counts as coming


def test_refill_waits_for_cold_starts_and_back_off() -> None:
    targets = {"a": 1, "b": 1}
    assert refill(targets, {}, {}, {}, 0.0, 2, cold_starting=1) == []
    assert refill(targets, {}, {}, {"a": 10.0}, 5.0, 2) == ["b"]
    assert refill(targets, {}, {}, {"a": 10.0}, 10.0, 2) == ["a", "b"]


def test_a_session_waits_only_for_a_warm_kernel_that_nobody_else_awaits() -> None:
    assert warm_pool.wait_for_one(ready=0, creating=1, waiting=0)
    assert not warm_pool.wait_for_one(ready=0, creating=1, waiting=1)
    assert not warm_pool.wait_for_one(ready=0, creating=0, waiting=0)
    assert not warm_pool.wait_for_one(ready=1, creating=1, waiting=0)


def test_excess_when_the_pool_shrinks_or_an_image_leaves() -> None:
    assert excess({"a": 1}, {"a": 3, "b": 1}) == {"a": 2, "b": 1}
    assert excess({"a": 3}, {"a": 2}) == {}


def test_retry_delay_doubles_up_to_a_limit() -> None:
    assert [retry_delay(n) for n in range(5)] == [0.0, 1.0, 2.0, 4.0, 8.0]
    assert retry_delay(50) == warm_pool.RETRY_MAX


def test_reserved_slots() -> None:
    assert reserved({}) == {}
    assert reserved({"a": 2, "b": 1}) == {"cpu": warm_pool.POOL_CPU * 3, "mem": warm_pool.POOL_MEM * 3}


def test_assignment_round_trip(tmp_path: Path) -> None:
    assert assignment.read(tmp_path) is None  # a pooled kernel: no assignment
    s = spec(session_name="my-session")
    assignment.write(tmp_path, s, {"BACKENDAI_KERNEL_ID": "k1"}, assignment.CLAIMED)
    assert assignment.read(tmp_path)["state"] == assignment.CLAIMED
    assignment.write(tmp_path, s, {"BACKENDAI_KERNEL_ID": "k1"}, assignment.READY)
    data = assignment.read(tmp_path)
    assert data["state"] == assignment.READY
    assert (tmp_path / assignment.FILE).stat().st_mode & 0o777 == 0o600
    back = assignment.spec_of(data)
    assert (back.kernel_id, back.session_id, back.session_name, back.slots) == ("k1", "s1", "my-session", s.slots)
    assert assignment.env_of(data) == {"BACKENDAI_KERNEL_ID": "k1"}


def test_a_damaged_assignment_is_never_reused(tmp_path: Path) -> None:
    (tmp_path / assignment.FILE).write_text("{not json")
    assert assignment.read(tmp_path)["state"] == assignment.CLAIMED


def test_cgroup_writes_match_what_docker_sets(tmp_path: Path) -> None:
    from bai.node.agent.cgroups import writes

    v2 = writes({"": tmp_path}, Decimal("1.5"), 2**30, 2**28)
    assert [(p.name, v) for p, v in v2] == [
        ("cpu.max", "150000 100000"),
        ("memory.max", str(2**30)),
        ("memory.swap.max", "0"),
    ]
    cpu, mem = tmp_path / "cpu", tmp_path / "memory"
    mem.mkdir()
    (mem / "memory.memsw.limit_in_bytes").write_text("0")
    up = [(p.name, v) for p, v in writes({"cpu": cpu, "memory": mem}, Decimal("0.5"), 2**30, 2**28)]
    assert up == [
        ("cpu.cfs_period_us", "100000"),
        ("cpu.cfs_quota_us", "50000"),
        ("memory.memsw.limit_in_bytes", str(2**30)),  # raising: memory+swap first
        ("memory.limit_in_bytes", str(2**30)),
    ]
    down = [p.name for p, _ in writes({"cpu": cpu, "memory": mem}, Decimal(1), 2**27, 2**28)]
    assert down[2:] == ["memory.limit_in_bytes", "memory.memsw.limit_in_bytes"]  # lowering: memory first


async def test_warm_pool_reserve_takes_a_full_pool_off_the_slots_offered() -> None:
    from bai.node.agent.agent import Agent
    from bai.node.agent.backends.sim import SimBackend

    class PoolingSim(SimBackend):
        warm_pool = True

    slots = {"cpu": Decimal(4), "mem": Decimal(8 * 2**30)}
    targets = {"bai-python:3.11": 2}
    free = Agent("a", PoolingSim(), None, slots, warm_pool=targets)
    assert free.offered_slots() == slots  # the default: warm kernels hold no slots
    reserving = Agent("a", PoolingSim(), None, slots, warm_pool=targets, warm_pool_reserve=True)
    assert reserving.offered_slots() == {"cpu": Decimal(3), "mem": Decimal(8 * 2**30 - 2 * 256 * 2**20)}
    assert Agent("a", SimBackend(), None, slots, warm_pool=targets).pool.targets == {}  # no pool but on Docker
