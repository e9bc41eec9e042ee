"""The manager's state: what the services read and write, below them. Only this package speaks SQL.

The SQLite implementation (the embedded default) lives in `sqlite/`; `Store` is it, re-exported here so that the
rest of the manager imports the state layer, not an implementation.
"""

from __future__ import annotations

from bai.node.manager.state.sqlite import (
    LOG_MAX_BYTES,
    LOG_PAGE_BYTES,
    POLICY_FIELDS,
    WAL_PAGES,
    Database,
    SchemaTooNew,
    Store,
    drop_marker,
    human_bytes,
    utcnow,
)

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
    "utcnow",
]
