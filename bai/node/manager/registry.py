"""The session lifecycle: create, schedule results, start, execute, destroy, agent events.

Every state change goes through `Store.transition` (one transaction that rejects illegal moves)
and is published on the EventHub only after it is committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from bai.common import slots as slotlib
from bai.common.background import Background
from bai.common.gpus import pack as gpu_pack
from bai.common.gpus import request_of as gpu_request
from bai.common.images import registry_of
from bai.common.problems import Problem, invalid, no_session
from bai.common.status import (
    ACTIVE_STATUSES,
    DEAD_STATUSES,
    OCCUPYING_STATUSES,
    SESSION_EVENTS,
    SessionStatus,
    StatusInfo,
)
from bai.node.link.base import AgentUnavailable, ManagerLink, RemoteError
from bai.node.manager.admission import Admission, admit, check_image
from bai.node.manager.diskfull import FullDiskWarnings
from bai.node.manager.events import EventHub, LogHub
from bai.node.manager.hooks import Hooks
from bai.node.manager.metrics import ManagerMetrics
from bai.node.manager.placeable import unplaceable
from bai.node.manager.requests import CreateRequest
from bai.node.manager.runs import BusySessions
from bai.node.manager.store import Store
from bai.node.manager.vfolders.service import VFolders

log = logging.getLogger("bai.manager")
S = SessionStatus
PULL_TIMEOUT = 900.0  # seconds an image pull may add to a kernel's start
STARTING = [S.PREPARING, S.PULLING]  # a kernel on its way: being created, or its image pulled first
HOOK_POINTS = {S.RUNNING: "after_start", S.TERMINATED: "after_termination", S.CANCELLED: "after_termination"}
STARTED_OR_OVER = frozenset({S.RUNNING, S.RUNNING_DEGRADED}) | DEAD_STATUSES | {S.ERROR, S.TERMINATING}


def _error_data(agent_id: str | None, exc: BaseException) -> dict[str, Any]:
    message = exc.message if isinstance(exc, RemoteError) else str(exc)
    name = exc.kind if isinstance(exc, RemoteError) else type(exc).__name__
    return {"error": {"src": "agent", "agent_id": agent_id, "name": name, "repr": message}}


class Registry:
    def __init__(
        self,
        store: Store,
        link: ManagerLink,
        start_timeout: float = 60.0,
        hooks: Hooks | None = None,
        lost_grace: float = 30.0,
        admission: Admission | None = None,
    ) -> None:
        self.lost_grace = lost_grace
        self._lost: dict[str, asyncio.Task[Any]] = {}  # agent id -> the grace period running out
        self.store = store
        self.link = link
        self.hooks = hooks or Hooks([])
        self.activity: dict[str, datetime] = {}  # session id -> last execution activity (idle timeout)
        self.busy = BusySessions()  # sessions with code running (or waiting to run) now
        self.image_labels: dict[str, dict[str, str]] = {}  # image name -> labels, from the agents
        self.known_slots: set[str] = {"cpu", "mem"}  # slot names some agent has offered
        self.events = EventHub()  # session lifecycle: (event name, session row)
        # what the dashboard follows besides sessions: ("agent_joined"|"agent_lost"|"agent_terminated"|
        # "agent_heartbeat", {"id": agent id}) and ("pending_updated", {"ids": [...]}) after a scheduling round
        self.changes = EventHub()
        self.logs = LogHub()
        self.start_timeout = start_timeout
        self.vfolders: VFolders | None = None  # set by the node when it serves virtual folders
        # networks and image registries sessions may ask for (from the node's configuration)
        self.admission = admission or Admission()
        self.agent_hosts: dict[str, frozenset[str]] = {}  # agent id -> vfolder hosts it sees (our paths)
        self.agent_backends: dict[str, str] = {}  # agent id -> its kernel backend (docker, local, sim)
        self.metrics = ManagerMetrics()
        self.agent_schedulable: dict[str, bool] = {}  # False while an agent is drained (its heartbeats say)
        # agent id -> {"devices": [{index, uuid, name, memory_total}], "live": [{uuid, utilization, …}]}
        self.agent_gpus: dict[str, dict[str, Any]] = {}
        self.wake_dispatcher = lambda: None  # set by the dispatcher
        self.background = Background(log)
        self.spawn = self.background.spawn
        self.full_disk = FullDiskWarnings(log)  # heartbeats, kernel logs, run results on a full disk: warned once

    async def close(self) -> None:
        await self.background.close()

    # -- state changes ------------------------------------------------------------------------

    async def transition(self, session_id: str, target: SessionStatus, info: str = "", data=None, **kw) -> Any:
        row = await self.store.transition(session_id, target, info, data, **kw)
        if row is not None:
            self.events.publish(SESSION_EVENTS.get(target, f"session_{target.lower()}"), row)
            if target in DEAD_STATUSES or target == S.TERMINATING:
                self.wake_dispatcher()
                self.activity.pop(session_id, None)
                self.busy.clear(session_id)
            if self.hooks and target in HOOK_POINTS:
                self.spawn(self._notify_hooks(HOOK_POINTS[target], row), f"hooks-{session_id}")
        return row

    async def _notify_hooks(self, point: str, session: dict[str, Any]) -> None:
        notes = await self.hooks.notify(point, session)
        if notes:
            await self.store.add_hook_notes(session["id"], notes)

    # -- lookups ------------------------------------------------------------------------------

    async def resolve(
        self, ref: str, access_key: str, *, active_only: bool = True, ids_of: str | None | bool = True
    ) -> dict[str, Any]:
        """Find a session by id or name (Backend.AI rules); dead ones too unless `active_only`.

        Names are `access_key`'s sessions; ids are `ids_of`'s (True: the same keypair; None: anyone's,
        for admins)."""
        rows = await self.store.find_sessions(ref, access_key, active_only=True, ids_of=ids_of)
        if not rows and not active_only:
            rows = (await self.store.find_sessions(ref, access_key, active_only=False, ids_of=ids_of))[:1]
        exact = [r for r in rows if r["id"] == ref]
        if exact:
            return exact[0]
        if len(rows) > 1:
            raise Problem(
                "too-many-sessions-matched",
                "Too many sessions matched.",
                f"{len(rows)} sessions match {ref!r}; use the session id",
                {"matches": [{"id": r["id"], "name": r["name"], "status": r["status"]} for r in rows]},
            )
        if not rows:
            raise no_session(ref)
        return rows[0]

    async def session_over(self, session_id: str) -> bool:
        """Whether a session has ended (or is gone): its kernels print nothing more."""
        current = await self.store.get_session(session_id)
        return current is None or S(current["status"]) not in ACTIVE_STATUSES

    async def main_kernel(self, session: dict[str, Any]) -> dict[str, Any]:
        kernels = await self.store.kernels_of(session["id"])
        for k in kernels:
            if k["cluster_role"] == "main":
                return k
        raise no_session(session["id"])

    # -- create ---------------------------------------------------------------------------------

    def _reuse(self, row: dict[str, Any], req: CreateRequest) -> tuple[dict[str, Any], bool]:
        """Get-or-create: the live session of that name, if the request may reuse it."""
        if row["image"] != req.image or not req.reuse:
            raise Problem(
                "session-already-exists",
                "The session already exists but you requested a different image.",
                f"session {req.name!r} already exists",
                {"existingSessionId": row["id"]},
            )
        return row, False

    async def create(self, access_key: str, req: CreateRequest, is_admin: bool = False) -> tuple[dict[str, Any], bool]:
        groups: set[str] = set()
        if req.scaling_group not in self.admission.groups:  # a group only agents name
            groups = {a["scaling_group"] for a in await self.store.agents()}
        if problem := admit(self.admission, req, is_admin, groups):
            raise problem
        existing = await self.store.find_sessions(req.name, access_key, active_only=True)
        existing = [r for r in existing if r["name"] == req.name]
        if existing:
            return self._reuse(existing[0], req)
        await self._check_image(req.image)
        if problem := unplaceable(req.resources, req.scaling_group, await self.store.agents(), self.agent_gpus):
            raise problem  # no agent of the group could ever hold it: not queued forever
        mounts: list[dict[str, Any]] = []
        if req.mounts:
            if self.vfolders is None:
                raise invalid("this manager serves no virtual folders")
            mounts = await self.vfolders.mounts_for(access_key, is_admin, req.mounts)
        depends_on = []
        for ref in req.depends:
            found = await self.store.find_sessions(ref, access_key, active_only=False)
            if not found:
                raise invalid(f"cannot depend on {ref!r}: no such session")
            depends_on.append(found[0]["id"])
        session_id = str(uuid.uuid4())
        now = datetime.now(UTC).isoformat()
        kernel = {
            "id": str(uuid.uuid4()),
            "cluster_role": "main",
            "cluster_idx": 1,
            "slots": slotlib.to_wire(req.resources),
        }
        session = {
            "id": session_id,
            "name": req.name,
            "access_key": access_key,
            "image": req.image,
            "type": req.type,
            "requested_slots": slotlib.to_wire(req.resources),
            "environ": req.environ,
            "config": {**req.config, "depends_on": depends_on, "mounts": mounts},
            "scaling_group": req.scaling_group,
            "tag": req.tag,
            "created_at": now,
        }
        if self.hooks:
            reason, notes = await self.hooks.before_enqueue({**session, "status": "PENDING"})
            if reason is not None:
                raise Problem("generic-forbidden", "Rejected by a hook.", reason)
            session["config"]["hook_notes"] = notes
        taken = await self.store.create_session(session, [kernel])
        if taken is not None:  # a concurrent request created it first
            same = await self.store.get_session(taken)
            assert same is not None
            return self._reuse(same, req)
        row = await self.store.get_session(session_id)
        assert row is not None
        self.events.publish("session_enqueued", row)
        if self.hooks:
            self.spawn(self._notify_hooks("after_enqueue", row), f"hooks-{session_id}")
        self.wake_dispatcher()
        return row, True

    def pull_grant(self, image: str) -> dict[str, Any] | None:
        """What an agent needs to pull `image` ({"registry", "auth"}: credentials for this pull only),
        None for a local image; a Problem when its registry is not configured."""
        if registry_of(image) is None:
            return None
        if problem := check_image(self.admission, image):
            raise problem
        reg = self.admission.registry_for(image)
        assert reg is not None
        return {"registry": reg.host, "auth": reg.auth()}

    async def _check_image(self, image: str) -> None:
        """Refuse an image no agent has, when every agent needs it present (docker; local and sim
        agents take any Python image name)."""
        backends = {self.agent_backends.get(a) for a in self.link.connected()}
        if backends != {"docker"} or image in self.image_labels or registry_of(image):
            return  # (an image from a registry is pulled when a kernel needs it)
        known = ", ".join(sorted(self.image_labels)) or "none"
        raise Problem(
            "invalid-api-params",
            "Unknown image.",
            f"no agent has the image {image!r} (images: {known}; add an alias under [images.aliases])",
        )

    async def wait_started(self, session_id: str, timeout: float | None) -> dict[str, Any] | None:
        return await self.events.wait_for(
            session_id,
            lambda: self.store.get_session(session_id),
            lambda row: S(row["status"]) in STARTED_OR_OVER,
            timeout,
        )

    # -- scheduling results ---------------------------------------------------------------------

    async def apply_round(
        self,
        placements: list[tuple[str, dict[str, str]]],
        cancels: list[tuple[str, str, dict[str, Any]]],
        pending: list[tuple[str, str, dict[str, Any]]],
        history: list[dict[str, Any]],
    ) -> None:
        """Commit a scheduling round, then publish its events and start the placed sessions."""
        scheduled, cancelled = await self.store.apply_round(placements, cancels, pending, history)
        if pending:
            self.changes.publish("pending_updated", {"ids": [sid for sid, _, _ in pending]})
        agents = dict(placements)
        now = datetime.now(UTC)
        self.metrics.scheduled([(now - datetime.fromisoformat(r["created_at"])).total_seconds() for r in scheduled])
        for row in cancelled:
            self.events.publish("session_cancelled", row)
            if self.hooks:
                self.spawn(self._notify_hooks("after_termination", row), f"hooks-{row['id']}")
        for row in scheduled:
            self.events.publish("session_scheduled", row)
            agent_id = next(iter(agents[row["id"]].values()))
            self.spawn(self._start_session(row, agent_id), f"start-{row['id']}")

    async def _start_session(self, session: dict[str, Any], agent_id: str) -> None:
        sid = session["id"]
        if await self.transition(sid, S.PREPARING, "", {}, allowed_from=[S.SCHEDULED]) is None:
            return
        kernel = await self.main_kernel(session)
        try:
            pull = self.pull_grant(session["image"])
        except Problem as p:  # the configuration changed since it was created: nothing is contacted
            error = {"error": {"src": "manager", "agent_id": agent_id, "name": p.title, "repr": p.msg}}
            await self.transition(sid, S.CANCELLED, StatusInfo.FAILED_TO_START, error, allowed_from=STARTING)
            return
        config = {
            "kernel_id": kernel["id"],
            "session_id": sid,
            "session_name": session["name"],
            "access_key": session["access_key"],
            "image": session["image"],
            "slots": kernel["occupied_slots"],
            "environ": session["environ"],
            "cluster_role": kernel["cluster_role"],
            "cluster_idx": kernel["cluster_idx"],
            "network": session["config"].get("network"),
            "pull": pull,  # with the registry's credentials: never stored, never logged
            "mounts": [
                {**m, "host_path": str(self.vfolders.path_of(m))}
                for m in session["config"].get("mounts") or []
                if self.vfolders is not None
            ],
            "dotfiles": await self.store.dotfiles(session["access_key"]),
        }
        try:
            # an image from a registry may have to be pulled first: allow for that too
            limit = self.start_timeout + (PULL_TIMEOUT if registry_of(session["image"]) else 0)
            result = await self.link.call(agent_id, "create_kernel", {"config": config}, timeout=limit)
        except TimeoutError:
            # PREPARING took too long: an ERROR with the reason, then clean up and free the slots
            error = _error_data(agent_id, TimeoutError(f"the kernel did not start within {self.start_timeout:g} s"))
            if await self.transition(sid, S.ERROR, StatusInfo.FAILED_TO_START, error, allowed_from=STARTING):
                with contextlib.suppress(Exception):
                    await self.link.call(agent_id, "destroy_kernel", {"kernel_id": kernel["id"]}, timeout=30)
                await self.transition(sid, S.TERMINATED, StatusInfo.FAILED_TO_START, error, allowed_from=[S.ERROR])
            return
        except (RemoteError, AgentUnavailable) as e:
            await self.transition(
                sid, S.CANCELLED, StatusInfo.FAILED_TO_START, _error_data(agent_id, e), allowed_from=STARTING
            )
            return
        started = await self.transition(
            sid,
            S.RUNNING,
            "",
            {},
            allowed_from=STARTING,
            kernel_updates={
                kernel["id"]: {
                    "container_id": result.get("container_id"),
                    "devices": json.dumps(result.get("gpus", [])),
                }
            },
        )
        if started is None:
            current = await self.store.get_session(sid)
            if current is not None and current["status"] == S.RUNNING:
                return  # adopted meanwhile (the agent re-registered with the kernel)
            with contextlib.suppress(Exception):  # destroyed while preparing
                await self.link.call(agent_id, "destroy_kernel", {"kernel_id": kernel["id"]}, timeout=30)
            return
        if session["type"] == "batch":
            self.spawn(self._run_batch(started, kernel, agent_id), f"batch-{sid}")

    async def _run_batch(self, session: dict[str, Any], kernel: dict[str, Any], agent_id: str) -> None:
        """A batch session runs its startup command, then ends by itself with its exit code."""
        command = session["config"]["startup_command"]
        run_id = secrets.token_hex(8)
        mode, code = "batch", command
        exit_code = 1
        try:
            while True:
                result = await self.link.call(
                    agent_id,
                    "execute",
                    {
                        "kernel_id": kernel["id"],
                        "run_id": run_id,
                        "mode": mode,
                        "code": code,
                        "options": {"exec": command},
                        "flush_timeout": 30.0,
                    },
                )
                if result["status"] == "finished":
                    exit_code = result["exitCode"]
                    break
                mode, code = "continue", ""
        except (RemoteError, AgentUnavailable) as e:
            log.warning("batch session %s: %s", session["id"], e)
        ok = exit_code == 0
        info = StatusInfo.TASK_DONE if ok else StatusInfo.TASK_FAILED
        row = await self.transition(
            session["id"],
            S.TERMINATING,
            info,
            {"exitCode": exit_code},
            allowed_from=[S.RUNNING],
            result="SUCCESS" if ok else "FAILURE",
            kernel_updates={kernel["id"]: {"exit_code": exit_code}},
        )
        if row is not None:
            self.events.publish("session_success" if ok else "session_failure", row)
            await self._finish_destroy(row, agent_id, info)

    # -- destroy ----------------------------------------------------------------------------------

    async def destroy(
        self, session: dict[str, Any], forced: bool, wait: bool = True, reason: str | None = None
    ) -> dict[str, Any]:
        """End a session. With wait=False a running one is TERMINATING on return and ends in the background."""
        status = S(session["status"])
        info = reason or (StatusInfo.FORCE_TERMINATED if forced else StatusInfo.USER_REQUESTED)
        if status in DEAD_STATUSES:
            raise Problem("generic-forbidden", "Forbidden.", f"the session is already {status}")
        if status == S.PENDING:
            await self.transition(session["id"], S.CANCELLED, info, {}, allowed_from=[S.PENDING])
            return {}
        if status in (S.SCHEDULED, S.PREPARING, S.PULLING, S.TERMINATING, S.ERROR) and not forced:
            raise Problem(
                "generic-forbidden",
                "Forbidden.",
                f"the session is {status}; wait, or destroy it with forced=true",
            )
        kernel = await self.main_kernel(session)
        target = S.CANCELLED if status in (S.SCHEDULED, S.PULLING) else S.TERMINATING
        row = await self.transition(session["id"], target, info, {})
        if row is None:
            row = await self.store.get_session(session["id"])
        if target == S.TERMINATING and row is not None:
            finishing = self._finish_destroy(row, kernel["agent_id"], info)
            if wait:
                await finishing
            else:
                self.spawn(finishing, f"destroy-{session['id']}")
        return {}

    async def _finish_destroy(self, session: dict[str, Any], agent_id: str | None, info: str) -> None:
        kernel = await self.main_kernel(session)
        if agent_id:
            try:
                await self.link.call(
                    agent_id, "destroy_kernel", {"kernel_id": kernel["id"], "reason": info}, timeout=60
                )
            except (RemoteError, AgentUnavailable, TimeoutError) as e:
                log.warning("destroying kernel %s on %s: %s", kernel["id"], agent_id, e)
        await self.transition(
            session["id"], S.TERMINATED, info, session["status_data"], allowed_from=[S.TERMINATING, S.ERROR]
        )

    # -- execution --------------------------------------------------------------------------------

    async def execute(
        self,
        session: dict[str, Any],
        run_id: str,
        mode: str,
        code: str,
        options: dict[str, Any],
        flush: float,
    ) -> dict[str, Any]:
        if S(session["status"]) not in (S.RUNNING, S.RUNNING_DEGRADED):
            raise Problem("generic-bad-request", "Bad request.", f"the session is {session['status']}, not RUNNING")
        kernel = await self.main_kernel(session)
        sid = session["id"]
        self.activity[sid] = datetime.now(UTC)
        if mode in ("query", "batch"):
            self.busy.add(sid, run_id)  # code is running: the session is not idle until it finishes
        args = {
            "kernel_id": kernel["id"],
            "run_id": run_id,
            "mode": mode,
            "code": code,
            "options": options,
            "flush_timeout": flush,
        }
        try:
            result = await self.link.call(kernel["agent_id"], "execute", args, timeout=flush + 60)
        except RemoteError as e:
            self.busy.discard(sid, run_id)
            raise invalid(e.message) from None
        except AgentUnavailable as e:
            self.busy.discard(sid, run_id)
            raise Problem("instance-not-available", "Instance not available.", str(e)) from None
        self.activity[sid] = datetime.now(UTC)
        if result["status"] == "finished":
            self.busy.discard(sid, run_id)
            code = result.get("exitCode")
            if isinstance(code, int) and not result.get("cancelled"):
                # the last run's outcome is the session's (kept when it is destroyed), as for a batch session
                # (on a full disk the run's output still reaches its client: only the record is dropped)
                outcome = "SUCCESS" if code == 0 else "FAILURE"
                if await self._background_write("run results", self.store.record_run(sid, kernel["id"], code, outcome)):
                    self.changes.publish("run_finished", {"ids": [sid]})
        return result

    async def interrupt(self, session: dict[str, Any], run_id: str | None = None) -> bool:
        """Interrupt a run: `run_id`'s (a waiting one leaves the queue), else the one running now (Backend.AI's
        interrupt names no run). False when there was no such run."""
        kernel = await self.main_kernel(session)
        if not kernel["agent_id"] or S(session["status"]) not in (S.RUNNING, S.RUNNING_DEGRADED):
            return False
        args: dict[str, Any] = {"kernel_id": kernel["id"]}
        if run_id is not None:
            args["run_id"] = run_id
        try:
            return bool(await self.link.call(kernel["agent_id"], "interrupt", args, timeout=10))
        except (RemoteError, AgentUnavailable):
            return False

    async def upload(self, session: dict[str, Any], files: list[tuple[str, bytes]]) -> None:
        kernel = await self.main_kernel(session)
        try:
            await self.link.call(
                kernel["agent_id"], "upload_files", {"kernel_id": kernel["id"], "files": files}, timeout=120
            )
        except RemoteError as e:
            raise invalid(e.message) from None

    async def list_files(self, session: dict[str, Any], path: str) -> dict[str, Any]:
        kernel = await self.main_kernel(session)
        if S(session["status"]) not in (S.RUNNING, S.RUNNING_DEGRADED):
            raise invalid(
                f"session {session['name']} is {session['status']}: only a running kernel's files can be listed"
            )
        try:
            return await self.link.call(
                kernel["agent_id"], "list_files", {"kernel_id": kernel["id"], "path": path}, timeout=60
            )
        except (RemoteError, AgentUnavailable) as e:
            raise invalid(str(e)) from None

    # -- what agents tell us ----------------------------------------------------------------------

    async def agent_joined(self, agent_id: str, registration: dict[str, Any]) -> dict[str, Any]:
        """Record the agent and reconcile its kernels with ours."""
        lost = self._lost.pop(agent_id, None)
        if lost is not None:  # back within the grace period: its sessions carry on
            lost.cancel()
        await self.store.upsert_agent(registration)
        self.agent_backends[agent_id] = registration.get("backend", "")
        if registration.get("gpus"):
            self.agent_gpus[agent_id] = {"devices": registration["gpus"], "live": []}
        else:
            self.agent_gpus.pop(agent_id, None)
        seen = registration.get("vfolder_hosts") or {}
        ours = self.vfolders.hosts if self.vfolders is not None else {}
        self.agent_hosts[agent_id] = frozenset(h for h, path in ours.items() if seen.get(h) == str(path))
        self.known_slots.update(registration.get("slots", {}))
        for image in registration.get("images", []):
            self.image_labels[image["name"]] = image.get("labels") or {}
        theirs = {k["kernel_id"] for k in registration.get("kernels", [])}
        ours = await self.store.kernels_where([s.value for s in OCCUPYING_STATUSES], agent_id)
        containers = {k["kernel_id"]: k.get("container_id") for k in registration.get("kernels", [])}
        for kernel in ours:
            status = S(kernel["status"])
            if kernel["id"] in theirs:
                if status in (S.SCHEDULED, S.PREPARING, S.PULLING):
                    # it came up while the manager was away: the session runs
                    if status == S.SCHEDULED:
                        await self.transition(kernel["session_id"], S.PREPARING)
                    await self.transition(
                        kernel["session_id"],
                        S.RUNNING,
                        kernel_updates={kernel["id"]: {"container_id": containers.get(kernel["id"])}},
                    )
                continue
            if status in (S.SCHEDULED, S.PREPARING, S.PULLING):
                await self.transition(
                    kernel["session_id"],
                    S.CANCELLED,
                    StatusInfo.FAILED_TO_START,
                    {
                        "error": {
                            "src": "agent",
                            "agent_id": agent_id,
                            "name": "AgentRestarted",
                            "repr": f"agent {agent_id} restarted while the kernel was starting",
                        }
                    },
                )
            elif status == S.TERMINATING:
                await self.transition(kernel["session_id"], S.TERMINATED, kernel["status_info"] or "user-requested")
            else:
                await self.transition(
                    kernel["session_id"],
                    S.TERMINATED,
                    StatusInfo.AGENT_TERMINATION,
                    {"msg": f"the kernel was gone when agent {agent_id} restarted"},
                )
        known = {k["id"] for k in ours}
        self.changes.publish("agent_joined", {"id": agent_id})
        self.wake_dispatcher()
        return {"destroy": sorted(theirs - known)}

    async def agent_left(self, agent_id: str, reason: str) -> None:
        await self.store.set_agent_status(agent_id, "LOST" if reason == "lost" else "TERMINATED")
        self.changes.publish("agent_lost" if reason == "lost" else "agent_terminated", {"id": agent_id})
        if reason == "lost":
            log.warning("agent %s is LOST (no heartbeat); its sessions wait %g s for it", agent_id, self.lost_grace)
            self._lost[agent_id] = self.spawn(self._agent_gone(agent_id), f"lost-{agent_id}")
        self.wake_dispatcher()

    async def _agent_gone(self, agent_id: str) -> None:
        """The grace period of a lost agent ran out: its sessions end in ERROR (`agent-lost`)."""
        await asyncio.sleep(self.lost_grace)
        self._lost.pop(agent_id, None)
        for kernel in await self.store.kernels_where([s.value for s in OCCUPYING_STATUSES], agent_id):
            await self.transition(
                kernel["session_id"],
                S.ERROR,
                StatusInfo.AGENT_LOST,
                {"msg": f"agent {agent_id} stopped heartbeating and did not come back within {self.lost_grace:g} s"},
            )

    async def agent_event(self, agent_id: str, name: str, payload: dict[str, Any]) -> None:
        if name == "heartbeat":
            await self._background_write("heartbeats", self.store.touch_agent(agent_id))
            if agent_id in self.agent_gpus and "gpus" in payload:
                self.agent_gpus[agent_id]["live"] = payload["gpus"]
            schedulable = bool(payload.get("schedulable", True))
            if self.agent_schedulable.get(agent_id, True) != schedulable:
                self.agent_schedulable[agent_id] = schedulable
                log.warning("agent %s is %s", agent_id, "schedulable again" if schedulable else "drained")
                self.wake_dispatcher()
            self.changes.publish("agent_heartbeat", {"id": agent_id})
        elif name == "kernel_logs":
            chunks = [(kid, text) for kid, text in payload["chunks"] if text]
            if chunks and await self._background_write("kernel logs", self.store.append_logs(chunks)):
                for kid in {kid for kid, _ in chunks}:
                    self.logs.notify(kid)
        elif name == "kernel_pulling":
            await self._pulling(payload)
        elif name == "kernel_terminated":
            await self._kernel_terminated(payload)
        else:
            log.warning("unknown event %s from agent %s", name, agent_id)

    async def _background_write(self, what: str, write) -> bool:
        """Await a write nobody waits for (a heartbeat, kernel output): on a full disk it is dropped, with
        one warning (not one per write), and the node carries on. Whether it was written."""
        try:
            await write
        except Exception as e:
            if not self.full_disk.failed(what, e):
                raise
            return False
        self.full_disk.ok(what)
        return True

    async def _pulling(self, payload: dict[str, Any]) -> None:
        """The agent pulls the kernel's image: PULLING, with how far it got in the status info."""
        done, total = int(payload.get("done", 0)), int(payload.get("total", 0))
        so_far = f": {done / 2**20:.1f} of {total / 2**20:.1f} MiB" if total else ""
        data = {"msg": f"pulling {payload['image']}{so_far}", "pull": {"done": done, "total": total}}
        sid = payload["session_id"]
        row = await self.store.set_status_info(sid, S.PULLING, "pulling-image", data)
        if row is not None:
            self.events.publish("session_pulling", row)
        else:
            await self.transition(sid, S.PULLING, "pulling-image", data, allowed_from=[S.PREPARING])

    async def _kernel_terminated(self, payload: dict[str, Any]) -> None:
        kernel = await self.store.get_kernel(payload["kernel_id"])
        if kernel is None:
            return
        await self.store.update_kernel(kernel["id"], exit_code=payload.get("exit_code"))
        await self.transition(
            kernel["session_id"],
            S.TERMINATED,
            payload.get("reason") or StatusInfo.SELF_TERMINATED,
            # msg: why, when the agent knows (e.g. out of memory, naming the limit)
            {"exitCode": payload.get("exit_code"), **({"msg": payload["msg"]} if payload.get("msg") else {})},
            allowed_from=[S.RUNNING, S.RUNNING_DEGRADED, S.RESTARTING],
        )
        self.logs.notify(kernel["id"])

    # -- capacity -----------------------------------------------------------------------------------

    async def gpu_free_by_agent(self) -> dict[str, tuple[Decimal, ...]]:
        """What each GPU of each agent has left (1 = unused), from the devices kernels hold; a kernel
        still starting (no devices recorded yet) is counted where it will most likely land."""
        if not self.agent_gpus:
            return {}
        free = {a: [Decimal(1)] * len(g["devices"]) for a, g in self.agent_gpus.items()}
        index = {a: {d["uuid"]: i for i, d in enumerate(g["devices"])} for a, g in self.agent_gpus.items()}
        starting = []
        for k in await self.store.kernels_where([s.value for s in OCCUPYING_STATUSES]):
            agent = k["agent_id"]
            if agent not in free:
                continue
            if k["devices"]:
                for uuid, amount in k["devices"]:
                    if uuid in index[agent]:
                        free[agent][index[agent][uuid]] -= Decimal(amount)
            else:
                starting.append(k)
        for k in starting:
            taken = gpu_pack(free[k["agent_id"]], *gpu_request(slotlib.from_wire(k["occupied_slots"])))
            for i, amount in taken or []:
                free[k["agent_id"]][i] -= amount
        return {a: tuple(f) for a, f in free.items()}

    async def occupied_by_agent(self) -> dict[str, dict[str, Decimal]]:
        occupied: dict[str, dict[str, Decimal]] = {}
        for k in await self.store.kernels_where([s.value for s in OCCUPYING_STATUSES]):
            if k["agent_id"]:
                occupied[k["agent_id"]] = slotlib.add(
                    occupied.get(k["agent_id"], {}), slotlib.from_wire(k["occupied_slots"])
                )
        return occupied
