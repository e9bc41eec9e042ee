"""A terminal in a kernel: a command on a pseudo-terminal (a real PTY: the program sees a tty, Ctrl-C
reaches its foreground process group, the window size follows the client's), served over a link stream.

Stream frames (dicts, see bai/node/link/streams.py):
  manager → agent   {"t": "in", "d": bytes}    keystrokes, raw
                    {"t": "resize", "rows", "cols"}
  agent → manager   {"t": "out", "d": bytes}   what the terminal shows, raw
                    {"t": "exit", "code": int} the command ended (the last frame)

A resize whose rows or cols is not an int in 1..MAX_WINDOW is ignored; nothing a frame holds ends the stream.
When the stream ends (the client or the manager went away, the link stream closed, the kernel was destroyed)
or the command ends, the terminal is closed: every process of the command's session on that terminal (its
shell, and the jobs it started, whatever their process group) gets SIGHUP, then SIGKILL after TERMINAL_GRACE
seconds, and the pty is freed. The agent counts a kernel's terminals only while they are served.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import signal
import struct
import termios
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from bai.common.background import cancel_and_wait
from bai.node.link.streams import LinkStream, StreamClosed

log = logging.getLogger("bai.agent.terminal")
READ_SIZE = 64 * 1024
# bash when the image has it, else sh (busybox images have only sh)
DEFAULT_COMMAND = ["/bin/sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash; else exec sh; fi"]
TERM = "xterm-256color"
MAX_WINDOW = 1000  # rows and cols of a terminal at most
TERMINAL_GRACE = 1.0  # seconds between the SIGHUP of a closed terminal's processes and their SIGKILL


class Terminal(Protocol):
    """A command running on a pseudo-terminal."""

    async def read(self) -> bytes | None:
        """What the terminal shows next; None once the command ended and everything was read."""
        ...

    async def write(self, data: bytes) -> None: ...

    async def resize(self, rows: int, cols: int) -> None: ...

    async def wait(self) -> int:
        """The command's exit status (128 + signal for a signal)."""
        ...

    async def close(self) -> None:
        """End the command (if it still runs) and free the terminal."""
        ...


def winsize(rows: int, cols: int) -> bytes:
    return struct.pack("HHHH", max(1, min(rows, MAX_WINDOW)), max(1, min(cols, MAX_WINDOW)), 0, 0)


def window_of(frame: Mapping[str, Any]) -> tuple[int, int] | None:
    """The (rows, cols) a resize frame asks for, or None when either is not an int in 1..MAX_WINDOW."""
    rows, cols = frame.get("rows"), frame.get("cols")
    for value in (rows, cols):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_WINDOW:
            return None
    assert isinstance(rows, int) and isinstance(cols, int)
    return rows, cols


def window_part(value: object, default: int) -> int:
    """A terminal's first rows or cols as the manager asked: an int clamped to 1..MAX_WINDOW, else `default`."""
    if isinstance(value, bool) or not isinstance(value, int):
        return default
    return max(1, min(value, MAX_WINDOW))


@dataclass(frozen=True)
class PtySession:
    """The processes a terminal started, as this host sees them: those of session `sid` (the terminal's command
    leads it), in pid namespace `ns` when known (a container's pids are its own: the namespace tells them apart).
    Its jobs lose their controlling terminal once the leader ends, so they are found by session, not by tty.
    A session id is not reused while a process of the session lives; `start` (the leader's start time) tells
    a later session of the same id (after all of this one ended) from this one."""

    sid: int
    start: int
    ns: str | None = None

    @classmethod
    def of_leader(cls, pid: int, *, with_ns: bool = True) -> PtySession | None:
        """The session process `pid` leads, or None when this host cannot see it."""
        stat = _stat(pid)
        if stat is None or stat.sid != pid:
            return None
        return cls(pid, stat.start, _pid_ns(pid) if with_ns else None)

    def members(self) -> list[int]:
        """Its processes alive now (zombies are their parents' to reap)."""
        leader = _stat(self.sid)
        if leader is not None and leader.start != self.start:
            return []  # the id is another session's now: ours ended
        found = []
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            stat = _stat(int(name))
            if stat is None or stat.state == "Z" or stat.sid != self.sid:
                continue
            if self.ns is not None and _pid_ns(int(name)) != self.ns:
                continue
            found.append(int(name))
        return found

    def signal(self, sig: int) -> int:
        """Send `sig` to its processes; how many there were."""
        pids = self.members()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        return len(pids)

    async def end(self, grace: float = TERMINAL_GRACE) -> int:
        """SIGHUP to its processes, SIGKILL to those left after `grace` seconds; how many were left (0: all
        ended). The scans of /proc run off the event loop."""
        if not await asyncio.to_thread(self.signal, signal.SIGHUP):
            return 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while loop.time() < deadline:
            await asyncio.sleep(0.05)
            if not await asyncio.to_thread(self.members):
                return 0
        await asyncio.to_thread(self.signal, signal.SIGKILL)
        for _ in range(40):
            await asyncio.sleep(0.025)
            if not (left := await asyncio.to_thread(self.members)):
                return 0
        return len(left)


@dataclass(frozen=True)
class ProcStat:
    state: str
    sid: int
    start: int  # clock ticks after boot


def _stat(pid: int) -> ProcStat | None:
    """What /proc/PID/stat says of process `pid`, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()
    try:
        return ProcStat(fields[0], int(fields[3]), int(fields[19]))
    except (IndexError, ValueError):
        return None


def _pid_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


class PtyProcess:
    """A local process on a PTY of this host (the local backend's kernels)."""

    def __init__(self, master: int, proc: asyncio.subprocess.Process) -> None:
        self.master = master
        self.proc = proc
        # the command's session (start_new_session): its processes as this host sees them
        self.session = PtySession.of_leader(proc.pid, with_ns=False)
        self.proc_done: asyncio.Future[int] | None = None  # set by whoever watches it
        self._data: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=64)
        loop = asyncio.get_running_loop()
        loop.add_reader(master, self._readable)
        self._reading = True

    @classmethod
    async def start(cls, command: Sequence[str], env: Mapping[str, str], cwd: str, rows: int, cols: int) -> PtyProcess:
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, winsize(rows, cols))

        def controlling_tty() -> None:  # in the child: its own session, the PTY as its terminal
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        try:
            proc = await asyncio.create_subprocess_exec(
                *command,
                stdin=slave,
                stdout=slave,
                stderr=slave,
                cwd=cwd,
                env={**env, "TERM": TERM},
                start_new_session=True,
                preexec_fn=controlling_tty,
            )
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        os.set_blocking(master, False)
        return cls(master, proc)

    def _readable(self) -> None:
        try:
            data = os.read(self.master, READ_SIZE)
        except BlockingIOError:
            return
        except OSError:  # EIO: the last process holding the terminal ended
            data = b""
        if not data:
            self._stop_reading()
            self._data.put_nowait(None)
            return
        self._data.put_nowait(data)
        if self._data.full():  # the client is slow: stop reading until it catches up (the PTY buffers)
            self._stop_reading()

    def _stop_reading(self) -> None:
        if self._reading:
            self._reading = False
            asyncio.get_running_loop().remove_reader(self.master)

    async def read(self) -> bytes | None:
        if self._data.empty() and not self._reading and self.proc.returncode is not None:
            return None  # closed, and everything shown
        data = await self._data.get()
        if data is None:
            self._data.put_nowait(None)
        elif not self._reading and self._data.empty() and self.proc.returncode is None:
            self._reading = True
            asyncio.get_running_loop().add_reader(self.master, self._readable)
        return data

    async def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.master, view)
            except BlockingIOError:
                await asyncio.sleep(0.01)
                continue
            view = view[n:]

    async def resize(self, rows: int, cols: int) -> None:
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, winsize(rows, cols))
        with contextlib.suppress(ProcessLookupError):  # the foreground program redraws
            os.killpg(self.proc.pid, signal.SIGWINCH)

    async def wait(self) -> int:
        code = await self.proc.wait()
        return 128 - code if code < 0 else code

    async def close(self) -> None:
        """End every process of the command's session on this pty (its jobs too, whatever their process
        group): SIGHUP, then SIGKILL after TERMINAL_GRACE seconds; reap the command, free the pty."""
        self._stop_reading()
        if self._data.empty():
            self._data.put_nowait(None)  # a reader waiting now sees the end
        left = await self.session.end() if self.session is not None else 0
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        await self.proc.wait()
        if left:
            log.warning("%d processes of a closed terminal (session %d) did not end", left, self.proc.pid)
        with contextlib.suppress(OSError):
            os.close(self.master)


class DockerExecTerminal:
    """A `docker exec` with a TTY in a kernel's container. Closing the attach stream ends nothing in the
    container (the daemon holds the pty), so `close` ends the exec's session itself: through /proc when the
    agent sees the container's processes (it runs on the daemon's host, as root)."""

    def __init__(self, execution: Any, stream: Any, container: Any = None) -> None:
        self.execution = execution
        self.stream = stream
        self.container = container
        self.session: PtySession | None = None  # found at start (None: this host cannot see it)
        self.pid = 0  # the exec's process, as the daemon's host sees it

    @classmethod
    async def start(
        cls, container: Any, command: Sequence[str], env: Mapping[str, str], rows: int, cols: int
    ) -> DockerExecTerminal:
        execution = await container.exec(
            list(command),
            stdin=True,
            tty=True,
            environment={**env, "TERM": TERM},
            workdir="/home/work",
        )
        stream = execution.start(detach=False)
        await stream.__aenter__()
        terminal = cls(execution, stream, container)
        await terminal._find_session()
        with contextlib.suppress(Exception):  # (a command that ended at once cannot be resized)
            await terminal.resize(rows, cols)
        return terminal

    async def _find_session(self) -> None:
        """The exec's process and session (the daemon starts it a moment after the attach)."""
        for _ in range(100):
            try:
                info = await self.execution.inspect()
            except Exception as e:  # noqa: BLE001 - it ends as it can (closing the stream)
                log.debug("cannot inspect a terminal's exec: %s", e)
                return
            self.pid = int(info.get("Pid") or 0)
            if self.pid or (not info.get("Running") and info.get("ExitCode") is not None):
                break
            await asyncio.sleep(0.02)
        if self.pid:
            self.session = await asyncio.to_thread(PtySession.of_leader, self.pid)

    async def read(self) -> bytes | None:
        message = await self.stream.read_out()
        return None if message is None else bytes(message.data)

    async def write(self, data: bytes) -> None:
        await self.stream.write_in(data)

    async def resize(self, rows: int, cols: int) -> None:
        await self.execution.resize(h=max(1, min(rows, MAX_WINDOW)), w=max(1, min(cols, MAX_WINDOW)))

    async def wait(self) -> int:
        for _ in range(50):  # the exec's status lags its stream's end a little
            try:
                info = await self.execution.inspect()
            except Exception:  # the container is gone (the kernel was destroyed under the terminal)
                return 129
            if not info.get("Running"):
                return int(info.get("ExitCode") or 0)
            await asyncio.sleep(0.02)
        return 0

    async def close(self) -> None:
        try:
            if self.session is not None:
                left = await self.session.end()
                if left:
                    log.warning("%d processes of a closed terminal (exec pid %d) did not end", left, self.pid)
            elif self.pid:
                log.warning(
                    "a closed terminal's processes (exec pid %d) are not visible to the agent (it does not run on "
                    "the Docker daemon's host, or not as root): they run until they end or the kernel does",
                    self.pid,
                )
        finally:
            with contextlib.suppress(Exception):
                await self.stream.close()


async def serve(terminal: Terminal, stream: LinkStream) -> None:
    """Pump keystrokes and resizes in, output out, until the command ends (then its exit status is the
    last frame) or the manager closes the stream (then the command is ended)."""

    async def keys() -> None:
        while (frame := await stream.receive()) is not None:
            if not isinstance(frame, dict):
                continue
            kind = frame.get("t")
            if kind == "in" and isinstance(frame.get("d"), bytes | str):
                data = frame["d"]
                try:
                    await terminal.write(data.encode(errors="replace") if isinstance(data, str) else data)
                except Exception as e:  # noqa: BLE001 - the command just ended: its output says so
                    log.debug("cannot write to a terminal: %s", e)
            elif kind == "resize":
                window = window_of(frame)
                if window is None:
                    log.debug("a resize frame of no size ignored: %.100r", frame)
                    continue
                try:
                    await terminal.resize(*window)
                except Exception as e:  # noqa: BLE001 - a terminal that cannot be resized goes on
                    log.debug("cannot resize a terminal: %s", e)

    async def screen() -> None:
        while (data := await terminal.read()) is not None:
            await stream.send({"t": "out", "d": data})
        code = await terminal.wait()
        await stream.send({"t": "exit", "code": code})

    tasks = [asyncio.create_task(screen(), name="terminal-out"), asyncio.create_task(keys(), name="terminal-in")]
    try:
        # the command ended (out), or the client went away (in: the stream ended)
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            with contextlib.suppress(StreamClosed):
                task.result()
    finally:
        await cancel_and_wait(*tasks, expected=(StreamClosed,))
        await terminal.close()
