"""The manager's state: what the services read and write, below them. Only this package speaks SQL.

- `records`: the frozen typed records reads return and writes take (sessions and kernels, agents, accounts,
  folders, images, logs);
- `protocols`: what the services ask of the state, one Protocol per domain (`SessionState` and its reads
  `SessionReadState`, `AgentState`, `AccountState`, `FolderState`, `ImageState`, `LogState`; `State`
  is all of them, for the services that use several);
- `errors`: what the state raises (`StorageFull` on a full disk, whatever the implementation);
- `sqlite/`: the SQLite implementation (the embedded default); `Store` is it, re-exported here so that the
  rest of the manager imports the state layer, not an implementation.
"""

from __future__ import annotations

from bai.node.manager.state.errors import StateError, StorageFull, UnknownPolicy
from bai.node.manager.state.protocols import (
    AccountState,
    AgentState,
    FolderState,
    ImageState,
    LogState,
    SessionReadState,
    SessionState,
    State,
)
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
)

__all__ = [
    "LOG_MAX_BYTES",
    "LOG_PAGE_BYTES",
    "POLICY_FIELDS",
    "WAL_PAGES",
    "AccountState",
    "AgentState",
    "Database",
    "FolderState",
    "ImageState",
    "LogState",
    "SchemaTooNew",
    "SessionReadState",
    "SessionState",
    "State",
    "StateError",
    "StorageFull",
    "Store",
    "UnknownPolicy",
    "drop_marker",
    "human_bytes",
]
