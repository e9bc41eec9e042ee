"""A terminal in a kernel: a command on a pseudo-terminal (a real PTY: the program sees a tty, Ctrl-C
reaches its foreground process group, the window size follows the client's), served over a link stream.

Stream frames (dicts, see bai/node/link/streams.py):
  manager → agent   {"t": "in", "d": bytes}    keystrokes, raw
                    {"t": "resize", "rows", "cols"}
  agent → manager   {"t": "out", "d": bytes}   what the terminal shows, raw
                    {"t": "exit", "code": int} the command ended (the last frame)
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
from typing import Any, Protocol

from bai.node.link.streams import LinkStream, StreamClosed

log = logging.getLogger("bai.agent.terminal")
READ_SIZE = 64 * 1024
# bash when the image has it, else sh (busybox images have only sh)
DEFAULT_COMMAND = ["/bin/sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash; else exec sh; fi"]
TERM = "xterm-256color"


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
    return struct.pack("HHHH", max(1, min(rows, 1000)), max(1, min(cols, 1000)), 0, 0)


class PtyProcess:
    """A local process on a PTY of this host (the local backend's kernels)."""

    def __init__(self, master: int, proc: asyncio.subprocess.Process) -> None:
        self.master = master
        self.proc = proc
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
        self._stop_reading()
        if self._data.empty():
            self._data.put_nowait(None)  # a reader waiting now sees the end
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGHUP)  # as a terminal closing does
            try:
                await asyncio.wait_for(self.proc.wait(), 2)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                await self.proc.wait()
        with contextlib.suppress(OSError):
            os.close(self.master)


class DockerExecTerminal:
    """A `docker exec` with a TTY in a kernel's container."""

    def __init__(self, execution: Any, stream: Any) -> None:
        self.execution = execution
        self.stream = stream

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
        terminal = cls(execution, stream)
        with contextlib.suppress(Exception):  # (a command that ended at once cannot be resized)
            await terminal.resize(rows, cols)
        return terminal

    async def read(self) -> bytes | None:
        message = await self.stream.read_out()
        return None if message is None else bytes(message.data)

    async def write(self, data: bytes) -> None:
        await self.stream.write_in(data)

    async def resize(self, rows: int, cols: int) -> None:
        await self.execution.resize(h=max(1, min(rows, 1000)), w=max(1, min(cols, 1000)))

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
        with contextlib.suppress(Exception):
            await self.stream.close()


async def serve(terminal: Terminal, stream: LinkStream) -> None:
    """Pump keystrokes and resizes in, output out, until the command ends (then its exit status is the
    last frame) or the manager closes the stream (then the command is ended)."""

    async def keys() -> None:
        while (frame := await stream.receive()) is not None:
            kind = frame.get("t")
            if kind == "in" and isinstance(frame.get("d"), bytes | str):
                data = frame["d"]
                with contextlib.suppress(OSError, RuntimeError):  # the command just ended: its output says so
                    await terminal.write(data.encode() if isinstance(data, str) else data)
            elif kind == "resize":
                with contextlib.suppress(TypeError, ValueError):
                    await terminal.resize(int(frame["rows"]), int(frame["cols"]))

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
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, StreamClosed):
                await task
        await terminal.close()
