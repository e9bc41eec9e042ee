#!/usr/bin/env python3
"""Build the zipapp `dist/bai.pyz` with shiv, from the settings in `shiv.toml` at the top of the tree.

    .venv/bin/python packaging/build-zipapp.py [--output PATH]

Needs shiv (in the test extras: `pip install -e '.[test]'`) and pip access to the dependencies.
Prints the output path and its size.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import tomllib
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
    print(f"{output} ({output.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
