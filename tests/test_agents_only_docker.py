"""Agents.only_docker_connected: what a create asks about the connected agents (stops at the first non-Docker one)."""

from __future__ import annotations

from typing import Any

import pytest

from bai.node.manager.services.agent_registry import AgentRecord, Agents


class FakeLink:
    def __init__(self, connected: set[str]) -> None:
        self._connected = connected

    def connected(self) -> set[str]:
        return set(self._connected)


def agents_with(connected: set[str], backends: dict[str, str]) -> Agents:
    agents = Agents.__new__(Agents)  # (only the link and the records are read)
    agents.link = FakeLink(connected)  # type: ignore[assignment]
    agents.records = {a: AgentRecord(a, backend=b) for a, b in backends.items()}
    return agents


@pytest.mark.parametrize(
    ("connected", "backends", "expected"),
    [
        (set(), {}, False),  # none connected
        ({"a"}, {"a": "docker"}, True),
        ({"a", "b"}, {"a": "docker", "b": "docker"}, True),
        ({"a", "b"}, {"a": "docker", "b": "sim"}, False),
        ({"a", "b"}, {"a": "docker"}, False),  # an agent with no record yet: not known to be Docker
        ({"a"}, {"a": "docker", "gone": "local"}, True),  # a record of an agent no longer connected: not asked
    ],
)
def test_same_answer_as_the_set_of_backends(connected: set[str], backends: dict[str, str], expected: bool) -> None:
    agents = agents_with(connected, backends)
    as_set: set[Any] = {agents.record(a).backend for a in connected}  # what was asked before
    assert agents.only_docker_connected() is expected
    assert (as_set == {"docker"}) is expected
