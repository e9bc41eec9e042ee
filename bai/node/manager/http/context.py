"""What the API's handler modules share: app keys, JSON bodies, problem responses."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from aiohttp import web

from bai.common import safejson
from bai.common.problems import Problem, invalid
from bai.node.manager.http.rate import OpenStreams
from bai.node.manager.rules.access import may_act_on_keypair
from bai.node.manager.services import Services
from bai.node.manager.state.records import Session

SERVICES = web.AppKey("services", Services)
SETTINGS = web.AppKey("settings", dict)
STREAMS = web.AppKey("streams", OpenStreams)
MAX_JSON_BODY = 16 * 1024 * 1024  # bytes of a JSON request body (an execute's code is the largest)
MAX_JSON_BODIES_IN_FLIGHT = 256 * 1024 * 1024  # bytes of JSON bodies being read by all requests together
BODY_IDLE_TIMEOUT = 30.0  # seconds a JSON body may stall (no byte) before the request is answered 408


@dataclass(frozen=True)
class Caller:
    """Who makes a request, and whose sessions a session name refers to.

    Users act on their own sessions only. Admins act on any session by id; by name on their own, or
    on another keypair's with `owner_access_key` (Backend.AI's parameter). A domain admin names the keypairs
    of its domain's users with `owner_access_key` (`rules.access.may_act_on_keypair`)."""

    access_key: str
    is_admin: bool
    owner: str | None = None  # owner_access_key, when an admin names another keypair

    @property
    def names_of(self) -> str:
        """The keypair whose sessions a name refers to."""
        return self.owner or self.access_key

    @property
    def ids_of(self) -> str | None:
        """The keypair whose sessions an id may refer to (None: anyone's)."""
        return None if self.is_admin else self.access_key


def caller_of(request: web.Request, body: Any = None) -> Caller:
    """The caller of a request, with `owner_access_key` from the query (or the JSON body) checked:
    only admins may name another keypair."""
    owner = request.query.get("owner_access_key")
    if owner is None and isinstance(body, dict):
        owner = body.get("owner_access_key")
    if owner in (None, ""):
        owner = None
    elif not isinstance(owner, str):
        raise invalid("owner_access_key must be an access key")
    if owner is not None and owner != request["access_key"] and not request["is_admin"]:
        teams = request.app[SERVICES].teams
        if not may_act_on_keypair(teams.directory, teams.actor(request["access_key"]), owner):
            raise Problem(
                "generic-forbidden",
                "Forbidden.",
                "only admins may act on another keypair's sessions (owner_access_key): superadmins on any, a "
                "domain's admins on its users'",
            )
    return Caller(request["access_key"], bool(request["is_admin"]), owner if owner != request["access_key"] else None)


def problem_response(p: Problem) -> web.Response:
    return web.json_response(p.body(), status=p.status, content_type="application/problem+json")


class _BodyBudget:
    """The bytes of JSON bodies being read by all requests together: beyond MAX_JSON_BODIES_IN_FLIGHT, a
    request is refused (503, try again) instead of being buffered."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, n: int) -> None:
        if self.used + n > self.limit:
            raise Problem(
                "instance-not-available",
                "Server busy.",
                f"the server is reading {self.used} bytes of request bodies, its limit; try again",
                status=503,
            )
        self.used += n


BODIES = _BodyBudget(MAX_JSON_BODIES_IN_FLIGHT)


def _too_large(size: int) -> Problem:
    return Problem(
        "generic-bad-request",
        "Request body too large.",
        f"a JSON request body holds at most {MAX_JSON_BODY} bytes (this one {size} or more)",
        status=413,
    )


@contextlib.contextmanager
def body_budget() -> Iterator[Callable[[int], None]]:
    """`take(n)` for bytes of a request body held in memory: counted against BODIES (a 503 Problem beyond
    it), all given back when the block ends."""
    taken = 0

    def take(n: int) -> None:
        nonlocal taken
        BODIES.take(n)
        taken += n

    try:
        yield take
    finally:
        BODIES.used -= taken


Piece = TypeVar("Piece")  # what a body's reader gives: bytes, or a multipart reader's next part


async def body_chunk(read: Callable[[], Awaitable[Piece]]) -> Piece:
    """The next piece of a body from `read()`; a 408 Problem when none comes for BODY_IDLE_TIMEOUT seconds."""
    try:
        async with asyncio.timeout(BODY_IDLE_TIMEOUT):
            return await read()
    except TimeoutError:
        raise Problem(
            "generic-bad-request",
            "Request timeout.",
            f"no byte of the request body came for {BODY_IDLE_TIMEOUT:g} seconds",
            status=408,
        ) from None


async def _read_body(request: web.Request) -> bytes:
    """The body, read chunk by chunk within MAX_JSON_BODY and the budget of all requests (a 413 / 503 Problem
    otherwise: nothing beyond the limits is buffered)."""
    declared = request.content_length
    if declared is not None and declared > MAX_JSON_BODY:
        raise _too_large(declared)
    data = bytearray()
    with body_budget() as take:
        while chunk := await body_chunk(request.content.readany):
            if len(data) + len(chunk) > MAX_JSON_BODY:
                raise _too_large(len(data) + len(chunk))
            take(len(chunk))
            data += chunk
        return bytes(data)


async def read_json(request: web.Request) -> Any:
    if not request.body_exists:
        return {}
    raw = await _read_body(request)
    try:
        text = raw.decode(request.charset or "utf-8")
    except (UnicodeDecodeError, LookupError):  # bytes that are not UTF-8 (or an unknown charset)
        raise invalid("the request body is not valid JSON") from None
    body = decode_json(text, "the request body", MAX_JSON_BODY)
    # a JSON "\ud800": no UTF-8 text (a file, a database, a kernel) can hold it. Looked for value by value only
    # when the text could give one: it holds a surrogate itself, or an escape of one
    if (not _plain_text(text) or _SURROGATE_ESCAPE.search(text)) and not _encodable(body):
        raise invalid("the request body holds a lone surrogate (\\ud800-\\udfff), which is not text")
    return body


def decode_json(text: str | bytes | bytearray, what: str, max_bytes: int = safejson.MAX_BYTES) -> Any:
    """A client's JSON (a body, a query value, a WebSocket frame), bounded in size and depth; a 400 Problem
    that says what is wrong otherwise (never RecursionError or any other exception)."""
    try:
        return safejson.loads(text, max_bytes=max_bytes, what=what)
    except safejson.UnsafeJson as e:
        if "not valid JSON" in str(e) and what == "the request body":
            raise invalid("the request body is not valid JSON") from None  # the wording clients already see
        raise invalid(str(e)) from None


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _plain_text(text: str) -> bool:
    """Whether the text has no surrogate code point of its own (UTF-8 can hold all of it)."""
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _encodable(value: Any) -> bool:
    """Whether every string in a parsed JSON value (keys too) can be written as UTF-8."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode()
            except UnicodeEncodeError:
                return False
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return True


def services_of(request: web.Request) -> Services:
    return request.app[SERVICES]


async def session_of(
    request: web.Request, ref: str | None = None, *, active_only: bool = True, body: Any = None
) -> Session:
    """The session a request names (`{ref}` in its path unless given), as the caller may see it."""
    caller = caller_of(request, body)
    return await request.app[SERVICES].reads.resolve(
        ref if ref is not None else request.match_info["ref"],
        caller.names_of,
        active_only=active_only,
        ids_of=caller.ids_of,
    )
