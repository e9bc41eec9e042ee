"""Managers of one PostgreSQL database killed at other moments than under a burst of creates (real processes,
local kernels): while starting on an empty database (taking the schema's lock, or the lease), the follower
under load, both at once, the leader while sessions end or while a client follows a session through the
other, and a leader frozen (SIGSTOP) past its lease. Afterwards every accepted session is there once, none
started or ended twice, the agent runs exactly the live kernels, and exactly one manager leads.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import pgserver
from tests.managers_support import Managers, run_code, wait_for

pytestmark = pytest.mark.timeout(120)
# a batch command printing a numbered line every 50 ms for 10 s
TICKS = (
    "python -c \"import time; [print('tick', i, flush=True) or time.sleep(0.05) for i in range(200)]; print('done')\""
)


@pytest.fixture
def cluster(tmp_path: Path):
    made: list[Managers] = []

    def make() -> Managers:
        made.append(Managers(tmp_path, pgserver.shared().new_database("kill")))
        return made[-1]

    yield make
    for m in made:
        m.stop()


def _started(cluster: Callable[[], Managers]) -> tuple[Managers, int, int]:
    """Two managers and the agent started: (them, the leader's index, the other's), once one leads."""
    m = cluster().start()
    leader = m.wait_leader(10)
    assert leader is not None, "no manager took the lead"
    return m, leader, 1 - leader


def _running(m: Managers, names: list[str], through: Callable[[int], int] = lambda k: k % 2) -> dict[str, set[str]]:
    accepted = m.create_many(names, through=through)
    m.settled(30, also=lambda c: c["RUNNING"] >= len(names))
    return accepted


def _holder_of_migration(m: Managers) -> int | None:
    """The pid of the manager whose database connection holds the schema's advisory lock, if one does."""
    import psutil

    rows = m.sql(
        "SELECT a.client_port FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE l.locktype = 'advisory' AND l.granted AND a.datname = current_database()"
    )
    ports = {r[0] for r in rows}
    for i in range(len(m.managers)):
        pid = m.pid(i)
        if pid is None or not ports:
            continue
        try:
            if any(c.laddr and c.laddr.port in ports for c in psutil.Process(pid).net_connections("tcp")):
                return i
        except psutil.Error:
            continue
    return None


def _lease_holder(m: Managers) -> int | None:
    try:
        rows = m.sql("SELECT m.pid FROM bai_lease l JOIN bai_managers m ON m.id = l.holder")
    except Exception:  # noqa: BLE001 (the tables are not made yet)
        return None
    pids = {r[0] for r in rows}
    return next((i for i in range(len(m.managers)) if m.pid(i) in pids), None)


@pytest.mark.parametrize("moment", ["migrating", "taking-the-lease"])
def test_a_manager_killed_while_it_starts_on_an_empty_database(cluster, moment: str) -> None:
    m: Managers = cluster()
    victim: list[int] = []
    find = _holder_of_migration if moment == "migrating" else _lease_holder

    def watch() -> None:  # kill the one at that moment, as soon as it is seen there
        deadline = time.monotonic() + 30
        while not victim and time.monotonic() < deadline:
            try:
                i = find(m)
            except Exception:  # noqa: BLE001 (the database is being made)
                i = None
            if i is not None:
                victim.append(i)
                os.kill(m.managers[i].proc.pid, signal.SIGKILL)  # type: ignore[union-attr]
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    failed = m.start_racing([0, 1])
    killed = time.monotonic()
    watcher.join()
    assert victim, f"no manager was seen {moment}"
    assert set(failed) <= set(victim), failed  # (one killed just after it said `ready` has started)
    survivor = 1 - victim[0]
    assert m.wait_leader(12, among=[survivor]) == survivor
    assert time.monotonic() - killed <= 12
    m.start_managers([victim[0]])  # it comes back as a follower, on the schema the other made
    assert m.leads(victim[0]) is False and m.leads(survivor) is True
    m.start_agent()
    assert wait_for(lambda: m.agents_seen(0) and m.agents_seen(1), 20)
    accepted = _running(m, [f"sess-{i}" for i in range(4)])
    m.check(accepted)


def test_the_follower_killed_under_load_loses_nothing(cluster) -> None:
    m, leader, follower = _started(cluster)
    enough = threading.Event()
    answers: dict[str, set[str]] = {}
    sender = threading.Thread(
        target=lambda: answers.update(
            m.create_many(
                [f"create-{i}" for i in range(24)],
                through=lambda k: k % 2,
                on_accept=lambda n: n >= 8 and enough.set(),
            )
        )
    )
    sender.start()
    assert enough.wait(30)
    m.kill(follower)
    sender.join(60)
    assert len(answers) == 24
    assert m.leader() == leader  # it went on leading all along
    m.settled(40, also=lambda c: c["RUNNING"] == 24)
    m.check(answers)
    m.start_managers([follower])
    assert m.leads(follower) is False and m.leader() == leader


def test_both_killed_and_restarted_keep_everything_and_one_leads(cluster) -> None:
    m: Managers = cluster().start()
    accepted = _running(m, [f"run-{i}" for i in range(6)])
    before = sorted(m.sessions())
    m.kill(0)
    m.kill(1)
    m.start_managers([0, 1])
    leader = m.wait_leader(12)
    assert leader is not None and m.leads(1 - leader) is False
    assert wait_for(lambda: m.agents_seen(0) and m.agents_seen(1), 20)
    assert sorted(m.check(accepted)) == before  # every session as it was: running, once

    from bai.client.api import Client

    async def each() -> None:
        for i in (0, 1):
            async with Client(m.creds(i)) as client:
                result = await run_code(client, next(iter(accepted["run-0"])), "print(6*7)")
                assert result.out.strip() == "42", result

    asyncio.run(each())
    assert _running(m, ["after"])


def test_the_leader_killed_while_sessions_end_ends_each_once(cluster) -> None:
    m: Managers = cluster().start()
    names = [f"ends-{i}" for i in range(10)]
    accepted = _running(m, names)
    leader = m.wait_leader(10)
    assert leader is not None
    answered: list[str] = []

    def destroy(k: int) -> None:
        for attempt in range(60):
            i = (k + attempt) % 2
            code, body = m.call(i, "DELETE", f"/session/{names[k]}")
            if code in (200, 204, 404):  # (404: an earlier try ended it, and its answer was lost)
                answered.append(names[k])
                return
            time.sleep(0.2)
        raise AssertionError(f"destroying {names[k]}: {code} {body}")

    threads = [threading.Thread(target=destroy, args=(k,)) for k in range(len(names))]
    for t in threads:
        t.start()
    wait_for(lambda: len(answered) >= 3, 20, 0.01)
    m.kill(leader)
    for t in threads:
        t.join(60)
    assert len(answered) == len(names)
    assert m.wait_leader(12, among=[1 - leader]) == 1 - leader
    counts = m.settled(40, also=lambda c: c["TERMINATED"] == len(names))
    assert counts["TERMINATED"] == len(names), counts
    m.check(accepted)  # (each went to TERMINATED once; the agent runs none of their kernels)
    assert not m.agent_kernels()


def test_clients_following_through_the_follower_go_on_when_the_leader_dies(cluster) -> None:
    """A log followed and a session's events followed through the follower, the leader killed under both."""
    m, leader, follower = _started(cluster)
    accepted = m.create_many(["ticker"], through=lambda k: follower, type="batch", startupCommand=TICKS)
    sleeper = 'python -c "import time; time.sleep(120)"'  # (ended by the client, through the new leader)
    accepted |= m.create_many(["watched"], through=lambda k: follower, type="batch", startupCommand=sleeper)
    ticker, watched = (next(iter(accepted[n])) for n in ("ticker", "watched"))
    m.settled(20, also=lambda c: c["RUNNING"] == 2)

    from bai.client.api import Client

    lines: list[str] = []
    events: list[str] = []
    killed = asyncio.Event()

    async def follow_logs() -> None:
        async with Client(m.creds(follower)) as client:
            async for text in client.follow_logs(ticker):
                lines.append(text)
                if not killed.is_set() and "tick 40" in "".join(lines):
                    m.kill(leader)
                    killed.set()

    async def follow_events() -> None:
        async with Client(m.creds(follower)) as client:
            async for name, _ in client.events(watched):
                events.append(name)

    async def main() -> None:
        tasks = [asyncio.create_task(follow_logs()), asyncio.create_task(follow_events())]
        await asyncio.wait_for(killed.wait(), 20)
        assert await asyncio.to_thread(m.wait_leader, 12, [follower]) == follower
        code, body = await asyncio.to_thread(m.call, follower, "DELETE", "/session/watched")
        assert code == 200, body
        await asyncio.wait_for(asyncio.gather(*tasks), 40)

    asyncio.run(main())
    assert m.leads(follower) is True
    text = "".join(lines)
    assert "done" in text.splitlines()[-1] or text.rstrip().endswith("done"), text[-300:]
    numbers = [int(line.split()[1]) for line in text.splitlines() if line.startswith("tick ")]
    assert numbers == sorted(set(numbers)), "a line came twice or out of order"
    assert events[-1] in ("session_terminated", "session_success", "session_failure"), events
    m.check(accepted)


def test_a_frozen_leader_that_wakes_does_not_lead(cluster) -> None:
    m, leader, other = _started(cluster)
    accepted = _running(m, [f"first-{i}" for i in range(4)])
    m.signal(leader, signal.SIGSTOP)
    try:
        frozen = time.monotonic()
        during = m.create_many([f"frozen-{i}" for i in range(12)], through=lambda k: other, others=False)
        assert m.wait_leader(12, among=[other]) == other, "the other did not take the lead"
        time.sleep(max(0.0, 8 - (time.monotonic() - frozen)))
        more = m.create_many([f"woken-{i}" for i in range(12)], through=lambda k: other, workers=12, others=False)
    finally:
        m.signal(leader, signal.SIGCONT)
    woke = time.monotonic()
    assert wait_for(lambda: m.leads(leader) is False, 5), "the woken manager still says it leads"
    assert time.monotonic() - woke <= 5
    assert m.leader() == other
    m.settled(40, also=lambda c: c["RUNNING"] == 28)
    m.check({**accepted, **during, **more})
