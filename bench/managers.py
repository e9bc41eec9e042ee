"""Managers on PostgreSQL against one manager on SQLite, and a leader's failover, measured in one run.

- session creates accepted through the API, `--concurrency` (64) in flight, enqueue-only batch sessions of a
  node with the simulated backend: one node on SQLite, the same on PostgreSQL (ratio, target >= 0.6x and
  >= 300/s), and the same PostgreSQL database served by two managers with the creates spread over both
  (ratio to one manager on PostgreSQL, target >= 1.3x);
- failover: two managers, the leader killed (-9); seconds until the other holds the lease, and until a session
  created through it is scheduled (its next scheduling round), target <= 10 s; `--failovers N` (5) of them,
  creating sessions all along, then the sessions counted: none lost, none twice (target 0).

    .venv/bin/python bench/managers.py [--sessions 2000] [--concurrency 64] [--failovers 5] [--rounds 3]

Each round measures the three one after the other; the ratios are taken within a round (this machine's speed
drifts from one minute to the next: one round alone varied 190-310/s) and their median is reported.

The PostgreSQL server is Debian's, started by the bench in a folder of its own with fsync on (the figures of a
durable database), on 127.0.0.1. Each phase's nodes are stopped before the next starts. Figures go to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.benchnode import BenchNode, free_port, start_node  # noqa: E402
from bench.cluster import keepalive_client, unbounded_queue  # noqa: E402
from tests.pgserver import PostgresServer  # noqa: E402

CONFIG = '[agent]\ncpu = "1000"\nmem = "4096g"\n[manager]\ntick = 1.0\n'


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def creds_of(node: BenchNode) -> Any:
    """The node's admin credentials (saved in its state folder, or its own user configuration)."""
    import tomllib

    from bai.common.credentials import Credentials

    for path in (node.folder / "state" / "credentials.toml", node.folder / "config" / "bai" / "credentials.toml"):
        if path.exists():
            data = tomllib.loads(path.read_text())
            return Credentials(f"http://127.0.0.1:{node.port}", data["access_key"], data["secret_key"])
    raise SystemExit(f"no credentials of the node in {node.folder}")


async def creates(nodes: list[BenchNode], total: int, concurrency: int, tag: str) -> tuple[float, list[str]]:
    """Creates per second, spread over `nodes` round-robin; and the names accepted."""
    from bai.client.api import APIError

    clients = [keepalive_client(creds_of(n), concurrency) for n in nodes]
    await unbounded_queue(clients[0])
    accepted: list[str] = []
    next_index = 0

    async def worker(w: int) -> None:
        nonlocal next_index
        while next_index < total:
            i = next_index
            next_index += 1
            client = clients[i % len(clients)]
            name = f"{tag}-{i:05d}"
            try:
                await client.create_session(
                    "sim", name=name, type="batch", startup_command="true", resources={"cpu": "0.1"},
                    enqueue_only=True,
                )  # fmt: skip
                accepted.append(name)
            except APIError as e:
                progress(f"create {name}: {e}")

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    rate = len(accepted) / (time.perf_counter() - t0)
    for c in clients:
        await c.close()
    return rate, accepted


def manager_node(url: str, link_dir: Path | None = None, role: str = "all") -> BenchNode:
    extra = ["--database", url, "--link-listen", f"127.0.0.1:{free_port()}"]
    if role != "all":
        extra = ["--role", role, *extra]
    return start_node(CONFIG, "sim", *extra)


async def status(node: BenchNode) -> dict[str, Any]:
    from bai.client import Client

    async with Client(creds_of(node)) as client:
        return await client.manager_status()


async def failover(server: PostgresServer, rounds: int, concurrency: int) -> dict[str, Any]:
    url = server.new_database("failover")
    nodes = [manager_node(url), manager_node(url)]
    started = list(nodes)  # (every one, the killed ones too: their folders are removed at the end)
    took_lead: list[float] = []
    took_round: list[float] = []
    accepted: list[str] = []
    try:
        for r in range(rounds):
            # the leader of the two: kill it while creates go through the other
            leader_id = (await status(nodes[1]))["leader"]
            selves = [(await status(n))["self"] for n in nodes]
            leader = nodes[selves.index(leader_id)]
            survivor = next(n for n in nodes if n is not leader)
            load = asyncio.create_task(creates([survivor], 200, concurrency // 4, f"fo{r}"))
            await asyncio.sleep(0.3)
            leader.proc.send_signal(signal.SIGKILL)
            leader.proc.wait()
            t0 = time.perf_counter()
            while (await status(survivor))["leader"] != (await status(survivor))["self"]:  # noqa: ASYNC110 (polled)
                await asyncio.sleep(0.05)
            took_lead.append(time.perf_counter() - t0)
            from bai.client import Client

            async with Client(creds_of(survivor)) as client:
                name = f"probe-{r}"
                await client.create_session("sim", name=name, type="batch", startup_command="true", enqueue_only=True)
                while (await client.get_session(name))["status"] == "PENDING":  # noqa: ASYNC110 (polled)
                    await asyncio.sleep(0.05)
            took_round.append(time.perf_counter() - t0)
            accepted += (await load)[1] + [name]
            # the killed one comes back (a follower) on a fresh folder and port
            nodes = [survivor, manager_node(url)]
            started.append(nodes[1])
        rows = await _all_sessions(nodes[0])
    finally:
        for n in started:
            n.stop()
    names = [r["name"] for r in rows]
    lost = sorted(set(accepted) - set(names))
    twice = sorted({n for n in names if names.count(n) > 1})
    return {"lead": took_lead, "round": took_round, "lost": lost, "twice": twice, "accepted": len(accepted)}


async def _all_sessions(node: BenchNode) -> list[dict[str, Any]]:
    from bai.client import Client

    async with Client(creds_of(node)) as client:
        return await client.list_sessions(all=True)


async def one_round(server: PostgresServer, args: argparse.Namespace, r: int) -> tuple[float, float, float]:
    """The three phases once, one after the other (each one's nodes stopped before the next starts)."""
    progress(f"round {r + 1}: one node on SQLite …")
    node = start_node(CONFIG, "sim", "--link-listen", f"127.0.0.1:{free_port()}")
    try:
        sqlite_rate, _ = await creates([node], args.sessions, args.concurrency, "lite")
    finally:
        node.stop()
    progress(f"round {r + 1}: one node on PostgreSQL …")
    node = manager_node(server.new_database("one"))
    try:
        pg_rate, _ = await creates([node], args.sessions, args.concurrency, "pg1")
    finally:
        node.stop()
    progress(f"round {r + 1}: two managers on one PostgreSQL database …")
    url = server.new_database("two")
    first = manager_node(url)
    second = manager_node(url, role="manager")
    try:
        two_rate, _ = await creates([first, second], args.sessions, args.concurrency, "pg2")
    finally:
        second.stop()
        first.stop()
    return sqlite_rate, pg_rate, two_rate


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


async def main_async(args: argparse.Namespace) -> None:
    server = PostgresServer.start(durable=True)
    try:
        # each round measures its pair in the same minute: the ratios are taken within a round (this machine's
        # speed drifts between minutes), and their median is reported with the range
        rounds = [await one_round(server, args, r) for r in range(args.rounds)]
        progress(f"{args.failovers} failovers …")
        fo = await failover(server, args.failovers, args.concurrency)
    finally:
        server.stop()
    sqlite_rates, pg_rates, two_rates = ([r[k] for r in rounds] for k in range(3))
    pg_ratios = [pg / lite for lite, pg, _ in rounds]
    two_ratios = [two / pg for _, pg, two in rounds]

    def spread(values: list[float], fmt: str) -> str:
        return "" if len(values) < 2 else f" ({format(min(values), fmt)}-{format(max(values), fmt)})"

    print(f"session creates/s, {args.concurrency} in flight, {args.sessions} each (sim backend), median of "
          f"{args.rounds} rounds (range):")  # fmt: skip
    print(f"  SQLite, one node             {_median(sqlite_rates):8.0f}/s{spread(sqlite_rates, '.0f')}")
    print(
        f"  PostgreSQL, one node         {_median(pg_rates):8.0f}/s{spread(pg_rates, '.0f')}   "
        f"{_median(pg_ratios):.2f}x SQLite{spread(pg_ratios, '.2f')} (target >= 0.6x, >= 300/s)"
    )
    print(
        f"  PostgreSQL, two managers     {_median(two_rates):8.0f}/s{spread(two_rates, '.0f')}   "
        f"{_median(two_ratios):.2f}x one manager{spread(two_ratios, '.2f')} (target >= 1.3x)"
    )
    lead = ", ".join(f"{t:.1f}" for t in fo["lead"])
    took = ", ".join(f"{t:.1f}" for t in fo["round"])
    print(f"failover, leader killed -9 ({len(fo['lead'])} times): lease taken after {lead} s")
    print(f"  next scheduling round on the new leader after {took} s (target <= 10 s)")
    print(f"  sessions accepted {fo['accepted']}: lost {len(fo['lost'])}, twice {len(fo['twice'])} (target 0)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--failovers", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3, help="times each pair is measured (median reported)")
    args = parser.parse_args()
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
