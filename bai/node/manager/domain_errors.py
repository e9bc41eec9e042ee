"""What the manager's services refuse, in the services' words: domain errors.

A service raises one of these (never an HTTP exception, never a link error: `kernel_call` below turns
those into domain errors); `http/problems.py` is the one place that says how the API answers each.
"""

from __future__ import annotations

from bai.node.manager.state.records import Session


class DomainError(Exception):
    """A request the manager's state does not allow now (see http/problems.py for the API's answer)."""

    def __init__(self, msg: str) -> None:
        super().__init__(msg)
        self.msg = msg


class Invalid(DomainError):
    """The request itself is wrong (a bad name, a file the kernel refused, …)."""


class SessionNotFound(DomainError):
    """No session `ref` the caller may see."""

    def __init__(self, ref: str) -> None:
        super().__init__(f"Session (id={ref}) does not exist.")
        self.ref = ref


class NotFound(DomainError):
    """Something other than a session or kernel the request names does not exist (or is no longer kept): a 404."""


class KernelNotFound(DomainError):
    """The session has no kernel `ref`; `kernels`: the names of those it has."""

    def __init__(self, session_name: str, ref: str, kernels: list[str]) -> None:
        super().__init__(f"session {session_name} has no kernel {ref!r}; its kernels: {', '.join(kernels)}")
        self.ref = ref
        self.kernels = kernels


class NotRunning(DomainError):
    """The session's status does not allow the request now (`what`: what the request needs); the answer
    says the status and what its owner can do."""

    def __init__(self, session: Session, what: str) -> None:
        self.name: str = session.name
        self.status: str = session.status
        self.status_info: str | None = session.status_info
        self.what = what
        super().__init__(f"session {self.name} is {self.status}: {what}")


class NotNow(DomainError):
    """The session is in no state for the request (its status allows it, but not what it is doing): a 409."""


class KernelUnreachable(DomainError):
    """The kernel's agent could not be asked (it is away, or did not answer in time)."""

    def __init__(self, agent_id: str | None, why: str) -> None:
        super().__init__(why)
        self.agent_id = agent_id


class Conflict(DomainError):
    """A session of that name exists already (`existing`: its id, when the answer names it)."""

    def __init__(self, msg: str, title: str = "The session already exists.", existing: str | None = None) -> None:
        super().__init__(msg)
        self.title = title
        self.existing = existing


class Forbidden(DomainError):
    """The request is not allowed in the session's status (or by a hook): a 403."""

    def __init__(self, msg: str, title: str = "Forbidden.") -> None:
        super().__init__(msg)
        self.title = title


class Failed(DomainError):
    """An operation the kernel's agent did not complete (a restart, …): `title` names it."""

    def __init__(self, title: str, msg: str) -> None:
        super().__init__(msg)
        self.title = title


class KeepsChanging(DomainError):
    """A session kept changing status while a request followed it: try again (a 409)."""


class AppNotFound(DomainError):
    """The session offers no app `name` (`apps`: those it offers)."""

    def __init__(self, session_name: str, name: str, apps: list[str]) -> None:
        listed = ", ".join(apps) or "none (its image declares no ai.backend.service-ports)"
        super().__init__(f"session {session_name} offers no app {name!r}; its apps: {listed}")
        self.name = name
        self.apps = apps


class AppFailed(DomainError):
    """An app did not start: what went wrong, and what it printed."""

    def __init__(self, name: str, error: str, output: str) -> None:
        detail = f"{name} did not start: {error}"
        if output.strip():
            detail += f"\n--- its output ---\n{output.rstrip()}"
        super().__init__(detail)
        self.name = name
        self.error = error
        self.output = output
