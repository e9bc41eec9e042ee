"""What the dashboard knows, without any I/O: the cluster from the event stream, filters, a log buffer.

Everything here is plain data and functions, tested directly (tests/test_tui_model.py); the widgets only
draw what these compute.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from bai.common.slots import add as add_slots
from bai.common.slots import from_wire

PENDING = frozenset({"PENDING"})
FINISHED = frozenset({"TERMINATED", "CANCELLED", "ERROR"})
GROUPS = {"pending": 0, "running": 1, "finished": 2}


def group_of(status: str) -> str:
    if status in PENDING:
        return "pending"
    if status in FINISHED:
        return "finished"
    return "running"


# -- filters ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Filter:
    """`/` filters: words match anywhere (case-insensitive, all must match); in the sessions view
    `status:X` (a status or one of pending / running / finished) and `owner:X` (access key or its
    start) narrow further; a leading `!` inverts the whole filter."""

    text: str = ""
    words: tuple[str, ...] = ()
    statuses: tuple[str, ...] = ()
    owners: tuple[str, ...] = ()
    invert: bool = False

    @classmethod
    def parse(cls, text: str) -> Filter:
        raw = text.strip()
        invert = raw.startswith("!")
        if invert:
            raw = raw[1:].strip()
        words, statuses, owners = [], [], []
        for token in raw.split():
            key, sep, value = token.partition(":")
            if sep and key.lower() == "status" and value:
                statuses.append(value.lower())
            elif sep and key.lower() == "owner" and value:
                owners.append(value.lower())
            else:
                words.append(token.lower())
        return cls(text.strip(), tuple(words), tuple(statuses), tuple(owners), invert)

    def __bool__(self) -> bool:
        return bool(self.words or self.statuses or self.owners)

    def match_text(self, text: str) -> bool:
        """For log lines: every word occurs in the line (or, inverted, not all do)."""
        if not self.words:
            return True
        low = text.lower()
        return all(w in low for w in self.words) != self.invert

    def match_session(self, s: dict[str, Any]) -> bool:
        if not self:
            return True
        status = s["status"].lower()
        ok = not self.statuses or any(want in (status, group_of(s["status"])) for want in self.statuses)
        ok = ok and (not self.owners or any(s["accessKey"].lower().startswith(o) for o in self.owners))
        if ok and self.words:
            hay = " ".join(
                str(s.get(k) or "") for k in ("name", "id", "image", "status", "agent", "reason", "accessKey", "type")
            ).lower()
            ok = all(w in hay for w in self.words)
        return ok != self.invert


# -- the cluster -----------------------------------------------------------------------------------


@dataclass
class ClusterModel:
    """Sessions and agents as the dashboard stream told them; `version` grows with every change."""

    keep_finished: int = 200
    sessions: dict[str, dict[str, Any]] = field(default_factory=dict)
    agents: dict[str, dict[str, Any]] = field(default_factory=dict)
    version: int = 0
    agents_version: int = 0

    def load_snapshot(self, data: dict[str, Any]) -> None:
        self.sessions = {s["id"]: s for s in data.get("sessions", [])}
        self.agents = {a["id"]: a for a in data.get("agents", [])}
        self._trim()
        self.version += 1
        self.agents_version += 1

    def update_sessions(self, items: list[dict[str, Any]]) -> None:
        for s in items:
            self.sessions[s["id"]] = s
        self._trim()
        self.version += 1

    def update_agents(self, items: list[dict[str, Any]]) -> None:
        for a in items:
            self.agents[a["id"]] = a
        self.agents_version += 1

    def _trim(self) -> None:
        """Keep the newest `keep_finished` finished sessions; active ones are always kept."""
        done = [s for s in self.sessions.values() if s["status"] in FINISHED and s["status"] != "ERROR"]
        if len(done) > self.keep_finished:
            done.sort(key=lambda s: s.get("statusChanged") or "")
            for s in done[: len(done) - self.keep_finished]:
                del self.sessions[s["id"]]

    def session_rows(self, flt: Filter | None = None) -> list[dict[str, Any]]:
        """Pending ones in queue order, then running ones (oldest first), then finished ones (newest first)."""
        rows = [s for s in self.sessions.values() if flt is None or flt.match_session(s)]

        def key(s: dict[str, Any]) -> tuple:
            group = group_of(s["status"])
            if group == "pending":
                pos = s.get("queuePosition")
                return (0, pos if pos is not None else 1 << 30, s["creationTime"])
            if group == "running":
                return (1, 0, s["creationTime"])
            return (2, 0, _invert(s.get("statusChanged") or s["creationTime"]))

        rows.sort(key=key)
        return rows

    def counts(self) -> dict[str, int]:
        out = {"pending": 0, "running": 0, "finished": 0}
        for s in self.sessions.values():
            out[group_of(s["status"])] += 1
        return out

    def agent_rows(self) -> list[dict[str, Any]]:
        return sorted(self.agents.values(), key=lambda a: (a["status"] != "ALIVE", a["id"]))

    def slot_names(self) -> list[str]:
        """cpu, mem, then any other slot type some agent offers (e.g. cuda.device), sorted."""
        names = {n for a in self.agents.values() for n in a.get("availableSlots", {})}
        return [n for n in ("cpu", "mem") if n in names] + sorted(names - {"cpu", "mem"})

    def totals(self) -> tuple[dict[str, Decimal], dict[str, Decimal], int]:
        """(capacity, used, alive agents) over the agents that are ALIVE."""
        cap: dict[str, Decimal] = {}
        used: dict[str, Decimal] = {}
        alive = 0
        for a in self.agents.values():
            if a["status"] != "ALIVE":
                continue
            alive += 1
            cap = add_slots(cap, from_wire(a.get("availableSlots", {})))
            used = add_slots(used, from_wire(a.get("occupiedSlots", {})))
        return cap, used, alive


def _invert(iso: str) -> str:
    """A key that sorts ISO timestamps newest first."""
    return "".join(chr(0x10FFFF - ord(c)) for c in iso)


# -- logs ------------------------------------------------------------------------------------------


@dataclass
class LogLine:
    """One line of a kernel's log as the logs view shows it."""

    index: int  # position since the log began (never reused)
    text: str
    ts: str | None


class LogBuffer:
    """The last `max_lines` lines of a kernel's output; a line without its newline yet is `partial`."""

    def __init__(self, max_lines: int = 10_000) -> None:
        self.max_lines = max_lines
        self.lines: deque[LogLine] = deque()
        self.partial: LogLine | None = None
        self.next_index = 0
        self.last_seq = 0  # the last chunk fed (to resume after a reconnect)
        self.ended = False

    @property
    def first_index(self) -> int:
        return self.lines[0].index if self.lines else self.next_index

    def feed(self, text: str, ts: str | None = None, seq: int | None = None) -> list[LogLine]:
        """Add a chunk; returns the lines it completed (the partial line is kept aside)."""
        if seq is not None:
            self.last_seq = max(self.last_seq, seq)
        if not text:
            return []
        parts = text.replace("\r\n", "\n").split("\n")
        if self.partial is not None:
            parts[0] = self.partial.text + parts[0]
            ts = self.partial.ts or ts
            self.partial = None
        done = []
        for part in parts[:-1]:
            done.append(LogLine(self.next_index, part, ts))
            self.next_index += 1
        if parts[-1]:
            self.partial = LogLine(self.next_index, parts[-1], ts)
        self.lines.extend(done)
        overflow = len(self.lines) - self.max_lines
        for _ in range(max(0, overflow)):
            self.lines.popleft()
        return done

    def all_lines(self) -> list[LogLine]:
        return [*self.lines, self.partial] if self.partial is not None else list(self.lines)

    def clear(self) -> None:
        self.__init__(self.max_lines)  # type: ignore[misc]


def wrap(text: str, width: int) -> list[str]:
    """Fixed-width pieces of a line (a log is not prose: no word breaking)."""
    if width <= 0 or len(text) <= width:
        return [text]
    return [text[i : i + width] for i in range(0, len(text), width)]


def clock_of(ts: str | None) -> str:
    """HH:MM:SS of an ISO timestamp (UTC, as the manager stores it)."""
    return ts[11:19] if ts and len(ts) >= 19 else "--:--:--"
