"""What `bai vfolder download` fetches: each path named, a folder as its whole tree (as upload sends one)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any


@dataclass
class DownloadPlan:
    """Local folders to make and (remote path, local path) of each file, both relative to the destination."""

    folders: list[str] = field(default_factory=list)
    files: list[tuple[str, str]] = field(default_factory=list)
    skipped: int = 0  # links in the trees (not followed)


async def _entry(c: Any, name: str, path: str) -> dict[str, Any] | None:
    """The listing entry of `path` in the folder (None: its parent lists no such name)."""
    pure = PurePosixPath(path)
    parent = "" if str(pure.parent) in (".", "/") else str(pure.parent)
    for item in await c.vfolder_files(name, parent):
        if item["name"] == pure.name:
            return item
    return None


async def _walk(c: Any, name: str, remote: str, local: str, plan: DownloadPlan) -> None:
    plan.folders.append(local)
    for item in await c.vfolder_files(name, remote):
        sub_remote = f"{remote}/{item['name']}" if remote else item["name"]
        sub_local = f"{local}/{item['name']}"
        if item["type"] == "dir":
            await _walk(c, name, sub_remote, sub_local, plan)
        elif item["type"] == "file":
            plan.files.append((sub_remote, sub_local))
        else:
            plan.skipped += 1


async def download_plan(c: Any, name: str, paths: list[str]) -> DownloadPlan:
    """A file downloads as that file, a folder as a folder of its name with everything under it; the vfolder's
    root ("" or "/") as a folder named after the vfolder. A path that is not there is left to the download
    itself to refuse (with the server's message)."""
    plan = DownloadPlan()
    for raw in paths:
        path = raw.strip("/")
        if path in ("", "."):
            await _walk(c, name, "", name, plan)
            continue
        entry = await _entry(c, name, path)
        if entry is not None and entry["type"] == "dir":
            await _walk(c, name, path, PurePosixPath(path).name, plan)
        else:
            plan.files.append((path, PurePosixPath(path).name))
    return plan


def local_targets(plan: DownloadPlan, dest: Path, force: bool) -> str | None:
    """Why the plan may not be written under `dest` (None: it may): a file where a folder goes, a folder where
    a file goes, or (without --force) a file that exists already."""
    for folder in plan.folders:
        target = dest / folder
        if target.exists() and not target.is_dir():
            return f"{target} is a file; not replacing it with a folder"
    for _, local in plan.files:
        target = dest / local
        if target.is_dir():
            return f"{target} is a folder; not overwriting it"
        if target.exists() and not force:
            return f"{target} exists already; not overwriting it (--force does)"
    return None
