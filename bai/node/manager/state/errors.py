"""What the state layer raises, whatever implementation is behind it."""

from __future__ import annotations

__all__ = ["StateError", "StorageFull", "UnknownPolicy"]


class StateError(Exception):
    """An error of the state layer."""


class StorageFull(StateError):
    """A write refused because the storage of the state (its disk) is full, or over its quota: nothing of it
    was stored. Raised `from` the implementation's own error."""

    where = "the node's database"


class UnknownPolicy(StateError, KeyError):
    """A keypair written with a resource policy that does not exist (a KeyError, as it was)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"no resource policy {name!r}")
        self.name = name

    def __str__(self) -> str:
        return str(self.args[0])
