"""A keypair cannot flood the queue (issue 27): its policy's `max_pending_session_count` bounds its PENDING sessions.

Every session that cannot be placed yet waits PENDING: a row in the store and an entry in every scheduling
round's snapshot. A keypair with `max_pending_session_count` (default 1000, 0 = unlimited) sessions waiting
gets a 412 (quota-exceeded) naming the limit for the next one, and nothing is stored; another keypair is not
affected; once one of its sessions starts or is cancelled, a new one is accepted. Settable from the REST admin
API, GraphQL (null = unlimited, as Backend.AI) and `bai policy --max-pending`, shown by `GET /bai/quota`
(maxPendingSessions, pendingSessions).

Concurrent creations do not overshoot: `QueueGate.insert` counts the keypair's creations in flight too.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import psutil
import pytest

from bai.common.problems import Problem
from bai.common.status import SessionStatus
from bai.node.manager.http.admin_routes import MAX_PENDING_SESSION_COUNT, parse_policy
from bai.node.manager.http.graphql.keypair_fields import _policy_fields as graphql_policy_fields
from bai.node.manager.http.graphql.keypair_fields import policy_item
from bai.node.manager.http.requests import parse_create
from bai.node.manager.services.lifecycle import new_session_rows
from bai.node.manager.services.queue_limit import PendingQueue, QueueGate, check_pending_limit, pending_queue
from bai.node.manager.state import Store
from bai.node.manager.state.records import NewKernel, NewKeypair, NewSession, PolicyFields, Session, new_policy
from bai.node.manager.state.sqlite.keypair_queries import DEFAULT_PENDING_SESSIONS
from tests.harness import Harness
from tests.nodeproc import Node, admin_keys, signed_request

NOW = datetime(2026, 1, 1, tzinfo=UTC)  # when these tests' writes are stamped

MiB = 2**20


async def _queue(h: Harness, owner: str, count: int, prefix: str = "wait", together: int = 1) -> None:
    """`count` sessions of `owner` that stay PENDING (no round runs), `together` created at once (in the order
    of their names otherwise)."""
    for start in range(0, count, together):
        names = [f"{prefix}-{i}" for i in range(start, min(count, start + together))]
        await asyncio.gather(*(h.create(name, owner=owner, cpu=1, mem="64m") for name in names))


async def _rows_of(h: Harness, owner: str) -> list[Session]:
    return await h.store.list_sessions(owner, None)


async def _plan(store: Store, sql: str) -> str:
    rows = await store.db.run(lambda conn: conn.execute(f"EXPLAIN QUERY PLAN {sql}").fetchall())
    return " ".join(str(r[-1]) for r in rows)


async def _refused(h: Harness, name: str, owner: str) -> Problem:
    with pytest.raises(Problem) as err:
        await h.create(name, owner=owner, cpu=1, mem="64m")
    return err.value


# -- the check and its one read (no line in Sessions.create needed) --------------------------------------------


async def test_the_check_refuses_at_the_limit_naming_it_and_counts_only_that_keypairs_pending(tmp_path: Path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("a1", cpu=1, mem="4g")
        mallory = await h.keypair("mallory", await h.policy("five", max_pending_session_count=5))
        alice = await h.keypair("alice", "five")
        await _queue(h, mallory, 4)
        await check_pending_limit(h.store, mallory)  # 4 of 5: one more may come
        await _queue(h, mallory, 1, prefix="last")
        with pytest.raises(Problem) as err:
            await check_pending_limit(h.store, mallory)
        problem = err.value
        assert problem.status == 412 and problem.slug == "quota-exceeded"
        assert problem.msg is not None
        for words in (mallory, "5 sessions waiting (PENDING)", "five allows 5", "max_pending_session_count"):
            assert words in problem.msg
        assert problem.data == {"policy": "five", "max_pending_session_count": 5, "pending": 5}
        await check_pending_limit(h.store, alice)  # the same policy, another keypair: its own queue
        # a session that starts no longer counts
        await h.schedule()
        await h.wait("wait-0", "RUNNING", owner=mallory)
        assert (await pending_queue(h.store, mallory)).pending == 4
        await check_pending_limit(h.store, mallory)


async def test_an_unknown_keypair_follows_the_default_policy_and_zero_is_unlimited(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "bai.db")
    try:
        queue = await pending_queue(store, "AKIANOSUCHKEY")
        assert (queue.policy, queue.limit, queue.pending, queue.full) == ("default", DEFAULT_PENDING_SESSIONS, 0, False)
        assert await store.save_policy("default", PolicyFields(max_pending_session_count=0), create=False, now=NOW)
        queue = await pending_queue(store, "AKIANOSUCHKEY")
        assert (queue.limit, queue.full) == (0, False)
    finally:
        await store.close()


async def _traced(store: Store, access_key: str) -> tuple[PendingQueue, list[str]]:
    """The keypair's queue, and the statements SQLite ran for it."""
    statements: list[str] = []
    await store.db.run(lambda conn: conn.set_trace_callback(statements.append))
    try:
        queue = await pending_queue(store, access_key)
    finally:
        await store.db.run(lambda conn: conn.set_trace_callback(None))
    return queue, statements


@pytest.mark.sqlite_only  # (SQLite's plan; on PostgreSQL, tests/test_postgres_store.py checks its own)
async def test_the_count_is_one_range_of_an_index_and_stops_at_the_limit(tmp_path: Path) -> None:
    """What the check asks SQLite: once the limits are in memory, only a count over the (access_key, status)
    index that reads at most `limit` entries, however many sessions the store holds; an unlimited keypair,
    nothing at all. A change of a policy or of a keypair's policy counts from the next check."""
    async with Harness(tmp_path) as h:
        await h.add_agent("a1", cpu=1, mem="4g")
        owner = await h.keypair("counted", await h.policy("three", max_pending_session_count=10))
        await _queue(h, owner, 7)
        assert (await pending_queue(h.store, owner)).pending == 7
        lowered = PolicyFields(max_pending_session_count=3)
        assert await h.store.save_policy("three", lowered, create=False, now=NOW)
        queue, statements = await _traced(h.store, owner)
        assert (queue.limit, queue.pending, queue.full) == (3, 3, True)  # counted up to the limit, no further
        queue, statements = await _traced(h.store, owner)
        assert len(statements) == 1, statements
        plan = await _plan(h.store, statements[0])
        assert "USING COVERING INDEX sessions_owner_status" in plan and "SCAN sessions" not in plan, plan
        await h.policy("any", max_pending_session_count=0)
        assert await h.store.update_keypair(owner, resource_policy="any")
        assert (await pending_queue(h.store, owner)).limit == 0
        queue, statements = await _traced(h.store, owner)
        assert (queue.policy, queue.limit, queue.full, statements) == ("any", 0, False, [])


async def test_the_check_reads_an_index_with_many_ended_sessions_of_the_keypair(tmp_path: Path) -> None:
    """An old keypair with many ended sessions: the count is right, and the plan of its statement reads an
    index, not every session (each engine's own plan, with the 20,000 rows just written)."""
    async with Harness(tmp_path) as h:
        await h.add_agent("a1", cpu=1, mem="4g")
        owner = await h.keypair("veteran")

        def fill(conn) -> None:  # 20,000 ended sessions of that keypair, as years of use leave them
            rows = [
                (f"old-{i}", f"old-{i}", owner, "python", "batch", "TERMINATED", "", "{}", "x", "{}", "x", i)
                for i in range(20_000)
            ]
            conn.executemany(
                "INSERT INTO sessions(id, name, access_key, image, type, status, status_info, status_data, "
                "status_changed, requested_slots, created_at, seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )

        await h.store.db.transaction(fill)
        await _queue(h, owner, 3)
        queue = await pending_queue(h.store, owner)
        assert queue.pending == 3
        sql = "SELECT COUNT(*) FROM (SELECT 1 FROM sessions WHERE access_key = ? AND status = 'PENDING' LIMIT ?) AS q"
        explain = "EXPLAIN QUERY PLAN " if h.engine == "sqlite" else "EXPLAIN "
        rows = await h.store.db.run(lambda conn: conn.execute(explain + sql, (owner, queue.limit)).fetchall())
        plan = " ".join(str(tuple(r)) for r in rows)
        assert "Seq Scan" not in plan and "SCAN sessions" not in plan and "index" in plan.lower(), plan


# -- the gate: exact under concurrency (no line in Sessions.create needed) -------------------------------------


def _rows(owner: str, name: str) -> tuple[NewSession, list[NewKernel]]:
    req = parse_create(
        {"image": "python", "name": name}, {"cpu", "mem"}, {"cpu": "1", "mem": "1g"}, {}, datetime.now(UTC)
    )
    return new_session_rows(req, owner, datetime.now(UTC))


async def _keypair(store: Store, access_key: str, policy: str) -> None:
    await store.create_keypair(NewKeypair(access_key, "s", access_key.lower(), False, policy), NOW)


async def _pending_of(store: Store, owner: str) -> int:
    return await store.count_sessions_of(owner, [SessionStatus.PENDING])


async def test_the_gate_stores_exactly_up_to_the_limit_whatever_the_concurrency(tmp_path: Path) -> None:
    """Bursts of concurrent inserts through the gate while other sessions of the keypair leave the queue
    (cancelled) at the same time: the PENDING count never passes the limit, and each burst fills it."""
    store = await Store.open(tmp_path / "bai.db")
    try:
        assert await store.save_policy("eight", PolicyFields(max_pending_session_count=8), create=True, now=NOW)
        await _keypair(store, "AKIABURST", "eight")
        gate = QueueGate(store)
        refused, seen = 0, []

        async def one(name: str) -> None:
            nonlocal refused
            session, kernels = _rows("AKIABURST", name)
            try:
                assert await gate.insert("AKIABURST", lambda: store.create_session(session, kernels)) is None
                seen.append(await _pending_of(store, "AKIABURST"))  # what the store holds at that moment
            except Problem as e:
                assert e.status == 412 and "allows 8" in (e.msg or "")
                refused += 1

        async def cancel_some(count: int) -> None:
            rows = await store.list_sessions("AKIABURST", [SessionStatus.PENDING], limit=count)
            for row in rows:
                await store.transition(row.id, SessionStatus.CANCELLED, "user-requested", now=datetime.now(UTC))

        for rnd in range(6):
            await asyncio.gather(*(one(f"b{rnd}-{i:02d}") for i in range(40)), cancel_some(3 if rnd else 0))
            assert await _pending_of(store, "AKIABURST") <= 8, rnd
            await asyncio.gather(*(one(f"f{rnd}-{i:02d}") for i in range(40)))  # fills what the cancels freed
            assert await _pending_of(store, "AKIABURST") == 8, rnd
            assert gate.in_flight() == 0
        assert max(seen) == 8
        stored = await store.list_sessions("AKIABURST", None)
        assert len(stored) == 8 + 5 * 3 and refused == 12 * 40 - len(stored)  # each place taken once, no more
    finally:
        await store.close()


async def test_the_gate_gives_the_place_back_when_the_insert_fails_or_is_cancelled(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "bai.db")
    try:
        assert await store.save_policy("one", PolicyFields(max_pending_session_count=1), create=True, now=NOW)
        await _keypair(store, "AKIAONE", "one")
        gate = QueueGate(store)

        async def broken() -> None:
            raise RuntimeError("disk full")

        with pytest.raises(RuntimeError):
            await gate.insert("AKIAONE", broken)
        stuck = asyncio.Event()

        async def hangs() -> None:
            await stuck.wait()

        task = asyncio.ensure_future(gate.insert("AKIAONE", hangs))
        await asyncio.sleep(0.05)
        assert gate.in_flight() == 1  # holds the one place meanwhile
        with pytest.raises(Problem):
            session, kernels = _rows("AKIAONE", "while-held")
            await gate.insert("AKIAONE", lambda: store.create_session(session, kernels))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert gate.in_flight() == 0
        session, kernels = _rows("AKIAONE", "after")
        assert await gate.insert("AKIAONE", lambda: store.create_session(session, kernels)) is None
        assert await _pending_of(store, "AKIAONE") == 1
        with pytest.raises(Problem):
            session, kernels = _rows("AKIAONE", "full")
            await gate.insert("AKIAONE", lambda: store.create_session(session, kernels))
        assert gate.in_flight() == 0
    finally:
        await store.close()


# -- through Sessions.create ---------------------------------------------------------------------------------


async def test_the_next_session_past_the_limit_is_a_412_and_nothing_is_stored(tmp_path: Path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("a1", cpu=1, mem="4g")
        mallory = await h.keypair("mallory", await h.policy("five", max_pending_session_count=5))
        alice = await h.keypair("alice", "five")
        await _queue(h, mallory, 5)
        for i in range(20):  # a flood: each one refused, none stored
            problem = await _refused(h, f"flood-{i}", mallory)
            assert problem.status == 412 and "max_pending_session_count" in (problem.msg or "")
            assert "allows 5" in (problem.msg or "")
        rows = await _rows_of(h, mallory)
        assert sorted(r.name for r in rows) == [f"wait-{i}" for i in range(5)]
        assert (await h.store.count_sessions_by_status()) == {"PENDING": 5}
        # another keypair of the same policy, and the admin, are not affected
        await _queue(h, alice, 5, prefix="alices")
        await h.create("admins-own", cpu=1, mem="64m")


async def test_a_place_frees_when_one_starts_or_is_cancelled(tmp_path: Path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("a1", cpu=1, mem="4g")  # room for one session at a time
        owner = await h.keypair("queued", await h.policy("three", max_pending_session_count=3))
        await _queue(h, owner, 3)
        await _refused(h, "fourth", owner)
        await h.schedule()
        await h.wait("wait-0", "RUNNING", owner=owner)  # started: no longer waiting
        await h.create("fourth", owner=owner, cpu=1, mem="64m")
        await _refused(h, "fifth", owner)
        await h.destroy("wait-1", owner=owner)  # a PENDING one cancelled
        assert await h.status("wait-1", owner=owner) == "CANCELLED"
        await h.create("fifth", owner=owner, cpu=1, mem="64m")
        await _refused(h, "sixth", owner)
        assert sorted(r.status for r in await _rows_of(h, owner)) == ["CANCELLED"] + ["PENDING"] * 3 + ["RUNNING"]


async def test_concurrent_bursts_do_not_overshoot_the_limit(tmp_path: Path) -> None:
    """Thirty creations at the same moment, at 4 of 5: exactly one is stored, and the next bursts none."""
    async with Harness(tmp_path) as h:
        await h.add_agent("a1", cpu=1, mem="4g")
        owner = await h.keypair("burst", await h.policy("five", max_pending_session_count=5))
        await _queue(h, owner, 4)

        async def burst(prefix: str) -> list:
            made = (h.create(f"{prefix}-{i}", owner=owner, cpu=1, mem="64m") for i in range(30))
            return await asyncio.gather(*made, return_exceptions=True)

        for prefix in ("first", "second", "third"):
            got = await burst(prefix)
            refused = [g for g in got if isinstance(g, Problem)]
            assert all(g.status == 412 for g in refused), refused
            assert len(await _rows_of(h, owner)) == 5, prefix
        assert h.lifecycle.queue.in_flight() == 0


async def test_zero_is_unlimited_and_the_default_is_1000(tmp_path: Path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("a1", cpu=1, mem="4g")
        unlimited = await h.keypair("bench", await h.policy("unbounded", max_pending_session_count=0))
        await _queue(h, unlimited, 1005, together=64)
        ordinary = await h.keypair("ordinary")  # the default policy
        await _queue(h, ordinary, DEFAULT_PENDING_SESSIONS, together=64)
        problem = await _refused(h, "one-too-many", ordinary)
        assert "policy default allows 1000" in (problem.msg or "")
        assert len(await _rows_of(h, ordinary)) == DEFAULT_PENDING_SESSIONS


# -- the policy field: validation and how each API shows it --------------------------------------------------


def test_the_rest_field_is_validated() -> None:
    from bai.cli.admin import MAX_PENDING

    assert MAX_PENDING == MAX_PENDING_SESSION_COUNT  # the CLI refuses what the manager would (without importing it)
    for good in (0, 1, 5, MAX_PENDING_SESSION_COUNT):
        assert parse_policy({"max_pending_session_count": good}, partial=True) == {"max_pending_session_count": good}
    for bad in (-1, True, 1.5, "5", None, MAX_PENDING_SESSION_COUNT + 1, 10**30):
        with pytest.raises(Problem) as err:
            parse_policy({"max_pending_session_count": bad}, partial=True)
        assert err.value.status == 400 and "max_pending_session_count" in (err.value.msg or ""), bad


def test_graphql_shows_null_for_unlimited_and_takes_null_as_unlimited() -> None:
    assert policy_item(new_policy("p", max_pending_session_count=1000))["max_pending_session_count"] == 1000
    assert policy_item(new_policy("p", max_pending_session_count=0))["max_pending_session_count"] is None
    assert graphql_policy_fields({"max_pending_session_count": None}, partial=True) == {"max_pending_session_count": 0}
    assert graphql_policy_fields({"max_pending_session_count": 7}, partial=True) == {"max_pending_session_count": 7}
    with pytest.raises(Problem):
        graphql_policy_fields({"max_pending_session_count": -3}, partial=True)


def test_the_policy_table_has_a_pending_column() -> None:
    from rich.console import Console

    from bai.cli.output import policies_table

    policy = {
        "name": "default", "max_concurrent_sessions": 0, "total_resource_slots": {}, "default_for_unspecified":
        "UNLIMITED", "idle_timeout": 0, "max_session_lifetime": 0, "max_session_networks": 2,
        "max_pending_session_count": 1000,
    }  # fmt: skip
    console = Console(width=200, record=True)
    console.print(policies_table([policy, {**policy, "name": "bench", "max_pending_session_count": 0}]))
    header, default, bench = console.export_text().splitlines()
    at = header.index("PENDING")
    assert default[at:].split()[0] == "1000" and bench[at:].split()[0] == "unlimited"


# -- over HTTP: a node with the simulated backend --------------------------------------------------------------


@pytest.fixture(scope="module")
def sim_node(tmp_path_factory) -> Iterator[Node]:
    node = Node(tmp_path_factory.mktemp("pending-limit"), "sim", agent_config='cpu = "16"\nmem = "32g"\n').start()
    yield node
    node.stop()


def _waiting(node: Node, keys: tuple[str, str], name: str) -> tuple[int, object]:
    """Create a batch session that waits PENDING for a day (its start time), without waiting for it."""
    body = {"name": name, "image": "python", "type": "batch", "startupCommand": "true", "starts_at": "1d",
            "enqueueOnly": True, "config": {"resources": {"cpu": "0.1", "mem": "64m"}}}  # fmt: skip
    return signed_request(node, "POST", "/session", *keys, body=body)


def _gql(node: Node, query: str, variables: dict | None = None) -> dict:
    status, body = signed_request(
        node, "POST", "/admin/gql", *admin_keys(node), body={"query": query, "variables": variables or {}}
    )
    assert status == 200, body
    return body  # type: ignore[return-value]


def test_the_limit_is_set_and_shown_by_the_cli_rest_graphql_and_quota(sim_node: Node) -> None:
    made = sim_node.json("policy", "create", "pend-show", "--max-pending", "4")
    made = made[0] if isinstance(made, list) else made
    assert made["maxPendingSessionCount"] == 4
    listed = sim_node.cli("policy", "ls", check=True).stdout
    assert "PENDING" in listed.splitlines()[0]
    for bad in ("-1", str(MAX_PENDING_SESSION_COUNT + 1)):
        refused = sim_node.cli("policy", "update", "pend-show", "--max-pending", bad)
        assert refused.returncode != 0 and "--max-pending" in refused.stderr + refused.stdout
    status, body = signed_request(
        sim_node, "PATCH", "/bai/admin/policies/pend-show", *admin_keys(sim_node),
        body={"max_pending_session_count": "lots"},
    )  # fmt: skip
    assert status == 400 and "max_pending_session_count" in str(body)
    status, body = signed_request(sim_node, "GET", "/bai/admin/policies", *admin_keys(sim_node))
    assert {p["name"]: p["max_pending_session_count"] for p in body["items"]}["default"] == 1000  # type: ignore[index]

    mutation = (
        "mutation($name: String!, $input: ModifyKeyPairResourcePolicyInput!) "
        "{ modify_keypair_resource_policy(name: $name, props: $input) { ok msg } }"
    )
    query = 'query { keypair_resource_policy(name: "pend-show") { name max_pending_session_count } }'
    done = _gql(sim_node, mutation, {"name": "pend-show", "input": {"max_pending_session_count": -5}})
    assert done["data"]["modify_keypair_resource_policy"]["ok"] is False
    assert "max_pending_session_count" in done["data"]["modify_keypair_resource_policy"]["msg"]
    done = _gql(sim_node, mutation, {"name": "pend-show", "input": {"max_pending_session_count": None}})
    assert done["data"]["modify_keypair_resource_policy"]["ok"] is True, done
    assert _gql(sim_node, query)["data"]["keypair_resource_policy"]["max_pending_session_count"] is None  # unlimited
    done = _gql(sim_node, mutation, {"name": "pend-show", "input": {"max_pending_session_count": 3}})
    assert done["data"]["modify_keypair_resource_policy"]["ok"] is True, done
    assert _gql(sim_node, query)["data"]["keypair_resource_policy"] == {
        "name": "pend-show",
        "max_pending_session_count": 3,
    }

    user = sim_node.json("keypair", "create", "--user", "pend-shown", "--policy", "pend-show")
    keys = (user["accessKey"], user["secretKey"])
    status, quota = signed_request(sim_node, "GET", "/bai/quota", *keys)
    assert status == 200 and (quota["maxPendingSessions"], quota["pendingSessions"]) == (3, 0)  # type: ignore[index]
    for i in range(2):
        status, body = _waiting(sim_node, keys, f"pend-shown-{i}")
        assert status == 201 and body["status"] == "PENDING", body  # type: ignore[index]
    status, quota = signed_request(sim_node, "GET", "/bai/quota", *keys)
    assert quota["pendingSessions"] == 2 and quota["concurrentSessions"] == 0  # type: ignore[index]
    for i in range(2):
        sim_node.cli("session", "destroy", f"pend-shown-{i}", as_keypair=user, check=True)
    status, quota = signed_request(sim_node, "GET", "/bai/quota", *keys)
    assert quota["pendingSessions"] == 0  # type: ignore[index]


def _flood(node: Node, keys: tuple[str, str], rnd: int, count: int) -> list[tuple[int, object]]:
    return [_waiting(node, keys, f"flood-{rnd}-{i}") for i in range(count)]


def test_a_flood_of_creates_is_refused_and_the_node_does_not_grow(sim_node: Node) -> None:
    """An attacker's keypair (limit 5) sends 4 rounds of 150 creations of sessions that would wait a day: each
    past the fifth is a 412 naming the limit, nothing more is stored, and the node's RSS and open fds stay
    flat between the rounds after the first two (which open what the node keeps)."""
    sim_node.cli("policy", "create", "pend-five", "--max-pending", "5", check=True)
    mallory = sim_node.json("keypair", "create", "--user", "mallory-queue", "--policy", "pend-five")
    alice = sim_node.json("keypair", "create", "--user", "alice-queue", "--policy", "pend-five")
    keys = (mallory["accessKey"], mallory["secretKey"])
    first = _flood(sim_node, keys, 0, 5)
    assert [s for s, _ in first] == [201] * 5, first
    proc = psutil.Process(sim_node.proc.pid)  # type: ignore[union-attr]
    refused: list[tuple[int, object]] = []
    for rnd in (1, 2):
        refused += _flood(sim_node, keys, rnd, 150)
    gc.collect()
    fds, rss = proc.num_fds(), proc.memory_info().rss
    for rnd in (3, 4):
        refused += _flood(sim_node, keys, rnd, 150)
    fds_after, rss_after = proc.num_fds(), proc.memory_info().rss
    print(f"node fds {fds} -> {fds_after}, RSS {rss / MiB:.1f} -> {rss_after / MiB:.1f} MiB over 300 refused creates")
    assert {s for s, _ in refused} == {412}
    assert all("max_pending_session_count" in str(b) and "allows 5" in str(b) for _, b in refused)
    status, quota = signed_request(sim_node, "GET", "/bai/quota", *keys)
    assert quota["pendingSessions"] == 5  # type: ignore[index]
    status, listed = signed_request(sim_node, "GET", "/session?status=PENDING,CANCELLED", *keys)
    assert sorted(s["sessionName"] for s in listed["items"]) == [f"flood-0-{i}" for i in range(5)]  # type: ignore[index]
    assert fds_after <= fds + 2, f"the node holds {fds_after - fds} more fds"
    assert rss_after - rss < 8 * MiB
    # another keypair of the policy is unaffected; one cancelled frees a place
    assert _waiting(sim_node, (alice["accessKey"], alice["secretKey"]), "alices-wait")[0] == 201
    sim_node.cli("session", "destroy", "flood-0-0", as_keypair=mallory, check=True)
    assert _waiting(sim_node, keys, "after-cancel")[0] == 201
    assert _waiting(sim_node, keys, "after-cancel-2")[0] == 412


def test_bais_cli_and_the_official_client_show_the_refusal(sim_node: Node, tmp_path: Path) -> None:
    from tests.test_official_client import Official, official_client

    sim_node.cli("policy", "create", "pend-one", "--max-pending", "1", check=True)
    user = sim_node.json("keypair", "create", "--user", "pend-one-user", "--policy", "pend-one")
    batch = ("--type", "batch", "--startup-command", "true", "--starts-at", "1d", "--no-wait")
    sim_node.cli("session", "create", "python", "--name", "pend-first", *batch, as_keypair=user, check=True)
    refused = sim_node.cli("session", "create", "python", "--name", "pend-second", *batch, as_keypair=user)
    said = refused.stdout + refused.stderr
    assert refused.returncode != 0 and "max_pending_session_count" in said and "allows 1" in said, said
    bac = Official(official_client(), sim_node, tmp_path)
    bac.env.update({"BACKEND_ACCESS_KEY": user["accessKey"], "BACKEND_SECRET_KEY": user["secretKey"]})
    out = bac("session", "create", "--type", "batch", "-c", "true", "--starts-at", "1d", "--enqueue-only", "python")
    assert "412" in out and "max_pending_session_count" in out, out
    status, quota = signed_request(sim_node, "GET", "/bai/quota", user["accessKey"], user["secretKey"])
    assert quota["pendingSessions"] == 1  # type: ignore[index]
    sim_node.cli("session", "destroy", "pend-first", as_keypair=user, check=True)


async def test_a_full_queue_still_gets_its_live_session_by_name(tmp_path: Path) -> None:
    """Get-or-create by name: with its queue full, asking for a session the keypair has gives that session;
    only a new one is the 412."""
    async with Harness(tmp_path) as h:
        await h.add_agent("a1", cpu=1, mem="4g")
        user = await h.keypair("queuer", await h.policy("two", max_pending_session_count=2))
        await _queue(h, user, 2)
        again = await h.create("wait-0", owner=user, cpu=1, mem="64m")
        assert again.name == "wait-0" and len(await _rows_of(h, user)) == 2
        assert (await _refused(h, "third", user)).status == 412
