"""What one manager of a database keeps in memory follows what another changes: a resource policy lowered
through one manager is the limit the other judges its next create by (each keeps the policies it read, dropped
when the database tells it of a change), and a keypair made through one signs at the other."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import pgserver
from tests.managers_support import Managers, wait_for
from tests.nodeproc import signed_request


@pytest.fixture
def managers(tmp_path: Path):
    m = Managers(tmp_path, pgserver.shared().new_database("limits"))
    yield m
    m.stop()


def test_a_policy_lowered_through_one_manager_limits_the_next_create_through_the_other(managers: Managers) -> None:
    m = managers.start()
    first, second = m.managers
    first.cli("policy", "create", "shared-cap", "--slots", "cpu=4", check=True)
    user = first.json("keypair", "create", "--user", "dora", "--policy", "shared-cap")
    keys = (user["accessKey"], user["secretKey"])

    def create(name: str, cpu: str) -> tuple[int, object]:
        body = {"name": name, "image": "python", "type": "batch", "enqueueOnly": True,
                "startupCommand": "true", "config": {"resources": {"cpu": cpu}}}  # fmt: skip
        return signed_request(second, "POST", "/session", *keys, body)

    # the keypair made through the first signs at the second, whose first create reads (and keeps) the policy
    assert wait_for(lambda: create("fits", "2")[0] in (200, 201), 10), create("fits", "2")
    first.cli("policy", "update", "shared-cap", "--slots", "cpu=1", check=True)
    refused = wait_for(lambda: (r := create("too-big-now", "2"))[0] == 412 and r, 5)
    assert refused, create("too-big-now", "2")
    assert "shared-cap" in str(refused[1]) and "cpu 1" in str(refused[1])
    first.cli("policy", "update", "shared-cap", "--slots", "cpu=8", check=True)
    assert wait_for(lambda: create("fits-again", "2")[0] in (200, 201), 5), create("fits-again", "2")


def test_teams_changed_through_one_manager_hold_at_the_other(managers: Managers) -> None:
    """A project made through one manager takes sessions through the other; a user deactivated through one stops
    signing at the other within a second (issue 31)."""
    from tests.nodeproc import admin_keys

    m = managers.start()
    first, second = m.managers
    admin = admin_keys(first)
    status, _ = signed_request(first, "POST", "/bai/projects", *admin, {"name": "shared-team"})
    assert status == 201
    body = {"email": "sam@example.com", "password": "a long password", "projects": ["shared-team"]}
    assert signed_request(first, "POST", "/bai/users", *admin, body)[0] == 201
    user = first.json("keypair", "create", "--user", "sam@example.com")
    keys = (user["accessKey"], user["secretKey"])
    create = {"name": "in-team", "image": "python", "enqueueOnly": True, "group": "shared-team",
              "config": {"resources": {"cpu": "1"}}}  # fmt: skip
    assert wait_for(lambda: signed_request(second, "POST", "/session", *keys, create)[0] in (200, 201), 10)
    status, info = signed_request(second, "GET", "/session/in-team", *keys)
    assert status == 200 and info["project"] == "shared-team", info
    assert signed_request(first, "PATCH", "/bai/users/sam@example.com", *admin, {"is_active": False})[0] == 200
    assert wait_for(lambda: signed_request(second, "GET", "/session", *keys)[0] == 401, 2)
