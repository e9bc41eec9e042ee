"""Every performance target of bai, measured in one run: each benchmark in turn, then one table.

    .venv/bin/python bench/targets.py [--only scheduler,startup,...] [--keep-going]

Runs bench/scheduler.py, bench/startup.py, bench/session_latency.py, bench/batch_queue.py,
bench/cluster.py (its quick preset), bench/stats.py and bench/cluster_session.py one after the other
(never at the same time: they measure CPU), each printing its own figures as usual; each also records the
figures it checks against a target (bench/figures.py), and this script prints them together at the end: the
figure, its value, the baseline measured in the same run and the ratio to it, the target, and whether it is
met. Exit status 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.figures import Figure, read  # noqa: E402

BENCH = Path(__file__).resolve().parent
BENCHES: dict[str, list[str]] = {
    "scheduler": ["scheduler.py"],
    "startup": ["startup.py", "--runs", "10"],
    "session_latency": ["session_latency.py", "--runs", "10"],
    "batch_queue": ["batch_queue.py"],  # a pool of 20: one warm kernel per queued session
    "batch_queue_pool4": ["batch_queue.py", "--warm", "4"],  # the rest of the queue waits for refills
    "cluster": ["cluster.py", "--quick"],
    "stats": ["stats.py"],  # the agent's statistics sampling: 50 idle Docker kernels
    # multi-container sessions: an 8-kernel single-node session against a one-kernel one (RUNNING, destroy)
    "cluster_session": ["cluster_session.py", "--runs", "5"],
}


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "/s":
        return f"{value:,.0f}/s"
    if unit == "ms":
        return f"{value:.0f} ms"
    if unit == "s":
        return f"{value:.2f} s"
    return f"{value:.2f}{unit}"


def table(figures: list[Figure]) -> str:
    rows = [("figure", "value", "baseline (same run)", "ratio", "target", "")]
    for f in figures:
        base = f"{f.baseline} {fmt(f.baseline_value, f.unit)}" if f.baseline else ""
        ratio = f"{f.ratio:.2f}×" if f.ratio is not None else ""
        rows.append((f.name, fmt(f.value, f.unit), base, ratio, f.target, "met" if f.met else "MISSED"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="comma-separated benchmark names: " + ", ".join(BENCHES))
    ap.add_argument("--keep-going", action="store_true", help="go on after a benchmark fails")
    args = ap.parse_args()
    chosen = [n for n in args.only.split(",") if n] or list(BENCHES)
    unknown = [n for n in chosen if n not in BENCHES]
    if unknown:
        ap.error(f"unknown benchmark(s): {', '.join(unknown)}")
    with tempfile.TemporaryDirectory(prefix="bai-targets-") as tmp:
        results = Path(tmp) / "figures.jsonl"
        env = {**os.environ, "BAI_BENCH_RESULTS": str(results)}
        failed = []
        for name in chosen:
            print(f"\n=== {name}", flush=True)
            started = time.monotonic()
            rc = subprocess.run([sys.executable, str(BENCH / BENCHES[name][0]), *BENCHES[name][1:]], env=env).returncode
            print(f"=== {name}: exit {rc} after {time.monotonic() - started:.0f} s", flush=True)
            if rc != 0:
                failed.append(name)
                if not args.keep_going:
                    break
        figures = read(str(results)) if results.exists() else []
    print("\n" + table(figures))
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed or not all(f.met for f in figures) else 0


if __name__ == "__main__":
    sys.exit(main())
