"""Two managers on one PostgreSQL database and a Docker agent that dials both (real processes, ZeroMQ, a real
PostgreSQL server): 20 python sessions run, then 200 creates are sent at once through both managers' APIs and
the leader is killed (-9) in the middle of them. The other takes the lead within 10 s; every create a client was
answered is there exactly once (by name and id), no session started twice, the agent's containers are exactly
the live kernels (none orphaned, none twice), the 20 running kernels answer exec, logs and a terminal through
the survivor, and the killed manager comes back as a follower.

The agent holds 30 sessions (cpu = 30, one each): 10 of the 200 run and the rest wait PENDING, so that the test
makes 30 containers, not 220 (too many for a small CI machine), while the 200 still go through admission, the
queue and the scheduling rounds of both leaders.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from tests import pgserver
from tests.managers_support import Managers, run_code, terminal_says, wait_for

pytestmark = pytest.mark.timeout(240)
RUNNING = 20
BURST = 200
CAPACITY = 30
KILL_AFTER = 70  # accepted creates of the burst before the leader is killed


@pytest.fixture
def cluster(tmp_path: Path, python_image: str):
    url = pgserver.shared().new_database("failover")
    managers = Managers(tmp_path, url, backend="docker", agent_config=f'cpu = "{CAPACITY}"\nmem = "64g"\n')
    try:
        yield managers.start()
    finally:
        managers.stop()
    assert not managers.containers(), "containers left behind"


def test_the_leader_killed_under_load_loses_nothing_and_runs_nothing_twice(cluster: Managers) -> None:
    m = cluster
    first = m.wait_leader(10)
    assert first is not None, "no manager leads"
    other = 1 - first
    status = m.status(other)
    assert status is not None and len(status["managers"]) == 2 and all(x["alive"] for x in status["managers"])
    assert "postgresql://" in status["database"] and "password" not in str(status)

    # 20 sessions running, created through both managers
    running = m.create_many([f"run-{i}" for i in range(RUNNING)], through=lambda k: k % 2)
    m.settled(90, also=lambda c: c["RUNNING"] == RUNNING)

    # 200 creates at once through both; the leader is killed once KILL_AFTER of them were answered
    enough = threading.Event()
    answers: dict[str, set[str]] = {}

    def burst() -> None:
        names = [f"burst-{i}" for i in range(BURST)]
        answers.update(
            m.create_many(names, through=lambda k: k % 2, on_accept=lambda n: n >= KILL_AFTER and enough.set())
        )

    sender = threading.Thread(target=burst)
    sender.start()
    assert enough.wait(60), "the creates did not get going"
    m.kill(first)
    killed = time.monotonic()
    took = m.wait_leader(15, among=[other])
    took_s = time.monotonic() - killed
    assert took == other and took_s <= 10, f"the survivor led after {took_s:.1f} s ({took})"
    sender.join(120)
    assert not sender.is_alive()
    assert len(answers) == BURST, f"{BURST - len(answers)} creates were never answered"

    # counted: each accepted session once, none started twice, the containers exactly the live kernels
    counts = m.settled(60, also=lambda c: c["RUNNING"] == CAPACITY)
    assert counts["PENDING"] == RUNNING + BURST - CAPACITY, (counts, m.described("CANCELLED", "ERROR", "TERMINATED"))
    m.check({**running, **answers})

    # the 20 running kernels answer exec, logs and a terminal through the survivor
    from bai.client.api import Client

    async def through_survivor() -> None:
        async with Client(m.creds(other)) as client:
            ids = {name: next(iter(sid)) for name, sid in running.items()}
            runs = await asyncio.gather(*(run_code(client, sid, f"print('alive', {n!r})") for n, sid in ids.items()))
            for (name, _), result in zip(ids.items(), runs, strict=True):
                assert result.code == 0 and result.out.strip() == f"alive {name}", (name, result)

            async def stored(name: str, sid: str) -> str:  # (stored moments after the exec's answer: a busy leader)
                for _ in range(50):
                    text = await client.logs(sid)
                    if f"alive {name}" in text:
                        break
                    await asyncio.sleep(0.1)
                return text

            logs = await asyncio.gather(*(stored(name, sid) for name, sid in ids.items()))
            for name, text in zip(ids, logs, strict=True):
                assert f"alive {name}" in text, (name, text)
            for sid in list(ids.values())[:3]:
                await terminal_says(client, sid, "echo $((6*7))\n", "42")

    asyncio.run(through_survivor())

    # the killed manager comes back as a follower; the survivor still leads and schedules
    m.managers[first].start()
    back = wait_for(lambda: (s := m.status(first)) and sum(x["alive"] for x in s["managers"]) == 2 and s, 20)
    assert back and back["leader"] != back["self"], back
    assert m.leader() == other
    code, body = m.call(first, "DELETE", "/session/run-0")
    assert code == 200, body
    m.settled(30, also=lambda c: c["RUNNING"] == CAPACITY and c["TERMINATED"] == 1)  # a pending one took its place
    m.check({**running, **answers})
