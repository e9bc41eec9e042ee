"""Which sessions have code running or waiting to run (the idle timeout never ends those), and the runs
each session had (`RunHistory`: the log view's run separators)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any


class BusySessions:
    """Session id -> the ids of its runs that have not finished. A session is busy while any run is."""

    def __init__(self) -> None:
        self._runs: dict[str, set[str]] = {}

    def add(self, session_id: str, run_id: str) -> None:
        self._runs.setdefault(session_id, set()).add(run_id)

    def discard(self, session_id: str, run_id: str) -> None:
        runs = self._runs.get(session_id)
        if runs is not None:
            runs.discard(run_id)
            if not runs:
                del self._runs[session_id]

    def clear(self, session_id: str) -> None:
        self._runs.pop(session_id, None)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._runs

    def __iter__(self) -> Iterator[str]:
        return iter(self._runs)

    def __len__(self) -> int:
        return len(self._runs)


MAX_RUNS = 1000  # per session, the newest kept
MAX_SESSIONS = 10_000  # sessions whose runs are kept, the most recently started first


@dataclass(slots=True)
class Run:
    """One execution of code in a session (`bai session exec` / `run`, a batch session's command)."""

    number: int  # 1, 2, … within its session
    kernel_id: str
    after: int  # the kernel's newest log chunk (seq) when it started: the run's output comes after it
    started_at: str  # ISO 8601, UTC
    ended_at: str | None = None
    exit_code: int | None = None  # None: still running, or it ended without one (interrupted, kernel gone)

    def event(self, kernel_id: str) -> dict[str, Any]:
        """The dashboard's `run` event (bai/node/manager/http/dashboard.py)."""
        return {
            "kernelId": kernel_id,
            "run": self.number,
            "startedAt": self.started_at,
            "endedAt": self.ended_at,
            "exitCode": self.exit_code,
        }


class RunHistory:
    """The runs of sessions, in memory (the store keeps only a session's last result): what the log view
    draws its run separators from. Lost when the manager restarts; bounded by MAX_RUNS per session and
    MAX_SESSIONS sessions. `changed(kernel_id)` is called on every start and end (it wakes log followers)."""

    def __init__(self, changed: Callable[[str], None] | None = None) -> None:
        self._runs: OrderedDict[str, list[Run]] = OrderedDict()  # session id -> its runs, oldest first
        self._open: dict[tuple[str, str], Run] = {}  # (session id, run id) -> a run not ended yet
        self._numbers: dict[str, int] = {}  # session id -> runs started so far
        self._changed = changed or (lambda kernel_id: None)

    def start(self, session_id: str, kernel_id: str, run_id: str, after: int, now: str) -> Run:
        """A run began (a second start of the same run id is the same run)."""
        run = self._open.get((session_id, run_id))
        if run is not None:
            return run
        number = self._numbers.get(session_id, 0) + 1
        run = Run(number, kernel_id, after, now)
        runs = self._runs.setdefault(session_id, [])
        self._runs.move_to_end(session_id)
        self._numbers[session_id] = number
        runs.append(run)
        if len(runs) > MAX_RUNS:
            del runs[0]
        while len(self._runs) > MAX_SESSIONS:
            gone, _ = self._runs.popitem(last=False)
            self._numbers.pop(gone, None)
            for key in [k for k in self._open if k[0] == gone]:
                del self._open[key]
        self._open[session_id, run_id] = run
        self._changed(kernel_id)
        return run

    def end(self, session_id: str, run_id: str, exit_code: int | None, now: str) -> None:
        run = self._open.pop((session_id, run_id), None)
        if run is not None:
            run.ended_at, run.exit_code = now, exit_code
            self._changed(run.kernel_id)

    def end_all(self, session_id: str, now: str) -> None:
        """The session ended: its runs still open end without an exit code."""
        for key in [k for k in self._open if k[0] == session_id]:
            self.end(session_id, key[1], None, now)

    def kernel_of(self, session_id: str, run_id: str) -> str | None:
        """The kernel a run not ended yet runs in (None: no such run)."""
        run = self._open.get((session_id, run_id))
        return run.kernel_id if run is not None else None

    def of(self, session_id: str, kernel_id: str) -> list[Run]:
        """A kernel's runs, oldest first."""
        return [r for r in self._runs.get(session_id, ()) if r.kernel_id == kernel_id]
