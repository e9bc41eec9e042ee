"""`--json` prints every object with camelCase keys that name their unit; keys that are data stay."""

from __future__ import annotations

import pytest

from bai.cli.jsonout import camel, keys_in_style
from tests.nodeproc import Node


def test_field_names_become_camel_case_with_units() -> None:
    policy = {"name": "p", "max_session_lifetime": 3600, "idle_timeout": 0, "idle_cpu_pct": 5.0,
              "total_resource_slots": {"cuda.shares": "1", "my_slot": "2"}, "max_vfolder_size": 0}  # fmt: skip
    assert keys_in_style(policy) == {
        "name": "p",
        "maxSessionLifetimeSeconds": 3600,
        "idleTimeoutSeconds": 0,
        "idleCpuPct": 5.0,
        "totalResourceSlots": {"cuda.shares": "1", "my_slot": "2"},  # slot names are data
        "maxVfolderSizeBytes": 0,
    }
    session = {"sessionId": "x", "environ": {"my_var": "1", "HOME": "/h"}, "kernels": [{"used_bytes": 1}]}
    assert keys_in_style(session) == {"sessionId": "x", "environ": {"my_var": "1", "HOME": "/h"},
                                      "kernels": [{"usedBytes": 1}]}  # fmt: skip
    assert camel("cuda.device") == "cuda.device" and camel("AKIA_X") == "AKIA_X" and camel("numFiles") == "numFiles"


@pytest.mark.parametrize("node", ["sim"], indirect=True)
def test_policies_and_folders_print_one_style(node: Node) -> None:
    node.cli("policy", "create", "json-style", "--idle-cpu", "5", check=True)
    (policy,) = [p for p in node.json("policy", "ls") if p["name"] == "json-style"]
    assert "maxConcurrentSessions" in policy and "maxSessionLifetimeSeconds" in policy
    assert policy["idleCpuPct"] == 5.0 and not [k for k in policy if "_" in k]
    node.cli("vfolder", "create", "json-style", check=True)
    folder = node.json("vfolder", "info", "json-style")
    assert folder["isOwner"] is True and folder["usedBytes"] == 0 and not [k for k in folder if "_" in k]
