"""The one place that says how the API answers a domain error (bai/node/manager/domain_errors.py): its problem
(slug, title, message, data, HTTP status), as Backend.AI's clients expect them."""

from __future__ import annotations

from bai.common.problems import Problem, invalid, no_session
from bai.common.status import SessionStatus
from bai.node.link.base import AgentUnavailable, RemoteError
from bai.node.manager.domain_errors import (
    AppFailed,
    AppNotFound,
    Conflict,
    DomainError,
    Failed,
    Forbidden,
    Invalid,
    KeepsChanging,
    KernelNotFound,
    KernelUnreachable,
    NotFound,
    NotNow,
    NotRunning,
    SessionNotFound,
)
from bai.node.manager.state.errors import DatabaseUnavailable

S = SessionStatus
WAITING = frozenset({S.PENDING, S.SCHEDULED, S.PREPARING, S.PULLING, S.RESTARTING})


def what_to_do(status: str, status_info: str | None) -> str:
    """What the owner of a session can do while it is in `status` (for a request it cannot serve now)."""
    if status in WAITING:
        return "wait until it is RUNNING (`bai session info` shows its status)"
    if status == S.ERROR:
        why = f" ({status_info})" if status_info else ""
        return f"it failed{why}: destroy it with forced=true (`bai session destroy --force`) and start a new one"
    return "it has ended: start a new session"


def problem_of(error: DomainError) -> Problem:
    """The API's answer to `error`."""
    if isinstance(error, NotRunning):
        return Problem(
            "invalid-session-state",
            "The session is not in a status for this request.",
            f"{error.msg}; {what_to_do(error.status, error.status_info)}",
            {"status": error.status},
            409,
        )
    if isinstance(error, SessionNotFound):
        return no_session(error.ref)
    if isinstance(error, KernelNotFound):
        return Problem(
            "object-not-found", "No such kernel.", error.msg, {"kernel": error.ref, "kernels": error.kernels}, 404
        )
    if isinstance(error, KernelUnreachable):
        return Problem("instance-not-available", "Instance not available.", error.msg)
    if isinstance(error, Conflict):
        data = {"existingSessionId": error.existing} if error.existing is not None else None
        return Problem("session-already-exists", error.title, error.msg, data)
    if isinstance(error, Forbidden):
        return Problem("generic-forbidden", error.title, error.msg)
    if isinstance(error, Failed):
        return Problem("generic-bad-request", error.title, error.msg)
    if isinstance(error, KeepsChanging):
        return Problem("generic-bad-request", "The session keeps changing status.", error.msg, status=409)
    if isinstance(error, NotNow):
        return Problem(
            "invalid-session-state", "The session is not in a status for this request.", error.msg, status=409
        )
    if isinstance(error, AppNotFound):
        return Problem("object-not-found", "No such app.", error.msg, {"app": error.name, "apps": error.apps})
    if isinstance(error, AppFailed):
        data = {"app": error.name, "error": error.error, "output": error.output}
        return Problem("app-start-failed", "The app did not start.", error.msg, data, 409)
    if isinstance(error, NotFound):
        return Problem("object-not-found", "Not found.", error.msg, status=404)
    if isinstance(error, Invalid):
        return invalid(error.msg)
    return Problem("generic-bad-request", "Bad request.", error.msg)


def as_problem(error: Problem | DomainError) -> Problem:
    """A problem as it is, a domain error as the API answers it."""
    return error if isinstance(error, Problem) else problem_of(error)


def link_problem(error: BaseException) -> Problem | None:
    """What the API answers for a link error no service turned into a domain error (a kernel's agent away,
    silent, or refusing), or None for any other exception: never a 500 for what an agent did."""
    if isinstance(error, AgentUnavailable):
        return Problem("instance-not-available", "Instance not available.", str(error) or "the agent is away")
    if isinstance(error, DatabaseUnavailable):  # (PostgreSQL down: running kernels go on; this request waits)
        return Problem("database-unavailable", "The database cannot be reached.", f"{error}; try again shortly")
    if isinstance(error, TimeoutError):
        return Problem("instance-not-available", "Instance not available.", str(error) or "no answer in time")
    if isinstance(error, RemoteError):
        return invalid(error.message)
    return None
