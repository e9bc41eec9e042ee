"""Whether an error means a full disk (or an exhausted quota): SQLite's SQLITE_FULL, or ENOSPC / EDQUOT
from a file write, also when wrapped (raised `from` one of those)."""

from __future__ import annotations

import errno
import sqlite3

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def disk_full(e: BaseException | None) -> bool:
    while e is not None:
        if isinstance(e, sqlite3.Error):
            code = getattr(e, "sqlite_errorcode", None)  # Python 3.11+
            if isinstance(code, int):
                return code & 0xFF == sqlite3.SQLITE_FULL
            return "database or disk is full" in str(e)
        if isinstance(e, OSError) and e.errno in DISK_FULL_ERRNOS:
            return True
        e = e.__cause__
    return False
