"""Fair share's usage: what each keypair's (and project's) sessions held over time, as GPU-weighted slot-seconds
that halve every half-life (as Slurm's decayed usage), for the multifactor policy's fair-share factor.

A session holding slots is charged per second: a core 1, a GiB of memory 0.1, a GPU (any `*.device` or `*.shares`
slot) `gpu_weight`. Each scheduling round brings every usage to `now` (decayed by 2^(-elapsed / half-life)) and
adds what the sessions that hold slots now held since the last round; the figures are stored at most every
`persist_every` seconds (and read back when the manager starts), so usage survives restarts and a new leader.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from decimal import Decimal

import msgspec

from bai.common import slots as slotlib
from bai.node.manager.state.protocols import FairShareState
from bai.node.manager.state.records import Session, stamp
from bai.node.scheduler.multifactor import fair_share_factors

MEM_WEIGHT_PER_GIB = 0.1
GIB = Decimal(1024**3)


def charge(requested: Mapping[str, str], gpu_weight: float) -> float:
    """What holding `requested` (wire form) for a second counts."""
    total = 0.0
    for slot, raw in requested.items():
        amount = Decimal(raw)
        if not amount.is_finite() or amount <= 0:
            continue
        if slot == "cpu":
            total += float(amount)
        elif slot.endswith((".device", ".shares")):
            total += float(amount) * gpu_weight
        elif slotlib.is_bytes_slot(slot):
            total += float(amount / GIB) * MEM_WEIGHT_PER_GIB
    return total


def decayed(value: float, seconds: float, half_life: float) -> float:
    if seconds <= 0 or half_life <= 0:
        return value
    return value * float(2.0 ** (-seconds / half_life))


class Standing(msgspec.Struct, frozen=True):
    """A keypair's (or project's) place in fair share, as the next round would rank it: its decayed usage (GPU-weighted
    slot-seconds), its part of the usage of all those compared (the keypairs with usage or a pending session),
    its fair-share factor 2^-(part / equal share), and how many of its sessions wait."""

    key: str
    usage: float
    part: float
    factor: float
    waiting: int = 0


def standings(usage: Mapping[str, float], waiting: Mapping[str, int]) -> list[Standing]:
    """Everyone compared (with usage, or with sessions waiting), the most used first; the factors are the
    scheduler's own (`multifactor.fair_share_factors`)."""
    compared = [k for k, n in waiting.items() if n > 0]
    factors = fair_share_factors(usage, {}, compared)
    used = {k: max(0.0, float(usage.get(k, 0.0))) for k in factors}
    total = sum(used[k] for k in sorted(used))
    rows = [Standing(k, used[k], used[k] / total if total > 0 else 0.0, factors[k], waiting.get(k, 0)) for k in factors]
    rows.sort(key=lambda r: (-r.usage, r.key))
    return rows


class Standings(msgspec.Struct, frozen=True):
    """Fair share as the next round ranks it (`FairShare.standings`): every keypair and project compared."""

    keypairs: list[Standing]
    projects: list[Standing]


class FairShare:
    def __init__(
        self, state: FairShareState, half_life: float, gpu_weight: float = 10.0, persist_every: float = 30.0
    ) -> None:
        self.state = state
        self.half_life = half_life
        self.gpu_weight = gpu_weight
        self.persist_every = persist_every
        self._usage: dict[str, float] | None = None  # key -> usage as of self._at
        self._at: datetime | None = None
        self._saved_at: datetime | None = None

    async def _load(self, now: datetime) -> dict[str, float]:
        usage: dict[str, float] = {}
        for key, (value, as_of) in (await self.state.fair_share_usage()).items():
            usage[key] = decayed(value, (now - datetime.fromisoformat(as_of)).total_seconds(), self.half_life)
        self._at = self._saved_at = now
        return usage

    async def advance(self, now: datetime, holding: Iterable[Session]) -> dict[str, float]:
        """Every key's usage at `now`, the sessions `holding` slots now charged for the time since the last call
        (keys: `keypair:ACCESS_KEY`, `project:ID`)."""
        if self._usage is None:
            self._usage = await self._load(now)
        usage = self._usage
        assert self._at is not None
        elapsed = (now - self._at).total_seconds()
        if elapsed > 0:
            for key in usage:
                usage[key] = decayed(usage[key], elapsed, self.half_life)
            middle = decayed(1.0, elapsed / 2, self.half_life)  # (held through the step: counted at its middle)
            for session in holding:
                amount = charge(session.requested_slots, self.gpu_weight) * elapsed * middle
                if amount > 0:
                    for key in (f"keypair:{session.access_key}", f"project:{session.project_id}"):
                        usage[key] = usage.get(key, 0.0) + amount
            self._at = now
        if self._saved_at is None or (now - self._saved_at).total_seconds() >= self.persist_every:
            await self.state.save_fair_share_usage({k: (v, stamp(now)) for k, v in usage.items()})
            self._saved_at = now
        return dict(usage)

    async def current(self, now: datetime) -> dict[str, float]:
        """Every key's usage at `now`, as the last round counted it (decayed since, nothing charged): this manager's
        own figures while it runs the rounds, else what the one that does stored last."""
        stored = await self.state.fair_share_usage()
        newest = max((datetime.fromisoformat(as_of) for _, as_of in stored.values()), default=None)
        if self._usage is not None and self._at is not None and (newest is None or self._at >= newest):
            elapsed = (now - self._at).total_seconds()
            return {k: decayed(v, elapsed, self.half_life) for k, v in self._usage.items()}
        return {
            k: decayed(v, (now - datetime.fromisoformat(as_of)).total_seconds(), self.half_life)
            for k, (v, as_of) in stored.items()
        }

    async def standings(self, now: datetime) -> Standings:
        """Every keypair's and project's standing at `now`: its usage as the rounds counted it (`current`), among
        those with usage or with sessions waiting."""
        usage = await self.current(now)
        by_keypair: dict[str, int] = {}
        by_project: dict[str, int] = {}
        for access_key, project_id, count in await self.state.pending_by_owner():
            by_keypair[access_key] = by_keypair.get(access_key, 0) + count
            by_project[project_id] = by_project.get(project_id, 0) + count
        return Standings(standings(self.keypairs(usage), by_keypair), standings(self.projects(usage), by_project))

    def projects(self, usage: Mapping[str, float]) -> dict[str, float]:
        """The projects' usage, by project id."""
        return {k.removeprefix("project:"): v for k, v in usage.items() if k.startswith("project:")}

    def keypairs(self, usage: Mapping[str, float]) -> dict[str, float]:
        """The keypairs' usage, by access key."""
        return {k.removeprefix("keypair:"): v for k, v in usage.items() if k.startswith("keypair:")}
