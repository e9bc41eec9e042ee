"""One manager and many simulated agents over ZeroMQ: the manager's cost of heartbeats and of scheduling.

Starts `bai node --role manager` (heartbeats every 5 s, scheduling tick 10 s) and a few agent-host processes,
each running many `Agent` objects with the simulated backend (`bai/node/agent/backends/sim.py`: kernels only
in memory) and their own ZeroMQ link, in one asyncio loop. Prints, measured in one run:

- the manager process's CPU (cores) and RSS at steady state, with only heartbeats
  (target: < 0.3 core with 1,000 agents heartbeating every 5 s), and where that CPU goes (its threads);
- session creates accepted through the API per second, `--concurrency` (64) requests in flight, against the
  same run's API floor: as many signed GETs of a trivial endpoint through the same client (HTTP and the
  signature check), with the manager's CPU per create and per GET (target: creates >= 0.3x that floor, a
  ratio that holds on a busy machine where the figures per second move).
  The client keeps its connections alive (an aiohttp pool of `--concurrency` connections, as a Backend.AI
  client's aiohttp session does), each request signed by bai's client code; `--connection-per-request`
  opens a connection for every request instead, as bai's own client (http.client) does. The sessions start
  and end while later ones are submitted: their CPU is in the creates' figure;
- end-to-end throughput of short batch sessions (`true`, cpu 0.5, submitted enqueue-only with bounded
  concurrency): from the first submission to the last session TERMINATED, and the manager's CPU meanwhile;
- the round trip of a `ping` call over the ZeroMQ link against the in-process link, in this process.

    .venv/bin/python bench/cluster.py [--agents 1000] [--sessions 10000] [--hosts 4] [--concurrency 64]
    .venv/bin/python bench/cluster.py --quick            # 200 agents, 3,000 sessions: about a minute
    .venv/bin/python bench/cluster.py --quick --agents 0 # the creates alone (nothing is placed or started)
    .venv/bin/python bench/cluster.py --quick --profile /tmp/prof   # where the manager's time goes

`--profile DIR` starts the manager through bench/benchnode.py, which profiles it from the first submission
to the last answer (SIGUSR1 / SIGUSR2): cProfile of the event loop's and of the database thread's CPU time,
and a wall-clock sampler of every thread, written to DIR. (The profilers slow the manager: compare their
shares, not the figures of a profiled run.)

At its start the bench lifts the queue bound of the policy its (admin) keypair follows: it sets that policy's
`max_pending_session_count` to 0 (unlimited) through the admin API (`PATCH /bai/admin/policies/NAME`), since
it submits thousands of enqueue-only sessions, more than a policy's default 1000 may have waiting PENDING (its
state folder is its own, made for the run).

Progress goes to stderr, figures to stdout. Every process it starts is stopped at the end (agent hosts also
end when this script dies: they watch their stdin). The end of the session phase is detected by reading the
manager's SQLite database read-only (a COUNT of active sessions every 0.25 s), which costs the manager
nothing, where listing sessions over the API would (one query per listed session); one API listing at the
end confirms that nothing is left active.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.figures import Figure, record  # noqa: E402

ACTIVE = ("PENDING", "SCHEDULED", "PREPARING", "PULLING", "RUNNING", "RUNNING_DEGRADED", "TERMINATING", "ERROR")
API_ACTIVE = "PENDING,SCHEDULED,PREPARING,RUNNING,TERMINATING"
JOIN_BATCH = 50  # agents of one host registering at the same time
STALL = 120.0  # seconds without a change in the count of active sessions: give up
CREATES_TO_FLOOR = 0.3  # target: session creates/s through the API, 64 in flight, ÷ the same run's API floor
QUICK = {"agents": 200, "sessions": 3000, "hosts": 2, "measure": 5.0, "rtt_calls": 300}
QUICK_FLAGS = " ".join(f"--{key.replace('_', '-')} {value:g}" for key, value in QUICK.items())


class BenchFailed(Exception):
    """The benchmark cannot go on; the message says why."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def progress(text: str) -> None:
    print(f"… {text}", file=sys.stderr, flush=True)


def _die_with_parent() -> None:  # runs in the child before exec
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


# -- agent host mode: N agents with simulated kernels in one loop -------------------------------------------


async def host_agents(args: argparse.Namespace) -> None:
    from bai.common import slots as slotlib
    from bai.node.agent.agent import Agent
    from bai.node.agent.backends.sim import SimBackend
    from bai.node.link.zmq import ZmqAgentLink

    slots = slotlib.parse_slots({"cpu": "8", "mem": "32g"})
    agents = []
    for j in range(args.host_agents):
        agent_id = f"sim-{args.index}-{j}"
        link = ZmqAgentLink(
            agent_id,
            args.manager,
            args.manager_key,
            args.join_token,
            heartbeat_interval=args.heartbeat,
            join_timeout=120,
        )
        agents.append(Agent(agent_id, SimBackend(start_delay=0.01), link, dict(slots)))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    def parent_gone() -> None:  # our stdin is the parent's pipe: EOF when it exits, even killed
        if not os.read(sys.stdin.fileno(), 4096):
            loop.remove_reader(sys.stdin.fileno())
            stop.set()

    loop.add_reader(sys.stdin.fileno(), parent_gone)
    started: list[Any] = []
    try:
        for first in range(0, len(agents), JOIN_BATCH):
            batch = agents[first : first + JOIN_BATCH]
            await asyncio.gather(*(a.start() for a in batch))
            started += batch
            if stop.is_set():
                return
        print(f"joined {len(agents)}", flush=True)
        await stop.wait()
    finally:
        results = await asyncio.gather(*(asyncio.wait_for(a.stop(), 15) for a in started), return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            print(f"host {args.index}: {len(failed)} agents did not stop cleanly: {failed[0]!r}", file=sys.stderr)


# -- the submitting client -------------------------------------------------------------------------------


def keepalive_client(creds: Any, connections: int) -> Any:
    """bai's `Client` whose plain requests go over kept-alive connections: an aiohttp session with a pool
    of `connections`, as a long-lived Backend.AI client keeps. Requests are built and signed by the
    client's own code (`Client._path`, `Client._headers`), and answers and errors read as it reads them."""
    import aiohttp
    import yarl

    from bai.client.api import APIError, Client, _error_from

    class KeepAliveClient(Client):
        def __init__(self) -> None:
            super().__init__(creds)
            self._pool: aiohttp.ClientSession | None = None

        async def request(
            self, method: str, path: str, *, json_body: Any = None, params: dict[str, Any] | None = None
        ) -> Any:
            if self._pool is None:
                self._pool = aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(limit=connections, keepalive_timeout=60),
                    timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
                    skip_auto_headers=("User-Agent",),
                )
            full = self.prefix + self._path(path, params)
            body = json.dumps(json_body).encode() if json_body is not None else None
            ctype = "application/json" if json_body is not None else "text/plain"
            headers = self._headers(method, full, ctype)
            url = yarl.URL(f"{self.scheme}://{self.host}{full}", encoded=True)  # exactly the path that was signed
            try:
                async with self._pool.request(method, url, data=body, headers=headers) as resp:
                    data = await resp.read()
                    status, reason = resp.status, resp.reason or ""
            except (aiohttp.ClientError, OSError) as e:
                raise APIError(0, f"cannot reach the manager at {self.endpoint}", str(e)) from None
            if status >= 400:
                raise _error_from(status, reason, data.decode(errors="replace"))
            return json.loads(data) if data and status != 204 else None

        async def close(self) -> None:
            if self._pool is not None:
                await self._pool.close()
            await super().close()

    return KeepAliveClient()


async def unbounded_queue(client: Any) -> str:
    """Let the client's keypair queue any number of sessions: its policy's max_pending_session_count becomes 0
    (unlimited), through the admin API. Returns the policy's name. (For benches that queue more than the
    default 1000 PENDING sessions, on a node of their own.)"""
    access_key = client.creds.access_key
    mine = [k for k in await client.keypairs() if k["accessKey"] == access_key]
    policy = mine[0]["resourcePolicy"] if mine else "default"
    await client.update_policy(policy, max_pending_session_count=0)
    return policy


# -- link round trip, in this process -------------------------------------------------------------------------


class _Manager:
    async def agent_joined(self, agent_id: str, registration: dict[str, Any]) -> dict[str, Any]:
        return {"destroy": []}

    async def agent_event(self, agent_id: str, name: str, payload: dict[str, Any]) -> None:
        pass

    async def agent_left(self, agent_id: str, reason: str) -> None:
        pass


async def _time_calls(link: Any, agent_id: str, calls: int) -> list[float]:
    for _ in range(min(200, calls)):  # warm up
        await link.call(agent_id, "ping", {})
    times = []
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        await link.call(agent_id, "ping", {})
        times.append((time.perf_counter_ns() - t0) / 1000)
    return times


async def link_rtt(tmp: Path, calls: int) -> tuple[float, float]:
    """Median µs of `ping` over ZeroMQ (CURVE, 127.0.0.1) and over the in-process link, same agent code."""
    from bai.common import slots as slotlib
    from bai.node.agent.agent import Agent
    from bai.node.agent.backends.sim import SimBackend
    from bai.node.link.inproc import InprocHub
    from bai.node.link.keys import load_or_create
    from bai.node.link.zmq import ZmqAgentLink, ZmqManagerLink

    slots = slotlib.parse_slots({"cpu": "8", "mem": "32g"})
    secrets = load_or_create(tmp / "rtt")
    manager = ZmqManagerLink("tcp://127.0.0.1:0", secrets)
    await manager.start(_Manager())
    assert manager.endpoint is not None
    link = ZmqAgentLink("rtt-zmq", manager.endpoint, secrets.public_key, secrets.join_token)
    agent = Agent("rtt-zmq", SimBackend(start_delay=0), link, dict(slots))
    try:
        await agent.start()
        zmq_times = await _time_calls(manager, "rtt-zmq", calls)
    finally:
        await agent.stop()
        await manager.close()
    hub = InprocHub()
    await hub.manager.start(_Manager())
    agent = Agent("rtt-inproc", SimBackend(start_delay=0), hub.agent_link("rtt-inproc"), dict(slots))
    try:
        await agent.start()
        inproc_times = await _time_calls(hub.manager, "rtt-inproc", calls)
    finally:
        await agent.stop()
        await hub.manager.close()
    return statistics.median(zmq_times), statistics.median(inproc_times)


# -- the cluster --------------------------------------------------------------------------------------------


class CpuMeter:
    """CPU time of processes between two points, in cores (seconds of CPU per second of wall time)."""

    def __init__(self, procs: list[psutil.Process]) -> None:
        self.procs = procs
        self.t0 = time.perf_counter()
        self.c0 = [self._cpu(p) for p in procs]
        self.threads0 = self._threads(procs[0])

    @staticmethod
    def _cpu(p: psutil.Process) -> float:
        t = p.cpu_times()
        return t.user + t.system

    @staticmethod
    def _threads(p: psutil.Process) -> dict[int, float]:
        return {t.id: t.user_time + t.system_time for t in p.threads()}

    def cores(self) -> tuple[float, list[float]]:
        wall = time.perf_counter() - self.t0
        return wall, [(self._cpu(p) - c) / wall for p, c in zip(self.procs, self.c0, strict=True)]

    def thread_cores(self, wall: float) -> dict[str, float]:
        """The first process's CPU by thread: its event loop, ZeroMQ's I/O threads, and the rest (SQLite)."""
        p = self.procs[0]
        out = {"event loop": 0.0, "zmq I/O": 0.0, "other threads (sqlite)": 0.0}
        for tid, cpu in self._threads(p).items():
            used = (cpu - self.threads0.get(tid, 0.0)) / wall
            if tid == p.pid:
                out["event loop"] += used
                continue
            try:
                name = Path(f"/proc/{p.pid}/task/{tid}/comm").read_text().strip()
            except OSError:
                name = ""
            out["zmq I/O" if name.startswith("ZMQbg") else "other threads (sqlite)"] += used
        return out


class Bench:
    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args = args
        self.tmp = tmp
        self.port = free_port()
        self.link_port = free_port()
        config = tmp / "bai.toml"
        config.write_text(
            f'[link]\nheartbeat_interval = {args.heartbeat}\n[manager]\ntick = 10.0\n[session]\ndefault_mem = "1g"\n'
        )
        self.env = {
            **os.environ,
            "XDG_CONFIG_HOME": str(tmp / "config"),
            "XDG_DATA_HOME": str(tmp / "data"),
            "BAI_CONFIG": str(config),
            "PYTHONUNBUFFERED": "1",
        }
        for key in ("BACKEND_ENDPOINT", "BACKEND_ACCESS_KEY", "BACKEND_SECRET_KEY"):
            self.env.pop(key, None)
        self.db = tmp / "state" / "bai.db"
        self.manager: subprocess.Popen[str] | None = None
        self.hosts: list[subprocess.Popen[str]] = []
        self.lines: list[str] = []

    def say(self, text: str) -> None:
        self.lines.append(text)
        print(text, flush=True)

    # -- processes ------------------------------------------------------------------------------------

    def start_manager(self) -> None:
        log = (self.tmp / "manager.log").open("a")
        launcher = ["-m", "bai"]
        if self.args.profile:  # the same node, with SIGUSR1 / SIGUSR2 starting and stopping its profiler
            launcher = [
                str(ROOT / "bench" / "benchnode.py"),
                "--profile-to",
                str(Path(self.args.profile).resolve()),
                "--",
            ]
        self.manager = subprocess.Popen(
            [
                sys.executable,
                *launcher,
                "node",
                "--role",
                "manager",
                "--listen",
                f"127.0.0.1:{self.port}",
                "--link-listen",
                f"127.0.0.1:{self.link_port}",
                "--state-dir",
                str(self.tmp / "state"),
            ],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=self.env,
            cwd=self.tmp,
            preexec_fn=_die_with_parent,
        )
        assert self.manager.stdout is not None
        for line in self.manager.stdout:
            if line.startswith("ready"):
                return
        raise BenchFailed(f"the manager did not start:\n{(self.tmp / 'manager.log').read_text()[-2000:]}")

    def join_info(self) -> dict[str, str]:
        out = subprocess.run(
            [sys.executable, "-m", "bai", "cluster", "join-info", "--json"],
            capture_output=True,
            text=True,
            env=self.env,
            cwd=self.tmp,
            timeout=60,
            check=True,
        )
        return json.loads(out.stdout)

    def start_hosts(self, info: dict[str, str]) -> list[int]:
        counts = [self.args.agents // self.args.hosts] * self.args.hosts
        for i in range(self.args.agents % self.args.hosts):
            counts[i] += 1
        for index, count in enumerate(counts):
            if not count:
                continue
            log = (self.tmp / f"host{index}.log").open("a")
            self.hosts.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        str(Path(__file__).resolve()),
                        "--host-agents",
                        str(count),
                        "--index",
                        str(index),
                        f"--manager={info['endpoint']}",  # a value may start with "-"
                        f"--manager-key={info['manager_key']}",  # a value may start with "-"
                        f"--join-token={info['join_token']}",  # a value may start with "-"
                        "--heartbeat",
                        str(self.args.heartbeat),
                    ],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    text=True,
                    env=self.env,
                    cwd=self.tmp,
                    preexec_fn=_die_with_parent,
                )
            )
        return [c for c in counts if c]

    def stop_all(self) -> None:
        for proc in self.hosts:  # agents first: they say bye to a manager still there
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in [*self.hosts, self.manager]:
            if proc is None:
                continue
            if proc is self.manager and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(40)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()

    def manager_died(self) -> str:
        """A sentence about the manager's end, when it ended before we stopped it."""
        if self.manager is None or self.manager.poll() is None:
            return ""
        return f"\nthe manager exited with status {self.manager.returncode}:\n{self.tail('manager.log')}"

    def tail(self, name: str) -> str:
        with contextlib.suppress(OSError):
            return (self.tmp / name).read_text()[-1500:]
        return ""

    # -- phases ---------------------------------------------------------------------------------------

    async def wait_joined(self, counts: list[int]) -> None:
        async def one(proc: subprocess.Popen[str], index: int) -> None:
            assert proc.stdout is not None
            line = await asyncio.to_thread(proc.stdout.readline)
            if not line.startswith("joined"):
                raise BenchFailed(f"agent host {index} failed:\n{self.tail(f'host{index}.log')}")

        await asyncio.wait_for(asyncio.gather(*(one(p, i) for i, p in enumerate(self.hosts))), 600)

    async def wait_alive(self, client: Any, expected: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            agents = await client.agents()
            alive = sum(1 for a in agents if a["status"] == "ALIVE")
            if alive >= expected:
                return
            if time.monotonic() > deadline:
                raise BenchFailed(f"only {alive} of {expected} agents are ALIVE after {timeout:g} s")
            await asyncio.sleep(0.5)

    def count_active(self, conn: sqlite3.Connection) -> int:
        marks = ",".join("?" * len(ACTIVE))
        return conn.execute(f"SELECT COUNT(*) FROM sessions WHERE status IN ({marks})", ACTIVE).fetchone()[0]

    async def floor(self, client: Any, total: int) -> float:
        """Signed GETs of a trivial endpoint per second, `--concurrency` in flight, through the same client and
        API as the creates: what HTTP, the client and authentication alone allow (the creates' ceiling)."""
        left = total

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                await client.request("GET", "/manager/announcement")

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(self.args.concurrency)))
        return total / (time.perf_counter() - t0)

    def profile_signal(self, sig: int) -> None:
        if self.args.profile and self.manager is not None and self.manager.poll() is None:
            self.manager.send_signal(sig)

    async def sessions(self, client: Any, manager: psutil.Process, others: list[psutil.Process]) -> dict[str, Any]:
        from bai.client.api import APIError

        total, run = self.args.sessions, os.getpid()
        next_index = 0
        errors: list[str] = []
        submit_end: list[float] = []

        async def worker() -> None:
            nonlocal next_index
            while next_index < total:
                i = next_index
                next_index += 1
                for attempt in range(5):
                    try:
                        await client.create_session(
                            "sim",
                            name=f"cl-{run}-{i:05d}",
                            type="batch",
                            startup_command="true",
                            resources={"cpu": "0.5"},
                            enqueue_only=True,
                        )
                        break
                    except APIError as e:
                        if attempt == 4 or (e.status and e.status < 500):
                            errors.append(str(e))
                            break
                        await asyncio.sleep(0.2 * (attempt + 1))

        conn = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, check_same_thread=False)
        try:
            self.profile_signal(signal.SIGUSR1)
            meter = CpuMeter([manager, *others])
            submit_meter = CpuMeter([manager, *others])
            submit_cores: list[float] = []
            start_wall = time.time()
            workers = [asyncio.create_task(worker()) for _ in range(self.args.concurrency)]
            submitting = asyncio.gather(*workers)
            submitting.add_done_callback(lambda _: submit_end.append(time.perf_counter()))
            last_report = time.perf_counter()
            submitted: float | None = None
            last_change, last_active = time.perf_counter(), -1
            while True:
                await asyncio.sleep(0.25)
                if submitting.done() and submitted is None:
                    submitting.result()
                    submitted = time.perf_counter() - meter.t0
                    _, submit_cores = submit_meter.cores()
                    self.profile_signal(signal.SIGUSR2)
                active = await asyncio.to_thread(self.count_active, conn)
                if submitted is not None and (active == 0 or not self.args.agents):
                    break  # (without agents the sessions stay PENDING: only the creates are measured)
                if active != last_active:
                    last_change, last_active = time.perf_counter(), active
                elif submitted is not None and time.perf_counter() - last_change > STALL:
                    raise BenchFailed(f"{active} sessions made no progress for {STALL:g} s")
                if time.perf_counter() - last_report >= 10:
                    last_report = time.perf_counter()
                    progress(
                        f"{min(next_index, total)} submitted, {active} active, {time.perf_counter() - meter.t0:.0f} s"
                    )
                if errors and len(errors) >= total // 10 + 1:
                    raise BenchFailed(f"too many failed submissions: {errors[:3]}")
            wall, cores = meter.cores()
            threads = meter.thread_cores(wall)
            rows = conn.execute(
                "SELECT status, result, COUNT(*) FROM sessions GROUP BY status, result ORDER BY 3 DESC"
            ).fetchall()
            last_end = conn.execute("SELECT MAX(terminated_at) FROM sessions").fetchone()[0]
            latencies = sorted(
                (datetime.fromisoformat(t) - datetime.fromisoformat(c)).total_seconds()
                for c, t in conn.execute(
                    "SELECT created_at, terminated_at FROM sessions WHERE terminated_at IS NOT NULL"
                )
            )
        finally:
            conn.close()
        left = await client.list_sessions(status=API_ACTIVE)  # the API agrees that nothing is left
        end_to_end = datetime.fromisoformat(last_end).timestamp() - start_wall if last_end else wall
        return {
            "wall": wall,
            "end_to_end": end_to_end,
            "submitted": submit_end[0] - meter.t0 if submit_end else submitted,
            "submit_cores": submit_cores,
            "accepted": total - len(errors),
            "manager_cores": cores[0],
            "other_cores": cores[1:],
            "threads": threads,
            "outcomes": rows,
            "errors": errors,
            "left": len(left),
            "latencies": latencies,
        }

    async def run(self) -> None:
        args = self.args
        t_all = time.perf_counter()
        zmq_us, inproc_us = await link_rtt(self.tmp, args.rtt_calls)
        rtt_s = time.perf_counter() - t_all

        t0 = time.perf_counter()
        self.start_manager()
        info = self.join_info()
        os.environ.update(self.env)
        from bai.client import Client
        from bai.common import credentials

        creds = credentials.load()
        assert creds is not None and self.manager is not None
        manager = psutil.Process(self.manager.pid)
        start_s = time.perf_counter() - t0
        progress(f"manager up in {start_s:.1f} s; starting {args.agents} agents in {args.hosts} processes")

        t0 = time.perf_counter()
        counts = self.start_hosts(info)
        await self.wait_joined(counts)
        hosts = [psutil.Process(p.pid) for p in self.hosts]
        if args.connection_per_request:
            client_cm = Client(creds)
        else:
            client_cm = keepalive_client(creds, args.concurrency)
        async with client_cm as client:
            policy = await unbounded_queue(client)
            progress(f"policy {policy}: max_pending_session_count 0 (unlimited) for the queued sessions")
            await self.wait_alive(client, args.agents)
            join_s = time.perf_counter() - t0
            progress(f"{args.agents} agents ALIVE in {join_s:.1f} s; letting heartbeats settle")

            await asyncio.sleep(args.heartbeat + 1.0)  # every agent has heartbeated since it joined
            t0 = time.perf_counter()
            meter = CpuMeter([manager, *hosts])
            await asyncio.sleep(args.measure)
            wall, cores = meter.cores()
            threads = meter.thread_cores(wall)
            rss = manager.memory_info().rss / 2**20
            alive = sum(1 for a in await client.agents() if a["status"] == "ALIVE")
            steady_s = time.perf_counter() - t0
            self.say(
                f"manager CPU, {args.agents} agents heartbeating every {args.heartbeat:g} s   "
                f"{cores[0]:.3f} cores (target < 0.3; over {wall:.0f} s, {alive} ALIVE at the end)"
            )
            self.say("  by thread: " + ", ".join(f"{name} {value:.3f}" for name, value in threads.items()) + " cores")
            self.say(f"manager RSS   {rss:.1f} MiB")
            self.say(
                f"agent hosts ({len(hosts)} processes, {args.agents} agents) CPU   {sum(cores[1:]):.3f} cores, "
                f"RSS {sum(h.memory_info().rss for h in hosts) / 2**20:.0f} MiB"
            )

            asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(args.concurrency + 8))
            floor_n = min(args.sessions, args.floor_requests)
            progress(f"API floor: {floor_n} signed GET /manager/announcement, {args.concurrency} in flight")
            floor_meter = CpuMeter([manager])
            floor_rps = await self.floor(client, floor_n)
            floor_wall, floor_cores = floor_meter.cores()
            floor_cpu_ms = floor_cores[0] * floor_wall / floor_n * 1000  # manager CPU per request

            progress(f"submitting {args.sessions} batch sessions, {args.concurrency} requests in flight")
            t0 = time.perf_counter()
            res = await self.sessions(client, manager, [*hosts, psutil.Process()])
            sessions_s = time.perf_counter() - t0
            rss_after = manager.memory_info().rss / 2**20
            alive_after = sum(1 for a in await client.agents() if a["status"] == "ALIVE")

        n = sum(count for _, _, count in res["outcomes"])  # the sessions created (submissions may fail)
        outcomes = ", ".join(f"{count} {status}/{result}" for status, result, count in res["outcomes"])
        lat = res["latencies"]
        creates = res["accepted"] / res["submitted"]
        ratio = creates / floor_rps
        verdict = "MET" if ratio >= CREATES_TO_FLOOR else "MISSED"
        record(
            Figure(
                f"API creates, sim, {args.concurrency} in flight, {args.agents} agents ÷ signed-GET floor of the "
                "same run",
                creates,
                "/s",
                f"signed GET /manager/announcement, {args.concurrency} in flight, same client",
                floor_rps,
                f">= {CREATES_TO_FLOOR:g}x",
                ratio >= CREATES_TO_FLOOR,
            )
        )
        conn_mode = "a connection per request" if args.connection_per_request else "kept-alive connections"
        self.say(
            f"session creates through the API, {args.concurrency} in flight (sim, {args.agents} agents)   "
            f"{creates:.0f} creates/s, {ratio:.2f}x the API floor below (target >= {CREATES_TO_FLOOR:g}x: {verdict}; "
            f"{res['accepted']} accepted in {res['submitted']:.1f} s)"
        )
        self.say(
            f"  same run, API floor (signed GET /manager/announcement, {args.concurrency} in flight, same client, "
            f"{conn_mode})   "
            f"{floor_rps:.0f} requests/s; creates reach {ratio:.0%} of it"
        )
        if res["submit_cores"]:
            sc = res["submit_cores"]
            create_cpu_ms = sc[0] * res["submitted"] / res["accepted"] * 1000
            self.say(
                f"  manager CPU per create {create_cpu_ms:.2f} ms (the sessions' starts and ends meanwhile "
                f"included), per floor GET {floor_cpu_ms:.2f} ms"
            )
            self.say(
                f"  while submitting: manager {sc[0]:.2f} cores, agent hosts {sum(sc[1:-1]):.2f}, this client "
                f"{sc[-1]:.2f} (machine: {psutil.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f})"
            )
        if args.profile:
            self.say(
                f"  manager profile of the submission phase: {Path(args.profile).resolve()}/(cprofile|samples).txt"
            )
        self.say(
            f"{n} batch sessions end to end   {n / res['end_to_end']:.1f} sessions/s ({res['end_to_end']:.1f} s; "
            f"all submitted after {res['submitted']:.1f} s)"
        )
        self.say(f"  outcomes: {outcomes}; submission errors {len(res['errors'])}; still active (API) {res['left']}")
        if lat:
            self.say(
                f"  per session created -> TERMINATED: median {statistics.median(lat) * 1000:.0f} ms, "
                f"p99 {lat[int(len(lat) * 0.99) - 1] * 1000:.0f} ms"
            )
        self.say(f"manager CPU while scheduling   {res['manager_cores']:.3f} cores (over {res['wall']:.0f} s)")
        self.say(
            "  by thread: " + ", ".join(f"{name} {value:.3f}" for name, value in res["threads"].items()) + " cores"
        )
        self.say(
            f"  meanwhile: agent hosts {sum(res['other_cores'][:-1]):.3f} cores, this client "
            f"{res['other_cores'][-1]:.3f} cores (machine: {psutil.cpu_count()} CPUs)"
        )
        self.say(f"manager RSS after the sessions   {rss_after:.1f} MiB; {alive_after} agents ALIVE")
        self.say(
            f"link RTT ping: zmq {zmq_us:.0f} µs, in-process {inproc_us:.1f} µs "
            f"(ratio {zmq_us / inproc_us:.0f}×; median of {args.rtt_calls} calls each)"
        )
        self.say(
            f"phases: link RTT {rtt_s:.1f} s, manager start {start_s:.1f} s, {args.agents} agents join {join_s:.1f} s, "
            f"steady state {steady_s:.1f} s, sessions {sessions_s:.1f} s, total {time.perf_counter() - t_all:.1f} s"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, default=1000, help="simulated agents (default 1000)")
    ap.add_argument("--sessions", type=int, default=10000, help="short batch sessions (default 10000)")
    ap.add_argument("--hosts", type=int, default=4, help="agent-host processes (default 4)")
    ap.add_argument("--concurrency", type=int, default=64, help="session submissions in flight (default 64)")
    ap.add_argument("--heartbeat", type=float, default=5.0, help="agents' heartbeat interval, s (default 5)")
    ap.add_argument("--measure", type=float, default=15.0, help="steady-state CPU window, s (default 15)")
    ap.add_argument("--rtt-calls", type=int, default=2000, help="ping calls per link (default 2000)")
    ap.add_argument(
        "--floor-requests",
        type=int,
        default=2000,
        help="signed GETs of the API floor (default 2000, at most --sessions)",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help=f"a short run (about a minute): {QUICK_FLAGS}",
    )
    ap.add_argument(
        "--profile",
        metavar="DIR",
        help="profile the manager during the submission phase (cProfile of its event loop and a sampler of every "
        "thread), reports written to DIR",
    )
    ap.add_argument(
        "--connection-per-request",
        action="store_true",
        help="open a connection for every request (bai's client) instead of keeping a pool alive",
    )
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, database)")
    # agent-host mode (started by the benchmark itself)
    ap.add_argument("--host-agents", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--manager", help=argparse.SUPPRESS)
    ap.add_argument("--manager-key", help=argparse.SUPPRESS)
    ap.add_argument("--join-token", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.host_agents is not None:
        asyncio.run(host_agents(args))
        return
    if args.quick:  # what the command line says explicitly wins
        given = {a.split("=")[0] for a in sys.argv[1:] if a.startswith("--")}
        for key, value in QUICK.items():
            if f"--{key.replace('_', '-')}" not in given:
                setattr(args, key, value)

    tmp = Path(tempfile.mkdtemp(prefix="bai-bench-cluster-"))
    bench = Bench(args, tmp)
    try:
        asyncio.run(bench.run())
    except BenchFailed as e:
        raise SystemExit(f"bench/cluster.py: {e}{bench.manager_died()}") from None
    except Exception:
        print(f"bench/cluster.py failed{bench.manager_died()}", file=sys.stderr)
        raise
    finally:
        bench.stop_all()
        if args.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
