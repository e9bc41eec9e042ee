"""Resource presets (Backend.AI's `GET /resource/presets`, `POST /resource/check-presets`, the GraphQL presets and
their superadmin mutations; bai's `/bai/presets`, `bai preset …` and `--preset`), through a real sim node of 4 cores
and 8 GiB: who may do what, whether each preset fits now (the keypair's policy, the agent's room), careless input
(a 4xx that names it, nothing stored), and sessions made with a preset."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.nodeproc import Node, admin_keys, signed_request

CAPACITY = 'cpu = "4"\nmem = "8g"\n'


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    node = Node(tmp_path_factory.mktemp("presets"), "sim", agent_config=CAPACITY).start()
    yield node
    node.stop()


@pytest.fixture(scope="module")
def user(node: Node) -> dict[str, str]:
    """A keypair whose policy allows 2 cores (and anything else)."""
    node.cli("policy", "create", "two-cores", "--slots", "cpu=2", check=True)
    return node.json("keypair", "create", "--user", "preset-user@example.com", "--policy", "two-cores")


def as_admin(node: Node, method: str, path: str, body: object = None) -> tuple[int, object]:
    return signed_request(node, method, path, *admin_keys(node), body=body)


def as_user(node: Node, user: dict[str, str], method: str, path: str, body: object = None) -> tuple[int, object]:
    return signed_request(node, method, path, user["accessKey"], user["secretKey"], body=body)


def make(node: Node, name: str, slots: dict[str, str], **more: object) -> dict:
    status, made = as_admin(node, "POST", "/bai/presets", {"name": name, "resource_slots": slots, **more})
    assert status == 201, made
    assert isinstance(made, dict)
    return made


def test_superadmins_make_change_and_remove_presets_everyone_lists_them(node: Node, user: dict[str, str]) -> None:
    made = make(node, "pr-small", {"cpu": "1", "mem": "1g"}, shared_memory="64m")
    assert made == {
        "name": "pr-small",
        "resource_slots": {"cpu": "1", "mem": str(1 << 30)},
        "shared_memory": str(64 << 20),
        "scaling_group_name": None,
    }
    status, listed = as_user(node, user, "GET", "/resource/presets")  # (Backend.AI's shape)
    assert status == 200 and {"presets"} == set(listed)  # type: ignore[arg-type]
    assert made in listed["presets"]  # type: ignore[index]
    # a user may not make, change or remove one
    for method, path, body in (
        ("POST", "/bai/presets", {"name": "pr-mine", "resource_slots": {"cpu": "1"}}),
        ("PATCH", "/bai/presets/pr-small", {"resource_slots": {"cpu": "4"}}),
        ("DELETE", "/bai/presets/pr-small", None),
    ):
        status, answer = as_user(node, user, method, path, body)
        assert status == 403 and "superadmins" in json.dumps(answer), (method, status, answer)
    status, changed = as_admin(node, "PATCH", "/bai/presets/pr-small", {"name": "pr-tiny", "shared_memory": None})
    assert status == 200 and changed["name"] == "pr-tiny" and changed["shared_memory"] is None, changed  # type: ignore[index]
    assert changed["resource_slots"] == made["resource_slots"]  # type: ignore[index]
    assert as_admin(node, "GET", "/bai/presets/pr-small")[0] == 404
    make(node, "pr-other", {"cpu": "2"})
    status, answer = as_admin(node, "PATCH", "/bai/presets/pr-tiny", {"name": "pr-other"})
    assert status == 409, answer
    assert as_admin(node, "DELETE", "/bai/presets/pr-tiny")[0] == 200
    assert as_admin(node, "DELETE", "/bai/presets/pr-tiny")[0] == 404
    assert as_admin(node, "DELETE", "/bai/presets/pr-other")[0] == 200
    status, listed = as_admin(node, "GET", "/bai/presets")
    assert [p["name"] for p in listed] == []  # type: ignore[union-attr]


def test_check_presets_says_what_fits_under_the_policy_and_on_the_agent(node: Node, user: dict[str, str]) -> None:
    for name, cpu in (("ck-one", "1"), ("ck-two", "2"), ("ck-three", "3"), ("ck-eight", "8")):
        make(node, name, {"cpu": cpu, "mem": "1g"})
    try:
        status, answer = as_user(node, user, "POST", "/resource/check-presets", {})
        assert status == 200, answer
        fits = {p["name"]: p["allocatable"] for p in answer["presets"]}  # type: ignore[index]
        # the policy leaves 2 cores, the agent has 4: three cores fit the agent but not the policy
        assert fits == {"ck-one": True, "ck-two": True, "ck-three": False, "ck-eight": False}, answer
        assert answer["keypair_limits"]["cpu"] == "2" and answer["keypair_limits"]["mem"] == "Infinity"  # type: ignore[index]
        assert answer["keypair_remaining"]["cpu"] == "2"  # type: ignore[index]
        assert answer["scaling_groups"]["default"]["remaining"] == {"cpu": "2", "mem": str(8 << 30)}  # type: ignore[index]
        # the admin's policy is unlimited: three cores fit, eight do not (no agent has them)
        status, answer = as_admin(node, "POST", "/resource/check-presets", {"scaling_group": "default"})
        fits = {p["name"]: p["allocatable"] for p in answer["presets"]}  # type: ignore[index]
        assert fits == {"ck-one": True, "ck-two": True, "ck-three": True, "ck-eight": False}, answer
        # a session of the user's holding a core: one is left to it
        env = {"accessKey": user["accessKey"], "secretKey": user["secretKey"]}
        node.cli("session", "create", "python", "--name", "ck-hold", "--preset", "ck-one", check=True, as_keypair=env)
        try:
            status, answer = as_user(node, user, "GET", "/resource/check-presets")
            assert answer["keypair_using"]["cpu"] == "1" and answer["keypair_remaining"]["cpu"] == "1", answer  # type: ignore[index]
            fits = {p["name"]: p["allocatable"] for p in answer["presets"]}  # type: ignore[index]
            assert fits == {"ck-one": True, "ck-two": False, "ck-three": False, "ck-eight": False}, answer
            held = node.json("session", "info", "ck-hold", as_keypair=env)
            assert held["requestedSlots"]["cpu"] == "1" and held["requestedSlots"]["mem"] == str(1 << 30), held
        finally:
            node.cli("session", "destroy", "ck-hold", as_keypair=env)
    finally:
        for name in ("ck-one", "ck-two", "ck-three", "ck-eight"):
            as_admin(node, "DELETE", f"/bai/presets/{name}")


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({"name": "x y", "resource_slots": {"cpu": "1"}}, "name must be"),
        ({"name": "", "resource_slots": {"cpu": "1"}}, "name must be"),
        ({"name": "p", "resource_slots": {"gpu.magic": "1"}}, "unknown slot"),
        ({"name": "p", "resource_slots": {"cpu": "-1"}}, "negative"),
        ({"name": "p", "resource_slots": {"cpu": "0"}}, "some slot an amount"),
        ({"name": "p", "resource_slots": {"mem": "inf"}}, "finite"),
        ({"name": "p", "resource_slots": ["cpu"]}, "object of slot amounts"),
        ({"name": "p"}, "some slot an amount"),
        ({"name": "p", "resource_slots": {"cpu": "1"}, "shared_memory": "lots"}, "shared_memory"),
        ({"name": "p", "resource_slots": {"cpu": "1"}, "shared_memory": 1 << 70}, "too large"),
        ({"name": "p", "resource_slots": {"cpu": "1"}, "scaling_group_name": "nowhere"}, "no scaling group"),
        ({"name": "p", "resource_slots": {"cpu": "1"}, "colour": "red"}, "no field 'colour'"),
        ({"name": ["p"], "resource_slots": {"cpu": "1"}}, "name must be"),
    ],
)
def test_careless_presets_are_400_and_nothing_is_stored(node: Node, body: dict, said: str) -> None:
    status, answer = as_admin(node, "POST", "/bai/presets", body)
    assert status == 400 and said in json.dumps(answer), (status, answer)
    assert as_admin(node, "GET", "/bai/presets")[1] == []


@pytest.mark.parametrize(
    "body", [{"group": "nowhere"}, {"scaling_group": "nowhere"}, {"group": 3}, {"colour": "red"}, [1], "text"]
)
def test_careless_checks_are_4xx(node: Node, user: dict[str, str], body: object) -> None:
    status, answer = as_user(node, user, "POST", "/resource/check-presets", body)
    assert 400 <= status < 500, (status, answer)


def test_graphql_presets_and_their_mutations(node: Node, user: dict[str, str]) -> None:
    def gql(who: str, query: str) -> dict:
        keys = admin_keys(node) if who == "admin" else (user["accessKey"], user["secretKey"])
        status, answer = signed_request(node, "POST", "/admin/gql", *keys, body={"query": query})
        assert status == 200, answer
        return answer  # type: ignore[return-value]

    made = gql(
        "admin",
        'mutation { create_resource_preset(name: "gq-one", props: {resource_slots: "{\\"cpu\\": \\"1\\"}", '
        'shared_memory: "1g"}) { ok msg resource_preset { name resource_slots shared_memory } } }',
    )["data"]["create_resource_preset"]
    assert made["ok"] is True, made
    assert made["resource_preset"] == {"name": "gq-one", "resource_slots": '{"cpu": "1"}', "shared_memory": 1 << 30}
    refused = gql("user", 'mutation { delete_resource_preset(name: "gq-one") { ok msg } }')["data"]
    said = refused["delete_resource_preset"]
    assert said["ok"] is False and "superadmins" in said["msg"], said
    changed = gql(
        "admin",
        'mutation { modify_resource_preset(name: "gq-one", props: {resource_slots: "{\\"cpu\\": \\"2\\"}"}) { ok } }',
    )
    assert changed["data"]["modify_resource_preset"]["ok"] is True
    listed = gql("user", '{ resource_presets { name resource_slots } resource_preset(name: "gq-one") { name } }')
    assert listed["data"]["resource_presets"] == [{"name": "gq-one", "resource_slots": '{"cpu": "2"}'}]
    assert listed["data"]["resource_preset"] == {"name": "gq-one"}
    assert gql("user", '{ resource_preset(name: "none") { name } }')["data"]["resource_preset"] is None
    gone = gql("admin", 'mutation { delete_resource_preset(name: "gq-one") { ok } }')
    assert gone["data"]["delete_resource_preset"]["ok"] is True


def test_the_cli_makes_lists_checks_and_runs_with_presets(node: Node, user: dict[str, str]) -> None:
    out = node.cli("preset", "add", "cli-small", "--cpu", "1", "--mem", "512m", "--shared-memory", "64m", check=True)
    assert out.stdout.strip() == "preset cli-small made: cpu 1, mem 512 MiB, shared memory 64 MiB", out.stdout
    try:
        listed = node.cli("preset", "ls", check=True).stdout
        assert "cli-small" in listed and "cpu 1, mem 512 MiB" in listed, listed
        env = {"accessKey": user["accessKey"], "secretKey": user["secretKey"]}
        checked = node.cli("preset", "check", check=True, as_keypair=env).stdout
        assert "FITS NOW" in checked and "you may still take: cpu 2, mem" in checked, checked
        assert "free for you in scaling group default: cpu 2, mem 8 GiB" in checked, checked
        ran = node.cli("session", "run", "sim", "--preset", "cli-small", "-q", "-c", "print('hi')", as_keypair=env)
        assert ran.returncode == 0 and ran.stdout == "hi\n", ran
        missing = node.cli("session", "run", "sim", "--preset", "nope", "-q", "-c", "print(1)", as_keypair=env)
        assert missing.returncode != 0 and "nope" in missing.stderr, missing
        refused = node.cli("preset", "rm", "cli-small", as_keypair=env)
        assert refused.returncode != 0 and "superadmins" in refused.stderr, refused
        out = node.cli("preset", "update", "cli-small", "--mem", "1g", check=True)
        assert out.stdout.strip() == "preset cli-small changed: mem 1 GiB, shared memory 64 MiB", out.stdout
        bad = node.cli("preset", "add", "cli-bad", "-r", "cpu=lots")
        assert bad.returncode == 2 and "lots" in bad.stderr, bad
    finally:
        node.cli("preset", "rm", "cli-small")
    assert "cli-small" not in node.cli("preset", "ls", check=True).stdout


def test_what_is_left_is_the_least_of_the_policy_project_and_domain_and_never_below_zero() -> None:
    from decimal import Decimal as D

    from bai.node.manager.rules import presets as rules
    from bai.node.manager.state.preset_records import ResourcePreset

    def preset(name: str, cpu: str, group: str | None = None) -> ResourcePreset:
        return ResourcePreset(name, {"cpu": cpu}, None, group, "")

    facts = rules.CheckFacts(
        known=["cpu", "mem", "cuda.device"],
        keypair=rules.Limit({"cpu": D(8)}, others_unlimited=False),  # LIMITED: mem and GPUs are 0 to it
        keypair_using={"cpu": D(1)},
        project=rules.Limit({"cpu": D(6)}),
        project_using={"cpu": D(3)},
        domain=rules.Limit({"cpu": D(10)}),
        domain_using={"cpu": D(12)},  # (over its cap: a cap lowered under what runs)
        groups={
            "a": rules.ScalingGroupFacts([{"cpu": D(4)}, {"cpu": D(1)}], {"cpu": D(1)}),
            "b": rules.ScalingGroupFacts([{"cpu": D(16)}], {}),
        },
        presets=[preset("one", "1"), preset("in-b", "1", "b")],
    )
    answer = rules.check(facts)
    assert answer["keypair_limits"] == {"cpu": "8", "cuda.device": "0", "mem": "0"}
    assert answer["keypair_remaining"] == {"cpu": "0", "cuda.device": "0", "mem": "0"}  # the domain is full
    assert answer["group_remaining"] == {"cpu": "3", "cuda.device": "Infinity", "mem": "Infinity"}
    assert answer["scaling_groups"]["a"] == {
        "using": {"cpu": "1", "cuda.device": "0", "mem": "0"},
        "remaining": {"cpu": "0", "cuda.device": "0", "mem": "0"},
    }
    assert [p["allocatable"] for p in answer["presets"]] == [False, False]
    roomy = rules.check(
        rules.CheckFacts(
            known=["cpu"], keypair=rules.Limit(), keypair_using={}, project=rules.Limit(), project_using={},
            domain=rules.Limit(), domain_using={}, groups=facts.groups,
            presets=[preset("five", "5"), preset("five-in-a", "5", "a"), preset("elsewhere", "1", "c")],
        )
    )  # fmt: skip
    # five cores: only b's agent has them; a preset for a scaling group is checked on its agents only
    assert [p["allocatable"] for p in roomy["presets"]] == [True, False, False]
    assert roomy["scaling_group_remaining"] == {"cpu": "21"}
