"""Usage over a period: what kernels held and used, computed from what bai keeps (pure: no I/O).

What bai keeps of a kernel: its session's first start and end (`started_at`, `terminated_at`), the slots it
holds (`occupied_slots`) and its statistics (the final sample stored with it, `last_stat`, or the live one of
a running kernel: `cpu_used` milliseconds since it started, `mem` / `mem_peak` bytes, `io_*` and `net_*` bytes).

- A kernel **ran** from its session's start until its end (now, for one still running); a session that never
  ran (cancelled while pending) used nothing. Its **time in a period** is the overlap of that run with the
  period; what it was **allocated** in the period is its slots times that time (core-seconds, byte-seconds,
  GPU-seconds).
- What it **used** is known for its whole run only (a sample is a total since the start): the Backend.AI
  answers show it whole, as Backend.AI does; bai's own rows (`Totals`) count the share of it that falls in the
  period, in proportion to the time (the whole of it for a kernel that ran inside the period).
- Periods: a month `YYYYMM`, days `YYYYMMDD`..`YYYYMMDD` (both days included, at most `MAX_DAYS`), in UTC.
- The 15-minute **buckets** of Backend.AI's monthly stats: `BUCKETS` windows of `BUCKET_SECONDS` ending now; a
  kernel counts in every window its run touches.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from bai.common import gpus
from bai.common.problems import Problem, invalid

MAX_DAYS = 100  # Backend.AI's limit on a period
BUCKET_SECONDS = 900  # 15 minutes
BUCKETS = 2880  # 30 days of them

_MONTH = re.compile(r"^(\d{4})(\d{2})$")
_DAY = re.compile(r"^(\d{4})-?(\d{2})-?(\d{2})$")


@dataclass(frozen=True)
class Period:
    """[start, end) in UTC, and how it was asked for."""

    start: datetime
    end: datetime
    label: str

    @property
    def seconds(self) -> float:
        return (self.end - self.start).total_seconds()


def month_period(text: Any, what: str = "month") -> Period:
    """The month `YYYYMM` (e.g. 202612) as a period; a 400 that says so otherwise."""
    m = _MONTH.match(text) if isinstance(text, str) else None
    if m is None:
        raise invalid(f"{what} must be a month as YYYYMM (e.g. 202612), not {text!r}")
    year, month = int(m[1]), int(m[2])
    if not 1 <= month <= 12:
        raise invalid(f"{what} {text!r} is no month: YYYYMM, the month 01 to 12")
    if not 1970 <= year < 9999:
        raise invalid(f"{what} {text!r} is not between 1970 and 9998")
    start = datetime(year, month, 1, tzinfo=UTC)
    end = datetime(year + (month == 12), month % 12 + 1, 1, tzinfo=UTC)
    return Period(start, end, text)


def _day(text: Any, what: str) -> datetime:
    m = _DAY.match(text) if isinstance(text, str) else None
    if m is None:
        raise invalid(f"{what} must be a date as YYYYMMDD (e.g. 20261201), not {text!r}")
    try:
        day = datetime(int(m[1]), int(m[2]), int(m[3]), tzinfo=UTC)
    except ValueError:
        raise invalid(f"{what} {text!r} is no date (YYYYMMDD)") from None
    if not 1970 <= day.year < 9999:
        raise invalid(f"{what} {text!r} is not between 1970 and 9998")
    return day


def days_period(start_date: Any, end_date: Any, max_days: int = MAX_DAYS) -> Period:
    """From the day `start_date` to the day `end_date`, both included (as Backend.AI's usage per period): a 400
    when either is no date, the end comes before the start, or it spans more than `max_days` days."""
    start = _day(start_date, "start_date")
    end = _day(end_date, "end_date") + timedelta(days=1)
    if end <= start:
        raise invalid(f"end_date {end_date} is before start_date {start_date}: the end must not come first")
    if end - start > timedelta(days=max_days):
        raise invalid(f"a period is at most {max_days} days ({start_date} to {end_date} is {(end - start).days})")
    return Period(start, end, f"{start:%Y%m%d}..{end - timedelta(days=1):%Y%m%d}")


def period_of(text: Any) -> Period:
    """bai's `period`: a month `YYYYMM`, or `START..END` of days (YYYYMMDD or YYYY-MM-DD, both included)."""
    if isinstance(text, str) and ".." in text:
        start, _, end = text.partition("..")
        return days_period(start.strip(), end.strip())
    if isinstance(text, str) and _MONTH.match(text):
        return month_period(text, "period")
    raise invalid(f"period must be a month YYYYMM or days START..END (YYYYMMDD..YYYYMMDD), not {text!r}")


def last_days(now: datetime, days: int = 30) -> Period:
    start = now - timedelta(days=days)
    return Period(start, now, f"last {days} days")


def overlap(start: datetime, end: datetime, period: Period) -> float:
    """Seconds of [start, end) inside the period (0 when they do not meet)."""
    return max(0.0, (min(end, period.end) - max(start, period.start)).total_seconds())


# -- a kernel's usage ---------------------------------------------------------------------------------------


def _amount(slots: Mapping[str, Any], *names: str) -> Decimal:
    total = Decimal(0)
    for name in names:
        try:
            value = Decimal(str(slots.get(name, 0)))
        except InvalidOperation:
            continue
        if value.is_finite():
            total += value
    return total


def _int(sample: Mapping[str, Any] | None, key: str) -> int:
    value = (sample or {}).get(key)
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


def _float(sample: Mapping[str, Any] | None, key: str) -> float:
    value = (sample or {}).get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


@dataclass(frozen=True)
class KernelFacts:
    """What bai keeps of one kernel that usage is computed from (the service gathers it)."""

    kernel_id: str
    session_id: str
    session_name: str
    access_key: str
    project_id: str
    domain_name: str
    image: str
    agent_id: str | None
    container_id: str | None
    status: str
    status_info: str
    status_changed: str
    cluster_role: str
    cluster_size: int
    created_at: datetime
    started_at: datetime | None  # its session's first start (None: it never ran)
    terminated_at: datetime | None  # None: not ended
    slots: Mapping[str, Any]  # what it holds (wire form)
    sample: Mapping[str, Any] | None  # its final (or latest live) statistics sample
    mounts: tuple[str, ...] = ()
    devices: tuple[tuple[str, str], ...] = ()  # the GPUs it held: (device uuid, share)


@dataclass(frozen=True)
class KernelUsage:
    """One kernel's figures: allocation (slots), use (its sample, for its whole run), and its time in a period."""

    facts: KernelFacts
    cpu_allocated: float  # cores
    mem_allocated: int  # bytes
    gpu_allocated: float  # devices (or fractional shares)
    cpu_used_ms: float  # CPU time over its whole run, milliseconds
    mem_used: int  # memory in use at its last sample, bytes
    mem_max_used: int  # the most it used, bytes
    io_read: int
    io_write: int
    net_rx: int
    net_tx: int
    run_seconds: float  # its whole run (to now for a live one)
    seconds: float  # its run inside the period
    used_days: int | None  # calendar days (UTC) its run touched, Backend.AI's used_days; None while running
    device_types: tuple[str, ...] = ()  # the models of the GPUs it held (those the manager knows)
    gpu_mem_allocated: int = 0  # their memory, bytes (times its share of each)

    @property
    def share(self) -> float:
        """The part of its run inside the period (1.0 for a run wholly inside)."""
        return self.seconds / self.run_seconds if self.run_seconds > 0 else 1.0


def kernel_usage(
    facts: KernelFacts, period: Period, now: datetime, known_gpus: Mapping[str, tuple[str, int]] | None = None
) -> KernelUsage | None:
    """The kernel's usage in the period; None when it did not run in it (never started, or ran outside it).
    `known_gpus`: what the manager knows of GPUs, device uuid -> (model name, memory in bytes)."""
    if facts.started_at is None:
        return None
    end = facts.terminated_at or now
    start = min(facts.started_at, end)
    seconds = overlap(start, end, period)
    if seconds <= 0 and not (start == end and period.start <= start < period.end):
        return None
    sample = facts.sample
    mem = _int(sample, "mem")
    used_days = None
    if facts.terminated_at is not None:
        used_days = end.date().toordinal() - start.date().toordinal() + 1
    models: set[str] = set()
    gpu_mem = Decimal(0)
    for device, share in facts.devices:
        model, memory = (known_gpus or {}).get(device, ("", 0))
        if model:
            models.add(model)
        gpu_mem += memory * _amount({"share": share}, "share")
    return KernelUsage(
        facts=facts,
        cpu_allocated=float(_amount(facts.slots, "cpu")),
        mem_allocated=int(_amount(facts.slots, "mem")),
        gpu_allocated=float(_amount(facts.slots, gpus.DEVICE, gpus.SHARES, "cuda.devices")),
        cpu_used_ms=_float(sample, "cpu_used"),
        mem_used=mem,
        mem_max_used=max(mem, _int(sample, "mem_peak")),
        io_read=_int(sample, "io_read"),
        io_write=_int(sample, "io_write"),
        net_rx=_int(sample, "net_rx"),
        net_tx=_int(sample, "net_tx"),
        run_seconds=(end - start).total_seconds(),
        seconds=seconds,
        used_days=used_days,
        device_types=tuple(sorted(models)),
        gpu_mem_allocated=int(gpu_mem),
    )


# -- sums -----------------------------------------------------------------------------------------------------


@dataclass
class Totals:
    """What kernels held and used in a period, summed (bai's own rows): allocations times time in the period, use
    in proportion to the part of each run inside it."""

    sessions: set[str] = field(default_factory=set)
    kernels: int = 0
    seconds: float = 0.0  # kernel-seconds in the period
    cpu_seconds: float = 0.0  # core-seconds allocated
    mem_byte_seconds: float = 0.0
    gpu_seconds: float = 0.0
    cpu_used_ms: float = 0.0
    mem_max_used: int = 0  # the most one kernel used
    io_read: int = 0
    io_write: int = 0

    def add(self, u: KernelUsage) -> None:
        share = u.share
        self.sessions.add(u.facts.session_id)
        self.kernels += 1
        self.seconds += u.seconds
        self.cpu_seconds += u.cpu_allocated * u.seconds
        self.mem_byte_seconds += u.mem_allocated * u.seconds
        self.gpu_seconds += u.gpu_allocated * u.seconds
        self.cpu_used_ms += u.cpu_used_ms * share
        self.mem_max_used = max(self.mem_max_used, u.mem_max_used)
        self.io_read += round(u.io_read * share)
        self.io_write += round(u.io_write * share)


def totals_by(usages: Iterable[KernelUsage], key: Callable[[KernelUsage], str]) -> dict[str, Totals]:
    """The usages summed per key (keypair, user, project …), keys in the order first seen."""
    out: dict[str, Totals] = {}
    for u in usages:
        out.setdefault(key(u), Totals()).add(u)
    return out


@dataclass
class Bucket:
    """One 15-minute window of Backend.AI's monthly stats: the kernels whose run touched it, summed."""

    start: float  # seconds since the epoch
    num_sessions: int = 0
    cpu_allocated: float = 0.0
    mem_allocated: int = 0
    gpu_allocated: float = 0.0
    io_read_bytes: int = 0
    io_write_bytes: int = 0
    disk_used: int = 0


def buckets(
    usages: Iterable[KernelUsage], now: datetime, window: int = BUCKET_SECONDS, count: int = BUCKETS
) -> list[Bucket]:
    """`count` windows of `window` seconds ending at `now`, each with the kernels that ran in it (Backend.AI's
    `get_time_binned_monthly_stats`: a kernel in every window from the one its run starts in to the one it ends
    in, with its allocation and its io figures)."""
    first = now.timestamp() - window * count
    out = [Bucket(first + i * window) for i in range(count)]
    for u in usages:
        if u.facts.started_at is None:
            continue
        begin = u.facts.started_at.timestamp()
        end = (u.facts.terminated_at or now).timestamp()
        lo = max(0, int((begin - first) // window))
        hi = min(count, int((end - first) // window) + 1)
        if hi <= lo:  # (it ended before the first window)
            continue
        for b in out[lo:hi]:
            b.num_sessions += 1
            b.cpu_allocated += u.cpu_allocated
            b.mem_allocated += u.mem_allocated
            b.gpu_allocated += u.gpu_allocated
            b.io_read_bytes += u.io_read
            b.io_write_bytes += u.io_write
    return out


def check_uuid(value: Any, what: str) -> str:
    """A project (group) id as Backend.AI takes it: a UUID; a 400 that says so otherwise."""
    import uuid

    if not isinstance(value, str):
        raise invalid(f"{what} must be a project id (a UUID), not {value!r}")
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise invalid(f"{what} must be a project id (a UUID), not {value!r}") from None


def forbidden(msg: str) -> Problem:
    return Problem("insufficient-privilege", "Insufficient privilege.", msg)
