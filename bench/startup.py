"""Start-up time of the `bai` command: from the zipapp and from the virtualenv, against the interpreter.

Prints, measured in one run, for `bai --version`, `bai --help` and `bai session ls` (against a node with
the sim backend started for the purpose):
- cold: the zipapp's first run with an empty SHIV_ROOT (it unpacks itself), and the venv's first run
  with an empty bytecode cache (PYTHONPYCACHEPREFIX pointing at a new folder: everything is compiled);
- warm: the median of --runs runs after that;
- the floor, `python3 -c pass`, and the target for warm `--help`: at most 2 × floor + 100 ms;
- the zipapp's size (target: at most 15 MB).

    .venv/bin/python bench/startup.py [--runs 10] [--pyz dist/bai.pyz]   (builds the zipapp if missing)
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from benchnode import start_node  # noqa: E402

COMMANDS = {"--version": ["--version"], "--help": ["--help"], "session ls": ["session", "ls"]}


def timed(cmd: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    result = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    took = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {result.stderr.strip()[-300:]}")
    return took


def ms(seconds: float) -> str:
    return f"{seconds * 1000:7.0f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--pyz", type=Path, default=ROOT / "dist" / "bai.pyz")
    args = ap.parse_args()
    if not args.pyz.is_file():
        print("building the zipapp …", file=sys.stderr)
        subprocess.run(
            [sys.executable, str(ROOT / "packaging" / "build-zipapp.py"), "--output", str(args.pyz)], check=True
        )
    tmp = Path(tempfile.mkdtemp(prefix="bai-bench-startup-"))
    node = start_node("", "sim")
    try:
        # bytecode is written (this environment may say otherwise): "warm" means compiled once already
        drop = ("BACKEND_", "PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE")
        base = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
        base.update({k: node.env[k] for k in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "BAI_CONFIG")})
        python3 = shutil.which("python3") or sys.executable  # what the zipapp's `#!/usr/bin/env python3` runs
        floor = statistics.median(timed([python3, "-c", "pass"], base) for _ in range(args.runs))
        venv_floor = statistics.median(timed([sys.executable, "-c", "pass"], base) for _ in range(args.runs))
        venv_bai = str(Path(sys.executable).parent / "bai")
        rows = []
        for label, argv in COMMANDS.items():
            zip_env = {**base, "SHIV_ROOT": str(tmp / f"shiv-{len(rows)}")}
            zip_cold = timed([str(args.pyz), *argv], zip_env)
            zip_warm = statistics.median(timed([str(args.pyz), *argv], zip_env) for _ in range(args.runs))
            venv_env = {**base, "PYTHONPYCACHEPREFIX": str(tmp / f"pyc-{len(rows)}")}
            venv_cold = timed([venv_bai, *argv], venv_env)
            venv_warm = statistics.median(timed([venv_bai, *argv], venv_env) for _ in range(args.runs))
            rows.append((label, zip_cold, zip_warm, venv_cold, venv_warm))
        print(f"floor: python3 -c pass  {ms(floor)}  ({python3}, as the zipapp starts; medians of {args.runs} runs)")
        print(f"floor: python -c pass   {ms(venv_floor)}  ({sys.executable}, as the venv's bai starts)")
        print(f"{'command':<12} {'zipapp cold':>11} {'zipapp warm':>11} {'venv cold':>11} {'venv warm':>11}")
        for label, zc, zw, vc, vw in rows:
            print(f"{label:<12} {ms(zc):>11} {ms(zw):>11} {ms(vc):>11} {ms(vw):>11}")
        help_row = rows[1]
        for where, warm, base_floor in (("zipapp", help_row[2], floor), ("venv", help_row[4], venv_floor)):
            target = 2 * base_floor + 0.1
            verdict = "met" if warm <= target else "MISSED"
            print(
                f"warm --help from the {where}: {warm * 1000:.0f} ms = {warm / base_floor:.1f}x its floor; "
                f"target 2 x floor + 100 ms = {target * 1000:.0f} ms: {verdict}"
            )
        size = args.pyz.stat().st_size / (1024 * 1024)
        print(f"zipapp size: {size:.1f} MiB (target <= 15 MB: {'met' if size * 1024 * 1024 <= 15e6 else 'MISSED'})")
    finally:
        node.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(node.folder, ignore_errors=True)


if __name__ == "__main__":
    main()
