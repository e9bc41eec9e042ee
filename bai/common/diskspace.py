"""Whether an error means a full disk (or an exhausted quota): ENOSPC / EDQUOT from a write, also when wrapped
(raised `from` one of those). The manager's state layer raises its full disk as such an OSError
(`bai.node.manager.state.errors.StorageFull`), whatever stores it."""

from __future__ import annotations

import errno

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def disk_full(e: BaseException | None) -> bool:
    while e is not None:
        if isinstance(e, OSError) and e.errno in DISK_FULL_ERRNOS:
            return True
        e = e.__cause__
    return False
