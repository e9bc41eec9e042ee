"""Property-based fuzzing of every route a keypair can reach: wrong JSON types, missing and extra fields,
huge strings, NUL and lone surrogates, NaN-like and huge numbers, deep nesting, bodies that are not JSON.
Whatever arrives, the answer is a 2xx or a 4xx problem: any 5xx fails.

Each route gets a fixed set of inputs (the same in every run) and a few new random ones;
BAI_FUZZ_EXAMPLES sets how many (30 fixed, a sixth of that random)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.nodeproc import Node, admin_keys, signed_request

EXAMPLES = int(os.environ.get("BAI_FUZZ_EXAMPLES", "30"))
COMMON = {"deadline": None, "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]}
FIXED = settings(max_examples=EXAMPLES, derandomize=True, **COMMON)  # the same inputs in every run
RANDOM = settings(max_examples=max(EXAMPLES // 6, 3), derandomize=False, database=None, **COMMON)  # new ones

TEXT = st.text(max_size=40) | st.sampled_from(
    ["", "\x00", "a\x00b", "..", "../..", "/etc/passwd", "x" * 5000, "🙂", "\ud800", "a\udfffb"]  # lone surrogates
)
NUMBER = st.integers() | st.floats(allow_nan=False) | st.sampled_from([1e308, -1e308, 2**64, -1, 0, 1e-9])
SCALAR = st.none() | st.booleans() | NUMBER | TEXT
JSON = st.recursive(
    SCALAR,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
# the field names routes read, so that fuzzed bodies reach past "unknown field" checks
FIELDS = [
    "name", "image", "lang", "type", "sessionType", "config", "tag", "enqueueOnly", "maxWaitSeconds",
    "reuseIfExists", "startupCommand", "starts_at", "dependencies", "clusterSize", "owner_access_key",
    "mode", "code", "runId", "options", "host", "usage_mode", "permission", "new_name", "path", "paths",
    "target_path", "new_path", "parents", "recursive", "user_id", "is_admin", "is_active",
    "resource_policy", "max_concurrent_sessions", "total_resource_slots", "idle_timeout", "data",
    "command", "rows", "cols", "app", "arguments", "envs",
    "query", "variables", "emails", "access_keys", "size", "archive", "file", "dst", "src", "shared_user_uuids",
    "files", "taskId", "cluster_size", "clusterMode", "cluster_mode", "kernel", "kernel_id",
    "target_name", "target_host", "cloneable", "perm", "user_ids", "inv_id", "vfolder_id", "vfolder", "user",
    "user_email", "id", "shared_user_uuid", "onwer_access_key",
    "month", "group_ids", "group_id", "project_id", "start_date", "end_date", "period", "by", "all",
    "payload", "template_id", "group", "domain", "format",
    "resource_slots", "shared_memory", "scaling_group_name", "scaling_group", "priority", "timeLimit",
    "preemptible", "isPreemptible",
]  # fmt: skip
CONFIG = st.fixed_dictionaries(
    {},
    optional={
        k: JSON for k in ("resources", "environ", "mounts", "mount_map", "mount_options", "network", "scalingGroup")
    },
)
BODY = (
    st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=8), JSON | CONFIG, max_size=8)
    | JSON
    | st.binary(max_size=64)  # not JSON at all (or not UTF-8)
)
# deep nesting: a parser or a validator that recurses must not fall over
DEEP = st.integers(min_value=100, max_value=5000).map(lambda n: b"[" * n + b"]" * n)


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> Iterator[Node]:
    apps = 'sim_apps = "echo:tcp:7000,broken:tcp:7001"\n'  # so that the app routes reach an agent
    node = Node(tmp_path_factory.mktemp("fuzz"), "sim", agent_config=apps).start()
    node.cli("session", "create", "--name", "fuzz-session", "python", check=True)
    # for the upload test: created first, before fuzzed sessions fill the agent (the fuzz never names it)
    node.cli("session", "create", "--name", "upload-target", "python", "--cpu", "0.5", check=True)
    # renamed by the fuzz (it shares the sim agent's second core with upload-target)
    node.cli("session", "create", "--name", "rename-target", "python", "--cpu", "0.5", check=True)
    node.cli("vfolder", "create", "fuzz-folder", check=True)
    yield node
    node.stop()


@pytest.fixture(scope="module")
def keys(node: Node) -> dict[str, tuple[str, str]]:
    user = node.json("keypair", "create", "--user", "fuzzer")
    return {"admin": admin_keys(node), "user": (user["accessKey"], user["secretKey"])}


SESSION = {"image": "python", "enqueueOnly": True, "config": {"resources": {"cpu": 1}}}
TEMPLATE = json.dumps(
    {"api_version": "6", "kind": "task_template", "metadata": {"name": "f"}, "spec": {"kernel": {"image": "py"}}}
)
# (method, path, a valid body: fuzzed bodies are this with fields replaced, dropped or added, so that
# they get past the first check); {ref} and {name} get an existing object or fuzzed text
ROUTES = [
    ("POST", "/session", SESSION),
    ("POST", "/session", {**SESSION, "type": "batch", "startupCommand": "true", "starts_at": "10s"}),
    ("POST", "/session", {**SESSION, "clusterSize": 2, "clusterMode": "multi-node"}),  # a cluster session
    ("GET", "/session", None),
    ("GET", "/session/{ref}", None),
    ("DELETE", "/session/{ref}", None),
    ("POST", "/session/{ref}", {"mode": "query", "code": "print(1)", "runId": "r1", "options": {}}),
    ("POST", "/session/{ref}", {"mode": "query", "code": "print(1)", "kernel": "main1"}),  # a kernel named
    ("POST", "/session/{ref}/interrupt", None),
    ("GET", "/stream/session/{ref}/pty", None),
    ("GET", "/stream/session/{ref}/apps", None),
    ("POST", "/stream/session/{ref}/apps/echo/start", None),
    ("POST", "/stream/session/{ref}/apps/broken/start", None),
    ("GET", "/stream/session/{ref}/tcpproxy", None),
    ("GET", "/stream/session/{ref}/httpproxy", None),
    ("GET", "/session/{ref}/logs", None),
    ("GET", "/bai/session/{ref}/history", None),
    ("GET", "/bai/session/{ref}/stats", None),
    ("POST", "/session/{ref}/upload", None),
    ("GET", "/session/{ref}/files", {"path": "/home/work"}),
    ("GET", "/session/{ref}/download", {"files": ["a.txt"]}),
    ("POST", "/session/{ref}/download", {"files": ["a.txt", "b/c.txt"]}),
    ("PATCH", "/session/{ref}", None),
    ("POST", "/session/{ref}/restart", None),
    ("POST", "/session/rename-target/rename", {"name": "rename-target"}),
    ("GET", "/session/{ref}/status-history", None),
    ("GET", "/session/{ref}/dependency-graph", None),
    ("POST", "/session/{ref}/commit", {"image": "fuzz/image:1"}),
    ("GET", "/session/_/logs", None),
    ("GET", "/bai/agents", None),
    ("GET", "/bai/quota", None),
    ("GET", "/resource/usage/month", {"month": "202612", "group_ids": []}),
    ("GET", "/resource/usage/period", {"group_id": None, "start_date": "20261201", "end_date": "20261210"}),
    ("GET", "/resource/stats/user/month", None),
    ("GET", "/resource/stats/admin/month", None),
    ("POST", "/resource/recalculate-usage", None),
    ("GET", "/bai/usage", None),
    # session templates: {ref} is fuzzed text or the fuzz session's name (no template: a 404 either way)
    ("POST", "/template/session", {"payload": TEMPLATE}),
    ("POST", "/template/session", {"payload": f"[{TEMPLATE}]", "group": "default"}),
    ("GET", "/template/session", {"all": True}),
    ("GET", "/template/session/{ref}", None),
    ("PUT", "/template/session/{ref}", {"payload": TEMPLATE}),
    ("DELETE", "/template/session/{ref}", None),
    ("POST", "/session/_/create-from-template", {"template_id": "0" * 32, "enqueueOnly": True, "config": {}}),
    ("POST", "/session/{ref}/priority", {"priority": 50}),
    (
        "POST",
        "/admin/gql",
        {
            "query": "mutation($input: ModifyComputeSessionInput!) { modify_compute_session(input: $input) "
            "{ item { name priority } clientMutationId } }",
            "variables": {"input": {"id": "00000000-0000-0000-0000-000000000000", "priority": 20}},
        },
    ),
    # resource presets: {ref} is fuzzed text or the fuzz session's name (no such preset: a 404)
    ("GET", "/resource/presets", None),
    ("POST", "/resource/check-presets", {"group": "default", "scaling_group": "default"}),
    ("GET", "/resource/check-presets", None),
    ("GET", "/bai/presets", None),
    ("POST", "/bai/presets", {"name": "fz", "resource_slots": {"cpu": "1"}, "shared_memory": "64m"}),
    ("GET", "/bai/presets/{ref}", None),
    ("PATCH", "/bai/presets/{ref}", {"resource_slots": {"mem": "1g"}, "scaling_group_name": None}),
    ("DELETE", "/bai/presets/{ref}", None),
    # scheduling rounds (superadmins): {ref} is fuzzed text (a 400 unless a round number; one not kept: a 404)
    ("GET", "/bai/scheduler/rounds", None),
    ("GET", "/bai/scheduler/rounds/{ref}", None),
    ("GET", "/bai/scheduler/fair-share", None),
    # Backend.AI's scheduling history (superadmins)
    (
        "POST",
        "/scheduling-history/sessions/search",
        {"filter": {"message": {"i_contains": "room"}, "result": ["FAILURE"]}, "order": [{"field": "updated_at"}]},
    ),
    (
        "POST",
        "/admin/gql",
        {"query": 'mutation { create_resource_preset(name: "fz", props: {resource_slots: "{}"}) { ok msg } }'},
    ),
    ("POST", "/admin/gql", {"query": "{ resource_presets { name resource_slots shared_memory } }"}),
    ("POST", "/admin/gql", {"query": "query { compute_session_list { items { id name } total_count } }"}),
    (
        "POST",
        "/admin/gql",
        {
            "query": "query($limit: Int!, $offset: Int!, $filter: String, $order: String, $status: String) "
            "{ compute_session_list(limit: $limit, offset: $offset, filter: $filter, order: $order, status: $status) "
            "{ items { id name status abusing_reports containers { id } } total_count } }",
            "variables": {"limit": 20, "offset": 0, "filter": 'name ilike "%fuzz%"', "order": "-created_at"},
        },
    ),
    (
        "POST",
        "/admin/gql",
        {
            "query": "query($limit: Int!, $offset: Int!, $filter: String, $status: String) { agent_list(limit: $limit, "
            "offset: $offset, filter: $filter, status: $status) { items { id status available_slots } total_count } "
            "keypair_list(limit: $limit, offset: $offset) { items { access_key } total_count } }",
            "variables": {"limit": 10, "offset": 0, "filter": 'status == "ALIVE"', "status": "ALIVE"},
        },
    ),
    (
        "POST",
        "/admin/gql",
        {
            "query": "mutation($user_id: String!, $input: KeyPairInput!) { create_keypair(user_id: $user_id, "
            "props: $input) { ok msg keypair { access_key } } }",
            "variables": {"user_id": "gql-fuzzed", "input": {"is_active": True, "resource_policy": "default"}},
        },
    ),
    (
        "POST",
        "/admin/gql",
        {
            "query": "mutation($name: String!, $input: ModifyKeyPairResourcePolicyInput!) { "
            "modify_keypair_resource_policy(name: $name, props: $input) { ok msg } }",
            "variables": {"name": "fuzzed-gql", "input": {"total_resource_slots": "{}", "idle_timeout": 0}},
        },
    ),
    (
        "POST",
        "/admin/gql",
        {
            "query": "mutation($alias: String!, $target: String!) { alias_image(alias: $alias, target: $target) "
            "{ ok msg } }",
            "variables": {"alias": "gql-fuzzed", "target": "python"},
        },
    ),
    ("GET", "/config/resource-slots", None),
    ("GET", "/config/docker-registries", None),
    ("GET", "/manager/status", None),
    ("GET", "/folders/_/hosts", None),
    ("POST", "/folders", {"name": "fuzzed-folder", "host": "local", "usage_mode": "general"}),
    ("GET", "/folders", None),
    ("GET", "/folders/{name}", None),
    ("DELETE", "/folders/{name}", None),
    ("POST", "/bai/folders/{name}/restore", None),
    ("POST", "/folders/{name}/rename", {"new_name": "fuzz-renamed"}),
    ("POST", "/folders/{name}/share", {"permission": "ro", "emails": ["nobody@example.com"]}),
    ("DELETE", "/folders/{name}/unshare", {"emails": ["nobody@example.com"]}),
    ("GET", "/folders/{name}/files", {"path": ""}),
    ("POST", "/folders/{name}/mkdir", {"path": "a/b", "parents": True}),
    ("POST", "/folders/{name}/rename-file", {"target_path": "a", "new_name": "c"}),
    ("DELETE", "/folders/{name}/delete-files", {"files": ["c"], "recursive": True}),
    ("POST", "/folders/{name}/request-upload", {"path": "f.txt", "size": 3}),
    ("POST", "/folders/{name}/request-download", {"file": "f.txt", "archive": False}),
    ("POST", "/folders/{name}/move-file", {"src": "a", "dst": "b"}),
    ("POST", "/folders/{name}/clone", {"target_name": "fuzz-clone", "target_host": "local", "permission": "rw"}),
    ("POST", "/folders/{name}/update-options", {"permission": "ro", "cloneable": True}),
    ("POST", "/folders/{name}/invite", {"perm": "ro", "user_ids": ["fuzzer"]}),
    ("POST", "/folders/{name}/leave", {"shared_user_uuid": "fuzzer"}),
    ("GET", "/folders/invitations/list", None),
    ("GET", "/folders/invitations/list-sent", None),
    ("POST", "/folders/invitations/accept", {"inv_id": "0" * 32}),
    ("DELETE", "/folders/invitations/delete", {"inv_id": "0" * 32}),
    ("GET", "/folders/_/allowed_types", None),
    ("GET", "/folders/_/all_hosts", None),
    ("GET", "/folders/_/shared", {"vfolder_id": "0" * 32}),
    ("POST", "/folders/_/shared", {"vfolder": "fuzz-folder", "user": "fuzzer", "perm": "ro"}),
    ("POST", "/folders/_/change-ownership", {"vfolder": "fuzz-folder", "user_email": "fuzzer"}),
    ("DELETE", "/folders", {"id": "0" * 32}),
    ("GET", "/user-config/dotfiles", None),
    ("GET", "/user-config/dotfiles", {"path": ".fuzzrc", "owner_access_key": "AKIA"}),
    ("POST", "/user-config/dotfiles", {"path": ".fuzzrc", "data": "x=1\n", "permission": "644"}),
    ("PATCH", "/user-config/dotfiles", {"path": ".fuzzrc", "data": "x=2\n", "permission": "600"}),
    ("DELETE", "/user-config/dotfiles", {"path": ".fuzzrc"}),
    ("GET", "/bai/images", None),
    ("POST", "/bai/images/pull", {"image": "127.0.0.1:1/x"}),
    ("DELETE", "/bai/images", {"image": "nothing:here"}),
    ("PUT", "/bai/images/aliases/{name}", {"image": "bai-python:3.11"}),
    ("GET", "/bai/admin/keypairs", None),
    ("POST", "/bai/admin/keypairs", {"user_id": "fuzzed", "is_admin": False, "resource_policy": "default"}),
    ("PATCH", "/bai/admin/keypairs/{ref}", {"resource_policy": "default"}),
    ("POST", "/bai/admin/policies", {"name": "fuzzed", "max_concurrent_sessions": 1}),
    ("PATCH", "/bai/admin/policies/{name}", {"max_concurrent_sessions": 2}),
    # teams (issue 31): bai's REST, Backend.AI's scaling groups, and the GraphQL mutations
    ("GET", "/scaling-groups", {"group": "default"}),
    ("GET", "/bai/users", {"domain": "default", "project": "default"}),
    ("POST", "/bai/users", {"email": "fuzz@example.com", "password": "fuzz-password", "projects": ["default"]}),
    ("GET", "/bai/users/{ref}", None),
    ("PATCH", "/bai/users/{ref}", {"full_name": "Fuzz", "role": "user", "is_active": True}),
    ("DELETE", "/bai/users/{ref}", None),
    ("GET", "/bai/projects", None),
    ("POST", "/bai/projects", {"name": "fuzz-project", "domain": "default", "total_resource_slots": {"cpu": 2}}),
    ("GET", "/bai/projects/{ref}", None),
    ("PATCH", "/bai/projects/{ref}", {"description": "x", "total_resource_slots": {"cuda.device": 8}}),
    ("DELETE", "/bai/projects/{ref}", None),
    ("POST", "/bai/projects/{ref}/members", {"add": ["fuzzer"], "remove": []}),
    ("GET", "/bai/domains", None),
    ("POST", "/bai/domains", {"name": "fuzz-domain", "description": "x"}),
    ("PATCH", "/bai/domains/{name}", {"is_active": True}),
    ("DELETE", "/bai/domains/{name}", None),
    ("GET", "/bai/scaling-groups", None),
    ("POST", "/bai/scaling-groups/{name}/associations", {"domain": "default", "remove": False}),
    (
        "POST",
        "/admin/gql",
        {
            "query": "mutation($email: String!, $input: UserInput!) { create_user(email: $email, props: $input) "
            "{ ok msg user { uuid email groups { id name } } } }",
            "variables": {
                "email": "gql-fuzz@example.com",
                "input": {"password": "long-enough", "domain_name": "default"},
            },
        },
    ),
    (
        "POST",
        "/admin/gql",
        {
            "query": "mutation($name: String!, $input: GroupInput!) { create_group(name: $name, props: $input) "
            "{ ok msg group { id } } }",
            "variables": {"name": "gql-fuzz", "input": {"domain_name": "default", "total_resource_slots": "{}"}},
        },
    ),
    (
        "POST",
        "/admin/gql",
        {
            "query": "mutation($gid: UUID!, $input: ModifyGroupInput!) { modify_group(gid: $gid, props: $input) "
            "{ ok msg } }",
            "variables": {"gid": "default", "input": {"user_update_mode": "add", "user_uuids": ["fuzzer"]}},
        },
    ),
    (
        "POST",
        "/admin/gql",
        {
            "query": "mutation($sg: String!, $d: String!) { associate_scaling_group_with_domain(scaling_group: $sg, "
            "domain: $d) { ok msg } }",
            "variables": {"sg": "default", "d": "default"},
        },
    ),
    (
        "POST",
        "/admin/gql",
        {
            "query": "query($d: String, $g: UUID) { users(domain_name: $d, group_id: $g) { email } domains { name } "
            'groups(domain_name: $d) { id name scaling_groups } scaling_groups_for_user_group(user_group: "default") '
            "{ name } user_resource_policies { name } project_resource_policies { name } }",
            "variables": {"d": "default", "g": "default"},
        },
    ),
]
CONFIG_FIELDS = ["resources", "environ", "mounts", "mount_map", "mount_options", "network", "scalingGroup", "x"]


@st.composite
def bodies(draw, base: dict | None):
    """Mostly the route's valid body with a few fields replaced, dropped or added; sometimes anything."""
    if base is None or draw(st.integers(0, 4)) == 0:
        return draw(BODY | DEEP)
    body = dict(base)
    for key in draw(st.lists(st.sampled_from(sorted(body)), max_size=2)):
        body.pop(key, None)
    body.update(draw(st.dictionaries(st.sampled_from(sorted(set(FIELDS) | set(base))), JSON, max_size=3)))
    if isinstance(base.get("config"), dict) and draw(st.booleans()):
        body["config"] = {**base["config"], **draw(st.dictionaries(st.sampled_from(CONFIG_FIELDS), JSON, max_size=3))}
    return body


def _quoted(text: str) -> str:
    """Percent-encoded as a careless client would, lone surrogates included (invalid UTF-8)."""
    return quote(text.encode("utf-8", "surrogatepass"), safe="")


def _path(template: str, ref: str | None, name: str | None) -> str:
    ref = ref if ref is not None else "fuzz-session"
    name = name if name is not None else "fuzz-folder"
    return template.replace("{ref}", _quoted(ref)).replace("{name}", _quoted(name))


def check(node, keys, method, template, body, query, ref, name, who) -> None:
    if method == "POST" and template == "/session" and isinstance(body, dict):
        body["enqueueOnly"] = True  # never block on a session that cannot start
    query.pop("follow", None)  # a followed log waits for its session's end
    qs = "&".join(f"{_quoted(k)}={_quoted(v)}" for k, v in query.items())
    path = _path(template, ref, name) + (f"?{qs}" if qs else "")
    access, secret = keys[who]
    status, answer = signed_request(node, method, path, access, secret, body=body)
    assert status < 500, (method, path, body, answer)
    if status >= 400:
        assert isinstance(answer, dict) and "type" in answer, answer


ARGS = {
    "data": st.data(),
    "query": st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=6), st.text(max_size=30), max_size=4),
    "ref": st.none() | TEXT,
    "name": st.none() | TEXT,
    "who": st.sampled_from(["user", "admin"]),
}
CASES = pytest.mark.parametrize("method,template,base", ROUTES, ids=[f"{m} {p}" for m, p, _ in ROUTES])


@CASES
@FIXED
@given(**ARGS)
def test_no_fixed_input_gets_a_server_error(node, keys, method, template, base, data, query, ref, name, who) -> None:
    check(node, keys, method, template, data.draw(bodies(base)), query, ref, name, who)


@CASES
@RANDOM
@given(**ARGS)
def test_no_random_input_gets_a_server_error(node, keys, method, template, base, data, query, ref, name, who) -> None:
    check(node, keys, method, template, data.draw(bodies(base)), query, ref, name, who)


# inputs that once answered 500, each named; and the cluster fields' edge cases (issue 20)
KNOWN = [
    ("POST", "/session", {**SESSION, "clusterSize": True}),
    ("POST", "/session", {**SESSION, "clusterSize": 1e308}),
    ("POST", "/session", {**SESSION, "clusterSize": 2**64}),
    ("POST", "/session", {**SESSION, "clusterSize": "2"}),
    ("POST", "/session", {**SESSION, "clusterSize": 2, "clusterMode": {"a": 1}}),
    ("POST", "/session", {**SESSION, "clusterSize": 2, "clusterMode": "\ud800"}),
    ("POST", "/session", {**SESSION, "clusterMode": "multi-node", "config": {"network": "host"}}),
    ("POST", "/session/fuzz-session", {"mode": "query", "code": "1", "kernel": {"a": 1}}),
    ("GET", "/session/fuzz-session/logs?kernel_id=%ff%fe", None),
    ("GET", "/session/fuzz-session/logs?kernel=sub1&kernel_id=main1", None),
    ("POST", "/session", {**SESSION, "tag": {"a": 1}}),
    ("POST", "/session", {**SESSION, "config": {"scalingGroup": {"a": 1}}}),
    ("POST", "/session", {**SESSION, "type": "batch", "startupCommand": "true", "starts_at": "99999999d"}),
    ("POST", "/session", {**SESSION, "startupCommand": {"a": 1}}),
    ("POST", "/session", {**SESSION, "config": {"environ": {"A": {"b": 1}}}}),
    ("POST", "/user-config/dotfiles", {"path": ".x", "data": "a\ud800b", "permission": "644"}),
    ("POST", "/folders", {"name": "known-folder", "host": {"a": 1}}),
    ("POST", "/bai/admin/keypairs", {"user_id": "u", "resource_policy": 2**63}),
    ("POST", "/admin/gql", b"[" * 5000 + b"]" * 5000),
]


@pytest.mark.parametrize("method,path,body", KNOWN, ids=[f"{m} {p} #{i}" for i, (m, p, _) in enumerate(KNOWN)])
def test_inputs_that_once_failed_are_4xx(node, keys, method: str, path: str, body) -> None:
    status, answer = signed_request(node, method, path, *keys["admin"], body=body)
    assert 400 <= status < 500, answer


def test_a_nul_in_an_uploaded_file_name_is_4xx(node, keys) -> None:
    import http.client
    from urllib.parse import urlsplit

    from bai import API_VERSION
    from bai.common import auth

    boundary = "fuzzboundary"
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="src"; filename="a\x00b.py"\r\n'
        f"Content-Type: application/octet-stream\r\n\r\nprint(1)\r\n--{boundary}--\r\n"
    ).encode()
    access, secret = keys["admin"]
    host, path = urlsplit(node.endpoint).netloc, "/session/upload-target/upload"
    date = auth.now_header()
    ctype = f"multipart/form-data; boundary={boundary}"
    sig = auth.sign(secret, "POST", path, date, host, "multipart/form-data", API_VERSION)
    conn = http.client.HTTPConnection(host, timeout=30)
    try:
        conn.request(
            "POST",
            path,
            body=body,
            headers={
                "Date": date,
                "X-BackendAI-Version": API_VERSION,
                "Authorization": auth.authorization_header(access, sig),
                "Content-Type": ctype,
            },
        )
        resp = conn.getresponse()
        status, answer = resp.status, resp.read().decode()
    finally:
        conn.close()
    assert status == 400 and "invalid-api-params" in answer, answer  # signed right, refused for the name


def test_a_nested_multipart_upload_is_4xx(node, keys) -> None:
    """A part that is itself a multipart body is no file: a 400, not a 500 (it has no filename to read)."""
    import http.client
    from urllib.parse import urlsplit

    from bai import API_VERSION
    from bai.common import auth

    outer, inner = "fuzzouter", "fuzzinner"
    body = (
        f'--{outer}\r\nContent-Disposition: form-data; name="src"\r\n'
        f"Content-Type: multipart/mixed; boundary={inner}\r\n\r\n"
        f'--{inner}\r\nContent-Disposition: attachment; filename="a.py"\r\n'
        f"Content-Type: application/octet-stream\r\n\r\nprint(1)\r\n--{inner}--\r\n"
        f"\r\n--{outer}--\r\n"
    ).encode()
    access, secret = keys["admin"]
    host, path = urlsplit(node.endpoint).netloc, "/session/upload-target/upload"
    date = auth.now_header()
    sig = auth.sign(secret, "POST", path, date, host, "multipart/form-data", API_VERSION)
    conn = http.client.HTTPConnection(host, timeout=30)
    try:
        conn.request(
            "POST",
            path,
            body=body,
            headers={
                "Date": date,
                "X-BackendAI-Version": API_VERSION,
                "Authorization": auth.authorization_header(access, sig),
                "Content-Type": f"multipart/form-data; boundary={outer}",
            },
        )
        resp = conn.getresponse()
        status, answer = resp.status, resp.read().decode()
    finally:
        conn.close()
    assert status == 400 and "nested multipart" in answer, answer
