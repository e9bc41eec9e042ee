"""Property tests of the inputs the multi-user rules read: whatever a careless or hostile client sends
as a network, an owner, log paging or a keypair change, the answer is a 2xx or a 4xx problem, never a
5xx, and nothing is granted that the rules refuse."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from tests.nodeproc import Node, admin_keys, signed_request

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=8,
)
QUERY_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=24) | st.integers().map(str)
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> Iterator[Node]:
    node = Node(tmp_path_factory.mktemp("inputs"), "sim").start()
    yield node
    node.stop()


@pytest.fixture(scope="module")
def user(node: Node) -> dict[str, str]:
    return node.json("keypair", "create", "--user", "fuzzed")


def assert_problem(status: int, body: object) -> None:
    assert status < 500, body
    if status >= 400:
        assert isinstance(body, dict) and body.get("type", "").startswith("https://api.backend.ai/probs/"), body


@SETTINGS
@given(network=JSON | st.sampled_from(["host", "bridge", "none", "container:x", "HOST", "host "]), owner=JSON)
def test_create_with_any_network_or_owner(node: Node, user: dict[str, str], network, owner) -> None:
    body = {"image": "python", "enqueueOnly": True, "config": {"network": network}, "owner_access_key": owner}
    status, answer = signed_request(node, "POST", "/session", user["accessKey"], user["secretKey"], body)
    assert_problem(status, answer)
    if status < 400:  # only what the default group allows: no network, or none at all
        assert network in (None, "none") and owner in (None, "", user["accessKey"]), (network, owner)
        signed_request(node, "DELETE", f"/session/{answer['sessionId']}", user["accessKey"], user["secretKey"])


@pytest.fixture(scope="module")
def session(node: Node, user: dict[str, str]) -> str:
    node.cli("session", "create", "--name", "fuzzed-logs", "python", check=True, as_keypair=user)
    return "fuzzed-logs"


@example(params={"since": str(2**64)})  # beyond what SQLite's integers hold
@example(params={"limit": str(-(2**64))})
@SETTINGS
@given(params=st.dictionaries(st.sampled_from(["tail", "since", "limit", "follow", "owner_access_key"]), QUERY_TEXT))
def test_logs_with_any_paging(node: Node, user: dict[str, str], session: str, params: dict[str, str]) -> None:
    assume(params.get("follow", "").lower() not in ("1", "true", "yes"))  # a follow would wait for output
    query = "&".join(f"{quote(k)}={quote(v)}" for k, v in params.items())
    status, answer = signed_request(
        node, "GET", f"/session/{session}/logs?{query}", user["accessKey"], user["secretKey"]
    )
    assert_problem(status, answer)
    assert status in (200, 400, 403)


@pytest.fixture(scope="module")
def target(node: Node) -> str:
    return node.json("keypair", "create", "--user", "target")["accessKey"]


@SETTINGS
@given(body=st.dictionaries(st.sampled_from(["is_active", "resource_policy", "terminate_sessions", "x"]), JSON))
def test_keypair_changes_with_any_body(node: Node, target: str, body: dict) -> None:
    admin_ak, admin_sk = admin_keys(node)
    status, answer = signed_request(node, "PATCH", f"/bai/admin/keypairs/{target}", admin_ak, admin_sk, body)
    assert_problem(status, answer)
    if status < 400:
        assert set(body) <= {"is_active", "resource_policy", "terminate_sessions"}
        assert answer["isActive"] == body.get("is_active", answer["isActive"])
    signed_request(node, "PATCH", f"/bai/admin/keypairs/{target}", admin_ak, admin_sk, {"is_active": True})
