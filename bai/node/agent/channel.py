"""Agent-side execution channels: how the agent runs code in a kernel and gathers its output.

`RunnerChannel` speaks the runner protocol (see runner.py) over a Unix socket the agent listens on
and the kernel's runner connects to.
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
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("bai.agent.channel")

CONTROL_RECORDS = {"finished", "waiting-input"}
OUTPUT_RECORDS = {"stdout", "stderr"}
OutputSink = Callable[[str, str], None]


class ChannelError(Exception):
    pass


class Channel:
    """The common part: one run at a time, a queue of records, result aggregation."""

    supports_query = True

    def __init__(self, on_output: OutputSink) -> None:
        self.on_output = on_output
        self.records: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.run_id: str | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self.exit_code: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    # -- to be provided by subclasses --
    async def _start(self, mode: str, code: str) -> None:
        raise NotImplementedError

    async def send_input(self, data: str) -> None:
        raise NotImplementedError

    async def send_eof(self) -> None:
        """The run's input has ended: a waiting (or later) input() raises EOFError, a command's stdin
        closes. Channels that cannot tell (a docker exec) ignore it."""

    async def interrupt(self) -> None:
        raise NotImplementedError

    async def put_file(self, path: str, data: bytes) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        """Stop talking to the kernel; a run still going ends (exit 137 unless the exit code is known)."""
        self.lost("\n[the kernel was destroyed]\n")

    # -- shared --
    def feed(self, record: dict[str, Any]) -> None:
        """Take one record from the kernel: tee output into the log, queue it for the run."""
        kind = record.get("t")
        if kind in OUTPUT_RECORDS:
            self.on_output(kind, record.get("d", ""))
        if self.run_id is None:
            return  # output with nobody running (reconnect): kept in the log only
        self.records.put_nowait(record)
        if kind == "finished":
            self.run_id = None
            self._idle.set()

    def lost(self, message: str) -> None:
        """The kernel went away: end the current run so nobody waits forever."""
        if self.run_id is not None:
            code = self.exit_code.result() if self.exit_code.done() else 137
            self.feed({"t": "stderr", "d": message})
            self.feed({"t": "finished", "exit": code})

    async def start_run(self, run_id: str, mode: str, code: str, wait: float = 30.0) -> None:
        if mode == "query" and not self.supports_query:
            raise ChannelError("this kernel's image has no Python: only commands (batch mode) can run")
        if self.run_id == run_id:
            return
        await asyncio.wait_for(self._wait_idle(), wait)
        self._idle.clear()
        self.run_id = run_id
        self.records = asyncio.Queue()
        try:
            await self._start(mode, code)
        except BaseException:
            self.run_id = None
            self._idle.set()
            raise

    async def _wait_idle(self) -> None:
        while not self._idle.is_set():
            await self._idle.wait()

    async def next_result(self, run_id: str, flush_timeout: float) -> dict[str, Any]:
        """Gather records of the run until a control record, or until output pauses / the timeout."""
        console: list[list[str]] = []
        status = "continued"
        exit_code = None
        options: dict[str, Any] | None = None
        if self.run_id != run_id and self.records.empty():
            raise ChannelError(f"no run {run_id} in this kernel")
        try:
            record: dict[str, Any] | None = await asyncio.wait_for(self.records.get(), flush_timeout)
        except TimeoutError:
            record = None
        while record is not None:
            kind = record.get("t")
            if kind in OUTPUT_RECORDS:
                text = record.get("d", "")
                if console and console[-1][0] == kind:
                    console[-1][1] += text
                else:
                    console.append([kind, text])
            elif kind == "finished":
                status, exit_code = "finished", int(record.get("exit", 0))
                break
            elif kind == "waiting-input":
                status, options = "waiting-input", record.get("opts") or {"is_password": False}
                break
            try:
                record = self.records.get_nowait()
            except asyncio.QueueEmpty:
                record = None
        return {
            "runId": run_id,
            "status": status,
            "console": console,
            "exitCode": exit_code,
            "options": options,
        }


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


class RunnerChannel(Channel):
    """Talks to runner.py: the agent listens on a Unix socket in the kernel's run folder and the runner
    connects to it (and connects again after the agent restarts). Connecting needs no write access to the
    folder, so a container gets it read-only and can write nothing there. One runner connection at a
    time: while one is up, other connections are closed at once."""

    def __init__(self, socket_path: Path, on_output: OutputSink) -> None:
        super().__init__(on_output)
        self.socket_path = socket_path
        self.writer: asyncio.StreamWriter | None = None
        self._server: asyncio.AbstractServer | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._put_waiters: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self.hello: dict[str, Any] = {}
        self.connected = asyncio.Event()

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
            self._server = await asyncio.start_unix_server(self._accept, sock=sock, limit=16 * 1024 * 1024)
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
        if self.writer is not None and not self.writer.is_closing():
            writer.close()  # the runner is connected: nobody else may talk for it
            return
        self.writer = writer
        try:
            line = await asyncio.wait_for(reader.readline(), 10)
            hello = json.loads(line)
            if not isinstance(hello, dict) or hello.get("t") != "hello":
                raise ValueError(f"expected hello, got {line[:100]!r}")
        except (ValueError, TimeoutError, ConnectionError, asyncio.LimitOverrunError) as e:
            log.warning("a connection to %s did not greet as a runner: %s", self.socket_path, e)
            writer.close()
            self.writer = None
            return
        self.hello = hello
        self._reader_task = asyncio.current_task()
        self.connected.set()
        try:
            await self._read(reader)
        except asyncio.CancelledError:
            pass  # closed by the agent (asyncio would log a cancelled connection task as an error)
        finally:
            writer.close()
            if self.writer is writer:
                self.writer = None

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while line := await reader.readline():
                try:
                    record = json.loads(line)
                except ValueError:
                    log.warning("bad line from runner: %r", line[:200])
                    continue
                if record.get("t") == "put-file":
                    fut = self._put_waiters.pop(record.get("path", ""), None)
                    if fut and not fut.done():
                        fut.set_result(record)
                    continue
                self.feed(record)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        if self.run_id is not None:
            # the runner died mid-run: finish the run with the kernel's exit code once the agent has
            # reported the exit to the manager (so the session has ended before its client hears of it)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.exit_code), 10.0)
            self.lost("\n[the kernel process ended]\n")

    async def _send(self, message: dict[str, Any]) -> None:
        if self.writer is None or self.writer.is_closing():
            raise ChannelError("the kernel's runner is not connected")
        self.writer.write(json.dumps(message).encode() + b"\n")
        await self.writer.drain()

    async def _start(self, mode: str, code: str) -> None:
        if mode == "query":
            await self._send({"op": "query", "code": code})
        else:
            await self._send({"op": "batch", "cmd": code})

    async def send_input(self, data: str) -> None:
        await self._send({"op": "input", "data": data})

    async def send_eof(self) -> None:
        await self._send({"op": "input-eof"})

    async def interrupt(self) -> None:
        await self._send({"op": "interrupt"})

    async def put_file(self, path: str, data: bytes) -> None:
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._put_waiters[path] = fut
        await self._send({"op": "put-file", "path": path, "b64": base64.b64encode(data).decode()})
        reply = await asyncio.wait_for(fut, 30)
        if not reply.get("ok"):
            raise ChannelError(f"cannot write {path}: {reply.get('error')}")

    async def close(self) -> None:
        """Stop listening and drop the connection (the socket file stays for the next agent to replace)."""
        if self._server is not None:
            self._server.close()
        if self.writer is not None:
            self.writer.close()
        task = self._reader_task
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await super().close()
