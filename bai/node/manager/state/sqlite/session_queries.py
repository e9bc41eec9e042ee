"""Sessions, their kernels, transitions and scheduling history."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any, NamedTuple, cast

import msgspec

from bai.common.status import ACTIVE_STATUSES, SESSION_TRANSITIONS, SessionStatus, check_transition
from bai.node.manager.state.records import (
    Dotfile,
    HistorySearch,
    Kernel,
    KernelChanges,
    NewKernel,
    NewSession,
    SchedulingAttempt,
    Session,
    Transition,
    changed_fields,
    stamp,
)
from bai.node.manager.state.sqlite.db import OneStatement, Queries, decode, decode_mapping
from bai.node.manager.state.sqlite.migrations import LIVE, NEXT_SESSION_NUMBER

_ENCODED = frozenset({"devices", "service_ports", "last_stat"})  # kernel columns stored as JSON text


def _session(row: sqlite3.Row) -> Session:
    return Session(**decode(row))


def _kernel(row: sqlite3.Row) -> Kernel:
    return Kernel(**decode(row))


def _kernel_columns(changes: KernelChanges) -> dict[str, Any]:
    """A kernel's changes as the columns they set (JSON ones encoded)."""
    return {c: json.dumps(v) if c in _ENCODED else v for c, v in changed_fields(changes).items()}


# for each target, the statuses a session may move to it from (the lifecycle's legal moves; not the target itself)
_LEGAL_FROM: dict[SessionStatus, frozenset[SessionStatus]] = {
    target: frozenset(s for s, targets in SESSION_TRANSITIONS.items() if target in targets and s != target)
    for target in SessionStatus
}
_DEAD_TARGETS = (SessionStatus.TERMINATED, SessionStatus.CANCELLED)
_moves: dict[tuple[SessionStatus, frozenset[SessionStatus] | None], tuple[str, tuple[str, ...]]] = {}


def _move_statement(target: SessionStatus, allowed: frozenset[SessionStatus] | None) -> tuple[str, tuple[str, ...]]:
    """The UPDATE … RETURNING that moves a session to `target` only from a status it may move from (legal, and
    in `allowed` when given), and those statuses (its last parameters); kept per (target, allowed)."""
    key = (target, allowed)
    known = _moves.get(key)
    if known is None:
        sources = _LEGAL_FROM[target] if allowed is None else _LEGAL_FROM[target] & allowed
        values = tuple(sorted(s.value for s in sources))
        marks = ",".join("?" * len(values)) or "NULL"
        sql = (
            "UPDATE sessions SET status=?, status_info=?, status_data=?, status_changed=?, "
            "terminated_at=COALESCE(?, terminated_at), result=COALESCE(?, result), "
            "started_at=COALESCE(started_at, ?) "
            f"WHERE id=? AND status IN ({marks}) RETURNING *"
        )
        known = _moves[key] = (sql, values)
    return known


def _transition(
    conn: sqlite3.Connection,
    session_id: str,
    target: SessionStatus,
    status_info: str,
    status_data: dict[str, Any] | None,
    allowed_from: Iterable[SessionStatus] | None,
    kernel_updates: dict[str, KernelChanges] | None,
    result: str | None,
    now: str,
    kernels_out: list[Kernel] | None = None,
) -> Session | None:
    """One session transition inside the caller's transaction (see Store.transition), stamped `now` (its
    status_changed, its transition row's time, terminated_at when it ends).

    `kernels_out`: a list to receive the session's kernels as changed (in cluster order), read back by the
    statement that changes them.

    One statement moves the session when it may move (the usual case) and returns its row as changed; when it
    did not move, its status says why: None (nothing changed) for a session that is not there, not in
    `allowed_from` or already at `target`, IllegalTransition for a move the lifecycle forbids."""
    allowed = None if allowed_from is None else frozenset(allowed_from)
    combined = getattr(conn, "writable_ctes", False)  # (PostgreSQL: the move, its record, the kernels in one)
    plan = _plan(session_id, target, status_info, status_data, allowed, kernel_updates, result, now)
    sql, move_params, data, params, updates = plan.move_sql, plan.move_params, plan.data, plan.params, plan.updates
    folded = combined and not updates
    kernels_sql = _kernels_statement(plan.terminated, plan.own_cols, kernels_out is not None and not folded)
    if combined:
        moved = conn.execute(
            *_combined_of(plan, kernels_sql if folded else None, folded and kernels_out is not None)
        ).fetchall()
    else:
        moved = conn.execute(sql, move_params).fetchall()  # (to the end: the statement is done before the next one)
    if not moved:
        before = conn.execute("SELECT status FROM sessions WHERE id=?", (session_id,)).fetchone()
        if before is None:
            return None
        current = SessionStatus(before[0])
        if (allowed is not None and current not in allowed) or current == target:
            return None
        check_transition(current, target)  # raises: the lifecycle forbids that move
        raise AssertionError(f"session {session_id} did not move from {current} to {target}")
    if not combined:
        conn.execute(
            "INSERT INTO session_transitions VALUES (?, ?, ?, ?, ?)",
            (session_id, target.value, status_info, data, now),
        )
    if folded:
        if kernels_out is None:
            return _session(moved[0])
        row, kernels = _moved_with_kernels(moved[0])
        kernels_out.extend(kernels)
        return row
    rows = conn.execute(kernels_sql, params).fetchall()
    for kid, own in updates:
        sets = ", ".join(f"{c}=?" for c in own)
        conn.execute(f"UPDATE kernels SET {sets} WHERE id=? AND session_id=?", (*own.values(), kid, session_id))
    if kernels_out is not None:
        if updates:  # (changed again since: read them as they are now)
            rows = conn.execute("SELECT * FROM kernels WHERE session_id=?", (session_id,)).fetchall()
        kernels_out.extend(sorted((_kernel(r) for r in rows), key=cluster_order))
    return _session(moved[0])


class _Plan(NamedTuple):
    """A transition's statements' parameters (see `_transition`)."""

    move_sql: str
    move_params: tuple[Any, ...]
    data: str  # the status data as stored
    params: list[Any]  # the kernels' statement's
    updates: list[tuple[str, dict[str, Any]]]  # kernels' own updates that take statements of their own
    own_cols: tuple[str, ...]  # the one kernel's own columns the kernels' statement sets
    terminated: bool
    history: tuple[Any, ...]  # the transition's record's (status, info, data, time)


def _plan(
    session_id: str,
    target: SessionStatus,
    status_info: str,
    status_data: dict[str, Any] | None,
    allowed: frozenset[SessionStatus] | None,
    kernel_updates: dict[str, KernelChanges] | None,
    result: str | None,
    now: str,
) -> _Plan:
    sql, sources = _move_statement(target, allowed)
    data = json.dumps(status_data) if status_data else "{}"
    terminated = now if target in _DEAD_TARGETS else None
    started = now if target == SessionStatus.RUNNING else None
    move_params = (target.value, status_info, data, now, terminated, result, started, session_id, *sources)
    # every kernel of the session follows it; then each kernel's own updates (which may override that): one
    # statement when one kernel has updates of its own that override none of the common columns (the usual case)
    updates = [(kid, own) for kid, changes in (kernel_updates or {}).items() if (own := _kernel_columns(changes))]
    own_cols: tuple[str, ...] = ()
    params: list[Any] = [target.value, status_info, now]
    if terminated:
        params.append(terminated)
    if len(updates) == 1 and _KERNEL_FOLLOWS.isdisjoint(updates[0][1]):
        kid, own = updates[0]
        own_cols = tuple(own)
        for value in own.values():
            params += (kid, value)
        updates = []
    params.append(session_id)
    history = (target.value, status_info, data, now)
    return _Plan(sql, move_params, data, params, updates, own_cols, bool(terminated), history)


def _combined_of(plan: _Plan, kernels_sql: str | None, kernels_back: bool) -> tuple[str, tuple[Any, ...]]:
    """PostgreSQL's one statement of a transition (`_combined_statement`) and its parameters."""
    folded = kernels_sql is not None
    return (
        _combined_statement(plan.move_sql, kernels_sql, kernels_back),
        (*plan.move_params, *plan.history, *(plan.params if folded else ())),
    )


def _transitions(conn: sqlite3.Connection, moves: list[tuple[Any, ...]]) -> list[Session | None]:
    """Several `_transition`s (each its arguments after `conn`, without kernels_out) inside the caller's
    transaction, in order. PostgreSQL: those whose move is one statement are sent together (its pipeline: one
    round trip for all, as a scheduling round's placements); a session that did not move is moved again alone,
    which says why (None, or IllegalTransition)."""
    pipeline = getattr(conn, "pipeline", None)
    if pipeline is None or len(moves) < 2:
        return [_transition(conn, *m) for m in moves]
    plans = []
    for session_id, target, info, data, allowed_from, updates, result, now in moves:
        allowed = None if allowed_from is None else frozenset(allowed_from)
        plans.append(_plan(session_id, target, info, data, allowed, updates, result, now))
    if any(p.updates for p in plans):  # (kernels with updates of their own: one statement each, in turn)
        return [_transition(conn, *m) for m in moves]
    with pipeline() as sent:
        cursors = [
            conn.execute(*_combined_of(p, _kernels_statement(p.terminated, p.own_cols, False), False)) for p in plans
        ]
        sent.sync()  # (every answer read: each cursor has its rows)
        results = [c.fetchall() for c in cursors]
    return [_session(rows[0]) if rows else _transition(conn, *m) for m, rows in zip(moves, results, strict=True)]


def _one_transition(args: tuple[Any, ...]) -> OneStatement | None:
    """PostgreSQL: `_transition` (its arguments after `conn`, without kernels_out) as one statement to send with
    others, when it is one (no kernel has updates of its own that take statements of their own); a session that
    did not move is moved again alone, which says why."""
    session_id, target, info, data, allowed_from, updates, result, now = args
    allowed = None if allowed_from is None else frozenset(allowed_from)
    plan = _plan(session_id, target, info, data, allowed, updates, result, now)
    if plan.updates:
        return None
    sql, params = _combined_of(plan, _kernels_statement(plan.terminated, plan.own_cols, False), False)

    def finish(conn: Any, rows: list[Any]) -> Session | None:
        return _session(rows[0]) if rows else _transition(conn, *args)

    return OneStatement(sql, params, finish)


_combined: dict[tuple[str, str | None, bool], str] = {}


def _combined_statement(move_sql: str, kernels_sql: str | None, kernels_back: bool = False) -> str:
    """PostgreSQL's one statement for a transition (its data-modifying WITH, which SQLite lacks): the move, the
    transition's record, and (`kernels_sql` given) the kernels following it, each only when the session moved;
    the session's row as changed, with (`kernels_back`) the kernels as changed in a JSON column `bai_kernels`.
    Parameters: the move's, the record's (status, info, data, time), the kernels'."""
    key = (move_sql, kernels_sql, kernels_back)
    known = _combined.get(key)
    if known is None:
        known = (
            f"WITH moved AS ({move_sql}), logged AS (INSERT INTO session_transitions "
            "SELECT id, ?::text, ?::text, ?::text, ?::text FROM moved)"
        )
        if kernels_sql is not None:
            back = " RETURNING *" if kernels_back else ""
            known += f", followed AS ({kernels_sql} AND EXISTS (SELECT 1 FROM moved){back})"
        if kernels_back:
            known += " SELECT moved.*, (SELECT json_agg(followed) FROM followed) AS bai_kernels FROM moved"
        else:
            known += " SELECT * FROM moved"
        if len(_combined) < 512:
            _combined[key] = known
    return known


def _moved_with_kernels(row: Any) -> tuple[Session, list[Kernel]]:
    """A moved session's row as `_combined_statement` gives it with `kernels_back`: the session, and its kernels
    as changed, in cluster order."""
    fields = decode(row)
    kernels = sorted((_kernel_of_json(k) for k in fields.pop("bai_kernels") or ()), key=cluster_order)
    return Session(**fields), kernels


def _kernel_of_json(row: dict[str, Any]) -> Kernel:
    """A kernel from its row as PostgreSQL's json_agg gives it (its columns by name; JSON ones as text)."""
    return Kernel(**decode_mapping(row))


def cluster_order(kernel: Kernel) -> tuple[bool, int]:
    """main1 first, then sub1, sub2 … (a kernel's place in its session)."""
    return kernel.cluster_role != "main", kernel.cluster_idx


_KERNEL_FOLLOWS = frozenset({"status", "status_info", "status_changed", "terminated_at"})
_kernel_statements: dict[tuple[bool, tuple[str, ...], bool], str] = {}


def _kernels_statement(terminated: bool, own: tuple[str, ...], returning: bool) -> str:
    """The UPDATE of a session's kernels following it (with terminated_at when it ends), with one kernel's own
    columns (`own`: each set on that kernel only, its id and value as parameters), reading them back when
    `returning`; kept per shape."""
    key = (terminated, own, returning)
    sql = _kernel_statements.get(key)
    if sql is None:
        sets = ["status=?", "status_info=?", "status_changed=?"]
        if terminated:
            sets.append("terminated_at=?")
        sets += [f"{c}=CASE WHEN id=? THEN ? ELSE {c} END" for c in own]
        sql = f"UPDATE kernels SET {', '.join(sets)} WHERE session_id=?" + (" RETURNING *" if returning else "")
        if len(_kernel_statements) < 256:
            _kernel_statements[key] = sql
    return sql


_LIVE = LIVE  # (the statuses of sessions_live_name's condition, as written there: the check reads that index)


def _live_named(conn: sqlite3.Connection, access_key: str, name: str) -> Session | None:
    """The owner's active session of that name (names are unique among live ones), if any."""
    row = conn.execute(
        f"SELECT * FROM sessions WHERE access_key=? AND name=? AND status IN ({_LIVE})", (access_key, name)
    ).fetchone()
    return None if row is None else _session(row)


def _create_or_get(conn: sqlite3.Connection, session: NewSession, kernels: list[NewKernel]) -> tuple[Session, bool]:
    """Inside the caller's transaction: (the new PENDING session as stored, True), or (the owner's active session
    of that name, False) with nothing inserted (names are unique among live ones). PostgreSQL, one kernel (the
    usual case): one statement, the check and the insert in its data-modifying WITH (a round trip fewer)."""
    if getattr(conn, "writable_ctes", False):
        if len(kernels) == 1:
            return cast(tuple[Session, bool], _create_at_once(session, kernels)(conn))
        return _check_and_insert(conn, session, kernels)
    return _insert_or_get(conn, session, kernels)


def _insert_or_get(conn: sqlite3.Connection, session: NewSession, kernels: list[NewKernel]) -> tuple[Session, bool]:
    """SQLite's `_create_or_get`: the insert first (its ON CONFLICT skips a live name), the live session of that
    name read only when it inserted nothing, so the usual create is one statement fewer. Exact: SQLite has one
    writer, which holds the database for the whole transaction (no one else stores or ends that name meanwhile)."""
    made = _insert_session(conn, session, kernels)
    if made is not None:
        return made, True
    return _check_and_insert(conn, session, kernels)  # (reads the live one; inserts should it have gone meanwhile)


def _check_and_insert(conn: sqlite3.Connection, session: NewSession, kernels: list[NewKernel]) -> tuple[Session, bool]:
    """`_create_or_get` statement by statement. The unique index of live names has the last word: on PostgreSQL a
    create through another manager (which takes no lock: see postgres/db.py) may store the name between the check
    and the insert, which then inserts nothing, and the session it stored is read again (each statement sees what
    was committed before it)."""
    for _ in range(_CREATE_TRIES):
        taken = _live_named(conn, session.access_key, session.name)
        if taken is not None:
            return taken, False
        made = _insert_session(conn, session, kernels)
        if made is not None:
            return made, True
    raise sqlite3.IntegrityError(
        f"session name {session.name!r}: stored and ended again by others {_CREATE_TRIES} times while it was created"
    )


_CREATE_TRIES = 3  # (a name another manager stores, and ends, between each check and insert of this one)


def _create_at_once(session: NewSession, kernels: list[NewKernel]) -> OneStatement:
    """PostgreSQL, a session of one kernel: `_create_or_get` as one statement (to send with others)."""
    values, kernel_rows = _session_values(session, kernels)
    params = (session.access_key, session.name, *values, values[5], *kernel_rows[0])

    def finish(conn: Any, rows: list[Any]) -> tuple[Session, bool]:
        if not rows:  # another manager's create of that name committed while this one ran: read again
            return _check_and_insert(conn, session, kernels)
        fields = decode(rows[0])
        made = bool(fields.pop("bai_made"))
        return Session(**fields), made

    # (takes no write lock: names are kept unique by the index, numbers by a sequence)
    return OneStatement(_CREATE_AT_ONCE, params, finish, serialized=False)


def _session_values(session: NewSession, kernels: list[NewKernel]) -> tuple[tuple[Any, ...], list[tuple[Any, ...]]]:
    """The parameters of a new session's INSERT (_INSERT_SESSION), and of its kernels' (_INSERT_KERNEL)."""
    now = stamp(session.created_at)
    values = (
        session.id,
        session.name,
        session.access_key,
        session.image,
        session.type,
        now,
        json.dumps(session.requested_slots),
        json.dumps(session.environ),
        json.dumps(session.config),
        session.scaling_group,
        len(kernels),
        session.tag,
        now,
        session.domain_name,
        session.project_id,
        session.priority,
        session.time_limit,
    )
    kernel_rows = [
        (k.id, session.id, k.cluster_role, k.cluster_idx, session.image, now, json.dumps(k.slots), now) for k in kernels
    ]
    return values, kernel_rows


def _insert_session(conn: sqlite3.Connection, session: NewSession, kernels: list[NewKernel]) -> Session | None:
    """Insert a PENDING session (last in the queue) and its kernels, inside the caller's transaction; return
    the session as stored, or None (nothing inserted) when the owner has a live session of that name."""
    values, kernel_rows = _session_values(session, kernels)
    now = values[5]
    rows = conn.execute(_INSERT_SESSION, values).fetchall()  # (to the end: done before the next one)
    if not rows:
        return None
    row = rows[0]
    conn.execute("INSERT INTO session_transitions VALUES (?, 'PENDING', '', '{}', ?)", (session.id, now))
    conn.executemany(_INSERT_KERNEL, kernel_rows)
    return _session(row)


_INSERT_SESSION = (
    "INSERT INTO sessions(id, name, access_key, image, type, status, status_info, status_data, "
    "status_changed, requested_slots, environ, config, scaling_group, cluster_size, tag, "
    "created_at, domain_name, project_id, priority, time_limit, seq) "
    f"VALUES (?, ?, ?, ?, ?, 'PENDING', '', '{{}}', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, {NEXT_SESSION_NUMBER}) "
    f"ON CONFLICT (access_key, name) WHERE status IN ({_LIVE}) DO NOTHING RETURNING *"
)
_INSERT_KERNEL = (
    "INSERT INTO kernels(id, session_id, cluster_role, cluster_idx, image, status, "
    "status_changed, occupied_slots, created_at) VALUES (?, ?, ?, ?, ?, 'PENDING', ?, ?, ?)"
)
# (PostgreSQL: `_live_named`, then the session, its first record and its one kernel, in one statement; parameters:
# the owner and name, the session's, the record's time, the kernel's. Its one row: the new session with bai_made 1,
# or the live one of that name with bai_made 0.)
_CREATE_AT_ONCE = (
    f"WITH taken AS (SELECT * FROM sessions WHERE access_key=? AND name=? AND status IN ({_LIVE}) LIMIT 1), "
    "made AS (INSERT INTO sessions(id, name, access_key, image, type, status, status_info, status_data, "
    "status_changed, requested_slots, environ, config, scaling_group, cluster_size, tag, created_at, domain_name, "
    "project_id, priority, time_limit, seq) SELECT ?, ?, ?, ?, ?, 'PENDING', '', '{}', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
    f"?, ?, {NEXT_SESSION_NUMBER} "
    f"WHERE NOT EXISTS (SELECT 1 FROM taken) ON CONFLICT (access_key, name) WHERE status IN ({_LIVE}) DO NOTHING "
    "RETURNING *), "
    "logged AS (INSERT INTO session_transitions SELECT id, 'PENDING', '', '{}', ?::text FROM made), "
    "kernel AS (INSERT INTO kernels(id, session_id, cluster_role, cluster_idx, image, status, status_changed, "
    "occupied_slots, created_at) SELECT ?, ?, ?, ?, ?, 'PENDING', ?, ?, ? FROM made) "
    "SELECT *, 1 AS bai_made FROM made UNION ALL SELECT *, 0 FROM taken"
)


def _history_row(h: SchedulingAttempt, now: str) -> tuple[Any, ...]:
    return (h.session_id, now, now, h.outcome, h.status_info, h.msg, h.agents, json.dumps(h.predicates))


_INSERT_HISTORY = (
    "INSERT INTO scheduling_history(session_id, first_at, last_at, rounds, outcome, status_info, "
    "msg, agents, predicates) VALUES (?, ?, ?, 1, ?, ?, ?, ?, ?)"
)
_MERGE_HISTORY = "UPDATE scheduling_history SET last_at=?, rounds=rounds+1 WHERE rowid=?"


def _record_history(conn: sqlite3.Connection, history: list[SchedulingAttempt], now: str) -> None:
    """A round's rows for `scheduling_history`, inside the caller's transaction: each merged with its session's
    last row when nothing changed (outcome, info, message, agents), else added. The sessions' last rows are read
    in one statement (their ids as one JSON parameter: one prepared statement whatever their number), the
    merges and the additions written with one executemany each."""
    if not history:
        return
    ids = [h.session_id for h in history]
    if len(set(ids)) != len(ids):  # a session twice in one round: one after the other, each seeing the last
        for h in history:
            _record_history(conn, [h], now)
        return
    last = {
        r[0]: r[1:]
        for r in conn.execute(
            "SELECT session_id, rowid, outcome, status_info, msg, agents FROM scheduling_history WHERE rowid IN "
            "(SELECT MAX(rowid) FROM scheduling_history WHERE session_id IN (SELECT value FROM json_each(?)) "
            "GROUP BY session_id)",
            (json.dumps(ids),),
        ).fetchall()
    }
    merges, additions = [], []
    for h in history:
        before = last.get(h.session_id)
        if before is not None and tuple(before[1:]) == (h.outcome, h.status_info, h.msg, h.agents):
            merges.append((now, before[0]))
        else:
            additions.append(_history_row(h, now))
    if merges:
        conn.executemany(_MERGE_HISTORY, merges)
    if additions:
        conn.executemany(_INSERT_HISTORY, additions)


class Sessions(Queries):
    """Sessions and their kernels: creation, transitions (one transaction each), scheduling rounds and
    their history, look-ups."""

    async def create_session(self, session: NewSession, kernels: list[NewKernel]) -> str | None:
        """Insert a PENDING session and its kernels; if the owner already has an active session of
        that name, insert nothing and return that session's id (names are unique among live ones)."""

        row, made = await self.create_or_get_session(session, kernels)
        return None if made else row.id

    async def create_or_get_session(self, session: NewSession, kernels: list[NewKernel]) -> tuple[Session, bool]:
        """As `create_session`, in the same one transaction: (the new session's row, True), or (the owner's
        active session of that name, False) when there is one (and nothing is inserted)."""

        if self.db.one_statement_writes and len(kernels) == 1:
            return cast(tuple[Session, bool], await self.db.transaction(_create_at_once(session, kernels)))

        def fn(conn: sqlite3.Connection) -> tuple[Session, bool]:
            return _create_or_get(conn, session, kernels)

        return await self.db.transaction(fn)

    async def transition(
        self,
        session_id: str,
        target: SessionStatus,
        status_info: str = "",
        status_data: dict[str, Any] | None = None,
        *,
        allowed_from: Iterable[SessionStatus] | None = None,
        kernel_updates: dict[str, KernelChanges] | None = None,
        result: str | None = None,
        now: datetime,
    ) -> Session | None:
        """Move a session to `target` in one transaction, at `now` (the caller's clock); return the updated row.

        Returns None (and changes nothing) when the session is not in `allowed_from`;
        raises IllegalTransition for a move the lifecycle forbids. Kernels listed in
        `kernel_updates` get their columns updated in the same transaction; the kernels'
        status follows the session's unless given.
        """
        at = stamp(now)
        args = (session_id, target, status_info, status_data, allowed_from, kernel_updates, result, at)
        if self.db.one_statement_writes:
            one = _one_transition(args)
            if one is not None:
                return cast(Session | None, await self.db.transaction(one))
        return await self.db.transaction(lambda conn: _transition(conn, *args))

    async def start_preparing(
        self, session_id: str, now: datetime
    ) -> tuple[Session, list[Kernel], list[Dotfile]] | None:
        """A SCHEDULED session goes PREPARING at `now` (as `transition`), and what starting its kernel needs is
        read in the same transaction: (its row, its kernels in cluster order, its owner's dotfiles). None (and
        nothing changed) when it is no longer SCHEDULED."""

        at = stamp(now)
        S = SessionStatus

        def dotfiles_of(conn: Any, row: Session) -> list[Dotfile]:
            owners = self.db.dotfile_owners  # (most keypairs have none: no read for theirs)
            if owners is None:
                owners = self.db.dotfile_owners = {
                    r[0] for r in conn.execute("SELECT DISTINCT access_key FROM dotfiles")
                }
            if row.access_key not in owners:
                return []
            return [
                Dotfile(r[0], r[1], r[2])
                for r in conn.execute(
                    "SELECT path, data, permission FROM dotfiles WHERE access_key=? ORDER BY path", (row.access_key,)
                ).fetchall()
            ]

        def fn(conn: sqlite3.Connection) -> tuple[Session, list[Kernel], list[Dotfile]] | None:
            kernels: list[Kernel] = []
            row = _transition(conn, session_id, S.PREPARING, "", {}, [S.SCHEDULED], None, None, at, kernels)
            if row is None:
                return None
            return row, kernels, dotfiles_of(conn, row)

        if self.db.one_statement_writes:  # (PostgreSQL: the move and its kernels one statement, sent with others)
            plan = _plan(session_id, S.PREPARING, "", {}, frozenset([S.SCHEDULED]), None, None, at)
            sql, params = _combined_of(plan, _kernels_statement(plan.terminated, plan.own_cols, False), True)

            def finish(conn: Any, rows: list[Any]) -> tuple[Session, list[Kernel], list[Dotfile]] | None:
                if not rows:
                    return fn(conn)  # (it did not move: as a transition alone, which says why)
                row, kernels = _moved_with_kernels(rows[0])
                return row, kernels, dotfiles_of(conn, row)

            return cast(
                tuple[Session, list[Kernel], list[Dotfile]] | None,
                await self.db.transaction(OneStatement(sql, params, finish)),
            )
        return await self.db.transaction(fn)

    async def apply_round(
        self,
        placements: list[tuple[str, dict[str, str]]],
        cancels: list[tuple[str, str, dict[str, Any]]],
        pending: list[tuple[str, str, dict[str, Any]]],
        history: list[SchedulingAttempt],
        now: datetime,
    ) -> tuple[list[Session], list[Session]]:
        """Apply one scheduling round in ONE transaction, at `now` (the transitions' and the history's time).

        placements: (session id, {kernel id: agent id}) → SCHEDULED; cancels: (id, status_info, data)
        → CANCELLED; pending: (id, status_info, data) recorded on sessions still PENDING; history:
        rows for `scheduling_history` (merged with the session's last row when nothing changed).
        Returns the rows that were scheduled and cancelled (sessions no longer PENDING are skipped). Raises
        NotLeading (nothing stored) when several managers share the database and this one's lease is gone.
        """

        at = stamp(now)

        def fn(conn: sqlite3.Connection) -> tuple[list[Session], list[Session]]:
            self.db.fence(conn)  # (several managers: only the leader's round is stored)
            pending_only = [SessionStatus.PENDING]
            placed: list[tuple[Any, ...]] = [
                (sid, SessionStatus.SCHEDULED, "scheduled", {}, pending_only,
                 {kid: KernelChanges(agent_id=agent) for kid, agent in agents.items()}, None, at)
                for sid, agents in placements
            ]  # fmt: skip
            ended = [
                (sid, SessionStatus.CANCELLED, info, data, pending_only, None, None, at) for sid, info, data in cancels
            ]
            moved = _transitions(conn, placed + ended)
            scheduled = [row for row in moved[: len(placed)] if row is not None]
            cancelled = [row for row in moved[len(placed) :] if row is not None]
            conn.executemany(
                "UPDATE sessions SET status_info=?, status_data=? WHERE id=? AND status='PENDING'",
                [(info, json.dumps(data), sid) for sid, info, data in pending],
            )
            _record_history(conn, history, at)
            return scheduled, cancelled

        return await self.db.transaction(fn)

    async def search_scheduling_history(
        self, search: HistorySearch, keep: Callable[[SchedulingAttempt], bool], offset: int, limit: int
    ) -> tuple[list[SchedulingAttempt], int]:
        if search.by not in ("first_at", "last_at"):  # (a column name: never from the request as it came)
            raise ValueError(f"cannot order the scheduling history by {search.by!r}")
        where = ["outcome IN (SELECT value FROM json_each(?))"]
        params: list[Any] = [json.dumps(search.outcomes)]
        if search.session_ids is not None:
            where.append("session_id IN (SELECT value FROM json_each(?))")
            params.append(json.dumps(search.session_ids))
        if search.not_session_ids:
            where.append("session_id NOT IN (SELECT value FROM json_each(?))")
            params.append(json.dumps(search.not_session_ids))
        direction = "DESC" if search.descending else "ASC"
        sql = (
            "SELECT rowid, session_id, first_at, last_at, rounds, outcome, status_info, msg, agents, predicates "
            f"FROM scheduling_history WHERE {' AND '.join(where)} ORDER BY {search.by} {direction}, rowid {direction}"
        )

        def fn(conn: sqlite3.Connection) -> tuple[list[SchedulingAttempt], int]:
            page: list[SchedulingAttempt] = []
            total = 0
            for r in conn.execute(sql, params):  # (rows read one by one: only the page is kept)
                attempt = SchedulingAttempt(
                    r["session_id"],
                    r["outcome"],
                    r["status_info"],
                    r["msg"],
                    r["agents"],
                    [],  # (the failed checks: decoded for the page's rows only)
                    r["first_at"],
                    r["last_at"],
                    r["rounds"],
                    r["rowid"],
                )  # fmt: skip
                if keep(attempt):
                    if offset <= total < offset + limit:
                        page.append(msgspec.structs.replace(attempt, predicates=json.loads(r["predicates"])))
                    total += 1
            return page, total

        return await self.db.run(fn)

    async def scheduling_history(self, session_id: str) -> list[SchedulingAttempt]:
        def fn(conn: sqlite3.Connection) -> list[SchedulingAttempt]:
            rows = conn.execute(
                "SELECT rowid, first_at, last_at, rounds, outcome, status_info, msg, agents, predicates "
                "FROM scheduling_history WHERE session_id=? ORDER BY rowid",
                (session_id,),
            ).fetchall()
            return [
                SchedulingAttempt(
                    session_id,
                    r["outcome"],
                    r["status_info"],
                    r["msg"],
                    r["agents"],
                    json.loads(r["predicates"]),
                    r["first_at"],
                    r["last_at"],
                    r["rounds"],
                    r["rowid"],
                )  # fmt: skip
                for r in rows
            ]

        return await self.db.run(fn)

    async def update_kernel(self, kernel_id: str, changes: KernelChanges) -> None:
        """Change a kernel's columns outside a transition (e.g. the exit code an agent reported)."""
        cols = _kernel_columns(changes)
        if not cols:
            return
        sets = ", ".join(f"{c}=?" for c in cols)
        await self.db.transaction(
            lambda conn: conn.execute(f"UPDATE kernels SET {sets} WHERE id=?", (*cols.values(), kernel_id))
        )

    async def get_session(self, session_id: str) -> Session | None:
        def fn(conn: sqlite3.Connection) -> Session | None:
            row = conn.execute("SELECT * FROM sessions WHERE id=?", (session_id,)).fetchone()
            return None if row is None else _session(row)

        return await self.db.run(fn)

    async def count_sessions_by_status(self) -> dict[str, int]:
        return await self.db.run(
            lambda conn: dict(conn.execute("SELECT status, COUNT(*) FROM sessions GROUP BY status").fetchall())
        )

    async def count_sessions_of(self, access_key: str, statuses: Iterable[SessionStatus]) -> int:
        """How many of the keypair's sessions are in these statuses: one range of the sessions_owner_status
        index per status (GET /bai/quota's pendingSessions)."""
        values = [s.value for s in statuses]

        def fn(conn: sqlite3.Connection) -> int:
            sql = f"SELECT COUNT(*) FROM sessions WHERE access_key = ? AND status IN ({','.join('?' * len(values))})"
            return int(conn.execute(sql, (access_key, *values)).fetchone()[0])

        return await self.db.run(fn)

    async def sessions_by_ids(self, session_ids: list[str]) -> list[Session]:
        """The sessions with these ids (those that exist), in one read."""

        def fn(conn: sqlite3.Connection) -> list[Session]:
            out: list[Session] = []
            for start in range(0, len(session_ids), 500):  # stay under SQLite's parameter limit
                chunk = session_ids[start : start + 500]
                sql = f"SELECT * FROM sessions WHERE id IN ({','.join('?' * len(chunk))})"
                out.extend(_session(r) for r in conn.execute(sql, chunk).fetchall())
            return out

        return await self.db.run(fn)

    async def sessions_overlapping(self, start: datetime, end: datetime) -> list[Session]:
        """Sessions that ran during [start, end) (started before `end`, not ended before `start`), in the order they
        started. Times are compared as stored (ISO 8601 text in UTC, byte by byte)."""
        sql = (
            "SELECT * FROM sessions WHERE started_at IS NOT NULL AND started_at < ? "
            "AND (terminated_at IS NULL OR terminated_at >= ?) ORDER BY started_at, seq"
        )
        args = (stamp(end.astimezone(UTC)), stamp(start.astimezone(UTC)))
        return await self.db.run(lambda conn: [_session(r) for r in conn.execute(sql, args).fetchall()])

    async def find_sessions(
        self, ref: str, access_key: str | None, *, active_only: bool, ids_of: str | None | bool = True
    ) -> list[Session]:
        """Sessions whose id (or id prefix of 8+ chars) or name matches `ref`, newest first.

        Names are looked up among `access_key`'s sessions (None: anyone's); ids among `ids_of`'s
        (True, the default: the same keypair as names; None: anyone's)."""
        id_owner = access_key if ids_of is True else ids_of

        def fn(conn: sqlite3.Connection) -> list[Session]:
            # indexed look-ups (id, owner+name, id range for a prefix) rather than one OR that scans
            only_id_owner = " AND access_key = :ids" if id_owner is not None else ""
            matches = "SELECT id FROM sessions WHERE id = :ref" + only_id_owner
            if access_key is not None:
                matches += " UNION SELECT id FROM sessions WHERE access_key = :names AND name = :ref"
            else:
                matches += " UNION SELECT id FROM sessions WHERE name = :ref"
            if len(ref) >= 8:
                matches += " UNION SELECT id FROM sessions WHERE id >= :ref AND id < :ref || '~'" + only_id_owner
            sql = f"SELECT * FROM sessions WHERE id IN ({matches})"
            if active_only:
                sql += f" AND status IN ({','.join(repr(s.value) for s in ACTIVE_STATUSES)})"
            params = {"ref": ref, "names": access_key, "ids": id_owner}
            return [_session(r) for r in conn.execute(sql + " ORDER BY seq DESC", params).fetchall()]

        return await self.db.run(fn)

    async def list_sessions(
        self, access_key: str | None, statuses: Iterable[SessionStatus] | None, limit: int = -1, newest: bool = False
    ) -> list[Session]:
        """Sessions in queue order (`newest`: the latest first); `limit` -1 means all of them."""

        def fn(conn: sqlite3.Connection) -> list[Session]:
            clauses: list[str] = []
            params: list[Any] = []
            if access_key is not None:
                clauses.append("access_key = ?")
                params.append(access_key)
            if statuses is not None:
                values = [s.value for s in statuses]
                if not values:
                    return []  # (no status: no session; `IN ()` is no SQL to PostgreSQL)
                clauses.append(f"status IN ({','.join('?' * len(values))})")
                params.extend(values)
            where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
            sql = f"SELECT * FROM sessions {where} ORDER BY seq {'DESC' if newest else ''}"
            if limit >= 0:
                sql += " LIMIT ?"
                params.append(limit)
            return [_session(r) for r in conn.execute(sql, params).fetchall()]

        return await self.db.run(fn)

    async def usage_by_keypair(self, statuses: Iterable[SessionStatus]) -> list[tuple[str, dict[str, str], int]]:
        """What the sessions in these statuses hold: (access key, requested slots (wire form), how many
        sessions of that keypair request exactly those), in one read that decodes each kind of request once."""
        values = [s.value for s in statuses]

        def fn(conn: sqlite3.Connection) -> list[tuple[str, dict[str, str], int]]:
            rows = conn.execute(
                f"SELECT access_key, requested_slots, COUNT(*) FROM sessions "
                f"WHERE status IN ({','.join('?' * len(values))}) GROUP BY access_key, requested_slots",
                values,
            ).fetchall()
            return [(r[0], json.loads(r[1]), r[2]) for r in rows]

        return await self.db.run(fn)

    async def kernels_of(self, session_id: str) -> list[Kernel]:
        return await self.db.statement(
            "SELECT * FROM kernels WHERE session_id=? ORDER BY cluster_role, cluster_idx",  # main1, sub1, sub2 …
            (session_id,),
            lambda _conn, rows: [_kernel(r) for r in rows],
        )

    async def kernels_of_many(self, session_ids: list[str]) -> dict[str, list[Kernel]]:
        """The kernels of several sessions in one read, keyed by session id."""

        def fn(conn: sqlite3.Connection) -> dict[str, list[Kernel]]:
            out: dict[str, list[Kernel]] = {}
            for start in range(0, len(session_ids), 500):  # stay under SQLite's parameter limit
                chunk = session_ids[start : start + 500]
                rows = conn.execute(
                    f"SELECT * FROM kernels WHERE session_id IN ({','.join('?' * len(chunk))}) "
                    "ORDER BY session_id, cluster_role, cluster_idx",  # main1, sub1, sub2 …
                    chunk,
                ).fetchall()
                for r in rows:
                    out.setdefault(r["session_id"], []).append(_kernel(r))
            return out

        return await self.db.run(fn)

    async def kernels_where(self, statuses: Iterable[str], agent_id: str | None = None) -> list[Kernel]:
        values = list(statuses)

        def fn(conn: sqlite3.Connection) -> list[Kernel]:
            sql = f"SELECT * FROM kernels WHERE status IN ({','.join('?' * len(values))})"
            params: list[Any] = list(values)
            if agent_id is not None:
                sql += " AND agent_id = ?"
                params.append(agent_id)
            return [_kernel(r) for r in conn.execute(sql, params).fetchall()]

        return await self.db.run(fn)

    async def kernel_owners(self, kernel_ids: list[str]) -> dict[str, tuple[str, str, str]]:
        """Kernel id -> (session id, its owner's access key, the kernel's status) for those that exist."""

        def fn(conn: sqlite3.Connection) -> dict[str, tuple[str, str, str]]:
            out: dict[str, tuple[str, str, str]] = {}
            for i in range(0, len(kernel_ids), 500):
                chunk = kernel_ids[i : i + 500]
                sql = (
                    "SELECT k.id, k.session_id, s.access_key, k.status FROM kernels k JOIN sessions s "
                    f"ON s.id = k.session_id WHERE k.id IN ({','.join('?' * len(chunk))})"
                )
                for kid, sid, owner, status in conn.execute(sql, chunk).fetchall():
                    out[kid] = (sid, owner, status)
            return out

        return await self.db.run(fn)

    async def get_kernel(self, kernel_id: str) -> Kernel | None:
        def fn(conn: sqlite3.Connection) -> Kernel | None:
            row = conn.execute("SELECT * FROM kernels WHERE id=?", (kernel_id,)).fetchone()
            return None if row is None else _kernel(row)

        return await self.db.run(fn)

    async def transitions_of(self, session_id: str) -> list[Transition]:
        return await self.db.run(
            lambda conn: [
                Transition(**decode(r))
                for r in conn.execute(
                    "SELECT status, status_info, status_data, at FROM session_transitions "
                    "WHERE session_id=? ORDER BY rowid",
                    (session_id,),
                ).fetchall()
            ]
        )

    async def rename_session(self, session_id: str, access_key: str, name: str) -> bool:
        """Give an active session a new name, in one transaction: False (and nothing changed) when its owner
        has another active session of that name (names are unique among live ones)."""

        def fn(conn: sqlite3.Connection) -> bool:
            live = ",".join(repr(s.value) for s in ACTIVE_STATUSES)
            taken = conn.execute(
                f"SELECT id FROM sessions WHERE access_key=? AND name=? AND id<>? AND status IN ({live})",
                (access_key, name, session_id),
            ).fetchone()
            if taken is not None:
                return False
            conn.execute("UPDATE sessions SET name=? WHERE id=?", (name, session_id))
            return True

        return await self.db.transaction(fn)

    async def set_session_priority(self, session_id: str, priority: int) -> bool:
        """A live session's priority (False: it has ended, or there is none)."""
        live = ",".join(repr(s.value) for s in ACTIVE_STATUSES)

        def fn(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                f"UPDATE sessions SET priority=? WHERE id=? AND status IN ({live})", (priority, session_id)
            )
            return cur.rowcount > 0

        return await self.db.transaction(fn)

    async def requeue(
        self, session_id: str, status_info: str, status_data: dict[str, Any], now: datetime
    ) -> Session | None:
        """A PREEMPTED session (its kernels removed) waits again: PENDING, with its kernels as new (no agent, no
        container, no devices or apps; their exit codes kept) and no start (its time limit counts from its next),
        in one transaction; its row, or None (nothing changed) when it is not PREEMPTED."""
        at = stamp(now)
        data = json.dumps(status_data)

        def fn(conn: sqlite3.Connection) -> Session | None:
            rows = conn.execute(
                "UPDATE sessions SET status='PENDING', status_info=?, status_data=?, status_changed=?, "
                "started_at=NULL, result='UNDEFINED' WHERE id=? AND status='PREEMPTED' RETURNING *",
                (status_info, data, at, session_id),
            ).fetchall()
            if not rows:
                return None
            conn.execute(
                "INSERT INTO session_transitions VALUES (?, 'PENDING', ?, ?, ?)", (session_id, status_info, data, at)
            )
            conn.execute(
                "UPDATE kernels SET status='PENDING', status_info=?, status_changed=?, agent_id=NULL, "
                "container_id=NULL, terminated_at=NULL, devices='[]', service_ports='[]' WHERE session_id=?",
                (status_info, at, session_id),
            )
            return _session(rows[0])

        return await self.db.transaction(fn)

    async def record_run(self, session_id: str, kernel_id: str, exit_code: int, result: str) -> None:
        """Record the exit code (on the kernel) and result (on the session) of a run that finished;
        no status change. A later destroy keeps both (its transition leaves them as they are)."""

        def fn(conn: sqlite3.Connection) -> None:
            conn.execute("UPDATE kernels SET exit_code=? WHERE id=?", (exit_code, kernel_id))
            conn.execute("UPDATE sessions SET result=? WHERE id=?", (result, session_id))

        await self.db.transaction(fn)

    async def set_pending_info(self, session_id: str, info: str, data: dict[str, Any]) -> None:
        """Record why a PENDING session is still pending (no status change, no transition row)."""
        await self.set_status_info(session_id, "PENDING", info, data)

    async def set_status_info(self, session_id: str, status: str, info: str, data: dict[str, Any]) -> Session | None:
        """Update the status info and data of a session still in `status` (no transition); its row, or None."""

        def fn(conn: sqlite3.Connection) -> Session | None:
            changed = conn.execute(
                "UPDATE sessions SET status_info=?, status_data=? WHERE id=? AND status=?",
                (info, json.dumps(data), session_id, status),
            ).rowcount
            if not changed:
                return None
            return _session(conn.execute("SELECT * FROM sessions WHERE id=?", (session_id,)).fetchone())

        return await self.db.transaction(fn)

    async def add_hook_notes(self, session_id: str, notes: list[str]) -> None:
        """Remember what went wrong with hooks for a session (shown in its status_data["hooks"])."""

        def fn(conn: sqlite3.Connection) -> None:
            row = conn.execute("SELECT config FROM sessions WHERE id=?", (session_id,)).fetchone()
            if row is not None:
                config = json.loads(row[0])
                config["hook_notes"] = [*config.get("hook_notes", []), *notes]
                conn.execute("UPDATE sessions SET config=? WHERE id=?", (json.dumps(config), session_id))

        await self.db.transaction(fn)
