"""Listing a folder inside a kernel (`GET /session/{ref}/files`, the client's `session ls`; spec §2.9).

`list_dir` is self-contained (standard library only, imports inside) so the Docker backend can send its
source to run with the container's own Python (`docker exec python3 -c …`), where the kernel's files
and mounts are; the local backend calls it directly on the host paths behind the kernel's view.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

# The signature's annotations are quoted: the function's source runs without this module's
# `from __future__ import annotations`, on whatever Python the kernel has (3.8 has no dict[...]).


def list_dir(path: str) -> "dict[str, str]":  # noqa: UP037 (see above)
    """Entries of a folder in Backend.AI's shape: `files` is a JSON string of
    {filename, size, mode ("-rw-r--r--"), mtime, ctime, atime}; `errors` says what went wrong."""
    import json
    import os
    import stat

    files: list[dict[str, Any]] = []  # (a local annotation: never evaluated)
    errors = ""
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue  # gone meanwhile
                files.append(
                    {
                        "filename": entry.name,
                        "size": st.st_size,
                        "mode": stat.filemode(st.st_mode),
                        "mtime": st.st_mtime,
                        "ctime": st.st_ctime,
                        "atime": st.st_atime,
                    }
                )
    except OSError as e:
        errors = f"{path}: {e.strerror}"
    files.sort(key=lambda f: f["filename"])
    return {"files": json.dumps(files), "errors": errors, "abspath": path}


def list_script() -> str:
    """Python source that prints list_dir(sys.argv[1]) as JSON."""
    return inspect.getsource(list_dir) + "\nimport json, sys\nprint(json.dumps(list_dir(sys.argv[1])))\n"
