"""The managers a client may use, in order, and which of them it uses now.

Several managers of one database each serve the whole API. A client tries the current one first and,
when it cannot be reached, the next ones in order (wrapping around once); the first that answers becomes
the current one, and `on_move(old, new)` is told once per move. A request that broke after it was sent
makes the next request start at the next manager (`broke`), whether or not it is retried itself.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass(frozen=True)
class Endpoint:
    """One manager's URL, split as the client uses it: `host` is HOST:PORT (signed in every request)."""

    url: str
    scheme: str
    host: str
    prefix: str

    @classmethod
    def of(cls, url: str) -> Endpoint:
        """ValueError when `url` is not http(s)://HOST[:PORT][/PATH]."""
        url = url.strip().rstrip("/")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(url)
        return cls(url, parts.scheme, parts.netloc, parts.path.rstrip("/"))


class Endpoints:
    """The ordered managers of one client; safe to use from several threads."""

    def __init__(self, urls: tuple[str, ...] | list[str]) -> None:
        """ValueError (naming the URL) for one that is not http(s)://HOST:PORT."""
        self.all = tuple(Endpoint.of(u) for u in urls)
        if not self.all:
            raise ValueError("no endpoint")
        self._current = 0  # where the next request starts
        self._answered = 0  # the one that answered last (a move is announced from it)
        self._lock = threading.Lock()
        self.on_move: Callable[[str, str], None] | None = None

    def __len__(self) -> int:
        return len(self.all)

    def __getitem__(self, i: int) -> Endpoint:
        return self.all[i]

    @property
    def current(self) -> Endpoint:
        return self.all[self._current]

    def order(self) -> list[int]:
        """The indexes a request tries: the current one, then the next ones, wrapping around once."""
        start, n = self._current, len(self.all)
        return [(start + k) % n for k in range(n)]

    def answered(self, i: int) -> None:
        """Manager `i` answered (any HTTP status): it is the current one; a move is announced once."""
        with self._lock:
            old = self._answered
            self._current = self._answered = i
        if old != i and self.on_move is not None:
            self.on_move(self.all[old].url, self.all[i].url)

    def broke(self, i: int) -> None:
        """A request to manager `i` broke after it was sent: the next request starts at the next one."""
        with self._lock:
            if self._current == i:
                self._current = (i + 1) % len(self.all)

    def broke_current(self) -> None:
        """A stream through the current manager broke (a WebSocket, after it was open): the next one starts at
        the next manager."""
        self.broke(self._current)

    def names(self, indexes: list[int] | None = None) -> str:
        """The URLs (of `indexes`, else all), comma-separated: for messages."""
        return ", ".join(self.all[i].url for i in (indexes if indexes is not None else range(len(self.all))))


def move_line(old: str, new: str) -> str:
    """What a client says when it moves: the CLI prints it to stderr, the dashboard shows it."""
    return f"the manager at {old} does not answer; moved to {new}"
