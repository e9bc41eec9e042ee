"""Multi-container ("cluster") sessions on the API (issue 20): `clusterSize` / `clusterMode` in a create
request, which kernel an execute, a log or a terminal is for (`kernel`, Backend.AI's `kernel_id` for logs),
and how a session of several kernels is shown (REST and GraphQL).

The parsing and the kernel references are checked without a node; the rest against a `bai node` with the
simulated backend (no Docker), through signed requests and the official client (`backend.ai session
create --cluster-size 2 --cluster-mode multi-node`)."""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from bai.common.cluster import MAX_CLUSTER_SIZE, MULTI_NODE, SINGLE_NODE
from bai.common.problems import Problem
from bai.node.manager.http.requests import parse_create, parse_kernel_ref
from tests.nodeproc import Node, admin_keys, signed_request

KNOWN = {"cpu", "mem"}
DEFAULTS = {"cpu": "1", "mem": "1g"}
BODY = {"name": "cluster-body", "image": "python", "config": {"resources": {"cpu": "1", "mem": "256m"}}}


def parse(**changes: Any):
    body = copy.deepcopy(BODY)
    body.update(changes)
    return parse_create(body, KNOWN, DEFAULTS, {}, datetime.now(UTC))


def refused(**changes: Any) -> str:
    with pytest.raises(Problem) as caught:
        parse(**changes)
    assert caught.value.status == 400
    return caught.value.msg or ""


# -- the request ------------------------------------------------------------------------------------------


def test_a_session_has_one_kernel_unless_it_asks_for_more() -> None:
    req = parse()
    assert (req.cluster_size, req.cluster_mode) == (1, SINGLE_NODE)
    assert req.config["cluster_mode"] == SINGLE_NODE
    assert parse(clusterSize=None, clusterMode=None).cluster_size == 1  # nulls are accepted (Backend.AI's rule)
    req = parse(clusterSize=3, clusterMode="multi-node")
    assert (req.cluster_size, req.cluster_mode, req.config["cluster_mode"]) == (3, MULTI_NODE, MULTI_NODE)
    assert parse(cluster_size=MAX_CLUSTER_SIZE, cluster_mode="single-node").cluster_size == MAX_CLUSTER_SIZE


@pytest.mark.parametrize(
    "given,mode",
    [("MULTI_NODE", MULTI_NODE), ("Multi-Node", MULTI_NODE), ("multi_node", MULTI_NODE), (" multi-node ", MULTI_NODE)]
    + [("SINGLE_NODE", SINGLE_NODE), ("Single-Node", SINGLE_NODE), ("", SINGLE_NODE)],
)
def test_the_mode_is_read_in_any_case_and_by_backend_ai_enum_names(given: str, mode: str) -> None:
    assert parse(clusterSize=2, clusterMode=given).cluster_mode == mode


@pytest.mark.parametrize(
    "size", [0, -1, MAX_CLUSTER_SIZE + 1, 2**64, True, False, 2.0, 1.5, "2", "", {"n": 2}, [2], float("nan")]
)
def test_a_size_that_is_not_a_whole_number_of_kernels_in_range_is_a_400(size: Any) -> None:
    msg = refused(clusterSize=size)
    assert "clusterSize" in msg and str(MAX_CLUSTER_SIZE) in msg, msg


@pytest.mark.parametrize("mode", ["both", "single", "multi-nodes", 1, True, ["multi-node"], {"a": 1}, "\x00"])
def test_an_unknown_mode_is_a_400(mode: Any) -> None:
    msg = refused(clusterSize=2, clusterMode=mode)
    assert "single-node or multi-node" in msg, msg


def test_a_session_of_several_kernels_cannot_have_the_host_network() -> None:
    config = {**BODY["config"], "network": "host"}
    for mode in ("multi-node", "single-node"):
        msg = refused(clusterSize=2, clusterMode=mode, config=config)
        assert "host network" in msg, msg
    assert parse(clusterSize=1, config=config).network == "host"  # one kernel: the scaling group decides


def test_kernel_references() -> None:
    assert parse_kernel_ref(None) is None and parse_kernel_ref("") is None  # the main kernel
    assert parse_kernel_ref("sub1") == "sub1"
    assert parse_kernel_ref("3f2a9c1e-0000-4000-8000-000000000000") == "3f2a9c1e-0000-4000-8000-000000000000"
    for bad in (1, True, ["sub1"], {"a": 1}, "sub\x00", "x" * 65, "süb1"):
        with pytest.raises(Problem) as caught:
            parse_kernel_ref(bad)
        assert caught.value.status == 400


# -- against a node ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> Iterator[Node]:
    node = Node(tmp_path_factory.mktemp("cluster-api"), "sim").start()
    yield node
    node.stop()


@pytest.fixture(scope="module")
def keys(node: Node) -> tuple[str, str]:
    return admin_keys(node)


def call(node: Node, keys, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    return signed_request(node, method, path, *keys, body=body)


def create(node: Node, keys, name: str, size: int, mode: str = SINGLE_NODE, **extra: Any) -> dict[str, Any]:
    body = {
        "name": name,
        "image": "python",
        "clusterSize": size,
        "clusterMode": mode,
        "config": {"resources": {"cpu": "0.25", "mem": "128m"}},
        "maxWaitSeconds": 20,
        **extra,
    }
    status, answer = call(node, keys, "POST", "/session", body)
    assert status in (200, 201), answer
    return answer


def test_bad_cluster_fields_are_400_on_the_wire(node: Node, keys) -> None:
    for changes in ({"clusterSize": "2"}, {"clusterSize": 0}, {"clusterSize": 2, "clusterMode": "sideways"}):
        body = {"image": "python", "enqueueOnly": True, **changes}
        status, answer = call(node, keys, "POST", "/session", body)
        assert status == 400 and answer["type"].endswith("invalid-api-params"), answer
    body = {"image": "python", "enqueueOnly": True, "clusterSize": 2, "clusterMode": "MULTI_NODE"}
    body["config"] = {"network": "host"}
    status, answer = call(node, keys, "POST", "/session", body)
    assert status == 400 and "host network" in answer["msg"], answer


def test_a_one_kernel_session_names_its_kernel_and_refuses_others(node: Node, keys) -> None:
    create(node, keys, "solo-one", 1)
    status, info = call(node, keys, "GET", "/session/solo-one")
    assert status == 200, info
    assert (info["clusterSize"], info["clusterMode"]) == (1, SINGLE_NODE)
    assert [k["name"] for k in info["kernels"]] == ["main1"]
    main = info["kernels"][0]
    assert (main["clusterRole"], main["clusterIdx"], main["clusterHostname"]) == ("main", 1, "main1")
    for path in ("/session/solo-one/logs?kernel=main1", f"/session/solo-one/logs?kernel_id={main['id']}"):
        status, answer = call(node, keys, "GET", path)
        assert status == 200, answer
    status, answer = call(node, keys, "GET", "/session/solo-one/logs?kernel=sub3")
    assert status == 404 and "main1" in answer["msg"], answer  # the kernels it has are listed
    status, answer = call(node, keys, "GET", "/session/solo-one/logs?kernel=main1&kernel_id=sub1")
    assert status == 400, answer
    status, answer = call(node, keys, "GET", "/session/solo-one/logs?kernel=" + quote("a\x01b"))
    assert status == 400, answer
    run = {"mode": "query", "code": "print('x')", "kernel": "sub1"}
    status, answer = call(node, keys, "POST", "/session/solo-one", run)
    assert status == 404 and "main1" in answer["msg"], answer
    status, answer = call(node, keys, "POST", "/session/solo-one", {**run, "kernel": ["sub1"]})
    assert status == 400, answer
    status, answer = call(node, keys, "GET", "/stream/session/solo-one/pty?kernel=sub2")
    assert status in (400, 404), answer  # not a WebSocket request, or no such kernel: a 4xx either way
    call(node, keys, "DELETE", "/session/solo-one")


# these need the manager's multi-kernel lifecycle (issue 20, sessions.py / dispatcher): every kernel starts


def _kernels(info: dict[str, Any]) -> list[str]:
    return [k["name"] for k in info["kernels"]]


def test_a_cluster_session_shows_every_kernel(node: Node, keys) -> None:
    answer = create(node, keys, "pair-api", 2, MULTI_NODE)
    assert answer["status"] == "RUNNING", answer
    status, info = call(node, keys, "GET", "/session/pair-api")
    assert status == 200, info
    assert (info["clusterSize"], info["clusterMode"]) == (2, MULTI_NODE)
    assert _kernels(info) == ["main1", "sub1"]
    assert all(k["status"] == "RUNNING" and k["agent"] and k["id"] for k in info["kernels"]), info["kernels"]
    assert [k["clusterRole"] for k in info["kernels"]] == ["main", "sub"]
    status, listed = call(node, keys, "GET", "/session")
    item = next(s for s in listed["items"] if s["name"] == "pair-api")
    assert (item["clusterSize"], item["clusterMode"], _kernels(item)) == (2, MULTI_NODE, ["main1", "sub1"])

    query = (
        "query($id: UUID!) { compute_session(id: $id) { cluster_size cluster_mode "
        "kernels { cluster_role cluster_idx cluster_hostname local_rank agent status live_stat } "
        "containers { cluster_hostname } } }"
    )
    status, gql = call(node, keys, "POST", "/admin/gql", {"query": query, "variables": {"id": info["id"]}})
    assert status == 200 and not gql.get("errors"), gql
    session = gql["data"]["compute_session"]
    assert (session["cluster_size"], session["cluster_mode"]) == (2, "MULTI_NODE")
    kernels = session["kernels"]
    assert [(k["cluster_role"], k["cluster_idx"], k["cluster_hostname"]) for k in kernels] == [
        ("main", 1, "main1"),
        ("sub", 1, "sub1"),
    ]
    assert [k["local_rank"] for k in kernels] == [0, 1]
    assert all(k["agent"] and k["status"] == "RUNNING" for k in kernels), kernels
    assert [c["cluster_hostname"] for c in session["containers"]] == ["main1", "sub1"]
    call(node, keys, "DELETE", "/session/pair-api")


def test_runs_and_logs_go_to_the_kernel_named(node: Node, keys) -> None:
    create(node, keys, "trio-api", 3)
    status, info = call(node, keys, "GET", "/session/trio-api")
    assert _kernels(info) == ["main1", "sub1", "sub2"], info
    sub2 = info["kernels"][2]["id"]
    for kernel, word in (("sub1", "on-sub1"), (sub2[:8], "on-sub2"), (None, "on-main")):
        run = {"mode": "query", "code": f"print('{word}')", **({"kernel": kernel} if kernel else {})}
        status, answer = call(node, keys, "POST", "/session/trio-api", run)
        assert status == 200 and answer["result"]["status"] == "finished", answer

    def logs(query: str) -> str:
        deadline = time.monotonic() + 10
        while True:
            status, answer = call(node, keys, "GET", f"/session/trio-api/logs{query}")
            assert status == 200, answer
            text = answer["result"]["logs"]
            if "on-" in text or time.monotonic() > deadline:
                return text
            time.sleep(0.1)

    assert "on-sub1" in logs("?kernel=sub1") and "on-main" not in logs("?kernel=sub1")
    assert "on-sub2" in logs(f"?kernel_id={sub2}")
    main = logs("")  # the main kernel's, as before clusters
    assert "on-main" in main and "on-sub1" not in main and "on-sub2" not in main
    call(node, keys, "DELETE", "/session/trio-api")


def test_the_official_client_creates_a_cluster_session(node: Node, tmp_path: Path) -> None:
    from tests.test_official_client import Official, official_client

    official = Official(official_client(), node, tmp_path)
    name = "oc-pair-" + uuid.uuid4().hex[:6]
    out = official(
        "session", "create", "--cluster-size", "2", "--cluster-mode", "multi-node",
        "-r", "cpu=0.25", "-r", "mem=128m", "--max-wait", "30", "-t", name, "python",
    )  # fmt: skip
    assert "is created and ready" in out, out
    info = node.json("session", "info", name)
    assert (info["clusterSize"], info["clusterMode"]) == (2, MULTI_NODE), info
    assert _kernels(info) == ["main1", "sub1"]
    shown = official("session", "info", info["id"])  # GraphQL: compute_session { containers { … } }
    assert "main1" in shown and "sub1" in shown, shown
    official("session", "destroy", name)
