"""What the state layer raises, whatever implementation is behind it."""

from __future__ import annotations

import errno

__all__ = ["DatabaseUnavailable", "NotLeading", "StateError", "StorageFull", "UnknownPolicy"]


class StateError(Exception):
    """An error of the state layer."""


class StorageFull(StateError, OSError):
    """A write refused because the storage of the state (its disk) is full, or over its quota: nothing of it
    was stored. Raised `from` the implementation's own error. An OSError with ENOSPC, so that code that knows
    only file systems (bai.common.diskspace) knows it for a full disk too."""

    where = "the node's database"

    def __init__(self, message: str) -> None:
        super().__init__(errno.ENOSPC, message)

    def __str__(self) -> str:
        return str(self.strerror)


class UnknownPolicy(StateError, KeyError):
    """A keypair written with a resource policy that does not exist (a KeyError, as it was)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"no resource policy {name!r}")
        self.name = name

    def __str__(self) -> str:
        return str(self.args[0])


class DatabaseUnavailable(StateError):
    """The database server cannot be reached (it is down, or the network between): nothing of the call was
    done, or, for a write whose COMMIT was under way when the connection broke, it may have been. Names the
    database as shown to people (never its password)."""

    def __init__(self, shown: str, cause: BaseException | None = None) -> None:
        reason = f": {str(cause).strip().splitlines()[0]}" if cause is not None and str(cause).strip() else ""
        super().__init__(f"the database {shown} cannot be reached{reason}")
        self.shown = shown


class NotLeading(StateError):
    """A write that only the leader of several managers may make (a scheduling round), refused because this
    manager no longer holds the leader lease in the database: nothing of it was stored. (A manager frozen past
    its lease wakes believing it leads; the database, where the next leader's lease is, knows better.)"""
