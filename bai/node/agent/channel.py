"""Agent-side execution channels: how the agent runs code in a kernel and gathers its output.

`RunnerChannel` speaks the runner protocol (see runner.py) over the kernel's Unix socket.
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


def _connect_path(path: Path) -> tuple[str, int | None]:
    """A connectable path for a socket, even one longer than sun_path allows."""
    if len(str(path).encode()) < 100:
        return str(path), None
    fd = os.open(path.parent, os.O_PATH)
    return f"/proc/self/fd/{fd}/{path.name}", fd


class RunnerChannel(Channel):
    """Talks to runner.py over its Unix socket."""

    def __init__(self, socket_path: Path, on_output: OutputSink) -> None:
        super().__init__(on_output)
        self.socket_path = socket_path
        self.writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._put_waiters: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self.hello: dict[str, Any] = {}

    async def connect(self) -> None:
        path, fd = _connect_path(self.socket_path)
        try:
            reader, self.writer = await asyncio.open_unix_connection(path, limit=16 * 1024 * 1024)
        finally:
            if fd is not None:
                os.close(fd)
        line = await asyncio.wait_for(reader.readline(), 10)
        self.hello = json.loads(line)
        self._reader_task = asyncio.create_task(self._read(reader), name=f"runner-read-{self.socket_path}")

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
        if self.writer is not None:
            self.writer.close()
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader_task
        await super().close()


async def wait_for_socket(
    run_dir: Path, deadline: float, exited: asyncio.Future[Any] | asyncio.Task[Any] | None
) -> str:
    """Poll until the runner's socket appears ("runner") or the no-Python marker ("nopython")."""
    loop = asyncio.get_running_loop()
    sock, marker = run_dir / "runner.sock", run_dir / "nopython"
    delay = 0.002
    while True:
        if sock.exists():
            return "runner"
        if marker.exists():
            return "nopython"
        if exited is not None and exited.done():
            raise ChannelError("the kernel exited while starting")
        if loop.time() > deadline:
            raise ChannelError("the kernel's runner did not start in time")
        await asyncio.sleep(delay)
        delay = min(delay * 1.5, 0.05)
