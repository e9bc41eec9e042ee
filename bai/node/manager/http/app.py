"""The HTTP API (Backend.AI paths and shapes, reference spec §1-§2), served by aiohttp."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import uuid
from collections.abc import Callable
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import unquote

import msgspec
from aiohttp import BodyPartReader, MultipartWriter, WSCloseCode, WSMessage, WSMsgType, web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Handler

from bai import API_VERSION, __version__
from bai.common import auth
from bai.common.problems import Problem, invalid
from bai.common.stats import usage_of
from bai.common.status import ACTIVE_STATUSES, SESSION_EVENTS, SessionStatus, statuses_named
from bai.node.manager.domain_errors import DomainError, KernelUnreachable
from bai.node.manager.http.admin_routes import add_admin_routes
from bai.node.manager.http.app_routes import add_app_routes
from bai.node.manager.http.bgtask_routes import add_bgtask_routes
from bai.node.manager.http.config_routes import add_config_routes
from bai.node.manager.http.context import (
    SERVICES,
    SETTINGS,
    STREAMS,
    body_budget,
    body_chunk,
    caller_of,
    decode_json,
    problem_response,
    read_json,
    services_of,
    session_of,
)
from bai.node.manager.http.dashboard import add_dashboard_routes
from bai.node.manager.http.graphql_route import add_graphql_routes
from bai.node.manager.http.history_routes import add_history_routes
from bai.node.manager.http.image_routes import add_image_routes
from bai.node.manager.http.logs_routes import log_kernel, log_query, serve_logs
from bai.node.manager.http.maintenance_routes import add_maintenance_routes, refuse_while_frozen
from bai.node.manager.http.preset_routes import add_preset_routes
from bai.node.manager.http.problems import as_problem, link_problem, problem_of
from bai.node.manager.http.quota import my_quota
from bai.node.manager.http.rate import OpenStreams
from bai.node.manager.http.represent import agent_items, session_json, session_view
from bai.node.manager.http.requests import (
    parse_create,
    parse_execute,
    parse_kernel_ref,
    parse_priority,
    parse_run_id,
)
from bai.node.manager.http.scheduler_routes import add_scheduler_routes
from bai.node.manager.http.sse import SPACED, EventStream
from bai.node.manager.http.team_routes import add_team_routes
from bai.node.manager.http.template_routes import add_template_routes
from bai.node.manager.http.terminal_routes import add_terminal_routes
from bai.node.manager.http.usage_routes import add_usage_routes
from bai.node.manager.services import Services
from bai.node.manager.services.diskfull import describe, insufficient_storage, is_disk_full
from bai.node.manager.services.hubs import Subscription
from bai.node.manager.services.kernel_ops import require_running
from bai.node.manager.services.metrics import exposition
from bai.node.manager.services.stats_book import stored_stat
from bai.node.manager.state.records import Kernel, SchedulingAttempt, Session

log = logging.getLogger("bai.api")
SESSION_EVENT_OF = {status.value: name for status, name in SESSION_EVENTS.items()}
PUBLIC = {("GET", "/"), ("GET", "/metrics"), ("POST", "/auth/authorize")}  # (the last: a password is its proof)
MAX_UPLOAD_FILES = 64
MAX_UPLOAD_BYTES = 16 * 1024 * 1024
MAX_UPLOAD_TOTAL = 4 * MAX_UPLOAD_BYTES  # all files of one upload
UPLOAD_CHUNK = 256 * 1024
IMAGE_NAME = re.compile(r"[a-z0-9][a-z0-9._/-]{0,127}:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except Problem as p:
        return problem_response(p)
    except DomainError as e:
        return problem_response(problem_of(e))
    except auth.AuthError as e:
        # Every authentication failure is a 401 (bad, missing or stale signature alike).
        title = "Authentication failed." if e.slug == "auth-failed" else "Invalid authentication parameters."
        return problem_response(Problem(e.slug, title, e.msg, status=401))
    except web.HTTPNotFound:
        return problem_response(Problem("url-not-found", "Unknown URL path.", f"{request.method} {request.path}"))
    except web.HTTPMethodNotAllowed:
        return problem_response(
            Problem("url-not-found", "Unknown URL path.", f"{request.method} is not allowed on {request.path}")
        )
    except web.HTTPException:
        raise
    except Exception as e:
        if (problem := link_problem(e)) is not None:  # an agent away, silent or refusing: never a 500
            log.warning("%s %s: %s (%s)", request.method, request.path, problem.msg, type(e).__name__)
            return problem_response(problem)
        if is_disk_full(e):  # a write found the disk full (or over quota): 507, and nothing was changed
            log.warning("%s %s: %s (%s: %s)", request.method, request.path, describe(e), type(e).__name__, e)
            return problem_response(insufficient_storage(e))
        if client_gone(request, e):  # normal: a stream's reader or a download's client went away
            log.debug("client went away during %s %s (%s: %s)", request.method, request.path, type(e).__name__, e)
            return gone_response(request)
        log.exception("internal error on %s %s", request.method, request.path)
        return problem_response(Problem("internal-server-error", "Internal server error.", f"{type(e).__name__}: {e}"))


def client_gone(request: web.Request, e: BaseException) -> bool:
    """Whether `e` is the client's connection ending under a handler (a write to a gone client), not a
    failure of the node: a connection error while the request's own connection is closed or closing."""
    if not isinstance(e, ConnectionError):
        return False
    transport = request.transport
    return transport is None or transport.is_closing()


def gone_response(request: web.Request) -> web.StreamResponse:
    """What a handler whose client went away returns: the connection is dropped, nothing more is sent
    (aiohttp's attempt to finish this response fails on the closed connection, which it ignores)."""
    if request.transport is not None:
        request.transport.close()
    return web.Response(status=499)


@web.middleware
async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
    if (request.method, request.path) in PUBLIC and "Authorization" not in request.headers:
        return await handler(request)
    if request.path in request.app[SETTINGS].get("public_paths", ()):  # bound to a token instead
        return await handler(request)
    keypair_of = services_of(request).accounts.active_keypair  # (from memory: no read per request)
    access_key = auth.verify(
        authorization=request.headers.get("Authorization"),
        date=request.headers.get("Date") or request.headers.get("X-BackendAI-Date"),
        method=request.method,
        path=request.raw_path,
        host=request.host,
        ctype=request.content_type if "Content-Type" in request.headers else "application/octet-stream",
        version=request.headers.get("X-BackendAI-Version", API_VERSION),
        lookup_secret=lambda ak: kp.secret_key if (kp := keypair_of(ak)) is not None else None,
    )
    request["access_key"] = access_key
    keypair = keypair_of(access_key)
    request["is_admin"] = keypair is not None and keypair.is_admin
    streams = request.app[STREAMS]
    with streams.serving(access_key):  # at most MAX_REQUESTS_PER_KEYPAIR at once (a 429 beyond)
        if not is_stream(request):
            return await handler(request)
        with streams.track(access_key):  # closed at once if the keypair is deactivated
            return await handler(request)


def is_stream(request: web.Request) -> bool:
    """Requests that stay open: event streams, WebSockets, followed logs."""
    path = request.path
    if path.startswith(("/stream/", "/events/", "/bai/events")):
        return True
    return path.endswith("/logs") and request.query.get("follow", "").lower() in ("1", "true", "yes")


# -- handlers ---------------------------------------------------------------------------------------


async def hello(request: web.Request) -> web.Response:
    return web.json_response({"version": API_VERSION, "manager": __version__})


def session_owner(request: web.Request, body: Any) -> tuple[str, bool]:
    """Whose session a create makes, and whether that keypair is an admin: the caller's own, or
    (admins only) the keypair named by `owner_access_key`, with that keypair's rights."""
    caller = caller_of(request, body)
    if caller.owner is None:
        return caller.access_key, caller.is_admin
    keypair = services_of(request).accounts.active_keypair(caller.owner)
    if keypair is None:
        raise invalid(f"owner_access_key: keypair {caller.owner} does not exist or is inactive")
    return caller.owner, keypair.is_admin


async def create_session(request: web.Request) -> web.Response:
    return await create_answer(request, await read_json(request))


async def create_answer(request: web.Request, body: Any) -> web.Response:
    """A create request's body answered (`POST /session`; a template's, `POST /session/_/create-from-template`)."""
    settings = request.app[SETTINGS]
    services = services_of(request)
    req = parse_create(
        body, services.agents.known_slots, settings["default_resources"], services.images.aliases, services.clock.now()
    )
    owner, owner_is_admin = session_owner(request, body)
    row, created = await services.lifecycle.create(owner, req, owner_is_admin)
    if not req.enqueue_only and row.status not in ("RUNNING",):
        waited = await services.reads.wait_started(row.id, req.max_wait or None)
        if waited is None:
            status = "TIMEOUT"
        else:
            row, status = waited, waited.status
    else:
        status = row.status
    ports = (await session_view(services, row)).service_ports if status in ("RUNNING", "RUNNING_DEGRADED") else []
    result = {
        "sessionId": row.id,
        "sessionName": row.name,
        "status": status,
        "servicePorts": ports,
        "created": created,
    }
    if not created:
        result["service_ports"] = ports
    if status in ("CANCELLED", "ERROR", "TERMINATED"):
        result["statusInfo"] = row.status_info
        result["statusData"] = row.status_data
    return web.json_response(result, status=201 if created else 200)


async def list_sessions(request: web.Request) -> web.Response:
    services = services_of(request)
    status_param = request.query.get("status")
    if request.query.get("all") in ("1", "true"):
        statuses = None
    elif status_param:
        try:
            statuses = statuses_named(status_param)
        except ValueError as e:
            raise invalid(str(e)) from None
    else:
        statuses = list(ACTIVE_STATUSES)
    caller = caller_of(request)
    owner = caller.owner if caller.is_admin else (caller.owner or caller.access_key)  # admins see every session
    rows = await services.state.list_sessions(owner, statuses)
    kernels = await services.state.kernels_of_many([r.id for r in rows])  # one read, not one per session
    items = [await session_json(services, r, kernels=kernels.get(r.id, [])) for r in rows]
    return web.json_response({"items": items})


async def get_session(request: web.Request) -> web.Response:
    services = services_of(request)
    row = await session_of(request, active_only=False)
    return web.json_response(await session_json(services, row, detail=True))


async def session_history(request: web.Request) -> web.Response:
    """Every scheduling decision about a session (`bai session explain`)."""
    services = services_of(request)
    row = await session_of(request, active_only=False)
    return web.json_response(
        {
            "sessionId": row.id,
            "name": row.name,
            "status": row.status,
            "priority": row.priority,
            "timeLimit": row.time_limit,
            "preemptible": row.config.get("preemptible", True) is not False,
            "statusData": {
                key: row.status_data[key] for key in ("scheduler", "preemption") if row.status_data.get(key)
            },
            "history": [_attempt_json(h) for h in await services.state.scheduling_history(row.id)],
            "transitions": [msgspec.structs.asdict(t) for t in await services.state.transitions_of(row.id)],
        }
    )


def _attempt_json(h: SchedulingAttempt) -> dict[str, Any]:
    """A scheduling attempt as `bai session explain` reads it (the history's columns, without the session id)."""
    return {
        "first_at": h.first_at,
        "last_at": h.last_at,
        "rounds": h.rounds,
        "outcome": h.outcome,
        "status_info": h.status_info,
        "msg": h.msg,
        "agents": h.agents,
        "predicates": h.predicates,
    }


async def session_stats(request: web.Request) -> web.Response:
    """The statistics history of a session's kernels, oldest first, as `usage` (bai's; the book keeps the
    last `[manager] stat_history` samples of live kernels; an ended kernel has its final one)."""
    services = services_of(request)
    row = await session_of(request, active_only=False)
    out: dict[str, list[dict[str, Any]]] = {}
    for kernel in await services.state.kernels_of(row.id):
        samples = services.stats.samples_of(kernel.id)
        if not samples and (final := stored_stat(kernel)) is not None:
            samples = [final]
        out[kernel.id] = [u for u in (usage_of([s]) for s in samples) if u is not None]
    return web.json_response({"sessionId": row.id, "kernels": out})


async def destroy_session(request: web.Request) -> web.Response:
    services = services_of(request)
    row = await session_of(request)
    forced = request.query.get("forced", "").lower() in ("1", "true", "yes")
    wait = request.query.get("wait", "").lower() not in ("0", "false", "no")
    stats = await services.lifecycle.destroy(row, forced, wait)
    return web.json_response({"stats": stats})


async def execute_http(request: web.Request) -> web.Response:
    """Polling execute (reference spec §2.4)."""
    services = services_of(request)
    row = await session_of(request)
    body = await read_json(request)
    mode, code, options = parse_execute(body)
    run_id = parse_run_id(body.get("runId"))
    kernel = parse_kernel_ref(body.get("kernel") or request.query.get("kernel"))  # bai's: main1 when absent
    result = await services.kernel_ops.execute(row, run_id, mode, code, options, 2.0, kernel_ref=kernel)
    result.pop("seq", None)  # (the execute stream's: Backend.AI's polling result has none)
    return web.json_response({"result": result})


async def interrupt(request: web.Request) -> web.Response:
    """Backend.AI's interrupt names no run: the running one is interrupted. bai's clients name theirs
    (`runId` in the body or the query): only that run is, and a run still waiting leaves the queue."""
    services = services_of(request)
    row = await session_of(request)
    body = await read_json(request) if request.body_exists else {}
    if not isinstance(body, dict):
        raise invalid("the interrupt request, when given, must be a JSON object")
    run_id = parse_run_id(body.get("runId") or request.query.get("runId"), new=False)
    found = await services.kernel_ops.interrupt(row, run_id)
    if run_id is not None and not found:
        raise Problem("object-not-found", "No such run.", f"no run {run_id} is running or waiting in this session")
    return web.Response(status=204)


async def logs(request: web.Request) -> web.StreamResponse:
    """Bounded and streamed; tail / since / limit / follow (see logs_api). The main kernel's unless
    `kernel_id` (Backend.AI's) or `kernel` (bai's: a name such as sub1, an id or an id prefix) names another."""
    query = log_query(request)
    services = services_of(request)
    row = await session_of(request, active_only=False)
    kernel = await services.reads.kernel_for(row, log_kernel(request))
    return await serve_logs(request, services.logs, services.reads, row, kernel, query)


async def list_files(request: web.Request) -> web.Response:
    """`session ls` (spec §2.9): parameters from the JSON body (the client sends one on GET) or the query."""
    services = services_of(request)
    row = await session_of(request)
    body = await read_json(request) if request.body_exists else {}
    path = (body.get("path") if isinstance(body, dict) else None) or request.query.get("path") or "/home/work"
    if not isinstance(path, str) or "\x00" in path:
        raise invalid("path must be a folder path in the kernel")
    return web.json_response(await services.kernel_ops.list_files(row, path))


async def _uploaded_files(request: web.Request, take: Callable[[int], None]) -> list[tuple[str, bytes]]:
    """The files of a multipart upload; a 400 for a malformed body or a bad name. Each part is read in
    pieces: a file over MAX_UPLOAD_BYTES or an upload over MAX_UPLOAD_TOTAL is refused when it gets there,
    every byte held is `take`n from the budget of bodies being read (503 beyond it), and a body that stalls
    is a 408."""
    files: list[tuple[str, bytes]] = []
    total = 0
    try:
        reader = await request.multipart()
        while (part := await body_chunk(reader.next)) is not None:
            if not isinstance(part, BodyPartReader):  # a multipart inside the multipart
                raise invalid("an upload's parts are files: a nested multipart body is not taken")
            # aiohttp's clients (the official one, bai's) percent-encode the file name: dir/file is dir%2Ffile
            name = unquote(part.filename or "", errors="strict") if part.filename else ""
            path = PurePosixPath(name)
            if not name or "\0" in name or path.is_absolute() or ".." in path.parts:
                raise invalid(f"bad file name {name[:100]!r}: use a relative path inside /home/work")
            if len(files) >= MAX_UPLOAD_FILES:
                raise invalid(f"at most {MAX_UPLOAD_FILES} files per upload")
            data = bytearray()
            while chunk := await body_chunk(lambda: part.read_chunk(UPLOAD_CHUNK)):  # noqa: B023 (read at once)
                if len(data) + len(chunk) > MAX_UPLOAD_BYTES:
                    raise invalid(f"{name} is larger than {MAX_UPLOAD_BYTES // (1024 * 1024)} MiB")
                total += len(chunk)
                if total > MAX_UPLOAD_TOTAL:
                    raise invalid(f"an upload holds at most {MAX_UPLOAD_TOTAL // (1024 * 1024)} MiB in all")
                take(len(chunk))
                data += chunk
            files.append((name, bytes(data)))
    except UnicodeDecodeError:
        raise invalid("bad file name: its percent-encoding is not UTF-8") from None
    except (ValueError, AssertionError, HttpProcessingError) as e:  # aiohttp's multipart reader on bad input
        raise invalid(f"the upload is not valid multipart/form-data: {str(e).splitlines()[0][:200]}") from None
    return files


async def upload(request: web.Request) -> web.Response:
    services = services_of(request)
    row = await session_of(request)
    require_running(row, "uploading files")  # (before the body is read: a 409 costs no upload)
    if not request.content_type.startswith("multipart/"):
        raise invalid("upload wants multipart/form-data with one 'src' part per file")
    with body_budget() as take:  # held until the kernel has the files
        files = await _uploaded_files(request, take)
        await services.kernel_ops.upload(row, files)
    return web.Response(status=204)


MAX_DOWNLOAD_FILES = 5  # as Backend.AI


async def download(request: web.Request) -> web.Response:
    """`session download` (Backend.AI's GET, and POST, /session/{ref}/download): `{"files": [PATH, ...]}` in
    the JSON body (or `files` in the query, repeated); answers a multipart/mixed of one tar archive per path."""
    services = services_of(request)
    body = await read_json(request) if request.body_exists else {}
    if not isinstance(body, dict):
        raise invalid('the download request must be a JSON object: {"files": [PATH, ...]}')
    row = await session_of(request, body=body)
    files = body.get("files") if "files" in body else request.query.getall("files", [])
    if isinstance(files, str):
        files = [files]
    if not isinstance(files, list) or not files or not all(isinstance(f, str) and f for f in files):
        raise invalid("files must be a list of paths in the kernel (relative ones are under /home/work)")
    if len(files) > MAX_DOWNLOAD_FILES:
        raise invalid(f"at most {MAX_DOWNLOAD_FILES} files per download")
    archives = await services.kernel_ops.download(row, files)
    with MultipartWriter("mixed") as writer:
        for archive in archives:
            writer.append(archive, {"Content-Type": "application/x-tar", "Content-Encoding": "identity"})
    return web.Response(body=writer, status=200)


async def restart_session(request: web.Request) -> web.Response:
    """Backend.AI's PATCH /session/{ref}: the kernel starts afresh, the session stays."""
    await services_of(request).kernel_ops.restart(await session_of(request))
    return web.Response(status=204)


async def rename_session(request: web.Request) -> web.Response:
    """Backend.AI's POST /session/{ref}/rename?name=NEW (or {"name": NEW} in the body)."""
    body = await read_json(request) if request.body_exists else {}
    name = request.query.get("name") or (body.get("name") if isinstance(body, dict) else None)
    if not name:
        raise invalid("name: the session's new name is required")
    row = await session_of(request, body=body)
    await services_of(request).kernel_ops.rename(row, name)
    return web.Response(status=204)


async def set_priority(request: web.Request) -> web.Response:
    """bai's POST /session/{ref}/priority {"priority": 0-100}: the session's scheduling priority (lowered to the
    owner's policy's max_priority for non-admins); the session as GET /session/{ref} shows it."""
    body = await read_json(request)
    if not isinstance(body, dict) or "priority" not in body:
        raise invalid("priority is required: a whole number from 0 to 100")
    priority = parse_priority(body["priority"])
    row = await session_of(request, body=body)
    services = services_of(request)
    row = await services.lifecycle.set_priority(row, priority, bool(request["is_admin"]))
    return web.json_response(await session_json(services, row))


async def status_history(request: web.Request) -> web.Response:
    """Backend.AI's GET /session/{ref}/status-history: {"result": {STATUS: time it last entered it}}."""
    services = services_of(request)
    row = await session_of(request, active_only=False)
    return web.json_response({"result": await services.reads.status_history(row)})


async def dependency_graph(request: web.Request) -> web.Response:
    """Backend.AI's GET /session/{ref}/dependency-graph (the client's `session show-graph`)."""
    services = services_of(request)
    row = await session_of(request, active_only=False)
    return web.json_response(await services.reads.dependency_graph(row))


async def commit_session(request: web.Request) -> web.Response:
    """Backend.AI's POST /session/{ref}/commit, done at once: the kernel becomes an image on its agent
    (`image`: the name to give it, a bai extension; default bai-commit/SESSION:TIME)."""
    body = await read_json(request) if request.body_exists else {}
    if not isinstance(body, dict):
        raise invalid("the commit request, when given, must be a JSON object")
    image = body.get("image") or request.query.get("image")
    if image is not None and (not isinstance(image, str) or not IMAGE_NAME.fullmatch(image)):
        raise invalid("image must be a local image name with a tag, e.g. myimage:v1")
    row = await session_of(request, body=body)
    return web.json_response(await services_of(request).kernel_ops.commit(row, image), status=201)


async def task_logs(request: web.Request) -> web.StreamResponse:
    """Backend.AI's GET /session/_/logs?taskId=ID (`backend.ai task-logs`): a batch task's output, as plain
    text. The id is the task's kernel id (Backend.AI's), or its session id."""
    task_id = request.query.get("taskId") or request.query.get("task_id") or request.query.get("sessionName")
    try:
        task_id = str(uuid.UUID(task_id or ""))
    except ValueError:
        raise invalid("taskId must be the id (a UUID) of a task's kernel or session") from None
    caller = caller_of(request)
    services = services_of(request)
    session, kernel = await services.reads.kernel_by_task(task_id, caller.ids_of)
    response = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8"})
    await response.prepare(request)
    if request.method != "HEAD":
        after, more = 0, True
        while more:
            chunks, more = await services.logs.page(kernel.id, after, 1 << 20)
            if not chunks:
                break
            after = chunks[-1][0]
            await response.write("".join(c[1] for c in chunks).encode())
    await response.write_eof()
    return response


# The execute WebSocket's bounds: the first frame carries a cell's code (Backend.AI sets no limit; 4 MiB is
# far more than any cell), later text frames are input lines for a running code's input().
EXECUTE_MAX_FRAME = 4 * 1024 * 1024  # bytes of one frame; aiohttp closes with 1009 beyond it
EXECUTE_MAX_INPUT = 64 * 1024  # bytes of one input frame
EXECUTE_MAX_QUEUED_INPUTS = 64  # input frames waiting for the code to read them
EXECUTE_MAX_QUEUED_BYTES = 1024 * 1024  # and their bytes together
EXECUTE_FIRST_FRAME_TIMEOUT = 30.0  # seconds from the upgrade to the first frame (clients send it at once)
EXECUTE_AGENT_AWAY = 30.0  # seconds a run's stream waits for its kernel's agent to come back (a restart)


class InputRefused(Exception):
    """More input than the execute WebSocket keeps (str: the error frame's message)."""


class InputQueue:
    """Input frames that arrived while the code ran, bounded by count and bytes: nothing accepted is
    dropped; what does not fit is refused (the client is told and the connection ends)."""

    def __init__(self) -> None:
        self._items: list[str | None] = []  # None: an empty binary frame, the end of the input
        self._bytes = 0

    def __bool__(self) -> bool:
        return bool(self._items)

    def put(self, msg: WSMessage) -> None:
        text = msg.data if msg.type == WSMsgType.TEXT else None  # a binary frame: the end of the input
        size = len(text.encode(errors="surrogatepass")) if text is not None else 0
        if size > EXECUTE_MAX_INPUT:
            raise InputRefused(f"an input frame is too large ({size} bytes; at most {EXECUTE_MAX_INPUT})")
        if len(self._items) >= EXECUTE_MAX_QUEUED_INPUTS or self._bytes + size > EXECUTE_MAX_QUEUED_BYTES:
            raise InputRefused(
                f"too much input waiting for the code to read it (at most {EXECUTE_MAX_QUEUED_INPUTS} frames, "
                f"{EXECUTE_MAX_QUEUED_BYTES} bytes)"
            )
        self._items.append(text)
        self._bytes += size

    def pop(self) -> str | None:
        text = self._items.pop(0)
        if text is not None:
            self._bytes -= len(text.encode(errors="surrogatepass"))
        return text


def _error_frame(msg: str) -> dict[str, Any]:
    return {"status": "error", "msg": msg, "console": [], "exitCode": None}


def _first_frame(first: WSMessage, request: web.Request) -> tuple[str, str, dict[str, Any], Any, Any, int | None]:
    """(mode, code, options, run id, kernel ref, after) of the execute WebSocket's first frame, or a Problem."""
    if first.type != WSMsgType.TEXT:
        raise invalid("the first frame must be a text frame holding a JSON object")
    body = decode_json(first.data, "the first frame", EXECUTE_MAX_FRAME)
    if not isinstance(body, dict):
        raise invalid("the first frame must be a JSON object")
    mode, code, options = parse_execute(body, default_mode="query")
    run_id = parse_run_id(body.get("runId"))  # bai's clients name their run (to interrupt it)
    kernel = parse_kernel_ref(body.get("kernel") or request.query.get("kernel"))  # main1 when absent
    after = body.get("after")  # bai's clients re-attaching to their run: the last answer (`seq`) they saw
    if after is not None and (isinstance(after, bool) or not isinstance(after, int) or not 0 <= after < 2**31):
        raise invalid("after must be the seq (a whole number from 0) of the last frame of the run seen")
    return mode, code, options, run_id, kernel, after


def _gone(msg: WSMessage) -> bool:
    """The client went away (or broke the protocol: aiohttp has closed with a code saying why)."""
    return msg.type not in (WSMsgType.TEXT, WSMsgType.BINARY)


async def execute_ws(request: web.Request) -> web.StreamResponse:
    """Streaming execute over a WebSocket (reference spec §2.3)."""
    services = services_of(request)
    row = await session_of(request)
    ws = web.WebSocketResponse(autoping=True, heartbeat=None, max_msg_size=EXECUTE_MAX_FRAME)
    await ws.prepare(request)
    receiving = asyncio.ensure_future(ws.receive())
    finished = False
    run_id = None
    call: asyncio.Future[dict[str, Any]] | None = None
    try:
        try:
            first = await asyncio.wait_for(asyncio.shield(receiving), EXECUTE_FIRST_FRAME_TIMEOUT)
        except TimeoutError:  # a connection held open without asking for anything
            await ws.send_json(_error_frame(f"no first frame within {EXECUTE_FIRST_FRAME_TIMEOUT:g} seconds"))
            return ws
        if _gone(first):
            return ws
        try:
            mode, code, options, run_id, kernel, seen = _first_frame(first, request)
        except (Problem, DomainError) as e:
            p = as_problem(e)
            await ws.send_json(_error_frame(p.msg or p.title))
            return ws
        receiving = asyncio.ensure_future(ws.receive())
        # text frames that arrived while the code ran: fed as input; an empty binary frame (a bai
        # extension) says the input ended (None here): the code's input() raises EOFError
        inputs = InputQueue()
        last_queue = None
        away_since: float | None = None  # since when the kernel's agent has been unreachable
        while True:
            call = asyncio.ensure_future(
                services.kernel_ops.execute(row, run_id, mode, code, options, 5.0, kernel_ref=kernel, after=seen)
            )
            while not call.done():
                await asyncio.wait({call, receiving}, return_when=asyncio.FIRST_COMPLETED)
                if receiving.done():
                    msg = receiving.result()
                    if _gone(msg):  # the client went away mid-run
                        call.cancel()
                        await services.kernel_ops.interrupt(row, run_id)
                        return ws
                    inputs.put(msg)
                    receiving = asyncio.ensure_future(ws.receive())
            try:
                result = call.result()
            except KernelUnreachable as e:
                # the kernel's agent is away (it restarts): the run goes on in the kernel, and the agent that
                # comes back re-attaches to it; ask again for a while (mode continue), then give up saying why
                loop = asyncio.get_running_loop()
                away_since = away_since or loop.time()
                if loop.time() - away_since > EXECUTE_AGENT_AWAY:
                    await ws.send_json(_error_frame(f"{e} (for {EXECUTE_AGENT_AWAY:g} s)"))
                    return ws
                await asyncio.sleep(0.5)
                continue  # (the same call again: a start the agent took already is not started twice)
            except (Problem, DomainError) as e:
                p = as_problem(e)
                await ws.send_json(_error_frame(p.msg or p.title))
                return ws
            away_since = None
            seen = result.get("seq") or seen
            queue = result.get("queue")  # the run waits behind another: say so when where it stands changes
            if result["status"] != "continued" or result["console"] or queue != last_queue:
                frame = {
                    "status": result["status"],
                    "console": result["console"],
                    "exitCode": result["exitCode"],
                    "options": result["options"],
                    "files": [],
                    "runId": run_id,
                    "seq": result.get("seq"),  # bai's: what a client that re-attaches says it saw (`after`)
                }
                if queue is not None:
                    frame["queue"] = queue
                await ws.send_json(frame)
            last_queue = queue
            if result["status"] == "finished":
                finished = True
                return ws
            if result["status"] == "waiting-input" and not inputs:
                msg = await receiving
                if _gone(msg):
                    await services.kernel_ops.interrupt(row, run_id)
                    return ws
                inputs.put(msg)
                receiving = asyncio.ensure_future(ws.receive())
            if inputs and queue is None:  # input is for the run once it has the kernel
                text = inputs.pop()
                mode, code = ("input", text) if text is not None else ("input-eof", "")
            else:
                mode, code = "continue", ""
    except InputRefused as e:  # the client is told, its run interrupted, the connection closed (1009)
        log.info("execute WebSocket of session %s: %s; closing it", row.name, e)
        if call is not None:
            call.cancel()
        with contextlib.suppress(Exception):
            await ws.send_json(_error_frame(str(e)))
        with contextlib.suppress(Exception):
            await services.kernel_ops.interrupt(row, run_id)
        with contextlib.suppress(Exception):
            await ws.close(code=WSCloseCode.MESSAGE_TOO_BIG, message=b"too much input")
        return ws
    finally:
        receiving.cancel()
        if not finished and not ws.closed:
            with contextlib.suppress(Exception):
                await ws.close()


KERNEL_EVENTS = {
    "session_preparing": "kernel_preparing",
    "session_started": "kernel_started",
    "session_cancelled": "kernel_cancelled",
    "session_terminating": "kernel_terminating",
    "session_terminated": "kernel_terminated",
}
FINAL_EVENTS = {"session_terminated", "session_cancelled"}


async def session_events(request: web.Request) -> web.StreamResponse:
    """Session lifecycle events as Server-Sent Events (reference spec §2.11).

    `sessionId` or `sessionName` picks one session (without either: all the requester may see);
    `scope` is `*`, `session`, `kernel` or a comma-separated list of them. The stream stays open, as Backend.AI's
    does; `follow=false` (a bai extension) ends it after the session's final event."""
    services = services_of(request)
    ref = request.query.get("sessionId") or request.query.get("sessionName")
    # Backend.AI's filter: a comma-separated list of `session` and `kernel`, or `*` for both (the 26.x client's
    # `session watch` asks for "session,kernel")
    scopes = {part.strip() for part in request.query.get("scope", "*").split(",")}
    if not scopes or not scopes <= {"*", "session", "kernel"}:
        raise invalid("scope must be *, session, kernel or a comma-separated list of them")
    scope = "*" if "*" in scopes or scopes == {"session", "kernel"} else scopes.pop()
    caller = caller_of(request)
    owner = caller.owner if caller.is_admin else (caller.owner or caller.access_key)
    only = None
    if ref:
        only = (await session_of(request, ref, active_only=False)).id
    until_end = request.query.get("follow", "").lower() in ("0", "false", "no")
    # Backend.AI's events write their JSON with json.dumps's own separators (the dashboard's, compact)
    stream = await EventStream.open(request, separators=SPACED)

    async def send(name: str, row: Session, kernel: Kernel | None) -> None:
        data = {
            "reason": row.status_info,
            "sessionName": row.name,
            "ownerAccessKey": row.access_key,
            "sessionId": row.id,
            "exitCode": (row.status_data or {}).get("exitCode"),
        }
        if kernel is not None:
            data.update(kernelId=kernel.id, clusterRole=kernel.cluster_role, clusterIdx=kernel.cluster_idx)
        await stream.send(name, data)

    async def events(queue: Subscription[Session]) -> None:
        while True:
            name, row = await queue.get()
            if (only is not None and row.id != only) or (owner is not None and row.access_key != owner):
                continue
            if scope in ("*", "session"):
                await send(name, row, None)
            if scope in ("*", "kernel") and name in KERNEL_EVENTS:
                for kernel in await services.state.kernels_of(row.id):
                    await send(KERNEL_EVENTS[name], row, kernel)
            if until_end and only is not None and name in FINAL_EVENTS:
                return

    with services.hubs.events.subscribe() as queue:
        if only is not None and until_end:  # already over: say so at once
            current = await services.state.get_session(only)
            if current and SessionStatus(current.status) in (SessionStatus.TERMINATED, SessionStatus.CANCELLED):
                with contextlib.suppress(ConnectionError):  # the client went away: normal
                    await send(SESSION_EVENT_OF[current.status], current, None)
                return stream.response
        await stream.serve(events(queue))  # until the final event, or the client goes away
    return stream.response


async def list_agents(request: web.Request) -> web.Response:
    services = services_of(request)
    return web.json_response({"items": await agent_items(services.agents, services.stats)})


# Backend.AI endpoints bai does not implement: a clear 501, not a 404 that reads like a typo.
NOT_IMPLEMENTED = [
    ("GET", "/session/{ref}/commit"),  # a commit's progress: bai commits at once (POST answers when done)
    ("*", "/session/{ref}/complete"),
    ("*", "/session/{ref}/download_single"),
    ("*", "/session/{ref}/direct-access-info"),
    ("*", "/session/{ref}/start-service"),
    ("*", "/session/{ref}/shutdown-service"),
    ("*", "/session/_/sync-agent-registry"),
    ("*", "/session/_/create-cluster"),
    ("*", "/session/_/match"),
    ("*", "/folders/_/quota"),
    ("*", "/folders/_/usage"),
    ("*", "/resource/{rest:.*}"),  # (but usage: http/usage_routes.py)
    ("*", "/scaling-groups/{rest:.*}"),  # (wsproxy versions: bai has no wsproxy)
    ("*", "/services{rest:.*}"),
    ("*", "/auth/{rest:.*}"),
    ("*", "/logs/{rest:.*}"),
    ("*", "/manager/scheduler/{rest:.*}"),
    ("*", "/license"),
    ("*", "/server/{rest:.*}"),  # the web server's session mode
    ("*", "/image/{rest:.*}"),
]


async def not_implemented(request: web.Request) -> web.Response:
    raise Problem(
        "not-implemented",
        "Not implemented.",
        f"{request.method} {request.path} is a Backend.AI endpoint bai does not offer",
    )


async def metrics(request: web.Request) -> web.Response:
    """Prometheus's scrape target (unsigned, see PUBLIC): the gauges are set from the services now."""
    services = services_of(request)
    counts = await services.state.count_sessions_by_status()
    services.metrics.refresh(counts, await agent_items(services.agents, services.stats))
    body, content_type = exposition(services.metrics)
    return web.Response(body=body, headers={"Content-Type": content_type})


def make_app(services: Services, settings: dict[str, Any]) -> web.Application:
    app = web.Application(
        middlewares=[errors, authenticate, refuse_while_frozen],
        client_max_size=MAX_UPLOAD_BYTES * 4,
        handler_args={"read_bufsize": 4 << 20},  # large request bodies (uploads) arrive in big pieces
    )
    app[SERVICES] = services
    app[SETTINGS] = settings
    app[STREAMS] = OpenStreams()
    services.teams.close_streams = app[STREAMS].close_all  # (a user or domain deactivated: its keypairs' streams)
    r = app.router
    r.add_get("/", hello)
    r.add_post("/session", create_session)
    r.add_get("/session", list_sessions)
    r.add_get("/session/{ref}", get_session)
    r.add_delete("/session/{ref}", destroy_session)
    r.add_post("/session/{ref}", execute_http)
    r.add_patch("/session/{ref}", restart_session)
    r.add_post("/session/{ref}/restart", restart_session)
    r.add_post("/session/{ref}/interrupt", interrupt)
    r.add_get("/session/_/logs", task_logs)  # before /session/{ref}/logs, which "_" would match
    r.add_get("/session/{ref}/logs", logs)
    r.add_get("/session/{ref}/download", download)
    r.add_post("/session/{ref}/download", download)
    r.add_post("/session/{ref}/rename", rename_session)
    r.add_post("/session/{ref}/priority", set_priority)
    r.add_get("/session/{ref}/status-history", status_history)
    r.add_get("/session/{ref}/dependency-graph", dependency_graph)
    r.add_post("/session/{ref}/commit", commit_session)
    r.add_get("/bai/session/{ref}/history", session_history)
    r.add_get("/bai/session/{ref}/stats", session_stats)
    r.add_post("/session/{ref}/upload", upload)
    r.add_get("/session/{ref}/files", list_files)
    r.add_get("/stream/session/{ref}/execute", execute_ws)
    r.add_get("/events/session", session_events)
    r.add_get("/bai/agents", list_agents)
    r.add_get("/bai/quota", my_quota)  # the caller's own limits and use (bai/node/manager/http/quota.py)
    add_admin_routes(app)
    add_team_routes(app)
    add_template_routes(app, create_answer)
    add_graphql_routes(app)
    add_dashboard_routes(app)
    r.add_get("/metrics", metrics)
    add_image_routes(app)
    add_terminal_routes(app)
    add_config_routes(app)
    add_maintenance_routes(app)
    add_bgtask_routes(app)
    add_app_routes(app)
    add_usage_routes(app)  # (before the /resource/{rest} of NOT_IMPLEMENTED)
    add_preset_routes(app)  # (the same)
    add_scheduler_routes(app)
    add_history_routes(app)
    if services.vfolders is not None:
        from bai.node.manager.http.vfolder_routes import add_vfolder_routes

        add_vfolder_routes(app, services.vfolders)
    for method, path in NOT_IMPLEMENTED:  # last: real routes of the same shape come first
        r.add_route(method, path, not_implemented)
    return app
