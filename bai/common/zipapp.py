"""Running from the shiv zipapp (`bai.pyz`): keep only the current build's extraction.

shiv unpacks the zipapp into `$SHIV_ROOT` (default `~/.shiv`) as `<file name>_<build id>/site-packages`,
once per build, and never removes an old one; each is 50-60 MB. When bai starts from such an
extraction it removes the other builds of the same file name (and their lock files), so upgrades do not
fill the disk. From a virtualenv or a source checkout this does nothing.
"""

from __future__ import annotations

import shutil
from pathlib import Path


def current_extraction() -> Path | None:
    """The `<name>_<build id>` folder this bai runs from, or None outside a shiv zipapp."""
    site = Path(__file__).resolve().parents[2]  # …/<name>_<build>/site-packages/bai/common/zipapp.py
    extraction = site.parent
    if site.name != "site-packages" or "_" not in extraction.name:
        return None
    return extraction


def clean_old_extractions(extraction: Path | None = None) -> list[Path]:
    """Remove the other builds' extractions of this zipapp; returns what was removed."""
    extraction = extraction or current_extraction()
    if extraction is None:
        return []
    name = extraction.name.rsplit("_", 1)[0]
    removed = []
    for other in extraction.parent.glob(f"{name}_*"):
        if other != extraction and other.is_dir() and (other / "site-packages").is_dir():
            shutil.rmtree(other, ignore_errors=True)
            removed.append(other)
    build = extraction.name.rsplit("_", 1)[1]
    for lock in extraction.parent.glob(f".{name}_*_lock"):
        if lock.name != f".{name}_{build}_lock":
            lock.unlink(missing_ok=True)
    return removed
