#!/usr/bin/env python3
"""Build the zipapp `dist/bai.pyz` with shiv, from the settings in `shiv.toml` at the top of the tree.

    .venv/bin/python packaging/build-zipapp.py [--output PATH]

Then its `__main__.py` is replaced by a lean start (`LEAN_START`): when the zipapp's extraction is there already
(every run but the first), it puts the extraction's site-packages on sys.path exactly as shiv's bootstrap does and
calls the entry point, without shiv's bootstrap, which compiles its four modules from source at every start (a
zip holds no bytecode of them) and imports compileall, hashlib, subprocess, zipfile and json: about 20 ms of each
`bai` command. The first run, and any SHIV_* variable but SHIV_ROOT, go through shiv's bootstrap as before.

Needs shiv (in the test extras: `pip install -e '.[test]'`) and pip access to the dependencies.
Prints the output path and its size.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def shiv_command(settings: dict, output: Path) -> list[str]:
    cmd = [sys.executable, "-m", "shiv", "-c", settings["console_script"], "-o", str(output)]
    cmd += ["-p", settings["interpreter"]]
    if settings.get("compile_pyc", True):
        cmd.append("--compile-pyc")
    cmd.append("--compressed" if settings.get("compressed", True) else "--uncompressed")
    if settings.get("reproducible", False):
        cmd.append("--reproducible")
    return [*cmd, "--disable-pip-version-check", "-q", *settings.get("requirements", ["."])]


SOURCES = ("pyproject.toml", "README.md", "bai")

# what the zipapp runs (see the docstring); {build_id}, {module} and {function} filled in at build time
LEAN_START = """\
# bai's start (packaging/build-zipapp.py): shiv's unpacked site-packages put on sys.path as shiv's bootstrap puts
# them, when they are there; the first run (which unpacks them), or any SHIV_* variable but SHIV_ROOT: shiv's own.
import os
import sys


def _site_packages():
    if any(k.startswith("SHIV_") and k != "SHIV_ROOT" for k in os.environ):
        return None
    root = os.environ.get("SHIV_ROOT")
    if root and root.startswith("$"):
        root = os.environ.get(root[1:], root[1:])
    root = os.path.expanduser(root or "~/.shiv")
    name = os.path.basename(os.path.realpath(sys.argv[0]))
    path = os.path.join(root, name + "_{build_id}", "site-packages")
    return path if os.path.isdir(path) else None


def _first_site_dir():
    for index, part in enumerate(sys.path):
        if os.path.splitext(os.path.basename(part))[0] in ("site-packages", "dist-packages"):
            return index
    return None


_unpacked = _site_packages()
if _unpacked is None:
    import _bootstrap

    _bootstrap.bootstrap()
else:
    import site

    _length = len(sys.path)
    _index = _first_site_dir() or _length
    site.addsitedir(_unpacked)
    sys.path = sys.path[:_index] + sys.path[_length:] + sys.path[_index:_length]
    from {module} import {function}

    sys.exit({function}())
"""


def lean_start(output: Path) -> None:
    """Replace the zipapp's `__main__.py` by `LEAN_START` (the entries, their order, dates and compression kept)."""
    with zipfile.ZipFile(output) as archive:
        env = json.loads(archive.read("environment.json"))
        module, function = env["entry_point"].split(":")
        entries = [(info, archive.read(info)) for info in archive.infolist()]
    with output.open("rb") as f:
        first = f.readline()
    shebang = first if first.startswith(b"#!") else b""  # (shiv's `-p` line)
    main = LEAN_START.format(build_id=env["build_id"], module=module, function=function).encode()
    tmp = output.with_suffix(".tmp")
    with tmp.open("wb") as f:
        f.write(shebang)
        with zipfile.ZipFile(f, "w") as archive:
            for info, data in entries:
                archive.writestr(info, main if info.filename == "__main__.py" else data)
    tmp.chmod(output.stat().st_mode)
    tmp.replace(output)


def copy_sources(dest: Path) -> None:
    """What building the wheel needs: the project file, the README it names, the package (no caches)."""
    dest.mkdir(parents=True)
    for name in SOURCES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, dest / name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--output", type=Path, help="where to write the zipapp [shiv.toml's output]")
    args = ap.parse_args()
    settings = tomllib.loads((ROOT / "shiv.toml").read_text())["zipapp"]
    output = (args.output or ROOT / settings["output"]).resolve()
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bai-zipapp-") as tmp:
        # pip builds the project in its source folder (setuptools' build/ and *.egg-info): build from a private
        # copy, so that two builds at once (parallel tests) and a stale build/ never meet.
        source = Path(tmp) / "src"
        copy_sources(source)
        result = subprocess.run(shiv_command(settings, output), cwd=source)
    if result.returncode != 0:
        print(f"build-zipapp: shiv failed with status {result.returncode}", file=sys.stderr)
        return result.returncode
    lean_start(output)
    print(f"{output} ({output.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
