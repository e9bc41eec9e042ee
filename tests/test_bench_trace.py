"""bench/trace.py, the issue's scheduling trace, on a small trace: it runs every policy, and its yardsticks say what
they claim (a user asking less than an equal part keeps what it asks; the sizes' and users' waits count the sessions
that never started)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.trace import USERS, asked_in_window, late_demand, make_trace, max_min_shares, simulate

ROOT = Path(__file__).resolve().parent.parent


def test_max_min_shares_give_the_small_what_they_ask_and_split_the_rest() -> None:
    shares = max_min_shares({"heavy": 100.0, "u1": 5.0, "u2": 10.0, "u3": 40.0, "u4": 40.0}, 100.0)
    assert shares["u1"] == pytest.approx(0.05) and shares["u2"] == pytest.approx(0.10)
    # 85 left for three users: 28.33 each, which u3 and u4 (asking 40) and heavy all exceed
    for user in ("heavy", "u3", "u4"):
        assert shares[user] == pytest.approx(85 / 3 / 100)
    # nobody asks beyond the capacity: everyone gets what they ask, as fractions of what is handed out
    under = max_min_shares({"heavy": 30.0, "u1": 10.0}, 100.0)
    assert under == {"heavy": pytest.approx(0.75), "u1": pytest.approx(0.25)}
    assert max_min_shares({"heavy": 0.0}, 10.0) == {"heavy": 0.0}


def test_a_small_trace_accounts_every_session_and_the_late_half() -> None:
    jobs, window = make_trace(300, 4, seed=3, load=2.0)
    demand = late_demand(jobs, window)
    assert set(demand) == set(USERS) and all(v >= 0 for v in demand.values())
    for policy in ("strict-fifo", "fifo", "backfill"):
        out = simulate(policy, jobs, 4, window)
        waited = sum(len(w) for w in out.user_waits.values())
        assert waited == sum(1 for j in jobs if j.arrival <= window)  # started or still waiting, each once
        assert out.started + sum(out.never_started.values()) == waited
        assert sum(len(w) for w in out.waits.values()) == waited
        assert sum(out.user_late.values()) == pytest.approx(out.all_late)
        assert out.used_gpu_seconds <= 4 * 8 * window * (1 + 1e-9)  # never more than the cluster has
        assert out.used_gpu_seconds <= asked_in_window(jobs, window) * (1 + 1e-9)  # nor than was asked
        assert out.largest_wait == max(out.waits.get(32, [0.0]))
    # the trace is overloaded (2x): strict FIFO leaves sessions waiting that backfill starts
    assert simulate("backfill", jobs, 4, window).started > simulate("strict-fifo", jobs, 4, window).started


def test_the_bench_prints_its_figures_and_yardsticks() -> None:
    result = subprocess.run(
        [sys.executable, "bench/trace.py", "--sessions", "300", "--agents", "4", "--seed", "3", "--load", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "longest wait by size" in out and "backfill, by user" in out
    assert "against its max-min fair share" in out and "the most any policy could reach" in out
    for figure in ("GPU utilisation, backfill", "longest wait of the 32-GPU sessions", "heavy user's share"):
        assert figure in out
