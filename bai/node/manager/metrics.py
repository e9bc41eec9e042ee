"""Prometheus metrics of the manager, `GET /metrics` (text format from prometheus-client; unsigned, like
any scrape target: keep the API on a private address or behind TLS and a firewall).

Read at scrape time from the store: sessions by status, the pending queue's length, agents by status,
slot capacity and use over live agents. Observed as they happen: how long sessions waited from enqueue
to being scheduled (a histogram), and scheduling rounds.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from bai.common import slots as slotlib
from bai.common.status import SessionStatus

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600)


class ManagerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.sessions = Gauge("bai_sessions", "Sessions by status", ["status"], registry=r)
        self.queue = Gauge("bai_pending_sessions", "Sessions waiting to be scheduled", registry=r)
        self.agents = Gauge("bai_agents", "Agents by status", ["status"], registry=r)
        self.capacity = Gauge("bai_slot_capacity", "Slots offered by live agents", ["slot"], registry=r)
        self.used = Gauge("bai_slot_used", "Slots held by kernels on live agents", ["slot"], registry=r)
        self.wait = Histogram(
            "bai_scheduling_latency_seconds",
            "Time from enqueue to scheduled",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.rounds = Counter("bai_scheduling_rounds", "Scheduling rounds applied", registry=r)
        self.placed = Counter("bai_sessions_scheduled", "Sessions placed on agents", registry=r)

    def scheduled(self, waited: list[float]) -> None:
        self.rounds.inc()
        for seconds in waited:
            self.wait.observe(max(0.0, seconds))
        self.placed.inc(len(waited))

    async def refresh(self, registry: Any) -> None:
        """Set the gauges from the store (a few reads)."""
        from bai.node.manager.represent import agent_items

        counts = await registry.store.count_sessions_by_status()
        for status in SessionStatus:
            self.sessions.labels(status.value).set(counts.get(status.value, 0))
        self.queue.set(counts.get(SessionStatus.PENDING.value, 0))
        agents = await agent_items(registry)
        by_status: dict[str, int] = {"ALIVE": 0, "LOST": 0, "TERMINATED": 0}
        cap: dict[str, Decimal] = {}
        used: dict[str, Decimal] = {}
        for a in agents:
            by_status[a["status"]] = by_status.get(a["status"], 0) + 1
            if a["status"] == "ALIVE":
                cap = slotlib.add(cap, slotlib.from_wire(a["availableSlots"]))
                used = slotlib.add(used, slotlib.from_wire(a["occupiedSlots"]))
        for status, n in by_status.items():
            self.agents.labels(status).set(n)
        for slot in set(cap) | set(used):
            self.capacity.labels(slot).set(float(cap.get(slot, 0)))
            self.used.labels(slot).set(float(used.get(slot, 0)))


async def metrics(request: web.Request) -> web.Response:
    from bai.node.manager.http import registry_of

    registry = registry_of(request)
    await registry.metrics.refresh(registry)
    body = generate_latest(registry.metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def add_metrics_routes(app: web.Application) -> None:
    app.router.add_get("/metrics", metrics)
