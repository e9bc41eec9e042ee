"""Isolation: a session gets only the networks its scaling group allows, and images come only from
the registries of [images.registries] (with the manager's credentials, which it never stores or shows).

The end-to-end part runs Debian's docker-registry with htpasswd (bcrypt) auth on 127.0.0.1, which
Docker treats as an insecure (plain HTTP) registry without any daemon flag."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import time
import tomllib
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bai.common.config import DEFAULTS, merge
from bai.node.manager.http.requests import parse_create
from bai.node.manager.rules.admission import admit, check_image, from_config
from tests.nodeproc import (
    BUSYBOX_IMAGE,
    Node,
    has_local_image,
    require_docker,
    start_registry,
    stop_removing_containers,
)

USER, PASSWORD = "bai-puller", "pull-s3cret-9f1c"

# -- the decisions (pure) ------------------------------------------------------------------------


def request(image: str = "bai-busybox:latest", **config: Any):
    return parse_create({"image": image, "config": config}, {"cpu", "mem"}, {}, {}, datetime.now(UTC))


def admission(extra: str = ""):
    return from_config(merge(DEFAULTS, tomllib.loads(extra)))


def test_by_default_only_none_or_the_agents_own_network() -> None:
    rules = admission()
    assert admit(rules, request(), False) is None  # unset: the agent's [agent.docker] network
    assert admit(rules, request(network="none"), False) is None
    for network in ("host", "bridge", "my-net"):
        for is_admin in (False, True):
            problem = admit(rules, request(network=network), is_admin)
            assert problem is not None and problem.status == 403 and problem.slug == "generic-forbidden"
            assert "allowed: none" in problem.msg and network in problem.msg
            assert problem.data["allowed_networks"] == ["none"]


def test_the_agents_configured_network_may_be_asked_for_by_name() -> None:
    rules = admission('[agent.docker]\nnetwork = "bridge"\n')
    assert admit(rules, request(network="bridge"), False) is None  # what an unset network gets anyway
    refused = admit(rules, request(network="host"), False)
    assert refused is not None and refused.data["allowed_networks"] == ["none", "bridge"]


def test_configured_networks_per_group_and_for_admins() -> None:
    rules = admission(
        '[scaling_groups.default]\nallowed_networks = ["bridge", "lab-net"]\nadmin_allowed_networks = ["host"]\n'
        '[scaling_groups.gpu]\npolicy = "drf"\n'
    )
    assert admit(rules, request(network="bridge"), False) is None
    assert admit(rules, request(network="lab-net"), False) is None  # a user-defined Docker network
    refused = admit(rules, request(network="host"), False)
    assert refused is not None and refused.status == 403 and "none, bridge, lab-net" in refused.msg
    assert admit(rules, request(network="host"), True) is None
    other = admit(rules, request(network="bridge", scalingGroup="gpu"), True)  # another group: its own rules
    assert other is not None and other.status == 403


def test_an_unknown_scaling_group_is_a_clear_400() -> None:
    rules = admission()
    problem = admit(rules, request(scalingGroup="nope"), False)
    assert problem is not None and problem.status == 400 and "unknown scaling group 'nope'" in problem.msg
    assert admit(rules, request(scalingGroup="nope"), False, agent_groups={"nope"}) is None  # an agent's group


def test_images_only_from_configured_registries() -> None:
    rules = admission(
        '[images.registries.lab]\nurl = "https://Reg.Example.com:5000/"\nusername = "u"\npassword = "p"\n'
        '[images.registries.local]\nurl = "127.0.0.1:5000"\n'
    )
    assert check_image(rules, "bai-busybox:latest") is None  # a local image: nothing is pulled
    assert check_image(rules, "reg.example.com:5000/team/python:3.11") is None
    assert check_image(rules, "127.0.0.1:5000/x:1") is None
    for ref in ("127.0.0.1:5001/x:1", "evil.example.com/x", "localhost:5000/x", "docker.io/library/busybox"):
        problem = check_image(rules, ref)
        assert problem is not None and problem.status == 403, ref
        assert "lab (reg.example.com:5000), local (127.0.0.1:5000)" in problem.msg
    assert rules.registry_for("reg.example.com:5000/x").auth() == {
        "username": "u",
        "password": "p",
        "serveraddress": "reg.example.com:5000",
    }
    assert rules.registry_for("127.0.0.1:5000/x").auth() is None
    assert "password=" not in repr(rules.registry_for("reg.example.com:5000/x"))


@pytest.mark.parametrize(
    "table",
    [
        'url = "ftp://reg.example.com"',
        'url = "reg.example.com/namespace"',
        'url = "myregistry"',  # Docker would read myregistry/x as a Docker Hub namespace
        'url = "https://reg.example.com"\ninsecure = true',
        'url = "reg.example.com"\npassword = "p"',
        'url = "reg.example.com"\nusername = "u"\npassword = "p"\npassword_file = "/f"',
    ],
)
def test_bad_registry_tables_are_refused(table: str) -> None:
    with pytest.raises(ValueError, match=r"\[images.registries.r\]"):
        admission(f"[images.registries.r]\n{table}\n")


# -- end to end: a registry with htpasswd auth, a node configured for it -------------------------------


@pytest.fixture(scope="module")
def auth_registry(tmp_path_factory, busybox_image: str) -> Iterator[dict[str, Any]]:
    program, htpasswd = shutil.which("docker-registry"), shutil.which("htpasswd")
    if program is None or htpasswd is None:
        require_docker()
        pytest.fail("docker-registry and htpasswd are needed (apt-get install docker-registry apache2-utils)")
    base = tmp_path_factory.mktemp("auth-registry")
    out = subprocess.run([htpasswd, "-Bbn", USER, PASSWORD], capture_output=True, text=True, check=True)
    (base / "htpasswd").write_text(out.stdout)
    proc, port = start_registry(program, base, base / "htpasswd")
    ref = f"127.0.0.1:{port}/bai/busybox:auth"
    env = {**os.environ, "DOCKER_CONFIG": str(base / "docker-cli")}  # the login stays out of root's own
    login = ["docker", "login", f"127.0.0.1:{port}", "-u", USER, "--password-stdin"]
    for cmd, stdin in (
        (login, PASSWORD),
        (["docker", "tag", busybox_image, ref], None),
        (["docker", "push", ref], None),
    ):
        done = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 0, done.stderr
    subprocess.run(["docker", "rmi", ref], capture_output=True, check=True)
    yield {"port": port, "ref": ref, "base": base}
    subprocess.run(["docker", "rmi", ref], capture_output=True)
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="module")
def docker_node(auth_registry: dict[str, Any], tmp_path_factory) -> Iterator[Node]:
    """Registries: `local` (the registry, right credentials from a file) and `wrong` (the same registry
    as localhost:PORT, a wrong password); networks: the defaults."""
    base = tmp_path_factory.mktemp("node-isolation")
    secret = base / "registry-password"
    secret.write_text(PASSWORD + "\n")
    secret.chmod(0o600)
    port = auth_registry["port"]
    node = Node(
        base,
        "docker",
        extra_config=(
            f'[images.registries.local]\nurl = "127.0.0.1:{port}"\nusername = "{USER}"\npassword_file = "{secret}"\n'
            f'[images.registries.wrong]\nurl = "localhost:{port}"\nusername = "{USER}"\npassword = "not-it"\n'
        ),
    ).start()
    yield node
    stop_removing_containers(node)


@pytest.fixture(scope="module")
def user(docker_node: Node) -> dict[str, str]:
    return docker_node.json("keypair", "create", "--user", "isolated-user")


def api_create(node: Node, keypair: dict[str, str] | None = None, image: str = BUSYBOX_IMAGE, **kw: Any) -> Any:
    """POST /session through the client; the APIError (with its HTTP status) when refused."""
    from bai.client import APIError, Client
    from bai.common.credentials import Credentials

    if keypair is None:
        saved = tomllib.loads((Path(node.env["XDG_CONFIG_HOME"]) / "bai" / "credentials.toml").read_text())
        keypair = {"accessKey": saved["access_key"], "secretKey": saved["secret_key"]}

    async def go() -> Any:
        async with Client(Credentials(node.endpoint, keypair["accessKey"], keypair["secretKey"])) as c:
            return await c.create_session(image, enqueue_only=True, **kw)

    try:
        return asyncio.run(go())
    except APIError as e:
        return e


def test_an_unconfigured_registry_is_refused_before_any_connection(
    docker_node: Node, user: dict[str, str], auth_registry: dict[str, Any]
) -> None:
    with socket.socket() as trap:  # where the image claims to come from: nothing may connect to it
        trap.bind(("127.0.0.1", 0))
        trap.listen(8)
        trap.setblocking(False)
        ref = f"127.0.0.1:{trap.getsockname()[1]}/evil/busybox:1"
        refused = api_create(docker_node, user, ref, name="from-elsewhere")
        assert getattr(refused, "status", None) == 403, refused
        assert f"local (127.0.0.1:{auth_registry['port']})" in refused.msg
        run = docker_node.cli("session", "run", ref, "--name", "from-elsewhere", "--", "true", as_keypair=user)
        assert run.returncode != 0 and "not configured" in run.stderr and "wrong (localhost:" in run.stderr
        pull = docker_node.cli("image", "pull", ref)  # admins too
        assert pull.returncode != 0 and "not configured" in pull.stderr, pull.stderr
        hub = docker_node.cli("image", "pull", "busybox:latest")  # no registry named: Docker Hub's
        assert hub.returncode != 0 and "docker.io" in hub.stderr and "not configured" in hub.stderr
        time.sleep(0.5)
        with pytest.raises(BlockingIOError):
            trap.accept()
    names = [s["name"] for s in docker_node.json("session", "ls", "--all")]
    assert "from-elsewhere" not in names


def test_a_private_registry_with_credentials_pulls_and_runs(
    docker_node: Node, user: dict[str, str], auth_registry: dict[str, Any]
) -> None:
    ref = auth_registry["ref"]
    assert not has_local_image(ref)
    result = docker_node.cli("session", "run", ref, "--name", "auth-pull", "--", "echo", "auth-pulled", as_keypair=user)
    assert result.returncode == 0 and "auth-pulled" in result.stdout, result.stderr
    assert has_local_image(ref)
    statuses = [t["status"] for t in docker_node.json("session", "info", "auth-pull", as_keypair=user)["transitions"]]
    assert "PULLING" in statuses and "RUNNING" in statuses
    # bai image pull (admins) goes through the same registry, with the same credentials
    docker_node.cli("image", "rm", ref, check=True)
    assert not has_local_image(ref)
    docker_node.cli("image", "pull", ref, check=True)
    assert has_local_image(ref)
    # the password is in no answer, no log line and nothing the manager keeps
    shown = docker_node.cli("session", "info", "auth-pull", "--json", as_keypair=user).stdout
    assert PASSWORD not in shown
    assert PASSWORD not in docker_node.log_path.read_text()
    for path in docker_node.state_dir.rglob("*"):
        if path.is_file() and path.name != "registry-password":
            assert PASSWORD.encode() not in path.read_bytes(), path


def test_wrong_credentials_fail_clearly(docker_node: Node, auth_registry: dict[str, Any]) -> None:
    ref = f"localhost:{auth_registry['port']}/bai/busybox:auth"
    result = docker_node.cli("session", "run", ref, "--", "true")
    assert result.returncode == 125, (result.returncode, result.stderr)
    assert "cannot pull" in result.stderr and "unauthorized" in result.stderr.lower(), result.stderr
    assert not has_local_image(ref)


def test_networks_are_refused_unless_the_scaling_group_allows_them(docker_node: Node, user: dict[str, str]) -> None:
    for network in ("host", "bridge"):
        refused = api_create(docker_node, user, network=network)
        assert getattr(refused, "status", None) == 403, refused
        assert "allowed: none" in refused.msg and network in refused.msg
        cli = docker_node.cli("session", "create", BUSYBOX_IMAGE, "--network", network, as_keypair=user)
        assert cli.returncode != 0 and "allowed: none" in cli.stderr, cli.stderr
    admin = api_create(docker_node, network="host")  # admins get no more unless configured
    assert getattr(admin, "status", None) == 403, admin
    unknown = api_create(docker_node, user, scaling_group="nope")
    assert getattr(unknown, "status", None) == 400 and "unknown scaling group 'nope'" in unknown.msg
    assert not [s for s in docker_node.json("session", "ls", "--all") if s["name"].startswith("sess-")]


@pytest.fixture(scope="module")
def open_node(tmp_path_factory, busybox_image: str) -> Iterator[Node]:
    node = Node(
        tmp_path_factory.mktemp("node-open-net"),
        "docker",
        extra_config='[scaling_groups.default]\nallowed_networks = ["bridge"]\nadmin_allowed_networks = ["host"]\n',
    ).start()
    yield node
    stop_removing_containers(node)


def test_configured_networks_are_allowed(open_node: Node) -> None:
    user = open_node.json("keypair", "create", "--user", "bridge-user")
    ls = ("--", "ls", "/sys/class/net")
    bridged = open_node.cli("session", "run", BUSYBOX_IMAGE, "--network", "bridge", *ls, as_keypair=user)
    assert bridged.returncode == 0 and "eth0" in bridged.stdout.split(), bridged.stderr
    unset = open_node.cli("session", "run", BUSYBOX_IMAGE, *ls, as_keypair=user)  # the agent's default: none
    assert unset.returncode == 0 and unset.stdout.split() == ["lo"], unset.stdout + unset.stderr
    host = open_node.cli("session", "run", BUSYBOX_IMAGE, "--network", "host", *ls, as_keypair=user)
    assert host.returncode != 0 and "allowed: none, bridge" in host.stderr, host.stderr
    admin = open_node.cli("session", "run", BUSYBOX_IMAGE, "--network", "host", *ls)
    assert admin.returncode == 0 and "docker0" in admin.stdout.split(), admin.stdout + admin.stderr


def test_a_sessions_network_is_shown(open_node: Node) -> None:
    open_node.cli("session", "create", "--name", "on-bridge", BUSYBOX_IMAGE, "--network", "bridge", check=True)
    try:
        assert open_node.json("session", "info", "on-bridge")["network"] == "bridge"
        assert "Network     bridge" in open_node.cli("session", "info", "on-bridge", check=True).stdout
    finally:
        open_node.cli("session", "destroy", "on-bridge", check=True)
