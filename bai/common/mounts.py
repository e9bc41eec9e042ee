"""Where virtual folders are mounted in a kernel: `--mount NAME[:PATH][:ro]`, targets and their checks.

Pure functions (no I/O), shared by the CLI (parsing the flag) and the manager (checking a request).
Rules (reference spec §9): the default target is /home/work/NAME; a relative PATH goes under
/home/work; an absolute one may not be a system path (/bin, /etc, /usr, /proc, /tmp, …) nor the home
folder itself; two mounts may not share or nest their targets.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

HOME = "/home/work"
SYSTEM_PATHS = (
    "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32", "/opt/bai", "/proc",
    "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/var",
)  # fmt: skip


class MountError(ValueError):
    """A mount request that cannot be honoured; str() says why."""


@dataclass(frozen=True)
class MountRequest:
    """A virtual folder a session asks to mount: name, target path, read-only."""

    name: str  # the folder's name (or id) as the user gave it
    target: str  # absolute path in the kernel
    read_only: bool  # asked for read-only (a folder shared read-only is mounted read-only anyway)


def parse_mount_arg(text: str) -> tuple[str, str | None, bool]:
    """`NAME`, `NAME:PATH`, `NAME:ro`, `NAME:PATH:ro` (or `:rw`) → (name, path or None, read_only)."""
    parts = text.split(":")
    read_only = False
    if len(parts) > 1 and parts[-1] in ("ro", "rw"):
        read_only = parts.pop() == "ro"
    if len(parts) > 2 or not parts[0]:
        raise MountError(f"cannot read --mount {text!r}: use NAME[:PATH][:ro]")
    path = parts[1] if len(parts) == 2 and parts[1] else None
    return parts[0], path, read_only


def mount_target(name: str, path: str | None) -> str:
    """The absolute target of a mount, or MountError when it is not allowed."""
    raw = path if path else name
    if "\x00" in raw:
        raise MountError("a mount path cannot contain NUL")
    p = PurePosixPath(raw)
    if ".." in p.parts:
        raise MountError(f"mount path {raw!r} may not contain '..'")
    if not p.is_absolute():
        p = PurePosixPath(HOME) / p
    target = str(p)
    if target == HOME:
        raise MountError(f"cannot mount {name!r} over {HOME} itself (the kernel's home)")
    if target.startswith(HOME + "/"):
        return target
    if target == "/" or any(target == s or target.startswith(s + "/") for s in SYSTEM_PATHS):
        raise MountError(f"cannot mount {name!r} at {target}: a system path")
    return target


def plan_mounts(mounts: Any, mount_map: Any, options: Any) -> list[MountRequest]:
    """Check Backend.AI's `mounts` (names), `mount_map` ({name: path}) and bai's `mount_options`
    ({name: {"permission": "ro" | "rw"}}) and return one request per folder."""
    mounts = mounts or []
    mount_map = mount_map or {}
    options = options or {}
    if not isinstance(mounts, list) or not all(isinstance(m, str) and m for m in mounts):
        raise MountError("config.mounts must be a list of folder names")
    if not isinstance(mount_map, dict) or not all(isinstance(v, str) for v in mount_map.values()):
        raise MountError("config.mount_map must map folder names to paths")
    if not isinstance(options, dict) or not all(isinstance(v, dict) for v in options.values()):
        raise MountError("config.mount_options must map folder names to options")
    names = list(dict.fromkeys([*mounts, *mount_map]))
    out: list[MountRequest] = []
    for name in names:
        permission = (options.get(name) or {}).get("permission", "rw")
        if permission not in ("ro", "rw"):
            raise MountError(f"mount permission of {name!r} must be ro or rw")
        out.append(MountRequest(name, mount_target(name, mount_map.get(name)), permission == "ro"))
    for i, a in enumerate(out):
        for b in out[i + 1 :]:
            if a.target == b.target or a.target.startswith(b.target + "/") or b.target.startswith(a.target + "/"):
                raise MountError(f"mount targets overlap: {a.target} ({a.name}) and {b.target} ({b.name})")
    return out


def mount_config(args: list[str]) -> dict[str, Any]:
    """The `config` keys for a create request from `--mount` flags."""
    mounts: list[str] = []
    mount_map: dict[str, str] = {}
    options: dict[str, dict[str, str]] = {}
    for text in args:
        name, path, read_only = parse_mount_arg(text)
        mounts.append(name)
        if path:
            mount_map[name] = path
        if read_only:
            options[name] = {"permission": "ro"}
    plan_mounts(mounts, mount_map, options)  # the same checks the manager makes, before asking it
    return {"mounts": mounts, "mount_map": mount_map, "mount_options": options}
