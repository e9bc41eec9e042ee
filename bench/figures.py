"""One shape for the figures the benchmarks print, so that `bench/targets.py` can gather them in one run.

A benchmark calls `record(...)` for each figure it checks against a target; the figure is printed as
usual by the benchmark, and, when `BAI_BENCH_RESULTS` names a file, also appended to it as a JSON line.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Figure:
    name: str  # what was measured, in words
    value: float
    unit: str  # "ms", "/s", "s", "×"
    baseline: str  # what it is compared with, measured in the same run ("" when the target is absolute)
    baseline_value: float | None
    target: str  # e.g. "<= 1.0x", ">= 100000/s"
    met: bool

    @property
    def ratio(self) -> float | None:
        if not self.baseline_value:
            return None
        return self.value / self.baseline_value


def record(figure: Figure) -> Figure:
    path = os.environ.get("BAI_BENCH_RESULTS")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(asdict(figure)) + "\n")
    return figure


def read(path: str) -> list[Figure]:
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                out.append(Figure(**json.loads(line)))
    return out
