"""`bai watcher`: a small HTTP service beside an agent, in a process of its own.

Because it is not the agent, it still answers when the agent is stuck (stopped, deadlocked, swapping).
It reads the status the agent writes at every heartbeat (`<state dir>/agent-status.json`) and:

  GET  /status    the agent's id, pid, whether its process runs, how old its last status is (stuck when
                  older than [watcher] stale_after), drained or not, and its kernels
  POST /drain     the agent stops taking new sessions (the file `<state dir>/drained`; the agent's next
                  heartbeat tells the manager, whose scheduler then skips it); running kernels go on
  POST /undrain   takes new sessions again
  POST /restart   runs [watcher] restart_command (default `systemctl restart bai-agent`; `{pid}` is the
                  agent's process id) and returns its exit status and output
  GET  /metrics   the agent's own Prometheus metrics (kernels, drained, status age, process up)

Every request needs `Authorization: Bearer <token>` ([watcher] token, or the one made at first start in
`<state dir>/watcher.token`, mode 0600); anything else is 401. Listens on 127.0.0.1:6009 by default.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import shlex
import time
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from bai.common.config import parse_hostport

log = logging.getLogger("bai.watcher")

STATE = web.AppKey("state", dict)


def watcher_token(cfg: dict[str, Any], state_dir: Path) -> str:
    if cfg["watcher"]["token"]:
        return str(cfg["watcher"]["token"])
    path = state_dir / "watcher.token"
    if path.is_file():
        return path.read_text().strip()
    token = secrets.token_urlsafe(24)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def read_status(state_dir: Path, stale_after: float) -> dict[str, Any]:
    """What the watcher knows of its agent: the agent's last status, its age, and whether it runs."""
    path = state_dir / "agent-status.json"
    try:
        status = json.loads(path.read_text())
    except (OSError, ValueError):
        status = {}
    age = time.time() - status["time"] if "time" in status else None
    pid = status.get("pid")
    running = False
    if isinstance(pid, int):
        running = _alive(pid)
    if not status:
        state = "unknown"  # the agent has not written a status yet
    elif not running:
        state = "not running"
    elif age is not None and age > stale_after:
        state = "stuck"
    else:
        state = "running"
    return {
        "state": state,
        "agent": status.get("id"),
        "pid": pid,
        "process_running": running,
        "status_age": round(age, 3) if age is not None else None,
        "drained": (state_dir / "drained").exists(),
        "kernels": status.get("kernels", []),
        "backend": status.get("backend"),
    }


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (dead, waiting for its parent to collect it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


@web.middleware
async def bearer(request: web.Request, handler: Handler) -> web.StreamResponse:
    expected = request.app[STATE]["token"]
    given = request.headers.get("Authorization", "")
    if not secrets.compare_digest(given.encode(), f"Bearer {expected}".encode()):
        return web.json_response(
            {"title": "Unauthorized", "msg": "send Authorization: Bearer <watcher token>"}, status=401
        )
    return await handler(request)


async def status(request: web.Request) -> web.Response:
    st = request.app[STATE]
    return web.json_response(read_status(st["state_dir"], st["stale_after"]))


async def drain(request: web.Request) -> web.Response:
    st = request.app[STATE]
    (st["state_dir"] / "drained").touch()
    return web.json_response(read_status(st["state_dir"], st["stale_after"]))


async def undrain(request: web.Request) -> web.Response:
    st = request.app[STATE]
    (st["state_dir"] / "drained").unlink(missing_ok=True)
    return web.json_response(read_status(st["state_dir"], st["stale_after"]))


async def restart(request: web.Request) -> web.Response:
    st = request.app[STATE]
    before = read_status(st["state_dir"], st["stale_after"])
    command = st["restart_command"].replace("{pid}", str(before["pid"] or ""))
    proc = await asyncio.create_subprocess_exec(
        *shlex.split(command), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), 120)
    except TimeoutError:
        try:
            proc.kill()
        except ProcessLookupError:
            pass  # it ended just now
        else:
            log.warning(
                "the restart command %r (pid %d) did not finish within 120 s and was killed; "
                "processes it started may be left behind",
                command,
                proc.pid,
            )
        return web.json_response({"command": command, "exit": None, "output": "timed out after 120 s"}, status=504)
    code = proc.returncode
    return web.json_response(
        {"command": command, "exit": code, "output": out.decode(errors="replace")[-2000:]},
        status=200 if code == 0 else 502,
    )


async def metrics(request: web.Request) -> web.Response:
    from prometheus_client import CollectorRegistry, Gauge, generate_latest
    from prometheus_client.exposition import CONTENT_TYPE_LATEST

    st = request.app[STATE]
    now = read_status(st["state_dir"], st["stale_after"])
    reg = CollectorRegistry()
    Gauge("bai_agent_up", "The agent's process runs", registry=reg).set(int(now["process_running"]))
    Gauge("bai_agent_stuck", "The agent's status is older than stale_after", registry=reg).set(
        int(now["state"] == "stuck")
    )
    Gauge("bai_agent_drained", "The agent takes no new sessions", registry=reg).set(int(now["drained"]))
    Gauge("bai_agent_kernels", "Kernels on the agent", registry=reg).set(len(now["kernels"]))
    Gauge("bai_agent_status_age_seconds", "Age of the agent's last status", registry=reg).set(
        now["status_age"] if now["status_age"] is not None else float("nan")
    )
    return web.Response(body=generate_latest(reg), headers={"Content-Type": CONTENT_TYPE_LATEST})


def make_app(cfg: dict[str, Any], state_dir: Path, token: str) -> web.Application:
    app = web.Application(middlewares=[bearer])
    app[STATE] = {
        "state_dir": state_dir,
        "token": token,
        "restart_command": str(cfg["watcher"]["restart_command"]),
        "stale_after": float(cfg["watcher"]["stale_after"]),
    }
    app.router.add_get("/status", status)
    app.router.add_post("/drain", drain)
    app.router.add_post("/undrain", undrain)
    app.router.add_post("/restart", restart)
    app.router.add_get("/metrics", metrics)
    return app


def main(cfg: dict[str, Any], state_dir: Path) -> int:
    host, port = parse_hostport(str(cfg["watcher"]["listen"]), "--listen")
    token = watcher_token(cfg, state_dir)
    where = "[watcher] token" if cfg["watcher"]["token"] else state_dir / "watcher.token"
    print(f"bai watcher for the agent in {state_dir}: http://{host}:{port} (token: {where})")
    print("ready", flush=True)
    web.run_app(make_app(cfg, state_dir, token), host=host, port=port, print=None, access_log=None)
    return 0
