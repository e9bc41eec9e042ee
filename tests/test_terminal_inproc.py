"""A terminal over the link stream, on the in-process harness with the simulated backend's pretend shell:
keystrokes in, output out, resizes, the exit status, and what happens when a side goes away."""

from __future__ import annotations

import asyncio

import pytest

from bai.node.manager.domain_errors import NotRunning
from tests.harness import Harness


async def shown(stream, text: bytes) -> bytes:
    seen = b""
    while text not in seen:
        frame = await asyncio.wait_for(stream.receive(), 5)
        assert frame is not None, seen
        if frame["t"] == "out":
            seen += frame["d"]
    return seen


async def test_keys_resizes_and_the_exit_status_travel_the_stream(tmp_path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("a1")
        await h.create("term-1")
        await h.schedule()
        row = await h.wait("term-1", "RUNNING")
        stream = await h.ops.open_terminal(row, None, 30, 100)
        await stream.send({"t": "in", "d": b"size\r"})
        await shown(stream, b"30 100")
        await stream.send({"t": "resize", "rows": 40, "cols": 120})
        await stream.send({"t": "in", "d": b"size\r"})
        await shown(stream, b"40 120")
        await stream.send({"t": "in", "d": b"exit 4\r"})
        frames = []
        while (frame := await asyncio.wait_for(stream.receive(), 5)) is not None:
            frames.append(frame)
        assert frames[-1] == {"t": "exit", "code": 4}
        assert stream.closed_reason == ""  # the agent ended it normally


async def test_a_client_going_away_ends_the_command(tmp_path) -> None:
    async with Harness(tmp_path) as h:
        node = await h.add_agent("a1")
        await h.create("term-2")
        await h.schedule()
        row = await h.wait("term-2", "RUNNING")
        stream = await h.ops.open_terminal(row, None, 24, 80)
        await stream.send({"t": "in", "d": b"hello\r"})
        await shown(stream, b"hello")
        [terminal] = node.backend.terminals
        assert terminal.code is None  # the command runs
        await stream.close("the client went away")
        for _ in range(100):
            if terminal.code is not None:
                break
            await asyncio.sleep(0.01)
        assert terminal.code == 129  # hung up, as when a terminal closes


async def test_no_terminal_before_the_session_runs(tmp_path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("a1", cpu=1)
        await h.create("big-one", cpu=1)
        await h.create("waiting", cpu=1)
        await h.schedule()
        with pytest.raises(NotRunning, match="a terminal needs a running kernel"):
            await h.ops.open_terminal(await h.row("waiting"), None, 24, 80)


async def test_a_kernel_has_a_bounded_number_of_terminals(tmp_path) -> None:
    from bai.node.agent.agent import MAX_TERMINALS

    async with Harness(tmp_path) as h:
        await h.add_agent("a1")
        await h.create("term-many")
        await h.schedule()
        row = await h.wait("term-many", "RUNNING")
        streams = [await h.ops.open_terminal(row, None, 24, 80) for _ in range(MAX_TERMINALS)]
        for s in streams:  # all open and answering
            await s.send({"t": "in", "d": b"x\r"})
            await shown(s, b"x")
        extra = await h.ops.open_terminal(row, None, 24, 80)
        assert await asyncio.wait_for(extra.receive(), 5) is None
        assert f"at most {MAX_TERMINALS} terminals" in (extra.closed_reason or "")
        await streams[0].close("done")
        await asyncio.sleep(0.05)
        again = await h.ops.open_terminal(row, None, 24, 80)  # a place came free
        await again.send({"t": "in", "d": b"y\r"})
        await shown(again, b"y")


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("[" * 100_000, "nested too deeply"),
        ('{"type": "resize", "rows": 1000000000000000000000000000000, "cols": 80}', "between 1 and 1000"),
        ('{"type": "resize", "rows": 0, "cols": 80}', "between 1 and 1000"),
        ('{"type": "resize", "rows": 1e400, "cols": 80}', "whole rows and cols"),  # inf
        ('{"type": "resize", "rows": true, "cols": 80}', "whole rows and cols"),
        ('{"type": "resize", "rows": "99999999", "cols": 80}', "whole rows and cols"),
        ('{"type": "stdin", "chars": 5}', "base64"),
        ('{"type": "stdin", "chars": "!!"}', "base64"),
        ("[1, 2]", "JSON objects"),
        ("not json", "JSON objects"),
    ],
)
def test_bad_terminal_frames_are_refused_with_a_reason(text: str, error: str) -> None:
    from bai.node.manager.http.terminal_routes import FrameError, decode_frame

    with pytest.raises(FrameError, match=error):
        decode_frame(text)


def test_good_terminal_frames_become_link_frames() -> None:
    from bai.node.manager.http.terminal_routes import decode_frame

    assert decode_frame('{"type": "resize", "rows": 40, "cols": "120"}') == {"t": "resize", "rows": 40, "cols": 120}
    assert decode_frame('{"type": "resize", "rows": 40.0, "cols": 1000}') == {"t": "resize", "rows": 40, "cols": 1000}
    assert decode_frame('{"type": "stdin", "chars": "aGk="}') == {"t": "in", "d": b"hi"}
    assert decode_frame('{"type": "ping"}') is None
