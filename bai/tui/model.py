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


def is_failed(s: dict[str, Any]) -> bool:
    """A session that went wrong: ERROR, failed to start, a run that ended with a non-zero exit code (or a
    FAILURE result), or cancelled with an error (a dependency that failed, a scheduler error)."""
    status = s["status"]
    if status == "ERROR":
        return True
    if status not in FINISHED:
        return False
    if s.get("exitCode") not in (None, 0) or s.get("result") == "FAILURE":
        return True
    data = s.get("statusData") or {}
    return s.get("statusInfo") in FAILED_INFOS or (isinstance(data, dict) and bool(data.get("error")))


FAILED_INFOS = frozenset({"failed-to-start", "scheduler-error", "dependency-failed", "out-of-memory", "agent-lost"})

# `field:value` in a sessions filter: how the value is compared with the session's field
#   exact (case-insensitive): exit, agent, name, image, type, group, project; from the start: id, owner;
#   status: a status, a group (pending / running / finished), or failed / ok (finished without failing)
FIELDS = {"status", "owner", "exit", "agent", "name", "id", "image", "type", "group", "project"}
WORD_KEYS = ("name", "id", "image", "status", "agent", "reason", "accessKey", "type", "project")  # plain words


def _field_match(s: dict[str, Any], name: str, want: str) -> bool:
    if name == "status":
        status = s["status"].lower()
        if want == "failed":
            return is_failed(s)
        if want in ("ok", "succeeded"):
            return group_of(s["status"]) == "finished" and not is_failed(s)
        return want in (status, group_of(s["status"]))
    if name == "owner":
        return str(s.get("accessKey") or "").lower().startswith(want)
    if name == "id":
        return str(s.get("id") or "").lower().startswith(want)
    if name == "exit":
        return s.get("exitCode") is not None and str(s["exitCode"]) == want
    key = {
        "agent": "agent", "name": "name", "image": "image", "type": "type", "group": "scalingGroup",
        "project": "project",
    }[name]  # fmt: skip
    return str(s.get(key) or "").lower() == want


@dataclass(frozen=True)
class Filter:
    """`/` filters: words match anywhere (case-insensitive, all must match); in the sessions view
    `field:value` matches a field exactly (`exit:3`, `agent:agent-1`, `name:`, `image:`, `type:`,
    `group:`, `project:`), from its start (`id:`, `owner:`), or `status:X` (a status, pending / running / finished,
    failed or ok); values of one field are alternatives, different fields must all match; a leading `!`
    inverts the whole filter."""

    text: str = ""
    words: tuple[str, ...] = ()
    statuses: tuple[str, ...] = ()
    owners: tuple[str, ...] = ()
    invert: bool = False
    fields: tuple[tuple[str, str], ...] = ()  # (field, value), every field:value of the filter

    @classmethod
    def parse(cls, text: str) -> Filter:
        raw = text.strip()
        invert = raw.startswith("!")
        if invert:
            raw = raw[1:].strip()
        words, fields = [], []
        for token in raw.split():
            key, sep, value = token.partition(":")
            if sep and key.lower() in FIELDS and value:
                fields.append((key.lower(), value.lower()))
            else:
                words.append(token.lower())
        statuses = tuple(v for k, v in fields if k == "status")
        owners = tuple(v for k, v in fields if k == "owner")
        return cls(text.strip(), tuple(words), statuses, owners, invert, tuple(fields))

    def __bool__(self) -> bool:
        return bool(self.words or self.fields)

    def match_text(self, text: str) -> bool:
        """For log lines: every word occurs in the line (or, inverted, not all do)."""
        if not self.words:
            return True
        low = text.lower()
        return all(w in low for w in self.words) != self.invert

    def match_session(self, s: dict[str, Any]) -> bool:
        if not self:
            return True
        ok = True
        if self.fields:
            wanted: dict[str, list[str]] = {}
            for name, value in self.fields:
                wanted.setdefault(name, []).append(value)
            ok = all(any(_field_match(s, name, v) for v in values) for name, values in wanted.items())
        if ok and self.words:
            hay = " ".join(str(s.get(k) or "") for k in WORD_KEYS).lower()
            ok = all(w in hay for w in self.words)
        return ok != self.invert


def view_of(word: str, views: dict[str, str]) -> str | None:
    """What `:word` names: an alias or view name (`views`: name -> view), else the one view whose name or
    alias starts with `word` (`:ag`, `:se`); None when none or several views do."""
    word = word.strip().lstrip(":").lower()
    if not word:
        return None
    if word in views:
        return views[word]
    found = {view for name, view in views.items() if name.startswith(word) and not name.isdigit()}
    return found.pop() if len(found) == 1 else None


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

    def update_usage(self, data: dict[str, Any]) -> None:
        """The `usage` event: the latest figures of some sessions and agents (None: no sample yet)."""
        sessions = data.get("sessions") or {}
        for sid, usage in sessions.items():
            row = self.sessions.get(sid)
            if row is not None:
                row["usage"] = usage
        agents = data.get("agents") or {}
        for aid, usage in agents.items():
            agent = self.agents.get(aid)
            if agent is not None:
                agent["usage"] = usage
        if sessions:
            self.version += 1
        if agents:
            self.agents_version += 1

    def _trim(self) -> None:
        """Keep the newest `keep_finished` finished sessions; active ones are always kept."""
        done = [s for s in self.sessions.values() if s["status"] in FINISHED and s["status"] != "ERROR"]
        if len(done) > self.keep_finished:
            done.sort(key=lambda s: s.get("statusChanged") or "")
            for s in done[: len(done) - self.keep_finished]:
                del self.sessions[s["id"]]

    def session_rows(self, flt: Filter | None = None, project: str | None = None) -> list[dict[str, Any]]:
        """Pending ones in queue order, then running ones (oldest first), then finished ones (newest first);
        `project`: only those of the project of that name."""
        rows = [
            s
            for s in self.sessions.values()
            if (project is None or s.get("project") == project) and (flt is None or flt.match_session(s))
        ]
        pending: list[dict[str, Any]] = []
        running: list[dict[str, Any]] = []
        finished: list[dict[str, Any]] = []
        for s in rows:
            status = s["status"]
            (pending if status in PENDING else finished if status in FINISHED else running).append(s)
        pending.sort(
            key=lambda s: (1 << 30 if s.get("queuePosition") is None else s["queuePosition"], s["creationTime"])
        )
        running.sort(key=lambda s: s["creationTime"])
        finished.sort(key=lambda s: s.get("statusChanged") or s["creationTime"], reverse=True)
        return pending + running + finished

    def counts(self, project: str | None = None) -> dict[str, int]:
        out = {"pending": 0, "running": 0, "finished": 0}
        for s in self.sessions.values():
            if project is None or s.get("project") == project:
                out[group_of(s["status"])] += 1
        return out

    def project_names(self) -> list[str]:
        """The projects the sessions known were created in, sorted."""
        return sorted({s["project"] for s in self.sessions.values() if s.get("project")})

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


# -- logs ------------------------------------------------------------------------------------------


MAX_LINE = 1 << 16  # characters of one line kept (a longer line's rest is counted, not kept)


@dataclass
class LogLine:
    """One line of a kernel's log as the logs view shows it (as printed: ANSI colour codes included), or,
    with `run`, the separator before a run (the dashboard stream's `run` event; updated when it ends)."""

    index: int  # position since the log began (never reused)
    text: str
    ts: str | None
    run: dict[str, Any] | None = None
    cut: int = 0  # characters beyond MAX_LINE that were dropped
    plain: str | None = field(default=None, repr=False, compare=False)  # the text without escape codes (a cache)


def _overwrite(current: str, cr: bool, part: str) -> tuple[str, bool]:
    """A line after more of its text (`part`: no newline), as a terminal shows it: text after a carriage
    return replaces the line from its start (a progress bar redrawn in place). `cr`: the line so far ended
    with a carriage return (what follows replaces it; nothing, or a newline, keeps it). Returns the line
    and whether it now ends with a carriage return."""
    if "\r" not in part:
        if not part:
            return current, cr
        return (part if cr else current + part), False
    pieces = part.split("\r")
    text = (pieces[0] if cr else current + pieces[0]) if pieces[0] else current
    for piece in pieces[1:]:
        if piece:
            text = piece
    return text, not pieces[-1]


class LogBuffer:
    """The last `max_lines` lines of a kernel's output; a line without its newline yet is `partial`.

    Carriage returns are collapsed as a terminal would (see `_overwrite`), across chunks; `\\r\\n` is a
    newline. A line keeps at most MAX_LINE characters. `mark_run` adds a run's separator line."""

    def __init__(self, max_lines: int = 10_000) -> None:
        self.max_lines = max_lines
        self.lines: deque[LogLine] = deque()
        self.partial: LogLine | None = None
        self.next_index = 0
        self.last_seq = 0  # the last chunk fed (to resume after a reconnect)
        self.ended = False
        self.runs: dict[Any, LogLine] = {}  # run number -> its separator line
        self._cr = False  # the partial line ended with a carriage return

    @property
    def first_index(self) -> int:
        return self.lines[0].index if self.lines else self.next_index

    def feed(self, text: str, ts: str | None = None, seq: int | None = None) -> list[LogLine]:
        """Add a chunk; returns the lines it completed (the partial line is kept aside)."""
        if seq is not None:
            self.last_seq = max(self.last_seq, seq)
        if not text:
            return []
        done = []
        if "\r" not in text and not self._cr:  # the usual case
            parts = text.split("\n")
            cut = 0
            if self.partial is not None:
                parts[0] = self.partial.text + parts[0]
                ts, cut = self.partial.ts or ts, self.partial.cut
                self.partial = None
            for part in parts[:-1]:
                done.append(LogLine(self.next_index, part, ts, cut=cut))
                self.next_index += 1
                cut = 0
            if parts[-1]:
                self.partial = LogLine(self.next_index, parts[-1], ts, cut=cut)
        else:
            parts = text.replace("\r\n", "\n").split("\n")
            for n, part in enumerate(parts):
                current = self.partial
                before = current.text if current is not None else ""
                line, cr = _overwrite(before, self._cr, part)
                line_ts = (current.ts if current is not None else None) or ts
                # what was cut of the line so far still counts unless the line was written over
                cut = current.cut if current is not None and line.startswith(before) else 0
                self.partial, self._cr = None, False
                if n < len(parts) - 1:
                    done.append(LogLine(self.next_index, line, line_ts, cut=cut))
                    self.next_index += 1
                elif line:
                    self.partial, self._cr = LogLine(self.next_index, line, line_ts, cut=cut), cr
        if self.partial is not None and len(self.partial.text) > MAX_LINE:
            self.partial = self._bounded(self.partial)
        for i, line in enumerate(done):
            if len(line.text) > MAX_LINE:
                done[i] = self._bounded(line)
        self.lines.extend(done)
        self._trim()
        return done

    @staticmethod
    def _bounded(line: LogLine) -> LogLine:
        line.cut += len(line.text) - MAX_LINE
        line.text = line.text[:MAX_LINE]
        line.plain = None
        return line

    def mark_run(self, run: dict[str, Any]) -> list[LogLine]:
        """A run began (a separator line, after the partial line, which it completes) or, for a run
        already marked, ended (its separator changes in place: nothing is returned)."""
        line = self.runs.get(run.get("run"))
        if line is not None:
            line.run = run
            return []
        done = []
        if self.partial is not None:
            done.append(self.partial)
            self.next_index += 1
            self.partial, self._cr = None, False
        line = LogLine(self.next_index, "", run.get("startedAt"), run=run)
        self.next_index += 1
        done.append(line)
        self.runs[run.get("run")] = line
        self.lines.extend(done)
        self._trim()
        return done

    def _trim(self) -> None:
        overflow = len(self.lines) - self.max_lines
        for _ in range(max(0, overflow)):
            self.lines.popleft()  # a run's separator stays in `runs`: its end changes nothing shown

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
