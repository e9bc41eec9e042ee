"""What today's official client (26.x) asks that 23.9 never did, through the raw API as the clients sign it: folders
named by id (`/folders/_/id` first), the trash bin by id, `mkdir` of several paths with its results, every status
Backend.AI has in a filter, GraphQL refusals whose `data` lists the errors, and the operator's endpoints (freeze,
announcement, etcd keys, registries, mounts, my-ip, abusing-report, networks, quota scopes). Sim kernels."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.nodeproc import Node, admin_keys, signed_request

pytestmark = pytest.mark.xdist_group("backend-ai-routes")  # (one node; the freeze test changes it for a moment)


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> Iterator[Node]:
    node = Node(tmp_path_factory.mktemp("bai-routes"), "sim").start()
    yield node
    node.stop()


@pytest.fixture(scope="module")
def alice(node: Node) -> dict[str, str]:
    return node.json("keypair", "create", "--user", "alice@example.com")


def call(node: Node, method: str, path: str, body: object = None, keys: dict[str, str] | None = None):
    """(status, answer); never a 5xx, but a 501 `not-implemented` (what bai does not offer, with why) and a frozen
    manager's 503 `server-frozen` (Backend.AI's)."""
    ak, sk = (keys["accessKey"], keys["secretKey"]) if keys else admin_keys(node)
    status, answer = signed_request(node, method, path, ak, sk, body=body)
    kind = answer.get("type", "") if isinstance(answer, dict) else ""
    expected = (status, kind.rpartition("/")[2]) in ((501, "not-implemented"), (503, "server-frozen"))
    assert status < 500 or expected, (method, path, status, answer)
    return status, answer


def folder_id(node: Node, name: str, keys: dict[str, str] | None = None) -> str:
    status, answer = call(node, "GET", "/folders/_/id", {"name": name}, keys)
    assert status == 200, answer
    assert isinstance(answer, dict)
    return str(uuid.UUID(answer["id"]))  # (a UUID, as the clients parse it)


def test_folders_by_id_and_the_trash_bin(node: Node, alice: dict[str, str]) -> None:
    assert call(node, "POST", "/folders", {"name": "binned", "host": "local"}, alice)[0] == 201
    fid = folder_id(node, "binned", alice)
    status, info = call(node, "GET", f"/folders/{uuid.UUID(fid).hex}", keys=alice)
    assert status == 200 and info["name"] == "binned"
    # another user neither finds it by name nor removes it by id
    bob = node.json("keypair", "create", "--user", "bob@example.com")
    assert call(node, "GET", "/folders/_/id", {"name": "binned"}, bob)[0] == 404
    assert call(node, "DELETE", "/folders", {"id": fid}, bob)[0] in (403, 404)
    # its owner (no admin) sends it to the trash by id, finds it there by name, and restores it
    assert call(node, "DELETE", "/folders", {"id": fid}, alice)[0] == 204
    assert call(node, "GET", "/folders/binned", keys=alice)[0] == 404
    assert folder_id(node, "binned", alice) == fid
    assert call(node, "POST", "/folders/restore-from-trash-bin", {"id": fid}, alice)[0] == 204
    assert call(node, "GET", "/folders/binned", keys=alice)[0] == 200
    # a ready folder is not purged (it must be in the trash first); a trashed one is, files and all
    assert call(node, "POST", "/folders/delete-from-trash-bin", {"id": fid}, alice)[0] == 404
    assert call(node, "DELETE", "/folders", {"id": fid}, alice)[0] == 204
    assert call(node, "POST", "/folders/delete-from-trash-bin", {"id": fid}, alice)[0] == 204
    assert call(node, "GET", "/folders/_/id", {"name": "binned"}, alice)[0] == 404
    assert call(node, "POST", "/folders/purge", {"id": fid}, alice)[0] == 404  # (gone: nothing to purge)
    # force: past the trash at once
    assert call(node, "POST", "/folders", {"name": "forced", "host": "local"}, alice)[0] == 201
    forced = uuid.UUID(folder_id(node, "forced", alice)).hex
    assert call(node, "DELETE", f"/folders/{forced}/force", keys=bob)[0] in (403, 404)
    assert call(node, "DELETE", f"/folders/{forced}/force", keys=alice)[0] == 204
    assert call(node, "GET", "/folders/_/id", {"name": "forced"}, alice)[0] == 404
    # careless bodies: a clear 400 each
    for body in ({}, {"id": 7}, {"id": ["x"]}, {"id": {"a": 1}}):
        assert call(node, "DELETE", "/folders", body, alice)[0] == 400
        assert call(node, "POST", "/folders/purge", body, alice)[0] == 400
    for body in ({}, {"name": 3}, {"name": None}, {"name": {"x": 1}}):
        assert call(node, "GET", "/folders/_/id", body, alice)[0] == 400


def test_mkdir_of_several_paths_says_what_it_made(node: Node, alice: dict[str, str]) -> None:
    call(node, "POST", "/folders", {"name": "dirs", "host": "local"}, alice)
    fid = uuid.UUID(folder_id(node, "dirs", alice)).hex
    status, answer = call(node, "POST", f"/folders/{fid}/mkdir", {"path": ["a", "b/c"], "parents": True}, alice)
    assert status == 201 and [x["item"] for x in answer["results"]["success"]] == ["a", "b/c"], answer
    status, answer = call(node, "POST", f"/folders/{fid}/mkdir", {"path": ["a", "d"]}, alice)
    assert status == 207, answer
    assert [x["item"] for x in answer["results"]["success"]] == ["d"]
    assert [x["item"] for x in answer["results"]["failed"]] == ["a"] and answer["results"]["failed"][0]["msg"]
    status, answer = call(node, "POST", f"/folders/{fid}/mkdir", {"path": "a"}, alice)
    assert status == 400 and "exists" in answer["msg"], answer  # (nothing made: the problem itself)
    for bad in ([], [1], [["x"]], {"a": 1}, ["../escape"]):
        assert call(node, "POST", f"/folders/{fid}/mkdir", {"path": bad}, alice)[0] in (400, 403), bad


def test_every_status_backend_ai_has_is_a_filter(node: Node) -> None:
    node.cli("session", "create", "--name", "filtered", "python", check=True)
    query = "query($s: String) { compute_session_list(status: $s) { items { name status } total_count } }"
    everything = "PENDING,SCHEDULED,PREPARING,PULLING,PREPARED,CREATING,RUNNING,RESTARTING,RUNNING_DEGRADED,ERROR"
    status, answer = call(node, "POST", "/admin/gql", {"query": query, "variables": {"s": everything}})
    assert status == 200 and "filtered" in [i["name"] for i in answer["data"]["compute_session_list"]["items"]]
    status, answer = call(node, "POST", "/admin/gql", {"query": query, "variables": {"s": "PREPARED,CREATING"}})
    assert status == 200 and answer["data"]["compute_session_list"]["total_count"] == 0  # (no bai session is)
    status, answer = call(node, "GET", "/session?status=PREPARED,RUNNING,DEPRIORITIZING")
    assert status == 200 and "filtered" in [s["name"] for s in answer["items"]], answer
    assert call(node, "GET", "/session?status=PREPARED")[1]["items"] == []
    # a word that is no status is refused, and the refusal's `data` lists the errors (the clients print it)
    status, answer = call(node, "POST", "/admin/gql", {"query": query, "variables": {"s": "RUNNING,NAPPING"}})
    assert status == 400 and answer["type"].endswith("/graphql-error"), answer
    assert "NAPPING" in answer["data"][0]["message"] and answer["data"] == answer["errors"]
    assert call(node, "GET", "/session?status=NAPPING")[0] == 400
    node.cli("session", "destroy", "filtered", check=True)  # (the sim agent's slots are few)


def test_a_frozen_manager_starts_nothing_until_unfrozen(node: Node, alice: dict[str, str]) -> None:
    assert call(node, "PUT", "/manager/status", {"status": "frozen"}, alice)[0] == 403  # (admins only)
    assert call(node, "PUT", "/manager/status", {"status": "frozen"})[0] == 204
    try:
        status, answer = call(node, "POST", "/session", {"image": "python", "sessionName": "x"}, alice)
        assert status == 503 and answer["type"].endswith("/server-frozen"), answer
        assert call(node, "POST", "/folders", {"name": "during", "host": "local"}, alice)[0] == 503
        mutation = 'mutation { create_keypair(user_id: "z@example.com", props: {is_active: true}) { ok } }'
        assert call(node, "POST", "/admin/gql", {"query": mutation})[0] == 503
        # reads and running sessions still answer
        assert call(node, "GET", "/session", keys=alice)[0] == 200
        assert call(node, "GET", "/folders", keys=alice)[0] == 200
        out = node.cli("session", "create", "--name", "frozen-out", "python")
        assert out.returncode != 0 and "frozen" in (out.stderr + out.stdout)
    finally:
        assert call(node, "PUT", "/manager/status", {"status": "running"})[0] == 204
    assert call(node, "POST", "/folders", {"name": "after", "host": "local"}, alice)[0] == 201
    for bad in ({}, {"status": "asleep"}, {"status": "frozen", "force_kill": "yes"}, {"status": ["frozen"]}):
        assert call(node, "PUT", "/manager/status", bad)[0] == 400, bad


def test_the_announcement_is_set_by_admins_and_read_by_all(node: Node, alice: dict[str, str]) -> None:
    assert call(node, "POST", "/manager/announcement", {"enabled": True, "message": "hi"}, alice)[0] == 403
    assert call(node, "POST", "/manager/announcement", {"enabled": True, "message": "down at 9"})[0] == 204
    assert call(node, "GET", "/manager/announcement", keys=alice)[1] == {"enabled": True, "message": "down at 9"}
    assert call(node, "POST", "/manager/announcement", {"enabled": False})[0] == 204  # (the message is kept)
    assert call(node, "GET", "/manager/announcement")[1] == {"enabled": False, "message": "down at 9"}
    for bad in ({"enabled": "no"}, {"message": 5}, {"enabled": True, "message": ""}, {"message": "x" * 20_000}):
        assert call(node, "POST", "/manager/announcement", bad)[0] == 400, bad


def test_etcd_keys_registries_mounts_and_my_ip(node: Node, alice: dict[str, str]) -> None:
    status, answer = call(node, "POST", "/config/get", {"key": "volumes/default_host", "prefix": False})
    assert status == 200 and answer == {"result": "local"}
    status, answer = call(node, "POST", "/config/get", {"key": "volumes", "prefix": True})
    assert answer["result"]["default_host"] == "local" and Path(answer["result"]["local"]["path"]).is_dir()
    assert call(node, "POST", "/config/get", {"key": "no/such", "prefix": False})[1] == {"result": None}
    assert call(node, "POST", "/config/get", {"key": "volumes"}, alice)[0] == 403
    assert call(node, "POST", "/config/set", {"key": "a", "value": "b"})[0] == 501
    for bad in ({}, {"key": 1}, {"key": "a", "prefix": "yes"}):
        assert call(node, "POST", "/config/get", bad)[0] == 400, bad
    status, registries = call(node, "GET", "/resource/container-registries")
    assert status == 200 and isinstance(registries, dict)
    assert call(node, "GET", "/resource/container-registries", keys=alice)[0] == 403
    status, mounts = call(node, "GET", "/folders/_/mounts")
    assert status == 200 and mounts["manager"]["mounts"][0][0] == "local" and mounts["agents"] == {}
    assert call(node, "GET", "/folders/_/mounts", keys=alice)[0] == 403
    status, me = call(node, "GET", "/auth/my-ip", keys=alice)
    assert status == 200 and me["ip"] == "127.0.0.1"


def test_abusing_report_networks_and_quota_scopes(node: Node, alice: dict[str, str]) -> None:
    node.cli("session", "create", "--name", "reported", "python", check=True, as_keypair=alice)
    assert call(node, "GET", "/session/reported/abusing-report", keys=alice) == (200, {})
    assert call(node, "GET", "/session/no-such/abusing-report", keys=alice)[0] == 404
    node.cli("session", "destroy", "reported", check=True, as_keypair=alice)
    q = "query { networks(first: 10) { edges { node { id name } cursor } count } }"
    assert call(node, "POST", "/admin/gql", {"query": q}, alice)[1]["data"]["networks"] == {"edges": [], "count": 0}
    users = node.json("user", "ls")
    uid = next(u["uuid"] for u in users if u["email"] == "alice@example.com")
    call(node, "POST", "/folders", {"name": "sized", "host": "local"}, alice)
    fid = uuid.UUID(folder_id(node, "sized", alice)).hex
    root = call(node, "POST", "/config/get", {"key": "volumes/local/path"})[1]["result"]
    (Path(root) / fid / "data.bin").write_bytes(b"x" * 5000)  # (the host's directory: what kernels bind)
    q = (
        "query($h: String!, $q: String!) { quota_scope(storage_host_name: $h, quota_scope_id: $q) "
        "{ quota_scope_id details { usage_bytes usage_count hard_limit_bytes } } }"
    )
    status, answer = call(node, "POST", "/admin/gql", {"query": q, "variables": {"h": "local", "q": f"user:{uid}"}})
    details = answer["data"]["quota_scope"]["details"]
    assert status == 200 and details["usage_count"] >= 1 and details["usage_bytes"] >= 5000, answer
    mine = call(node, "POST", "/admin/gql", {"query": q, "variables": {"h": "local", "q": f"user:{uid}"}}, alice)
    assert mine[1]["data"]["quota_scope"]["quota_scope_id"] == f"user:{uid}"
    admin_uid = next(u["uuid"] for u in users if u["email"] != "alice@example.com")
    other = call(node, "POST", "/admin/gql", {"query": q, "variables": {"h": "local", "q": f"user:{admin_uid}"}}, alice)
    assert other[1]["data"]["quota_scope"] is None and "privilege" in other[1]["errors"][0]["message"]
    for scope in ("nobody", "user:", f"user:{uuid.uuid4()}", "domain:x"):
        answer = call(node, "POST", "/admin/gql", {"query": q, "variables": {"h": "local", "q": scope}})[1]
        assert answer["data"]["quota_scope"] is None and answer["errors"], scope


def test_a_share_names_its_user_by_the_uuid_the_user_list_prints(node: Node, alice: dict[str, str]) -> None:
    call(node, "POST", "/folders", {"name": "shared-by-uuid", "host": "local"}, alice)
    carol = node.json("keypair", "create", "--user", "carol@example.com")
    carol_uuid = next(u["uuid"] for u in node.json("user", "ls") if u["email"] == "carol@example.com")
    status, answer = call(
        node, "POST", "/folders/shared-by-uuid/share", {"permission": "ro", "emails": [carol_uuid]}, alice
    )
    assert status in (200, 201), answer
    assert call(node, "GET", "/folders/shared-by-uuid", keys=carol)[0] == 200
    fid = folder_id(node, "shared-by-uuid", alice)
    body = {"vfolder": fid, "user": carol_uuid.replace("-", ""), "perm": "rw"}
    assert call(node, "POST", "/folders/_/shared", body)[0] == 200
    assert call(node, "GET", "/folders/shared-by-uuid", keys=carol)[1]["permission"] == "rw"


def test_imagify_names_and_background_task_streams(node: Node) -> None:
    """(The commit itself needs a Docker kernel: tests/test_official_everyday.py runs `session convert-to-image`.)"""
    alice = node.json("keypair", "create", "--user", "dora@example.com")  # (a session of her own: one at a time)
    node.cli("session", "create", "--name", "to-image", "python", check=True, as_keypair=alice)
    for bad in ("", "UPPER", "a b", "x:y:z", "-lead", ":v1"):
        status, answer = call(node, "POST", f"/session/to-image/imagify?image_name={quote(bad)}", keys=alice)
        assert status == 400 and "image_name" in answer["msg"], (bad, answer)
    status, answer = call(node, "POST", "/session/to-image/imagify?image_name=mine", keys=alice)
    assert 400 <= status < 500 or status == 501, answer  # (a simulated kernel is no container: said at once)
    assert call(node, "POST", "/session/nobodys/imagify?image_name=mine", keys=alice)[0] == 404
    status, answer = call(node, "GET", f"/events/background-task?task_id={uuid.uuid4()}", keys=alice)
    assert status == 404 and answer["type"].endswith("/task-not-found")


def test_the_cli_freezes_unfreezes_and_announces(node: Node, alice: dict[str, str]) -> None:
    assert "frozen" in node.cli("cluster", "freeze", check=True).stdout
    try:
        out = node.cli("session", "create", "--name", "while-frozen", "python")
        assert out.returncode != 0 and "bai cluster unfreeze" in out.stderr, out.stderr
        assert call(node, "GET", "/bai/quota", keys=alice)[1]["frozen"] is True  # (what the dashboard's header says)
        refused = node.cli("cluster", "freeze", as_keypair=alice)
        assert refused.returncode != 0 and "admin" in refused.stderr.lower()
    finally:
        node.cli("cluster", "unfreeze", check=True)
    assert call(node, "GET", "/bai/quota", keys=alice)[1]["frozen"] is False
    node.cli("cluster", "announce", "back at 10", check=True)
    assert node.cli("cluster", "announce", check=True, as_keypair=alice).stdout.strip() == "back at 10"
    assert call(node, "GET", "/bai/quota", keys=alice)[1]["announcement"] == "back at 10"
    node.cli("cluster", "announce", "--off", check=True)
    assert call(node, "GET", "/bai/quota", keys=alice)[1]["announcement"] is None
    assert node.cli("cluster", "announce", "x", "--off").returncode == 2
