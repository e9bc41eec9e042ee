"""Carrying out the scheduler's preemptions (bai/node/scheduler/preemption.py decides them).

A batch session is stopped at once: PREEMPTED, its command interrupted, its kernels removed, then it waits again
(PENDING, requeued with its exit noted). An interactive session is told first: its status_info becomes
`preempting` and its status_data["preemption"] says by whom, why and when ("deadline", the scaling group's
`preemption_grace` later); it is stopped then (PREEMPTED, then TERMINATED) unless the session it made room for no
longer waits, in which case the notice is withdrawn. Both keep the note (who, why, when) in their history.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from bai.common.status import SessionStatus, StatusInfo
from bai.node.manager.services.lifecycle import SessionLifecycle
from bai.node.manager.state.records import Session
from bai.node.scheduler.snapshot import Preempt

log = logging.getLogger("bai.preemption")
DEFAULT_GRACE = 60.0  # seconds an interactive session is told before it is preempted


def preempting_for(row: Session) -> str | None:
    """The pending session a running session is being preempted for (notice given, or PREEMPTED), if any."""
    if row.status_info not in (StatusInfo.PREEMPTING, StatusInfo.PREEMPTED):
        return None
    note = row.status_data.get("preemption")
    by = note.get("by") if isinstance(note, dict) else None
    return by if isinstance(by, str) else None


class Preemptions:
    """What a scheduling round's preemptions become, and the notices given earlier (see the module)."""

    def __init__(self, lifecycle: SessionLifecycle, graces: Mapping[str, float] | None = None) -> None:
        self.lifecycle = lifecycle
        self.graces = dict(graces or {})  # per scaling group: seconds an interactive session is told first

    async def apply(
        self, decisions: Iterable[Preempt], rows: Mapping[str, Session], pending: Mapping[str, Session], now: datetime
    ) -> None:
        """Stop (batch) or tell (interactive) each session the round preempts. `rows`: the running sessions by id,
        `pending`: the pending ones by id (who they make room for)."""
        for decision in decisions:
            victim, by = rows.get(decision.session_id), pending.get(decision.by)
            if victim is None or by is None:
                continue
            note: dict[str, Any] = {
                "by": by.id,
                "byName": by.name,
                "byPriority": by.priority,
                "byAccessKey": by.access_key,
                "priority": victim.priority,
                "msg": decision.msg,
                "at": now.isoformat(),
            }
            grace = self.graces.get(victim.scaling_group, DEFAULT_GRACE)
            if victim.type == "batch" or grace <= 0:
                await self.lifecycle.preempt(victim, note)
            else:
                note["deadline"] = (now + timedelta(seconds=grace)).isoformat()
                note["msg"] += f"; it ends at {note['deadline'][:19]} UTC ({grace:g} s notice)"
                await self.lifecycle.give_notice(victim, note)

    async def settle(self, running: Iterable[Session], waiting: set[str], now: datetime) -> datetime | None:
        """The notices given: withdrawn when the session they made room for no longer waits (`waiting`: the ids of
        the pending sessions), carried out when their deadline has come. The next deadline, if any."""
        due: datetime | None = None
        for row in running:
            if row.status_info != StatusInfo.PREEMPTING or row.status not in (
                SessionStatus.RUNNING,
                SessionStatus.RUNNING_DEGRADED,
                SessionStatus.RESTARTING,
            ):
                continue
            note = row.status_data.get("preemption") or {}
            if note.get("by") not in waiting:
                await self.lifecycle.withdraw_notice(row, f"{note.get('byName', 'the session')} no longer waits")
                continue
            try:
                deadline = datetime.fromisoformat(note.get("deadline") or "")
            except ValueError:
                deadline = now
            if deadline <= now:
                await self.lifecycle.preempt(row, note)
            elif due is None or deadline < due:
                due = deadline
        return due
