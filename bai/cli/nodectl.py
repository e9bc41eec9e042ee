"""`bai node status` and `bai node stop`: the node of a state folder, found by its `node.json`
(bai/common/nodefile.py)."""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bai.cli.common import fail


def state_dir_for(flag: str | None) -> Path:
    """The state folder meant: --state-dir, else BAI_STATE_DIR, else the configuration's, else the default."""
    from bai.common.config import ConfigError, data_dir, load

    chosen = flag or os.environ.get("BAI_STATE_DIR")
    if not chosen:
        try:
            cfg, _ = load()
        except ConfigError as e:
            fail(str(e), code=2)
        chosen = cfg["node"]["state_dir"] or str(data_dir())
    return Path(chosen).expanduser().resolve()


def uptime_text(started: str, now: datetime | None = None) -> str:
    """How long since `started` (ISO time), e.g. 2h 05m, 3m 12s, 40s."""
    try:
        since = datetime.fromisoformat(started)
    except ValueError:
        return "unknown"
    seconds = max(0, int(((now or datetime.now(UTC)) - since).total_seconds()))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def answers(endpoint: str, timeout: float = 2.0) -> bool:
    """Whether the API at `endpoint` answers its unsigned hello (GET /) within `timeout` seconds."""
    import urllib.error
    import urllib.request

    if not endpoint:
        return False
    try:
        with urllib.request.urlopen(endpoint.rstrip("/") + "/", timeout=timeout):
            return True
    except urllib.error.HTTPError:
        return True  # it answered
    except (OSError, ValueError):
        return False


def status(state_dir_flag: str | None, as_json: bool) -> int:
    from bai.common import nodefile

    state_dir = state_dir_for(state_dir_flag)
    info = nodefile.running(state_dir)
    if info is None:
        if as_json:
            print(json.dumps({"running": False, "state_dir": str(state_dir)}, indent=2))
        else:
            print(f"no node runs for {state_dir}")
        return 1
    up = answers(str(info.get("endpoint") or ""))
    report: dict[str, Any] = {**info, "running": True, "uptime": uptime_text(str(info.get("started", "")))}
    report["answers"] = up
    if as_json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"Node      running, pid {info['pid']} (bai {info.get('version', '?')})")
    print(f"Role      {info.get('role', '?')}")
    endpoint = info.get("endpoint") or ""
    if endpoint:
        print(f"Endpoint  {endpoint}" + ("" if up else "  (does not answer)"))
    print(f"State     {state_dir}")
    print(f"Uptime    {report['uptime']}   (since {info.get('started', '?')})")
    return 0


def stop(state_dir_flag: str | None, timeout: float) -> int:
    from bai.common import nodefile

    state_dir = state_dir_for(state_dir_flag)
    info = nodefile.running(state_dir)
    if info is None:
        fail(f"no node runs for {state_dir} (`bai node status` says so; --state-dir names another)")
    pid = int(info["pid"])
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        print(f"the node (pid {pid}) had exited already")
        return 0
    except PermissionError:
        fail(f"the node of {state_dir} (pid {pid}) belongs to another user: not allowed to stop it")
    print(f"stopping the node of {state_dir} (pid {pid})…", flush=True)
    deadline = time.monotonic() + timeout
    while nodefile.alive(pid):
        if time.monotonic() > deadline:
            fail(f"the node (pid {pid}) still runs after {timeout:g}s; `kill -9 {pid}` ends it without clean-up")
        time.sleep(0.1)
    print(f"node stopped (pid {pid})")
    return 0
