"""The steps of a batch run (clean, build, exec), and what they run when the client leaves the choice to the
kernel: Backend.AI's `"*"` (the official client's `backend.ai run IMAGE FILE...` without `--exec`).

Backend.AI's kernel runners choose by the image's language (the Python runner runs `main.py`, the C runner
compiles `*.c`, ...). bai's kernels run any image, so the choice goes by the kind of the files the client
uploaded just before: the first one whose kind bai knows is run (`python3 x.py`, `sh x.sh`, `cc` then the
program for `.c`, ...); with nothing uploaded a Python kernel runs `main.py`, as Backend.AI's does. A build
of `"*"` runs `make` when a Makefile was uploaded, else the chosen file's own build step (a compiler).
"""

from __future__ import annotations

import posixpath
import shlex
from typing import Any

# extension -> (build command, run command); {f}: the file, {out}: the program a build makes
KINDS: dict[str, tuple[str, str]] = {
    ".py": ("", "python3 {f}"),
    ".sh": ("", "sh {f}"),
    ".bash": ("", "bash {f}"),
    ".c": ("cc -O2 -o {out} {f}", "{out}"),
    ".cc": ("c++ -O2 -o {out} {f}", "{out}"),
    ".cpp": ("c++ -O2 -o {out} {f}", "{out}"),
    ".rs": ("rustc -O -o {out} {f}", "{out}"),
    ".go": ("", "go run {f}"),
    ".js": ("", "node {f}"),
    ".mjs": ("", "node {f}"),
    ".rb": ("", "ruby {f}"),
    ".pl": ("", "perl {f}"),
    ".php": ("", "php {f}"),
    ".lua": ("", "lua {f}"),
    ".r": ("", "Rscript {f}"),
    ".jl": ("", "julia {f}"),
}
CHOOSE = "*"  # the client leaves the command to the kernel


class NoCommand(Exception):
    """The kernel cannot tell what to run; the message tells the user what to give instead."""


def _choose(uploads: list[str], has_python: bool) -> tuple[str, str] | None:
    """(build, run) for the first uploaded file of a known kind; None when there is none."""
    for path in uploads:
        stem, ext = posixpath.splitext(path)
        kind = KINDS.get(ext.lower())
        if kind is None:
            continue
        if ext.lower() == ".py" and not has_python:
            raise NoCommand(f"{path} is a Python file but this kernel's image has no Python: give --exec CMD")
        out = "./" + stem  # uploads are relative to the home, where the run starts
        build, run = kind
        return (
            build.format(f=shlex.quote(path), out=shlex.quote(out)),
            run.format(f=shlex.quote(path), out=shlex.quote(out)),
        )
    if not uploads and has_python:
        return "", "python3 main.py"  # Backend.AI's Python runner: main.py in the home
    return None


def plan(code: str, options: dict[str, Any], uploads: list[str], has_python: bool) -> list[tuple[str, str]]:
    """The steps of a batch run as (step, command): clean and build when the client named them (an empty
    command: the step is skipped, and said finished), then exec (never empty). NoCommand when the kernel is
    to choose and cannot."""
    steps: list[tuple[str, str]] = []
    clean = options.get("clean")
    build = options.get("build")
    command = options.get("exec") or code
    chosen: tuple[str, str] | None = None
    if command in ("", CHOOSE):
        chosen = _choose(uploads, has_python)
        if chosen is None:
            names = ", ".join(uploads[:5]) or "no files were uploaded"
            known = ", ".join(sorted({k for k in KINDS if k != ".r"} | {".R"}))
            raise NoCommand(
                f"cannot tell how to run this ({names}): bai runs an uploaded file of a kind it knows "
                f"({known}); give the command with --exec CMD"
            )
    if "clean" in options:
        steps.append(("clean", "" if clean in (None, CHOOSE) else clean))
    if "build" in options:
        if build == CHOOSE:
            build = "make" if "Makefile" in uploads or "makefile" in uploads else (chosen[0] if chosen else "")
        steps.append(("build", build or ""))
    if chosen is not None:
        # without a build step of its own, a file that needs building is built as part of the run
        command = chosen[1] if "build" in options or not chosen[0] else f"{chosen[0]} && {chosen[1]}"
    steps.append(("exec", command))
    return steps
