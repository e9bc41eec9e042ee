"""Backend.AI's background tasks, for what bai does at once (reference spec §2):

POST /session/{ref}/imagify?image_name=NAME   `session convert-to-image`: the session's main kernel becomes a local
                                              image (bai's commit: it is done when this answers) → {"task_id"}
GET  /events/background-task?task_id=ID       the task's end as Backend.AI's event stream (`bgtask_done` or
                                              `bgtask_failed`, then `server_close`: the stream ends)

Backend.AI commits in the background and pushes the image to the project's registry; bai commits on the kernel's
agent, where new sessions use the image at once (`bai image ls`), and pushes nowhere; what stops a commit (a session
not running, a kernel that is no container) is answered at once, a 4xx. A task's outcome is kept for an hour (at
most MAX_TASKS of them), for its owner and admins.
"""

from __future__ import annotations

import re
import time
import uuid
from collections import OrderedDict

import msgspec
from aiohttp import web

from bai.common.problems import Problem, invalid
from bai.node.manager.http.context import services_of, session_of
from bai.node.manager.http.sse import EventStream

MAX_TASKS = 1000
KEEP_SECONDS = 3600.0
IMAGE_REPO = re.compile(r"[a-z0-9][a-z0-9._/-]{0,127}")
IMAGE_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


class FinishedTask(msgspec.Struct, frozen=True):
    id: str
    owner: str  # the access key that asked
    event: str  # bgtask_done | bgtask_failed
    message: str
    at: float


class FinishedTasks:
    """The outcomes of tasks that ended, newest last, at most MAX_TASKS, each for KEEP_SECONDS."""

    def __init__(self) -> None:
        self._tasks: OrderedDict[str, FinishedTask] = OrderedDict()

    def add(self, owner: str, event: str, message: str) -> FinishedTask:
        task = FinishedTask(str(uuid.uuid4()), owner, event, message, time.monotonic())
        self._tasks[task.id] = task
        while len(self._tasks) > MAX_TASKS:
            self._tasks.popitem(last=False)
        return task

    def get(self, task_id: str) -> FinishedTask | None:
        task = self._tasks.get(task_id)
        if task is not None and time.monotonic() - task.at > KEEP_SECONDS:
            del self._tasks[task_id]
            return None
        return task


TASKS = web.AppKey("bgtasks", FinishedTasks)


def image_named(text: object) -> str:
    """`name` or `name:tag` (no tag: `latest`), a local image name."""
    if not isinstance(text, str) or not text:
        raise invalid("image_name must be the new image's name, e.g. myimage or myimage:v1")
    repo, _, tag = text.partition(":")
    tag = tag or "latest"
    if not IMAGE_REPO.fullmatch(repo) or not IMAGE_TAG.fullmatch(tag):
        raise invalid(f"image_name {text!r} is no image name (lower-case letters, digits, . _ - /; a tag after :)")
    return f"{repo}:{tag}"


async def imagify(request: web.Request) -> web.Response:
    image = image_named(request.query.get("image_name"))
    row = await session_of(request)
    made = await services_of(request).kernel_ops.commit(row, image)  # (what stops it is said at once: a 4xx)
    task = request.app[TASKS].add(request["access_key"], "bgtask_done", f"committed as {made.get('name', image)}")
    return web.json_response({"task_id": task.id})


async def task_events(request: web.Request) -> web.StreamResponse:
    task_id = request.query.get("task_id") or request.query.get("taskId") or ""
    task = request.app[TASKS].get(task_id)
    if task is None or (task.owner != request["access_key"] and not request["is_admin"]):
        raise Problem(
            "task-not-found", "No such background task.", f"no background task {task_id!r} of yours", status=404
        )
    stream = await EventStream.open(request)
    data = {"task_id": task.id, "message": task.message, "current_progress": 1, "total_progress": 1}
    try:
        await stream.send(task.event, data)
        await stream.send("server_close", {})  # (else the clients reconnect: Backend.AI's end of a task's stream)
        await stream.end()
    except ConnectionError:
        pass
    return stream.response


def add_bgtask_routes(app: web.Application) -> None:
    app[TASKS] = FinishedTasks()
    app.router.add_post("/session/{ref}/imagify", imagify)
    app.router.add_get("/events/background-task", task_events)
