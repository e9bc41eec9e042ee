"""The GraphQL endpoint under abusive queries: depth, size, alias and field-count bounds, and arguments
of every wrong type. Each is refused before it runs, with a 400 problem that is also a GraphQL answer
(`data: null`, `errors`); none gets a 5xx; the official client's queries still answer."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bai.node.manager.http.graphql.limits import MAX_DEPTH, MAX_FIELDS, MAX_PAGE_SIZE, MAX_QUERY_BYTES, MAX_ROOT_FIELDS
from tests.nodeproc import Node, admin_keys, signed_request

LIST = "compute_session_list(limit: $limit, offset: $offset) { items { id name status } total_count }"
LIST_QUERY = f"query($limit: Int!, $offset: Int!) {{ {LIST} }}"


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> Iterator[Node]:
    node = Node(tmp_path_factory.mktemp("gql-limits"), "sim").start()
    node.cli("session", "create", "--name", "gql-limits", "python", check=True)
    yield node
    node.stop()


def gql(node: Node, query: object, variables: object = None, path: str = "/admin/gql") -> tuple[int, dict]:
    body = {"query": query} if variables is None else {"query": query, "variables": variables}
    status, answer = signed_request(node, "POST", path, *admin_keys(node), body=body)
    assert status < 500, answer
    assert isinstance(answer, dict), answer
    return status, answer


def refused(node: Node, query: object, variables: object = None, *, says: str) -> dict:
    """The query is refused with a 400 problem that is a GraphQL answer too, naming what is wrong."""
    status, answer = gql(node, query, variables)
    assert status == 400, answer
    assert answer["type"].endswith("/graphql-error") and answer["title"], answer
    assert says in answer["msg"], answer
    assert says in answer["errors"][0]["message"], answer
    assert answer["data"] == answer["errors"], answer  # (Backend.AI's: the clients print `data`'s messages)
    return answer


def test_the_official_clients_queries_still_answer(node: Node) -> None:
    for path in ("/admin/gql", "/admin/graphql"):
        for limit in (1, 20, MAX_PAGE_SIZE):
            status, answer = gql(node, LIST_QUERY, {"limit": limit, "offset": 0})
            assert status == 200, answer
            page = answer["data"]["compute_session_list"]
            assert page["total_count"] >= 1 and 1 <= len(page["items"]) <= limit
        status, answer = gql(node, "{ keypair { access_key is_admin } }", None, path)
        assert status == 200 and answer["data"]["keypair"]["is_admin"] is True, answer
    status, answer = gql(node, LIST_QUERY, {"limit": 20, "offset": 10**6})
    assert status == 200 and answer["data"]["compute_session_list"]["items"] == [], answer
    status, answer = gql(node, "{ compute_session_list { total_count } }")  # no arguments: the defaults
    assert status == 200 and answer["data"]["compute_session_list"]["total_count"] >= 1, answer
    [session] = gql(node, LIST_QUERY, {"limit": 5, "offset": 0})[1]["data"]["compute_session_list"]["items"]
    status, answer = gql(node, "query($id: UUID!) { compute_session(id: $id) { name } }", {"id": session["id"]})
    assert status == 200 and answer["data"]["compute_session"] == {"name": "gql-limits"}, answer
    status, answer = gql(node, "{ vfolder_list(limit: 100, offset: 0) { items { name } total_count } }")
    assert status == 200 and "vfolder_list" in answer["data"], answer


def test_a_hundred_aliased_lists_are_refused_not_run(node: Node) -> None:
    aliases = " ".join(f"a{i}: {LIST}" for i in range(100))
    answer = refused(
        node,
        f"query($limit: Int!, $offset: Int!) {{ {aliases} }}",
        {"limit": 100, "offset": 0},
        says="too many root fields",
    )
    assert str(MAX_ROOT_FIELDS) in answer["msg"]
    assert "a0" not in str(answer)  # not one of them ran


def test_root_fields_are_bounded(node: Node) -> None:
    ten = " ".join(f"k{i}: keypair {{ access_key }}" for i in range(MAX_ROOT_FIELDS))
    status, answer = gql(node, f"{{ {ten} }}")
    assert status == 200 and len(answer["data"]) == MAX_ROOT_FIELDS, answer
    refused(node, f"{{ {ten} extra: keypair {{ access_key }} }}", says="too many root fields")


def test_fields_in_all_are_bounded(node: Node) -> None:
    many = " ".join(["access_key"] * (MAX_FIELDS - 1))
    status, answer = gql(node, f"{{ keypair {{ {many} }} }}")  # keypair and its fields: MAX_FIELDS
    assert status == 200, answer
    refused(node, f"{{ keypair {{ {many} is_admin }} }}", says=f"at most {MAX_FIELDS}")


def test_the_query_text_is_bounded(node: Node) -> None:
    padding = "#" + "x" * MAX_QUERY_BYTES + "\n"
    refused(node, padding + "{ keypair { access_key } }", says=f"{MAX_QUERY_BYTES} bytes")


def test_selections_nested_too_deeply_are_refused(node: Node) -> None:
    # MAX_DEPTH levels parse (and are an ordinary GraphQL error: keypair's fields are scalars)
    status, answer = gql(node, "{ keypair" + " { access_key" * (MAX_DEPTH - 1) + " }" * MAX_DEPTH)
    assert status == 200 and answer["errors"], answer
    deeper = "{ keypair" + " { access_key" * MAX_DEPTH + " }" * (MAX_DEPTH + 1)
    refused(node, deeper, says=f"at most {MAX_DEPTH} levels")


@pytest.mark.parametrize(
    "query",
    [
        "{" + " a {" * 15000,
        "{ a" * 20000,
        "{ keypair(x: " + "[" * 60000,
        "{ keypair(x: " + "{a: " * 15000,
        "query($a: " + "[" * 60000,
        "query($a: Int = " + "[" * 60000,
        "{ keypair(x: " + "[" * 30 + "]" * 30 + ") { access_key } }",
    ],
    ids=["braces", "fields", "lists", "objects", "list-types", "defaults", "shallow-lists"],
)
def test_pathological_nesting_is_a_400_not_a_recursion_error(node: Node, query: str) -> None:
    refused(node, query, says=f"at most {MAX_DEPTH} levels")


def test_whole_queries_of_only_brackets_are_refused_too(node: Node) -> None:
    for text in ("{" * 100000, "[" * 100000):
        status, answer = gql(node, text)
        assert status == 400 and "type" in answer, answer


@pytest.mark.parametrize(
    "limit,says",
    [
        (0, f"limit must be between 1 and {MAX_PAGE_SIZE}"),
        (-1, f"limit must be between 1 and {MAX_PAGE_SIZE}"),
        (MAX_PAGE_SIZE + 1, f"limit must be between 1 and {MAX_PAGE_SIZE}"),
        (10**30, f"limit must be between 1 and {MAX_PAGE_SIZE}"),
        ("20", "limit must be an integer"),
        (20.5, "limit must be an integer"),
        (20.0, "limit must be an integer"),
        (1e308, "limit must be an integer"),
        (True, "limit must be an integer"),
        ({"a": 1}, "limit must be an integer"),
        ([20], "limit must be an integer"),
    ],
)
def test_limit_outside_one_to_the_page_size_is_refused(node: Node, limit: object, says: str) -> None:
    refused(node, LIST_QUERY, {"limit": limit, "offset": 0}, says=says)


@pytest.mark.parametrize("offset", [-1, 10**30, "0", 1.5, False, {"a": 1}, [0]])
def test_offset_negative_or_not_an_integer_is_refused(node: Node, offset: object) -> None:
    refused(node, LIST_QUERY, {"limit": 10, "offset": offset}, says="offset must be")


@pytest.mark.parametrize(
    "literal", ['"5"', "0", "101", "1e3", "2.5", "true", "[5]", "{a: 5}", "1" + "0" * 80, "SOME_ENUM"]
)
def test_literal_limits_are_checked_the_same(node: Node, literal: str) -> None:
    status, answer = gql(node, f"{{ compute_session_list(limit: {literal}) {{ total_count }} }}")
    assert status == 400 and "type" in answer, answer
    assert "limit" in answer["msg"] or "number" in answer["msg"], answer


def test_vfolder_list_pages_are_checked_too(node: Node) -> None:
    refused(node, "{ vfolder_list(limit: 1000) { total_count } }", says="limit must be between 1 and 100")
    refused(node, '{ vfolder_list(offset: "x") { total_count } }', says="offset must be")


@pytest.mark.parametrize(
    "query,variables,says",
    [
        ("query($id: UUID!) { compute_session(id: $id) { id } }", {"id": 12345}, "id must be a string"),
        ("query($id: UUID!) { compute_session(id: $id) { id } }", {"id": ["x"]}, "id must be a string"),
        ("query($id: UUID!) { compute_session(id: $id) { id } }", {"id": {"a": 1}}, "id must be a string"),
        ("query($id: UUID!) { compute_session(id: $id) { id } }", {"id": "x" * 5000}, "id is too long"),
        ("{ compute_session(id: 7) { id } }", None, "id must be a string"),
        ("{ compute_session { id } }", None, "needs an id"),
        ("{ session(session_id: true) { id } }", None, "session_id must be a string"),
        ("query($s: String) { compute_session_list(status: $s) { total_count } }", {"s": 3}, "status must be"),
        ("query($s: String) { compute_session_list(status: $s) { total_count } }", {"s": ["RUNNING"]}, "status"),
        ('{ compute_session_list(status: "NOT_A_STATUS") { total_count } }', None, "NOT_A_STATUS"),
        ("{ compute_session_list(access_key: 5) { total_count } }", None, "access_key must be a string"),
    ],
)
def test_every_argument_a_resolver_reads_is_type_checked(node: Node, query: str, variables, says: str) -> None:
    refused(node, query, variables, says=says)


def test_variables_that_are_not_an_object_are_a_problem(node: Node) -> None:
    for variables in ([1, 2], "limit", 5):
        status, answer = gql(node, LIST_QUERY, variables)
        assert status == 400 and "variables" in answer["msg"], answer


def test_bad_literals_are_refused_or_graphql_errors_never_500(node: Node) -> None:
    refused(node, '{ compute_session(id: "\\ud800") { id } }', says="lone surrogate")
    refused(node, "{ compute_session_list(limit: " + "9" * 5000 + ") { total_count } }", says="too long")
    for query in ('{ compute_session(id: "\\q") { id } }', "{ keypair { is_admin { x } } }", "{ keypair { } }"):
        status, answer = gql(node, query)
        assert status in (200, 400), answer
    status, answer = gql(node, "{ keypair { is_admin { x } } }")
    assert status == 200 and answer["data"] is None and answer["errors"], answer


def test_a_deep_json_string_is_a_graphql_error_not_a_recursion_error() -> None:
    from graphql import GraphQLError

    from bai.node.manager.http.graphql.base import _parse_json

    with pytest.raises(GraphQLError, match="nested too deeply"):
        _parse_json("[" * 5000 + "]" * 5000)
    assert _parse_json('{"cpu": "1"}') == {"cpu": "1"}
