"""Start-up time of the `bai` command: from the zipapp and from the virtualenv, against the interpreter.

Prints, measured in one run, for `bai --version`, `bai --help`, `bai session ls` (and `--json`),
`bai session info` and `bai session run --help` (against a node with the sim backend started for the
purpose):
- cold: the zipapp's first run with an empty SHIV_ROOT (it unpacks itself), and the venv's first run
  with an empty bytecode cache (PYTHONPYCACHEPREFIX pointing at a new folder: everything is compiled);
- warm: the median of --runs runs after that, wall clock and CPU (user + system) of the process. The
  bytecode is cached: PYTHONDONTWRITEBYTECODE (which this environment sets) is dropped, the venv runs
  use a private PYTHONPYCACHEPREFIX warmed by the cold run, and the zipapp carries compiled bytecode;
- the floors, `python3 -c pass` and `python3 -c 'import http.client'` (bai's client uses http.client),
  for the zipapp's interpreter and the venv's; each command's warm time as a multiple of its
  http.client floor; the targets: `session ls` at most 2 × that floor, warm `--help` at most
  2 × `-c pass` + 100 ms, each MET or MISSED;
- the zipapp's size (target: at most 15 MB).

Runs are interleaved (one of each command per round), so a change of load on the machine touches all
figures alike. The zipapp is started with the interpreter its `#!/usr/bin/env python3` finds, resolved
first: a pyenv shim (a shell script) would add its own start-up to every figure.

    .venv/bin/python bench/startup.py [--runs 10] [--pyz dist/bai.pyz] [--rebuild]
    (builds the zipapp if missing, or with --rebuild)
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from benchnode import start_node  # noqa: E402
from figures import Figure, record  # noqa: E402

SESSION = "bench-startup"
COMMANDS = {
    "--version": ["--version"],
    "--help": ["--help"],
    "session ls": ["session", "ls"],
    "session ls --json": ["session", "ls", "--json"],
    "session info": ["session", "info", SESSION],
    "session run --help": ["session", "run", "--help"],
}
LS_TARGET = 2.0  # × the http.client floor (the zipapp: issue 34)
HELP_TARGET = (2.0, 0.1)  # 2 × the `-c pass` floor + 100 ms


@dataclass
class Figures:
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)

    def add(self, took: tuple[float, float]) -> None:
        self.wall.append(took[0])
        self.cpu.append(took[1])

    @property
    def median(self) -> float:
        return statistics.median(self.wall)

    @property
    def median_cpu(self) -> float:
        return statistics.median(self.cpu)


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one run of `cmd`, which must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    result = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    took = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {result.stderr.strip()[-300:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return took, cpu


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def real_python3() -> str:
    """The interpreter `python3` on PATH runs, past any shim (pyenv's is a shell script)."""
    found = shutil.which("python3")
    if not found:
        return sys.executable
    out = subprocess.run([found, "-c", "import sys; print(sys.executable)"], capture_output=True, text=True)
    return out.stdout.strip() or found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--pyz", type=Path, default=ROOT / "dist" / "bai.pyz")
    ap.add_argument("--rebuild", action="store_true", help="Build the zipapp even if it exists.")
    args = ap.parse_args()
    if args.rebuild or not args.pyz.is_file():
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
        python3 = real_python3()  # what the zipapp's `#!/usr/bin/env python3` ends up running
        venv_bai = [sys.executable, "-m", "bai"]
        zip_bai = [python3, str(args.pyz)]
        zip_env = {**base, "SHIV_ROOT": str(tmp / "shiv")}
        venv_env = {**base, "PYTHONPYCACHEPREFIX": str(tmp / "pyc")}
        subprocess.run([*venv_bai, "session", "create", "--name", SESSION, "python"], env=venv_env, check=True,
                       capture_output=True)  # fmt: skip

        floors = {
            "python3 -c pass": ([python3, "-c", "pass"], base),
            "python3 -c 'import http.client'": ([python3, "-c", "import http.client"], base),
            "venv python -c pass": ([sys.executable, "-c", "pass"], venv_env),
            "venv python -c 'import http.client'": ([sys.executable, "-c", "import http.client"], venv_env),
        }
        cold = {}
        for label, argv in COMMANDS.items():  # the first runs: the zipapp unpacks, the venv compiles
            cold[("zipapp", label)] = timed([*zip_bai, *argv], zip_env)[0] if label == "--version" else None
            cold[("venv", label)] = timed([*venv_bai, *argv], venv_env)[0]
        warm: dict[tuple[str, str], Figures] = {}
        for _ in range(args.runs):
            for label, (cmd, env) in floors.items():
                warm.setdefault(("floor", label), Figures()).add(timed(cmd, env))
            for label, argv in COMMANDS.items():
                warm.setdefault(("zipapp", label), Figures()).add(timed([*zip_bai, *argv], zip_env))
                warm.setdefault(("venv", label), Figures()).add(timed([*venv_bai, *argv], venv_env))
        report(args, python3, floors, cold, warm)
    finally:
        node.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(node.folder, ignore_errors=True)


def report(args, python3: str, floors: dict, cold: dict, warm: dict) -> None:
    print(f"medians of {args.runs} interleaved runs; wall clock (CPU: user + system of the process)")
    print(f"zipapp: {python3} {args.pyz}   venv: {sys.executable} -m bai")
    for label in floors:
        f = warm[("floor", label)]
        print(f"floor  {label:<38} {ms(f.median):>7}  (CPU {ms(f.median_cpu)})")
    http_floor = {
        "zipapp": warm[("floor", "python3 -c 'import http.client'")],
        "venv": warm[("floor", "venv python -c 'import http.client'")],
    }
    pass_floor = {"zipapp": warm[("floor", "python3 -c pass")], "venv": warm[("floor", "venv python -c pass")]}
    print()
    print(f"{'command':<20} {'from':<7} {'first run':>9} {'warm':>8} {'÷ floor':>7} {'CPU':>8} {'÷ floor':>7}")
    for label in COMMANDS:
        for where in ("zipapp", "venv"):
            c, w, floor = cold[(where, label)], warm[(where, label)], http_floor[where]
            first = ms(c) if c is not None else "-"
            print(
                f"{label if where == 'zipapp' else '':<20} {where:<7} {first:>9} {ms(w.median):>8} "
                f"{w.median / floor.median:>6.1f}x {ms(w.median_cpu):>8} {w.median_cpu / floor.median_cpu:>6.1f}x"
            )
    print("(÷ floor: the http.client floor of the same interpreter, wall clock and CPU; first run: the zipapp")
    print(" unpacks itself, the venv compiles everything into an empty bytecode cache)")
    print()
    for where in ("zipapp", "venv"):
        w, floor = warm[(where, "session ls")], http_floor[where]
        for what, took, base in (("wall", w.median, floor.median), ("CPU", w.median_cpu, floor.median_cpu)):
            target = LS_TARGET * base
            if what == "wall":
                record(
                    Figure(
                        f"`bai session ls`, whole process ({where})",
                        took * 1000,
                        "ms",
                        "`import http.client`",
                        base * 1000,
                        f"<= {LS_TARGET:.0f}x",
                        took <= target,
                    )
                )
            print(
                f"target: warm `bai session ls` from the {where} <= {LS_TARGET:.0f} x the http.client floor ({what}): "
                f"{ms(took)} = {took / base:.1f}x, target {ms(target)}: {'MET' if took <= target else 'MISSED'}"
            )
    for where in ("zipapp", "venv"):
        w, floor = warm[(where, "--help")], pass_floor[where]
        target = HELP_TARGET[0] * floor.median + HELP_TARGET[1]
        verdict = "MET" if w.median <= target else "MISSED"
        print(
            f"target: warm `bai --help` from the {where} <= 2 x `-c pass` + 100 ms: {ms(w.median)} = "
            f"{w.median / floor.median:.1f}x its floor, target {ms(target)}: {verdict}"
        )
    size = args.pyz.stat().st_size / (1024 * 1024)
    print(f"zipapp size: {size:.1f} MiB (target <= 15 MB: {'MET' if size * 1024 * 1024 <= 15e6 else 'MISSED'})")


if __name__ == "__main__":
    main()
