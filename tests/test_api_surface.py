"""What a client that strays sees: JSON problems, never HTML or a 500; bai's own endpoints under /bai/."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bai.client.api import APIError
from tests.nodeproc import Node
from tests.tui_support import node_client


@pytest.fixture(scope="module")
def sim_node(tmp_path_factory) -> Iterator[Node]:
    node = Node(tmp_path_factory.mktemp("surface"), "sim").start()
    yield node
    node.stop()


async def test_unknown_and_unimplemented_endpoints_answer_with_problems(sim_node: Node) -> None:
    client = node_client(sim_node)
    for method, path, status, slug in (
        ("GET", "/no/such/path", 404, "url-not-found"),
        ("GET", "/agents", 404, "url-not-found"),  # bai's own endpoints moved under /bai/
        ("GET", "/session/abc/commit", 501, "not-implemented"),
        ("GET", "/folders/_/quota", 501, "not-implemented"),
        ("GET", "/resource/get-presets", 501, "not-implemented"),
        ("PUT", "/session", 404, "url-not-found"),
        ("POST", "/config/set", 501, "not-implemented"),  # admin etcd put: bai's configuration is bai.toml
        ("GET", "/session/_/match", 501, "not-implemented"),
        ("GET", "/license", 501, "not-implemented"),
        ("POST", "/manager/scheduler/operation", 501, "not-implemented"),
    ):
        with pytest.raises(APIError) as err:
            await client.request(method, path)
        assert (err.value.status, err.value.slug) == (status, slug), (method, path)
        assert err.value.msg and path.split("/")[1] in err.value.msg


async def test_bai_endpoints_live_under_the_prefix(sim_node: Node) -> None:
    client = node_client(sim_node)
    assert [a["id"] for a in await client.agents()] == [sim_node.agent_id]
    assert (await client.request("GET", "/bai/images"))["items"][0]["name"] == "sim"
    assert any(k["isAdmin"] for k in await client.keypairs())
    assert "default" in [p["name"] for p in await client.policies()]


def test_metrics_for_prometheus_after_running_sessions(sim_node: Node) -> None:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    sim_node.cli("session", "create", "sim", "--name", "metric-run", "--cpu", "1", check=True)
    # all of the agent's cores, while metric-run holds one: it waits (a request no agent could ever hold is refused)
    (agent,) = sim_node.json("agent", "ls")
    every_core = agent["availableSlots"]["cpu"]
    sim_node.cli("session", "create", "sim", "--name", "metric-wait", "--cpu", every_core, "--no-wait", check=True)
    sim_node.cli(
        "session", "create", "sim", "--name", "metric-done", "--type", "batch", "--startup-command", "true",
        "--wait", check=True,
    )  # fmt: skip
    text = urllib.request.urlopen(f"{sim_node.endpoint}/metrics", timeout=10).read().decode()  # unsigned
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    assert samples[("bai_sessions", (("status", "RUNNING"),))] >= 1
    assert samples[("bai_sessions", (("status", "PENDING"),))] >= 1
    assert samples[("bai_sessions", (("status", "TERMINATED"),))] >= 1
    assert samples[("bai_pending_sessions", ())] == samples[("bai_sessions", (("status", "PENDING"),))]
    assert samples[("bai_agents", (("status", "ALIVE"),))] == 1
    assert samples[("bai_slot_capacity", (("slot", "cpu"),))] >= 2
    assert samples[("bai_slot_used", (("slot", "cpu"),))] >= 1
    assert samples[("bai_scheduling_latency_seconds_count", ())] >= 2  # metric-run and metric-done
    assert samples[("bai_sessions_scheduled_total", ())] >= 2
    for name in ("metric-run", "metric-wait"):
        sim_node.cli("session", "destroy", name, check=True)
