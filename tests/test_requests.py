"""Tests for bai/node/manager/http/requests.py: validation of the session-create body."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from bai.common.problems import Problem
from bai.node.manager.http.requests import parse_create

KNOWN = {"cpu", "mem"}
DEFAULTS = {"cpu": "1", "mem": "1g"}
ALIASES = {"python": "bai-python:3.11"}
GiB = 1024**3

# The exact body the official Backend.AI client sends for `session create python`.
CLIENT_BODY: dict[str, Any] = {
    "tag": None,
    "name": "pysdk-e5932223fb",
    "config": {
        "mounts": [],
        "environ": {},
        "resources": {},
        "resource_opts": {},
        "scalingGroup": None,
        "mount_map": {},
        "preopen_ports": [],
    },
    "dependencies": None,
    "callback_url": None,
    "architecture": "x86_64",
    "clusterSize": 1,
    "clusterMode": "single-node",
    "starts_at": None,
    "bootstrap_script": None,
    "owner_access_key": None,
    "domain": "default",
    "group": "default",
    "type": "interactive",
    "enqueueOnly": False,
    "maxWaitSeconds": 0,
    "reuseIfExists": True,
    "startupCommand": None,
    "image": "python",
}


def parse(body: Any):
    return parse_create(body, KNOWN, DEFAULTS, ALIASES, datetime.now(UTC))


def body_with(**changes: Any) -> dict[str, Any]:
    body = copy.deepcopy(CLIENT_BODY)
    body.update(changes)
    return body


def body_with_resources(resources: Any) -> dict[str, Any]:
    body = copy.deepcopy(CLIENT_BODY)
    body["config"]["resources"] = resources
    return body


def test_official_client_body_parses() -> None:
    req = parse(copy.deepcopy(CLIENT_BODY))
    assert req.name == "pysdk-e5932223fb"
    assert req.image == "bai-python:3.11"  # alias resolved
    assert req.type == "interactive"
    assert req.resources == {"cpu": Decimal(1), "mem": Decimal(GiB)}  # defaults for {}
    assert req.environ == {}
    assert req.cluster_size == 1
    assert req.enqueue_only is False
    assert req.max_wait == 0.0
    assert req.reuse is True
    assert req.startup_command is None
    assert req.tag is None


def test_null_scaling_group_means_default() -> None:
    assert parse(copy.deepcopy(CLIENT_BODY)).scaling_group == "default"


def test_scaling_group_is_taken_when_given() -> None:
    body = copy.deepcopy(CLIENT_BODY)
    body["config"]["scalingGroup"] = "gpu"
    assert parse(body).scaling_group == "gpu"


def test_unaliased_image_is_kept() -> None:
    assert parse(body_with(image="  busybox:1.36  ")).image == "busybox:1.36"


def test_string_resources_parse() -> None:
    req = parse(body_with_resources({"cpu": "2", "mem": "512m"}))
    assert req.resources == {"cpu": Decimal(2), "mem": Decimal(512 * 1024**2)}


def test_partial_resources_get_the_other_default() -> None:
    req = parse(body_with_resources({"cpu": 0.5}))
    assert req.resources == {"cpu": Decimal("0.5"), "mem": Decimal(GiB)}


def test_environ_values_become_strings() -> None:
    body = copy.deepcopy(CLIENT_BODY)
    body["config"]["environ"] = {"A": "1", "B": 2}
    assert parse(body).environ == {"A": "1", "B": "2"}


def test_batch_with_startup_command() -> None:
    req = parse(body_with(type="batch", startupCommand="python main.py"))
    assert req.type == "batch"
    assert req.startup_command == "python main.py"
    assert req.config["startup_command"] == "python main.py"


def test_missing_name_generates_a_valid_one() -> None:
    body = body_with()
    del body["name"]
    first, second = parse(body).name, parse(copy.deepcopy(body)).name
    assert first != second
    assert 4 <= len(first) <= 64


@pytest.mark.parametrize("key", ["session_name", "clientSessionToken"])
def test_name_aliases(key: str) -> None:
    body = body_with(**{key: "my-session"})
    del body["name"]
    assert parse(body).name == "my-session"


def test_lang_alias_for_image() -> None:
    body = body_with(lang="python")
    del body["image"]
    assert parse(body).image == "bai-python:3.11"


def test_session_type_alias() -> None:
    body = body_with(sessionType="BATCH", startupCommand="true")
    del body["type"]
    assert parse(body).type == "batch"


def test_enqueue_only_and_max_wait() -> None:
    req = parse(body_with(enqueueOnly=True, maxWaitSeconds=2.5, reuseIfExists=False))
    assert req.enqueue_only is True
    assert req.max_wait == 2.5
    assert req.reuse is False


def _resources(value: Any) -> dict[str, Any]:
    return body_with_resources(value)


def _without(key: str) -> dict[str, Any]:
    body = body_with()
    del body[key]
    return body


def _config(value: Any) -> dict[str, Any]:
    return body_with(config=value)


INVALID = {
    "name-too-short": body_with(name="ab"),
    "name-with-space": body_with(name="has space"),
    "name-leading-dash": body_with(name="-lead"),
    "name-65-chars": body_with(name="a" * 65),
    "name-reserved": body_with(name="from-template"),
    "name-not-string": body_with(name=1234),
    "missing-image": _without("image"),
    "null-image": body_with(image=None),
    "blank-image": body_with(image="   "),
    "unknown-slot": _resources({"cuda.device": 1}),
    "negative-cpu": _resources({"cpu": -1}),
    "negative-cpu-string": _resources({"cpu": "-1"}),
    "bad-mem": _resources({"mem": "lots"}),
    "shmem-in-resources": _resources({"shmem": "64m"}),
    "batch-without-startup": body_with(type="batch"),
    "unknown-type": body_with(type="inference"),
    "cluster-size-65": body_with(clusterSize=65),  # more kernels than a session may have (MAX_CLUSTER_SIZE)
    "resources-not-dict": _resources(["cpu", 1]),
    "resources-string": _resources("cpu=1"),
    "config-not-dict": _config("nope"),
    "negative-max-wait": body_with(maxWaitSeconds=-1),
    "max-wait-string": body_with(maxWaitSeconds="10"),
    "environ-not-dict": _config({"environ": ["A=1"]}),
    "bad-network": _config({"network": "container:other"}),
    "network-not-string": _config({"network": ["host"]}),
    "starts-at-interactive": body_with(starts_at="2030-01-01T00:00:00Z"),
    "starts-at-garbage": body_with(type="batch", startupCommand="true", starts_at="someday"),
    "dependencies-not-list": body_with(dependencies="other-session"),
    "dependencies-not-strings": body_with(dependencies=[1]),
}


def test_batch_start_time_and_dependencies() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    body = body_with(type="batch", startupCommand="make", starts_at="1h30m", dependencies=["a-session", "a-session"])
    req = parse_create(body, KNOWN, DEFAULTS, ALIASES, now=now)
    assert req.starts_at == now + timedelta(minutes=90)
    assert req.depends == ["a-session"]
    iso = parse(body_with(type="batch", startupCommand="make", starts_at="2030-01-01T00:00:00"))
    assert iso.starts_at == datetime(2030, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize("body", list(INVALID.values()), ids=list(INVALID))
def test_invalid_bodies_are_invalid_api_params(body: Any) -> None:
    with pytest.raises(Problem) as exc:
        parse(body)
    assert exc.value.slug == "invalid-api-params"
    assert exc.value.status == 400
    assert exc.value.msg


@pytest.mark.parametrize("body", [None, [], "text", 42], ids=["null", "list", "string", "number"])
def test_non_dict_body_is_invalid(body: Any) -> None:
    with pytest.raises(Problem) as exc:
        parse(body)
    assert exc.value.slug == "invalid-api-params"


def test_unknown_slot_message_names_the_slot() -> None:
    with pytest.raises(Problem) as exc:
        parse(_resources({"cuda.device": 1}))
    assert "cuda.device" in exc.value.msg


def test_huge_cpu_is_invalid_api_params() -> None:
    with pytest.raises(Problem) as exc:
        parse(_resources({"cpu": 1e30}))
    assert exc.value.slug == "invalid-api-params"


def test_backend_ai_image_references_go_through_the_aliases() -> None:
    from bai.node.manager.http.requests import resolve_image

    aliases = {"python": "bai-python:3.11", "python:3.9-ubuntu20.04": "bai-python:3.9"}
    assert resolve_image("python", aliases) == "bai-python:3.11"
    assert resolve_image("python:3.9-ubuntu20.04", aliases) == "bai-python:3.9"
    assert resolve_image("cr.backend.ai/stable/python:3.9-ubuntu20.04", aliases) == "bai-python:3.9"
    assert resolve_image("cr.backend.ai/multiarch/python:3.10-ubuntu22.04", aliases) == "bai-python:3.11"
    assert resolve_image("localhost:5000/python", aliases) == "bai-python:3.11"
    assert resolve_image("bai-busybox:latest", aliases) == "bai-busybox:latest"  # no alias: used as it is
    assert resolve_image("ghcr.io/acme/tool:1", aliases) == "ghcr.io/acme/tool:1"
