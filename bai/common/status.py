"""Session and kernel states, their legal transitions and the status_info strings.

Names, transitions and strings follow Backend.AI (reference spec §3).
"""

from __future__ import annotations

from enum import StrEnum


class SessionStatus(StrEnum):
    """A session's lifecycle status (Backend.AI's names)."""

    PENDING = "PENDING"
    SCHEDULED = "SCHEDULED"
    PULLING = "PULLING"
    PREPARING = "PREPARING"
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"
    RUNNING_DEGRADED = "RUNNING_DEGRADED"
    TERMINATING = "TERMINATING"
    TERMINATED = "TERMINATED"
    ERROR = "ERROR"
    CANCELLED = "CANCELLED"
    # stopped by the scheduler to make room for a session of a higher priority (preemption): its kernels are being
    # removed; a batch session then waits again (PENDING: requeued), an interactive one ends (TERMINATED)
    PREEMPTED = "PREEMPTED"


S = SessionStatus

SESSION_TRANSITIONS: dict[SessionStatus, frozenset[SessionStatus]] = {
    S.PENDING: frozenset({S.SCHEDULED, S.TERMINATING, S.TERMINATED, S.ERROR, S.CANCELLED}),
    S.SCHEDULED: frozenset({S.PULLING, S.PREPARING, S.TERMINATED, S.ERROR, S.CANCELLED}),
    S.PULLING: frozenset({S.PREPARING, S.RUNNING, S.RUNNING_DEGRADED, S.TERMINATED, S.ERROR, S.CANCELLED}),
    S.PREPARING: frozenset(
        {S.PULLING, S.RUNNING, S.RUNNING_DEGRADED, S.TERMINATING, S.TERMINATED, S.ERROR, S.CANCELLED}
    ),
    S.RUNNING: frozenset({S.RESTARTING, S.RUNNING_DEGRADED, S.TERMINATING, S.TERMINATED, S.ERROR, S.PREEMPTED}),
    S.RESTARTING: frozenset({S.RUNNING, S.RUNNING_DEGRADED, S.TERMINATING, S.TERMINATED, S.ERROR, S.PREEMPTED}),
    S.RUNNING_DEGRADED: frozenset({S.RUNNING, S.TERMINATING, S.TERMINATED, S.ERROR, S.PREEMPTED}),
    S.TERMINATING: frozenset({S.TERMINATED, S.ERROR}),
    S.PREEMPTED: frozenset({S.PENDING, S.TERMINATED, S.ERROR}),
    S.ERROR: frozenset({S.TERMINATED}),
    S.TERMINATED: frozenset(),
    S.CANCELLED: frozenset(),
}

# What a forced destroy moves a live session to (Backend.AI's `forced=true` always ends a session): every
# live status has one, and each is a legal move above (tests/test_forced_end.py checks both). TERMINATING
# ends TERMINATED once the kernels are removed; TERMINATING and ERROR go there directly after that.
FORCED_DESTROY: dict[SessionStatus, SessionStatus] = {
    S.PENDING: S.CANCELLED,
    S.SCHEDULED: S.CANCELLED,
    S.PULLING: S.CANCELLED,
    S.PREPARING: S.TERMINATING,
    S.RUNNING: S.TERMINATING,
    S.RESTARTING: S.TERMINATING,
    S.RUNNING_DEGRADED: S.TERMINATING,
    S.TERMINATING: S.TERMINATED,
    S.PREEMPTED: S.TERMINATED,
    S.ERROR: S.TERMINATED,
}

DEAD_STATUSES = frozenset({S.TERMINATED, S.CANCELLED})
# Statuses in which a session holds resources on an agent.
OCCUPYING_STATUSES = frozenset(set(SessionStatus) - {S.PENDING, S.TERMINATED, S.CANCELLED})
ACTIVE_STATUSES = frozenset(set(SessionStatus) - DEAD_STATUSES)


# Statuses Backend.AI has (its clients filter by them: 26.x lists PREPARED and CREATING by default) that no bai
# session is ever in: a filter may name them and matches nothing by them.
UNUSED_STATUSES = frozenset({"PREPARED", "CREATING", "DEPRIORITIZING", "RESERVED", "RESCHEDULING"})


def statuses_named(text: str) -> list[SessionStatus]:
    """The statuses of a comma-separated filter (any case; Backend.AI's names that bai never uses match nothing).
    ValueError names a word that is no status at all."""
    named: list[SessionStatus] = []
    for word in (w.strip().upper() for w in text.split(",")):
        if not word or word in UNUSED_STATUSES:
            continue
        try:
            status = SessionStatus(word)
        except ValueError:
            known = ", ".join([*SessionStatus, *sorted(UNUSED_STATUSES)])
            raise ValueError(f"{word!r} is not a session status (one of {known})") from None
        if status not in named:
            named.append(status)
    return named


class IllegalTransition(Exception):
    """A status change the lifecycle does not allow."""

    def __init__(self, current: SessionStatus, target: SessionStatus) -> None:
        super().__init__(f"a session cannot go from {current} to {target}")
        self.current = current
        self.target = target


def check_transition(current: SessionStatus, target: SessionStatus) -> None:
    if target not in SESSION_TRANSITIONS[current]:
        raise IllegalTransition(current, target)


class StatusInfo:
    """The exact status_info strings of Backend.AI (reference spec §3.3)."""

    SCHEDULED = "scheduled"
    PREDICATE_CHECKS_FAILED = "predicate-checks-failed"
    NO_AVAILABLE_INSTANCES = "no-available-instances"
    SCHEDULER_ERROR = "scheduler-error"
    FAILED_TO_START = "failed-to-start"
    USER_REQUESTED = "user-requested"
    FORCE_TERMINATED = "force-terminated"
    SELF_TERMINATED = "self-terminated"
    AGENT_TERMINATION = "agent-termination"
    ALREADY_TERMINATED = "already-terminated"
    TASK_DONE = "task-done"
    TASK_FAILED = "task-failed"
    NOT_FOUND_IN_MANAGER = "not-found-in-manager"
    PENDING_TIMEOUT = "pending-timeout"
    AGENT_LOST = "agent-lost"
    IDLE_TIMEOUT = "idle-timeout"
    SESSION_LIFETIME = "idle-session-lifetime"
    # not a Backend.AI string: the session ran for the time limit it declared (`timeLimit`)
    TIME_LIMIT = "time-limit"
    # not a Backend.AI string: Backend.AI leaves such a session pending forever, we cancel it
    DEPENDENCY_FAILED = "dependency-failed"
    # not a Backend.AI string (it reports such a kernel as self-terminated, exit 137): the kernel was
    # killed by the out-of-memory killer at its memory limit; status_data {"exitCode", "msg"} names the limit
    OUT_OF_MEMORY = "out-of-memory"
    # not Backend.AI strings (its design names the reason PREEMPTED_BY_SCHEDULER): a running interactive session
    # told that it will be preempted at the end of its scaling group's grace period (status_data "preemption"
    # says by whom and when), and a session stopped by preemption (PREEMPTED, then PENDING or TERMINATED)
    PREEMPTING = "preempting"
    PREEMPTED = "preempted"


# Session lifecycle event names (reference spec §2.11), keyed by the status they announce.
SESSION_EVENTS: dict[SessionStatus, str] = {
    S.PENDING: "session_enqueued",
    S.SCHEDULED: "session_scheduled",
    S.PREPARING: "session_preparing",
    S.RUNNING: "session_started",
    S.CANCELLED: "session_cancelled",
    S.TERMINATING: "session_terminating",
    S.TERMINATED: "session_terminated",
    S.ERROR: "session_failure",
    S.PREEMPTED: "session_preempted",
}
