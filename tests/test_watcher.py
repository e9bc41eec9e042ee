"""`bai watcher` beside a real agent process: token auth, status, drain / undrain as the scheduler sees
it, a stuck agent (SIGSTOP) reported and restarted with the configured command, and its metrics."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.nodeproc import Cluster, free_port

TOKEN = "watch-token-0123456789"


def call(port: int, method: str, path: str, token: str | None = TOKEN) -> tuple[int, dict | str]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            body = resp.read().decode()
            return resp.status, json.loads(body) if resp.headers.get_content_type() == "application/json" else body
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read().decode() or "{}")


def wait_until(check, timeout: float = 20, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return value


def test_watcher_status_drain_restart_and_metrics(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path / "c", "sim", agents=0).start()
    watcher = None
    try:
        extra = f'[watcher]\ntoken = "{TOKEN}"\nrestart_command = "kill -KILL {{pid}}"\nstale_after = 2.0\n'
        agent = cluster.add_agent(0, extra_config=extra).start()
        cluster.agents.append(agent)
        port = free_port()
        watcher = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bai",
                "watcher",
                "--listen",
                f"127.0.0.1:{port}",
                "--state-dir",
                str(agent.state_dir),
            ],
            env=agent.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert watcher.stdout is not None
        wait_until(lambda: "ready" in watcher.stdout.readline(), what="the watcher")

        assert call(port, "GET", "/status", token=None)[0] == 401
        assert call(port, "GET", "/status", token="wrong")[0] == 401
        code, st = wait_until(lambda: (r := call(port, "GET", "/status")) and r[1].get("state") == "running" and r)
        assert code == 200 and st["agent"] == agent.agent_id and st["pid"] == agent.proc.pid and not st["drained"]

        # drained: the manager's scheduler gets no new session onto it
        assert call(port, "POST", "/drain")[1]["drained"] is True
        wait_until(lambda: "drained" in cluster.cli("agent", "ls").stdout, what="the manager to see the drain")
        cluster.cli("session", "create", "sim", "--name", "while-drained", "--no-wait", check=True)
        time.sleep(1.5)
        info = cluster.json("session", "info", "while-drained")
        assert info["status"] == "PENDING" and "no schedulable agent" in info["statusData"]["scheduler"]["msg"]
        call(port, "POST", "/undrain")
        wait_until(lambda: cluster.json("session", "info", "while-drained")["status"] == "RUNNING", what="RUNNING")
        # the agent's next heartbeat writes its status with the new kernel
        wait_until(lambda: [k["session"] for k in call(port, "GET", "/status")[1]["kernels"]] == ["while-drained"])

        # stuck: stopped with SIGSTOP, it writes no status; the watcher says so and restarts it
        os.kill(agent.proc.pid, signal.SIGSTOP)
        wait_until(lambda: call(port, "GET", "/status")[1]["state"] == "stuck", timeout=15, what="stuck")
        code, done = call(port, "POST", "/restart")
        assert code == 200 and done["exit"] == 0 and done["command"] == f"kill -KILL {agent.proc.pid}"
        assert wait_until(lambda: call(port, "GET", "/status")[1]["state"] == "not running", what="not running")
        metrics = call(port, "GET", "/metrics")[1]
        assert "bai_agent_up 0.0" in metrics and "bai_agent_kernels 1.0" in metrics
    finally:
        if watcher is not None:
            watcher.terminate()
            watcher.wait(10)
        cluster.stop()
