"""Live statistics end to end with real Docker: what a kernel uses reaches `bai session info`, the
GraphQL API and the official client, and destroying a session answers its final statistics."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.nodeproc import Node, stop_removing_containers
from tests.test_official_client import Official, official_client

MiB = 1024 * 1024
BURN = "python3 -c 'while True: pass'"
HOLD = "python3 -c 'import time; x = b\"x\" * (220 * 1024 * 1024); time.sleep(600)'"


@pytest.fixture(scope="module")
def stats_node(tmp_path_factory, python_image: str) -> Iterator[Node]:
    node = Node(tmp_path_factory.mktemp("stats"), "docker", agent_config="stat_interval = 0.5\n").start()
    try:
        yield node
    finally:
        stop_removing_containers(node)


def _usage_until(node: Node, name: str, ok, timeout: float = 30.0) -> dict:
    """The session's usage once `ok(usage)` holds (the last one seen, for the assertion's message)."""
    deadline = time.monotonic() + timeout
    usage: dict = {}
    while time.monotonic() < deadline:
        usage = node.json("session", "info", name).get("usage") or {}
        if usage and ok(usage):
            return usage
        time.sleep(0.5)
    return usage


def test_a_cpu_burner_shows_its_cpu_and_its_final_stats(stats_node: Node, tmp_path: Path) -> None:
    stats_node.cli(
        "session", "create", "python", "--name", "burn", "--cpu", "1", "--mem", "512m",
        "--type", "batch", "--startup-command", BURN, check=True,
    )  # fmt: skip
    try:
        usage = _usage_until(stats_node, "burn", lambda u: u.get("cpuPct", 0) >= 50)
        assert usage.get("cpuPct", 0) >= 50, usage
        assert usage["cpuPct"] <= 130  # one core's limit (and some sampling jitter)
        assert usage["pids"] >= 1 and usage["cpuMs"] > 0
        info = stats_node.json("session", "info", "burn")
        main = info["kernels"][0]
        assert main["usage"]["cpuPct"] >= 1  # each kernel shows its own figures
        text = stats_node.cli("session", "info", "burn", check=True).stdout
        assert "%" in text  # used next to allocated in words
    except BaseException:
        stats_node.cli("session", "destroy", "burn")  # (a burner left running slows every later test)
        raise
    # destroy answers the final statistics in Backend.AI's shape: the official client prints them
    out = Official(official_client(), stats_node, tmp_path)("session", "rm", "-s", "burn")
    used = re.search(r"cpu_used\s+([\d,]+)(?:\.\d*)?\s+msec", out)
    assert used and int(used.group(1).replace(",", "")) > 500, out  # it burned at least half a second
    # the terminated session keeps its last statistics (Backend.AI's `lastStat`)
    ended = stats_node.json("session", "info", "burn")
    assert ended["status"] in {"TERMINATING", "TERMINATED"}
    assert float(ended["lastStat"]["cpu_used"]["current"]) > 500, ended.get("lastStat")


def test_a_200_mib_allocation_shows_as_used_memory(stats_node: Node) -> None:
    stats_node.cli(
        "session", "create", "python", "--name", "hold", "--mem", "1g",
        "--type", "batch", "--startup-command", HOLD, check=True,
    )  # fmt: skip
    try:
        usage = _usage_until(stats_node, "hold", lambda u: u.get("memBytes", 0) >= 200 * MiB)
        assert usage.get("memBytes", 0) >= 200 * MiB, usage
        assert usage["memBytes"] < 1024 * MiB
        assert usage["memPeakBytes"] >= usage["memBytes"]
    finally:
        stats_node.cli("session", "destroy", "hold")


def test_the_official_client_prints_statistics(stats_node: Node, tmp_path: Path) -> None:
    bai_client = Official(official_client(), stats_node, tmp_path)
    out = bai_client("run", "--rm", "-s", "python", "-c", "x = sum(range(10**7)); print(x)")
    assert "49999995000000" in out
    assert "Statistics" in out and "cpu_used" in out and "msec" in out, out
    assert "Error" not in out and "Traceback" not in out, out
