"""Many creates at once: the database's group commit (transactions queued together share one COMMIT, each
answered on its own), creating a session in one transaction, and what a burst of creates may not change:
admission, names, queue order, what the agents could ever hold."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from bai.common.problems import Problem
from bai.common.status import OCCUPYING_STATUSES
from bai.node.manager.domain_errors import Conflict
from bai.node.manager.http.problems import problem_of
from bai.node.manager.state import Store
from bai.node.manager.state.records import Session
from tests.harness import Harness

BURST = 64


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    st = await Store.open(tmp_path / "state" / "bai.db")
    yield st
    await st.close()


def insert_alias(name: str, then: Callable[[sqlite3.Connection], Any] | None = None):
    def fn(conn: sqlite3.Connection) -> str:
        conn.execute("INSERT INTO image_aliases VALUES (?, 'img')", (name,))
        if then is not None:
            then(conn)
        return name

    return fn


async def queued_together(store: Store, fns: list[Callable[[sqlite3.Connection], Any]]) -> list[Any]:
    """Run fns as transactions queued while the database's thread is busy (so it takes them at once)."""
    gate = threading.Event()
    busy = store.db.run(lambda conn: gate.wait(10))
    calls = [store.db.transaction(fn) for fn in fns]
    gate.set()
    await busy
    return await asyncio.gather(*calls, return_exceptions=True)


def boom(conn: sqlite3.Connection) -> None:
    raise RuntimeError("boom")


async def test_transactions_queued_together_each_get_their_own_answer(store: Store) -> None:
    fns = [insert_alias(f"a{i}", boom if i % 7 == 3 else None) for i in range(50)]
    results = await queued_together(store, fns)
    for i, result in enumerate(results):
        if i % 7 == 3:  # a failing transaction fails alone: its insert is undone, the others' are kept
            assert isinstance(result, RuntimeError), (i, result)
        else:
            assert result == f"a{i}"
    assert {a.alias for a in await store.image_aliases()} == {f"a{i}" for i in range(50) if i % 7 != 3}


async def test_failures_first_last_and_in_a_row_each_fail_alone(store: Store) -> None:
    """A group has no savepoints: a transaction that raises rolls the group back, those before it run again
    together and those after it go on; whatever the pattern, each gets the answer it would have had alone."""
    failing = {0, 1, 4, 5, 6, 9, 11}
    fns = [insert_alias(f"b{i}", boom if i in failing else None) for i in range(12)]
    results = await queued_together(store, fns)
    for i, result in enumerate(results):
        if i in failing:
            assert isinstance(result, RuntimeError), (i, result)
        else:
            assert result == f"b{i}"
    assert {a.alias for a in await store.image_aliases()} == {f"b{i}" for i in range(12) if i not in failing}
    assert await store.set_image_alias("after", "img")  # the connection is not left in a transaction


async def test_a_transaction_that_raises_sees_what_those_before_it_wrote(store: Store) -> None:
    """Run again after a failure later in the group, a transaction gets the same answer: it reads the state
    left by those queued before it, not the one of the rolled-back attempt."""

    def count_then(name: str, fail: bool) -> Callable[[sqlite3.Connection], int]:
        def fn(conn: sqlite3.Connection) -> int:
            conn.execute("INSERT INTO image_aliases VALUES (?, 'img')", (name,))
            seen = conn.execute("SELECT COUNT(*) FROM image_aliases").fetchone()[0]
            if fail:
                raise RuntimeError(name)
            return seen

        return fn

    results = await queued_together(
        store, [count_then("c0", False), count_then("c1", False), count_then("c2", True), count_then("c3", False)]
    )
    assert results[:2] == [1, 2] and isinstance(results[2], RuntimeError) and results[3] == 3
    assert {a.alias for a in await store.image_aliases()} == {"c0", "c1", "c3"}


async def test_a_group_that_fails_as_a_whole_runs_each_transaction_alone(store: Store) -> None:
    """One transaction ends the shared transaction (as SQLite does itself on a full disk): the others run
    again on their own and are stored; only that one fails."""

    def end_it(conn: sqlite3.Connection) -> None:
        conn.execute("ROLLBACK")

    results = await queued_together(
        store, [insert_alias("first"), insert_alias("breaker", end_it), insert_alias("last")]
    )
    assert results[0] == "first" and results[2] == "last"
    assert isinstance(results[1], sqlite3.OperationalError)
    assert {a.alias for a in await store.image_aliases()} == {"first", "last"}
    assert await store.set_image_alias("after", "img")  # the connection is not left in a transaction


async def test_an_answered_transaction_is_committed(store: Store, tmp_path: Path) -> None:
    """Each caller is answered only once its group is committed: another connection sees every row."""
    names = [f"n{i}" for i in range(20)]
    assert await queued_together(store, [insert_alias(n) for n in names]) == names
    with closing(sqlite3.connect(tmp_path / "state" / "bai.db")) as other:
        assert {r[0] for r in other.execute("SELECT alias FROM image_aliases")} == set(names)
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


async def test_reads_between_transactions_see_what_was_queued_before_them(store: Store) -> None:
    gate = threading.Event()
    busy = store.db.run(lambda conn: gate.wait(10))
    first = store.db.transaction(insert_alias("one"))
    seen = store.db.run(lambda conn: [r[0] for r in conn.execute("SELECT alias FROM image_aliases")])
    second = store.db.transaction(insert_alias("two"))
    gate.set()
    await busy
    assert (await first, await seen, await second) == ("one", ["one"], "two")


# -- creates ----------------------------------------------------------------------------------------


async def test_a_burst_of_creates_with_one_name_makes_one_session(tmp_path: Path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("a1", cpu=4)
        rows = await asyncio.gather(*(h.create("same-name") for _ in range(20)))
        assert len({r.id for r in rows}) == 1  # the others got the live session of that name
        assert len(await h.store.find_sessions("same-name", h.admin, active_only=True)) == 1


async def test_a_burst_that_may_not_reuse_a_name_is_refused_but_once(tmp_path: Path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("a1", cpu=4)
        results = await asyncio.gather(
            *(h.create("only-once", reuseIfExists=False) for _ in range(10)), return_exceptions=True
        )
        made = [r for r in results if isinstance(r, Session)]
        refused = [problem_of(r) for r in results if isinstance(r, Conflict)]
        assert len(made) == 1 and len(refused) == 9, results
        assert {p.slug for p in refused} == {"session-already-exists"}


async def test_a_burst_never_goes_over_the_keypairs_session_limit_and_keeps_its_order(tmp_path: Path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("a1", cpu=BURST, mem="256g")
        alice = await h.keypair("alice", await h.policy("five", max_concurrent_sessions=5))
        names = [f"burst-{i:02d}" for i in range(BURST)]
        rows = await asyncio.gather(*(h.create(n, owner=alice, cpu=0.5, mem="1g") for n in names))
        assert len({r.id for r in rows}) == BURST
        for _ in range(3):  # rounds as the dispatcher runs them; none lets a sixth one start
            await h.schedule()
            occupying = await h.store.list_sessions(alice, OCCUPYING_STATUSES)
            assert len(occupying) == 5
        queue = sorted(rows, key=lambda r: (r.created_at, r.id))  # FIFO: the oldest ones go first
        assert {r.id for r in occupying} == {r.id for r in queue[:5]}


async def test_a_taken_name_answers_before_any_other_check(tmp_path: Path) -> None:
    """Get-or-create: asking again for a live session by its name gives that session, even when the request
    could not be placed anywhere now (the agent that could hold it is gone)."""
    async with Harness(tmp_path) as h:
        await h.add_agent("big", cpu=8)
        first = await h.create("named-one", cpu=8)
        await h.add_agent("small", cpu=1)
        await h.lose_agent("big")
        with pytest.raises(Problem, match="can ever hold"):
            await h.create("another-one", cpu=8)
        again = await h.create("named-one", cpu=8)
        assert again.id == first.id


async def test_what_agents_could_hold_follows_agents_joining_and_leaving(tmp_path: Path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("small", cpu=1)
        await h.create("fits-small", cpu=1)  # remembered: a 1-cpu request fits
        with pytest.raises(Problem, match="can ever hold"):
            await h.create("too-big-1", cpu=4)
        await h.add_agent("big", cpu=4)
        assert (await h.create("big-enough", cpu=4)).status == "PENDING"
        await h.lose_agent("big")
        with pytest.raises(Problem, match="can ever hold"):
            await h.create("too-big-2", cpu=4)


async def test_a_transition_returns_the_row_as_stored(tmp_path: Path) -> None:
    """The row a transition answers with (and publishes) is the stored one, column for column."""
    async with Harness(tmp_path) as h:
        await h.add_agent("a1", cpu=4)
        await h.create("row-check", type="batch", command="exit 3")
        events: list[Session] = []
        with h.hubs.events.subscribe() as queue:
            await h.schedule()
            done = await h.wait("row-check", "TERMINATED")
            while not queue.empty():
                events.append(queue.get_nowait()[1])
        assert done.result == "FAILURE" and done.terminated_at
        stored = await h.store.get_session(done.id)
        assert events and events[-1] == stored
        kernels = await h.store.kernels_of(done.id)
        assert [(k.status, k.exit_code, k.terminated_at) for k in kernels] == [("TERMINATED", 3, stored.terminated_at)]
