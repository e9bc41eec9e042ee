"""What one manager hears of another's session events (services/cluster_events.py): the session is read from
the database and published to this manager's own subscribers, and only while it has some (a follower is told of
every move the leader makes: read for nobody, each would wait in its database's queue with the creates it serves)."""

from __future__ import annotations

import asyncio
import json

from bai.node.manager.services.cluster_events import ClusterEvents
from bai.node.manager.services.hubs import Hubs
from bai.node.manager.services.wakeup import Wakeup


async def test_another_managers_session_event_is_read_for_this_ones_watchers_only() -> None:
    hubs = Hubs()
    reads: list[str] = []
    sent: list[str] = []

    async def get_session(session_id: str) -> object:
        reads.append(session_id)
        return type("Row", (), {"id": session_id})()

    relay = ClusterEvents("me", hubs, Wakeup(), get_session, sent.append, {})  # type: ignore[arg-type]
    event = json.dumps({"m": "other", "h": "e", "n": "session_started", "id": "s1"})
    relay.received([event])
    await asyncio.sleep(0)
    assert reads == [] and relay.received_count == 1  # nobody watches here: nothing read
    with hubs.events.subscribe() as watcher:
        relay.received([event, json.dumps({"m": "me", "h": "e", "n": "session_started", "id": "mine"})])
        name, row = await asyncio.wait_for(watcher.get(), 2)
        assert (name, row.id) == ("session_started", "s1") and reads == ["s1"]  # (its own event skipped)
    await relay.close()
