"""Scheduling rounds kept for replay: each round's snapshot and decisions (bai.node.scheduler.record), the latest
`keep` of them, and what replaying one says.

A round is numbered when it is kept (one more than the last, over every manager of a PostgreSQL state); its number
is in the log line the dispatcher writes for it, in each waiting session's statusData.scheduler.round, and in the
scheduling history a session's `explain` shows. `replay(number)` runs the recorded snapshot through today's core:
whether it decides the same again (the core reproduces the past decision, or what changed in the core since), what
changed in the cluster since (the snapshot then and now) and what would be decided now instead.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from bai.common.background import Background
from bai.node.manager.domain_errors import NotFound
from bai.node.manager.state import State
from bai.node.manager.state.records import SchedulerRound
from bai.node.scheduler import record
from bai.node.scheduler.core import schedule
from bai.node.scheduler.snapshot import Decisions, Snapshot

log = logging.getLogger("bai.scheduler.rounds")
KEEP = 200  # rounds kept by default ([manager] scheduler_rounds_kept; 0: none)


def summary_of(decisions: Decisions, pending: int) -> dict[str, int]:
    return {
        "pending": pending,
        "placed": len(decisions.placements),
        "cancelled": len(decisions.cancels),
        "preempted": len(decisions.preemptions),
        "waiting": len(decisions.pending),
    }


def round_json(r: SchedulerRound) -> dict[str, Any]:
    return {"round": r.number, "at": r.at, "digest": r.digest, **r.summary}


class SchedulerRounds:
    """Keeps rounds (`record`) and replays them (`replay`)."""

    def __init__(
        self,
        store: State,
        keep: int = KEEP,
        current: Callable[[], Awaitable[Snapshot]] | None = None,
        background: Background | None = None,
    ) -> None:
        self.store = store
        self.keep = keep
        self.current = current  # the snapshot a round would take now (the dispatcher's; set once it exists)
        self.background = background or Background(log)
        self._writing: dict[int, asyncio.Task[Any]] = {}  # rounds whose record is being written here

    async def record(self, snapshot: Snapshot, decisions: Decisions, now: datetime) -> int | None:
        """Keep a round: numbered at once (its number is returned; None: rounds are not kept), its snapshot and
        decisions written in the background (encoded in a thread: a round of thousands of sessions takes a
        while, and neither the round nor the event loop waits for it)."""
        if self.keep <= 0:
            return None
        summary = summary_of(decisions, len(snapshot.pending))
        number = await self.store.add_scheduler_round(now.isoformat(), "", b"", b"", summary, self.keep)
        task = self.background.spawn(self._write(number, snapshot, decisions, summary), f"round-{number}")
        self._writing[number] = task
        task.add_done_callback(lambda _: self._writing.pop(number, None))
        return number

    async def _write(self, number: int, snapshot: Snapshot, decisions: Decisions, summary: dict[str, int]) -> None:
        try:
            data, decided, digest = await asyncio.to_thread(_encoded, snapshot, decisions)
            await self.store.fill_scheduler_round(number, digest, data, decided)
        except Exception as e:  # (a full disk, a lost database: the round was applied; its record is lost)
            log.warning("scheduling round %d not kept for replay: %s", number, e)
            return
        busy = summary["placed"] or summary["cancelled"] or summary["preempted"]
        log.log(
            logging.INFO if busy else logging.DEBUG,
            "scheduling round %d (snapshot %s): %d pending, %d placed, %d cancelled, %d preempted, %d waiting",
            number,
            digest[:16],
            *summary.values(),
        )

    async def list(self, limit: int = 20, before: int | None = None) -> list[dict[str, Any]]:
        return [round_json(r) for r in await self.store.scheduler_rounds(limit, before)]

    async def replay(self, number: int) -> dict[str, Any]:
        """Round `number` again: the recorded decisions, today's core's on the same snapshot (`reproduced`, or
        `differences`), what changed in the cluster since (`changes`) and what would be decided now (`now`; from
        `current()`, the snapshot a round would take now; nothing is applied). NotFound for a round not kept."""
        current = self.current
        if current is None:
            raise NotFound("this manager does not schedule: it cannot say what a round would decide now")
        writing = self._writing.get(number)
        if writing is not None:  # (asked for at once: its record is written first)
            await asyncio.wait([writing], timeout=30)
        kept = await self.store.scheduler_round(number)
        if kept is None:
            raise NotFound(f"scheduling round {number} is not kept (see `bai scheduler rounds`)")
        if not kept.snapshot:
            raise NotFound(f"scheduling round {number} is still being written (or could not be): try again")
        past = await asyncio.to_thread(record.decode, kept.snapshot)
        decided = await asyncio.to_thread(record.decode, kept.decisions)
        again = await asyncio.to_thread(schedule, past)
        present = await current()
        later = await asyncio.to_thread(schedule, present)
        names = {s.id: s.name for s in [*past.pending, *present.pending, *past.running, *present.running]}
        differences = record.decision_changes(decided, again, names)
        return {
            **round_json(kept),
            "decisions": _lines(decided, names),
            "reproduced": not differences,
            "differences": differences,
            "changes": record.snapshot_changes(past, present),
            "now": record.decision_changes(decided, later, names),
            "nowDigest": record.digest(present),
        }


def _encoded(snapshot: Snapshot, decisions: Decisions) -> tuple[bytes, bytes, str]:
    data, digest = record.encode_and_digest(snapshot)
    return data, record.encode(decisions), digest


def _lines(decisions: Decisions, names: dict[str, str]) -> list[str]:
    """What a round decided, a line per session: `name: placed on a1` / `waited (…)` / `cancelled (…)` /
    `preempted for NAME (…)`."""
    out = []
    for p in decisions.placements:
        out.append(f"{names.get(p.session_id, p.session_id)}: placed on {', '.join(p.agent_ids)}")
    for w in decisions.pending:
        out.append(f"{names.get(w.session_id, w.session_id)}: waited ({w.msg})")
    for c in decisions.cancels:
        out.append(f"{names.get(c.session_id, c.session_id)}: cancelled ({c.msg})")
    for x in decisions.preemptions:
        out.append(f"{names.get(x.session_id, x.session_id)}: preempted for {names.get(x.by, x.by)}")
    return out
