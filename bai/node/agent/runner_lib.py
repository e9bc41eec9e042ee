"""The runner as an importable module with its bytecode beside it, for Docker kernels.

A kernel's Python that runs `/opt/bai/runner.py` as a script compiles its 1,700 lines on every start (about 30 ms
of a cold create, more on a busy machine: a script's bytecode is never cached). Imported as a module instead, it
loads `__pycache__/_bai_runner.<tag>.pyc` when the image's Python is the node's (`<tag>` as
`sys.implementation.cache_tag`, cpython-311 say); any other Python finds no bytecode of its own there and compiles
the source as before (the folder is mounted read-only: it writes nothing). The bytecode is checked against the
source's hash (not its time), so a copy that is stale, or made by another node, is never used.

`install(source, into)` writes the module and its bytecode (atomically, only when changed); `START` is the Python
code a container runs, with the runner's arguments after it.
"""

from __future__ import annotations

import py_compile
import sys
from pathlib import Path

MODULE = "_bai_runner"  # (not `runner`: a user's own runner.py in /home/work stays importable)
MOUNT = "/opt/bai/lib"  # where a container sees the folder
# what the container's Python runs (`python -u -c START --connect ...`): the folder first on the path, as a script's
# own folder would be (main() swaps it for the working directory)
START = f"import sys; sys.path[0] = {MOUNT!r}; import {MODULE}; {MODULE}.main()"


def bytecode_path(into: Path) -> Path:
    """Where this Python's bytecode of the module goes (never `sys.pycache_prefix`: the kernel looks beside it)."""
    return into / "__pycache__" / f"{MODULE}.{sys.implementation.cache_tag}.pyc"


def install(source: bytes, into: Path) -> Path:
    """The folder `into` with the runner module (`source`) and this Python's bytecode of it; returns `into`."""
    into.mkdir(parents=True, exist_ok=True)
    into.chmod(0o755)
    module = into / f"{MODULE}.py"
    pyc = bytecode_path(into)
    if not module.exists() or module.read_bytes() != source:
        tmp = module.with_suffix(".tmp")
        tmp.write_bytes(source)
        tmp.chmod(0o644)
        tmp.replace(module)
    elif pyc.exists():
        return into  # (a checked-hash pyc of this very source: it says so itself when loaded)
    pyc.parent.mkdir(exist_ok=True)
    pyc.parent.chmod(0o755)
    tmp_pyc = pyc.with_suffix(".tmp")
    py_compile.compile(
        str(module),
        cfile=str(tmp_pyc),
        dfile=f"{MOUNT}/{MODULE}.py",  # (tracebacks name the path the kernel sees)
        doraise=True,
        invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
    )
    tmp_pyc.chmod(0o644)
    tmp_pyc.replace(pyc)
    return into
