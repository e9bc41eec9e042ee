"""Replay of scheduling rounds through the dispatcher's real rounds on the in-process harness: each round kept
with its number in what a waiting session shows, the list of rounds, a replay that reproduces the past decision
and says what changed in the cluster since and what would be decided now, a record that no longer matches what
today's scheduler decides and the rounds kept bounded (the routes and the CLI: tests/test_cli_scheduling.py)."""

from __future__ import annotations

import pytest

from bai.node.manager.domain_errors import NotFound
from bai.node.scheduler import record
from bai.node.scheduler.snapshot import Decisions, Placement
from tests.harness import Harness

MULTIFACTOR = {"scaling_groups": {"default": {"policy": "multifactor"}}}


async def test_a_round_is_kept_and_replayed_with_what_changed_since(tmp_path) -> None:
    async with Harness(tmp_path, config=MULTIFACTOR) as h:
        await h.add_agent("a1", cpu=1)
        await h.create("rp-first", cpu=1)
        await h.create("rp-second", cpu=1)
        await h.schedule()
        await h.wait("rp-first", "RUNNING")
        waiting = await h.info("rp-second")
        number = waiting["statusData"]["scheduler"]["round"]
        rounds = h.services.scheduler_rounds
        assert rounds is not None
        (latest, *_) = await rounds.list(5)
        assert latest["round"] == number
        assert (latest["pending"], latest["placed"], latest["waiting"]) == (2, 1, 1)
        replayed = await rounds.replay(number)
        assert replayed["reproduced"] is True and replayed["differences"] == []
        assert "rp-first: placed on a1" in replayed["decisions"]
        assert any(line.startswith("rp-second: waited (") for line in replayed["decisions"])
        # nothing changed but the clock? the first started since: the snapshot says so, and now the second waits
        h.advance(120)
        replayed = await rounds.replay(number)
        assert replayed["changes"][0] == "time: 2 min later", replayed["changes"]
        assert any("rp-first" in line and "started or ended" in line for line in replayed["changes"]), replayed
        assert any(line.startswith("rp-first: no longer pending") for line in replayed["now"]), replayed["now"]
        # the first ends: now the second would be placed (nothing is applied by a replay)
        await h.destroy("rp-first")
        replayed = await rounds.replay(number)
        assert any(line.startswith("rp-second: waited") and "placed on a1" in line for line in replayed["now"])
        assert (await h.row("rp-second")).status == "PENDING"


async def test_a_record_today_s_scheduler_decides_differently_and_the_rounds_kept(tmp_path) -> None:
    config = {**MULTIFACTOR, "manager": {"scheduler_rounds_kept": 3}}
    async with Harness(tmp_path, config=config) as h:
        await h.add_agent("a1", cpu=1)
        await h.create("rp-one", cpu=1)
        await h.create("rp-two", cpu=1)
        for _ in range(5):
            await h.schedule()
        rounds = h.services.scheduler_rounds
        assert rounds is not None
        kept = [r["round"] for r in await rounds.list(10)]
        assert len(kept) == 3 and kept == sorted(kept, reverse=True)
        with pytest.raises(NotFound):
            await rounds.replay(kept[-1] - 1)  # no longer kept
        # what was recorded then differs from what the scheduler decides now on the same snapshot (as after a
        # change of the scheduler's code): the replay says how
        assert (await rounds.replay(kept[0]))["reproduced"] is True  # (its record written, as the replay waits)
        stored = await h.store.scheduler_round(kept[0])
        assert stored is not None and stored.snapshot
        then = record.decode(stored.decisions)
        waiting = then.pending[0]
        forged = Decisions(placements=[Placement(waiting.session_id, {"k": "a9"})])
        await h.store.add_scheduler_round(stored.at, stored.digest, stored.snapshot, record.encode(forged), {}, 3)
        (newest, *_) = await rounds.list(1)
        replayed = await rounds.replay(newest["round"])
        assert replayed["reproduced"] is False
        assert any("placed on a9 → waited" in line for line in replayed["differences"]), replayed["differences"]
