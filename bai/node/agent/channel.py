"""Agent-side execution channels: how the agent runs code in a kernel and gathers its output.

`RunnerChannel` speaks the runner protocol (see runner.py) over a Unix socket the agent listens on
and the kernel's runner connects to; through the runner it also starts apps in the kernel and opens
TCP tunnels to them (more connections to the same socket), which needs no network in the kernel.
In a multi-node session a peer proxy (the runner in relay mode, standing in for a kernel on another agent;
see bai/common/cluster.py) relays connections to that kernel through a local kernel's socket: each is one
more connection to the socket, saying {"dial": {"host", "port"}}, handed to the agent
(`RunnerChannel.on_dial`), which connects it to that kernel (agent.py `dial`).
Other channels (docker exec for images without Python) feed the same record queue, so
`next_result` aggregates output the same way for all of them (reference spec §6, "How the
agent aggregates a result").
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import secrets
import socket
import weakref
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from bai.common.background import cancel_and_wait
from bai.common.logs import LogThrottle
from bai.node.link.messages import QueuePlace, RunResult

log = logging.getLogger("bai.agent.channel")

CONTROL_RECORDS = {"finished", "waiting-input", "clean-finished", "build-finished"}
STEP_RECORDS = {"clean-finished", "build-finished"}  # a batch run's step ended (Backend.AI's statuses)
OUTPUT_RECORDS = {"stdout", "stderr"}
OutputSink = Callable[[str, str], None]
# a connection relayed (by a peer proxy, through this kernel's socket) to another kernel of the session:
# (host, port, reader, writer)
DialHandler = Callable[[str, int, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class ChannelError(Exception):
    """A run cannot be started, fed or read in this kernel (said to the client as a 4xx)."""


NO_RUNNER = "this kernel has no runner (no Python in the image): apps need one"


MAX_WAITING = 32  # runs waiting behind the running one, per kernel
QUEUE_NOTICE = 1.0  # seconds a waiting run's poll is held at most before it is answered with its place
KEEP_FINISHED = MAX_WAITING + 16  # finished runs whose end is not read yet (older ones are forgotten)
KEEP_ANSWERS = 16  # a run's last answers, for a caller that did not get them (Execute.after) ...
KEEP_ANSWER_CHARS = 256 * 1024  # ... of at most this much output together (the newest always kept)
KEEP_ANSWERED = 16  # runs whose end was read: kept (with their last answers) for such a caller
MAX_BUFFERED = 8 * 1024 * 1024  # output characters kept for a run whose client is not reading
MAX_KERNEL_BUFFERED = 2 * MAX_BUFFERED  # ... and for all the runs of a kernel (KEEP_FINISHED may be unread)
RECORD_COST = 64  # what each queued record counts against MAX_BUFFERED besides its output characters
MAX_EXIT = 2**31 - 1  # an exit code the kernel reports is clamped to a signed 32-bit int

# What a kernel's connections to its agent socket may make the agent hold (the kernel may replace the
# runner: every byte is hostile). The first line of a connection says what it is; until then it holds
# at most HELLO_LIMIT bytes for HELLO_TIMEOUT seconds, and at most MAX_UNGREETED connections per kernel
# are in that state. After it, a connection's reads are flow-controlled at STREAM_LIMIT (the socket is not
# read while that much waits), and the runner's record lines may be MAX_RUNNER_LINE bytes long (output is
# sent as the code writes it: one print() of a long string is one line); a longer line is read through in
# chunks and dropped with a notice, never buffered. At most MAX_CONNECTIONS connections (runner, tunnels,
# dials) per kernel are open at once; more are closed unread.
HELLO_LIMIT = 4 * 1024
HELLO_TIMEOUT = 5.0
MAX_UNGREETED = 64
STREAM_LIMIT = 64 * 1024
MAX_RUNNER_LINE = 4 * 1024 * 1024
READ_CHUNK = 64 * 1024
MAX_CONNECTIONS = 512  # apps.py: MAX_TUNNELS + MAX_PEER_TUNNELS are 256 each


def _merged(answers: list[RunResult]) -> RunResult:
    """Answers of a run given again as one: their output in order, the last one's status."""
    console: list[list[str]] = []
    for answer in answers:
        for kind, text in answer.console:
            if console and console[-1][0] == kind:
                console[-1][1] += text
            else:
                console.append([kind, text])
    last = answers[-1]
    return msgspec.structs.replace(last, console=console)


def _run_id(value: object) -> bool:
    """A run id as a runner's hello may name one."""
    return isinstance(value, str) and 0 < len(value) <= 64


def exit_code_of(value: object) -> int:
    """An exit code a kernel reported: an int (a bool, a float or anything else is 1), clamped to 32 bits."""
    if isinstance(value, bool) or not isinstance(value, int):
        return 1
    return max(-MAX_EXIT - 1, min(value, MAX_EXIT))


class LineReader:
    """Newline-ended lines of a stream, each at most `limit` bytes buffered: a longer one is read through
    and discarded in chunks, and given back as its length (an int) instead of its bytes."""

    def __init__(self, reader: asyncio.StreamReader, limit: int, chunk: int = READ_CHUNK) -> None:
        self.reader = reader
        self.limit = limit
        self.chunk = chunk
        self._buf = bytearray()
        self._scanned = 0  # bytes of _buf known to hold no newline

    async def next(self) -> bytes | int | None:
        """The next line (with its newline), the length of an over-long one (dropped), or None at the end
        (a last line without a newline is dropped)."""
        while True:
            end = self._buf.find(b"\n", self._scanned)
            if end >= 0:
                line = bytes(self._buf[: end + 1])
                del self._buf[: end + 1]
                self._scanned = 0
                return line
            self._scanned = len(self._buf)
            if len(self._buf) > self.limit:
                return await self._discard()
            data = await self.reader.read(self.chunk)
            if not data:
                self._buf.clear()
                return None
            self._buf += data

    async def _discard(self) -> int:
        dropped = len(self._buf)
        self._buf.clear()
        self._scanned = 0
        while data := await self.reader.read(self.chunk):
            end = data.find(b"\n")
            if end >= 0:
                self._buf += data[end + 1 :]
                return dropped + end + 1
            dropped += len(data)
        return dropped


@dataclass(eq=False)
class Run:
    """One execution in a kernel: its code, its state and the records only it sees."""

    id: str
    mode: str
    code: str
    state: str = "waiting"  # waiting -> running -> finished
    records: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)
    started: asyncio.Event = field(default_factory=asyncio.Event)  # set when it runs (or ends waiting)
    buffered: int = 0  # output characters queued and not read yet
    dropped: bool = False
    cancelled: bool = False  # left the queue before it ran
    # a batch run of several steps (clean, build, exec; see agent/batch.py): those still to run after the one
    # running now (`step`), each a (step, command); each but the last ends with a `STEP-finished` record
    steps: list[tuple[str, str]] = field(default_factory=list)
    step: str = "exec"
    interrupted: bool = False  # no further step runs
    # a run the kernel's runner had from an agent before this one (it said so in its hello, or its records name
    # it): it runs (or waits) in the kernel already, so it is never started again
    adopted: bool = False
    answers: deque[RunResult] = field(default_factory=lambda: deque(maxlen=KEEP_ANSWERS))  # its last answers
    seq: int = 0  # answers given so far (each answer's `seq`: 1, 2, …)


class Channel:
    """The common part: runs one at a time in arrival order (the others wait in a queue), the records of
    each run kept apart by run id, result aggregation."""

    supports_query = True

    def __init__(self, on_output: OutputSink) -> None:
        self.on_output = on_output
        self.current: Run | None = None
        self.waiting: deque[Run] = deque()
        self.runs: dict[str, Run] = {}  # waiting, running and finished-but-unread runs by id
        self.answered: OrderedDict[str, Run] = OrderedDict()  # runs whose end was read (KEEP_ANSWERED)
        self._ending = False  # the kernel went away: waiting runs end instead of starting
        self.buffered = 0  # what all its runs hold unread (the sum of their `buffered`)
        self.exit_code: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    @property
    def run_id(self) -> str | None:
        """The run that has the kernel now."""
        return self.current.id if self.current is not None else None

    # -- to be provided by subclasses --
    async def _start(self, mode: str, code: str) -> None:
        raise NotImplementedError

    async def send_input(self, data: str) -> None:
        raise NotImplementedError

    async def send_eof(self) -> None:
        """The run's input has ended: a waiting (or later) input() raises EOFError, a command's stdin
        closes. Channels that cannot tell (a docker exec) ignore it."""

    async def interrupt(self) -> None:
        """Interrupt the code running now (SIGINT)."""
        raise NotImplementedError

    async def put_file(self, path: str, data: bytes, mode: int | None = None) -> None:
        raise NotImplementedError

    async def set_env(self, env: dict[str, str]) -> None:
        """Give the kernel's processes started from now on these variables (a warm kernel's hand-over)."""
        raise ChannelError(NO_RUNNER)

    async def start_service(
        self, name: str, port: int, command: list[str] | None, env: dict[str, str], timeout: float
    ) -> dict[str, Any]:
        """Start the app `name` listening on TCP `port` in the kernel unless it listens already; the
        runner's service record (ok, started, error, output). Only a kernel with a runner can."""
        raise ChannelError(NO_RUNNER)

    async def open_tunnel(self, port: int, timeout: float = 10.0) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A byte stream to TCP `port` in the kernel. Only a kernel with a runner can."""
        raise ChannelError(NO_RUNNER)

    async def restart(self, timeout: float, exited: asyncio.Future[Any] | None = None) -> None:
        """Start the kernel's code afresh (a new Python namespace); runs still going or waiting end. This
        one has nothing of its own to restart."""
        self.lost("\n[the kernel was restarted]\n")

    async def close(self) -> None:
        """Stop talking to the kernel; a run still going ends (exit 137 unless the exit code is known)."""
        self.lost("\n[the kernel was destroyed]\n")

    async def detach(self) -> None:
        """The agent stops while the kernel goes on: stop talking to it. A channel whose runs cannot outlive
        the agent (a docker exec's) ends them as `close` does; a runner's go on in the kernel, for the next
        agent to re-attach to (RunnerChannel)."""
        await self.close()

    # -- shared --
    def feed(self, record: dict[str, Any]) -> None:
        """Take one record from the kernel: tee output into the log, queue it for the running run. Records
        are the kernel's to make up: output that is not text, and kinds nobody reads, are dropped; what
        queues for a run whose client is not reading is bounded (MAX_BUFFERED, RECORD_COST a record)."""
        kind = record.get("t")
        if not isinstance(kind, str):
            return
        if kind in OUTPUT_RECORDS:
            if not isinstance(record.get("d", ""), str):
                return
            self.on_output(kind, record.get("d", ""))
        elif kind not in CONTROL_RECORDS:
            return
        run = self.current
        named = record.get("id")
        if isinstance(named, str) and (run is None or run.id != named):
            run = self._run_named(named)
        if run is None:
            return  # output with nobody running (reconnect): kept in the log only
        if kind == "finished":
            record = {"t": "finished", "exit": exit_code_of(record.get("exit", 0))}
        elif kind == "waiting-input":
            opts = record.get("opts")
            secret = isinstance(opts, dict) and opts.get("is_password") is True
            record = {"t": "waiting-input", "opts": {"is_password": secret}}
        elif kind in STEP_RECORDS:
            return  # said by the agent itself (_step_ended), never by the kernel
        if kind != "finished":  # (a run always gets its end)
            size = len(record.get("d", "")) + RECORD_COST
            if run.buffered + size > MAX_BUFFERED or self.buffered + size > MAX_KERNEL_BUFFERED:
                if not run.dropped:  # its client is not reading: keep the kernel's log, drop the rest
                    run.dropped = True
                    run.records.put_nowait({"t": "stderr", "d": "\n[output dropped: nobody was reading it]\n"})
                return
            run.buffered += size
            self.buffered += size
        if kind == "finished" and (run.steps or run.step != "exec"):
            self._step_ended(run, record["exit"])
            return
        run.records.put_nowait(record)
        if kind == "finished":
            current = self.current is run
            self._finished(run)
            if current:
                self._next()

    def _run_named(self, run_id: str) -> Run | None:
        """The run a record of the kernel names that is not the current one: one still going (or waiting), or one
        this agent never started (the kernel's runner ran it for an agent before this one: it is adopted, as the
        current run when there is none). None for one that ended (its records are in the log only)."""
        run = self.runs.get(run_id)
        if run is not None:
            return run if run.state != "finished" else None
        if len(run_id) > 64 or not self._may_adopt():
            return None  # (the kernel's to make up: it cannot make the agent hold runs without end)
        run = self._adopt_run(run_id, "query")
        if self.current is None:
            self.current = run
        return run

    def _may_adopt(self) -> bool:
        """Whether another run the kernel names may be adopted: at most MAX_WAITING adopted ones not ended (what
        a kernel says, in its records or in any number of hellos, cannot make the agent hold runs without end)."""
        return sum(r.adopted and r.state != "finished" for r in self.runs.values()) < MAX_WAITING

    def _adopt_run(self, run_id: str, mode: str) -> Run:
        """A run of the kernel that this agent did not start, as running."""
        run = Run(run_id, mode, "", state="running", adopted=True)
        run.started.set()
        self.runs[run_id] = run
        return run

    def adopt_runs(self, hello: dict[str, Any]) -> None:
        """What a runner's hello says it has (see runner.py): the job running (the current run, adopted unless
        known), the jobs waiting (adopted as waiting, ahead of this agent's own), the jobs whose records follow
        (adopted as running: a client that asks for one before its records arrive waits for them, even for its
        end) and the last that ended (their ends, for a client that asks for them after a restart). Malformed
        parts are ignored."""
        job = hello.get("job")
        if "job" not in hello and hello.get("busy") is True and self.current is None:
            # a runner older than run ids, busy with a job of an agent before this one: the job is a run of its
            # own (its records name none: they are the current run's), so that new runs wait behind it
            job = {"id": f"earlier-{secrets.token_hex(4)}", "kind": "query"}
        if isinstance(job, dict) and _run_id(job.get("id")) and job["id"] not in self.runs:
            mode = "batch" if job.get("kind") == "batch" else "query"
            run = self._adopt_run(job["id"], mode)
            if self.current is None:
                self.current = run
        queued = hello.get("queued")
        if isinstance(queued, list):
            ahead = [q for q in queued[:MAX_WAITING] if _run_id(q) and q not in self.runs]
            room = MAX_WAITING - sum(r.adopted and r.state != "finished" for r in self.runs.values())
            for run_id in reversed(ahead[: max(0, room)]):
                run = Run(run_id, "query", "", adopted=True)
                self.runs[run_id] = run
                self.waiting.appendleft(run)
        backlog = hello.get("backlog")
        if isinstance(backlog, list):  # runs whose records follow the hello: known before those arrive
            for run_id in backlog[:MAX_WAITING]:
                if _run_id(run_id) and run_id not in self.runs and self._may_adopt():
                    self._adopt_run(run_id, "query")
        done = hello.get("done")
        if isinstance(done, list):
            for item in done[:KEEP_FINISHED]:
                if not (isinstance(item, list) and len(item) == 2 and _run_id(item[0])) or item[0] in self.runs:
                    continue
                run = Run(item[0], "query", "", adopted=True)
                self.runs[item[0]] = run
                run.records.put_nowait({"t": "finished", "exit": exit_code_of(item[1])})
                self._finished(run)
        if self.current is None:
            self._next()

    def _step_ended(self, run: Run, code: int) -> None:
        """A step of a batch run ended: say so, then start the next step (the run keeps the kernel), or end
        the run. After a failed build the program is not run (exit 127, as Backend.AI's runners do)."""
        run.records.put_nowait({"t": f"{run.step}-finished", "exit": code})
        if run.step == "build" and code != 0 and not run.interrupted and not self._ending:
            run.steps = []
            run.step = "exec"
            run.records.put_nowait({"t": "stderr", "d": "[the build failed: the program was not run]\n"})
            self.feed({"t": "finished", "exit": 127})
            return
        command = self._next_step(run) if not (run.interrupted or self._ending) else None
        if command is None:
            run.steps = []
            run.step = "exec"
            self.feed({"t": "finished", "exit": code})
            return
        asyncio.get_running_loop().create_task(self._begin(run, command), name=f"run-{run.id}-{run.step}")

    @staticmethod
    def _next_step(run: Run) -> str | None:
        """The command of the run's next step that has one (skipped steps are said finished at once), or None
        when no step is left."""
        while run.steps:
            run.step, command = run.steps.pop(0)
            if command or run.step == "exec":
                return command
            run.records.put_nowait({"t": f"{run.step}-finished", "exit": 0})
        return None

    def _finished(self, run: Run) -> None:
        run.state = "finished"
        run.started.set()
        if self.current is run:
            self.current = None
        unread = [r for r in self.runs.values() if r.state == "finished"]
        for old in unread[: max(0, len(unread) - KEEP_FINISHED)]:
            self.runs.pop(old.id, None)
            self.buffered -= old.buffered  # forgotten with what it held

    def _next(self) -> None:
        """Give the kernel to the first waiting run (its code starts in the background)."""
        if self.current is not None or not self.waiting or self._ending:
            return
        run = self.waiting.popleft()
        self.current = run
        run.state = "running"
        run.started.set()
        if run.adopted:
            return  # the kernel runs it already (it was waiting there)
        asyncio.get_running_loop().create_task(self._begin(run, run.code), name=f"run-{run.id}")

    async def _begin(self, run: Run, code: str) -> None:
        try:
            await self._start(run.mode, code)
        except Exception as e:  # noqa: BLE001 - the run ends with the reason; the next one goes on
            if self.current is run:
                run.steps, run.step = [], "exec"
                self.feed({"t": "stderr", "d": f"\n[the run could not start: {e}]\n"})
                self.feed({"t": "finished", "exit": 1})

    def lost(self, message: str) -> None:
        """The kernel went away: end the current run and every waiting one so nobody waits forever."""
        code = self.exit_code.result() if self.exit_code.done() else 137
        self._ending = True
        try:
            while self.waiting:
                run = self.waiting.popleft()
                run.records.put_nowait({"t": "stderr", "d": message})
                run.records.put_nowait({"t": "finished", "exit": code})
                self._finished(run)
            if self.current is not None:
                self.current.steps, self.current.step = [], "exec"
                self.feed({"t": "stderr", "d": message})
                self.feed({"t": "finished", "exit": code})
        finally:
            self._ending = False

    async def start_run(self, run_id: str, mode: str, code: str, steps: list[tuple[str, str]] | None = None) -> None:
        """Start a run now if the kernel is free, else queue it behind the others (same id again: no-op).
        `steps`: a batch run's steps (clean, build, exec: see agent/batch.py) instead of `code`."""
        if mode == "query" and not self.supports_query:
            raise ChannelError("this kernel's image has no Python: only commands (batch mode) can run")
        if run_id in self.runs or run_id in self.answered:
            return  # (a start said again: by a caller that did not hear it was taken)
        run = Run(run_id, mode, code)
        if steps:
            run.steps = list(steps)
            run.code = self._next_step(run) or ""
        if self.current is not None or self.waiting:
            if len(self.waiting) >= MAX_WAITING:
                raise ChannelError(f"{MAX_WAITING} runs are already waiting in this kernel: try again later")
            self.runs[run_id] = run
            self.waiting.append(run)
            return
        self.runs[run_id] = run
        self.current = run
        run.state = "running"
        run.started.set()
        try:
            await self._start(mode, run.code)
        except BaseException:
            self.runs.pop(run_id, None)
            self.buffered -= run.buffered
            run.buffered = 0
            if self.current is run:
                self.current = None
            self._next()
            raise

    def fail_run(self, run_id: str, message: str, code: int = 127) -> None:
        """A run that ends before it starts, saying why on its stderr (e.g. nothing to run)."""
        if run_id in self.runs:
            return
        run = Run(run_id, "batch", "")
        self.runs[run_id] = run
        run.records.put_nowait({"t": "stderr", "d": message if message.endswith("\n") else message + "\n"})
        run.records.put_nowait({"t": "finished", "exit": code})
        self.on_output("stderr", message if message.endswith("\n") else message + "\n")
        self._finished(run)

    def queue_of(self, run: Run) -> QueuePlace:
        """Where a waiting run stands: behind which run, how many ahead of it."""
        ahead = next(i for i, r in enumerate(self.waiting) if r is run)
        return QueuePlace(self.run_id, ahead + (self.current is not None))

    async def interrupt_run(self, run_id: str | None = None) -> bool:
        """Interrupt `run_id` (a waiting run leaves the queue and ends), else the running run.
        False when that run is not running or waiting."""
        if run_id is None or (self.current is not None and self.current.id == run_id):
            if self.current is None:
                return False
            self.current.interrupted = True  # a batch run's later steps do not run
            await self.interrupt()
            return True
        run = self.runs.get(run_id)
        if run is None or run.state != "waiting":
            return False
        self.waiting.remove(run)
        run.cancelled = True
        run.records.put_nowait({"t": "stderr", "d": "[cancelled before it ran]\n"})
        run.records.put_nowait({"t": "finished", "exit": 130})
        self._finished(run)
        return True

    def check_running(self, run_id: str) -> None:
        """Input goes to the run that has the kernel; others get an error."""
        if self.run_id != run_id:
            state = self.runs[run_id].state if run_id in self.runs else "unknown"
            raise ChannelError(f"run {run_id} is not running ({state}): it cannot take input")

    async def next_result(self, run_id: str, flush_timeout: float, after: int | None = None) -> RunResult:
        """Gather records of the run until a control record, or until output pauses / the timeout.
        A run still waiting its turn gets `continued` with where it stands in `queue`. `after`: the last answer
        the caller saw; the kept answers after it come first, as one (of a run whose end was read, too)."""
        run = self.runs.get(run_id)
        if after is not None:
            kept = run or self.answered.get(run_id)
            if kept is not None:
                missed = [a for a in kept.answers if a.seq > after]
                if missed:
                    return _merged(missed)
                if run is None and kept.answers:  # the caller saw its end: the end again
                    last = kept.answers[-1]
                    return RunResult(run_id, last.status, [], last.exit_code, last.options, seq=last.seq)
        if run is None:
            raise ChannelError(f"no run {run_id} in this kernel")
        result = await self._gather(run, flush_timeout)
        run.seq += 1
        result = msgspec.structs.replace(result, seq=run.seq)
        if result.console or result.status != "continued":  # (an empty poll is not worth keeping)
            run.answers.append(result)
            chars = sum(len(text) for a in run.answers for _, text in a.console)
            while len(run.answers) > 1 and chars > KEEP_ANSWER_CHARS:
                chars -= sum(len(text) for _, text in run.answers.popleft().console)
        if result.status == "finished":
            self.answered[run_id] = run
            while len(self.answered) > KEEP_ANSWERED:
                self.answered.popitem(last=False)
        return result

    async def _gather(self, run: Run, flush_timeout: float) -> RunResult:
        run_id = run.id
        console: list[list[str]] = []
        status = "continued"
        exit_code = None
        options: dict[str, Any] | None = None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + flush_timeout
        if run.state == "waiting":  # told where it stands within a second (its client says so), or it starts
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(run.started.wait(), min(flush_timeout, QUEUE_NOTICE))
            if run.state == "waiting":
                return RunResult(run_id, status, console, queue=self.queue_of(run))
        try:
            left = max(0.0, deadline - loop.time())
            record: dict[str, Any] | None = await asyncio.wait_for(run.records.get(), left)
        except TimeoutError:
            record = None
        while record is not None:
            kind = record.get("t")
            taken = min(run.buffered, len(record.get("d", "")) + RECORD_COST)
            run.buffered -= taken
            self.buffered -= taken
            if kind in OUTPUT_RECORDS:
                text = record.get("d", "")
                if console and console[-1][0] == kind:
                    console[-1][1] += text
                else:
                    console.append([kind, text])
            elif kind == "finished":
                status, exit_code = "finished", int(record.get("exit", 0))
                self.runs.pop(run_id, None)
                self.buffered -= run.buffered
                run.buffered = 0
                break
            elif kind == "waiting-input":
                status, options = "waiting-input", record.get("opts") or {"is_password": False}
                break
            elif kind in STEP_RECORDS:  # a batch step ended: its own result (the run goes on)
                status, exit_code = kind, int(record.get("exit", 0))
                break
            try:
                record = run.records.get_nowait()
            except asyncio.QueueEmpty:
                record = None
        return RunResult(run_id, status, console, exit_code, options, cancelled=run.cancelled)


AGENT_SOCKET = "agent.sock"  # in a kernel's run folder: where the agent listens for its runner


def bind_unix(path: Path) -> socket.socket:
    """A listening Unix socket at *path* (a stale one is replaced), even one longer than sun_path allows."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    fd = os.open(path.parent, os.O_PATH)
    try:
        where = f"/proc/self/fd/{fd}/{path.name}"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(where)
        sock.bind(where)
    except OSError:
        sock.close()
        raise
    finally:
        os.close(fd)
    sock.listen(4)
    sock.setblocking(False)
    return sock


def widen(reader: asyncio.StreamReader, limit: int) -> None:
    """Raise a reader's flow-control limit (it stops reading its socket while 2 x limit bytes wait): the
    greeting is read under a small one, the stream after it under a larger one. asyncio has no public
    setter; without the attribute the small limit stays (slower, never unbounded)."""
    if isinstance(getattr(reader, "_limit", None), int):
        reader._limit = limit  # type: ignore[attr-defined]


async def _closed(writer: asyncio.StreamWriter) -> None:
    """Until the connection `writer` writes to is closed (by whoever was handed it)."""
    with contextlib.suppress(Exception):
        await writer.wait_closed()


class RunnerChannel(Channel):
    """Talks to runner.py: the agent listens on a Unix socket in the kernel's run folder and the runner
    connects to it (and connects again after the agent restarts). Connecting needs no write access to the
    folder, so a container gets it read-only and can write nothing there. The first line of a connection
    says what it is: a runner's hello (one runner connection at a time: while one is up, another
    connection greeting as the runner is closed at once), {"tunnel": ID}, the kernel side of a tunnel
    that `open_tunnel` asked for (an ID nobody waits for is closed), or {"dial": {"host": NAME, "port": N}},
    a connection to another kernel of the session that a peer proxy relays: handed to
    `on_dial` (the agent's), closed when there is none; anything else is closed."""

    def __init__(self, socket_path: Path, on_output: OutputSink) -> None:
        super().__init__(on_output)
        self.socket_path = socket_path
        self.writer: asyncio.StreamWriter | None = None
        self._server: asyncio.AbstractServer | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._put_waiters: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._env_waiters: list[asyncio.Future[dict[str, Any]]] = []  # env ops, answered in order
        self._service_waiters: dict[str, asyncio.Future[dict[str, Any]]] = {}  # by start-service id
        self._tunnel_waiters: dict[str, asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]]] = {}
        self._tunnels: weakref.WeakSet[asyncio.StreamWriter] = weakref.WeakSet()  # handed out, closed with us
        self.hello: dict[str, Any] = {}
        self.connected = asyncio.Event()
        self.on_dial: DialHandler | None = None  # set by the agent
        self.open_connections = 0  # to the socket now, greeted or not (MAX_CONNECTIONS)
        self.ungreeted = 0  # of those, the ones that have not said what they are yet (MAX_UNGREETED)
        self._refused = LogThrottle(log)  # one line per burst of refused connections, not one per connection
        self._odd = LogThrottle(log)  # connections and lines that are not what the protocol says

    async def listen(self, owner: tuple[int, int] | None = None) -> None:
        """Listen at socket_path: owned by `owner` (uid, gid) with mode 0600 when given (and the agent may
        give it away), else mode 0666."""
        sock = bind_unix(self.socket_path)
        try:
            mode = 0o666
            if owner is not None:
                with contextlib.suppress(PermissionError):  # an agent that is not root: anyone's
                    os.chown(self.socket_path, *owner)
                    mode = 0o600
            os.chmod(self.socket_path, mode)
            self._server = await asyncio.start_unix_server(self._accept, sock=sock, limit=HELLO_LIMIT)
        except BaseException:
            sock.close()
            raise

    async def wait_connected(self, deadline: float, exited: asyncio.Future[Any] | None = None) -> None:
        """Until the runner has connected; ChannelError when the kernel exits or the deadline passes."""
        loop = asyncio.get_running_loop()
        while not self.connected.is_set():
            if exited is not None and exited.done():
                raise ChannelError("the kernel exited while starting")
            left = deadline - loop.time()
            if left <= 0:
                raise ChannelError("the kernel's runner did not connect in time")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.connected.wait(), min(left, 0.05))

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.open_connections >= MAX_CONNECTIONS or self.ungreeted >= MAX_UNGREETED:
            writer.close()  # unread: what it sent is the kernel's socket buffer's, not ours
            self._refused(
                logging.WARNING,
                "a connection to %s refused: %d open (at most %d), %d not greeted yet (at most %d)",
                self.socket_path,
                self.open_connections,
                MAX_CONNECTIONS,
                self.ungreeted,
                MAX_UNGREETED,
            )
            return
        self.open_connections += 1
        try:
            await self._serve_connection(reader, writer)
        finally:
            self.open_connections -= 1
            writer.close()

    async def _greeting(self, reader: asyncio.StreamReader) -> object:
        """The connection's first line, parsed: at most HELLO_LIMIT bytes within HELLO_TIMEOUT seconds."""
        self.ungreeted += 1
        try:
            line = await asyncio.wait_for(reader.readuntil(b"\n"), HELLO_TIMEOUT)
        except asyncio.LimitOverrunError:
            raise ValueError(f"its first line is longer than {HELLO_LIMIT} bytes") from None
        except asyncio.IncompleteReadError as e:
            raise ValueError(f"it closed after {len(e.partial)} bytes without a first line") from None
        except TimeoutError:
            raise TimeoutError(f"no first line within {HELLO_TIMEOUT:g} s") from None
        finally:
            self.ungreeted -= 1
        widen(reader, STREAM_LIMIT)
        return json.loads(line)

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            hello = await self._greeting(reader)
            if isinstance(hello, dict) and "tunnel" in hello:
                self._tunnel_arrived(hello["tunnel"], reader, writer)
                if not writer.is_closing():
                    await _closed(writer)  # counted until it ends
                return
            if isinstance(hello, dict) and "dial" in hello:
                await self._dial_arrived(hello["dial"], reader, writer)
                return
            if not isinstance(hello, dict) or hello.get("t") != "hello":
                raise ValueError(f"expected a hello, got {json.dumps(hello)[:100]}")
        except (ValueError, TimeoutError, ConnectionError, RecursionError) as e:
            self._odd(logging.WARNING, "a connection to %s did not greet as a runner: %s", self.socket_path, e)
            return
        except asyncio.CancelledError:
            return  # the channel closed
        if self.writer is not None and not self.writer.is_closing():
            return  # the runner is connected: nobody else may talk for it
        self.writer = writer
        self.hello = hello
        self._reader_task = asyncio.current_task()
        self.adopt_runs(hello)
        self.connected.set()
        try:
            await self._read(reader)
        except asyncio.CancelledError:
            pass  # closed by the agent (asyncio would log a cancelled connection task as an error)
        finally:
            writer.close()
            if self.writer is writer:
                self.writer = None
                self._fail_waiters("the kernel's runner disconnected")

    def _tunnel_arrived(self, tunnel_id: object, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A connection that said {"tunnel": ID}: the kernel end of the tunnel `open_tunnel` waits for."""
        fut = self._tunnel_waiters.pop(tunnel_id, None) if isinstance(tunnel_id, str) else None
        if fut is None or fut.done():
            self._odd(
                logging.WARNING,
                "a tunnel connection to %s nobody waits for (%.40r): closed",
                self.socket_path,
                tunnel_id,
            )
            writer.close()
            return
        self._tunnels.add(writer)
        fut.set_result((reader, writer))

    async def _dial_arrived(self, dial: object, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A connection that said {"dial": {"host", "port"}}: handed to `on_dial` until it ends (it closes the
        connection when it cannot connect it); a malformed one, or one nobody takes, is closed."""
        host = dial.get("host") if isinstance(dial, dict) else None
        port = dial.get("port") if isinstance(dial, dict) else None
        handler = self.on_dial
        if (
            handler is None
            or not isinstance(host, str)
            or not 0 < len(host) <= 64
            or isinstance(port, bool)
            or not isinstance(port, int)
            or not 0 < port < 65536
        ):
            self._odd(
                logging.WARNING,
                "a dial connection to %s that cannot be relayed (%.80r): closed",
                self.socket_path,
                dial,
            )
            writer.close()
            return
        self._tunnels.add(writer)
        try:
            await handler(host, port, reader, writer)
        except asyncio.CancelledError:
            pass  # the channel closed (asyncio would log a cancelled connection task as an error)
        except Exception:
            log.exception("relaying a connection of %s to %s:%d failed", self.socket_path, host, port)
        finally:
            writer.close()

    def _fail_waiters(self, reason: str) -> None:
        """Nobody will answer: start_service/open_tunnel calls waiting for the runner raise ChannelError."""
        waiters: list[asyncio.Future[Any]] = [
            *self._service_waiters.values(),
            *self._tunnel_waiters.values(),
            *self._env_waiters,
        ]
        self._env_waiters.clear()
        self._service_waiters.clear()
        self._tunnel_waiters.clear()
        for fut in waiters:
            if not fut.done():
                fut.set_exception(ChannelError(reason))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        lines = LineReader(reader, MAX_RUNNER_LINE)
        try:
            while (line := await lines.next()) is not None:
                if isinstance(line, int):
                    self._too_long(line)
                    continue
                try:
                    record = json.loads(line)
                except (ValueError, RecursionError):
                    self._odd(logging.WARNING, "bad line from the runner of %s: %.200r", self.socket_path, line)
                    continue
                if not isinstance(record, dict):
                    self._odd(logging.WARNING, "bad line from the runner of %s: %.200r", self.socket_path, line)
                    continue
                try:
                    self._take(record)
                except Exception as e:  # noqa: BLE001 - one odd record must not hang the runner up
                    self._odd(logging.WARNING, "a record from the runner of %s was dropped: %r", self.socket_path, e)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        if self.run_id is not None:
            # the runner died mid-run: finish the run with the kernel's exit code once the agent has
            # reported the exit to the manager (so the session has ended before its client hears of it)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.exit_code), 10.0)
            self.lost("\n[the kernel process ended]\n")

    def _take(self, record: dict[str, Any]) -> None:
        """One record of the runner: an answer to what the agent asked (env, put-file, service, tunnel), else
        the running run's."""
        kind = record.get("t")
        if kind == "env":
            if self._env_waiters and not self._env_waiters[0].done():
                self._env_waiters.pop(0).set_result(record)
            return
        if kind == "put-file":
            fut = self._put_waiters.pop(str(record.get("path", ""))[:4096], None)
            if fut and not fut.done():
                fut.set_result(record)
            return
        if kind == "service":
            fut = self._service_waiters.pop(str(record.get("id"))[:64], None)
            if fut and not fut.done():
                fut.set_result(record)
            return
        if kind == "tunnel":  # a tunnel that could not be opened (an open one is a connection)
            tunnel = self._tunnel_waiters.pop(str(record.get("id"))[:64], None)
            if tunnel and not tunnel.done():
                tunnel.set_exception(ChannelError(str(record.get("error") or "the tunnel failed")[:1000]))
            return
        self.feed(record)

    def _too_long(self, size: int) -> None:
        """The runner sent a line longer than MAX_RUNNER_LINE (read through, not kept): said in the log and to
        the running run (it was most likely output written in one piece)."""
        self._odd(
            logging.WARNING,
            "a line of %d bytes from the runner of %s (at most %d): dropped",
            size,
            self.socket_path,
            MAX_RUNNER_LINE,
        )
        self.feed(
            {
                "t": "stderr",
                "d": f"\n[the kernel sent a message of {size} bytes, more than the {MAX_RUNNER_LINE} an agent takes: "
                "dropped (output written in one piece that long is not shown)]\n",
            }
        )

    async def _send(self, message: dict[str, Any]) -> None:
        if self.writer is None or self.writer.is_closing():
            raise ChannelError("the kernel's runner is not connected")
        self.writer.write(json.dumps(message).encode() + b"\n")
        await self.writer.drain()

    async def _start(self, mode: str, code: str) -> None:
        # (the run being started is the current one: its id comes back on its records)
        if mode == "query":
            await self._send({"op": "query", "code": code, "id": self.run_id})
        else:
            await self._send({"op": "batch", "cmd": code, "id": self.run_id})

    async def send_input(self, data: str) -> None:
        await self._send({"op": "input", "data": data})

    async def send_eof(self) -> None:
        await self._send({"op": "input-eof"})

    async def interrupt(self) -> None:
        await self._send({"op": "interrupt", "id": self.run_id})

    async def put_file(self, path: str, data: bytes, mode: int | None = None) -> None:
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._put_waiters[path] = fut
        message: dict[str, Any] = {"op": "put-file", "path": path, "b64": base64.b64encode(data).decode()}
        if mode is not None:
            message["mode"] = mode
        await self._send(message)
        reply = await asyncio.wait_for(fut, 30)
        if not reply.get("ok"):
            raise ChannelError(f"cannot write {path}: {reply.get('error')}")

    async def set_env(self, env: dict[str, str], timeout: float = 10.0) -> None:
        """The runner sets these variables for itself and all it starts from now on (see env in runner.py)."""
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._env_waiters.append(fut)
        try:
            await self._send({"op": "env", "env": env})
            reply = await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            raise ChannelError("the kernel's runner did not take its environment in time") from None
        finally:
            if fut in self._env_waiters:
                self._env_waiters.remove(fut)
        if not reply.get("ok"):
            raise ChannelError(f"the kernel's runner refused its environment: {reply.get('error')}")

    async def start_service(
        self, name: str, port: int, command: list[str] | None, env: dict[str, str], timeout: float
    ) -> dict[str, Any]:
        """Ask the runner to start app `name` on `port` (see start-service in runner.py) and return its
        service record; ChannelError when it does not answer within timeout + 5 s or disconnects."""
        op_id = secrets.token_hex(16)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._service_waiters[op_id] = fut
        message = {
            "op": "start-service",
            "id": op_id,
            "name": name,
            "port": port,
            "command": command,
            "env": env,
            "timeout": timeout,
        }
        try:
            await self._send(message)
            return await asyncio.wait_for(fut, timeout + 5)
        except TimeoutError:
            raise ChannelError(f"the kernel's runner did not answer about starting {name} in time") from None
        finally:
            self._service_waiters.pop(op_id, None)

    async def open_tunnel(self, port: int, timeout: float = 10.0) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A byte stream to TCP `port` in the kernel: the runner connects to the port and back to our socket
        (see tunnel in runner.py), and that connection is returned. EOF on it: the app closed its side (or
        shut its writing down); `writer.write_eof()` shuts ours down. ChannelError when nothing listens
        there, the runner is not connected, or no tunnel comes within `timeout` seconds."""
        tunnel_id = secrets.token_hex(16)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = loop.create_future()
        self._tunnel_waiters[tunnel_id] = fut
        try:
            await self._send({"op": "tunnel", "id": tunnel_id, "port": port})
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            raise ChannelError(f"no tunnel to port {port} in the kernel came within {timeout:g} s") from None
        except BaseException:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                fut.result()[1].close()  # it came, but our caller is gone
            raise
        finally:
            self._tunnel_waiters.pop(tunnel_id, None)

    async def restart(self, timeout: float, exited: asyncio.Future[Any] | None = None) -> None:
        """The runner executes itself afresh (see `restart` in runner.py: the same process, a new Python and
        namespace; what it ran is killed) and connects again; runs still going or waiting end. ChannelError
        when it has not connected again within `timeout` seconds (or the kernel exited)."""
        self.lost("\n[the kernel was restarted]\n")
        self.connected.clear()
        try:
            await self._send({"op": "restart"})
            await self.wait_connected(asyncio.get_running_loop().time() + timeout, exited)
        except ChannelError:
            if self.writer is not None and not self.writer.is_closing():
                self.connected.set()  # the old runner is still there (one without the restart op, say)
            raise

    async def detach(self) -> None:
        """The agent stops, the kernel goes on: stop listening and drop the connection, saying nothing to the
        runs (the runner keeps what they make for the next agent, which re-attaches to them)."""
        await self._hang_up()

    async def close(self) -> None:
        """Stop listening and drop the connection (the socket file stays for the next agent to replace)."""
        await self._hang_up()
        await super().close()

    async def _hang_up(self) -> None:
        if self._server is not None:
            self._server.close()
        if self.writer is not None:
            self.writer.close()
        self._fail_waiters("the kernel's channel was closed")
        for tunnel in list(self._tunnels):
            tunnel.close()
        self._refused.close()
        self._odd.close()
        task = self._reader_task
        await cancel_and_wait(task)  # (not when it is the reader itself that closes)
