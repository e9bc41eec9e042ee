"""Live statistics on the manager: the `StatsBook` keeps what agents sample (bai/common/stats.py), and the
pure renderings show it as Backend.AI does.

The book (in memory; nothing here does I/O) keeps, per kernel of a live session, its last sample, a short
history (a ring of `[manager] stat_history` samples), its peaks and, while some resource policy asks for
idle detection by utilisation, a coarse trail of its CPU and GPU utilisation (`Trail`: buckets of about 10
seconds, as long as the longest `idle_window`); per agent, its host's last node sample. A kernel is learnt
(`bind`: its session and owner) the first time a sample of it arrives, and forgotten when its session ends
(`forget`), after its final sample was taken (`final`) to be stored as the kernel's `last_stat`.

Renderings (numbers as strings, as Backend.AI sends them):
- `live_stat(sample, kernel)`: Backend.AI's kernel `live_stat` (v2 metrics: current, capacity, pct,
  unit_hint, stats.*); `last_stat(...)` the same with `"status": "terminated", "version": 2` (what
  `DELETE /session/{ref}` answers as `stats`, and the official client prints with `-s`).
- `agent_live_stat(node)`: an agent's `{"node": {...}, "devices": {...}}` in the unit hints the official
  client's AgentStatFormatter prints (bytes with a capacity, bps, pct; cpu_util special-cased).
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from bai.common.stats import node_usage_of, usage_of
from bai.node.manager.state.records import Kernel

DEFAULT_HISTORY = 150  # samples per kernel: about 5 minutes at the agents' default stat_interval (2 s)
MAX_HISTORY = 100_000
BUCKET = 10.0  # seconds of samples one trail bucket sums (idle detection by utilisation)
MAX_TRAIL = 7 * 86400.0  # the longest trail kept (a week)
ENDED_REMEMBERED = 4096  # kernels remembered as ended, so that a late sample does not bring one back


def stat_history_of(cfg: Mapping[str, Any]) -> int:
    """[manager] stat_history (samples kept per kernel); ValueError with a sentence when out of range."""
    value = cfg["manager"].get("stat_history", DEFAULT_HISTORY)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_HISTORY:
        raise ValueError(f"[manager] stat_history must be a whole number from 1 to {MAX_HISTORY}, got {value!r}")
    return value


def stat_interval_of(cfg: Mapping[str, Any]) -> float:
    """The agents' [agent] stat_interval (seconds between samples; 2 unless set)."""
    value = cfg.get("agent", {}).get("stat_interval", 2.0)
    try:
        value = float(value)
    except (TypeError, ValueError):
        return 2.0
    return value if math.isfinite(value) and value > 0 else 2.0


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def clean_sample(sample: Any) -> dict[str, Any] | None:
    """A kernel (or node) sample as the book keeps it: a mapping with a finite `at`; None otherwise."""
    if not isinstance(sample, dict) or _number(sample.get("at")) is None:
        return None
    return sample


def gpu_util(sample: Mapping[str, Any]) -> float | None:
    """The mean utilisation of a sample's GPUs (None without GPUs)."""
    gpus = [g for g in (sample.get("gpus") or {}).values() if isinstance(g, dict)]
    values = [v for v in (_number(g.get("util")) for g in gpus) if v is not None]
    return sum(values) / len(values) if values else None


# -- the utilisation trail (idle detection) ----------------------------------------------------------------


@dataclass
class Trail:
    """A kernel's CPU and GPU utilisation since `since` (when its trail began), in buckets of about
    BUCKET seconds: [first at, last at, cpu sum, cpu samples, gpu sum, gpu samples]."""

    since: float
    buckets: deque[list[float]] = field(default_factory=deque)

    @property
    def last(self) -> float:
        return self.buckets[-1][1] if self.buckets else self.since

    def add(self, at: float, cpu: float | None, gpu: float | None, keep: float) -> None:
        b = self.buckets[-1] if self.buckets else None
        if b is None or at - b[0] >= BUCKET or at < b[1]:
            b = [at, at, 0.0, 0, 0.0, 0]
            self.buckets.append(b)
        b[1] = at
        if cpu is not None:
            b[2] += cpu
            b[3] += 1
        if gpu is not None:
            b[4] += gpu
            b[5] += 1
        while self.buckets[0][1] < at - keep - BUCKET:
            self.buckets.popleft()

    def longest_gap(self, start: float, now: float) -> float:
        """The longest stretch of time between `start` and `now` without a sample (the whole of it when the
        trail began after `start`); gaps inside a bucket (under BUCKET seconds) are not seen."""
        if self.since > start:
            return now - start
        gap, after = 0.0, now  # `after`: the time of the next sample (now, for the newest)
        for b in reversed(self.buckets):
            if b[1] < start:
                return max(gap, after - start)
            gap = max(gap, after - b[1])
            after = b[0]
        return max(gap, after - start)

    def averages(self, start: float) -> tuple[float | None, int, float | None]:
        """Since `start` (buckets that end after it count whole): the mean CPU utilisation (percent of one
        core), how many CPU samples that is, and the mean GPU utilisation (None without GPU samples)."""
        cpu = gpu = 0.0
        n = m = 0
        for b in reversed(self.buckets):
            if b[1] < start:
                break
            cpu, n, gpu, m = cpu + b[2], n + int(b[3]), gpu + b[4], m + int(b[5])
        return (cpu / n if n else None), n, (gpu / m if m else None)


# -- the book -------------------------------------------------------------------------------------------------


@dataclass
class KernelStats:
    """What the book keeps of one kernel."""

    session_id: str
    access_key: str
    agent_id: str | None
    history: deque[dict[str, Any]]
    peak_cpu: float | None = None
    peak_mem: int | None = None
    trail: Trail | None = None
    version: int = 0  # the book's version when its last sample arrived

    @property
    def latest(self) -> dict[str, Any] | None:
        return self.history[-1] if self.history else None


class StatsBook:
    """The latest statistics of live kernels and of agents' hosts (see the module docstring)."""

    def __init__(self, history: int = DEFAULT_HISTORY, interval: float = 2.0) -> None:
        self.history = history
        self.interval = interval  # the agents' stat_interval: how often figures change
        self.kernels: dict[str, KernelStats] = {}
        self.sessions: dict[str, set[str]] = {}  # session id -> its kernels the book knows
        self.nodes: dict[str, dict[str, Any]] = {}  # agent id -> its host's last sample
        self.ended: OrderedDict[str, None] = OrderedDict()  # kernels forgotten lately
        self.trail_seconds = 0.0  # how much utilisation to keep per kernel (0: none)
        self.version = 0  # moves on with every change (the dashboard looks for changes)

    # -- what agents send --------------------------------------------------------------------------------

    def unknown(self, kernel_ids: Iterable[str]) -> list[str]:
        """Of these kernels, those the book has to learn (neither known nor lately ended)."""
        return [k for k in kernel_ids if k not in self.kernels and k not in self.ended]

    def bind(self, kernel_id: str, session_id: str, access_key: str, agent_id: str | None = None) -> None:
        """Learn a kernel of a live session (nothing for one that ended lately)."""
        if kernel_id in self.kernels or kernel_id in self.ended:
            return
        self.kernels[kernel_id] = KernelStats(session_id, access_key, agent_id, deque(maxlen=self.history))
        self.sessions.setdefault(session_id, set()).add(kernel_id)

    def mark_ended(self, kernel_id: str) -> None:
        """A kernel that is not (or no longer) live: its samples are ignored from now on."""
        self.ended[kernel_id] = None
        self.ended.move_to_end(kernel_id)
        while len(self.ended) > ENDED_REMEMBERED:
            self.ended.popitem(last=False)

    def record(self, agent_id: str, samples: Mapping[str, Any], node: Any = None) -> list[str]:
        """Samples from an agent (kernel id -> sample) and its host's; the known kernels whose sample was
        taken (unknown ones are skipped: `bind` them first)."""
        taken = []
        for kernel_id, raw in samples.items():
            kernel = self.kernels.get(kernel_id)
            sample = clean_sample(raw)
            if kernel is None or sample is None:
                continue
            self._add(kernel, sample)
            kernel.agent_id = agent_id
            taken.append(kernel_id)
        node_sample = clean_sample(node)
        if node_sample is not None:
            self.nodes[agent_id] = node_sample
        if taken or node_sample is not None:
            self.version += 1
        return taken

    def _add(self, kernel: KernelStats, sample: dict[str, Any]) -> None:
        kernel.history.append(sample)
        kernel.version = self.version + 1
        cpu = _number(sample.get("cpu_util"))
        if cpu is not None:
            kernel.peak_cpu = cpu if kernel.peak_cpu is None else max(kernel.peak_cpu, cpu)
        for key in ("mem", "mem_peak"):
            mem = _number(sample.get(key))
            if mem is not None:
                kernel.peak_mem = int(mem) if kernel.peak_mem is None else max(kernel.peak_mem, int(mem))
        if self.trail_seconds > 0:
            at = float(sample["at"])
            if kernel.trail is None:
                kernel.trail = Trail(at)
            kernel.trail.add(at, cpu, gpu_util(sample), self.trail_seconds)
        elif kernel.trail is not None:
            kernel.trail = None

    def final(self, kernel_id: str, session_id: str, access_key: str, sample: Any) -> None:
        """A kernel's last sample (taken as it was removed, or as it ended): kept as its latest until the
        session's end is stored."""
        sample = clean_sample(sample)
        if sample is None:
            return
        self.ended.pop(kernel_id, None)
        self.bind(kernel_id, session_id, access_key)
        self._add(self.kernels[kernel_id], sample)
        self.version += 1

    def forget(self, session_id: str) -> None:
        """The session ended: its kernels' figures go (their final samples were stored)."""
        for kernel_id in self.sessions.pop(session_id, ()):
            self.kernels.pop(kernel_id, None)
            self.mark_ended(kernel_id)
        self.version += 1

    def agent_left(self, agent_id: str) -> None:
        if self.nodes.pop(agent_id, None) is not None:
            self.version += 1

    def keep_utilization(self, seconds: float) -> None:
        """Keep this much utilisation per kernel for idle detection (0: none)."""
        self.trail_seconds = min(max(float(seconds), 0.0), MAX_TRAIL)

    # -- questions ---------------------------------------------------------------------------------------

    def latest(self, kernel_id: str) -> dict[str, Any] | None:
        kernel = self.kernels.get(kernel_id)
        return kernel.latest if kernel is not None else None

    def peaks(self, kernel_id: str) -> dict[str, Any]:
        """The most CPU (percent of one core) and memory (bytes) the kernel was seen using."""
        kernel = self.kernels.get(kernel_id)
        if kernel is None:
            return {}
        return {k: v for k, v in (("cpu_util", kernel.peak_cpu), ("mem", kernel.peak_mem)) if v is not None}

    def samples_of(self, kernel_id: str) -> list[dict[str, Any]]:
        """The kernel's history, oldest first."""
        kernel = self.kernels.get(kernel_id)
        return list(kernel.history) if kernel is not None else []

    def kernels_of(self, session_id: str) -> list[str]:
        return sorted(self.sessions.get(session_id, ()))

    def trails_of(self, session_id: str) -> list[Trail | None]:
        """The utilisation trails of the session's kernels (None for a kernel without one)."""
        return [self.kernels[k].trail for k in self.sessions.get(session_id, ()) if k in self.kernels]

    def session_usage(self, session_id: str) -> dict[str, Any] | None:
        return usage_of([self.latest(k) or {} for k in self.sessions.get(session_id, ())])

    def owner_of(self, session_id: str) -> str | None:
        for k in self.sessions.get(session_id, ()):
            kernel = self.kernels.get(k)
            if kernel is not None:
                return kernel.access_key
        return None

    def sessions_changed_since(self, version: int) -> set[str]:
        """Sessions one of whose kernels had a sample after the book's `version`."""
        return {k.session_id for k in self.kernels.values() if k.version > version}

    def agent_usages(self) -> dict[str, dict[str, Any]]:
        """Each agent's `usage` (agents with a node sample or a kernel sampled): its host's (node_usage_of),
        with `kernelsCpuPct` and `kernelsMemBytes`, what its kernels use, summed (one pass over kernels)."""
        sums: dict[str, list[float]] = {}
        for kernel in self.kernels.values():
            latest = kernel.latest
            if kernel.agent_id is None or latest is None:
                continue
            acc = sums.setdefault(kernel.agent_id, [0.0, 0])
            acc[0] += _number(latest.get("cpu_util")) or 0.0
            acc[1] += int(_number(latest.get("mem")) or 0)
        out = {}
        for agent_id in set(self.nodes) | set(sums):
            usage = dict(node_usage_of(self.nodes.get(agent_id)) or {})
            cpu, mem = sums.get(agent_id, (0.0, 0))
            usage["kernelsCpuPct"] = round(cpu, 1)
            usage["kernelsMemBytes"] = int(mem)
            out[agent_id] = usage
        return out

    def agent_usage(self, agent_id: str) -> dict[str, Any] | None:
        """One agent's `usage` (see agent_usages); None before any sample."""
        return self.agent_usages().get(agent_id)


# -- renderings (pure) ----------------------------------------------------------------------------------------


def _text(value: Any) -> str | None:
    """A figure as Backend.AI writes it: a string, whole numbers without a fraction, others with two places."""
    if value is None:
        return None
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, int):
        return str(value)
    try:
        d = Decimal(str(value))
    except InvalidOperation:
        return None
    if not d.is_finite():
        return None
    if d == d.to_integral_value():
        return str(int(d))
    return str(d.quantize(Decimal("0.01")))


def _pct(current: Any, capacity: Any) -> str | None:
    try:
        cap = float(capacity)
        cur = float(current)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(cap) or not math.isfinite(cur) or cap <= 0:
        return None
    return _text(round(cur / cap * 100, 2))


def _metric(current: Any, unit: str, capacity: Any = None, *, pct: Any = "auto", peak: Any = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "current": _text(current),
        "capacity": _text(capacity),
        "pct": _pct(current, capacity) if pct == "auto" else _text(pct),
        "unit_hint": unit,
    }
    if peak is not None:
        out["stats.max"] = _text(peak)
    return out


def _slot(slots: Mapping[str, Any] | None, name: str) -> float | None:
    try:
        value = float((slots or {}).get(name))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def live_stat(
    sample: Mapping[str, Any] | None, slots: Mapping[str, Any] | None = None, peaks: Mapping[str, Any] | None = None
) -> dict[str, Any] | None:
    """Backend.AI's kernel `live_stat` (v2 metrics) of a sample; `slots`: what the kernel was allocated
    (its capacities); `peaks`: the most it was seen using (`stats.max`). None without a sample.

    cpu_util: current and pct are percent of one core (as Backend.AI's: 200 = two cores busy), capacity
    the cores allocated x 100; mem: bytes, capacity the memory allocated, stats.max the peak."""
    if not sample:
        return None
    peaks = peaks or {}
    out: dict[str, Any] = {}
    cpu = _number(sample.get("cpu_util"))
    if cpu is not None:
        cores = _slot(slots, "cpu")
        peak = max(cpu, _number(peaks.get("cpu_util")) or 0.0, _number(sample.get("cpu_util_max")) or 0.0)
        out["cpu_util"] = _metric(cpu, "percent", cores * 100 if cores else None, pct=cpu, peak=peak)
    used = _number(sample.get("cpu_used"))
    if used is not None:
        out["cpu_used"] = _metric(used, "msec", pct=None, peak=used)
    mem = _number(sample.get("mem"))
    if mem is not None:
        peak_mem = max(int(mem), int(_number(sample.get("mem_peak")) or 0), int(_number(peaks.get("mem")) or 0))
        out["mem"] = _metric(int(mem), "bytes", _slot(slots, "mem"), peak=peak_mem)
    for key in ("io_read", "io_write", "net_rx", "net_tx"):
        value = _number(sample.get(key))
        if value is not None:
            out[key] = _metric(int(value), "bytes", pct=None, peak=int(value))
    gpus = [g for g in (sample.get("gpus") or {}).values() if isinstance(g, dict)]
    if gpus:
        util = gpu_util(sample) or 0.0
        out["cuda_util"] = _metric(util, "percent", 100, pct=util, peak=util)
        mem_used = sum(int(_number(g.get("mem")) or 0) for g in gpus)
        total = sum(int(_number(g.get("mem_total")) or 0) for g in gpus) or None
        out["cuda_mem"] = _metric(mem_used, "bytes", total, peak=mem_used)
    return out


def last_stat(
    sample: Mapping[str, Any] | None, slots: Mapping[str, Any] | None = None, peaks: Mapping[str, Any] | None = None
) -> dict[str, Any] | None:
    """A kernel's final statistics as Backend.AI stores them (`last_stat`) and its destroy answers them:
    `live_stat` with "status": "terminated", "version": 2."""
    live = live_stat(sample, slots, peaks)
    if live is None:
        return None
    return {"status": "terminated", "version": 2, **live}


def with_peaks(sample: Mapping[str, Any], peaks: Mapping[str, Any]) -> dict[str, Any]:
    """A final sample to store, with the kernel's peaks in it (cpu_util_max; mem_peak at least the peak)."""
    out = dict(sample)
    if peaks.get("cpu_util") is not None:
        out["cpu_util_max"] = max(float(peaks["cpu_util"]), _number(out.get("cpu_util_max")) or 0.0)
    if peaks.get("mem") is not None:
        out["mem_peak"] = max(int(peaks["mem"]), int(_number(out.get("mem_peak")) or 0))
    return out


def stored_stat(kernel: Kernel) -> dict[str, Any] | None:
    """The final sample stored with a kernel (its `last_stat`), None when there is none."""
    raw = kernel.last_stat
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return clean_sample(value)


def agent_live_stat(node: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """An agent's `live_stat` from its host's node sample: {"node": {...}, "devices": {...}}, in the unit
    hints the official client's AgentStatFormatter prints. None without a sample."""
    if not node:
        return None
    count = int(_number(node.get("cpu_count")) or 0)
    per_core = [v for v in (_number(c) for c in node.get("cpu_per_core") or []) if v is not None]
    if not count:
        count = len(per_core) or 1
    cpu = _number(node.get("cpu_util")) or 0.0
    mem = int(_number(node.get("mem")) or 0)
    mem_total = int(_number(node.get("mem_total")) or 0)
    out_node: dict[str, Any] = {
        "cpu_util": _metric(cpu, "percent", count * 100, pct=cpu),
        "mem": _metric(mem, "bytes", mem_total),
        "net_rx": _metric(_number(node.get("net_rx")) or 0, "bps", pct=None),
        "net_tx": _metric(_number(node.get("net_tx")) or 0, "bps", pct=None),
    }
    cores = per_core or [cpu / count] * count
    devices: dict[str, Any] = {
        "cpu_util": {str(i): _metric(v, "pct", 100, pct=v) for i, v in enumerate(cores)},
        "mem": {"root": _metric(mem, "bytes", mem_total)},
    }
    gpus = {u: g for u, g in (node.get("gpus") or {}).items() if isinstance(g, dict)}
    if gpus:
        util = sum(_number(g.get("util")) or 0.0 for g in gpus.values()) / len(gpus)
        used = sum(int(_number(g.get("mem")) or 0) for g in gpus.values())
        total = sum(int(_number(g.get("mem_total")) or 0) for g in gpus.values())
        out_node["cuda_util"] = _metric(util, "pct", 100, pct=util)
        out_node["cuda_mem"] = _metric(used, "bytes", total)
        devices["cuda_util"] = {
            u: _metric(_number(g.get("util")) or 0, "pct", 100, pct=g.get("util")) for u, g in gpus.items()
        }
        devices["cuda_mem"] = {
            u: _metric(int(_number(g.get("mem")) or 0), "bytes", int(_number(g.get("mem_total")) or 0))
            for u, g in gpus.items()
        }
    return {"node": out_node, "devices": devices}
