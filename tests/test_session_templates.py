"""Session templates (Backend.AI's `/template/session` and `POST /session/_/create-from-template`), through a real
sim node: CRUD, who may see what, sessions made from a template with overrides, careless bodies (never a 5xx), bai's
CLI, and both official clients (23.9 in `.venv-bac/`, 26.9 in `.venv-bac26/`, skipped where missing but in CI)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.nodeproc import ROOT, Node, admin_keys, signed_request
from tests.test_official_client import Official, official_client

TEMPLATE = """\
api_version: "6"
kind: task_template
metadata:
  name: worker
  tag: nightly
spec:
  session_type: interactive
  kernel:
    image: python
    environ:
      GREETING: hello
      LEVEL: 3
  resources:
    cpu: 1
    mem: 256m
"""
BATCH = {
    "api_version": "6",
    "kind": "taskTemplate",
    "metadata": {"name": "job"},
    "spec": {
        "sessionType": "batch",
        "kernel": {"image": "python", "run": {"startupCommand": "echo hi"}, "environ": {"A": "1"}},
    },
}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    node = Node(tmp_path_factory.mktemp("templates"), "sim").start()
    yield node
    node.stop()


@pytest.fixture(scope="module")
def keys(node: Node) -> dict[str, tuple[str, str]]:
    one = node.json("keypair", "create", "--user", "tpl-one@example.com")
    two = node.json("keypair", "create", "--user", "tpl-two@example.com")
    return {
        "admin": admin_keys(node),
        "one": (one["accessKey"], one["secretKey"]),
        "two": (two["accessKey"], two["secretKey"]),
    }


def call(node: Node, keys: dict[str, tuple[str, str]], who: str, method: str, path: str, body: object = None):
    return signed_request(node, method, path, *keys[who], body=body)


def create(node: Node, keys: dict[str, tuple[str, str]], who: str, payload: object) -> str:
    status, answer = call(node, keys, who, "POST", "/template/session", {"payload": payload})
    assert status == 200, answer
    assert isinstance(answer, list) and len(answer) == 1 and set(answer[0]) == {"id", "user"}
    return answer[0]["id"]


def test_crud_and_the_shape_backend_ai_gives(node: Node, keys) -> None:
    tid = create(node, keys, "one", TEMPLATE)
    assert re.fullmatch(r"[0-9a-f]{32}", tid)
    status, items = call(node, keys, "one", "GET", "/template/session")
    assert status == 200
    item = next(i for i in items if i["id"] == tid)
    assert set(item) >= {"name", "id", "created_at", "is_owner", "user", "group", "user_email", "group_name"}
    assert set(item) >= {"domain_name", "type", "template"}
    assert (item["name"], item["is_owner"], item["type"], item["user_email"]) == (
        "worker",
        True,
        "task",
        "tpl-one@example.com",
    )
    assert (item["group_name"], item["domain_name"]) == ("default", "default")
    template = item["template"]
    assert template["spec"]["kernel"]["environ"] == {"GREETING": "hello", "LEVEL": "3"}
    assert template["metadata"] == {"name": "worker", "tag": "nightly"}

    status, got = call(node, keys, "one", "GET", f"/template/session/{tid}")
    assert status == 200 and got["template"] == template and got["name"] == "worker"
    assert set(got) >= {"template", "name", "user_uuid", "group_id", "domain_name"}
    status, text = call(node, keys, "one", "GET", f"/template/session/{tid}?format=yaml")
    assert status == 200 and isinstance(text, str) and "image: python" in text

    status, answer = call(node, keys, "one", "PUT", f"/template/session/{tid}", {"payload": json.dumps(BATCH)})
    assert (status, answer) == (200, {"success": True})
    status, got = call(node, keys, "one", "GET", f"/template/session/{tid}")
    assert got["name"] == "job" and got["template"]["spec"]["session_type"] == "batch"
    assert got["template"]["spec"]["kernel"]["run"]["startup_command"] == "echo hi"

    status, answer = call(node, keys, "one", "DELETE", f"/template/session/{tid}")
    assert (status, answer) == (200, {"success": True})
    assert call(node, keys, "one", "GET", f"/template/session/{tid}")[0] == 404
    assert call(node, keys, "one", "DELETE", f"/template/session/{tid}")[0] == 404


def test_a_payload_may_hold_several_templates_in_any_form(node: Node, keys) -> None:
    entries = [{"template": BATCH, "name": "named-entry"}, BATCH]
    status, answer = call(node, keys, "one", "POST", "/template/session", {"payload": json.dumps(entries)})
    assert status == 200 and len(answer) == 2
    names = {i["id"]: i["name"] for i in call(node, keys, "one", "GET", "/template/session")[1]}
    assert [names[a["id"]] for a in answer] == ["named-entry", "job"]
    docs = TEMPLATE + "---\n" + TEMPLATE.replace("worker", "second")
    status, answer = call(node, keys, "one", "POST", "/template/session", {"payload": docs})
    assert status == 200 and len(answer) == 2


def test_only_owners_and_admins_see_a_template(node: Node, keys) -> None:
    tid = create(node, keys, "one", TEMPLATE)
    for method, body in (("GET", None), ("PUT", {"payload": TEMPLATE}), ("DELETE", None)):
        status, answer = call(node, keys, "two", method, f"/template/session/{tid}", body)
        assert status == 404 and answer["type"].endswith("task-template-not-found"), answer
    status, answer = call(node, keys, "two", "POST", "/session/_/create-from-template", {"template_id": tid})
    assert status == 404, answer
    assert tid not in {i["id"] for i in call(node, keys, "two", "GET", "/template/session?all=true")[1]}
    # an admin: its own by default, everyone's with all
    assert tid not in {i["id"] for i in call(node, keys, "admin", "GET", "/template/session")[1]}
    everyone = {i["id"]: i for i in call(node, keys, "admin", "GET", "/template/session?all=true")[1]}
    assert tid in everyone and everyone[tid]["is_owner"] is False
    assert call(node, keys, "admin", "GET", f"/template/session/{tid}")[0] == 200
    assert call(node, keys, "admin", "PUT", f"/template/session/{tid}", {"payload": TEMPLATE})[0] == 200
    assert call(node, keys, "admin", "DELETE", f"/template/session/{tid}")[0] == 200


def _session(node: Node, keys, who: str, ref: str) -> dict:
    status, info = call(node, keys, who, "GET", f"/session/{ref}")
    assert status == 200, info
    return info


def test_a_session_from_a_template_with_overrides(node: Node, keys) -> None:
    tid = create(node, keys, "one", TEMPLATE)
    status, answer = call(
        node, keys, "one", "POST", "/session/_/create-from-template", {"template_id": tid, "name": "from-tpl-1"}
    )
    assert status == 201 and answer["status"] == "RUNNING", answer
    info = _session(node, keys, "one", "from-tpl-1")
    assert info["environ"] == {"GREETING": "hello", "LEVEL": "3"} and info["tag"] == "nightly"
    assert info["image"].startswith("bai-python") and info["requestedSlots"]["cpu"] in (1, "1")
    assert call(node, keys, "one", "DELETE", "/session/from-tpl-1")[0] < 300

    body = {
        "template_id": tid,
        "name": "from-tpl-2",
        "enqueueOnly": True,
        "image": "busybox-over",
        "tag": None,  # (None: the template's)
        "config": {"environ": {"GREETING": "hi"}, "resources": {"cpu": 2}, "mounts": []},
    }
    status, answer = call(node, keys, "one", "POST", "/session/_/create-from-template", body)
    assert status == 201, answer
    info = _session(node, keys, "one", "from-tpl-2")
    assert info["environ"] == {"GREETING": "hi"} and info["tag"] == "nightly"
    assert "busybox-over" in info["image"] and info["requestedSlots"]["cpu"] in (2, "2")
    status, answer = call(node, keys, "one", "DELETE", "/session/from-tpl-2?forced=true")  # (maybe starting)
    assert status < 300, answer

    batch = create(node, keys, "one", json.dumps(BATCH))
    body = {"template_id": batch, "name": "from-tpl-3", "enqueueOnly": True, "startupCommand": "echo over"}
    status, answer = call(node, keys, "one", "POST", "/session/_/create-from-template", body)
    assert status == 201, answer
    info = _session(node, keys, "one", "from-tpl-3")
    assert info["type"].lower() == "batch" and info["environ"] == {"A": "1"}
    assert call(node, keys, "one", "DELETE", "/session/from-tpl-3?forced=true")[0] < 300


CARELESS = [
    {"payload": {"api_version": "6"}},  # a mapping where text is expected
    {"payload": ["a"]},
    {"payload": None},
    {"payload": 5},
    {},
    {"payload": ""},
    {"payload": "a: [b"},  # not YAML
    {"payload": "x" * (300 * 1024)},  # too long
    {"payload": "[" * 200_000},
    {"payload": "- " * 20_000 + "x"},
    {"payload": "a: &x [1, 2]\nb: *x"},  # aliases
    {"payload": "just text"},
    {"payload": json.dumps([BATCH] * 100)},  # too many
    {"payload": json.dumps({**BATCH, "kind": "clusterTemplate"})},
    {"payload": json.dumps({**BATCH, "spec": {"kernel": {"image": ["x"]}}})},
    {
        "payload": json.dumps(
            {**BATCH, "spec": {"kernel": {"image": "x", "environ": {str(i): "v" for i in range(300)}}}}
        )
    },
    {"payload": json.dumps({**BATCH, "spec": {"kernel": {"image": "x", "environ": {"A=B": "v"}}}})},
    {"payload": json.dumps({**BATCH, "spec": {"kernel": {"image": "x"}, "mounts": {"../etc": "/x"}}})},
    {"payload": json.dumps({**BATCH, "spec": {"kernel": {"image": "x"}, "resources": {"cpu": [1]}}})},
    {"payload": json.dumps({**BATCH, "metadata": {"name": "x" * 500}})},
    {"payload": json.dumps({**BATCH, "spec": {"kernel": {"image": "x", "environ": {"A": "a\x00b"}}}})},
    {"payload": "api_version: 6\nkind: task_template\nmetadata: {name: t}\nspec: {kernel: {image: !!binary aGk=}}"},
    {"payload": TEMPLATE, "group": "no-such-project"},
    {"payload": TEMPLATE, "group": {"a": 1}},
]


@pytest.mark.parametrize("body", CARELESS, ids=range(len(CARELESS)))
def test_careless_bodies_are_clear_400s(node: Node, keys, body) -> None:
    status, answer = call(node, keys, "one", "POST", "/template/session", body)
    assert status == 400, (status, answer)
    assert isinstance(answer, dict) and answer["msg"], answer


def test_careless_requests_elsewhere_are_4xx(node: Node, keys) -> None:
    tid = create(node, keys, "one", TEMPLATE)
    cases = [
        ("POST", "/session/_/create-from-template", {}, 400),
        ("POST", "/session/_/create-from-template", {"template_id": 5}, 400),
        ("POST", "/session/_/create-from-template", {"template_id": "0" * 32}, 404),
        ("POST", "/session/_/create-from-template", {"template_id": "x" * 5000}, 404),
        ("POST", "/session/_/create-from-template", {"template_id": tid, "config": "x"}, 400),
        ("POST", "/session/_/create-from-template", {"template_id": tid, "config": {"resources": "x"}}, 400),
        ("POST", "/session/_/create-from-template", {"template_id": tid, "type": "weird"}, 400),
        ("POST", "/session/_/create-from-template", ["x"], 400),
        ("GET", f"/template/session/{tid}?format=xml", None, 400),
        ("GET", "/template/session?all=maybe", None, 400),
        ("PUT", f"/template/session/{tid}", {"payload": {"a": 1}}, 400),
        ("PUT", f"/template/session/{tid}", {"payload": json.dumps([BATCH, BATCH])}, 400),
        ("PUT", f"/template/session/{tid}", {}, 400),
        ("PUT", "/template/session/" + "0" * 32, {"payload": TEMPLATE}, 404),
        ("GET", "/template/session/%00", None, 404),
    ]
    for method, path, body, expected in cases:
        status, answer = call(node, keys, "one", method, path, body)
        assert status == expected, (method, path, body, status, answer)
        assert isinstance(answer, dict) and "type" in answer, answer


def test_bai_cli(node: Node, tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(TEMPLATE)
    created = node.json("session", "template", "create", str(path))
    tid = created[0]["id"]
    listed = node.json("session", "template", "list")
    assert tid in {i["id"] for i in listed}
    plain = node.cli("session", "template", "list", check=True).stdout
    assert tid in plain and "worker" in plain
    assert "GREETING: hello" in node.cli("session", "template", "get", tid, check=True).stdout
    assert node.json("session", "template", "get", tid)["template"]["metadata"]["name"] == "worker"
    stdin = node.cli("session", "template", "create", "-", "--json", input=json.dumps(BATCH), check=True)
    assert len(json.loads(stdin.stdout)) == 1
    result = node.json("session", "template", "run", tid, "--name", "cli-tpl", "--env", "GREETING=bye", "--cpu", "1")
    assert result["status"] == "RUNNING"
    info = node.json("session", "info", "cli-tpl")
    assert info["environ"] == {"GREETING": "bye"}
    node.cli("session", "destroy", "cli-tpl", check=True)
    path.write_text(TEMPLATE.replace("worker", "renamed"))
    node.cli("session", "template", "update", tid, str(path), check=True)
    assert node.json("session", "template", "get", tid)["name"] == "renamed"
    node.cli("session", "template", "delete", tid, check=True)
    missing = node.cli("session", "template", "get", tid)
    assert missing.returncode != 0 and "no session template" in (missing.stdout + missing.stderr)


def _program(version: str) -> str:
    if version == "23.9":
        return official_client()
    path = os.environ.get("BAI_OFFICIAL_CLIENT26") or str(ROOT / ".venv-bac26" / "bin" / "backend.ai")
    if not Path(path).is_file():
        reason = f"the official client 26.9 is not installed at {path} (backend.ai-client==26.9.6, Python 3.13)"
        if os.environ.get("BAI_REQUIRE_DOCKER") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return path


@pytest.mark.parametrize("version", ["23.9", "26.9"])
def test_official_clients_session_template_commands(node: Node, tmp_path: Path, version: str) -> None:
    bai = Official(_program(version), node, tmp_path)
    path = tmp_path / "t.yaml"
    path.write_text(TEMPLATE)
    out = bai("session-template", "create", "-f", str(path))
    match = re.search(r"Task template ([0-9a-f]{32}) created", out)
    assert match, out
    tid = match.group(1)
    listed = bai("session-template", "list")
    assert tid in listed and "worker" in listed, listed
    shown = bai("session-template", "get", tid)
    assert "GREETING: hello" in shown, shown
    assert '"GREETING": "hello"' in bai("session-template", "get", tid, "-f", "json")
    path.write_text(TEMPLATE.replace("worker", "renamed"))
    assert f"Task template {tid} updated" in bai("session-template", "update", tid, "-f", str(path))
    assert "renamed" in bai("session-template", "list")

    name = f"official-tpl-{version.replace('.', '')}"
    if version == "23.9":
        out = bai("session", "create-from-template", tid, "-t", name, "-e", "GREETING=over")
        assert "created and ready" in out, out
    else:  # 26.9's command itself fails before it sends anything (it passes its SDK an argument it lacks)
        out = bai("session", "create-from-template", tid, "-t", name, "-e", "GREETING=over")
        assert "unexpected keyword argument 'attach_network'" in out, out
        _sdk_create_from_template(bai, tid, name, {"GREETING": "over"})
    info = node.json("session", "info", name)
    assert info["environ"] == {"GREETING": "over"} and info["image"].startswith("bai-python"), info
    if version == "23.9":
        out = bai("session", "create-from-template", tid, "-t", name + "b")
        assert "created and ready" in out, out
    else:
        _sdk_create_from_template(bai, tid, name + "b", None)
    assert node.json("session", "info", name + "b")["environ"] == {"GREETING": "hello", "LEVEL": "3"}
    node.cli("session", "destroy", name, name + "b", check=True)

    out = bai("session-template", "create", input=json.dumps(BATCH))  # from stdin (each line given twice a newline)
    other = re.search(r"Task template ([0-9a-f]{32}) created", out)
    assert other, out
    assert other.group(1) in bai("session-template", "list", "-a")
    assert f"Task template {other.group(1)} deleted" in bai("session-template", "delete", other.group(1), "-f")
    assert f"Task template {tid} deleted" in bai("session-template", "delete", tid, "-f")
    assert tid not in bai("session-template", "list")
    if version == "23.9":
        out = bai("session", "create-from-template", tid, "-t", name + "c")
        assert "404" in out and "template" in out.lower(), out


def _sdk_create_from_template(bai: Official, tid: str, name: str, envs: dict[str, str] | None) -> None:
    """The official SDK's own `ComputeSession.create_from_template` (what the CLI command would call)."""
    import subprocess

    code = (
        "import json, sys\n"
        "from ai.backend.client.session import Session\n"
        "tid, name, envs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])\n"
        "with Session() as s:\n"
        "    kw = {'envs': envs} if envs is not None else {}\n"
        "    cs = s.ComputeSession.create_from_template(tid, name=name, **kw)\n"
        "    print(cs.status, cs.created)\n"
    )
    python = str(Path(bai.program).with_name("python"))
    out = subprocess.run(
        [python, "-c", code, tid, name, json.dumps(envs)], capture_output=True, text=True, env=bai.env, timeout=120
    )
    assert out.returncode == 0 and out.stdout.split() == ["RUNNING", "True"], out.stdout + out.stderr


# -- the pure part (rules/session_templates.py) ----------------------------------------------------------


def test_a_request_field_replaces_the_templates_under_any_of_its_names() -> None:
    from bai.node.manager.rules.session_templates import check_template, template_body, with_overrides

    template = check_template(
        {
            "apiVersion": 6,
            "kind": "taskTemplate",
            "metadata": {"name": "t", "tag": "x"},
            "spec": {
                "type": "batch",
                "scaling_group": "sg",
                "kernel": {"image": "py", "run": {"startup": "echo"}, "environ": {"A": True}},
                "mounts": {"data": "/data", "home": None},
                "resources": {"cpu": 2},
            },
        }
    )
    assert template.api_version == "6" and template.spec.kernel.environ == {"A": "true"}
    base = template_body(template, "default", "proj")
    assert base["config"] == {
        "scalingGroup": "sg",
        "mounts": ["data", "home"],
        "mount_map": {"data": "/data"},
        "environ": {"A": "true"},
        "resources": {"cpu": 2},
    }
    body = with_overrides(
        base,
        {
            "template_id": "t",
            "lang": "other",
            "sessionType": "interactive",
            "startup_command": None,
            "config": {"scaling_group": "sg2", "mounts": [], "environ": {}},
        },
    )
    assert "image" not in body and body["lang"] == "other" and "type" not in body
    assert body["sessionType"] == "interactive" and body["startupCommand"] == "echo" and "template_id" not in body
    assert body["config"]["scaling_group"] == "sg2" and "scalingGroup" not in body["config"]
    assert body["config"]["mounts"] == ["data", "home"] and body["config"]["environ"] == {}
    body = with_overrides(base, {"config": {"mounts": ["other"]}})
    assert body["config"]["mounts"] == ["other"] and "mount_map" not in body["config"]
