"""Stopping background work: a loop stopped while it waits for its own tasks to end is stopped (a node's stop
hung 30 s when a manager's leadership loop, cancelled in the middle of stopping its dispatcher, ran on)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from bai.common.background import Background, cancel_and_wait


async def _stubborn_end(started: asyncio.Event) -> None:
    """A task that takes a while to end once cancelled (as a round finishing its database call)."""
    started.set()
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        await asyncio.sleep(0.05)
        raise


async def test_a_loop_cancelled_while_it_closes_its_background_stops() -> None:
    rounds = 0
    first = asyncio.Event()

    async def loop() -> None:
        nonlocal rounds
        while rounds < 20:  # (bounded: a loop that ran on would not hang the test's event loop)
            background = Background(logging.getLogger("test"))
            started = asyncio.Event()
            background.spawn(_stubborn_end(started), "round")
            await started.wait()
            rounds += 1
            first.set()
            await background.close()  # (the loop is cancelled here)

    task = asyncio.create_task(loop())
    await first.wait()
    await asyncio.sleep(0.01)  # in close, waiting for the round to end
    task.cancel()
    await asyncio.wait_for(asyncio.wait([task]), 2)
    assert task.cancelled() and rounds == 1


async def test_the_tasks_own_ends_are_taken_and_an_unexpected_error_is_raised() -> None:
    async def fails(e: BaseException) -> None:
        raise e

    ok = asyncio.create_task(asyncio.sleep(60))
    expected = asyncio.create_task(fails(ConnectionError("gone")))
    await asyncio.sleep(0)
    await cancel_and_wait(ok, expected, None)  # cancelled, and an expected error: both ends
    assert ok.cancelled() and expected.done()

    unexpected = asyncio.create_task(fails(KeyError("bug")))
    await asyncio.sleep(0)
    with pytest.raises(KeyError):
        await cancel_and_wait(unexpected, expected=(ConnectionError,))


async def test_a_task_closing_itself_does_not_wait_for_itself() -> None:
    async def closes_itself() -> str:
        await cancel_and_wait(asyncio.current_task())
        return "ended"

    assert await asyncio.wait_for(closes_itself(), 1) == "ended"


async def test_a_task_that_lost_its_cancellation_is_cancelled_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A loop whose step swallowed the cancellation (Python 3.11's asyncio.wait_for loses one that comes as what
    it waits for ends) runs on: it is cancelled again, and the stop ends instead of hanging."""
    from bai.common import background

    monkeypatch.setattr(background, "RECANCEL", 0.05)
    steps = 0

    async def loop() -> None:
        nonlocal steps
        while steps < 200:  # (bounded: a loop that ran on would not hang the test's event loop)
            steps += 1
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                if steps < 3:
                    continue  # the first cancellations are lost
                raise

    task = asyncio.create_task(loop())
    await asyncio.sleep(0.02)
    await asyncio.wait_for(cancel_and_wait(task), 5)
    assert task.cancelled() and steps < 200
