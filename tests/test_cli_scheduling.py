"""The multifactor policy from the CLI, on a real sim node: priorities and time limits on create, set-priority
(bounded by the policy for a user), what `session info` / `explain` say about a waiting session's score and
its reservation, and preemption (a batch session requeued, what the sessions on both sides show)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.nodeproc import Node, admin_keys, signed_request
from tests.test_official_client import Official, official_client26

CONFIG = '[scaling_groups.default]\npolicy = "multifactor"\npreemption = true\n'


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    node = Node(tmp_path_factory.mktemp("mf-cli"), "sim", extra_config=CONFIG, agent_config='cpu = "2"\n').start()
    yield node
    node.stop()


def test_priority_time_limit_set_priority_and_what_a_waiting_session_shows(node: Node) -> None:
    node.cli("session", "create", "sim", "--name", "cli-hold", "--cpu", "2", "--time-limit", "1h", check=True)
    held = node.json("session", "info", "cli-hold")
    assert held["timeLimit"] == 3600 and held["priority"] == 10
    node.cli(
        "session", "create", "sim", "--name", "cli-wait", "--cpu", "2", "--priority", "40", "--time-limit", "30m",
        "--detach", check=True,
    )  # fmt: skip
    node.cli("session", "create", "sim", "--name", "cli-later", "--cpu", "1", "--detach", check=True)
    waiting = node.json("session", "info", "cli-wait")
    assert waiting["priority"] == 40 and waiting["status"] == "PENDING"
    info = node.cli("session", "info", "cli-wait", check=True).stdout
    assert "Priority    40 (score" in info and "Reserved    starts by" in info, info
    explained = node.cli("session", "explain", "cli-wait", check=True).stdout
    assert "Reserved: starts by" in explained and "on " in explained, explained
    # (cli-later, one core for no known time, would delay it: it waits too)
    assert node.json("session", "info", "cli-later")["status"] == "PENDING"
    out = node.cli("session", "set-priority", "cli-later", "60", check=True).stdout
    assert out.strip() == "session cli-later now has priority 60"
    user = node.json("keypair", "create", "--user", "mf-user@example.com", "--policy", "capped")
    env = {"accessKey": user["accessKey"], "secretKey": user["secretKey"]}
    node.cli("session", "create", "sim", "--name", "cli-user", "--cpu", "1", "--detach", check=True, as_keypair=env)
    said = node.cli("session", "set-priority", "cli-user", "90", check=True, as_keypair=env).stdout
    assert said.strip() == "session cli-user now has priority 30 (your policy allows at most 30)"
    bad = node.cli("session", "set-priority", "cli-user", "101", as_keypair=env)
    assert bad.returncode == 2, bad
    bad = node.cli("session", "create", "sim", "--name", "cli-bad", "--time-limit", "soon", as_keypair=env)
    assert bad.returncode == 2 and "--time-limit" in bad.stderr, bad
    for name in ("cli-hold", "cli-wait", "cli-later"):
        node.cli("session", "destroy", name)
    node.cli("session", "destroy", "cli-user", as_keypair=env)


def test_preemption_from_the_cli(node: Node) -> None:
    node.cli("session", "create", "sim", "--name", "cli-optout", "--cpu", "1", "--priority", "1", "--not-preemptible",
             check=True)  # fmt: skip
    node.cli(
        "session", "create", "sim", "--name", "cli-batch", "--cpu", "1", "--priority", "1", "--type", "batch",
        "--startup-command", "sleep 3600", check=True,
    )  # fmt: skip
    assert "Preemptible no (" in node.cli("session", "info", "cli-optout", check=True).stdout
    node.cli("session", "create", "sim", "--name", "cli-vip", "--cpu", "1", "--priority", "70", check=True)
    assert node.json("session", "info", "cli-vip")["status"] == "RUNNING"
    info = node.json("session", "info", "cli-batch")
    assert info["status"] == "PENDING" and info["statusData"]["preemption"]["byName"] == "cli-vip", info
    shown = node.cli("session", "info", "cli-batch", check=True).stdout
    assert "Preempted" in shown and "by cli-vip (priority 70)" in shown and "requeued" in shown, shown
    assert "exited 130" in shown, shown  # its command was interrupted
    explained = node.cli("session", "explain", "cli-batch", check=True).stdout
    assert "PREEMPTED" in explained, explained
    assert node.json("session", "info", "cli-optout")["status"] == "RUNNING"
    for name in ("cli-optout", "cli-batch", "cli-vip"):
        node.cli("session", "destroy", name)


def test_scheduler_rounds_and_replay(node: Node) -> None:
    node.cli("session", "create", "sim", "--name", "cli-fill", "--cpu", "2", check=True)
    node.cli("session", "create", "sim", "--name", "cli-queued", "--cpu", "1", "--detach", check=True)
    number = node.json("session", "info", "cli-queued")["statusData"]["scheduler"]["round"]
    assert f"Round       {number} (`bai scheduler replay {number}`" in node.cli("session", "info", "cli-queued").stdout
    rounds = node.json("scheduler", "rounds", "-n", "3")
    assert rounds[0]["round"] >= number and all(r["digest"] for r in rounds)
    table = node.cli("scheduler", "rounds", check=True).stdout
    assert "ROUND" in table and "PREEMPTED" in table and str(number) in table, table
    out = node.cli("scheduler", "replay", str(number), check=True).stdout
    assert f"Round {number} at" in out and "Replayed: the same decisions again" in out, out
    assert "cli-queued: waited (" in out and "Changed in the cluster since:" in out, out
    replayed = node.json("scheduler", "replay", str(number))
    assert replayed["reproduced"] is True and replayed["round"] == number
    # superadmins only; bad input a clear 4xx; a round not kept a 404
    user = node.json("keypair", "create", "--user", "rounds-user@example.com")
    env = {"accessKey": user["accessKey"], "secretKey": user["secretKey"]}
    refused = node.cli("scheduler", "rounds", as_keypair=env)
    assert refused.returncode != 0 and "only superadmins" in refused.stderr, refused
    missing = node.cli("scheduler", "replay", "999999")
    assert missing.returncode != 0 and "not kept" in missing.stderr, missing
    keys = admin_keys(node)
    for bad in ("?limit=0", "?limit=x", "?before=-1", "?other=1", "/0", "/abc", "/99999999999999999999999"):
        status, _ = signed_request(node, "GET", f"/bai/scheduler/rounds{bad}", *keys)
        assert 400 <= status < 500, (bad, status)
    for name in ("cli-fill", "cli-queued"):
        node.cli("session", "destroy", name)


def test_the_official_client_reads_the_scheduling_history(node: Node, tmp_path: Path) -> None:
    """Backend.AI 26.x's `backend.ai scheduling-history session list`, unchanged, over what bai's rounds kept."""
    node.cli("session", "create", "sim", "--name", "hist-fill", "--cpu", "2", check=True)
    node.cli("session", "create", "sim", "--name", "hist-wait", "--cpu", "1", "--detach", check=True)
    fill, wait = (node.json("session", "info", name)["id"] for name in ("hist-fill", "hist-wait"))
    bac = Official(official_client26(), node, tmp_path)

    def listed(*args: str) -> list[dict]:
        out = bac("scheduling-history", "session", "list", "--json", *args)
        return json.loads(out[out.index("[") :])

    mine = [h for h in listed("--limit", "1000") if h["session_id"] in (fill, wait)]
    placed = [h for h in mine if h["session_id"] == fill]
    assert [(h["phase"], h["from_status"], h["to_status"], h["result"]) for h in placed] == [
        ("schedule", "PENDING", "SCHEDULED", "SUCCESS")
    ], mine
    assert placed[0]["message"].startswith("placed on ") and placed[0]["attempts"] == 1
    (waiting,) = [h for h in mine if h["session_id"] == wait]
    assert waiting["result"] == "FAILURE" and waiting["error_code"] == "no-available-instances", waiting
    assert "no agent has room" in waiting["message"] and waiting["to_status"] == "PENDING", waiting
    # the client's filters, as the server applies them
    assert [h["session_id"] for h in listed("--session-id", wait)] == [wait]
    assert {h["session_id"] for h in listed("--result", "SUCCESS", "--limit", "1000")} >= {fill}
    assert wait not in {h["session_id"] for h in listed("--result", "SUCCESS", "--limit", "1000")}
    assert wait in {h["session_id"] for h in listed("--error-code", "available-inst", "--limit", "1000")}
    assert all(h["to_status"] == "SCHEDULED" for h in listed("--to-status", "SCHEDULED"))
    assert len(listed("--limit", "1")) == 1
    table = bac("scheduling-history", "session", "list", "--session-id", wait)
    assert wait in table and "no-available-instances" in table and "Traceback" not in table, table
    # superadmins only; every malformed search a clear 4xx
    user = node.json("keypair", "create", "--user", "history-user@example.com")
    status, _ = signed_request(node, "POST", "/scheduling-history/sessions/search", user["accessKey"],
                               user["secretKey"], body={})  # fmt: skip
    assert status == 403, status
    keys = admin_keys(node)
    for bad in (
        [], {"limit": 0}, {"limit": "5"}, {"limit": 1001}, {"offset": -1}, {"other": 1},
        {"filter": {"result": ["MAYBE"]}}, {"filter": {"session_id": {"equals": "nope"}}},
        {"filter": {"message": {"regex": "x"}}}, {"filter": {"message": {"contains": 5}}},
        {"order": [{"field": "name"}]}, {"order": [{"field": "created_at", "direction": "up"}]}, {"order": "x"},
    ):  # fmt: skip
        status, answer = signed_request(node, "POST", "/scheduling-history/sessions/search", *keys, body=bad)
        assert status == 400, (bad, status, answer)
    for name in ("hist-fill", "hist-wait"):
        node.cli("session", "destroy", name)


def test_fair_share_standings_from_the_cli(node: Node) -> None:
    """`bai scheduler fair-share`: usage charged while sessions hold slots, the factor it gives, who sees what."""
    admin = admin_keys(node)[0]
    node.cli("session", "create", "sim", "--name", "fs-hold", "--cpu", "2", check=True)
    time.sleep(1.5)  # (held for a while: the next round charges it)
    node.cli("session", "create", "sim", "--name", "fs-wait", "--cpu", "1", "--detach", check=True)
    answer = node.json("scheduler", "fair-share")
    (mine,) = [r for r in answer["keypairs"] if r["accessKey"] == admin]
    assert mine["usage"] >= 2.0 * 1.0, mine  # two cores for over a second (GPU-weighted slot-seconds)
    assert 0 < mine["factor"] < 1 and mine["waiting"] >= 1 and 0 < mine["part"] <= 1, mine
    assert abs(sum(r["part"] for r in answer["keypairs"]) - 1) < 1e-9
    assert answer["compared"]["keypairs"] == len(answer["keypairs"]) and answer["halfLifeSeconds"] == 7 * 86400
    (project,) = [p for p in answer["projects"] if p["name"] == "default"]
    assert project["usage"] >= mine["usage"] * 0.99, project  # (the admin's sessions are the default project's)
    table = node.cli("scheduler", "fair-share", check=True).stdout
    assert "ACCESS KEY" in table and admin in table and "halving every 7 days" in table, table
    # a user who waits too is compared, and sees its own keypair only; a parameter is a 400
    user = node.json("keypair", "create", "--user", "fs-user@example.com")
    env = {"accessKey": user["accessKey"], "secretKey": user["secretKey"]}
    node.cli("session", "create", "sim", "--name", "fs-user-wait", "--cpu", "1", "--detach", check=True,
             as_keypair=env)  # fmt: skip
    seen = node.json("scheduler", "fair-share", as_keypair=env)
    assert [(r["accessKey"], r["user"], r["usage"], r["factor"], r["waiting"]) for r in seen["keypairs"]] == [
        (user["accessKey"], "fs-user@example.com", 0.0, 1.0, 1)
    ], seen
    assert seen["compared"]["keypairs"] == answer["compared"]["keypairs"] + 1, seen  # (the others, unseen)
    status, _ = signed_request(node, "GET", "/bai/scheduler/fair-share?x=1", *admin_keys(node))
    assert status == 400
    node.cli("session", "destroy", "fs-user-wait", as_keypair=env)
    for name in ("fs-hold", "fs-wait"):
        node.cli("session", "destroy", name)


@pytest.fixture(scope="module", autouse=True)
def capped_policy(node: Node) -> None:
    node.cli("policy", "create", "capped", "--max-priority", "30", check=True)
