"""Which PostgreSQL driver for the manager's state: psycopg 3 (sync, one thread, group commit) against psycopg 3
async and asyncpg (pools, one transaction per call), measured in one run on one server.

The PostgreSQL engine reuses the SQLite engine's design (bai/node/manager/state/sqlite/db.py): one connection
driven from a thread of its own, the same SQL (`?` -> `%s`), transactions queued while the thread was busy
committed together in one BEGIN … COMMIT, each taking `pg_advisory_xact_lock` first so that several manager
processes on one database serialize their writes as SQLite does. The alternative is asyncpg's pool.

Prints, on a schema shaped like bai's (sessions of 20 columns, kernels of 17, session_transitions of 5; TEXT
COLLATE "C", BIGINT, JSON as TEXT):
1. creates/s: "create a session" = one transaction: INSERT sessions … RETURNING * (seq = MAX(seq) + 1, as
   bai's), INSERT session_transitions, INSERT kernels … RETURNING *; 64 in flight (asyncio tasks), 3000 timed
   (after 100 to warm up), on a fresh database each, for
   a. psycopg sync connection in one thread, group commit (what was queued: BEGIN, lock, all, COMMIT; the
      answers reach the event loop in one call_soon_threadsafe), with the advisory lock;
   b. psycopg AsyncConnection × POOL by hand (psycopg_pool is not installed), one transaction each, the lock;
   c. asyncpg pool of POOL, one transaction each, the lock;
   d. (a) and (c) without the lock, for the record (no lock: MAX(seq) + 1 races, duplicate seqs are counted);
   with the median and 99th percentile of one create's latency, and ratios vs (a);
2. reads/s: SELECT * FROM sessions ORDER BY seq LIMIT 500 as dicts, 200 one after the other, per driver;
3. import time (best of 5 fresh processes, bytecode as users have it: PYTHONDONTWRITEBYTECODE unset) and RSS
   each driver adds to a process that has asyncio, json and psutil loaded already.

The server is started here with tests/pgserver.py's code but durable settings (fsync, synchronous_commit and
full_page_writes on): the tests' server is started with `-c fsync=off` and the like, and a command-line setting
outranks ALTER SYSTEM (pg_settings says source "command line" after ALTER SYSTEM SET fsync=on and a reload).
`--fsync-off` runs on the tests' server as it is.

    .venv/bin/python bench/pg_drivers.py [--fsync-off] [--creates 3000] [--in-flight 64] [--reads 200] [--rounds 2]

Seen on the 2-cpu dev VM (PostgreSQL 15.18, fsync/synchronous_commit/full_page_writes on, pg_test_fsync
~150 µs per fdatasync; psycopg 3.3.9 binary, asyncpg 0.32.0; the cpus shared with other work, load average
about 4), one run of 67 s:
  a   psycopg sync, 1 thread, group commit, lock        1185 creates/s   1.00x  p50   53.9 ms  p99   87.7 ms
  b   psycopg async × 10, tx each, lock                  628 creates/s   0.53x  p50   97.1 ms  p99  194.2 ms
  c   asyncpg pool of 10, tx each, lock                  612 creates/s   0.52x  p50   99.7 ms  p99  178.3 ms
  d-a psycopg sync, 1 thread, group commit, NO lock     1414 creates/s   1.19x  p50   43.4 ms  p99  108.9 ms
  d-c asyncpg pool of 10, tx each, NO lock              1490 creates/s   1.26x  p50   41.6 ms  p99  131.4 ms
  (a: 38.2 transactions per COMMIT; d-c: 3100 sessions but 462 distinct seqs: MAX(seq) + 1 raced)
  reads/s: a 341 (1.00x), b 474 (1.39x), c 429 (1.26x)
  import: psycopg 75.7 ms +13.3 MiB RSS, asyncpg 20.7 ms +4.4 MiB RSS
Over four runs (load 1 to 9; the first with (b) on an asyncio.Queue) the locked variants kept their order, (a)
at 1185 to 1901 creates/s, (b) and (c) at 0.12x to 0.53x of it: the lock lets one transaction at a time through,
its COMMIT's fsync included, and the busier the cpus the longer each holder takes. The unlocked figures and the
reads moved by ±40 % between runs (reads: (a) first in two runs, second and third in the others): no driver reads
decisively faster here.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from queue import SimpleQueue
from typing import Any

import asyncpg
import psycopg
from psycopg.rows import dict_row

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests import pgserver  # noqa: E402
from tests.pgserver import PostgresServer  # noqa: E402

POOL = 10  # connections of (b) and (c): asyncpg's default pool size
MAX_GROUP = 256  # transactions one COMMIT takes at most, as db.py's
WARM = 100  # creates before the timed ones, on each variant's database
LOCK_KEY = 0x626169  # "bai"

SCHEMA = """
CREATE TABLE sessions (
    id TEXT COLLATE "C" PRIMARY KEY,
    name TEXT COLLATE "C" NOT NULL,
    access_key TEXT COLLATE "C" NOT NULL,
    image TEXT COLLATE "C" NOT NULL,
    type TEXT COLLATE "C" NOT NULL,
    status TEXT COLLATE "C" NOT NULL,
    status_info TEXT COLLATE "C" NOT NULL DEFAULT '',
    status_data TEXT COLLATE "C" NOT NULL DEFAULT '{}',
    status_changed TEXT COLLATE "C" NOT NULL,
    requested_slots TEXT COLLATE "C" NOT NULL,
    environ TEXT COLLATE "C" NOT NULL DEFAULT '{}',
    config TEXT COLLATE "C" NOT NULL DEFAULT '{}',
    scaling_group TEXT COLLATE "C" NOT NULL DEFAULT 'default',
    cluster_size BIGINT NOT NULL DEFAULT 1,
    tag TEXT COLLATE "C",
    result TEXT COLLATE "C" NOT NULL DEFAULT 'UNDEFINED',
    created_at TEXT COLLATE "C" NOT NULL,
    terminated_at TEXT COLLATE "C",
    seq BIGINT NOT NULL,
    started_at TEXT COLLATE "C"
);
CREATE INDEX sessions_status ON sessions(status, seq);
CREATE INDEX sessions_name ON sessions(access_key, name);
CREATE INDEX sessions_owner_status ON sessions(access_key, status);
CREATE INDEX sessions_seq ON sessions(seq);
CREATE TABLE session_transitions (
    session_id TEXT COLLATE "C" NOT NULL,
    status TEXT COLLATE "C" NOT NULL,
    status_info TEXT COLLATE "C" NOT NULL,
    status_data TEXT COLLATE "C" NOT NULL,
    at TEXT COLLATE "C" NOT NULL
);
CREATE INDEX transitions_session ON session_transitions(session_id);
CREATE TABLE kernels (
    id TEXT COLLATE "C" PRIMARY KEY,
    session_id TEXT COLLATE "C" NOT NULL,
    cluster_role TEXT COLLATE "C" NOT NULL,
    cluster_idx BIGINT NOT NULL,
    image TEXT COLLATE "C" NOT NULL,
    agent_id TEXT COLLATE "C",
    container_id TEXT COLLATE "C",
    status TEXT COLLATE "C" NOT NULL,
    status_info TEXT COLLATE "C" NOT NULL DEFAULT '',
    status_changed TEXT COLLATE "C" NOT NULL,
    occupied_slots TEXT COLLATE "C" NOT NULL,
    exit_code BIGINT,
    created_at TEXT COLLATE "C" NOT NULL,
    terminated_at TEXT COLLATE "C",
    devices TEXT COLLATE "C" NOT NULL DEFAULT '[]',
    service_ports TEXT COLLATE "C" NOT NULL DEFAULT '[]',
    last_stat TEXT COLLATE "C"
);
CREATE INDEX kernels_session ON kernels(session_id);
CREATE INDEX kernels_status ON kernels(status, agent_id);
"""

# the SQL as bai writes it for SQLite (`?`), translated for each driver
INSERT_SESSION = (
    "INSERT INTO sessions(id, name, access_key, image, type, status, status_info, status_data, "
    "status_changed, requested_slots, environ, config, scaling_group, cluster_size, tag, "
    "created_at, seq) VALUES (?, ?, ?, ?, ?, 'PENDING', '', '{}', ?, ?, ?, ?, ?, ?, ?, ?, "
    "(SELECT COALESCE(MAX(seq), 0) + 1 FROM sessions)) RETURNING *"
)
INSERT_TRANSITION = "INSERT INTO session_transitions VALUES (?, 'PENDING', '', '{}', ?)"
INSERT_KERNEL = (
    "INSERT INTO kernels(id, session_id, cluster_role, cluster_idx, image, status, "
    "status_changed, occupied_slots, created_at) VALUES (?, ?, ?, ?, ?, 'PENDING', ?, ?, ?) RETURNING *"
)
READ = "SELECT * FROM sessions ORDER BY seq LIMIT 500"
LOCK = f"SELECT pg_advisory_xact_lock({LOCK_KEY})"


def to_psycopg(sql: str) -> str:
    return sql.replace("?", "%s")


def to_asyncpg(sql: str) -> str:
    parts = sql.split("?")
    return parts[0] + "".join(f"${i}{part}" for i, part in enumerate(parts[1:], 1))


PG_SESSION, PG_TRANSITION, PG_KERNEL = map(to_psycopg, (INSERT_SESSION, INSERT_TRANSITION, INSERT_KERNEL))
APG_SESSION, APG_TRANSITION, APG_KERNEL = map(to_asyncpg, (INSERT_SESSION, INSERT_TRANSITION, INSERT_KERNEL))


def new_session(i: int) -> tuple[tuple[Any, ...], tuple[Any, ...], tuple[Any, ...]]:
    """The parameters of one create: (session, transition, kernel)."""
    sid = uuid.uuid4().hex
    now = datetime.now(UTC).isoformat()
    slots = json.dumps({"cpu": "1", "mem": "1073741824", "cuda.shares": "0.5"})
    environ = json.dumps({"HOME": "/home/work", "LANG": "C.UTF-8", "BAI_RUN": f"run-{i}"})
    config = json.dumps({"mounts": [], "startup_command": None, "bootstrap_script": "", "preopen_ports": []})
    image = "cr.backend.ai/stable/python:3.11-ubuntu22.04"
    session: tuple[Any, ...] = (sid, f"s-{i}", f"AKIABENCH{i % 10}", image, "interactive", now, slots, environ)
    session += (config, "default", 1, None, now)
    kernel = (uuid.uuid4().hex, sid, "main", 1, image, now, slots, now)
    return session, (sid, now), kernel


# --- (a) psycopg sync, one thread, group commit --------------------------------------------------------------

Call = tuple["asyncio.Future[Any]", Callable[[psycopg.Connection[Any]], Any], bool]  # (future, fn, in a transaction)


def _answer(answers: list[tuple[asyncio.Future[Any], bool, Any]]) -> None:
    for future, failed, value in answers:
        if not future.done():
            if failed:
                future.set_exception(value)
            else:
                future.set_result(value)


class GroupCommit:
    """One psycopg connection in a thread of its own: calls in the order queued; consecutive transactions taken
    from the queue at once run in ONE BEGIN, [advisory lock,] fn, fn, … COMMIT (as db.py's; a failure here
    fails the whole group, where db.py runs the others again: the bench has none)."""

    def __init__(self, url: str, lock: bool) -> None:
        self.conn = psycopg.connect(url, autocommit=True, row_factory=dict_row)
        self.lock = lock
        self.calls: SimpleQueue[Call | None] = SimpleQueue()
        self.groups = self.grouped = 0  # COMMITs of more than one transaction, and the transactions in them
        self.thread = threading.Thread(target=self._serve, name="pg", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            batch = [self.calls.get()]
            while len(batch) < MAX_GROUP and not self.calls.empty():
                batch.append(self.calls.get())
            calls = [c for c in batch if c is not None]
            i = 0
            while i < len(calls):
                j = i + 1
                while j < len(calls) and calls[j][2] == calls[i][2]:
                    j += 1
                run = calls[i:j]
                answers = self._group(run) if run[0][2] else [self._alone(c) for c in run]
                run[0][0].get_loop().call_soon_threadsafe(_answer, answers)
                i = j
            if len(calls) < len(batch):
                self.conn.close()
                return

    def _alone(self, call: Call) -> tuple[asyncio.Future[Any], bool, Any]:
        try:
            return call[0], False, call[1](self.conn)
        except Exception as e:  # noqa: BLE001 (handed to the caller)
            return call[0], True, e

    def _group(self, run: list[Call]) -> list[tuple[asyncio.Future[Any], bool, Any]]:
        conn = self.conn
        try:
            conn.execute("BEGIN")
            if self.lock:
                conn.execute(LOCK)
            results = [fn(conn) for _, fn, _ in run]
            conn.execute("COMMIT")
        except Exception as e:  # noqa: BLE001 (handed to the callers)
            conn.execute("ROLLBACK")
            return [(future, True, e) for future, _, _ in run]
        if len(run) > 1:
            self.groups += 1
            self.grouped += len(run)
        return [(future, False, r) for (future, _, _), r in zip(run, results, strict=True)]

    def run(self, fn: Callable[[psycopg.Connection[Any]], Any], transaction: bool = False) -> asyncio.Future[Any]:
        future = asyncio.get_running_loop().create_future()
        self.calls.put((future, fn, transaction))
        return future

    def close(self) -> None:
        self.calls.put(None)
        self.thread.join()


def create_sync(i: int) -> Callable[[psycopg.Connection[Any]], Any]:
    session, transition, kernel = new_session(i)

    def fn(conn: psycopg.Connection[Any]) -> Any:
        s = conn.execute(PG_SESSION, session).fetchone()
        conn.execute(PG_TRANSITION, transition)
        k = conn.execute(PG_KERNEL, kernel).fetchone()
        return s, k

    return fn


# --- the variants: each an async "create i" and an async "read", with what it holds ---------------------------


class Variant:
    """One driver shape: a "create a session" and a read, over what `open` made."""

    name = ""

    async def open(self, url: str) -> None:
        raise NotImplementedError

    async def create(self, i: int) -> Any:
        raise NotImplementedError

    async def read(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError


class SyncThread(Variant):
    def __init__(self, lock: bool) -> None:
        self.lock = lock
        self.name = f"psycopg sync, 1 thread, group commit{', lock' if lock else ', NO lock'}"

    async def open(self, url: str) -> None:
        self.db = await asyncio.to_thread(GroupCommit, url, self.lock)

    async def create(self, i: int) -> Any:
        return await self.db.run(create_sync(i), transaction=True)

    async def read(self) -> list[dict[str, Any]]:
        return await self.db.run(lambda conn: conn.execute(READ).fetchall())  # type: ignore[no-any-return]

    async def close(self) -> None:
        await asyncio.to_thread(self.db.close)


class FairPool:
    """Connections handed out first come, first served: a released one goes straight to the longest waiter (an
    asyncio.Queue lets the task that just released one take it back at once, starving the others: p99 of 5 s)."""

    def __init__(self, conns: list[psycopg.AsyncConnection[Any]]) -> None:
        self.free = collections.deque(conns)
        self.waiters: collections.deque[asyncio.Future[psycopg.AsyncConnection[Any]]] = collections.deque()

    async def get(self) -> psycopg.AsyncConnection[Any]:
        if self.free and not self.waiters:
            return self.free.popleft()
        waiter: asyncio.Future[psycopg.AsyncConnection[Any]] = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        return await waiter

    def put(self, conn: psycopg.AsyncConnection[Any]) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        self.free.append(conn)


class PsycopgAsync(Variant):
    def __init__(self, lock: bool) -> None:
        self.lock = lock
        self.name = f"psycopg async × {POOL}, tx each{', lock' if lock else ', NO lock'}"

    async def open(self, url: str) -> None:
        self.conns = [
            await psycopg.AsyncConnection.connect(url, autocommit=True, row_factory=dict_row) for _ in range(POOL)
        ]
        self.pool = FairPool(self.conns)

    async def create(self, i: int) -> Any:
        session, transition, kernel = new_session(i)
        conn = await self.pool.get()
        try:
            async with conn.transaction():
                if self.lock:
                    await conn.execute(LOCK)
                s = await (await conn.execute(PG_SESSION, session)).fetchone()
                await conn.execute(PG_TRANSITION, transition)
                k = await (await conn.execute(PG_KERNEL, kernel)).fetchone()
            return s, k
        finally:
            self.pool.put(conn)

    async def read(self) -> list[dict[str, Any]]:
        conn = await self.pool.get()
        try:
            return await (await conn.execute(READ)).fetchall()
        finally:
            self.pool.put(conn)

    async def close(self) -> None:
        for c in self.conns:
            await c.close()


class AsyncpgPool(Variant):
    def __init__(self, lock: bool) -> None:
        self.lock = lock
        self.name = f"asyncpg pool of {POOL}, tx each{', lock' if lock else ', NO lock'}"

    async def open(self, url: str) -> None:
        self.pool = await asyncpg.create_pool(url, min_size=POOL, max_size=POOL)

    async def create(self, i: int) -> Any:
        session, transition, kernel = new_session(i)
        async with self.pool.acquire() as conn, conn.transaction():
            if self.lock:
                await conn.execute(LOCK)
            s = dict(await conn.fetchrow(APG_SESSION, *session))
            await conn.execute(APG_TRANSITION, *transition)
            k = dict(await conn.fetchrow(APG_KERNEL, *kernel))
        return s, k

    async def read(self) -> list[dict[str, Any]]:
        async with self.pool.acquire() as conn:
            return [dict(r) for r in await conn.fetch(READ)]

    async def close(self) -> None:
        await self.pool.close()


# --- measuring -------------------------------------------------------------------------------------------------


async def in_flight(create: Callable[[int], Awaitable[Any]], start: int, count: int, width: int) -> list[float]:
    """`count` creates, `width` at a time (one task each, taking the next number); each one's latency."""
    numbers = iter(range(start, start + count))
    latencies: list[float] = []

    async def worker() -> None:
        for i in numbers:
            t = time.perf_counter()
            await create(i)
            latencies.append(time.perf_counter() - t)

    await asyncio.gather(*(worker() for _ in range(width)))
    return latencies


async def creates(variant: Variant, url: str, count: int, width: int) -> dict[str, Any]:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SCHEMA)
    await variant.open(url)
    try:
        await in_flight(variant.create, 0, WARM, width)
        if isinstance(variant, SyncThread):
            variant.db.groups = variant.db.grouped = 0
        t = time.perf_counter()
        latencies = await in_flight(variant.create, WARM, count, width)
        wall = time.perf_counter() - t
        group = variant.db.grouped / variant.db.groups if isinstance(variant, SyncThread) and variant.db.groups else 0
    finally:
        await variant.close()
    with psycopg.connect(url) as conn:
        counts = conn.execute(
            "SELECT (SELECT count(*) FROM sessions), (SELECT count(*) FROM kernels), "
            "(SELECT count(*) FROM session_transitions), (SELECT count(*) - count(DISTINCT seq) FROM sessions)"
        ).fetchone()
    assert counts is not None
    n = WARM + count
    if counts[:3] != (n, n, n):
        raise SystemExit(f"{variant.name}: stored {counts[:3]}, expected {n} each")
    latencies.sort()
    return {
        "rate": count / wall,
        "p50": statistics.median(latencies),
        "p99": latencies[int(len(latencies) * 0.99)],
        "dup_seq": counts[3],
        "group": group,
    }


async def reads(variants: list[Variant], url: str, count: int, rounds: int, stored: int) -> list[float]:
    """Each variant's best reads/s over `rounds` rounds of count/rounds reads one after the other, the variants
    taking turns (so that the machine's other load falls on all of them alike)."""
    for variant in variants:
        await variant.open(url)
    try:
        best = [0.0] * len(variants)
        for _ in range(rounds):
            for v, variant in enumerate(variants):
                rows = await variant.read()
                assert len(rows) == min(500, stored) and isinstance(rows[0], dict) and rows[0]["seq"] == 1, rows[0]
                t = time.perf_counter()
                for _ in range(count // rounds):
                    await variant.read()
                best[v] = max(best[v], count // rounds / (time.perf_counter() - t))
        return best
    finally:
        for variant in variants:
            await variant.close()


IMPORT = """
import asyncio, json, time, psutil
p = psutil.Process()
r0 = p.memory_info().rss
t0 = time.perf_counter()
import {module}
t1 = time.perf_counter()
print(t1 - t0, p.memory_info().rss - r0)
"""


def import_cost(module: str, runs: int = 5) -> tuple[float, float]:
    """(best import seconds, median RSS bytes added) over fresh processes, bytecode as users have it."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    seen = []
    for _ in range(runs + 1):  # (the first one may write the bytecode)
        out = subprocess.run(
            [sys.executable, "-c", IMPORT.format(module=module)], env=env, capture_output=True, text=True, check=True
        )
        seconds, rss = out.stdout.split()
        seen.append((float(seconds), float(rss)))
    seen = seen[1:]
    return min(s for s, _ in seen), statistics.median(r for _, r in seen)


def start_durable() -> PostgresServer:
    """A server as tests/pgserver.py starts one for the tests, with fsync and full_page_writes on."""
    if not pgserver.available():
        raise SystemExit("PostgreSQL is not installed (Debian: apt-get install postgresql)")
    return PostgresServer.start(durable=True)


async def measure(server: PostgresServer, args: argparse.Namespace) -> None:
    with psycopg.connect(server.admin_url) as conn:
        settings = conn.execute(
            "SELECT string_agg(name || '=' || setting, ', ' ORDER BY name) FROM pg_settings "
            "WHERE name IN ('fsync', 'synchronous_commit', 'full_page_writes', 'server_version')"
        ).fetchone()
    assert settings is not None
    print(
        f"server: {settings[0]}; psycopg {psycopg.__version__} ({psycopg.pq.__impl__}), asyncpg {asyncpg.__version__}"
    )
    variants: list[tuple[str, Variant]] = [
        ("a", SyncThread(lock=True)),
        ("b", PsycopgAsync(lock=True)),
        ("c", AsyncpgPool(lock=True)),
        ("d-a", SyncThread(lock=False)),
        ("d-c", AsyncpgPool(lock=False)),
    ]
    print(
        f"\n1. creates: 1 transaction of 3 INSERTs … RETURNING, {args.in_flight} in flight, {args.creates} timed; "
        f"best of {args.rounds} rounds (the variants taking turns, a fresh database each)"
    )
    urls: dict[str, str] = {}
    best: dict[str, dict[str, Any]] = {}
    for r in range(args.rounds):
        for key, variant in variants:
            urls[key] = url = server.new_database(f"create_{key.replace('-', '_')}_{r}")
            got = await creates(variant, url, args.creates, args.in_flight)
            if key not in best or got["rate"] > best[key]["rate"]:
                best[key] = got
    base = best["a"]["rate"]
    for key, variant in variants:
        got = best[key]
        extra = f", {got['group']:.1f} tx/COMMIT" if got["group"] else ""
        extra += f", {got['dup_seq']} duplicate seq" if got["dup_seq"] else ""
        print(
            f"  {key:<4}{variant.name:<46}{got['rate']:>8.0f} creates/s  {got['rate'] / base:5.2f}x  "
            f"p50 {got['p50'] * 1000:6.1f} ms  p99 {got['p99'] * 1000:6.1f} ms{extra}"
        )
    print(f"  (load average at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus)")
    print(f"\n2. reads: {READ} as dicts, {args.reads} one after the other; best of 4 rounds (taking turns)")
    rates = await reads([variant for _, variant in variants[:3]], urls["a"], args.reads, 4, WARM + args.creates)
    for (key, variant), rate in zip(variants[:3], rates, strict=True):
        print(f"  {key:<4}{variant.name.rsplit(',', 1)[0]:<46}{rate:>8.0f} reads/s    {rate / rates[0]:5.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fsync-off", action="store_true", help="the tests' server as it is (fsync off)")
    ap.add_argument("--creates", type=int, default=3000)
    ap.add_argument("--in-flight", type=int, default=64)
    ap.add_argument("--reads", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=2, help="of the creates")
    args = ap.parse_args()
    server = PostgresServer.start() if args.fsync_off else start_durable()
    try:
        asyncio.run(measure(server, args))
    finally:
        server.stop()
    print("\n3. import into a process with asyncio, json, psutil loaded (best of 5 fresh ones; RSS median)")
    for module in ("psycopg", "asyncpg"):
        seconds, rss = import_cost(module)
        print(f"  {module:<10}{seconds * 1000:6.1f} ms  +{rss / 2**20:5.1f} MiB RSS")


if __name__ == "__main__":
    main()
