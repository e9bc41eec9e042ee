"""Which sessions have code running or waiting to run (the idle timeout never ends those)."""

from __future__ import annotations

from collections.abc import Iterator


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
