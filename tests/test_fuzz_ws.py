"""Property-based tests over WebSocket frames, against a real node (the simulated backend): the execute and
terminal WebSockets get text, binary, huge, deeply nested and wrongly typed frames, in any order. Whatever
arrives: the upgrade is never a 5xx, every frame the server sends is JSON, the connection ends with an error
frame or a close code (or, for a terminal, keeps answering), the node logs no traceback, and it answers after.

BAI_FUZZ_EXAMPLES sets how many examples (as in test_fuzz_routes: that many fixed, a sixth of it random)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
from collections.abc import Iterator

import aiohttp
import psutil
import pytest
import yarl
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.nodeproc import Node
from tests.test_attack_http import answers, signed_headers

EXAMPLES = int(os.environ.get("BAI_FUZZ_EXAMPLES", "30"))
COMMON = {"deadline": None, "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]}
FIXED = settings(max_examples=EXAMPLES, derandomize=True, **COMMON)
RANDOM = settings(max_examples=max(EXAMPLES // 6, 3), derandomize=False, database=None, **COMMON)
MiB = 1024 * 1024

NUMBER = st.integers() | st.floats() | st.sampled_from([10**30, -(10**30), 2**63, -1, 0, 1000, 1001, 1e308])
TEXT = st.text(max_size=30) | st.sampled_from(["", "\x00", "\ud800", "🙂", "sleep 0.2", "exit 3", "x" * 5000])
SCALAR = st.none() | st.booleans() | NUMBER | TEXT
JSON = st.recursive(
    SCALAR,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
FIELDS = ["type", "chars", "rows", "cols", "code", "mode", "runId", "kernel", "options", "data"]
KINDS = st.sampled_from(["stdin", "resize", "ping", "restart", "nonsense", "query", "batch", "input", "continue"])
OBJECT = st.dictionaries(st.sampled_from(FIELDS), JSON | KINDS, max_size=5)
STDIN = st.binary(max_size=40).map(lambda b: {"type": "stdin", "chars": base64.b64encode(b).decode()})
RESIZE = st.fixed_dictionaries({"type": st.just("resize"), "rows": NUMBER | TEXT, "cols": NUMBER | TEXT})
RUN = st.sampled_from(
    [{"mode": "batch", "code": "sleep 0.2"}, {"code": "print(1)"}, {"mode": "batch", "code": "echo hi"}]
)


def _text(value) -> str:
    return json.dumps(value)


FRAME = st.one_of(
    (OBJECT | STDIN | RESIZE | RUN | JSON).map(lambda v: ("text", _text(v))),
    st.text(max_size=60).map(lambda t: ("text", t)),  # not JSON
    st.binary(max_size=60).map(lambda b: ("binary", b)),
    st.integers(min_value=100, max_value=200_000).map(lambda n: ("text", "[" * n)),  # deep nesting
    st.integers(min_value=100, max_value=5000).map(lambda n: ("text", '{"a":' * n + "1" + "}" * n)),
    st.sampled_from([2, 5]).map(lambda n: ("text", "z" * (n * MiB))),  # over and under the frame limits
)
FRAMES = st.lists(FRAME, min_size=1, max_size=6)
# the execute WebSocket: half the time a run that starts, then anything while it runs
EXECUTE_FRAMES = st.tuples(RUN.map(lambda v: ("text", _text(v))) | FRAME, FRAMES).map(lambda t: [t[0], *t[1]])


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> Iterator[Node]:
    node = Node(tmp_path_factory.mktemp("fuzzws"), "sim").start()
    node.cli("session", "create", "--name", "ws-target", "python", check=True)
    yield node
    node.stop()


async def exchange(
    node: Node, path: str, frames: list[tuple[str, object]], linger: float, enough=lambda got: False
) -> tuple[list, object]:
    """Send the frames, then read until the server closes, `enough(frames so far)` or `linger` seconds
    pass: (frames, close code or None when still open). Fails on a 5xx upgrade or a frame that is not JSON."""
    got: list = []
    async with aiohttp.ClientSession() as http:
        url = yarl.URL(node.endpoint + path, encoded=True)
        try:
            ws = await http.ws_connect(url, headers=signed_headers(node, path), max_msg_size=0)
        except aiohttp.WSServerHandshakeError as e:
            assert e.status < 500, e
            return got, e.status
        async with ws:
            with contextlib.suppress(ConnectionError, aiohttp.ClientError):
                for kind, data in frames:
                    if ws.closed:
                        break
                    if kind == "text":
                        await ws.send_str(data)  # type: ignore[arg-type]
                    else:
                        await ws.send_bytes(data)  # type: ignore[arg-type]
            with contextlib.suppress(asyncio.TimeoutError):
                async with asyncio.timeout(linger):
                    async for msg in ws:
                        if msg.type == aiohttp.WSMsgType.TEXT:
                            got.append(json.loads(msg.data))  # every text frame the server sends is JSON
                            if enough(got):
                                break
            return got, ws.close_code if ws.closed else None


def check_log(node: Node) -> None:
    text = node.log_path.read_text(errors="replace")
    assert "Traceback" not in text and " ERROR " not in text, text[-3000:]


def _execute(node: Node, frames) -> None:
    got, code = asyncio.run(exchange(node, "/stream/session/ws-target/execute", frames, linger=5.0))
    check_log(node)
    # the server ended it: after a last result, an error frame, or with a close code
    assert code is not None, (frames[:1], got)
    if got and code in (1000, None):
        assert got[-1].get("status") in ("finished", "error"), got


def _typed(got: list) -> bytes:
    return b"".join(base64.b64decode(f["data"]) for f in got if f.get("type") == "out")


def _probed(got: list) -> bool:
    return b"probe-ok" in _typed(got)


def _terminal(node: Node, frames) -> None:
    probe = [("text", json.dumps({"type": "stdin", "chars": base64.b64encode(b"\recho probe-ok\r").decode()}))]
    got, code = asyncio.run(exchange(node, "/stream/session/ws-target/pty", frames + probe, 3.0, _probed))
    check_log(node)
    kinds = {f.get("type") for f in got}
    assert kinds <= {"out", "error", "exit"}, got
    if code is None:  # still open: it still answers (what was typed comes back)
        assert _probed(got), got


SLEEP = ("text", json.dumps({"mode": "batch", "code": "sleep 0.2"}))


@FIXED
@given(frames=EXECUTE_FRAMES)
@example(frames=[SLEEP, ("text", "[" * 100_000), ("binary", b""), ("text", "line")])
@example(frames=[SLEEP, *[("text", "w" * 60_000)] * 20])  # over the queued input bytes
@example(frames=[SLEEP, ("text", "z" * (5 * MiB))])
@example(frames=[("text", json.dumps({"code": 1, "mode": ["query"]}))])
def test_execute_frames(node: Node, frames) -> None:
    _execute(node, frames)


@RANDOM
@given(frames=EXECUTE_FRAMES)
def test_execute_frames_random(node: Node, frames) -> None:
    _execute(node, frames)


@FIXED
@given(frames=FRAMES)
@example(frames=[("text", "[" * 100_000), ("text", json.dumps({"type": "resize", "rows": 10**30, "cols": 80}))])
@example(frames=[("text", json.dumps({"type": "resize", "rows": "1e400", "cols": 1e308}))])
@example(frames=[("text", json.dumps({"type": "stdin", "chars": "!!"}))] * 40)  # too many bad frames: 1008
@example(frames=[("text", json.dumps({"type": "stdin", "chars": base64.b64encode(b"p" * 700_000).decode()}))])
def test_terminal_frames(node: Node, frames) -> None:
    _terminal(node, frames)


@RANDOM
@given(frames=FRAMES)
def test_terminal_frames_random(node: Node, frames) -> None:
    _terminal(node, frames)


def test_the_node_is_well_after_the_fuzz(node: Node) -> None:
    """(Runs after the fuzz in this module's order.) No traceback, bounded memory, fds back, and it answers."""
    proc = psutil.Process(node.proc.pid)
    print(f"after the WebSocket fuzz: RSS {proc.memory_info().rss / MiB:.0f} MiB, {proc.num_fds()} fds")
    check_log(node)
    assert proc.num_fds() < 40
    assert answers(node, "127.0.0.1")
