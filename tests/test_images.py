"""Images from a registry: a local registry (Debian's docker-registry) on 127.0.0.1, configured as
[images.registries.test]; a session whose image the agent lacks goes through PULLING; bai image pull |
rm | alias."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from tests.nodeproc import BUSYBOX_IMAGE, Node, has_local_image, start_registry, stop_removing_containers


@pytest.fixture(scope="module")
def docker_node(registry: str, tmp_path_factory) -> Iterator[Node]:
    """A docker node that may pull from the test registry (images come only from [images.registries])."""
    host = registry.split("/", 1)[0]
    node = Node(
        tmp_path_factory.mktemp("node-images"), "docker", extra_config=f'[images.registries.test]\nurl = "{host}"\n'
    ).start()
    yield node
    stop_removing_containers(node)


@pytest.fixture(scope="module")
def registry(tmp_path_factory, busybox_image: str) -> Iterator[str]:
    program = shutil.which("docker-registry")
    if program is None:
        if os.environ.get("BAI_REQUIRE_DOCKER") == "1":
            pytest.fail("docker-registry is missing (CI installs Debian's docker-registry)")
        pytest.skip("docker-registry is not installed (apt-get install docker-registry)")
    proc, port = start_registry(program, tmp_path_factory.mktemp("registry"))
    ref = f"127.0.0.1:{port}/bai/busybox:pulled"
    for cmd in (["docker", "tag", busybox_image, ref], ["docker", "push", ref], ["docker", "rmi", ref]):
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
    yield ref
    subprocess.run(["docker", "rmi", ref], capture_output=True)
    proc.terminate()
    proc.wait(10)


def test_a_session_pulls_its_image_from_the_registry(docker_node: Node, registry: str) -> None:
    assert not has_local_image(registry)
    result = docker_node.cli("session", "run", registry, "--name", "pulls-first", "--", "echo", "pulled-ok")
    assert result.returncode == 0 and "pulled-ok" in result.stdout, result.stderr
    statuses = [t["status"] for t in docker_node.json("session", "info", "pulls-first")["transitions"]]
    assert statuses[:4] == ["PENDING", "SCHEDULED", "PREPARING", "PULLING"] and "RUNNING" in statuses
    assert has_local_image(registry)
    assert registry in [i["name"] for i in docker_node.json("image", "ls")]


def test_image_rm_pull_and_alias(docker_node: Node, registry: str) -> None:
    if not has_local_image(registry):
        docker_node.cli("image", "pull", registry, check=True)
    removed = docker_node.cli("image", "rm", registry, check=True)
    assert registry in removed.stdout and not has_local_image(registry)
    pulled = docker_node.cli("image", "pull", registry, check=True)
    assert docker_node.agent_id in pulled.stdout and has_local_image(registry)
    docker_node.cli("image", "alias", "bb", registry, check=True)
    assert f"bb → {registry}" in docker_node.cli("image", "alias", check=True).stdout
    via = docker_node.cli("session", "run", "bb", "--", "echo", "via-alias")
    assert via.returncode == 0 and "via-alias" in via.stdout, via.stderr
    docker_node.cli("image", "alias", "bb", "--remove", check=True)
    assert "bb →" not in docker_node.cli("image", "alias", check=True).stdout


def test_a_missing_image_in_the_registry_fails_clearly(docker_node: Node, registry: str) -> None:
    missing = registry.rsplit("/", 1)[0] + "/nothing-here:1"
    result = docker_node.cli("session", "run", missing, "--", "true")
    assert result.returncode == 125 and "cannot pull" in result.stderr, result.stderr


def test_only_admins_change_images(docker_node: Node, registry: str) -> None:
    user = docker_node.json("keypair", "create", "--user", "no-images")
    denied = docker_node.cli("image", "pull", registry, as_keypair=user)
    assert denied.returncode != 0 and "admin" in denied.stderr
    assert BUSYBOX_IMAGE in [i["name"] for i in docker_node.json("image", "ls", as_keypair=user)]
