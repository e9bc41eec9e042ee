"""Prometheus metrics of the manager, served as `GET /metrics` by the API (text format from
prometheus-client; unsigned, like any scrape target: keep the API on a private address or behind TLS and
a firewall).

Set at scrape time from what the API passes in: sessions by status, the pending queue's length, agents by status,
slot capacity and use over live agents. Observed as they happen: how long sessions waited from enqueue
to being scheduled (a histogram), and scheduling rounds.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from bai.common import slots as slotlib
from bai.common.status import SessionStatus

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600)


class ManagerMetrics:
    """The manager's Prometheus collectors."""

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

    def refresh(self, session_counts: dict[str, int], agents: list[dict[str, Any]]) -> None:
        """Set the gauges: sessions by status, and the agents as the API shows them (status, slots)."""
        for status in SessionStatus:
            self.sessions.labels(status.value).set(session_counts.get(status.value, 0))
        self.queue.set(session_counts.get(SessionStatus.PENDING.value, 0))
        by_status: dict[str, int] = {"ALIVE": 0, "LOST": 0, "TERMINATED": 0}
        cap: dict[str, Decimal] = {}
        used: dict[str, Decimal] = {}
        for a in agents:
            by_status[a["status"]] = by_status.get(a["status"], 0) + 1
            if a["status"] == "ALIVE":
                cap = slotlib.add(cap, slotlib.from_wire(a["availableSlots"]))
                used = slotlib.add(used, slotlib.from_wire(a["occupiedSlots"]))
        for agent_status, n in by_status.items():
            self.agents.labels(agent_status).set(n)
        for slot in set(cap) | set(used):
            self.capacity.labels(slot).set(float(cap.get(slot, 0)))
            self.used.labels(slot).set(float(used.get(slot, 0)))


def exposition(metrics: ManagerMetrics) -> tuple[bytes, str]:
    """The gauges and counters in Prometheus's text format, and its content type."""
    return generate_latest(metrics.registry), CONTENT_TYPE_LATEST
