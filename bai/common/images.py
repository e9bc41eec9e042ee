"""Image references: which part is a registry (pure)."""

from __future__ import annotations


def registry_of(ref: str) -> str | None:
    """The registry a reference names (`cr.backend.ai`, `127.0.0.1:5000`, `localhost`), or None for a
    local name such as `python` or `bai-python:3.11` (as Docker reads references)."""
    first, sep, _ = ref.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first
    return None
