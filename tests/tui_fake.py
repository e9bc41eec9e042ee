"""A made-up cluster for the dashboard's tests: sessions and agents with live statistics, fixed in time.

`FakeClient` answers the calls the dashboard makes from these rows (no node): the stream sends one
snapshot (with `usage`) and then whatever a test puts on `events`; `get_session` adds kernels, mounts and
transitions to a row; `projects` (`GET /bai/projects`) lists four projects of the default domain, three
with sessions (ml-team, data-eng, default) and one without (vision), with what their live sessions hold
and their caps. Everything is deterministic, for pictures (tests/test_tui_tables_snapshots.py) and
pilot tests (tests/test_tui_tables.py).
"""

from __future__ import annotations

import asyncio
import copy
import zlib
from datetime import timedelta
from typing import Any

from tests.tui_support import FROZEN

GIB = 1024**3
MIB = 1024**2
KEY = "AKIATESTADMIN0000000"


def _at(**ago: float) -> str:
    return (FROZEN - timedelta(**ago)).isoformat()


def _session(name: str, status: str, *, created: float, **kw: Any) -> dict[str, Any]:
    """A dashboard row (as `SessionView.to_dashboard` plus `usage`), created `created` minutes ago."""
    row = {
        "id": f"{zlib.crc32(name.encode()):08x}-0000-4000-8000-{name.encode().hex()[:12]:0<12}",
        "name": name,
        "accessKey": KEY,
        "image": "cr.backend.ai/stable/python:3.11",
        "type": "INTERACTIVE",
        "status": status,
        "statusInfo": None,
        "statusData": None,
        "reason": None,
        "queuePosition": None,
        "agent": None,
        "kernels": [],
        "requestedSlots": {"cpu": "1", "mem": str(GIB)},
        "scalingGroup": "default",
        "project": "default",
        "creationTime": _at(minutes=created),
        "statusChanged": _at(minutes=created),
        "startedAt": None,
        "terminationTime": None,
        "exitCode": None,
        "result": "UNDEFINED",
        "servicePorts": [],
        "usage": None,
    }
    row.update(kw)
    return row


def _usage(cpu: float, mem: int, peak: int, **kw: Any) -> dict[str, Any]:
    return {
        "at": _at(seconds=2),
        "cpuPct": cpu,
        "cpuMs": 754_300,
        "memBytes": mem,
        "memPeakBytes": peak,
        "netRxBytes": 48 * MIB,
        "netTxBytes": 3 * MIB,
        "ioReadBytes": 812 * MIB,
        "ioWriteBytes": 97 * MIB,
        "pids": 14,
        **kw,
    }


def _ended(minutes_ago: float, ran: float, queued: float = 0, started: bool = True) -> dict[str, Any]:
    """Times of a session that waited `queued` seconds, ran `ran` seconds and ended `minutes_ago` minutes
    ago (`started`: it did run, so it has a `startedAt`)."""
    end = FROZEN - timedelta(minutes=minutes_ago)
    times = {
        "creationTime": (end - timedelta(seconds=ran + queued)).isoformat(),
        "statusChanged": end.isoformat(),
        "terminationTime": end.isoformat(),
    }
    if started:
        times["startedAt"] = (end - timedelta(seconds=ran)).isoformat()
    return times


def _started(created: float, queued: float) -> str:
    """`startedAt` of a session created `created` minutes ago that waited `queued` seconds."""
    return (FROZEN - timedelta(minutes=created) + timedelta(seconds=queued)).isoformat()


def sessions() -> list[dict[str, Any]]:
    return [
        _session(
            "big-sweep", "PENDING", project="ml-team", created=4, queuePosition=1, statusInfo="no-available-instances",
            reason="no-available-instances: no agent has 4 cpu free (the most free is 2 on agent-1); "
            "it waits for sessions to end",
            requestedSlots={"cpu": "4", "mem": str(8 * GIB)}, type="BATCH",
        ),
        _session(
            "after-notebook", "PENDING", project="ml-team", created=3, queuePosition=2,
            statusInfo="predicate-checks-failed",
            reason="predicate-checks-failed: waiting for its dependency notebook-ana (RUNNING) to finish",
            type="BATCH",
        ),
        _session(
            "train-resnet", "RUNNING", project="ml-team", created=42, agent="agent-1", startedAt=_started(42, 121),
            requestedSlots={"cpu": "2", "mem": str(4 * GIB), "cuda.shares": "0.5"},
            usage=_usage(187.5, int(3.6 * GIB), int(3.9 * GIB), gpuPct=71.0, gpuMemBytes=int(5.2 * GIB)),
        ),
        _session(
            "notebook-ana", "RUNNING", project="ml-team", created=30, agent="agent-2", startedAt=_started(30, 3),
            exitCode=137,
            result="FAILURE",  # its last run was killed; the session goes on
            usage=_usage(12.0, 300 * MIB, 410 * MIB),
        ),
        _session("tensorboard", "RUNNING", created=1, agent="agent-3", startedAt=_started(1, 0)),  # no sample yet
        _session(
            "lab-agent-10", "RUNNING", created=20, agent="agent-10",  # no startedAt: only its age is known
            requestedSlots={"cpu": "0.5", "mem": str(512 * MIB)}, usage=_usage(49.0, 470 * MIB, 500 * MIB),
        ),
        _session(
            "etl-nightly", "TERMINATED", project="data-eng", created=0, agent="agent-3", exitCode=0, result="SUCCESS",
            statusInfo="task-done", type="BATCH", **_ended(8, 123, queued=5),
        ),
        _session(
            "flaky-job", "TERMINATED", project="data-eng", created=0, agent="agent-1", exitCode=3, result="FAILURE",
            statusInfo="task-failed", type="BATCH", **_ended(6, 47),
        ),
        _session(
            "report-after-flaky", "CANCELLED", project="data-eng", created=0, statusInfo="dependency-failed",
            type="BATCH",
            reason="dependency-failed: session flaky-job ended with exit code 3", **_ended(6, 50, started=False),
        ),
        _session(
            "bad-image", "ERROR", created=0, agent="agent-2", statusInfo="failed-to-start",
            statusData={"error": {"name": "ImageNotFound", "repr": "ImageNotFound: bai/nope:1 is not on agent-2"}},
            reason="failed-to-start: ImageNotFound: bai/nope:1 is not on agent-2", **_ended(5, 4, started=False),
        ),
        _session(
            "stopped-by-me", "CANCELLED", created=0, statusInfo="user-requested", reason="user-requested",
            **_ended(2, 30, started=False),
        ),
    ]  # fmt: skip


# a cluster session (issue 20): three kernels on two agents, each with its own figures; in the cluster only
# when a FakeClient is made with `cluster=True` (the other pictures stay as they are)
CLUSTER_KERNELS = [  # (name, agent, status, usage)
    ("main1", "agent-1", "RUNNING", {"cpuPct": 96.0, "memBytes": int(1.4 * GIB)}),
    ("sub1", "agent-2", "RUNNING", {"cpuPct": 188.5, "memBytes": int(2.25 * GIB)}),
    ("sub2", "agent-10", "RUNNING", None),  # no sample yet
]


def cluster_session() -> dict[str, Any]:
    return _session(
        "dist-train", "RUNNING", created=12, agent="agent-1", project="ml-team",
        requestedSlots={"cpu": "6", "mem": str(6 * GIB)},  # the sum over its three kernels
        usage=_usage(284.5, int(3.65 * GIB), int(3.9 * GIB)), startedAt=_started(12, 20),
        clusterSize=3, clusterMode="multi-node",
    )  # fmt: skip


def _agent(aid: str, *, cpu: float | None, mem: int | None, held_cpu: str, held_mem: int, **kw: Any) -> dict:
    usage = None
    if cpu is not None:
        usage = {"at": _at(seconds=1), "cpuPct": cpu, "cpuCount": 8, "memBytes": mem, "memTotalBytes": 16 * GIB}
    return {
        "id": aid,
        "hostname": f"host-{aid.rsplit('-', 1)[-1]}",
        "backend": "docker",
        "version": "0.0.0",
        "scalingGroup": "default",
        "status": "ALIVE",
        "availableSlots": {"cpu": "8", "mem": str(16 * GIB)},
        "occupiedSlots": {"cpu": held_cpu, "mem": str(held_mem)},
        "firstContact": _at(hours=2),
        "lastSeen": _at(seconds=2),
        "schedulable": True,
        "gpus": [],
        "warm": {},
        "usage": usage,
        **kw,
    }


def agents() -> list[dict[str, Any]]:
    return [
        _agent("agent-1", cpu=412.0, mem=int(9.5 * GIB), held_cpu="6", held_mem=10 * GIB),
        _agent("agent-2", cpu=35.5, mem=int(2.1 * GIB), held_cpu="2", held_mem=2 * GIB),
        _agent("agent-3", cpu=None, mem=None, held_cpu="1", held_mem=GIB),  # no sample yet
        _agent("agent-10", cpu=770.0, mem=int(15.2 * GIB), held_cpu="7.5", held_mem=15 * GIB),
        _agent("agent-lost", cpu=None, mem=None, held_cpu="0", held_mem=0, status="LOST", lastSeen=_at(minutes=9)),
    ]


PROJECT_IDS = {
    name: f"{zlib.crc32(name.encode()):08x}-0000-4002-8000-000000000000"
    for name in ("default", "ml-team", "data-eng", "vision")
}


def projects() -> list[dict[str, Any]]:
    """`GET /bai/projects`: ml-team (capped: 8 cpu, 1 GPU share) holds what train-resnet and notebook-ana
    hold; data-eng (capped: 4 cpu) holds nothing now; default (no cap) what tensorboard and lab-agent-10
    hold; vision (8 whole GPUs) has no session."""

    def project(name: str, sessions: int, occupied: dict[str, str], cap: dict[str, str]) -> dict[str, Any]:
        return {
            "id": PROJECT_IDS[name],
            "name": name,
            "domain": "default",
            "description": "",
            "isActive": True,
            "totalResourceSlots": cap,
            "resourcePolicy": None,
            "createdAt": _at(days=30),
            "sessions": sessions,
            "occupied": occupied,
            "cap": cap,
        }

    return [
        project("default", 2, {"cpu": "1.5", "mem": str(GIB + 512 * MIB)}, {}),
        project(
            "ml-team", 4, {"cpu": "3", "mem": str(5 * GIB), "cuda.shares": "0.5"}, {"cpu": "8", "cuda.shares": "1"}
        ),
        project("data-eng", 0, {}, {"cpu": "4"}),
        project("vision", 0, {}, {"cuda.device": "8"}),
    ]


def detail_of(row: dict[str, Any]) -> dict[str, Any]:
    """`GET /session/{ref}` of a row: its kernels, mounts and transitions too."""
    s = copy.deepcopy(row)
    s["kernels"] = [
        {
            "id": s["id"].replace("-4000-", "-4001-"),
            "clusterRole": "main",
            "clusterIdx": 1,
            "agent": s["agent"],
            "containerId": "c0ffee" * 4 if s["agent"] else None,
            "status": s["status"],
            "exitCode": s["exitCode"],
        }
    ]
    if s.get("clusterSize", 1) > 1:
        s["kernels"] = [
            {
                "id": f"{zlib.crc32(name.encode()):08x}-0000-4001-8000-{rank:012x}",
                "name": name,
                "clusterRole": name.rstrip("0123456789"),
                "clusterIdx": int(name.lstrip("mainsub")),
                "clusterHostname": name,
                "agent": agent,
                "containerId": f"{rank:x}beef" * 4,
                "status": status,
                "exitCode": None,
                "usage": usage,
            }
            for rank, (name, agent, status, usage) in enumerate(CLUSTER_KERNELS)
        ]
    s["domain"] = "default"
    s["projectId"] = PROJECT_IDS[s["project"]]
    s["mounts"] = [{"name": "data", "target": "/home/work/data", "readOnly": True}]
    s["transitions"] = [
        {"at": s["creationTime"], "status": "PENDING", "status_info": None},
        {"at": s["statusChanged"], "status": s["status"], "status_info": s["statusInfo"]},
    ]
    return s


class EventQueue(asyncio.Queue):
    """The dashboard stream's events a test puts (`put_nowait`), and, called as the client's `events(ref)`,
    a session's lifecycle events (`GET /events/session`): those of `lifecycle`, then whatever a test puts
    on `lifecycle_more` (a name and data; None ends the stream)."""

    def __init__(self) -> None:
        super().__init__()
        self.lifecycle: list[tuple[str, dict[str, Any]]] = []
        self.lifecycle_more: asyncio.Queue[tuple[str, dict[str, Any]] | None] = asyncio.Queue()
        self.asked: list[str | None] = []

    async def __call__(self, ref: str | None = None, until_end: bool = True):
        self.asked.append(ref)
        for item in self.lifecycle:
            yield item
        while (item := await self.lifecycle_more.get()) is not None:
            yield item


class FakeClient:
    """The calls the dashboard makes, answered from `sessions()` and `agents()`."""

    endpoint = "http://127.0.0.1:8091"

    def __init__(self, cluster: bool = False) -> None:
        """`cluster`: with the cluster session of three kernels (`cluster_session`) too."""
        self.sessions = {s["id"]: s for s in sessions() + ([cluster_session()] if cluster else [])}
        self.agents = agents()
        self.logs: dict[tuple[str | None, str | None], list[tuple[str, dict[str, Any]]]] = {}  # stream events
        self.events = EventQueue()
        self.log_streams: list[tuple[str | None, str | None]] = []  # (session, kernel) of each logs stream
        self.projects_asked = 0  # how many times `projects` was called

    def by_name(self, name: str) -> dict[str, Any]:
        return next(s for s in self.sessions.values() if s["name"] == name)

    async def dashboard_events(self, topics: str = "sessions,agents", session: str | None = None, **kw):
        if topics == "logs":
            self.log_streams.append((session, kw.get("kernel")))
            for item in self.logs.get((session, kw.get("kernel")), []):
                yield item
            await asyncio.Event().wait()
        yield "snapshot", {"now": FROZEN.isoformat(), "sessions": copy.deepcopy(list(self.sessions.values())),
                           "agents": copy.deepcopy(self.agents)}  # fmt: skip
        while True:
            yield await self.events.get()

    async def get_session(self, ref: str) -> dict[str, Any]:
        return detail_of(self.sessions[ref])

    async def projects(self, domain: str | None = None) -> list[dict[str, Any]]:
        """The header's `GET /bai/projects` (`projects()`)."""
        self.projects_asked += 1
        return [p for p in projects() if domain is None or p["domain"] == domain]

    async def request(self, method: str, path: str, **kw: Any) -> Any:
        """The header's `/bai/quota`: a keypair with a policy of 3 sessions, 8 cpu and 16 GiB."""
        if path == "/bai/projects":
            return {"items": await self.projects()}
        if path != "/bai/quota":
            raise AssertionError(f"the fake client does not answer {method} {path}")
        return {
            "accessKey": "AKIAFAKEUSER00000XYZ",
            "resourcePolicy": "default",
            "maxConcurrentSessions": 3,
            "concurrentSessions": 2,
            "totalResourceSlots": {"cpu": "8", "mem": str(16 * 2**30)},
            "defaultForUnspecified": "UNLIMITED",
            "occupiedSlots": {"cpu": "3", "mem": str(3 * 2**30)},
        }

    async def scheduler_rounds(self, limit: int = 20, before: int | None = None) -> dict[str, Any]:
        """`GET /bai/scheduler/rounds`: three rounds, the newest first."""
        rows = [
            {"round": 1042 - n, "at": _at(minutes=3 * n), "digest": f"{n}3fa9c0de12b4" * 4, "pending": 5 - n,
             "placed": 1, "waiting": 4 - n, "cancelled": 0, "preempted": 1 if n == 2 else 0}
            for n in range(3)
        ]  # fmt: skip
        return {"rounds": rows[:limit]}

    async def replay_round(self, number: int) -> dict[str, Any]:
        """`GET /bai/scheduler/rounds/{number}`: a round that today's scheduler decides as it did, since which
        the cluster changed."""
        return {
            "round": number, "at": _at(minutes=6), "digest": "03fa9c0de12b4" * 4, "pending": 3, "placed": 1,
            "waiting": 1, "cancelled": 0, "preempted": 1, "reproduced": True, "differences": [],
            "decisions": [
                "train-resnet: placed on agent-1",
                "big-sweep: waited (no agent has room: best is agent-2 with cpu 2 free of 4 requested)",
                "low-batch: preempted for train-resnet",
            ],
            "changes": ["time: 6 min later", "pending: -1 started or ended (train-resnet)",
                        "agent agent-3 joined"],
            "now": ["train-resnet: no longer pending (was placed on agent-1)",
                    "big-sweep: waited (no agent has room: best is agent-2 …) → placed on agent-3"],
            "nowDigest": "77aa" * 16,
        }  # fmt: skip

    async def fair_share(self) -> dict[str, Any]:
        """`GET /bai/scheduler/fair-share`: a heavy keypair, a light one that waits, one with no usage yet; two
        projects."""
        keypair = [
            ("AKIAFAKEHEAVY0000001", "heavy@lab.example", 512_000.0, 0.8, 0.0625, 4),
            ("AKIAFAKEUSER00000XYZ", "me@lab.example", 128_000.0, 0.2, 0.5, 2),
            ("AKIAFAKENEW000000003", None, 0.0, 0.0, 1.0, 1),
        ]
        project = [
            ("5b0c3f2e-9d7a-4e61-8f00-111111111111", "vision", 560_000.0, 0.875, 0.2726, 5),
            ("5b0c3f2e-9d7a-4e61-8f00-222222222222", "nlp-team", 80_000.0, 0.125, 0.8409, 2),
        ]
        keys = ("usage", "part", "factor", "waiting")
        return {
            "asOf": _at(),
            "halfLifeSeconds": 7 * 86400,
            "gpuWeight": 10.0,
            "compared": {"keypairs": 3, "projects": 2},
            "keypairs": [dict(zip(("accessKey", "user", *keys), r, strict=True)) for r in keypair],
            "projects": [dict(zip(("projectId", "name", *keys), r, strict=True)) for r in project],
        }

    async def history(self, ref: str) -> dict[str, Any]:
        s = self.sessions[ref]
        return {"name": s["name"], "sessionId": s["id"], "status": s["status"], "history": [], "transitions": []}
