"""The GraphQL subset: parsing the client's queries and projecting exactly the requested fields."""

from __future__ import annotations

import pytest

from bai.node.manager.gql import GraphQLError, Variable, argument, parse, project

LIST_QUERY = (
    "query($limit:Int!, $offset:Int!, $status: String, $access_key: String, $filter: String, $order: String) "
    "{ compute_session_list(limit:$limit, offset:$offset, status:$status, access_key:$access_key, "
    "filter:$filter, order:$order) { items { name access_key id group_name main_kernel_id image type status "
    "status_info status_changed result } total_count } }"
)
INFO_QUERY = (
    "query($id: UUID!) { compute_session(id: $id) { name id containers { id cluster_role agent } "
    "dependencies { name id } } }"
)


def test_the_clients_list_query_parses_with_variables() -> None:
    [root] = parse(LIST_QUERY)
    assert root.name == "compute_session_list"
    assert root.args["limit"] == Variable("limit")
    assert argument(root, "limit", {"limit": 20}) == 20
    assert argument(root, "status", {}, "DEFAULT") == "DEFAULT"
    items, total = root.selections
    assert (items.name, total.name) == ("items", "total_count")
    assert [f.name for f in items.selections][:3] == ["name", "access_key", "id"]


def test_literals_aliases_and_the_keypair_query() -> None:
    [root] = parse('{ who: keypair(flag: true, n: 3, s: "x,y", l: [1, 2]) { access_key is_admin } }')
    assert (root.name, root.alias) == ("keypair", "who")
    assert root.args == {"flag": True, "n": 3, "s": "x,y", "l": [1, 2]}
    [kp] = parse("query {  keypair {    user_id access_key secret_key is_active is_admin  }}")
    assert [f.name for f in kp.selections] == ["user_id", "access_key", "secret_key", "is_active", "is_admin"]


def test_projection_keeps_the_requested_order_and_nesting() -> None:
    [root] = parse(INFO_QUERY)
    value = {
        "id": "s1",
        "name": "demo",
        "extra": "not asked for",
        "containers": [{"agent": "a1", "cluster_role": "main", "id": "k1", "image": "x"}],
        "dependencies": lambda: [{"id": "d", "name": "dep", "status": "TERMINATED"}],
    }
    out = project(value, root.selections)
    assert list(out) == ["name", "id", "containers", "dependencies"]
    assert list(out["containers"][0]) == ["id", "cluster_role", "agent"]
    assert out["dependencies"] == [{"name": "dep", "id": "d"}]
    assert project(None, root.selections) is None


@pytest.mark.parametrize(
    "query",
    ["mutation { x }", "{ a { b }", "{ a } { b }", "query { a(b: ) }", "{ a ~ }"],
)
def test_what_is_not_supported_is_a_graphql_error(query: str) -> None:
    with pytest.raises(GraphQLError):
        parse(query)


def test_unknown_fields_are_errors() -> None:
    [root] = parse("{ keypair { nope } }")
    with pytest.raises(GraphQLError, match="nope"):
        project({"user_id": "u"}, root.selections)
