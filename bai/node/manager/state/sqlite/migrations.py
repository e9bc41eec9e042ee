"""The manager's schema, and the steps that brought it there: PRAGMA user_version says which one a database has.

A new database gets SCHEMA, the whole of it, at version LATEST. An existing one goes through the STEPS after
its version, each in one transaction together with its new version number.

Steps 1 to 7 are the schema's history before it had versions: a database that bai wrote then has
user_version 0, whatever it holds, so each of these steps adds only what is missing (CREATE … IF NOT EXISTS;
`add_column`). Steps from 8 on run on databases known to have the version before, and need no such care.

To change the schema: change SCHEMA (what a new database gets), append a Step that makes the same change to a
database at the version before (in SQLite, and in PostgreSQL as its `postgres` statements: PostgreSQL databases
are made from this SCHEMA too, see state/postgres/schema.py), and raise LATEST. `tests/test_store.py` checks
that both give the same tables.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass

# the statuses of live sessions (bai.common.status.ACTIVE_STATUSES), as the live-name check lists them (so that
# its condition is the index's own); tests/test_store.py checks that they are ACTIVE_STATUSES
LIVE = (
    "'ERROR', 'PENDING', 'PREPARING', 'PULLING', 'RESTARTING', 'RUNNING', 'RUNNING_DEGRADED', 'SCHEDULED', "
    "'TERMINATING'"
)
LIVE_NAME_INDEX = (
    f"CREATE INDEX IF NOT EXISTS sessions_live_name ON sessions(access_key, name) WHERE status IN ({LIVE})"
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS keypairs (
    access_key TEXT PRIMARY KEY,
    secret_key TEXT NOT NULL,
    user_id TEXT NOT NULL,
    is_admin INTEGER NOT NULL DEFAULT 0,
    is_active INTEGER NOT NULL DEFAULT 1,
    resource_policy TEXT NOT NULL DEFAULT 'default',
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS resource_policies (
    name TEXT PRIMARY KEY,
    max_concurrent_sessions INTEGER NOT NULL DEFAULT 0,
    total_resource_slots TEXT NOT NULL DEFAULT '{}',
    default_for_unspecified TEXT NOT NULL DEFAULT 'UNLIMITED',
    idle_timeout REAL NOT NULL DEFAULT 0,
    max_session_lifetime REAL NOT NULL DEFAULT 0,
    created_at TEXT NOT NULL,
    max_vfolder_count INTEGER NOT NULL DEFAULT 0,  -- 0 = unlimited
    max_vfolder_size INTEGER NOT NULL DEFAULT 0,  -- bytes per folder; 0 = unlimited
    -- idle detection by utilisation: end a session whose mean CPU (percent of what it was allocated) and GPU
    -- utilisation over idle_window seconds stayed under these (NULL: not checked)
    idle_cpu_pct REAL,
    idle_gpu_pct REAL,
    idle_window REAL NOT NULL DEFAULT 600,
    -- sessions of several kernels a keypair may hold at once (each holds a Docker network, one of its daemon's
    -- address pools, on every agent it runs on); 0 = unlimited
    max_session_networks INTEGER NOT NULL DEFAULT 2,
    -- sessions a keypair may have waiting (PENDING) at once: one more is refused at creation; 0 = unlimited
    max_pending_session_count INTEGER NOT NULL DEFAULT 1000
);
INSERT OR IGNORE INTO resource_policies(name, created_at) VALUES ('default', '1970-01-01T00:00:00+00:00');
CREATE TABLE IF NOT EXISTS agents (
    id TEXT PRIMARY KEY,
    hostname TEXT NOT NULL,
    backend TEXT NOT NULL,
    version TEXT NOT NULL,
    scaling_group TEXT NOT NULL,
    status TEXT NOT NULL,
    slots TEXT NOT NULL,
    first_contact TEXT NOT NULL,
    last_seen TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    access_key TEXT NOT NULL,
    image TEXT NOT NULL,
    type TEXT NOT NULL,
    status TEXT NOT NULL,
    status_info TEXT NOT NULL DEFAULT '',
    status_data TEXT NOT NULL DEFAULT '{}',
    status_changed TEXT NOT NULL,
    requested_slots TEXT NOT NULL,
    environ TEXT NOT NULL DEFAULT '{}',
    config TEXT NOT NULL DEFAULT '{}',
    scaling_group TEXT NOT NULL DEFAULT 'default',
    cluster_size INTEGER NOT NULL DEFAULT 1,
    tag TEXT,
    result TEXT NOT NULL DEFAULT 'UNDEFINED',
    created_at TEXT NOT NULL,
    terminated_at TEXT,
    seq INTEGER NOT NULL,
    started_at TEXT
);
CREATE INDEX IF NOT EXISTS sessions_status ON sessions(status, seq);
CREATE INDEX IF NOT EXISTS sessions_name ON sessions(access_key, name);
CREATE INDEX IF NOT EXISTS sessions_owner_status ON sessions(access_key, status);
CREATE TABLE IF NOT EXISTS session_transitions (
    session_id TEXT NOT NULL,
    status TEXT NOT NULL,
    status_info TEXT NOT NULL,
    status_data TEXT NOT NULL,
    at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS transitions_session ON session_transitions(session_id);
CREATE TABLE IF NOT EXISTS kernels (
    id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    cluster_role TEXT NOT NULL,
    cluster_idx INTEGER NOT NULL,
    image TEXT NOT NULL,
    agent_id TEXT,
    container_id TEXT,
    status TEXT NOT NULL,
    status_info TEXT NOT NULL DEFAULT '',
    status_changed TEXT NOT NULL,
    occupied_slots TEXT NOT NULL,
    exit_code INTEGER,
    created_at TEXT NOT NULL,
    terminated_at TEXT,
    devices TEXT NOT NULL DEFAULT '[]',  -- [[GPU UUID, share], ...] the kernel holds
    service_ports TEXT NOT NULL DEFAULT '[]',  -- its apps: [{name, protocol, container_ports, host_ports}]
    last_stat TEXT  -- its final statistics sample (bai/common/stats.py), stored as it ended; NULL: none
);
CREATE INDEX IF NOT EXISTS kernels_session ON kernels(session_id);
CREATE INDEX IF NOT EXISTS kernels_status ON kernels(status, agent_id);
CREATE INDEX IF NOT EXISTS sessions_seq ON sessions(seq);
CREATE TABLE IF NOT EXISTS scheduling_history (
    session_id TEXT NOT NULL,
    first_at TEXT NOT NULL,
    last_at TEXT NOT NULL,
    rounds INTEGER NOT NULL,
    outcome TEXT NOT NULL,
    status_info TEXT NOT NULL,
    msg TEXT NOT NULL,
    agents TEXT NOT NULL,
    predicates TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS scheduling_history_session ON scheduling_history(session_id);
CREATE TABLE IF NOT EXISTS kernel_logs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    kernel_id TEXT NOT NULL,
    size INTEGER,  -- UTF-8 bytes of data (NULL in rows an older bai stored; ahead of data so reading it is cheap)
    data TEXT NOT NULL,
    ts TEXT  -- when the manager stored the chunk (ISO 8601, UTC)
);
CREATE INDEX IF NOT EXISTS kernel_logs_kernel ON kernel_logs(kernel_id, seq);
CREATE TABLE IF NOT EXISTS kernel_log_sizes (
    kernel_id TEXT PRIMARY KEY,
    bytes INTEGER NOT NULL,  -- UTF-8 bytes of output kept (the marker line not counted)
    dropped INTEGER NOT NULL DEFAULT 0,  -- bytes of older output dropped to stay within log_max_bytes
    marker_seq INTEGER,  -- the kernel_logs row that says so; it comes before every row kept
    purged_at TEXT  -- when the whole log was purged (log_retention after its session ended)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS kernel_log_sizes_kept ON kernel_log_sizes(kernel_id) WHERE purged_at IS NULL;
CREATE TABLE IF NOT EXISTS vfolders (
    id TEXT PRIMARY KEY,  -- hex; also the folder's directory name under its host's root
    name TEXT NOT NULL,
    host TEXT NOT NULL,
    owner TEXT NOT NULL,  -- access key
    usage_mode TEXT NOT NULL DEFAULT 'general',
    status TEXT NOT NULL DEFAULT 'ready',  -- ready | trashed
    created_at TEXT NOT NULL,
    trashed_at TEXT,
    mount_permission TEXT NOT NULL DEFAULT 'rw',  -- Backend.AI's innate permission: ro makes every mount read-only
    cloneable INTEGER NOT NULL DEFAULT 0  -- whoever may read it may clone it
);
CREATE UNIQUE INDEX IF NOT EXISTS vfolders_owner_name ON vfolders(owner, name) WHERE status = 'ready';
CREATE TABLE IF NOT EXISTS vfolder_shares (
    vfolder_id TEXT NOT NULL,
    access_key TEXT NOT NULL,
    permission TEXT NOT NULL,  -- ro | rw
    PRIMARY KEY (vfolder_id, access_key)
);
CREATE TABLE IF NOT EXISTS vfolder_invitations (
    id TEXT PRIMARY KEY,  -- hex
    vfolder_id TEXT NOT NULL,
    inviter TEXT NOT NULL,  -- access keys
    invitee TEXT NOT NULL,
    permission TEXT NOT NULL,  -- ro | rw: the share it becomes once accepted
    state TEXT NOT NULL DEFAULT 'pending',  -- pending | accepted | rejected | canceled
    created_at TEXT NOT NULL,
    modified_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS vfolder_invitations_invitee ON vfolder_invitations(invitee, state);
CREATE TABLE IF NOT EXISTS image_aliases (
    alias TEXT PRIMARY KEY,  -- set with `bai image alias`; they override [images.aliases]
    image TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS dotfiles (
    access_key TEXT NOT NULL,
    path TEXT NOT NULL,  -- relative to the kernel's home
    data TEXT NOT NULL,
    permission TEXT NOT NULL DEFAULT '644',
    PRIMARY KEY (access_key, path)
);
"""
SCHEMA += LIVE_NAME_INDEX + ";\n"


@dataclass(frozen=True)
class Step:
    """One numbered schema migration."""

    version: int  # the user_version a database has once the step is applied
    summary: str
    apply: Callable[[sqlite3.Connection], None]  # inside the step's transaction
    before: Callable[[sqlite3.Connection], None] | None = None  # outside it, before (a VACUUM); safe to repeat
    # the same change in PostgreSQL, statement by statement (state/postgres/schema.py): every step after 13,
    # the version a PostgreSQL database starts at, has one
    postgres: tuple[str, ...] | None = None


def statements(script: str) -> Iterator[str]:
    """The SQL statements of a script, one at a time (to run them inside a transaction, as executescript()
    would commit it)."""
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            yield pending.strip()
            pending = ""
    if pending.strip():
        raise ValueError(f"an incomplete SQL statement: {pending.strip()!r}")


def script(sql: str) -> Callable[[sqlite3.Connection], None]:
    def apply(conn: sqlite3.Connection) -> None:
        for statement in statements(sql):
            conn.execute(statement)

    return apply


def add_column(conn: sqlite3.Connection, table: str, column: str, declaration: str) -> None:
    """ALTER TABLE … ADD COLUMN, unless the table has that column (a step of the history before versions)."""
    if column not in {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}:
        conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")


def has_table(conn: sqlite3.Connection, name: str) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (name,)).fetchone() is not None


# -- the steps ----------------------------------------------------------------------------------------

V1 = """
CREATE TABLE IF NOT EXISTS keypairs (
    access_key TEXT PRIMARY KEY,
    secret_key TEXT NOT NULL,
    user_id TEXT NOT NULL,
    is_admin INTEGER NOT NULL DEFAULT 0,
    is_active INTEGER NOT NULL DEFAULT 1,
    resource_policy TEXT NOT NULL DEFAULT 'default',
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS agents (
    id TEXT PRIMARY KEY,
    hostname TEXT NOT NULL,
    backend TEXT NOT NULL,
    version TEXT NOT NULL,
    scaling_group TEXT NOT NULL,
    status TEXT NOT NULL,
    slots TEXT NOT NULL,
    first_contact TEXT NOT NULL,
    last_seen TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    access_key TEXT NOT NULL,
    image TEXT NOT NULL,
    type TEXT NOT NULL,
    status TEXT NOT NULL,
    status_info TEXT NOT NULL DEFAULT '',
    status_data TEXT NOT NULL DEFAULT '{}',
    status_changed TEXT NOT NULL,
    requested_slots TEXT NOT NULL,
    environ TEXT NOT NULL DEFAULT '{}',
    config TEXT NOT NULL DEFAULT '{}',
    scaling_group TEXT NOT NULL DEFAULT 'default',
    cluster_size INTEGER NOT NULL DEFAULT 1,
    tag TEXT,
    result TEXT NOT NULL DEFAULT 'UNDEFINED',
    created_at TEXT NOT NULL,
    terminated_at TEXT,
    seq INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS sessions_status ON sessions(status, seq);
CREATE INDEX IF NOT EXISTS sessions_name ON sessions(access_key, name);
CREATE TABLE IF NOT EXISTS session_transitions (
    session_id TEXT NOT NULL,
    status TEXT NOT NULL,
    status_info TEXT NOT NULL,
    status_data TEXT NOT NULL,
    at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS transitions_session ON session_transitions(session_id);
CREATE TABLE IF NOT EXISTS kernels (
    id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    cluster_role TEXT NOT NULL,
    cluster_idx INTEGER NOT NULL,
    image TEXT NOT NULL,
    agent_id TEXT,
    container_id TEXT,
    status TEXT NOT NULL,
    status_info TEXT NOT NULL DEFAULT '',
    status_changed TEXT NOT NULL,
    occupied_slots TEXT NOT NULL,
    exit_code INTEGER,
    created_at TEXT NOT NULL,
    terminated_at TEXT
);
CREATE INDEX IF NOT EXISTS kernels_session ON kernels(session_id);
CREATE TABLE IF NOT EXISTS kernel_logs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    kernel_id TEXT NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS kernel_logs_kernel ON kernel_logs(kernel_id, seq);
"""

V2 = """
CREATE TABLE IF NOT EXISTS resource_policies (
    name TEXT PRIMARY KEY,
    max_concurrent_sessions INTEGER NOT NULL DEFAULT 0,
    total_resource_slots TEXT NOT NULL DEFAULT '{}',
    default_for_unspecified TEXT NOT NULL DEFAULT 'UNLIMITED',
    idle_timeout REAL NOT NULL DEFAULT 0,
    max_session_lifetime REAL NOT NULL DEFAULT 0,
    created_at TEXT NOT NULL
);
INSERT OR IGNORE INTO resource_policies(name, created_at) VALUES ('default', '1970-01-01T00:00:00+00:00');
CREATE TABLE IF NOT EXISTS scheduling_history (
    session_id TEXT NOT NULL,
    first_at TEXT NOT NULL,
    last_at TEXT NOT NULL,
    rounds INTEGER NOT NULL,
    outcome TEXT NOT NULL,
    status_info TEXT NOT NULL,
    msg TEXT NOT NULL,
    agents TEXT NOT NULL,
    predicates TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS scheduling_history_session ON scheduling_history(session_id);
"""

V3 = """
CREATE INDEX IF NOT EXISTS kernels_status ON kernels(status, agent_id);
CREATE INDEX IF NOT EXISTS sessions_seq ON sessions(seq);
"""

V4 = """
CREATE TABLE IF NOT EXISTS vfolders (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    host TEXT NOT NULL,
    owner TEXT NOT NULL,
    usage_mode TEXT NOT NULL DEFAULT 'general',
    status TEXT NOT NULL DEFAULT 'ready',
    created_at TEXT NOT NULL,
    trashed_at TEXT
);
CREATE UNIQUE INDEX IF NOT EXISTS vfolders_owner_name ON vfolders(owner, name) WHERE status = 'ready';
CREATE TABLE IF NOT EXISTS vfolder_shares (
    vfolder_id TEXT NOT NULL,
    access_key TEXT NOT NULL,
    permission TEXT NOT NULL,
    PRIMARY KEY (vfolder_id, access_key)
);
CREATE TABLE IF NOT EXISTS dotfiles (
    access_key TEXT NOT NULL,
    path TEXT NOT NULL,
    data TEXT NOT NULL,
    permission TEXT NOT NULL DEFAULT '644',
    PRIMARY KEY (access_key, path)
);
"""


def v4(conn: sqlite3.Connection) -> None:
    add_column(conn, "resource_policies", "max_vfolder_count", "INTEGER NOT NULL DEFAULT 0")
    add_column(conn, "resource_policies", "max_vfolder_size", "INTEGER NOT NULL DEFAULT 0")
    add_column(conn, "kernel_logs", "ts", "TEXT")
    script(V4)(conn)


V5 = """
CREATE TABLE IF NOT EXISTS image_aliases (
    alias TEXT PRIMARY KEY,
    image TEXT NOT NULL
);
"""


def v6(conn: sqlite3.Connection) -> None:
    add_column(conn, "kernels", "devices", "TEXT NOT NULL DEFAULT '[]'")


V7 = """
CREATE TABLE kernel_log_sizes (
    kernel_id TEXT PRIMARY KEY,
    bytes INTEGER NOT NULL,
    dropped INTEGER NOT NULL DEFAULT 0,
    marker_seq INTEGER,
    purged_at TEXT
) WITHOUT ROWID;
CREATE INDEX kernel_log_sizes_kept ON kernel_log_sizes(kernel_id) WHERE purged_at IS NULL;
INSERT INTO kernel_log_sizes(kernel_id, bytes)
    SELECT kernel_id, SUM(length(CAST(data AS BLOB))) FROM kernel_logs GROUP BY kernel_id;
"""


def v7_vacuum(conn: sqlite3.Connection) -> None:
    """Once, so that purged logs give their space back from now on (auto_vacuum is set before the first
    table of a database, or it takes a VACUUM)."""
    if conn.execute("PRAGMA auto_vacuum").fetchone()[0] != 2:
        conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
        conn.execute("VACUUM")


def v7(conn: sqlite3.Connection) -> None:
    add_column(conn, "kernel_logs", "size", "INTEGER")  # (after data here: only a new database has it ahead)
    if not has_table(conn, "kernel_log_sizes"):
        script(V7)(conn)  # every log's running total, from what is stored


def v8(conn: sqlite3.Connection) -> None:
    add_column(conn, "kernels", "service_ports", "TEXT NOT NULL DEFAULT '[]'")


V9 = """
CREATE TABLE IF NOT EXISTS vfolder_invitations (
    id TEXT PRIMARY KEY,
    vfolder_id TEXT NOT NULL,
    inviter TEXT NOT NULL,
    invitee TEXT NOT NULL,
    permission TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',
    created_at TEXT NOT NULL,
    modified_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS vfolder_invitations_invitee ON vfolder_invitations(invitee, state);
"""


def v9(conn: sqlite3.Connection) -> None:
    # (with care, as steps 1 to 7: a database of the last bai before versions has the whole SCHEMA at 0)
    add_column(conn, "vfolders", "mount_permission", "TEXT NOT NULL DEFAULT 'rw'")
    add_column(conn, "vfolders", "cloneable", "INTEGER NOT NULL DEFAULT 0")
    script(V9)(conn)


def v10(conn: sqlite3.Connection) -> None:
    # (with care, as v9: a database of the last bai before versions has the whole SCHEMA at 0)
    add_column(conn, "kernels", "last_stat", "TEXT")
    add_column(conn, "resource_policies", "idle_cpu_pct", "REAL")
    add_column(conn, "resource_policies", "idle_gpu_pct", "REAL")
    add_column(conn, "resource_policies", "idle_window", "REAL NOT NULL DEFAULT 600")


def v11(conn: sqlite3.Connection) -> None:
    # every policy, the existing ones too, gets the default: an unbounded one would let one keypair take
    # every address pool of a Docker daemon (an operator sets 0 for unlimited)
    add_column(conn, "resource_policies", "max_session_networks", "INTEGER NOT NULL DEFAULT 2")


def v12(conn: sqlite3.Connection) -> None:
    # every policy, the existing ones too, gets the default: an unbounded queue would let one keypair grow the
    # store and every scheduling round's snapshot without limit (an operator sets 0 for unlimited); the index
    # makes the count at each creation one range of it
    add_column(conn, "resource_policies", "max_pending_session_count", "INTEGER NOT NULL DEFAULT 1000")
    conn.execute("CREATE INDEX IF NOT EXISTS sessions_owner_status ON sessions(access_key, status)")


def v13(conn: sqlite3.Connection) -> None:
    # when a session first ran (its time queued and its time running are shown apart); sessions that ran
    # before this step keep NULL (their transitions still say when)
    add_column(conn, "sessions", "started_at", "TEXT")


def v14(conn: sqlite3.Connection) -> None:
    # the live-name check of every create (names are unique among an owner's live sessions) reads this index only:
    # PostgreSQL planned it over sessions_owner_status, every live session of the owner (a create slowed as its
    # queue grew)
    conn.execute(LIVE_NAME_INDEX)


STEPS = [
    Step(1, "keypairs, agents, sessions and their transitions, kernels, kernel logs", script(V1)),
    Step(2, "resource policies, scheduling history", script(V2)),
    Step(3, "indexes: kernels by status and agent, sessions by seq", script(V3)),
    Step(4, "virtual folders, their shares, dotfiles; policies' folder quotas; log chunks' times", v4),
    Step(5, "image aliases", script(V5)),
    Step(6, "kernels' GPU devices", v6),
    Step(7, "bounded logs: chunk sizes, each kernel's total; incremental auto-vacuum", v7, before=v7_vacuum),
    Step(8, "kernels' apps (service ports)", v8),
    Step(9, "virtual folders' innate permission and cloneable; invitations", v9),
    Step(10, "kernels' final statistics (last_stat); policies' idle detection by utilisation", v10),
    Step(11, "policies' session networks (max_session_networks)", v11),
    Step(12, "policies' queue bound (max_pending_session_count); sessions by owner and status", v12),
    Step(13, "sessions' first start (started_at)", v13),
    Step(14, "sessions' live names (an index of the live sessions only)", v14, postgres=(LIVE_NAME_INDEX,)),
]
LATEST = STEPS[-1].version
assert [s.version for s in STEPS] == list(range(1, LATEST + 1))
