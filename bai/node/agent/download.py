"""Files out of a kernel (`GET /session/{ref}/download`, the client's `session download`): one tar archive
per path, holding the file or folder under its own name (as `docker cp` and Backend.AI's agent make them).

`tar_path` is self-contained (standard library only, imports inside) so the Docker backend can send its
source to run with the container's own Python, as the kernel's user, where its files and mounts are; the
local backend calls it on the host path behind the kernel's view.
"""

from __future__ import annotations

import inspect
import posixpath
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import IO

HOME = "/home/work"
# tar_path's signature is annotated in quotes: its source runs without this module's
# `from __future__ import annotations`, on the kernel's Python, where IO is not imported.


class DownloadError(Exception):
    """A path that cannot be downloaded; the message says why."""


def kernel_path(path: str) -> str:
    """The absolute path in the kernel of a requested path (relative ones are under /home/work); only
    /home/work and what is below it (its mounted folders too) can be downloaded."""
    if not isinstance(path, str) or not path or "\0" in path:
        raise DownloadError("a file to download must be a non-empty path")
    full = posixpath.normpath(posixpath.join(HOME, path))
    if full != HOME and not full.startswith(HOME + "/"):
        raise DownloadError(f"{path}: only files under {HOME} can be downloaded")
    return full


def tar_path(path: str, out: "IO[bytes]", limit: int) -> None:  # noqa: UP037 (quoted: see above)
    """Write a tar archive of `path` (a file or a folder, under its base name) to the binary stream `out`;
    stop with OSError once it would hold more than `limit` bytes of file data."""
    import os
    import tarfile

    if not os.path.lexists(path):
        raise FileNotFoundError(f"{path}: no such file or folder")
    total = 0

    def count(info: tarfile.TarInfo) -> tarfile.TarInfo:
        nonlocal total
        total += info.size
        if total > limit:
            raise OSError(f"{path} holds more than {limit // (1024 * 1024)} MiB: download it from a virtual folder")
        return info

    name = os.path.basename(path.rstrip("/")) or "."
    with tarfile.open(fileobj=out, mode="w|") as tar:
        tar.add(path, arcname=name, filter=count)


def tar_script() -> str:
    """Python source that writes tar_path(sys.argv[1]) to stdout, errors on stderr (exit 2)."""
    return (
        inspect.getsource(tar_path)
        + "\nimport sys\ntry:\n    tar_path(sys.argv[1], sys.stdout.buffer, int(sys.argv[2]))\n"
        + "except OSError as e:\n    sys.stderr.write(str(e) + '\\n')\n    sys.exit(2)\n"
    )
