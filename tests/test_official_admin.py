"""The official Backend.AI client's administration (`backend.ai admin …`, `ps --filter/--order`) and its
SDK (`Session`, `AsyncSession`) against a real bai node, through GraphQL and the config endpoints.

A sim node: Docker is not the point here (what is asked of the manager is the same). The client exits 0
even when something fails, so each test reads what it prints (and the node's state).
"""

from __future__ import annotations

import json
import subprocess
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.nodeproc import Node, admin_keys, signed_request
from tests.test_official_client import Official, official_client


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> Iterator[Node]:
    capacity = 'cpu = "32"\nmem = "64g"\n'  # room for every session the tests keep running
    node = Node(tmp_path_factory.mktemp("official-admin"), "sim", agent_config=capacity).start()
    yield node
    node.stop()


@pytest.fixture
def bac(node: Node, tmp_path: Path) -> Official:
    return Official(official_client(), node, tmp_path)


def rest(node: Node, method: str, path: str, body: object = None) -> object:
    status, answer = signed_request(node, method, path, *admin_keys(node), body=body)
    assert status < 300, answer
    return answer


def user_keys(node: Node, user: str) -> tuple[str, str]:
    """A fresh non-admin keypair (bai's own admin API)."""
    made = rest(node, "POST", "/bai/admin/keypairs", {"user_id": user})
    assert isinstance(made, dict)
    return made["accessKey"], made["secretKey"]


def as_user(bac: Official, node: Node, user: str) -> Official:
    access, secret = user_keys(node, user)
    other = Official.__new__(Official)
    other.program, other.cwd = bac.program, bac.cwd
    other.env = {**bac.env, "BACKEND_ACCESS_KEY": access, "BACKEND_SECRET_KEY": secret}
    return other


def confirmed(bac: Official, *args: str) -> str:
    """A command that asks "Are you sure?", answered yes."""
    out = subprocess.run(
        [bac.program, *args], input="y\n", capture_output=True, text=True, env=bac.env, cwd=bac.cwd, timeout=120
    )
    return out.stdout + out.stderr


def sdk(bac: Official, code: str) -> dict:
    """Run Python with the official client's SDK (its own interpreter); the JSON it prints last."""
    python = str(Path(bac.program).parent / "python")
    out = subprocess.run(
        [python, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=bac.env, cwd=bac.cwd, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_admin_agent_list(bac: Official, node: Node) -> None:
    out = bac("admin", "agent", "list")
    assert node.agent_id in out and "ALIVE" in out, out
    assert "cpu:" in out and "Error" not in out, out


def test_admin_agent_info(bac: Official, node: Node) -> None:
    out = bac("admin", "agent", "info", node.agent_id)
    assert node.agent_id in out and "ALIVE" in out and "Error" not in out, out


def test_admin_image_list(bac: Official, node: Node) -> None:
    items = rest(node, "GET", "/bai/images")["items"]  # type: ignore[index]
    name = items[0]["name"]
    out = bac("admin", "image", "list")
    assert name.split(":")[0] in out and "Error" not in out, out


def test_admin_image_alias_and_dealias(bac: Official, node: Node) -> None:
    alias = "al-" + uuid.uuid4().hex[:6]
    out = bac("admin", "image", "alias", alias, "python:3.11-sim")
    assert f"An alias has created: {alias}" in out, out
    assert rest(node, "GET", "/bai/images/aliases")[alias] == "python:3.11-sim"  # type: ignore[index]
    assert f"The alias has been removed: {alias}" in bac("admin", "image", "dealias", alias)
    assert alias not in rest(node, "GET", "/bai/images/aliases")  # type: ignore[operator]
    assert "Dealiasing has failed" in bac("admin", "image", "dealias", alias)


def test_admin_keypair_list(bac: Official) -> None:
    out = bac("admin", "keypair", "list")
    assert bac.env["BACKEND_ACCESS_KEY"] in out and "admin" in out and "Error" not in out, out


def test_admin_keypair_info(bac: Official) -> None:
    out = bac("admin", "keypair", "info")
    assert bac.env["BACKEND_ACCESS_KEY"] in out and "True" in out, out


def keypairs(node: Node) -> dict[str, dict]:
    return {k["accessKey"]: k for k in rest(node, "GET", "/bai/admin/keypairs")["items"]}  # type: ignore[index]


def test_admin_keypair_add_update_delete(bac: Official, node: Node) -> None:
    user = "kp-" + uuid.uuid4().hex[:6]
    out = bac("admin", "keypair", "add", user, "default")
    assert "access_key" in out and "secret_key" in out, out
    [made] = [k for k in keypairs(node).values() if k["userId"] == user]
    assert made["accessKey"] in out and made["resourcePolicy"] == "default" and not made["isAdmin"]
    # (the client's `--is-active false` sends true: it converts with bool("false"); hence --is-admin 1)
    out = bac("admin", "keypair", "update", "--is-admin", "1", made["accessKey"])
    assert "ok" in out and "True" in out, out
    assert keypairs(node)[made["accessKey"]]["isAdmin"] is True
    # a keypair's user is named by the email `admin user list` prints (Backend.AI's user_id is the email)
    email = f"{user}@bai.local"
    assert made["accessKey"] in bac("admin", "keypair", "list", "--filter", f'user_id == "{email}"')
    assert email in bac("admin", "user", "list")
    assert "True" in bac("admin", "keypair", "activate", made["accessKey"])
    assert keypairs(node)[made["accessKey"]]["isActive"] is True
    assert "True" in bac("admin", "keypair", "deactivate", made["accessKey"])
    assert keypairs(node)[made["accessKey"]]["isActive"] is False
    out = bac("admin", "keypair", "delete", made["accessKey"])
    assert "True" in out, out
    assert made["accessKey"] not in keypairs(node)
    out = bac("admin", "keypair", "delete", bac.env["BACKEND_ACCESS_KEY"])
    assert "cannot delete the keypair you are using" in out, out


def test_admin_keypair_add_with_an_unknown_policy_fails(bac: Official) -> None:
    out = bac("admin", "keypair", "add", "nobody-" + uuid.uuid4().hex[:4], "no-such-policy")
    assert "no resource policy 'no-such-policy'" in out, out


def test_admin_keypair_resource_policy_list_add_update_delete(bac: Official, node: Node) -> None:
    assert "default" in bac("admin", "keypair-resource-policy", "list")
    name = "pol-" + uuid.uuid4().hex[:6]
    out = bac(
        "admin",
        "keypair-resource-policy",
        "add",
        name,
        "--total-resource-slots",
        '{"cpu": "4", "mem": "8g"}',
        "--max-concurrent-sessions",
        "3",
        "--idle-timeout",
        "600",
    )
    assert name in out and "True" in out, out
    policy = rest(node, "GET", "/bai/admin/policies")
    [row] = [p for p in policy["items"] if p["name"] == name]  # type: ignore[index]
    assert row["max_concurrent_sessions"] == 3 and row["idle_timeout"] == 600
    assert row["total_resource_slots"] == {"cpu": "4", "mem": "8589934592"}
    out = bac("admin", "keypair-resource-policy", "update", name, "--max-concurrent-sessions", "5")
    assert "True" in out, out
    listed = bac("admin", "keypair-resource-policy", "list")
    assert name in listed and "5" in listed, listed
    assert name in bac("admin", "keypair-resource-policy", "info", name)
    assert "True" in confirmed(bac, "admin", "keypair-resource-policy", "delete", name)
    assert name not in bac("admin", "keypair-resource-policy", "list")
    out = confirmed(bac, "admin", "keypair-resource-policy", "delete", "default")
    assert "the default resource policy stays" in out, out


def test_admin_scaling_group_list_and_info(bac: Official) -> None:
    out = bac("admin", "scaling-group", "list")
    assert "default" in out and "Error" not in out, out
    assert "default" in bac("admin", "scaling-group", "info", "default")


def test_admin_user_list_and_info(bac: Official) -> None:
    out = bac("admin", "user", "list")
    assert "admin@bai.local" in out and "superadmin" in out and "Error" not in out, out
    out = bac("admin", "user", "info")
    assert "admin@bai.local" in out, out


def test_admin_domain_list_and_info(bac: Official) -> None:
    out = bac("admin", "domain", "list")
    assert "default" in out and "Error" not in out, out
    assert "default" in bac("admin", "domain", "info", "default")


def test_admin_group_list_and_info(bac: Official) -> None:
    out = bac("admin", "group", "list")
    assert "default" in out and "Error" not in out, out
    assert "default" in bac("admin", "group", "info", "default")


def test_admin_storage_list_and_info(bac: Official) -> None:
    out = bac("admin", "storage", "list")
    assert "local" in out and "vfs" in out and "Error" not in out, out
    assert "vfs" in bac("admin", "storage", "info", "local")


def test_admin_resource_query_slots_and_registries(bac: Official) -> None:
    out = bac("admin", "resource", "query-slots")
    assert "cpu (count)" in out and "mem (bytes)" in out, out
    out = bac("admin", "resource", "docker-registries")
    assert "Error" not in out and "rror" not in out, out


def test_admin_resource_vfolder_types(bac: Official) -> None:
    assert bac("admin", "resource", "vfolder-types").split() == ["user"]


def test_admin_vfolder_list(bac: Official, node: Node) -> None:
    name = "avf-" + uuid.uuid4().hex[:4]
    node.cli("vfolder", "create", name, check=True)
    out = bac("admin", "vfolder", "list")
    assert name in out and "local" in out and "Error" not in out, out


def test_admin_session_list_and_info(bac: Official, node: Node) -> None:
    name = "asi-" + uuid.uuid4().hex[:4]
    node.cli("session", "create", "--name", name, "python", check=True)
    sid = node.json("session", "info", name)["id"]
    out = bac("admin", "session", "list", "--detail")
    assert name in out and "RUNNING" in out, out
    out = bac("admin", "session", "info", sid)
    assert name in out and "RUNNING" in out and "Error" not in out, out


def test_admin_manager_status(bac: Official, node: Node) -> None:
    node.cli("session", "create", "--name", "status-" + uuid.uuid4().hex[:4], "python", check=True)
    out = bac("admin", "manager", "status")
    assert "running" in out and "Active Sessions" in out, out


def test_ps_filter_and_order(bac: Official, node: Node) -> None:
    tag = uuid.uuid4().hex[:4]
    for name in (f"flt-a-{tag}", f"flt-b-{tag}", f"other-{tag}"):
        node.cli("session", "create", "--name", name, "python", check=True)
    out = bac("ps", "--filter", f'name ilike "flt-%-{tag}"', "--order", "name")
    assert f"flt-a-{tag}" in out and f"flt-b-{tag}" in out and f"other-{tag}" not in out, out
    assert out.index(f"flt-a-{tag}") < out.index(f"flt-b-{tag}")
    out = bac("ps", "--filter", f'name ilike "flt-%-{tag}"', "--order", "-name")
    assert out.index(f"flt-b-{tag}") < out.index(f"flt-a-{tag}"), out
    out = bac("ps", "--filter", f'name == "other-{tag}" | name == "flt-a-{tag}"')
    assert f"other-{tag}" in out and f"flt-a-{tag}" in out and f"flt-b-{tag}" not in out, out
    out = bac("ps", "--filter", 'status == "TERMINATED" & name == "nothing-here"')
    assert "NoItems" in out, out  # the client's way to say "No matching items." when not on a terminal
    out = bac("admin", "session", "list", "--filter", "name ===", "--order", "-created_at")
    assert "graphql-error" in out.lower() or "filter" in out, out


@pytest.mark.parametrize(
    "args,says",
    [
        (("admin", "image", "rescan"), "no registry catalogue to scan"),
        (("admin", "permission", "list"), "no per-host folder permissions"),
    ],
    ids=["image-rescan", "permission-list"],
)
def test_what_bai_does_not_offer_says_why(bac: Official, args: tuple[str, ...], says: str) -> None:
    out = bac(*args)
    assert says in out, out


def test_teams_through_the_official_client(bac: Official, node: Node) -> None:
    """`admin domain|group|user|scaling-group` as Backend.AI's users type them: each change is seen by the lists
    and by the next command (issue 31)."""
    tag = uuid.uuid4().hex[:6]
    domain, group, email, sgroup = f"dom-{tag}", f"grp-{tag}", f"u-{tag}@example.com", f"sg-{tag}"
    out = bac("admin", "domain", "add", domain)
    assert "ok" in out and "True" in out and domain in out, out
    assert domain in bac("admin", "domain", "list")
    out = bac("admin", "group", "add", domain, group, "--description", "a team")
    assert "True" in out and group in out, out
    gid = next(line.split()[-1] for line in out.splitlines() if line.strip().startswith("id"))
    out = bac("admin", "user", "add", domain, email, "a-long-password", "--full-name", "U Ser")
    assert "True" in out and email in out and "a-long-password" not in out, out
    listed = bac("admin", "user", "list")
    assert email in listed, listed
    user_id = next(line.split()[-1] for line in bac("admin", "user", "info", "--email", email).splitlines()
                   if line.strip().startswith(("UUID", "uuid")))  # fmt: skip
    out = bac("admin", "group", "add-users", gid, user_id)
    assert "True" in out or "success" in out.lower(), out
    info = bac("admin", "user", "info", "--email", email)
    assert group in info, info
    assert group in bac("admin", "group", "info", gid)
    out = bac("admin", "scaling-group", "add", sgroup, "--description", "for the team")
    assert "True" in out and sgroup in out, out
    assert sgroup in bac("admin", "scaling-group", "list")
    out = bac("admin", "scaling-group", "associate-scaling-group", sgroup, domain)
    assert "True" in out or "success" in out.lower(), out
    status, groups = signed_request(node, "GET", "/bai/scaling-groups", *admin_keys(node))
    assert status == 200 and {g["name"]: g["domains"] for g in groups["items"]}[sgroup] == [domain], groups
    out = bac("admin", "scaling-group", "get-available", "default")
    assert "default" in out, out
    out = bac("admin", "user", "update", email, "--status", "inactive")
    assert "inactive" in bac("admin", "user", "info", "--email", email), out
    out = bac("admin", "user", "delete", email)
    assert "True" in out or "success" in out.lower(), out
    out = confirmed(bac, "admin", "domain", "purge", domain)  # it still has a project and a user: refused, said why
    assert "still has" in out, out


def test_users_get_insufficient_privilege(bac: Official, node: Node) -> None:
    user = as_user(bac, node, "plain-" + uuid.uuid4().hex[:4])
    for args in (("admin", "agent", "list"), ("admin", "user", "list"), ("admin", "keypair", "add", "x", "default")):
        out = user(*args)
        assert "insufficient privilege" in out, (args, out)
    out = user("admin", "keypair", "list")  # a user sees their own keypair only
    assert user.env["BACKEND_ACCESS_KEY"] in out and bac.env["BACKEND_ACCESS_KEY"] not in out, out


SDK_SYNC = """
import json
from ai.backend.client.session import Session
with Session() as s:
    agents = s.Agent.paginated_list(status="ALIVE")
    made = s.KeyPair.create("sdk-sync-user", resource_policy="default")
    sessions = s.ComputeSession.paginated_list()
    print(json.dumps({
        "agents": [a["id"] for a in agents.items],
        "created": made["ok"] and bool(made["keypair"]["access_key"]),
        "total": sessions.total_count,
        "fields": sorted(sessions.items[0]) if sessions.items else [],
    }))
"""

SDK_ASYNC = """
import asyncio, json
from ai.backend.client.session import AsyncSession
async def main():
    async with AsyncSession() as s:
        agents = await s.Agent.paginated_list(status="ALIVE", filter='scaling_group == "default"', order="-id")
        made = await s.KeyPair.create("sdk-async-user", resource_policy="default")
        sessions = await s.ComputeSession.paginated_list(status="RUNNING", order="-created_at")
        return {
            "agents": [a["id"] for a in agents.items],
            "created": made["ok"] and bool(made["keypair"]["access_key"]),
            "total": sessions.total_count,
            "fields": sorted(sessions.items[0]) if sessions.items else [],
        }
print(json.dumps(asyncio.run(main())))
"""


@pytest.mark.parametrize("code", [SDK_SYNC, SDK_ASYNC], ids=["Session", "AsyncSession"])
def test_sdk_agent_keypair_and_session_lists(bac: Official, node: Node, code: str) -> None:
    node.cli("session", "create", "--name", "sdk-" + uuid.uuid4().hex[:4], "python", check=True)
    result = sdk(bac, code)
    assert result["agents"] == [node.agent_id] and result["created"] is True, result
    assert result["total"] >= 1, result
    assert result["fields"] == sorted(
        ["id", "image", "type", "status", "status_info", "status_changed", "result", "abusing_reports"]
    ), result


def test_admin_image_list_on_docker(docker_node: Node, tmp_path: Path) -> None:
    """With Docker the images are real: the kernel image with its registry, tag, digest and size."""
    from tests.nodeproc import PYTHON_IMAGE

    bac = Official(official_client(), docker_node, tmp_path)
    out = bac("admin", "image", "list")
    repo, _, tag = PYTHON_IMAGE.rpartition(":")
    [row] = [line for line in out.splitlines() if line.startswith(repo.rsplit("/", 1)[-1] + " ")]
    assert f" {tag} " in row and "sha256:" in row and "[python]" in row, out  # the node's alias `python`
    assert row.split()[-2][-1] in "KMG", row  # its size, humanised
