"""The GraphQL schema and its bounds without a node: the official client's queries fit the schema, the
bounds refuse before anything runs, and `filter` / `order` (Backend.AI's minilang) parse safely."""

from __future__ import annotations

import pytest
from graphql import GraphQLError, validate

from bai.node.manager.http.graphql import minilang
from bai.node.manager.http.graphql.base import page
from bai.node.manager.http.graphql.limits import QueryRefused, check_arguments, parse_bounded
from bai.node.manager.http.graphql.schema import SCHEMA
from bai.node.manager.http.graphql_route import RULES

PAGED = (
    "query($limit:Int!, $offset:Int!, {decls}) {{ {root}( limit:$limit, offset:$offset, {args}) "
    "{{ items {{ {fields} }} total_count }} }}"
)


def paged(root: str, fields: str, **variables: str) -> str:
    decls = ", ".join(f"${k}: {t}" for k, t in variables.items())
    args = ", ".join(f"{k}:${k}" for k in variables)
    return PAGED.format(decls=decls, root=root, args=args, fields=fields)


# the shapes the 23.9 client sends (ai/backend/client/func/*.py with their default fields)
CLIENT_QUERIES = [
    paged(
        "compute_session_list",
        "id main_kernel_id tag name type image registry cluster_template cluster_mode cluster_size domain_name "
        "group_name group_id agent_ids user_email user_id access_key created_user_email created_user_id status "
        "status_info status_data status_changed created_at terminated_at starts_at scheduled_at startup_command "
        "result resource_opts scaling_group service_ports mounts occupying_slots containers { id cluster_role "
        "cluster_idx cluster_hostname session_id image registry status status_info status_data status_changed "
        "agent container_id resource_opts occupied_slots preopen_ports live_stat last_stat } dependencies { name "
        "id } abusing_reports idle_checks",
        status="String",
        access_key="String",
        filter="String",
        order="String",
    ),
    paged(
        "agent_list",
        "id status scaling_group available_slots occupied_slots",
        status="String",
        scaling_group="String",
        filter="String",
        order="String",
    ),
    "query($agent_id: String!) { agent(agent_id: $agent_id) { id status scaling_group addr region first_contact "
    "cpu_cur_pct mem_cur_bytes available_slots occupied_slots local_config } }",
    "query($is_operation: Boolean) { images(is_operation: $is_operation) { name registry architecture tag digest "
    "size_bytes aliases } }",
    paged(
        "keypair_list",
        "user_id access_key secret_key is_active is_admin created_at user_info { full_name } projects",
        is_active="Boolean",
        domain_name="String",
        filter="String",
        order="String",
    ),
    "query { keypair { user_id access_key secret_key is_active is_admin } }",
    "query { keypair_resource_policies { name created_at total_resource_slots max_concurrent_sessions "
    "max_vfolder_count max_vfolder_size idle_timeout max_containers_per_session allowed_vfolder_hosts } }",
    "query($is_active: Boolean) { scaling_groups(is_active: $is_active) { name description is_active is_public "
    "created_at driver scheduler use_host_network wsproxy_addr wsproxy_api_token } }",
    paged(
        "user_list",
        "uuid role username email need_password_change status status_info is_active created_at domain_name "
        "groups { id name } allowed_client_ip totp_activated sudo_session_enabled main_access_key",
        status="String",
        group_id="UUID",
        filter="String",
        order="String",
    ),
    "query { domains { name description is_active created_at total_resource_slots allowed_vfolder_hosts "
    "allowed_docker_registries integration_id } }",
    "query($domain_name: String) { groups(domain_name: $domain_name) { id name is_active created_at integration_id } }",
    paged("storage_volume_list", "id backend capabilities", filter="String", order="String"),
    "mutation($user_id: String!, $input: KeyPairInput!) { create_keypair(user_id: $user_id, props: $input) "
    "{ ok msg keypair { access_key secret_key } } }",
    "mutation($access_key: String!, $input: ModifyKeyPairInput!) { modify_keypair(access_key: $access_key, "
    "props: $input) { ok msg } }",
    "mutation($access_key: String!) { delete_keypair(access_key: $access_key) { ok msg } }",
    "mutation($name: String!, $input: CreateKeyPairResourcePolicyInput!) { create_keypair_resource_policy("
    "name: $name, props: $input) { ok msg resource_policy { name } } }",
    "mutation($name: String!, $input: ModifyKeyPairResourcePolicyInput!) { modify_keypair_resource_policy("
    "name: $name, props: $input) { ok msg } }",
    "mutation($name: String!) { delete_keypair_resource_policy(name: $name) { ok msg } }",
    "mutation($alias: String!, $target: String!) { alias_image(alias: $alias, target: $target) { ok msg } }",
    "mutation($alias: String!) { dealias_image(alias: $alias) { ok msg } }",
]


@pytest.mark.parametrize("query", CLIENT_QUERIES, ids=range(len(CLIENT_QUERIES)))
def test_the_official_clients_queries_fit_the_schema(query: str) -> None:
    document = parse_bounded(query)
    check_arguments(SCHEMA, document, {"limit": 20, "offset": 0, "filter": None, "order": None})
    assert validate(SCHEMA, document, RULES) == []


def test_unknown_fields_and_scalar_selections_are_validation_errors() -> None:
    for query, says in [
        ("{ no_such_thing { id } }", "no_such_thing"),
        ("{ keypair { nope } }", "nope"),
        ("{ keypair { is_admin { x } } }", "is_admin"),
    ]:
        [error] = validate(SCHEMA, parse_bounded(query), RULES)
        assert says in error.message


@pytest.mark.parametrize(
    "query,variables,says",
    [
        ("{ keypair { } }", None, "Syntax Error"),
        ("{ a(x: (1)) }", None, "Syntax Error"),
        ("{ a ~ }", None, "Syntax Error"),
        ("{ compute_session_list(limit: 0) { total_count } }", None, "limit must be between 1 and 100"),
        ("query($o: Int) { agent_list(offset: $o) { total_count } }", {"o": -1}, "offset must be"),
        ('{ compute_session(id: "\\udc00") { id } }', None, "lone surrogate"),
        ("query($l: Int = 1000) { agent_list(limit: $l) { total_count } }", None, "limit must be between"),
        ("{ keypair(access_key: " + "[" * 11 + "]" * 11 + ") { id } }", None, "nested too deeply"),
    ],
)
def test_refusals_name_what_is_wrong(query: str, variables, says: str) -> None:
    with pytest.raises(QueryRefused, match=says):
        check_arguments(SCHEMA, parse_bounded(query), variables or {})


def test_fragments_count_towards_the_bounds() -> None:
    spreads = " ".join(["...F"] * 11)
    with pytest.raises(QueryRefused, match="root fields"):
        parse_bounded("fragment F on Queries { keypair { access_key } } { " + spreads + " }")
    body = " ".join(f"f{i}: access_key" for i in range(60))
    with pytest.raises(QueryRefused, match="at most 500"):
        parse_bounded("fragment K on KeyPair { " + body + " } { keypair { " + " ".join(["...K"] * 9) + " } }")


ITEMS = [
    {"name": "alpha", "status": "RUNNING", "cluster_size": 1, "created_at": "2026-01-02", "tag": None},
    {"name": "beta", "status": "TERMINATED", "cluster_size": 2, "created_at": "2026-01-01", "tag": "x"},
    {"name": "Gamma-x", "status": "RUNNING", "cluster_size": 3, "created_at": "2026-01-03", "tag": "y"},
]
FIELDS = {"name", "status", "cluster_size", "created_at", "tag"}


@pytest.mark.parametrize(
    "expr,names",
    [
        ('status == "RUNNING"', ["alpha", "Gamma-x"]),
        ("status != 'RUNNING'", ["beta"]),
        ('name ilike "%X%"', ["Gamma-x"]),
        ('name like "%x"', ["Gamma-x"]),
        ('name like "_eta"', ["beta"]),
        ("cluster_size >= 2", ["beta", "Gamma-x"]),
        ("cluster_size < 2 | cluster_size > 2", ["alpha", "Gamma-x"]),
        ('status == "RUNNING" & (cluster_size == 1 | name ilike "g%")', ["alpha", "Gamma-x"]),
        ('status in ["TERMINATED", "ERROR"]', ["beta"]),
        ("tag is null", ["alpha"]),
        ("tag isnot null", ["beta", "Gamma-x"]),
        ('created_at > "2026-01-01"', ["alpha", "Gamma-x"]),
    ],
)
def test_filters(expr: str, names: list[str]) -> None:
    predicate = minilang.parse_filter(expr, FIELDS)
    assert [i["name"] for i in ITEMS if predicate(i)] == names


@pytest.mark.parametrize(
    "expr",
    [
        'nope == "x"',
        'status = "RUNNING"',
        'status == "RUNNING" &',
        "(status == 'x'",
        "status ~ 1",
        "status in 3",
        "name like 5",
        "(" * 40 + "status == 'x'" + ")" * 40,
        "__class__ == 1",
        "status == ",
    ],
)
def test_bad_filters_are_errors_not_crashes(expr: str) -> None:
    with pytest.raises(minilang.MinilangError):
        minilang.parse_filter(expr, FIELDS)
    with pytest.raises(GraphQLError):
        page(list(ITEMS), {"filter": expr}, FIELDS)


def test_orders_and_pages() -> None:
    out = page(list(ITEMS), {"order": "-created_at", "limit": 2, "offset": 0}, FIELDS)
    assert [i["name"] for i in out["items"]] == ["Gamma-x", "alpha"] and out["total_count"] == 3
    out = page(list(ITEMS), {"order": "status,-cluster_size", "limit": 10, "offset": 1}, FIELDS)
    assert [i["name"] for i in out["items"]] == ["alpha", "beta"]
    for bad in ("nope", "-", "name;drop", ","):
        with pytest.raises(GraphQLError):
            page(list(ITEMS), {"order": bad}, FIELDS)
