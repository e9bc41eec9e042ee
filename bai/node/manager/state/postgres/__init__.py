"""The manager's state in PostgreSQL, for a team that runs several managers on one database.

- `db`: the database object (one thread, group commit, as SQLite's) over psycopg 3, and the connection that
  gives the shared queries what they use of sqlite3's;
- `schema`: the same tables and numbered versions as SQLite's, made from its schema.

`PgStore` is every domain's queries (the same classes as SQLite's `Store`) over a PostgreSQL database.
"""

from __future__ import annotations

from bai.common.clock import Clock
from bai.node.manager.state.postgres.cluster_queries import Cluster
from bai.node.manager.state.postgres.db import PgDatabase
from bai.node.manager.state.sqlite import LOG_MAX_BYTES, Store

__all__ = ["PgDatabase", "PgStore"]


class PgStore(Store, Cluster):
    """The manager's state in a PostgreSQL database, and the managers that share it (`Cluster`)."""

    @classmethod
    async def open_url(
        cls, dsn: str, shown: str, log_max_bytes: int = LOG_MAX_BYTES, *, clock: Clock | None = None
    ) -> PgStore:
        """Connect (DatabaseUnavailable: the server cannot be reached), bring the schema to the latest version
        (SchemaTooNew: a newer bai's database), cut every log to `log_max_bytes`, read the active keypairs."""
        return await cls.over(await PgDatabase.open_url(dsn, shown), log_max_bytes, clock)
