"""A pending session that no agent could ever hold says so in one line, naming the shortfall, in the
scheduler's reason and in `bai session info` (the request was accepted while the group had no agent;
the agent that joined later is too small). Unit tests: tests/test_scheduler_core.py."""

from __future__ import annotations

import time

from tests.nodeproc import Cluster


def test_session_info_names_the_slot_no_agent_can_hold(tmp_path) -> None:
    cluster = Cluster(tmp_path, "sim", agents=0, agent_config='cpu = "2"\nmem = "8g"\n').start()
    try:
        # no agent yet: creation refuses nothing (agents may join), the session waits
        cluster.cli("session", "create", "--name", "too-big", "--cpu", "64", "--no-wait", "sim", check=True)
        cluster.agents.append(cluster.add_agent(0).start())
        reason = ""
        for _ in range(150):
            row = cluster.json("session", "info", "too-big")
            reason = ((row.get("statusData") or {}).get("scheduler") or {}).get("msg", "")
            if reason.startswith("needs"):
                break
            time.sleep(0.1)
        assert row["status"] == "PENDING"
        assert reason == "needs cpu 64; the only agent has 2"
        shown = cluster.cli("session", "info", "too-big", check=True).stdout
        assert "needs cpu 64; the only agent has 2" in shown
    finally:
        cluster.stop()
