"""Live statistics: what a kernel (and an agent's host) uses, in one shape for every part of bai.

Agents sample every running kernel each `[agent] stat_interval` seconds (default 2) and send the samples
to the manager with the `KernelStats` event; the manager keeps the last sample and a short history per
kernel and shows them.

A **kernel sample** (the wire; plain values; a key is absent when the backend cannot measure it):
    at          float  seconds since the epoch when it was taken
    cpu_util    float  CPU utilisation over the last interval, percent of ONE core (200.0 = two cores busy)
    cpu_used    float  CPU time used since the kernel started, milliseconds
    mem         int    memory in use now, bytes (cgroup memory.current less inactive file cache)
    mem_peak    int    the most memory it has used, bytes
    net_rx      int    bytes received since it started (0 for a kernel without a network)
    net_tx      int    bytes sent since it started
    io_read     int    bytes read from block devices since it started
    io_write    int    bytes written to block devices since it started
    pids        int    processes and threads now
    gpus        dict   device uuid -> {"util": float percent, "mem": int bytes}; absent without GPUs

A **node sample** (the agent's host):
    at, cpu_util (percent of one core, summed over cores: 100 x cores when all are busy), cpu_count,
    cpu_per_core (list of percents), mem (bytes used), mem_total (bytes), net_rx/net_tx (bytes per
    second over the last interval), gpus (as above, plus "mem_total").

**`usage`** — how bai's own API (REST `GET /session`, `GET /session/{ref}`, `GET /bai/agents`, the
dashboard stream) shows the latest figures: camelCase keys that name their unit (`usage_of` turns kernel
samples into it). Sessions sum their kernels; `None` until a first sample arrived. An agent's `usage`
(`node_usage_of`) is its host's: at, cpuPct (100 per busy core), cpuCount, memBytes, memTotalBytes, and
gpuPct / gpuMemBytes / gpuMemTotalBytes with GPUs. The dashboard stream sends an event `usage`,
{"sessions": {session id: usage}, "agents": {agent id: usage}}, for the rows whose figures changed.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

# kernel sample key -> the `usage` key that shows it
USAGE_KEYS: dict[str, str] = {
    "cpu_util": "cpuPct",
    "cpu_used": "cpuMs",
    "mem": "memBytes",
    "mem_peak": "memPeakBytes",
    "net_rx": "netRxBytes",
    "net_tx": "netTxBytes",
    "io_read": "ioReadBytes",
    "io_write": "ioWriteBytes",
    "pids": "pids",
}


def usage_of(samples: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The `usage` of kernels from their latest samples: figures summed, `at` the oldest sample's time
    (ISO 8601), `gpuPct` the mean over devices and `gpuMemBytes` the sum, when there are GPUs."""
    samples = [s for s in samples if s]
    if not samples:
        return None
    out: dict[str, Any] = {"at": datetime.fromtimestamp(min(s["at"] for s in samples), UTC).isoformat()}
    for key, name in USAGE_KEYS.items():
        values = [s[key] for s in samples if s.get(key) is not None]
        if values:
            total = sum(values)
            out[name] = round(total, 1) if isinstance(total, float) else total
    gpus = [g for s in samples for g in (s.get("gpus") or {}).values()]
    if gpus:
        out["gpuPct"] = round(sum(g.get("util", 0.0) for g in gpus) / len(gpus), 1)
        out["gpuMemBytes"] = sum(g.get("mem", 0) for g in gpus)
    return out


def node_usage_of(node: dict[str, Any] | None) -> dict[str, Any] | None:
    """An agent's `usage` from its host's latest node sample."""
    if not node or "at" not in node:
        return None
    out: dict[str, Any] = {"at": datetime.fromtimestamp(node["at"], UTC).isoformat()}
    for key, name in (
        ("cpu_util", "cpuPct"),
        ("cpu_count", "cpuCount"),
        ("mem", "memBytes"),
        ("mem_total", "memTotalBytes"),
    ):
        if node.get(key) is not None:
            out[name] = round(node[key], 1) if isinstance(node[key], float) else node[key]
    gpus = list((node.get("gpus") or {}).values())
    if gpus:
        out["gpuPct"] = round(sum(g.get("util", 0.0) for g in gpus) / len(gpus), 1)
        out["gpuMemBytes"] = sum(g.get("mem", 0) for g in gpus)
        out["gpuMemTotalBytes"] = sum(g.get("mem_total", 0) for g in gpus)
    return out
