"""Saving a kernel's log from the dashboard (Ctrl-s in the logs view): to ./SESSION-KERNEL.log, never over
a file that is there (then SESSION-KERNEL-1.log, -2 …)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def log_path(session: str, kernel: str, folder: Path | None = None) -> Path:
    """The first of ./SESSION-KERNEL.log, ./SESSION-KERNEL-1.log … that does not exist (names made safe)."""
    folder = folder or Path.cwd()
    stem = _UNSAFE.sub("_", f"{session}-{kernel}").strip("._") or "session"
    n = 0
    while True:
        path = folder / (f"{stem}.log" if n == 0 else f"{stem}-{n}.log")
        if not path.exists():
            return path
        n += 1


def save_log(lines: Iterable[str], session: str, kernel: str, folder: Path | None = None) -> Path:
    """Write `lines` (one per line) to a new file (`log_path`); returns where. Created exclusively: a file
    that appeared meanwhile is not overwritten either (the next name is taken)."""
    text = "".join(f"{line}\n" for line in lines)
    while True:
        path = log_path(session, kernel, folder)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        return path.resolve()
