"""Attach this terminal to a terminal in a kernel (`bai session shell`, the dashboard's `s`): the local
terminal in raw mode (every key, Ctrl-C / Ctrl-D / Ctrl-Z included, goes to the kernel), window-size
changes passed on, the remote command's exit status returned. With several managers, a shell whose
connection broke (its manager went away) is opened again through the next one, saying so: a new shell, in
the same kernel (what ran in the old one went with its connection); a command given is not run again."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import signal
import sys
import termios
import tty
from typing import Any

EOT = b"\x04"  # Ctrl-D: what a terminal sends at the end of piped input
MAX_REOPENS = 3  # shells opened again, one attach, after broken connections (one that breaks at once stops)


def terminal_size() -> tuple[int, int]:
    """(rows, cols) of this terminal (its own, not $LINES / $COLUMNS, which go stale on a resize)."""
    for stream in (sys.stdout, sys.stdin, sys.stderr):
        try:
            size = os.get_terminal_size(stream.fileno())
        except (OSError, ValueError):
            continue
        if size.lines and size.columns:
            return size.lines, size.columns
    size = shutil.get_terminal_size((80, 24))
    return size.lines, size.columns


async def attach_terminal(
    client: Any, session_id: str, command: list[str] | None = None, kernel: str | None = None
) -> int:
    """Run `command` (None: the kernel's shell) on a terminal in the session's kernel `kernel` (main1 when
    None), attached to this process's stdin/stdout; its exit status (1 with a message on stderr when the
    terminal could not run)."""
    rows, cols = terminal_size()
    ws = await client.terminal(session_id, command, rows, cols, kernel=kernel)
    loop = asyncio.get_running_loop()
    fd = sys.stdin.fileno()
    interactive = os.isatty(fd)
    saved = termios.tcgetattr(fd) if interactive else None
    keys: asyncio.Queue[bytes | tuple[int, int]] = asyncio.Queue()  # keystrokes, or a new (rows, cols)
    reopened = 0

    def readable() -> None:
        try:
            data = os.read(fd, 4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            loop.remove_reader(fd)
            if not interactive:
                keys.put_nowait(EOT)  # piped input ended: like Ctrl-D at a prompt
            return
        keys.put_nowait(data)

    def resized() -> None:
        keys.put_nowait(terminal_size())

    async def send_keys() -> None:
        while True:
            item = await keys.get()
            try:
                if isinstance(item, tuple):
                    await ws.send_json({"type": "resize", "rows": item[0], "cols": item[1]})
                else:
                    await ws.send_json({"type": "stdin", "chars": base64.b64encode(item).decode()})
            except (ConnectionError, RuntimeError):
                continue  # (the connection broke: what follows goes to the shell opened next, if any)

    out = sys.stdout.buffer
    sender = asyncio.create_task(send_keys())
    try:
        if saved is not None:
            tty.setraw(fd)
        loop.add_reader(fd, readable)
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGWINCH, resized)
        while True:
            async for msg in ws:
                if msg.type.name != "TEXT":
                    continue
                frame = json.loads(msg.data)
                kind = frame.get("type")
                if kind == "out":
                    out.write(base64.b64decode(frame.get("data", "")))
                    out.flush()
                elif kind == "exit":
                    code = frame.get("code")
                    return int(code) if isinstance(code, int) else 0
                elif kind == "error":
                    _restore(fd, saved)
                    print(f"\r\nbai: the terminal ended: {frame.get('data')}", file=sys.stderr)
                    return 1
            # the connection broke (its manager went away) with the shell's end unsaid: an interactive shell is
            # opened again through the next manager (a command is not run twice)
            broken = client.ends.current.url
            client.ends.broke_current()
            again = None
            if command is None and reopened < MAX_REOPENS:
                reopened += 1
                with contextlib.suppress(Exception):
                    again = await client.terminal(session_id, None, *terminal_size(), kernel=kernel)
            if again is None:
                _restore(fd, saved)
                print("\r\nbai: the terminal's connection closed", file=sys.stderr)
                return 1
            await ws.close()
            ws = again
            note = f"\r\n[bai: the connection to {broken} broke: a new shell, through {client.ends.current.url}]\r\n"
            out.write(note.encode())
            out.flush()
    finally:
        with contextlib.suppress(ValueError, OSError):
            loop.remove_reader(fd)
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.remove_signal_handler(signal.SIGWINCH)
        _restore(fd, saved)
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await sender
        await ws.close()


def _restore(fd: int, saved: list | None) -> None:
    if saved is not None:
        with contextlib.suppress(termios.error, OSError):
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)
