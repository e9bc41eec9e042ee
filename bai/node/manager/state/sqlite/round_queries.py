"""Scheduling rounds kept for replay (`scheduler_rounds`: each round's snapshot and decisions as
bai.node.scheduler.record encodes them, base64 text here, with a summary): the same queries for SQLite and
PostgreSQL."""

from __future__ import annotations

import base64
import json
import sqlite3
from typing import Any

from bai.node.manager.state.records import SchedulerRound
from bai.node.manager.state.sqlite.db import Queries


def _round(row: Any, with_data: bool) -> SchedulerRound:
    return SchedulerRound(
        number=int(row[0]),
        at=str(row[1]),
        digest=str(row[2]),
        summary=json.loads(row[3]),
        snapshot=base64.b64decode(row[4]) if with_data else b"",
        decisions=base64.b64decode(row[5]) if with_data else b"",
    )


class RoundQueries(Queries):
    async def add_scheduler_round(
        self, at: str, digest: str, snapshot: bytes, decisions: bytes, summary: dict[str, Any], keep: int
    ) -> int:
        """Store a round (its number: one more than the last) and forget all but the latest `keep`."""

        def fn(conn: sqlite3.Connection) -> int:
            row = conn.execute(
                "INSERT INTO scheduler_rounds(at, digest, snapshot, decisions, summary) VALUES (?, ?, ?, ?, ?) "
                "RETURNING number",
                (
                    at,
                    digest,
                    base64.b64encode(snapshot).decode(),
                    base64.b64encode(decisions).decode(),
                    json.dumps(summary),
                ),
            ).fetchone()
            number = int(row[0])
            conn.execute("DELETE FROM scheduler_rounds WHERE number <= ?", (number - keep,))
            return number

        return await self.db.transaction(fn)

    async def fill_scheduler_round(self, number: int, digest: str, snapshot: bytes, decisions: bytes) -> None:
        """A round's record, written once encoded (after `add_scheduler_round` numbered it)."""

        def fn(conn: sqlite3.Connection) -> None:
            conn.execute(
                "UPDATE scheduler_rounds SET digest=?, snapshot=?, decisions=? WHERE number=?",
                (digest, base64.b64encode(snapshot).decode(), base64.b64encode(decisions).decode(), number),
            )

        await self.db.transaction(fn)

    async def scheduler_rounds(self, limit: int, before: int | None = None) -> list[SchedulerRound]:
        """The latest rounds (before round `before` when given), newest first, without their data."""

        def fn(conn: sqlite3.Connection) -> list[SchedulerRound]:
            sql = "SELECT number, at, digest, summary FROM scheduler_rounds"
            params: list[Any] = []
            if before is not None:
                sql += " WHERE number < ?"
                params.append(before)
            sql += " ORDER BY number DESC LIMIT ?"
            params.append(limit)
            return [_round(r, False) for r in conn.execute(sql, params).fetchall()]

        return await self.db.run(fn)

    async def scheduler_round(self, number: int) -> SchedulerRound | None:
        """One round with its snapshot and decisions (None: not kept, or never was)."""

        def fn(conn: sqlite3.Connection) -> SchedulerRound | None:
            row = conn.execute(
                "SELECT number, at, digest, summary, snapshot, decisions FROM scheduler_rounds WHERE number=?",
                (number,),
            ).fetchone()
            return None if row is None else _round(row, True)

        return await self.db.run(fn)
