"""A subscriber that stops reading (an event stream whose client went quiet) cannot make the manager
keep every later event for it: past its backlog it is dropped and told so, the others go on, and a
waiter that fell behind re-reads the session instead of missing its change."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from bai.node.manager.services.hubs import EventHub, Lagged, SessionEvents
from bai.node.manager.state.records import Session
from tests.records import a_session


async def test_a_slow_subscriber_is_dropped_at_its_backlog_and_others_keep_every_event() -> None:
    hub = EventHub(backlog=100)
    with hub.subscribe() as slow, hub.subscribe() as fast:
        got = []
        for i in range(1000):
            hub.publish("session_started", {"id": str(i)})
            got.append(await fast.get())
        assert [row["id"] for _, row in got] == [str(i) for i in range(1000)]
        assert slow.qsize() <= 1  # not 1000 held for a reader that never came
        with pytest.raises(Lagged):
            await slow.get()


async def test_a_reader_waiting_when_it_is_dropped_is_woken_with_lagged() -> None:
    hub = EventHub(backlog=2)
    with hub.subscribe() as q:
        hub.publish("a", {"id": "1"})
        assert await q.get() == ("a", {"id": "1"})
        reader = asyncio.ensure_future(q.get())
        await asyncio.sleep(0)
        for i in range(5):
            hub.publish("b", {"id": str(i)})  # the reader is woken but runs only after it lagged
        with pytest.raises(Lagged):
            await asyncio.wait_for(reader, 1)  # woken (not left waiting forever), and told
        with pytest.raises(Lagged):
            await q.get()


async def test_wait_for_rereads_the_session_after_falling_behind() -> None:
    hub = SessionEvents(backlog=1)
    state = a_session(id="s", status="PENDING")

    async def current() -> Session:
        return state

    waiter = asyncio.ensure_future(hub.wait_for("s", current, lambda r: r.status == "RUNNING", 5))
    await asyncio.sleep(0.01)
    state = msgspec.structs.replace(state, status="RUNNING")
    for i in range(50):  # a burst of other sessions' events hides the one it waits for
        hub.publish("x", a_session(id=f"other-{i}"))
    hub.publish("session_started", state)
    found = await asyncio.wait_for(waiter, 2)
    assert found is not None and found.status == "RUNNING"


async def test_an_event_stream_that_fell_behind_ends_saying_so() -> None:
    from bai.node.manager.http.sse import EventStream

    written: list[bytes] = []

    class Response:
        async def write(self, data: bytes) -> None:
            written.append(data)

    stream = EventStream(Response(), keepalive=60)  # type: ignore[arg-type]
    hub = EventHub(backlog=1)
    with hub.subscribe() as q:
        hub.publish("a", {"id": "1"})
        hub.publish("b", {"id": "2"})  # over the backlog: dropped

        async def producer() -> None:
            while True:
                await q.get()

        assert await stream.serve(producer()) is True
    assert written and b"fell 1 events behind" in written[-1] and b"reconnect" in written[-1]
