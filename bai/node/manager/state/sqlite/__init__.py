"""The manager's state in SQLite (WAL). The only package that speaks SQL.

- `db`: one small Database object (its own thread, pragmas, transactions, the migrations runner);
- `migrations`: the schema and its numbered steps (PRAGMA user_version);
- `keypair_queries`, `agent_queries`, `session_queries`, `vfolder_queries`, `image_queries`, `template_queries`,
  `preset_queries`, `log_queries`: the queries of each domain, a class each, returning the records of `state.records`.

`Store` is all of them over one Database. Each of its public methods is one transaction in one thread hop.
"""

from __future__ import annotations

from pathlib import Path
from typing import Self

from bai.common.clock import Clock
from bai.node.manager.state.sqlite.agent_queries import Agents
from bai.node.manager.state.sqlite.db import WAL_PAGES, Database, SchemaTooNew
from bai.node.manager.state.sqlite.fair_share_queries import FairShareQueries
from bai.node.manager.state.sqlite.image_queries import Images
from bai.node.manager.state.sqlite.keypair_queries import POLICY_FIELDS, Keypairs
from bai.node.manager.state.sqlite.log_queries import LOG_MAX_BYTES, LOG_PAGE_BYTES, Logs, drop_marker, human_bytes
from bai.node.manager.state.sqlite.preset_queries import Presets
from bai.node.manager.state.sqlite.round_queries import RoundQueries
from bai.node.manager.state.sqlite.session_queries import Sessions
from bai.node.manager.state.sqlite.team_queries import Teams
from bai.node.manager.state.sqlite.template_queries import Templates
from bai.node.manager.state.sqlite.vfolder_queries import Vfolders

__all__ = [
    "LOG_MAX_BYTES",
    "LOG_PAGE_BYTES",
    "POLICY_FIELDS",
    "WAL_PAGES",
    "Database",
    "SchemaTooNew",
    "Store",
    "drop_marker",
    "human_bytes",
]


class Store(
    Teams, Keypairs, Agents, Sessions, Vfolders, Images, Templates, Presets, FairShareQueries, RoundQueries, Logs
):
    """The manager's state: every domain's queries over one database."""

    def __init__(self, db: Database, log_max_bytes: int = LOG_MAX_BYTES) -> None:
        Logs.__init__(self, db, log_max_bytes)

    @classmethod
    async def open(cls, path: Path, log_max_bytes: int = LOG_MAX_BYTES, *, clock: Clock | None = None) -> Store:
        """Open (or create) the database, its schema brought to the latest version (SchemaTooNew: the
        database is of a newer bai), every log cut to `log_max_bytes` (the cut stamped with `clock`'s time),
        and the active keypairs read into memory."""
        # the -wal file is disk too: checkpoint it at about a quarter of the log bound
        db = await Database.open(path, max_wal_bytes=log_max_bytes // 4)
        return await cls.over(db, log_max_bytes, clock)

    @classmethod
    async def over(cls, db: Database, log_max_bytes: int, clock: Clock | None) -> Self:
        """The store over an open database: every log cut to `log_max_bytes` (stamped with `clock`'s time), the
        active keypairs read into memory (the database closed again should that fail)."""
        store = cls(db, log_max_bytes)
        try:
            await store.cut_logs_to_bound((clock or Clock()).now())
            await store.load_teams()
        except BaseException:
            await db.close()
            raise
        return store

    async def close(self) -> None:
        await self.db.close()

    async def reclaim_space(self, min_free_pages: int = 0) -> dict[str, int]:
        """Give free pages back to the file system (incremental vacuum) when there are more than
        `min_free_pages`, and checkpoint the WAL, cutting the -wal file to nothing."""
        return await self.db.reclaim_space(min_free_pages)
