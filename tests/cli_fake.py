"""A fake manager for CLI tests: answers the few GETs the commands under test make, from canned rows, and
records each request's path and query (what the CLI asked for)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import zlib
from collections.abc import Iterator
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

GiB = 2**30
MiB = 2**20


def session(name: str, **over: Any) -> dict[str, Any]:
    row = {
        "id": f"{zlib.crc32(name.encode()) % 10**8:08d}-a2b4-4fb5-a651-3a9d2a760e05",  # the same in every run
        "name": name,
        "image": "bai-python:3.11",
        "type": "INTERACTIVE",
        "status": "RUNNING",
        "statusInfo": "",
        "statusData": {},
        "result": "UNDEFINED",
        "creationTime": "2026-11-30T23:05:25.244407+00:00",
        "terminationTime": None,
        "requestedSlots": {"cpu": "2", "mem": str(GiB)},
        "occupiedSlots": {"cpu": "2", "mem": str(GiB)},
        "mounts": [],
        "agent": "host1",
        "exitCode": None,
        "servicePorts": [],
        "kernels": [],
        "usage": None,
        "accessKey": "AKIAEXAMPLEEXAMPLE00",
    }
    row.update(over)
    if "startedAt" not in over:  # when it first ran (the manager's startedAt): two minutes after its creation
        never_ran = row["status"] in NEVER_RAN or row["status"] == "CANCELLED"
        row["startedAt"] = None if never_ran else later(row["creationTime"], 120)
    return row


NEVER_RAN = ("PENDING", "SCHEDULED", "PREPARING", "PULLING")


def later(iso: str, seconds: float) -> str:
    return (datetime.fromisoformat(iso) + timedelta(seconds=seconds)).isoformat()


def usage(cpu: float, mem_mib: float, **more: Any) -> dict[str, Any]:
    return {
        "at": "2026-12-01T00:00:00+00:00",
        "cpuPct": cpu,
        "cpuMs": 1000.0,
        "memBytes": int(mem_mib * MiB),
        "memPeakBytes": int(mem_mib * MiB),
        "netRxBytes": 1536,
        "netTxBytes": 512,
        "ioReadBytes": 5 * MiB,
        "ioWriteBytes": 1 * MiB,
        "pids": 3,
        **more,
    }


AGENT = {
    "id": "host1",
    "hostname": "host1",
    "status": "ALIVE",
    "schedulable": True,
    "backend": "sim",
    "scalingGroup": "default",
    "availableSlots": {"cpu": "4", "mem": str(16 * GiB)},
    "occupiedSlots": {"cpu": "3", "mem": str(int(1.5 * GiB))},
    "gpus": [],
    "warm": {},
    "lastSeen": "2026-12-01T00:00:00+00:00",
    "usage": {"at": "2026-12-01T00:00:00+00:00", "cpuPct": 200.0, "cpuCount": 4, "memBytes": 2 * GiB,
              "memTotalBytes": 16 * GiB},
}  # fmt: skip


class Fake:
    def __init__(self) -> None:
        self.sessions: list[dict[str, Any]] = []
        self.agents: list[dict[str, Any]] = [AGENT]
        self.requests: list[tuple[str, dict[str, list[str]]]] = []


class JsonHandler(BaseHTTPRequestHandler):
    """A fake manager's request handler: `_answer` sends a JSON body; requests are not logged."""

    def _answer(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def _handler(fake: Fake) -> type[BaseHTTPRequestHandler]:
    class Handler(JsonHandler):
        def do_GET(self) -> None:  # noqa: N802
            parts = urlsplit(self.path)
            query = parse_qs(parts.query)
            fake.requests.append((parts.path, query))
            if parts.path == "/session":
                rows = fake.sessions
                if query.get("all") != ["true"]:
                    wanted = (query.get("status") or ["PENDING,RUNNING"])[0].upper().split(",")
                    rows = [s for s in rows if s["status"] in wanted]
                self._answer(200, {"items": rows})
            elif parts.path.startswith("/session/"):
                found = [s for s in fake.sessions if s["name"] == parts.path.rsplit("/", 1)[1]]
                if found:
                    self._answer(200, found[0])
                else:
                    self._answer(404, {"type": "https://api.backend.ai/probs/not-found", "title": "No such session."})
            elif parts.path == "/bai/agents":
                self._answer(200, {"items": fake.agents})
            else:
                self._answer(404, {"type": "https://api.backend.ai/probs/not-found", "title": "Not found."})

    return Handler


def serve(fake: Fake) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def cli_env(endpoint: str, tmp_path: Path, **more: str) -> dict[str, str]:
    keep = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("BACKEND_", "BAI_")) and k not in ("NO_COLOR", "FORCE_COLOR", "COLUMNS", "TERM")
    }
    return {
        **keep,
        "BACKEND_ENDPOINT": endpoint,
        "BACKEND_ACCESS_KEY": "AKIAEXAMPLEEXAMPLE00",
        "BACKEND_SECRET_KEY": "secret",
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "XDG_DATA_HOME": str(tmp_path / "data"),
        **more,
    }


def bai(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bai", *args], env=env, capture_output=True, text=True, timeout=60)
