"""Session templates (the records of `state/template_records.py`, in `session_templates`): the same queries for
SQLite and PostgreSQL."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Sequence
from datetime import datetime

import msgspec

from bai.node.manager.state.records import stamp
from bai.node.manager.state.sqlite.db import Queries
from bai.node.manager.state.template_records import TEMPLATE_TYPE, NewTemplate, StoredTemplate, TaskTemplate

_COLUMNS = "id, name, created_at, user_uuid, access_key, domain_name, group_id, type, template"
_decode = msgspec.json.Decoder(TaskTemplate)


def _row(r: Sequence[object]) -> StoredTemplate:
    return StoredTemplate(
        id=str(r[0]),
        name=str(r[1]),
        created_at=str(r[2]),
        user_uuid=str(r[3]),
        access_key=str(r[4]),
        domain_name=str(r[5]),
        group_id=None if r[6] is None else str(r[6]),
        type=str(r[7]),
        template=_decode.decode(str(r[8])),
    )


class Templates(Queries):
    """Session templates: stored, listed, read, replaced and deleted by id."""

    async def create_templates(self, templates: Sequence[NewTemplate], now: datetime, limit: int) -> list[str] | None:
        """Store every template at once (their new ids, in order), or none (None) when their owner would then have
        more than `limit`."""

        def fn(conn: sqlite3.Connection) -> list[str] | None:
            owners = {t.user_uuid for t in templates}
            for owner in owners:
                (held,) = conn.execute("SELECT COUNT(*) FROM session_templates WHERE user_uuid=?", (owner,)).fetchone()
                if int(held) + sum(1 for t in templates if t.user_uuid == owner) > limit:
                    return None
            ids: list[str] = []
            for t in templates:
                tid = uuid.uuid4().hex
                conn.execute(
                    f"INSERT INTO session_templates({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        tid,
                        t.name,
                        stamp(now),
                        t.user_uuid,
                        t.access_key,
                        t.domain_name,
                        t.group_id,
                        TEMPLATE_TYPE,
                        msgspec.json.encode(t.template).decode(),
                    ),
                )
                ids.append(tid)
            return ids

        return await self.db.transaction(fn)

    async def session_templates(self, user_uuid: str | None) -> list[StoredTemplate]:
        """The templates of one user (None: everyone's), oldest first (then by name)."""

        def fn(conn: sqlite3.Connection) -> list[StoredTemplate]:
            if user_uuid is None:
                rows = conn.execute(
                    f"SELECT {_COLUMNS} FROM session_templates ORDER BY created_at, name, id"
                ).fetchall()
            else:
                rows = conn.execute(
                    f"SELECT {_COLUMNS} FROM session_templates WHERE user_uuid=? ORDER BY created_at, name, id",
                    (user_uuid,),
                ).fetchall()
            return [_row(r) for r in rows]

        return await self.db.run(fn)

    async def session_template(self, template_id: str) -> StoredTemplate | None:
        def fn(conn: sqlite3.Connection) -> StoredTemplate | None:
            r = conn.execute(f"SELECT {_COLUMNS} FROM session_templates WHERE id=?", (template_id,)).fetchone()
            return None if r is None else _row(r)

        return await self.db.run(fn)

    async def replace_session_template(
        self, template_id: str, name: str, template: TaskTemplate, group_id: str | None
    ) -> bool:
        """A template's name, content and project replaced (False: there is no such template)."""

        def fn(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                "UPDATE session_templates SET name=?, template=?, group_id=? WHERE id=?",
                (name, msgspec.json.encode(template).decode(), group_id, template_id),
            )
            return cur.rowcount > 0

        return await self.db.transaction(fn)

    async def delete_session_template(self, template_id: str) -> bool:
        def fn(conn: sqlite3.Connection) -> bool:
            return conn.execute("DELETE FROM session_templates WHERE id=?", (template_id,)).rowcount > 0

        return await self.db.transaction(fn)
