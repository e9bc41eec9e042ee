"""Session name rules (Backend.AI: 4-64 chars, `^\\w[\\w.-]*\\w$`, ASCII)."""

from __future__ import annotations

import re

NAME_RE = re.compile(r"^\w[\w.-]*\w$", re.ASCII)
RESERVED = {"from-template"}


def name_problem(name: str) -> str | None:
    """Why `name` cannot be a session name, or None when it can."""
    if not 4 <= len(name) <= 64 or not NAME_RE.match(name) or name in RESERVED:
        return (
            f"invalid session name {name!r}: use 4-64 letters, digits, '_', '-' or '.', "
            "starting and ending with a letter or digit"
        )
    return None
