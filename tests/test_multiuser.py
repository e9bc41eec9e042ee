"""Many users on one node: admins act on anyone's sessions (by id, or by name with owner_access_key),
users only on their own; a deactivated keypair's open streams close at once; only HMAC-SHA256
signatures count; a node listening beyond loopback without TLS says so. Real Docker kernels."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.nodeproc import Node, admin_keys, signed_request


def user_keypair(node: Node, name: str) -> dict[str, str]:
    return node.json("keypair", "create", "--user", name)


def signed_get(node: Node, path: str, access_key: str, secret_key: str, method: str = "HMAC-SHA256"):
    return signed_request(node, "GET", path, access_key, secret_key, sign_method=method)


def test_admins_act_on_other_keypairs_sessions_by_id_or_with_owner(docker_node: Node) -> None:
    alice = user_keypair(docker_node, "alice")
    bob = user_keypair(docker_node, "bob")
    docker_node.cli("session", "create", "--name", "alices", "python", check=True, as_keypair=alice)
    session = docker_node.json("session", "info", "alices", as_keypair=alice)
    sid = session["id"]

    # the admin's own namespace of names does not contain alice's session...
    by_name = docker_node.cli("session", "info", "alices")
    assert by_name.returncode != 0 and "does not exist" in by_name.stderr
    # ...but the admin reaches it by id, and by name with --owner (owner_access_key)
    assert docker_node.json("session", "info", sid)["name"] == "alices"
    assert docker_node.json("session", "info", "alices", "--owner", alice["accessKey"])["id"] == sid
    listed = docker_node.json("session", "ls", "--owner", alice["accessKey"])
    assert [s["name"] for s in listed] == ["alices"]
    out = docker_node.cli("session", "exec", sid, "-c", "import os; print(os.environ['BACKENDAI_SESSION_NAME'])")
    assert out.returncode == 0 and out.stdout.strip() == "alices", out.stderr

    # another user reaches it neither by id nor by naming alice as the owner
    assert docker_node.cli("session", "info", sid, as_keypair=bob).returncode != 0
    denied = docker_node.cli("session", "info", "alices", "--owner", alice["accessKey"], as_keypair=bob)
    assert denied.returncode != 0 and "only admins" in denied.stderr
    destroy = docker_node.cli("session", "destroy", sid, as_keypair=bob)
    assert destroy.returncode != 0
    assert docker_node.json("session", "info", sid)["status"] == "RUNNING"

    # the admin ends it by name with --owner
    docker_node.cli("session", "destroy", "alices", "--owner", alice["accessKey"], check=True)
    assert docker_node.json("session", "info", sid)["status"] in ("TERMINATING", "TERMINATED")


def test_owner_access_key_is_forbidden_to_users_at_the_api(docker_node: Node) -> None:
    carol = user_keypair(docker_node, "carol")
    admin_ak, _ = admin_keys(docker_node)
    status, body = signed_get(
        docker_node, f"/session?owner_access_key={admin_ak}", carol["accessKey"], carol["secretKey"]
    )
    assert status == 403, body
    assert "only admins" in body["msg"]
    # naming oneself is what it always was
    status, _ = signed_get(
        docker_node, f"/session?owner_access_key={carol['accessKey']}", carol["accessKey"], carol["secretKey"]
    )
    assert status == 200


def _ended_within(proc: subprocess.Popen, seconds: float) -> bool:
    try:
        proc.wait(seconds)
        return True
    except subprocess.TimeoutExpired:
        return False


def test_deactivating_a_keypair_closes_its_streams_and_keeps_its_sessions(docker_node: Node) -> None:
    dave = user_keypair(docker_node, "dave")
    docker_node.cli("session", "create", "--name", "daves", "python", check=True, as_keypair=dave)
    env = {
        **docker_node.env,
        "BACKEND_ENDPOINT": docker_node.endpoint,
        "BACKEND_ACCESS_KEY": dave["accessKey"],
        "BACKEND_SECRET_KEY": dave["secretKey"],
    }
    streams = [
        subprocess.Popen([sys.executable, "-m", "bai", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for args in (("session", "events", "-f"), ("session", "logs", "daves", "-f"))
    ]
    try:
        time.sleep(1.5)  # both connected and waiting
        assert all(p.poll() is None for p in streams)
        out = docker_node.cli("keypair", "deactivate", dave["accessKey"], check=True)
        assert "closed 2 open stream" in out.stdout
        assert all(_ended_within(p, 5) for p in streams), "streams still open after deactivation"
    finally:
        for p in streams:
            p.kill()
            p.wait()
    assert docker_node.cli("session", "ls", as_keypair=dave).returncode != 0  # it signs nothing any more
    # its session keeps running (as Backend.AI does)
    assert docker_node.json("session", "info", "daves", "--owner", dave["accessKey"])["status"] == "RUNNING"
    docker_node.cli("keypair", "activate", dave["accessKey"], check=True)
    docker_node.cli("session", "destroy", "daves", check=True, as_keypair=dave)


def test_deactivate_terminate_ends_the_keypairs_sessions(docker_node: Node) -> None:
    erin = user_keypair(docker_node, "erin")
    docker_node.cli("session", "create", "--name", "erins", "python", check=True, as_keypair=erin)
    out = docker_node.cli("keypair", "deactivate", erin["accessKey"], "--terminate", check=True)
    assert "erins" in out.stdout
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        status = docker_node.json("session", "info", "erins", "--owner", erin["accessKey"])["status"]
        if status == "TERMINATED":
            break
        time.sleep(0.3)
    assert status == "TERMINATED"


def test_only_sha256_signatures_count_and_unknown_keys_are_not_told_apart(docker_node: Node) -> None:
    admin_ak, admin_sk = admin_keys(docker_node)
    assert signed_get(docker_node, "/session", admin_ak, admin_sk)[0] == 200
    for method in ("HMAC-MD5", "HMAC-SHA1"):
        answers = []
        for access in (admin_ak, "AKIANOBODYKNOWSTHIS0"):
            status, body = signed_get(docker_node, "/session", access, admin_sk, method)
            assert status == 401, (method, body)
            answers.append(body)
        assert answers[0] == answers[1], answers  # whether or not the key exists
    # a wrong signature and an unknown key get one answer too
    wrong = signed_get(docker_node, "/session", admin_ak, "not-the-secret")
    unknown = signed_get(docker_node, "/session", "AKIANOBODYKNOWSTHIS0", admin_sk)
    assert wrong == unknown and wrong[0] == 401


@pytest.mark.parametrize("listen,warns", [("0.0.0.0", True), ("127.0.0.1", False)])
def test_plain_http_beyond_loopback_is_announced(tmp_path, python_image: str, listen: str, warns: bool) -> None:
    node = Node(tmp_path, "docker")
    node.args = ("--listen", f"{listen}:{node.port}")
    node.start()
    try:
        warning = [line for line in node.banner.splitlines() if "altered on the wire" in line]
        assert len(warning) == (1 if warns else 0), node.banner
    finally:
        node.stop()
