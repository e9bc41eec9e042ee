"""An in-process cluster for tests: the manager's services as `bai node` wires them, agents with the
simulated backend, the in-process link and a clock the test moves. Nothing listens on a port and no
process starts, so a test that drives sessions through their lifecycle runs in milliseconds.

    async with Harness(tmp_path) as h:
        await h.add_agent("a1", cpu=4, mem="8g")
        await h.create("job-1", type="batch", command="exit 3")
        await h.schedule()                      # one scheduling round, as the dispatcher runs it
        row = await h.wait("job-1", "TERMINATED")
        assert row.result == "FAILURE"

What is real: the Store (SQLite in tmp_path, or a database of the tests' PostgreSQL server: `engine`, by
default `ENGINE`, which tests/conftest.py sets for the modules it runs on both engines), Sessions, Agents,
Images, AgentEvents, the Dispatcher's round and the Timers' sweep, the Agent and its link. What is not:
kernels (SimBackend: query code and batch commands are answered without running anything, see
bai/node/agent/backends/sim.py), the HTTP API, the ZeroMQ link, time (a ManualClock: nothing happens because
time passes unless the test calls `schedule()` or `sweep()` after `advance()`), heartbeats (sent when the test
calls `heartbeat()`). The dispatcher's and the timers' loops are not started: the test decides when a round
runs.

Like Nomad's scheduler test harness: the real state store and the real planner's code, with the
outside (clients, time) in the test's hands. Session names follow the API's rules (4-64 characters).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from bai.common import slots as slotlib
from bai.common.auth import Keypair
from bai.common.clock import ManualClock
from bai.common.config import DEFAULTS, merge
from bai.common.gpus import DEVICE, SHARES
from bai.common.status import DEAD_STATUSES, SessionStatus
from bai.node.agent.agent import Agent
from bai.node.agent.backends.sim import SimBackend
from bai.node.agent.gpus import GPU
from bai.node.link.inproc import InprocHub
from bai.node.link.messages import GpuDevice
from bai.node.manager.build import build_manager
from bai.node.manager.http.represent import session_json
from bai.node.manager.http.requests import parse_create
from bai.node.manager.services.hooks import Hooks
from bai.node.manager.services.vfolder_service import VFolders
from bai.node.manager.state import Store
from bai.node.manager.state.postgres import PgStore
from bai.node.manager.state.records import NewKeypair, PolicyFields, Session

S = SessionStatus
_PG_DATABASES: dict[Path, str] = {}  # a harness's folder -> its PostgreSQL database, as the SQLite file is in it
ENGINE = "sqlite"  # the state's engine of a Harness not told one (tests/conftest.py's state_engine sets it)
CREATE_STEP = 0.001  # seconds the clock moves with each create
START = datetime(2020, 1, 1, tzinfo=UTC)  # the clock's time when a harness starts (unless told)
STAT_INTERVAL = 3600.0  # the agents' statistics rounds: the tests send them (`send_stats`), as heartbeats
WAIT = 5.0  # seconds `wait` allows by default: everything here takes milliseconds; this only bounds a bug


class FakeGPUs:
    """What the agent asks NVML, for `gpus` devices that are never busy (the shape of `agent.gpus.NVML`)."""

    def __init__(self, agent_id: str, count: int, memory: int = 16 << 30) -> None:
        self.error = None
        self.gpus = [GPU(i, f"GPU-{agent_id}-{i}", "Fake GPU", memory) for i in range(count)]

    def sample(self) -> list[dict[str, Any]]:
        return [{"uuid": g.uuid, "utilization": 0, "memory_used": 0} for g in self.gpus]

    def describe(self) -> list[GpuDevice]:
        return [GpuDevice(g.index, g.uuid, g.name, g.memory_total) for g in self.gpus]


class HarnessSimBackend(SimBackend):
    """The simulated backend, whose kernels can outlive their agent as Docker containers do: while
    `keeps_kernels`, stopping the agent leaves them, and the next agent on this backend adopts them (it
    re-registers with them)."""

    def __init__(self, start_delay: float = 0.0, keeps_kernels: bool = False, apps: str = "") -> None:
        super().__init__(start_delay=start_delay, apps=apps)
        self.keeps_kernels = keeps_kernels
        self.starting: set[str] = set()  # kernels being created (waiting out start_delay)

    async def create(self, spec, on_output):
        self.starting.add(spec.kernel_id)
        try:
            return await super().create(spec, on_output)
        finally:
            self.starting.discard(spec.kernel_id)

    async def close(self, kernels) -> None:
        if not self.keeps_kernels:
            await super().close(kernels)

    async def adopt(self, on_output) -> list:
        return list(self.kernels.values()) if self.keeps_kernels else []


@dataclass
class AgentNode:
    """One agent of the harness and what it was built with (to start it again)."""

    id: str
    slots: dict[str, Decimal]
    group: str
    backend: HarnessSimBackend
    state_dir: Path
    gpus: FakeGPUs | None
    agent: Agent | None = None  # None while stopped (or lost)
    link: Any = None


class Harness:
    """The manager's services, in-process agents and a manual clock; see the module docstring.

    `config`: overrides of the node configuration (bai.common.config.DEFAULTS), e.g.
    `{"scaling_groups": {"default": {"policy": "drf"}}}`. `hooks`: hook objects (modules or namespaces
    with before_enqueue / after_start / …), as `[manager] hooks` would load them.
    """

    def __init__(
        self,
        tmp_path: Path,
        *,
        config: dict[str, Any] | None = None,
        hooks: list[tuple[str, Any]] | None = None,
        hook_timeout: float = 0.5,
        lost_grace: float = 0.01,
        start_timeout: float = 5.0,
        start: datetime | None = None,
        engine: str | None = None,
    ) -> None:
        self.base = tmp_path
        self.engine = engine or ENGINE  # the state's engine: "sqlite" (a file in tmp_path) or "postgresql"
        self.cfg = merge(DEFAULTS, config or {})
        self.cfg["manager"]["lost_grace"] = lost_grace
        self.cfg["manager"]["preparing_timeout"] = start_timeout
        # the one clock of the manager (every stamp it stores, every limit it judges): it starts at `start`, by
        # default a date far from today, so that a time taken from the system's clock shows (tests/test_clock_dates.py)
        self.clock = ManualClock(start or START)
        self.hooks = Hooks(list(hooks or []), hook_timeout)
        self.nodes: dict[str, AgentNode] = {}
        self.wakes = 0  # how often something woke the dispatcher (a round would run now)
        self.admin = ""

    # -- building and tearing down ------------------------------------------------------------------

    async def __aenter__(self) -> Harness:
        cfg = self.cfg
        if self.engine == "postgresql":
            from tests import pgserver

            self.base.mkdir(parents=True, exist_ok=True)  # (the folder hosts are in it)
            url = _PG_DATABASES.get(self.base)  # (a harness again on the same folder: a manager restart)
            if url is None:
                url = _PG_DATABASES[self.base] = pgserver.shared().new_database("h")
            self.store = store = await PgStore.open_url(url, "the harness's database", clock=self.clock)
        else:
            self.store = store = await Store.open(self.base / "bai.db", clock=self.clock)
        try:
            await self._build(cfg, store)
        except BaseException:
            await store.close()
            raise
        return self

    async def _build(self, cfg: dict[str, Any], store: Store) -> None:
        """As bai/node/main.py start_manager wires the services (without the HTTP app and the loops)."""
        fresh = Keypair.generate()
        self.admin, _ = await store.ensure_admin_keypair(fresh.access_key, fresh.secret_key, self.clock.now())
        (self.base / "vfolders").mkdir(exist_ok=True)
        self.vfolders = VFolders(store, {"local": self.base / "vfolders"}, "local")
        self.hub = InprocHub(heartbeat_interval=3600.0)  # heartbeats: when the test sends them
        link = self.hub.manager
        self.manager = manager = await build_manager(cfg, store, link, self.vfolders, self.hooks, clock=self.clock)
        self.services = services = manager.services
        self.hubs, self.wake, self.metrics = services.hubs, manager.wake, services.metrics
        self.background = manager.background
        self.agents, self.images = services.agents, services.images
        # the session services: lifecycle (create, destroy, transitions), kernel operations, reads
        self.lifecycle, self.ops, self.reads = services.lifecycle, services.kernel_ops, services.reads
        self.agent_events, self.dispatcher, self.timers = manager.agent_events, manager.dispatcher, manager.timers
        self.wake.bind(self._woken)  # counted; no loop runs a round by itself
        self.defaults = {"cpu": str(cfg["session"]["default_cpu"]), "mem": str(cfg["session"]["default_mem"])}
        await link.start(self.agent_events)

    def _woken(self) -> None:
        self.wakes += 1

    def start_dispatcher(self) -> None:
        """Run the dispatcher's own loop, as the node does: rounds follow wake-ups (and the tick, at real
        time), not `schedule()` calls. For tests of that wiring; others are better off deterministic."""

        def woken() -> None:
            self._woken()
            self.dispatcher.wake()

        self.wake.bind(woken)
        self.dispatcher.start()

    async def __aexit__(self, *exc: object) -> None:
        # the node's shutdown order: timers, dispatcher, background work, agents, link, store
        await self.manager.close()
        for node in self.nodes.values():
            if node.agent is not None:
                with contextlib.suppress(Exception):
                    await self._stop(node)
            await SimBackend.close(node.backend, list(node.backend.kernels.values()))  # kept ones too
        await self.hub.manager.close()
        await self.store.close()
        await self._no_tasks_left(exc[0] is None)

    async def _no_tasks_left(self, strict: bool) -> None:
        """No task may outlive the harness (one left pending is a shutdown bug): any left is cancelled,
        and named in a failure unless the test failed already."""
        for _ in range(3):  # let cancelled tasks finish
            await asyncio.sleep(0)
        me = asyncio.current_task()
        left = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
        for task in left:
            task.cancel()
        for task in left:
            with contextlib.suppress(BaseException):
                await task
        if left and strict:
            raise AssertionError(f"tasks still running after the harness stopped: {[t.get_name() for t in left]}")

    # -- agents ---------------------------------------------------------------------------------------

    async def add_agent(
        self,
        agent_id: str,
        *,
        cpu: float | str = 4,
        mem: str = "8g",
        group: str = "default",
        gpus: int = 0,
        gpu_shares: bool = False,
        start_delay: float = 0.0,
        keeps_kernels: bool = False,
        apps: str = "",
    ) -> Agent:
        """Start an agent with the simulated backend; it registers before this returns.

        `gpus`: fake NVIDIA devices (offered as cuda.device; with `gpu_shares` as cuda.shares too).
        `keeps_kernels`: its kernels outlive it (as containers do), so a restart re-registers with them.
        `apps`: the apps its kernels offer (a service-ports label; the sim backend serves echo apps)."""
        slots = {"cpu": slotlib.parse_count(str(cpu)), "mem": slotlib.parse_bytes(mem)}
        fake = FakeGPUs(agent_id, gpus) if gpus else None
        if gpus:
            slots[DEVICE] = Decimal(gpus)
            if gpu_shares:
                slots[SHARES] = Decimal(gpus)
        backend = HarnessSimBackend(start_delay, keeps_kernels, apps)
        state_dir = self.base / "agents" / agent_id
        state_dir.mkdir(parents=True, exist_ok=True)
        node = AgentNode(agent_id, slots, group, backend, state_dir, fake)
        self.nodes[agent_id] = node
        return await self._start(node)

    async def _start(self, node: AgentNode) -> Agent:
        node.link = self.hub.agent_link(node.id)
        agent = Agent(
            node.id,
            node.backend,
            node.link,
            dict(node.slots),
            node.group,
            {"local": self.base / "vfolders"},
            node.state_dir,
            node.gpus,  # type: ignore[arg-type]
            stat_interval=STAT_INTERVAL,  # statistics: sent when the test calls `send_stats()` (after one at start)
        )
        node.agent = agent
        await agent.start()
        return agent

    async def _stop(self, node: AgentNode) -> None:
        agent, node.agent = node.agent, None
        assert agent is not None
        await agent.stop()

    def agent(self, agent_id: str) -> Agent:
        """The running Agent object of `agent_id`."""
        agent = self.nodes[agent_id].agent
        assert agent is not None, f"agent {agent_id} is not running"
        return agent

    async def agent_statuses(self) -> dict[str, str]:
        """Agent id -> ALIVE, LOST or TERMINATED, as the manager has it."""
        return {a.id: a.status for a in await self.agents.rows()}

    def kernels_on(self, agent_id: str) -> set[str]:
        """Ids of the kernels the agent's backend holds now."""
        return set(self.nodes[agent_id].backend.kernels)

    def kernels_starting(self, agent_id: str) -> set[str]:
        """Ids of the kernels the agent's backend is creating now (see `start_delay`)."""
        return set(self.nodes[agent_id].backend.starting)

    async def stop_agent(self, agent_id: str) -> None:
        """Stop the agent as `bai node` does on SIGTERM: its link says goodbye (the agent is TERMINATED,
        its sessions carry on); its kernels end with it unless it `keeps_kernels`."""
        await self._stop(self.nodes[agent_id])

    async def start_agent(self, agent_id: str, *, keep_kernels: bool | None = None) -> Agent:
        """Start a stopped (or lost) agent again: it re-registers and the manager reconciles its kernels
        with its sessions. `keep_kernels`: whether it comes back with the kernels it had (True: as Docker
        containers outlive their agent; False: they died with it; None: as the agent was built)."""
        node = self.nodes[agent_id]
        if node.agent is not None:
            await self._detach(node)
        backend = node.backend
        if keep_kernels is False:
            await SimBackend.close(backend, list(backend.kernels.values()))
        keeps, backend.keeps_kernels = backend.keeps_kernels, bool(keep_kernels) or backend.keeps_kernels
        try:
            return await self._start(node)
        finally:
            backend.keeps_kernels = keeps

    async def restart_agent(self, agent_id: str, *, keep_kernels: bool) -> Agent:
        """Stop the agent cleanly and start it again; see `start_agent`."""
        node = self.nodes[agent_id]
        keeps, node.backend.keeps_kernels = node.backend.keeps_kernels, keep_kernels
        try:
            if node.agent is not None:
                await self._stop(node)
        finally:
            node.backend.keeps_kernels = keeps
        return await self.start_agent(agent_id, keep_kernels=keep_kernels)

    async def _detach(self, node: AgentNode) -> None:
        """The agent vanishes without a word (killed): its tasks end, its kernels stay in its backend."""
        agent, node.agent = node.agent, None
        assert agent is not None
        await agent.background.close()
        if agent.logs is not None:
            await agent.logs.close()
        await node.link.drop()

    async def lose_agent(self, agent_id: str, *, wait_grace: bool = True) -> None:
        """The agent stops answering (killed, or its network gone): the link reports it `lost`, its
        sessions wait out the grace period (`lost_grace`, by the clock), then end in ERROR (`agent-lost`)
        unless it comes back (`start_agent`). With `wait_grace`, the clock moves on by the grace period and
        this returns once it has run out; without, the grace runs out when the test moves the clock past it
        (`advance`, then `grace_over`)."""
        node = self.nodes[agent_id]
        await self._detach(node)
        await self.agent_events.agent_left(agent_id, "lost")
        if wait_grace:
            self.advance(self.cfg["manager"]["lost_grace"])
            await self.grace_over(agent_id)

    async def grace_over(self, agent_id: str) -> None:
        """Return once the lost agent's grace period has run out and its sessions were ended (after the clock
        was moved past it); at once when it is not lost."""
        task = self._grace(agent_id)
        if task is not None:
            await asyncio.wait_for(asyncio.shield(task), WAIT)

    def _grace(self, agent_id: str) -> asyncio.Task[Any] | None:
        return self.agent_events.grace_of(agent_id)

    def in_grace(self, agent_id: str) -> bool:
        """Whether a lost agent's grace period is running out now (it ends when the agent comes back)."""
        task = self._grace(agent_id)
        return task is not None and not task.done()

    async def heartbeat(self, agent_id: str) -> None:
        """The agent sends one heartbeat; returns once the manager handled it."""
        agent = self.agent(agent_id)
        await agent.link.report("heartbeat", agent.heartbeat())

    async def send_stats(self, agent_id: str) -> None:
        """The agent samples its kernels and host and sends them (one KernelStats event); returns once the
        manager handled it."""
        agent = self.agent(agent_id)
        await agent.stats_round()
        await agent.link.report("kernel_stats", {})  # (events are handled in order: this one after it)

    async def drain(self, agent_id: str, drained: bool = True) -> None:
        """Drain the agent (as `bai watcher` does: a file in its state dir) and let its heartbeat tell."""
        drain_file = self.nodes[agent_id].state_dir / "drained"
        if drained:
            drain_file.touch()
        else:
            drain_file.unlink(missing_ok=True)
        await self.heartbeat(agent_id)

    # -- keypairs and policies ----------------------------------------------------------------------

    async def policy(self, name: str, **fields: Any) -> str:
        """Create a resource policy (fields as `bai policy create` stores them: max_concurrent_sessions,
        total_resource_slots, idle_timeout, max_session_lifetime, …)."""
        saved = await self.store.save_policy(name, PolicyFields(**fields), create=True, now=self.clock.now())
        assert saved, f"policy {name} exists"
        return name

    async def keypair(self, user: str, policy: str = "default", *, admin: bool = False) -> str:
        """A new keypair (its access key) following `policy`."""
        fresh = Keypair.generate()
        await self.store.create_keypair(
            NewKeypair(fresh.access_key, fresh.secret_key, user, is_admin=admin, resource_policy=policy),
            self.clock.now(),
        )
        return fresh.access_key

    # -- sessions -----------------------------------------------------------------------------------

    async def create(
        self,
        name: str,
        *,
        cpu: float | str | None = 1,
        mem: str | None = "1g",
        type: str = "interactive",
        command: str | None = None,
        image: str = "python",
        owner: str | None = None,
        depends: list[str] | tuple[str, ...] = (),
        starts_at: str | None = None,
        group: str | None = None,
        resources: dict[str, Any] | None = None,
        environ: dict[str, str] | None = None,
        **body: Any,
    ) -> Session:
        """Create a session as the API does (the request body through `parse_create`, then
        `Sessions.create`) and return its row (PENDING until a round places it). `owner`: an access key
        (default: the admin's); `resources` adds slots (cuda.device, …); other keywords go into the body.
        A batch session without `command` runs `true`. The clock moves on by a millisecond."""
        if type == "batch" and command is None:
            command = "true"
        slots: dict[str, Any] = {}
        if cpu is not None:
            slots["cpu"] = str(cpu)
        if mem is not None:
            slots["mem"] = mem
        slots.update(resources or {})
        config: dict[str, Any] = {"resources": slots}
        if group is not None:
            config["scalingGroup"] = group
        if environ:
            config["environ"] = environ
        request = {"name": name, "image": image, "type": type, "config": config, **body}
        if command is not None:
            request["startupCommand"] = command
        if depends:
            request["dependencies"] = list(depends)
        if starts_at is not None:
            request["starts_at"] = starts_at
        owner = owner or self.admin
        keypairs = await self.store.keypairs()
        is_admin = keypairs[owner].is_admin if owner in keypairs else False
        req = parse_create(request, self.agents.known_slots, self.defaults, self.images.aliases, self.clock.now())
        row, _ = await self.lifecycle.create(owner, req, is_admin)
        self.clock.advance(CREATE_STEP)  # as real time would: queue order (FIFO) follows creation order
        return row

    async def schedule(self) -> None:
        """One scheduling round, as the dispatcher's loop runs it when woken (or at its tick). Placed
        sessions start in the background: `wait` for the status a test needs."""
        await self.dispatcher.round()

    async def row(self, ref: str, owner: str | None = None) -> Session:
        """The session's row, by name or id, of `owner` (default: anyone's); ended ones too."""
        return await self.reads.resolve(ref, owner, active_only=False, ids_of=None)  # type: ignore[arg-type]

    async def info(self, ref: str, owner: str | None = None) -> dict[str, Any]:
        """The session as `GET /session/{ref}` shows it (statusInfo, statusData, queuePosition, transitions…)."""
        return await session_json(self.services, await self.row(ref, owner), detail=True)

    async def status(self, ref: str, owner: str | None = None) -> str:
        return (await self.row(ref, owner)).status

    async def transitions(self, ref: str, owner: str | None = None) -> list[str]:
        """The statuses the session went through, in order."""
        row = await self.row(ref, owner)
        return [t.status for t in await self.store.transitions_of(row.id)]

    async def wait(self, ref: str, status: str, timeout: float = WAIT, owner: str | None = None) -> Session:
        """Wait (on the session events, no polling) until the session is in `status`; returns its row.
        Fails at once if it ends in another status first (with its reason), or after `timeout`."""
        target = S(status)
        row = await self.row(ref, owner)

        def done(r: Session) -> bool:
            now = S(r.status)
            return now == target or (now in DEAD_STATUSES and target not in DEAD_STATUSES)

        got = await self.hubs.events.wait_for(row.id, lambda: self.store.get_session(row.id), done, timeout)
        current = got or await self.store.get_session(row.id)
        assert current is not None
        if current.status != target:
            raise AssertionError(
                f"session {ref} is {current.status} ({current.status_info}: {current.status_data}), "
                f"not {target}" + ("" if got else f" after {timeout:g} s")
            )
        return current

    async def until(self, check: Callable[[], Any], timeout: float = WAIT, what: str = "") -> Any:
        """Poll `check()` (sync or async) every few milliseconds until it returns something true; that.
        For what no event announces (use `wait` for statuses)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            value = check()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return value
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"not within {timeout:g} s: {what or check}")
            await asyncio.sleep(0.005)

    async def run(self, name: str, **create: Any) -> Session:
        """Create a session, run a round, and wait until it runs (or, for a batch session, ends)."""
        await self.create(name, **create)
        await self.schedule()
        if create.get("type") == "batch":
            return await self.wait(name, "TERMINATED")
        return await self.wait(name, "RUNNING")

    async def execute(self, ref: str, code: str, *, mode: str = "query", flush: float = 2.0) -> dict[str, Any]:
        """Run code in the session as the API does (one call; a run still going answers `continued`);
        the result as the API shows it (runId, status, console, exitCode)."""
        options = {"exec": code} if mode == "batch" else {}
        result = await self.ops.execute(await self.row(ref), secrets.token_hex(8), mode, code, options, flush)
        to_api = getattr(result, "to_api", None)
        return to_api() if to_api is not None else result

    async def logs(self, ref: str) -> str:
        """What the session's kernel printed, as stored (kernel output reaches the store in the background:
        `until` it shows)."""
        kernel = await self.reads.main_kernel(await self.row(ref))
        return "".join(text for _, text in await self.store.read_logs(kernel.id))

    async def destroy(self, ref: str, *, forced: bool = False, owner: str | None = None) -> None:
        """Destroy the session as `DELETE /session/{ref}` does (waits until a running one has ended)."""
        row = await self.reads.resolve(ref, owner, ids_of=None)  # type: ignore[arg-type]
        await self.lifecycle.destroy(row, forced)

    # -- time -----------------------------------------------------------------------------------------

    def advance(self, seconds: float) -> datetime:
        """Move the clock (the dispatcher's reserved start times and pending timeouts, the timers' idle
        timeouts and lifetimes follow it); nothing runs until `schedule()` or `sweep()`."""
        return self.clock.advance(seconds)

    async def sweep(self) -> None:
        """One pass of the timers (idle timeout, lifetime) at the clock's time. Sessions it ends end in
        the background: `wait` for TERMINATED."""
        await self.timers.sweep(self.clock.now())
