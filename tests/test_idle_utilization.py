"""Idle detection by utilisation (as Backend.AI's utilisation idle checker): a resource policy's
`idle_cpu_pct` / `idle_gpu_pct` thresholds over `idle_window` seconds. The pure decision (`underused`), the
timers ending such a session (`idle-utilization`) on the in-process cluster, and the policy fields'
validation (REST, GraphQL, CLI)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bai.common.problems import Problem
from bai.node.manager.http.admin_routes import parse_policy
from bai.node.manager.http.graphql.keypair_fields import _policy_fields
from bai.node.manager.services.stats_book import StatsBook
from bai.node.manager.services.timers import IDLE_UTILIZATION, underused, utilization_window
from bai.node.manager.state.records import PolicyFields, Session
from tests.harness import Harness
from tests.nodeproc import Node, admin_keys, signed_request
from tests.records import a_session

NOW = datetime(2026, 1, 1, tzinfo=UTC)  # when these tests' writes are stamped

T0 = datetime(2026, 1, 1, tzinfo=UTC)
WINDOW = 60.0
POLICY = {"idle_cpu_pct": 10.0, "idle_gpu_pct": None, "idle_window": WINDOW}


def session(
    sid: str = "s1", *, cpu: str = "2", kind: str = "interactive", created: float = 0.0, status: str = "RUNNING"
) -> Session:
    at = (T0 + timedelta(seconds=created)).isoformat()
    return a_session(
        id=sid, name=f"sess-{sid}", type=kind, status=status, status_changed=at, created_at=at,
        requested_slots={"cpu": cpu, "mem": "1073741824"},
    )  # fmt: skip


def book_with(
    samples: dict[str, list[tuple[float, float, float | None]]], keep: float = WINDOW, interval: float = 2.0
) -> StatsBook:
    """A book whose session `sid` had (seconds after T0, cpu percent of one core, gpu percent) samples."""
    book = StatsBook(interval=interval)
    book.keep_utilization(keep)
    for sid, series in samples.items():
        book.bind(f"k-{sid}", sid, "AK", "a1")
        for at, cpu, gpu in series:
            sample: dict[str, Any] = {"at": T0.timestamp() + at, "cpu_util": cpu}
            if gpu is not None:
                sample["gpus"] = {"GPU-0": {"util": gpu, "mem": 0}}
            book.record("a1", {f"k-{sid}": sample})
    return book


def steady(cpu: float, until: float = 100.0, gpu: float | None = None, step: float = 2.0):
    return [(t * step, cpu, gpu) for t in range(int(until / step) + 1)]


def decide(sessions, book: StatsBook, now: float = 100.0, policy=POLICY) -> list[str]:
    found = underused(sessions, {"AK": policy}, book.trails_of, T0.timestamp() + now, book.interval)
    assert all(reason == IDLE_UTILIZATION for _, reason, _ in found)
    return [sid for sid, _, _ in found]


def test_a_session_under_the_cpu_threshold_for_a_full_window_is_idle() -> None:
    # 2 cores allocated, 15 % of one core = 7.5 % of the allocation: under 10 %
    book = book_with({"s1": steady(15.0)})
    assert decide([session()], book) == ["s1"]
    found = underused([session()], {"AK": POLICY}, book.trails_of, T0.timestamp() + 100, 2.0)
    assert found[0][2]["cpuPct"] == 7.5 and found[0][2]["window"] == WINDOW


def test_a_busy_session_is_not_idle() -> None:
    assert decide([session()], book_with({"s1": steady(25.0)})) == []  # 12.5 % of two cores
    # busy in the window's last part: the mean over the window counts
    series = [(t, 0.0 if t < 70 else 100.0, None) for t in range(0, 101, 2)]
    assert decide([session()], book_with({"s1": series})) == []
    # idle long ago, busy over the last window
    series = [(t, 0.0 if t < 40 else 30.0, None) for t in range(0, 101, 2)]
    assert decide([session()], book_with({"s1": series})) == []


def test_young_sessions_and_those_without_a_full_window_of_samples_are_never_ended() -> None:
    book = book_with({"s1": steady(0.0)})
    assert decide([session(created=50.0)], book) == []  # younger than the window
    book = book_with({"s1": [(t, 0.0, None) for t in range(60, 101, 2)]})  # sampled for 40 s only
    assert decide([session()], book) == []
    # with a long stretch without samples in the window (its agent away) it is not a full window
    book = book_with({"s1": [(t, 0.0, None) for t in [*range(0, 31, 2), *range(96, 101, 2)]]}, keep=WINDOW)
    assert decide([session()], book, policy={**POLICY, "idle_window": 90.0}) == []
    book = book_with({"s1": [(t, 0.0, None) for t in range(0, 101, 30)]}, keep=WINDOW)  # sparse, but steady
    assert decide([session()], book, now=95.0) == ["s1"]
    book = book_with({"s1": steady(0.0, until=30.0)})  # nothing for the last 70 s
    assert decide([session()], book) == []
    assert decide([session()], StatsBook()) == []  # never sampled
    book = book_with({"s1": steady(0.0)}, keep=0)  # no policy asked for utilisation: no trail kept
    assert decide([session()], book) == []


def test_batch_sessions_and_policies_without_thresholds_are_exempt() -> None:
    book = book_with({"s1": steady(0.0)})
    assert decide([session(kind="batch")], book) == []
    assert decide([session()], book, policy={"idle_cpu_pct": None, "idle_gpu_pct": None, "idle_window": 60}) == []
    assert decide([session()], book, policy={}) == []
    assert underused([session()], {}, book.trails_of, T0.timestamp() + 100) == []
    assert decide([session(status="RESTARTING")], book) == []


def test_gpu_thresholds() -> None:
    only_gpu = {"idle_cpu_pct": None, "idle_gpu_pct": 20.0, "idle_window": WINDOW}
    both = {"idle_cpu_pct": 10.0, "idle_gpu_pct": 20.0, "idle_window": WINDOW}
    # without GPUs, a GPU threshold alone judges nothing
    assert decide([session()], book_with({"s1": steady(0.0)}), policy=only_gpu) == []
    assert decide([session()], book_with({"s1": steady(90.0, gpu=5.0)}), policy=only_gpu) == ["s1"]
    assert decide([session()], book_with({"s1": steady(0.0, gpu=50.0)}), policy=only_gpu) == []
    # with both, every one that applies must be under its threshold
    assert decide([session()], book_with({"s1": steady(0.0, gpu=5.0)}), policy=both) == ["s1"]
    assert decide([session()], book_with({"s1": steady(90.0, gpu=5.0)}), policy=both) == []
    assert decide([session()], book_with({"s1": steady(0.0, gpu=50.0)}), policy=both) == []
    assert decide([session()], book_with({"s1": steady(0.0)}), policy=both) == ["s1"]  # (no GPU: CPU alone)


def test_long_windows_keep_coarse_buckets_and_the_longest_window_wins() -> None:
    hour = 3600.0
    book = book_with({"s1": steady(1.0, until=2 * hour)}, keep=hour)
    (trail,) = book.trails_of("s1")
    assert trail is not None and len(trail.buckets) <= hour / 10 + 3  # ~10 s buckets, bounded by the window
    policy = {"idle_cpu_pct": 5.0, "idle_window": hour}
    assert decide([session()], book, now=2 * hour, policy=policy) == ["s1"]
    policies = {"a": {"idle_cpu_pct": 5.0, "idle_window": hour}, "b": {"idle_gpu_pct": 1.0}, "c": {"idle_window": 1e6}}
    assert utilization_window(policies) == hour
    assert utilization_window({"c": {"idle_window": 99}}) == 0.0


# -- the timers on the in-process cluster -------------------------------------------------------------------


async def _feed(h: Harness, kernel_id: str, cpu: float) -> None:
    sample = {"at": h.clock.now().timestamp(), "cpu_util": cpu, "mem": 1 << 20}
    await h.agent_events.agent_event("a1", "kernel_stats", {"samples": {kernel_id: sample}})


async def test_the_timers_end_an_underused_session(tmp_path: Path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("a1", cpu=4, mem="8g")
        policy = await h.policy("frugal", idle_cpu_pct=10.0, idle_window=60.0)
        owner = await h.keypair("frugal-user", policy)
        await h.run("idle-one", owner=owner, cpu=1)
        await h.run("busy-one", owner=owner, cpu=1)
        await h.create("idle-batch", owner=owner, type="batch", command="sleep 1000", cpu=1)
        await h.schedule()
        await h.wait("idle-batch", "RUNNING")
        await h.run("other-policy", cpu=1)  # the default policy: no threshold
        names = ("idle-one", "busy-one", "idle-batch")
        kernels = {r: (await h.store.kernels_of((await h.row(r)).id))[0].id for r in names}
        other = (await h.store.kernels_of((await h.row("other-policy")).id))[0].id
        await h.sweep()  # the timers tell the book to keep utilisation (the longest window: 60 s)
        assert h.services.stats.trail_seconds == 60.0
        for step in range(40):  # 80 s of samples, every 2 s
            await _feed(h, kernels["idle-one"], 3.0)
            await _feed(h, kernels["busy-one"], 50.0)
            await _feed(h, other, 0.0)
            await _feed(h, kernels["idle-batch"], 0.0)
            if step == 20:  # 40 s in: younger than the window, nothing ends
                await h.sweep()
                assert await h.status("idle-one") == "RUNNING"
            h.advance(2.0)
        await h.sweep()
        row = await h.wait("idle-one", "TERMINATED")
        assert row.status_info == IDLE_UTILIZATION
        for busy in ("busy-one", "other-policy", "idle-batch"):
            assert await h.status(busy) == "RUNNING", busy
        assert (await h.info("idle-one"))["lastStat"]["status"] == "terminated"


async def test_policy_fields_are_stored(tmp_path: Path) -> None:
    async with Harness(tmp_path) as h:
        await h.policy("plain")
        await h.policy("watched", idle_cpu_pct=5.0, idle_gpu_pct=1.5, idle_window=120.0)
        policies = await h.store.policies()
        assert (policies["plain"].idle_cpu_pct, policies["plain"].idle_window) == (None, 600.0)
        assert policies["watched"].idle_gpu_pct == 1.5
        await h.store.save_policy("watched", PolicyFields(idle_cpu_pct=None), create=False, now=NOW)
        assert (await h.store.policies())["watched"].idle_cpu_pct is None


# -- validation ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        {"idle_cpu_pct": "5"},
        {"idle_cpu_pct": True},
        {"idle_cpu_pct": 0},
        {"idle_cpu_pct": 101},
        {"idle_gpu_pct": [1]},
        {"idle_gpu_pct": -3},
        {"idle_window": None},
        {"idle_window": "10m"},
        {"idle_window": 0},
        {"idle_window": 1e12},
        {"idle_window": False},
    ],
)
def test_wrong_policy_fields_are_refused(body: dict[str, Any]) -> None:
    with pytest.raises(Problem) as e:
        parse_policy({"name": "p", **body}, partial=True)
    assert e.value.status == 400
    if body != {"idle_window": None}:  # (GraphQL: a field given as null is left as it is)
        with pytest.raises(Problem):
            _policy_fields(body, partial=True)


def test_policy_fields_are_parsed() -> None:
    body = {"idle_cpu_pct": 5, "idle_gpu_pct": None, "idle_window": 90}
    assert parse_policy(body, partial=True) == {"idle_cpu_pct": 5.0, "idle_gpu_pct": None, "idle_window": 90.0}
    assert _policy_fields({"idle_cpu_pct": None, "idle_window": None}, partial=True) == {"idle_cpu_pct": None}


@pytest.fixture(scope="module")
def sim_node(tmp_path_factory) -> Iterator[Node]:
    node = Node(tmp_path_factory.mktemp("idle"), "sim").start()
    yield node
    node.stop()


def test_rest_graphql_and_cli_set_the_fields(sim_node: Node) -> None:
    keys = admin_keys(sim_node)
    status, body = signed_request(
        sim_node, "POST", "/bai/admin/policies", *keys, body={"name": "r", "idle_cpu_pct": "x"}
    )
    assert status == 400, body
    status, body = signed_request(
        sim_node, "POST", "/bai/admin/policies", *keys, body={"name": "r", "idle_cpu_pct": 5, "idle_window": 120}
    )
    assert status == 201 and body["idle_cpu_pct"] == 5.0 and body["idle_window"] == 120.0, body  # type: ignore[index]
    status, body = signed_request(sim_node, "PATCH", "/bai/admin/policies/r", *keys, body={"idle_window": "long"})
    assert status == 400, body
    status, body = signed_request(sim_node, "PATCH", "/bai/admin/policies/r", *keys, body={"idle_cpu_pct": None})
    assert status == 200 and body["idle_cpu_pct"] is None, body  # type: ignore[index]

    mutation = (
        "mutation($name: String!, $input: ModifyKeyPairResourcePolicyInput!) { "
        "modify_keypair_resource_policy(name: $name, props: $input) { ok msg } }"
    )
    for props, ok in (({"idle_gpu_pct": 7.5}, True), ({"idle_gpu_pct": 700}, False)):
        status, body = signed_request(
            sim_node, "POST", "/admin/gql", *keys, body={"query": mutation, "variables": {"name": "r", "input": props}}
        )
        assert status == 200 and body["data"]["modify_keypair_resource_policy"]["ok"] is ok, body  # type: ignore[index]
    status, body = signed_request(
        sim_node,
        "POST",
        "/admin/gql",
        *keys,
        body={"query": mutation, "variables": {"name": "r", "input": {"idle_gpu_pct": "many"}}},
    )
    assert status == 400 or (isinstance(body, dict) and body.get("errors")), body
    query = 'query { keypair_resource_policy(name: "r") { name idle_gpu_pct idle_window } }'
    status, body = signed_request(sim_node, "POST", "/admin/gql", *keys, body={"query": query})
    assert body["data"]["keypair_resource_policy"] == {"name": "r", "idle_gpu_pct": 7.5, "idle_window": 120.0}  # type: ignore[index]

    made = json.loads(sim_node.cli("policy", "create", "c", "--idle-cpu", "5%", "--idle-window", "10m", "--json",
                                   check=True).stdout)  # fmt: skip
    made = made[0] if isinstance(made, list) else made
    assert made["idleCpuPct"] == 5.0 and made["idleWindowSeconds"] == 600.0
    changed = json.loads(sim_node.cli("policy", "update", "c", "--idle-cpu", "off", "--idle-gpu", "3", "--json",
                                      check=True).stdout)  # fmt: skip
    changed = changed[0] if isinstance(changed, list) else changed
    assert changed["idleCpuPct"] is None and changed["idleGpuPct"] == 3.0
    bad = sim_node.cli("policy", "create", "d", "--idle-cpu", "lots")
    assert bad.returncode != 0 and "--idle-cpu" in bad.stderr + bad.stdout
