"""Teams (issue 31), tried as an attacker with an ordinary keypair would: domains hold projects and users; a user of
project A cannot see, reach, mount, start into or account against project B by id, name, GraphQL or REST; a domain
admin manages its domain only; a project's cap holds its sessions back with the reason said; scaling groups are
usable only where associated; deactivating a user stops its keypairs at once. One sim node with fake GPUs."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.nodeproc import ROOT, Node, admin_keys, signed_request

pytestmark = pytest.mark.xdist_group("teams")  # (one node for the module: its tests build on each other's teams)
FAKE_NVML = ROOT / "tests" / "fake_nvml"
GPUS = [{"uuid": f"GPU-{i}", "name": "Fake H200", "memory": 141 << 30, "util": 0, "used": 0} for i in range(4)]
PASSWORD = "correct horse battery"


class Caller:
    """Signed requests as one keypair."""

    def __init__(self, node: Node, access_key: str, secret_key: str) -> None:
        self.node, self.access_key, self.secret_key = node, access_key, secret_key

    def __call__(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return signed_request(self.node, method, path, self.access_key, self.secret_key, body=body)

    def ok(self, method: str, path: str, body: Any = None) -> Any:
        status, answer = self(method, path, body)
        assert status < 300, (method, path, status, answer)
        return answer

    def gql(self, query: str, **variables: Any) -> Any:
        status, answer = self("POST", "/admin/gql", {"query": query, "variables": variables})
        assert status == 200, answer
        return answer


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    node = Node(tmp_path_factory.mktemp("teams"), "sim", agent_config='cpu = "32"\nmem = "64g"\n')
    node.env["PYTHONPATH"] = os.pathsep.join([str(FAKE_NVML), node.env.get("PYTHONPATH", "")])
    node.env["BAI_FAKE_NVML"] = json.dumps(GPUS)
    node.start()
    yield node
    node.stop()


@pytest.fixture(scope="module")
def team(node: Node) -> dict[str, Any]:
    """Two domains: acme (projects ml-team, capped at 2 GPUs, and other) and rival (rival-p); alice in ml-team, carol
    in ml-team, bob in other, dana admin of acme, rita admin of rival; a keypair each."""
    admin = Caller(node, *admin_keys(node))
    admin.ok("POST", "/bai/domains", {"name": "acme"})
    admin.ok("POST", "/bai/domains", {"name": "rival"})
    ml = admin.ok(
        "POST", "/bai/projects", {"name": "ml-team", "domain": "acme", "total_resource_slots": {"cuda.device": 2}}
    )
    other = admin.ok("POST", "/bai/projects", {"name": "other", "domain": "acme"})
    rival = admin.ok("POST", "/bai/projects", {"name": "rival-p", "domain": "rival"})
    people = {
        "alice": ("acme", ["ml-team"], "user"),
        "carol": ("acme", ["ml-team"], "user"),
        "bob": ("acme", ["other"], "user"),
        "dana": ("acme", [], "admin"),
        "rita": ("rival", ["rival-p"], "admin"),
    }
    callers = {"admin": admin}
    for name, (domain, projects, role) in people.items():
        email = f"{name}@{domain}.example"
        body = {"email": email, "password": PASSWORD, "domain": domain, "projects": projects, "role": role}
        made = admin.ok("POST", "/bai/users", body)
        assert made["projects"] == projects and made["role"] == role and "password" not in json.dumps(made)
        keys = node.json("keypair", "create", "--user", email)
        callers[name] = Caller(node, keys["accessKey"], keys["secretKey"])
    return {"callers": callers, "ml": ml, "other": other, "rival": rival}


def _session(caller: Caller, name: str, **more: Any) -> tuple[int, Any]:
    body = {"name": name, "image": "sim", "enqueueOnly": True, "config": {"resources": {"cpu": 1}}, **more}
    return caller("POST", "/session", body)


def test_a_user_creates_sessions_only_in_its_own_projects(team: dict[str, Any]) -> None:
    alice, bob = team["callers"]["alice"], team["callers"]["bob"]
    status, made = _session(alice, "in-ml", group="ml-team")
    assert status == 201, made
    info = alice.ok("GET", "/session/in-ml")
    assert (info["project"], info["domain"], info["projectId"]) == ("ml-team", "acme", team["ml"]["id"])
    # by name, by id, in another domain, or a project that does not exist: the same answer (nothing is learnt)
    answers = [
        _session(alice, "cross-1", group="other"),
        _session(alice, "cross-2", group=team["other"]["id"]),
        _session(alice, "cross-3", group="rival-p", domain="rival"),
        _session(alice, "cross-4", group=team["rival"]["id"]),
        _session(alice, "cross-5", group="no-such-project"),
    ]
    assert [s for s, _ in answers[:2] + answers[3:]] == [404, 404, 404, 404], answers
    assert answers[2][0] == 403 and "you belong to domain acme" in answers[2][1]["msg"]
    assert all("other" not in a["msg"] or "no project" in a["msg"] for _, a in answers)
    # a user of one project (bob: other) creates there by default; alice's only project is her default
    status, made = _session(bob, "in-other")
    assert status == 201, made
    assert bob.ok("GET", "/session/in-other")["project"] == "other"
    assert alice.ok("GET", "/session/in-ml")["status"] in ("PENDING", "SCHEDULED", "PREPARING", "RUNNING")
    # bob sees none of alice's sessions, by list, by name or by id
    assert "in-ml" not in [s["name"] for s in bob.ok("GET", "/session")["items"]]
    assert bob("GET", "/session/in-ml")[0] == 404
    assert bob("GET", f"/session/{alice.ok('GET', '/session/in-ml')['id']}")[0] == 404


def test_projects_domains_and_users_are_seen_only_where_allowed(team: dict[str, Any]) -> None:
    c = team["callers"]
    alice, dana, rita = c["alice"], c["dana"], c["rita"]
    assert [p["name"] for p in alice.ok("GET", "/bai/projects")["items"]] == ["ml-team"]
    assert alice("GET", "/bai/projects/other")[0] == 404
    assert alice("GET", f"/bai/projects/{team['rival']['id']}")[0] == 404
    assert [u["email"] for u in alice.ok("GET", "/bai/users")["items"]] == ["alice@acme.example"]  # herself
    assert alice("GET", "/bai/users/bob@acme.example")[0] == 404
    assert [d["name"] for d in alice.ok("GET", "/bai/domains")["items"]] == ["acme"]
    # GraphQL: the same answers
    data = alice.gql(
        "query($b: UUID!, $r: UUID!) { groups { name } b: group(id: $b) { name } r: group(id: $r) { name } "
        'domains { name } user(email: "bob@acme.example") { email } me: user { email groups { name } } }',
        b=team["other"]["id"],
        r=team["rival"]["id"],
    )["data"]
    assert data == {
        "groups": [{"name": "ml-team"}],
        "b": None,
        "r": None,
        "domains": [{"name": "acme"}],
        "user": None,
        "me": {"email": "alice@acme.example", "groups": [{"name": "ml-team"}]},
    }
    denied = alice.gql("{ user_list { items { email } total_count } }")
    assert denied["data"]["user_list"] is None and "insufficient privilege" in denied["errors"][0]["message"]
    # a domain admin sees its domain's users and projects, never another domain's
    emails = [u["email"] for u in dana.ok("GET", "/bai/users")["items"]]
    assert emails == sorted(f"{n}@acme.example" for n in ("alice", "bob", "carol", "dana"))
    assert {p["name"] for p in dana.ok("GET", "/bai/projects")["items"]} == {"ml-team", "other"}
    assert dana("GET", "/bai/users/rita@rival.example")[0] == 404
    assert dana("GET", "/bai/projects/rival-p?domain=rival")[0] == 404
    listed = dana.gql("{ user_list(limit: 100) { items { email domain_name } total_count } }")["data"]["user_list"]
    assert {u["domain_name"] for u in listed["items"]} == {"acme"} and listed["total_count"] == 4
    assert [u["email"] for u in rita.ok("GET", "/bai/users")["items"]] == ["rita@rival.example"]


def test_a_domain_admin_manages_its_domain_only(team: dict[str, Any]) -> None:
    c = team["callers"]
    dana = c["dana"]
    made = dana.ok("POST", "/bai/users", {"email": "erin@acme.example", "password": PASSWORD, "projects": ["other"]})
    assert made["domain"] == "acme" and made["projects"] == ["other"]
    dana.ok("POST", "/bai/projects/other/members", {"add": ["erin@acme.example"], "remove": []})
    status, answer = dana("POST", "/bai/users", {"email": "x@rival.example", "password": PASSWORD, "domain": "rival"})
    assert status == 404, answer
    status, answer = dana(
        "POST", "/bai/users", {"email": "boss@acme.example", "password": PASSWORD, "role": "superadmin"}
    )
    assert status == 403 and "superadmin" in answer["msg"]
    status, answer = dana("POST", "/bai/projects", {"name": "sneaky", "domain": "rival"})
    assert status == 404, answer
    assert dana("PATCH", "/bai/users/rita@rival.example", {"full_name": "x"})[0] == 404
    assert dana("POST", "/bai/domains", {"name": "mine"})[0] == 403
    # and cannot touch a superadmin, even of its own domain's default
    assert dana("PATCH", "/bai/users/admin", {"full_name": "x"})[0] in (403, 404)
    # its domain's sessions: named with owner_access_key (Backend.AI's), listed, ended; never another domain's
    alice, rita, bob = c["alice"], c["rita"], c["bob"]
    status, answer = _session(alice, "watched", group="ml-team")
    assert status == 201, answer
    mine = dana.ok("GET", f"/session?owner_access_key={alice.access_key}")["items"]
    assert "watched" in [s["name"] for s in mine]
    assert dana.ok("GET", f"/session/watched?owner_access_key={alice.access_key}")["project"] == "ml-team"
    dana.ok("DELETE", f"/session/watched?owner_access_key={alice.access_key}&forced=true")
    assert alice.ok("GET", "/session/watched")["status"] in ("TERMINATING", "TERMINATED", "CANCELLED")
    assert _session(rita, "rivals")[0] == 201
    query = "{ compute_session_list(limit: 100) { items { name domain_name group_name } total_count } }"
    listed = dana.gql(query)["data"]["compute_session_list"]["items"]
    assert {"in-ml", "in-other"} <= {s["name"] for s in listed} and "rivals" not in {s["name"] for s in listed}
    assert {s["domain_name"] for s in listed} == {"acme"}
    assert {s["name"]: s["group_name"] for s in listed}["in-other"] == "other"
    assert [s["name"] for s in alice.gql(query)["data"]["compute_session_list"]["items"]] == ["in-ml"]
    status, answer = dana("GET", f"/session?owner_access_key={rita.access_key}")
    assert status == 403 and "only admins" in answer["msg"], answer
    assert dana("GET", f"/session?owner_access_key={c['admin'].access_key}")[0] == 403  # (a superadmin's)
    assert bob("GET", f"/session?owner_access_key={alice.access_key}")[0] == 403
    # a name is its owner's, whichever project: get-or-create does not hand back a session of another project
    assert _session(dana, "twice", group="ml-team")[0] == 201
    status, answer = _session(dana, "twice", group="other")
    assert status == 400 and "another project" in answer["msg"] and answer["type"].endswith("session-already-exists")
    assert _session(dana, "twice", group="ml-team")[0] == 200  # (the same project: the live session, reused)
    assert dana("GET", "/bai/users?status=bogus")[0] == 400 and dana("GET", "/bai/users?domain=rival")[0] == 404
    # users change nothing of teams
    assert alice("POST", "/bai/projects", {"name": "mine", "domain": "acme"})[0] == 403
    assert alice("POST", "/bai/projects/ml-team/members", {"add": ["bob@acme.example"]})[0] == 403
    assert alice("PATCH", "/bai/users/alice@acme.example", {"role": "admin"})[0] == 403
    out = alice.gql(
        'mutation { create_group(name: "g", props: {domain_name: "acme"}) { ok msg } '
        'modify_user(email: "alice@acme.example", props: {role: "superadmin"}) { ok msg } }'
    )["data"]
    assert out["create_group"]["ok"] is False and out["modify_user"]["ok"] is False


def test_project_folders_are_mounted_by_members_only(team: dict[str, Any]) -> None:
    c = team["callers"]
    alice, carol, bob = c["alice"], c["carol"], c["bob"]
    made = alice.ok("POST", "/folders", {"name": "ml-data", "group": "ml-team"})
    assert made["ownership_type"] == "group" and made["group_name"] == "ml-team"
    assert bob("POST", "/folders", {"name": "sneak", "group": "ml-team"})[0] == 404
    assert bob("POST", "/folders", {"name": "sneak", "group": team["ml"]["id"]})[0] == 404
    assert "ml-data" in [f["name"] for f in carol.ok("GET", "/folders")]
    assert "ml-data" not in [f["name"] for f in bob.ok("GET", "/folders")]
    assert bob("GET", "/folders/ml-data")[0] == 404
    assert bob("GET", f"/folders/{made['id']}/files")[0] == 404
    status, answer = _session(carol, "mounts-ml", config={"resources": {"cpu": 1}, "mounts": ["ml-data"]})
    assert status == 201, answer
    status, answer = _session(bob, "mounts-ml", config={"resources": {"cpu": 1}, "mounts": ["ml-data"]})
    assert status == 404, answer
    status, answer = _session(bob, "mounts-ml-id", config={"resources": {"cpu": 1}, "mounts": [made["id"]]})
    assert status == 404, answer
    # GraphQL: members see it among their project's folders; others do not
    query = "{ vfolder_project_list { items { name group_name ownership_type } } }"
    assert alice.gql(query)["data"]["vfolder_project_list"]["items"] == [
        {"name": "ml-data", "group_name": "ml-team", "ownership_type": "group"}
    ]
    assert bob.gql(query)["data"]["vfolder_project_list"]["items"] == []
    # a member may not delete the project's folder (its managers may)
    assert carol("DELETE", "/folders/ml-data")[0] == 403
    everything = c["admin"].gql("{ vfolder_list(limit: 100) { items { name } } }")["data"]["vfolder_list"]["items"]
    assert "ml-data" in [f["name"] for f in everything]  # a superadmin's list has every user's and project's


def test_a_project_cap_holds_sessions_back_and_says_why(team: dict[str, Any]) -> None:
    alice, carol = team["callers"]["alice"], team["callers"]["carol"]
    for caller, name in ((alice, "gpu-a"), (carol, "gpu-b")):
        status, answer = _session(caller, name, config={"resources": {"cpu": 1, "cuda.device": 1}})
        assert status == 201, answer
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if all(c.ok("GET", f"/session/{n}")["status"] == "RUNNING" for c, n in ((alice, "gpu-a"), (carol, "gpu-b"))):
            break
        time.sleep(0.2)
    status, answer = _session(alice, "gpu-c", config={"resources": {"cpu": 1, "cuda.device": 1}})
    assert status == 201, answer
    deadline = time.monotonic() + 20
    info = alice.ok("GET", "/session/gpu-c")
    while time.monotonic() < deadline and "project ml-team" not in json.dumps(info["statusData"]):
        time.sleep(0.2)
        info = alice.ok("GET", "/session/gpu-c")
    assert info["status"] == "PENDING", info
    failed = info["statusData"]["scheduler"]["failed_predicates"]
    assert {"name": "user_group_resource_limit", "msg": "project ml-team has 2/2 GPUs (asks 1 more)"} in failed
    # the other project is not held back by ml-team's cap (2 GPUs are free)
    status, answer = _session(team["callers"]["bob"], "gpu-other", config={"resources": {"cpu": 1, "cuda.device": 1}})
    assert status == 201, answer
    usage = {p["name"]: p for p in alice.ok("GET", "/bai/projects")["items"]}["ml-team"]
    assert usage["cap"] == {"cuda.device": "2"} and usage["occupied"]["cuda.device"] == "2"
    alice.ok("DELETE", "/session/gpu-a")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and alice.ok("GET", "/session/gpu-c")["status"] == "PENDING":
        time.sleep(0.2)
    assert alice.ok("GET", "/session/gpu-c")["status"] != "PENDING"  # room in the project again


def test_scaling_groups_are_usable_only_where_associated(team: dict[str, Any]) -> None:
    c = team["callers"]
    admin, alice, rita = c["admin"], c["alice"], c["rita"]
    assert alice.ok("GET", "/scaling-groups?group=ml-team") == {"scaling_groups": [{"name": "default"}]}
    admin.ok("POST", "/bai/scaling-groups/default/associations", {"domain": "rival"})
    try:
        assert alice.ok("GET", "/scaling-groups?group=ml-team") == {"scaling_groups": []}
        assert rita.ok("GET", "/scaling-groups?group=rival-p") == {"scaling_groups": [{"name": "default"}]}
        status, answer = _session(alice, "no-group")
        assert status == 403 and "scaling group default is not open to project ml-team" in answer["msg"], answer
        assert alice("GET", "/scaling-groups?group=rival-p")[0] == 404  # another domain's project: as if none
        admin.ok("POST", "/bai/scaling-groups/default/associations", {"project": team["ml"]["id"]})
        assert alice.ok("GET", "/scaling-groups?group=ml-team") == {"scaling_groups": [{"name": "default"}]}
        status, answer = _session(alice, "now-open")
        assert status == 201, answer
        assert alice("POST", "/bai/scaling-groups/default/associations", {"keypair": alice.access_key})[0] == 403
    finally:
        for target in ({"domain": "rival"}, {"project": team["ml"]["id"]}):
            admin.ok("POST", "/bai/scaling-groups/default/associations", {**target, "remove": True})
    assert bool(admin.ok("GET", "/bai/scaling-groups")["items"][0]["open"]) is True


def test_deactivating_a_user_stops_its_keypairs_at_once(node: Node, team: dict[str, Any]) -> None:
    admin = team["callers"]["admin"]
    admin.ok("POST", "/bai/users", {"email": "gone@acme.example", "password": PASSWORD, "domain": "acme"})
    keys = node.json("keypair", "create", "--user", "gone@acme.example")
    gone = Caller(node, keys["accessKey"], keys["secretKey"])
    assert gone("GET", "/session")[0] == 200
    env = {**node.env, "BACKEND_ENDPOINT": node.endpoint, "BACKEND_ACCESS_KEY": keys["accessKey"],
           "BACKEND_SECRET_KEY": keys["secretKey"]}  # fmt: skip
    stream = subprocess.Popen([sys.executable, "-m", "bai", "session", "events", "-f"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        time.sleep(1.5)  # connected, following
        assert stream.poll() is None
        admin.ok("PATCH", "/bai/users/gone@acme.example", {"is_active": False})
        assert gone("GET", "/session")[0] == 401
        stream.wait(5)  # its open stream closed at once, as a deactivated keypair's
    finally:
        stream.kill()
        stream.wait()
    admin.ok("PATCH", "/bai/users/gone@acme.example", {"is_active": True})
    assert gone("GET", "/session")[0] == 200
    # a deactivated domain stops every keypair of its users
    admin.ok("POST", "/bai/domains", {"name": "shortlived"})
    admin.ok("POST", "/bai/users", {"email": "temp@short.example", "password": PASSWORD, "domain": "shortlived"})
    keys = node.json("keypair", "create", "--user", "temp@short.example")
    temp = Caller(node, keys["accessKey"], keys["secretKey"])
    assert temp("GET", "/session")[0] == 200
    admin.ok("DELETE", "/bai/domains/shortlived")
    assert temp("GET", "/session")[0] == 401
    # Backend.AI's delete: the user's status says deleted, and it signs nothing more
    deleted = admin.ok("DELETE", "/bai/users/gone@acme.example")
    assert deleted["status"] == "deleted" and gone("GET", "/session")[0] == 401


def test_bad_team_input_is_a_clear_4xx_and_changes_nothing(team: dict[str, Any]) -> None:
    admin = team["callers"]["admin"]
    before = admin.ok("GET", "/bai/users")["items"]
    cases = [
        ("POST", "/bai/users", {"email": "not-an-email", "password": PASSWORD}, "email"),
        ("POST", "/bai/users", {"email": "short@acme.example", "password": "short"}, "password"),
        ("POST", "/bai/users", {"email": "x@acme.example", "password": PASSWORD, "role": "god"}, "role"),
        ("POST", "/bai/users", {"email": "x@acme.example", "password": PASSWORD, "projects": ["nope"]}, "no project"),
        ("POST", "/bai/users", {"email": "alice@acme.example", "password": PASSWORD, "domain": "acme"}, "exists"),
        ("POST", "/bai/projects", {"name": "../x", "domain": "acme"}, "name"),
        ("POST", "/bai/projects", {"name": "ml-team", "domain": "acme"}, "has a project"),
        ("POST", "/bai/projects", {"name": "p", "domain": "acme", "total_resource_slots": {"cpu": "lots"}}, "cpu"),
        ("PATCH", "/bai/projects/ml-team?domain=acme", {"total_resource_slots": [1]}, "slot amounts"),
        ("POST", "/bai/domains", {"name": "acme"}, "exists"),
        ("DELETE", "/bai/domains/acme?purge=true", None, "still has"),
    ]
    for method, path, body, says in cases:
        status, answer = admin(method, path, body)
        assert 400 <= status < 500 and says in answer["msg"], (method, path, body, status, answer)
    assert admin.ok("GET", "/bai/users")["items"] == before
    assert "password" not in json.dumps(admin.ok("GET", "/bai/users"))


def test_a_database_of_keypairs_only_gets_a_user_for_each_and_loses_nothing(tmp_path: Path) -> None:
    """A database at schema 15 (keypairs, no users): schema 16 makes each keypair's user id a user of the default
    domain and project, a superadmin for an admin keypair; sessions and folders land in the default project."""
    import asyncio

    from bai.node.manager.state import Store
    from bai.node.manager.state.team_records import DEFAULT_PROJECT_ID, user_uuid

    path = tmp_path / "bai.db"

    async def make() -> None:
        store = await Store.open(path)
        await store.close()

    asyncio.run(make())
    db = sqlite3.connect(path)
    for table in ("domains", "projects", "users", "project_members", "scaling_groups", "scaling_group_links",
                  "user_resource_policies", "project_resource_policies"):  # fmt: skip
        db.execute(f"DROP TABLE {table}")
    db.execute("DROP INDEX sessions_project_status")
    db.execute("DROP INDEX keypairs_user")
    for table, column in (("keypairs", "user_uuid"), ("sessions", "domain_name"), ("sessions", "project_id"),
                          ("vfolders", "project_id")):  # fmt: skip
        db.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    rows = [("AKADMIN", "s0", "admin", 1), ("AKALICE1", "s1", "alice", 0), ("AKALICE2", "s2", "alice", 0),
            ("AKBOB", "s3", "bob@example.com", 0), ("AKTWIN", "s4", "bob", 0)]  # fmt: skip
    for ak, sk, user, admin in rows:
        db.execute(
            "INSERT INTO keypairs(access_key, secret_key, user_id, is_admin, created_at) VALUES (?, ?, ?, ?, ?)",
            (ak, sk, user, admin, f"2026-01-0{len(ak) % 9 + 1}T00:00:00+00:00"),
        )
    db.execute(
        "INSERT INTO sessions(id, name, access_key, image, type, status, status_changed, requested_slots, created_at, "
        "seq) VALUES ('s1', 'old', 'AKALICE1', 'python', 'INTERACTIVE', 'TERMINATED', 'x', '{}', 'x', 1)"
    )
    db.execute("PRAGMA user_version = 15")
    db.commit()
    db.close()

    async def upgraded() -> Any:
        store = await Store.open(path)
        try:
            return (
                store.teams(),
                {k: v.user_uuid for k, v in (await store.keypairs(False)).items()},
                await store.get_session("s1"),
            )
        finally:
            await store.close()

    teams, keys, session = asyncio.run(upgraded())
    users = {u.username: u for u in teams.users.values()}
    assert sorted(users) == ["admin", "alice", "bob", "bob@example.com"]
    assert users["admin"].role == "superadmin" and users["alice"].role == "user"
    assert users["alice"].uuid == user_uuid("alice")  # the id GraphQL showed for it before
    assert users["bob@example.com"].email == "bob@example.com" and users["bob"].email == "bob@bai.local"
    assert keys == {
        "AKADMIN": users["admin"].uuid,
        "AKALICE1": users["alice"].uuid,
        "AKALICE2": users["alice"].uuid,
        "AKBOB": users["bob@example.com"].uuid,
        "AKTWIN": users["bob"].uuid,
    }
    assert teams.members[DEFAULT_PROJECT_ID] == frozenset(u.uuid for u in users.values())
    assert session is not None and session.project_id == DEFAULT_PROJECT_ID and session.domain_name == "default"
    assert uuid.UUID(DEFAULT_PROJECT_ID)


def test_a_user_gets_its_keypair_with_its_password_and_changes_it(node: Node, team: dict[str, Any]) -> None:
    alice = team["callers"]["alice"]
    import http.client
    from urllib.parse import urlsplit

    def authorize(body: Any) -> tuple[int, Any]:
        conn = http.client.HTTPConnection(urlsplit(node.endpoint).netloc, timeout=30)
        conn.request("POST", "/auth/authorize", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"null")

    status, answer = authorize(
        {"type": "keypair", "domain": "acme", "username": "alice@acme.example", "password": PASSWORD}
    )
    assert status == 200 and answer["data"]["access_key"] == alice.access_key and answer["data"]["role"] == "user"
    assert answer["data"]["secret_key"] == alice.secret_key
    wrong = [
        {"type": "keypair", "domain": "acme", "username": "alice@acme.example", "password": "not it at all"},
        {"type": "keypair", "domain": "rival", "username": "alice@acme.example", "password": PASSWORD},
        {"type": "keypair", "domain": "acme", "username": "nobody@acme.example", "password": PASSWORD},
        {"type": "keypair", "username": ["x"], "password": {"a": 1}},
    ]
    for body in wrong:  # one answer for every way it is wrong
        status, answer = authorize(body)
        assert status == 401 and answer["msg"] == "wrong username or password", (body, answer)
    new = "another long password"
    status, answer = alice(
        "POST", "/auth/update-password", {"old_password": "wrong", "new_password": new, "new_password2": new}
    )
    assert status == 401
    status, answer = alice(
        "POST", "/auth/update-password", {"old_password": PASSWORD, "new_password": new, "new_password2": "x"}
    )
    assert status == 400 and "differ" in answer["msg"]
    alice.ok("POST", "/auth/update-password", {"old_password": PASSWORD, "new_password": new, "new_password2": new})
    assert authorize({"username": "alice@acme.example", "password": PASSWORD})[0] == 401
    assert authorize({"username": "alice@acme.example", "password": new})[0] == 200
    alice.ok(
        "POST", "/auth/update-password", {"old_password": new, "new_password": PASSWORD, "new_password2": PASSWORD}
    )


def test_a_user_resource_policy_bounds_a_users_folders(team: dict[str, Any]) -> None:
    admin, bob = team["callers"]["admin"], team["callers"]["bob"]
    made = admin.gql(
        'mutation { create_user_resource_policy(name: "one-folder", props: {max_vfolder_count: 1}) '
        "{ ok msg resource_policy { name max_vfolder_count } } }"
    )["data"]["create_user_resource_policy"]
    assert made == {"ok": True, "msg": "success", "resource_policy": {"name": "one-folder", "max_vfolder_count": 1}}
    admin.ok("PATCH", "/bai/users/bob@acme.example", {"resource_policy": "one-folder"})
    try:
        bob.ok("POST", "/folders", {"name": "bobs-first"})
        status, answer = bob("POST", "/folders", {"name": "bobs-second"})
        assert status == 412 and "user resource policy one-folder allows 1 folders" in answer["msg"], answer
        in_use = admin.gql('mutation { delete_user_resource_policy(name: "one-folder") { ok msg } }')
        assert in_use["data"]["delete_user_resource_policy"]["ok"] is False  # (a user follows it)
    finally:
        admin.ok("PATCH", "/bai/users/bob@acme.example", {"resource_policy": "default"})
    assert bob("POST", "/folders", {"name": "bobs-second"})[0] == 201


def test_a_domain_cap_holds_its_projects_sessions_back_together(node: Node, team: dict[str, Any]) -> None:
    admin = team["callers"]["admin"]
    admin.ok("POST", "/bai/domains", {"name": "capped", "total_resource_slots": {"cpu": 1}})
    for name in ("cap-a", "cap-b"):
        admin.ok("POST", "/bai/projects", {"name": name, "domain": "capped"})
    admin.ok("POST", "/bai/users", {"email": "cap@capped.example", "password": PASSWORD, "domain": "capped",
                                    "projects": ["cap-a", "cap-b"]})  # fmt: skip
    keys = node.json("keypair", "create", "--user", "cap@capped.example")
    user = Caller(node, keys["accessKey"], keys["secretKey"])
    assert _session(user, "first", group="cap-a")[0] == 201
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and user.ok("GET", "/session/first")["status"] != "RUNNING":
        time.sleep(0.2)
    assert _session(user, "second", group="cap-b")[0] == 201  # another project, the same domain
    deadline = time.monotonic() + 20
    info = user.ok("GET", "/session/second")
    while time.monotonic() < deadline and "domain capped" not in json.dumps(info["statusData"]):
        time.sleep(0.2)
        info = user.ok("GET", "/session/second")
    assert info["status"] == "PENDING"
    failed = info["statusData"]["scheduler"]["failed_predicates"]
    assert {"name": "domain_resource_limit", "msg": "domain capped has 1/1 CPU cores (asks 1 more)"} in failed
    user.ok("DELETE", "/session/first?forced=true")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and user.ok("GET", "/session/second")["status"] == "PENDING":
        time.sleep(0.2)
    assert user.ok("GET", "/session/second")["status"] != "PENDING"
    user.ok("DELETE", "/session/second?forced=true")
