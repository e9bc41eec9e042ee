"""`STATE/node.json`: which process runs the node of a state folder, written once it is ready and removed
as it stops. `bai node status` and `bai node stop` read it.

    {"pid": N, "role": "all" | "manager" | "agent", "endpoint": URL or "" (an agent serves no API),
     "started": ISO time (UTC), "version": bai's, "state_dir": PATH}
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

FILE_NAME = "node.json"


def path_of(state_dir: Path) -> Path:
    return state_dir / FILE_NAME


def write(state_dir: Path, info: dict[str, Any]) -> Path:
    path = path_of(state_dir)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(info, indent=2) + "\n")
    os.replace(tmp, path)
    return path


def remove(state_dir: Path, pid: int) -> None:
    """Remove the file if it is still this process's (a second node of the folder may have replaced it)."""
    info = read(state_dir)
    if info is not None and info.get("pid") == pid:
        path_of(state_dir).unlink(missing_ok=True)


def read(state_dir: Path) -> dict[str, Any] | None:
    try:
        info = json.loads(path_of(state_dir).read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) and isinstance(info.get("pid"), int) else None


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, one that has exited but is not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc (not Linux): kill(0) is the answer
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def is_bai(pid: int) -> bool:
    """Whether process `pid` runs bai (a file left by a node killed with -9 may name a pid reused since by
    another program, which must not be taken for the node, let alone sent SIGTERM)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc, or not ours to read: the pid is all there is to go by
    return b"bai" in cmdline


def running(state_dir: Path) -> dict[str, Any] | None:
    """The node.json of a node that runs now for `state_dir` (None: none does, or the file is stale)."""
    info = read(state_dir)
    if info is None:
        return None
    pid = int(info["pid"])
    return info if alive(pid) and is_bai(pid) else None
