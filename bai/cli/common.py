"""Helpers shared by CLI commands: errors, the client, running coroutines."""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, NoReturn

import typer

# Exit status when a session could not start (as `docker run` uses 125 for its own failures).
EXIT_NOT_STARTED = 125


def no_color() -> bool:
    """NO_COLOR (https://no-color.org) is set: nothing bai prints has ANSI escapes (no colour, spinner, bar)."""
    import os

    return bool(os.environ.get("NO_COLOR"))


def fail(message: str, code: int = 1) -> NoReturn:
    print(f"bai: error: {message}", file=sys.stderr)
    raise typer.Exit(code)


def client(owner: str | None = None):
    """The API client of the saved credentials; `owner` (admins): act on that keypair's sessions."""
    from bai.client import Client
    from bai.common import credentials

    try:
        creds = credentials.load()
    except credentials.BadEndpoint as e:
        fail(str(e), code=2)
    if creds is None:
        fail(
            f"no credentials: start `bai node` on this machine (it saves them to {credentials.credentials_path()}) "
            "or set BACKEND_ENDPOINT, BACKEND_ACCESS_KEY and BACKEND_SECRET_KEY"
        )
    c = Client(creds)
    c.owner = owner or None
    c.on_move = say_moved
    return c


def say_moved(old: str, new: str) -> None:
    """The line the CLI prints (to stderr) when its client moves to another manager."""
    from bai.client.endpoints import move_line

    print(f"bai: {move_line(old, new)}", file=sys.stderr, flush=True)


def run_async(coro) -> Any:
    import asyncio

    from bai.client import APIError

    try:
        return asyncio.run(coro)
    except APIError as e:
        fail(str(e))


def call(fn: Callable[[Any], Awaitable[Any]], owner: str | None = None) -> Any:
    """Run one client call, e.g. `call(lambda c: c.agents())`; API errors end the CLI with a message."""

    async def go() -> Any:
        async with client(owner) as c:
            return await fn(c)

    return run_async(go())


def call_now(fn: Callable[[Any], Coroutine[Any, Any, Any]], owner: str | None = None) -> Any:
    """`call` for one read-only request (a GET of a plain Client method, e.g. `c.list_sessions()`): it
    blocks this thread instead of starting an event loop, so the command never imports asyncio.

    A method that needs an event loop after all (a stream) is answered by `call`, from the start."""
    from bai.client import APIError

    c = client(owner)
    c.blocking = True
    try:
        answered, value = answer_blocking(fn(c))
    except APIError as e:
        fail(str(e))
    return value if answered else call(fn, owner)


NOT_BLOCKING = (False, None)


def answer_blocking(coro: Coroutine[Any, Any, Any]) -> tuple[bool, Any]:
    """Run a request of a blocking client (`Client.blocking`) without an event loop: (True, its value), or
    NOT_BLOCKING when it awaits more than plain requests (it is closed unrun: ask again with an event loop)."""
    try:
        coro.send(None)
    except StopIteration as done:
        return True, done.value
    except RuntimeError as e:  # "no running event loop": it awaited more than plain requests
        if "event loop" not in str(e):
            raise
    else:
        coro.close()  # it suspended: it awaits more than plain requests
    return NOT_BLOCKING


def show(items: Any, as_json: bool, render: Callable[[Any], Any]) -> None:
    """Print JSON for scripts, or what `render` makes of the items (a rich table) for people."""
    if as_json:
        from bai.cli.jsonout import dumps

        print(dumps(items))
        return
    from bai.cli.output import emit

    emit(render(items))
