"""A full disk on the node: `507 Insufficient Storage`, saying which storage is full; nothing is changed.

Disk-full shows up as the state layer's `StorageFull` (`bai.node.manager.state.errors`: it says so, whatever
stores the state) on a write to the node's state, and as an OSError with ENOSPC (no space left) or EDQUOT (over
the quota) on a write to a file.
Code that writes to a folder host wraps its file writes in `storage_of(...)`, which names the storage;
the API's error middleware turns every such error into one problem (`insufficient_storage`); background
writers (heartbeats, kernel logs) use `FullDiskWarnings` to warn once and carry on.

What failed changed nothing: a database write is one transaction, rolled back; a vfolder write leaves
no half-made folder or file behind (an upload stays where it was, to be resumed).
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager

from bai.common.diskspace import DISK_FULL_ERRNOS, disk_full
from bai.common.problems import Problem
from bai.node.manager.state import errors as state_errors

DATABASE = "the node's database"
STATUS = 507
SLUG = "insufficient-storage"
TITLE = "Insufficient storage."


def vfolder_host(name: str) -> str:
    """How a message names a vfolder host's storage."""
    return f"virtual folder host {name!r}"


class StorageFull(Exception):
    """A write refused because the disk holding `where` is full (or over its quota)."""

    def __init__(self, where: str, cause: BaseException | None = None, changed: str | None = None) -> None:
        super().__init__(f"{where}: {cause}" if cause is not None else where)
        self.where = where
        self.cause = cause
        self.changed = changed  # what did change before the write failed (None: nothing)


def is_disk_full(e: BaseException) -> bool:
    """Whether an error is a full disk (or quota): the state's StorageFull, ENOSPC, EDQUOT, or a StorageFull."""
    return isinstance(e, StorageFull | state_errors.StorageFull) or disk_full(e)


def where_full(e: BaseException) -> str:
    """The storage a disk-full error is about."""
    if isinstance(e, StorageFull):
        return e.where
    if isinstance(e, state_errors.StorageFull):
        return DATABASE
    return "a disk of the node"


def _over_quota(e: BaseException) -> bool:
    cause = e.cause if isinstance(e, StorageFull) else e
    return isinstance(cause, OSError) and cause.errno == errno.EDQUOT


def describe(e: BaseException) -> str:
    """What a disk-full error says: which storage is full and what it means for the write."""
    full = "is over its disk quota" if _over_quota(e) else "is on a full disk"
    changed = e.changed if isinstance(e, StorageFull) and e.changed else "nothing was changed"
    return (
        f"{where_full(e)} {full}: {changed}. Reading still works; writes work again once space is freed "
        "there (ask the node's administrator)."
    )


def insufficient_storage(e: BaseException) -> Problem:
    """The problem (507) a disk-full error is answered with."""
    return Problem(SLUG, TITLE, describe(e), status=STATUS)


@contextmanager
def storage_of(where: str) -> Iterator[None]:
    """Turn a disk-full OSError raised inside into StorageFull(where); other errors pass through."""
    try:
        yield
    except OSError as e:
        if e.errno in DISK_FULL_ERRNOS and not isinstance(e, state_errors.StorageFull):  # (that one names its own)
            raise StorageFull(where, e) from e
        raise


class FullDiskWarnings:
    """For writers in the background: one WARNING when a write of theirs finds the disk full, not one
    per write (a heartbeat every few seconds), and one INFO line once such writes work again."""

    def __init__(self, log: logging.Logger) -> None:
        self.log = log
        self.failing: set[str] = set()

    def failed(self, what: str, e: BaseException) -> bool:
        """Note a failed write; True when it was a full disk (warned about once), False for any other error."""
        if not is_disk_full(e):
            return False
        if what not in self.failing:
            self.failing.add(what)
            self.log.warning(
                "%s failed: %s is on a full disk (%s); the node carries on (said once, until space is freed)",
                what,
                where_full(e),
                e,
            )
        return True

    async def attempt(self, what: str, write: Awaitable[object]) -> bool:
        """Await a write nobody waits for (a heartbeat, kernel output): on a full disk it is dropped with
        one warning (not one per write) and the caller carries on; other errors are raised. Whether it
        was written."""
        try:
            await write
        except Exception as e:
            if not self.failed(what, e):
                raise
            return False
        self.ok(what)
        return True

    def ok(self, what: str) -> None:
        """A write worked: warn again should the disk fill up again."""
        if what in self.failing:
            self.failing.discard(what)
            self.log.info("%s works again (the disk has space again)", what)
