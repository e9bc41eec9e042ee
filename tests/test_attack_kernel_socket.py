"""A kernel attacking its agent through the runner socket (/opt/bai/run/agent.sock; channel.py RunnerChannel).

The kernel may replace the runner, so every byte on that socket is hostile. Here the agent's side is a
RunnerChannel in this process, with the real runner connected to it as a subprocess (the session that must
keep working), and the attacker is another process that floods and holds connections, or a fake runner
that sends records no runner sends. What must hold: the agent's RSS and open files do not grow with what
the kernel sends, extra connections are refused (closed unread) and said once in the log, and the real
runner still runs code afterwards. The same against a real Docker kernel: test_attack_terminal.py."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bai.node.agent import channel as channel_mod
from bai.node.agent.channel import (
    HELLO_LIMIT,
    MAX_BUFFERED,
    MAX_KERNEL_BUFFERED,
    MAX_RUNNER_LINE,
    MAX_UNGREETED,
    RECORD_COST,
    LineReader,
    LogThrottle,
    RunnerChannel,
    exit_code_of,
)

RUNNER = Path(__file__).resolve().parent.parent / "bai" / "node" / "agent" / "runner.py"
PYTHON = os.environ.get("BAI_RUNNER_PYTHON", sys.executable)
MB = 1024 * 1024

# The attacker: N connections at once, each sending up to SIZE bytes without a newline in 64 KiB pieces, then
# holding it open; prints how many it opened, how many the agent closed (send failed) and the bytes it took.
FLOOD = r"""
import socket, sys, threading, time
path, n, size, hold = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
chunk = b"x" * 65536
closed = [0]; sent = [0]; lock = threading.Lock(); socks = []
def one():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(hold)
    try:
        s.connect(path)
    except OSError:
        with lock: closed[0] += 1
        return
    socks.append(s)
    done = 0
    try:
        while done < size:
            done += s.send(chunk)
    except OSError:  # closed by the agent (EPIPE / ECONNRESET), or the send blocked past `hold`
        with lock: closed[0] += 1
    with lock: sent[0] += done
threads = [threading.Thread(target=one) for _ in range(n)]
for t in threads: t.start()
for t in threads: t.join()
print(len(socks), closed[0], sent[0], flush=True)
time.sleep(float(sys.argv[5]) if len(sys.argv) > 5 else 0)
"""


def rss() -> int:
    return psutil.Process().memory_info().rss


def fds() -> int:
    return psutil.Process().num_fds()


class Kernel:
    """The real runner (--connect) and the agent's channel it connected to, with what reached feed()."""

    def __init__(self, channel: RunnerChannel, proc: asyncio.subprocess.Process | None) -> None:
        self.channel = channel
        self.proc = proc
        self.records: list[dict[str, Any]] = []
        feed = channel.feed

        def recording_feed(record: dict[str, Any]) -> None:
            self.records.append(record)
            feed(record)

        channel.feed = recording_feed  # type: ignore[method-assign]

    async def query(self, code: str, timeout: float = 10.0) -> tuple[str, int | None]:
        run_id = secrets.token_hex(4)
        await self.channel.start_run(run_id, "query", code)
        out = ""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = await self.channel.next_result(run_id, 0.5)
            out += "".join(text for kind, text in result.console if kind == "stdout")
            if result.status == "finished":
                return out, result.exit_code
        raise AssertionError(f"query {code!r} did not finish")


@pytest.fixture
async def kernel(tmp_path: Path) -> AsyncIterator[Kernel]:
    workdir = tmp_path / "work"
    workdir.mkdir()
    channel = RunnerChannel(tmp_path / "agent.sock", lambda kind, text: None)
    await channel.listen()
    proc = await asyncio.create_subprocess_exec(
        *[PYTHON, "-u", str(RUNNER), "--connect", str(tmp_path / "agent.sock"), "--workdir", str(workdir)],
        env={**os.environ, "HOME": str(tmp_path)},
    )
    try:
        await channel.wait_connected(asyncio.get_running_loop().time() + 10)
        yield Kernel(channel, proc)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 10)
        await channel.close()


@pytest.fixture
async def fake(tmp_path: Path) -> AsyncIterator[tuple[Kernel, asyncio.StreamReader, asyncio.StreamWriter]]:
    """A channel whose 'runner' is this test: (kernel, reader, writer) of a connection that said hello."""
    channel = RunnerChannel(tmp_path / "agent.sock", lambda kind, text: None)
    await channel.listen()
    reader, writer = await asyncio.open_unix_connection(str(tmp_path / "agent.sock"))
    writer.write(b'{"t": "hello", "pid": 1}\n')
    await channel.wait_connected(asyncio.get_running_loop().time() + 5)
    try:
        yield Kernel(channel, None), reader, writer
    finally:
        writer.close()
        await channel.close()


async def flood(path: Path, n: int, size: int, hold: float, linger: float = 0.0) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        FLOOD,
        str(path),
        str(n),
        str(size),
        str(hold),
        str(linger),
        stdout=subprocess.PIPE,
    )


async def settle(channel: RunnerChannel, timeout: float = 5.0) -> None:
    """Until only the runner's connection is open."""
    deadline = time.monotonic() + timeout
    while channel.open_connections > 1 or channel.ungreeted:
        assert time.monotonic() < deadline, (channel.open_connections, channel.ungreeted)
        await asyncio.sleep(0.02)


async def test_a_flood_of_connections_without_a_newline_holds_no_memory(
    kernel: Kernel, caplog: pytest.LogCaptureFixture
) -> None:
    """The review's attack: many connections each sending megabytes without a newline (it took a node from
    61 MB to 998 MB). Each may make the agent hold HELLO_LIMIT bytes; past MAX_UNGREETED they are closed
    unread; the refusals are one log line, not one per connection."""
    assert (await kernel.query("print(6 * 7)"))[0] == "42\n"
    rss_before, fds_before = rss(), fds()
    caplog.set_level(logging.WARNING, logger="bai.agent.channel")
    attacker = await flood(kernel.channel.socket_path, 100, 15 * MB, hold=3.0)
    out, _ = await asyncio.wait_for(attacker.communicate(), 30)
    opened, closed, taken = map(int, out.split())
    grown = rss() - rss_before
    await settle(kernel.channel)
    print(
        f"RSS {rss_before / MB:.1f} -> +{grown / MB:.1f} MB, fds {fds_before} -> {fds()}, {opened} opened, "
        f"{closed} closed by the agent, {taken / MB:.1f} MB sent in all"
    )
    assert grown < 20 * MB
    assert closed == 100  # every one was closed (none is held to be read later)
    assert taken < 100 * (HELLO_LIMIT + 2 * MB)  # (what the kernel's socket buffers took, not the agent)
    assert fds() <= fds_before + 1
    refusals = [r for r in caplog.records if "refused" in r.getMessage() or "greet" in r.getMessage()]
    assert 1 <= len(refusals) <= 4, [r.getMessage() for r in refusals]
    assert (await kernel.query("print('still here')"))[0] == "still here\n"


async def test_idle_connections_are_capped_and_timed_out(
    kernel: Kernel, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Connections that say nothing: at most MAX_UNGREETED wait for their first line, each at most
    HELLO_TIMEOUT seconds; the others are closed at once; then the runner works."""
    monkeypatch.setattr(channel_mod, "HELLO_TIMEOUT", 0.5)
    caplog.set_level(logging.WARNING, logger="bai.agent.channel")
    fds_before = fds()
    conns = [await asyncio.open_unix_connection(str(kernel.channel.socket_path)) for _ in range(150)]
    start = time.monotonic()
    ended = await asyncio.gather(*(asyncio.wait_for(r.read(), 5) for r, _ in conns))
    took = time.monotonic() - start
    assert ended == [b""] * 150 and took < 3  # every one closed by the agent, the last within the timeout
    for _, w in conns:
        w.close()
        await w.wait_closed()
    assert kernel.channel.ungreeted == 0
    await settle(kernel.channel)
    assert fds() <= fds_before + 1
    messages = [r.getMessage() for r in caplog.records]
    assert any(f"not greeted yet (at most {MAX_UNGREETED})" in m for m in messages)
    assert len(messages) <= 4, messages
    assert (await kernel.query("print(1)"))[0] == "1\n"


async def test_a_long_first_line_is_refused_at_the_hello_limit(kernel: Kernel) -> None:
    reader, writer = await asyncio.open_unix_connection(str(kernel.channel.socket_path))
    writer.write(b'{"t": "hello", "pad": "' + b"p" * (2 * HELLO_LIMIT) + b'"}\n')
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    assert (await kernel.query("print(2)"))[0] == "2\n"  # and the runner it did not replace works


async def test_a_runner_line_over_the_limit_is_read_through_not_kept(fake: tuple[Kernel, Any, Any]) -> None:
    """After the hello, a line may be MAX_RUNNER_LINE bytes; a longer one (here 6 times that, never ended
    until the end) is dropped as it comes, the run is told, and the records after it arrive."""
    kernel, _, writer = fake
    await kernel.channel.start_run("r1", "query", "x")
    rss_before = rss()
    piece = b"y" * (256 * 1024)
    writer.write(b'{"t": "stdout", "d": "')
    for _ in range(6 * MAX_RUNNER_LINE // len(piece)):
        writer.write(piece)
        await writer.drain()
    writer.write(b'"}\n{"t": "stdout", "d": "after"}\n{"t": "finished", "exit": 0}\n')
    await writer.drain()
    result = await kernel.channel.next_result("r1", 5)
    text = "".join(t for _, t in result.console)
    grown = rss() - rss_before
    print(f"RSS +{grown / MB:.1f} MB for a {6 * MAX_RUNNER_LINE / MB:.0f} MB line")
    assert "more than the" in text and text.endswith("after") and result.status == "finished"
    assert grown < 3 * MAX_RUNNER_LINE


async def test_records_no_runner_sends_are_harmless(fake: tuple[Kernel, Any, Any]) -> None:
    """Wrong types, huge numbers, deep nesting, unknown kinds, a path that is a list: each is ignored or
    clamped; the connection lives and the run ends with a code msgpack can carry."""
    kernel, _, writer = fake
    await kernel.channel.start_run("r1", "query", "x")
    lines = [
        b'{"t": "stdout", "d": ["not", "text"]}',
        b'{"t": "put-file", "path": ["a"]}',
        b'{"t": "service", "id": {"x": 1}}',
        b'{"t": "waiting-input", "opts": "yes"}',
        b"[" * 100000 + b"]" * 100000,
        b'{"t": "clean-finished", "exit": 0}',
        b"9" * 5000,
        b'{"t": "nonsense"}',
        b"\xff\xfe",
        b'{"t": "stdout", "d": "ok"}',
        b'{"t": "finished", "exit": ' + str(10**30).encode() + b"}",
    ]
    writer.write(b"\n".join(lines) + b"\n")
    await writer.drain()
    console: list[list[str]] = []
    statuses = []
    for _ in range(5):
        result = await kernel.channel.next_result("r1", 2)
        console += result.console
        statuses.append(result.status)
        if result.status == "finished":
            break
    assert statuses == ["waiting-input", "finished"]
    assert result.exit_code == 2**31 - 1
    assert console == [["stdout", "ok"]]
    assert kernel.channel.connected.is_set() and kernel.channel.writer is not None


async def test_records_queued_for_a_run_nobody_reads_are_bounded(fake: tuple[Kernel, Any, Any]) -> None:
    """Records (not only output) that queue for a run count against MAX_BUFFERED: 300,000 tiny records
    nobody reads keep at most MAX_BUFFERED / RECORD_COST of them."""
    kernel, _, writer = fake
    await kernel.channel.start_run("r1", "query", "x")
    batch = b'{"t": "waiting-input"}\n{"t": "stdout", "d": ""}\n' * 5000
    for _ in range(30):
        writer.write(batch)
        await writer.drain()
    writer.write(b'{"t": "finished", "exit": 0}\n')
    await writer.drain()
    run = kernel.channel.runs["r1"]
    deadline = time.monotonic() + 10
    while run.state != "finished":
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    assert run.records.qsize() <= MAX_BUFFERED // RECORD_COST + 2
    assert run.dropped


async def test_unread_output_of_all_a_kernels_runs_is_bounded(fake: tuple[Kernel, Any, Any]) -> None:
    """Runs whose output nobody reads each keep at most MAX_BUFFERED, and all the kernel's together at most
    MAX_KERNEL_BUFFERED (finished runs wait to be read, KEEP_FINISHED of them); reading one frees its part."""
    kernel, _, writer = fake
    channel = kernel.channel
    chunk = json.dumps({"t": "stdout", "d": "o" * (512 * 1024)}).encode() + b"\n"
    for i in range(4):
        await channel.start_run(f"r{i}", "query", "x")
        for _ in range(14):  # 7 MiB each
            writer.write(chunk)
        writer.write(b'{"t": "finished", "exit": 0}\n')
        await writer.drain()
        deadline = time.monotonic() + 10
        while channel.runs[f"r{i}"].state != "finished":
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
    held = [channel.runs[f"r{i}"].buffered for i in range(4)]
    assert sum(held) == channel.buffered <= MAX_KERNEL_BUFFERED
    assert held[0] > 7 * MB and held[3] < MB and channel.runs["r3"].dropped
    first = await channel.next_result("r0", 1)
    assert sum(len(t) for _, t in first.console) == 7 * MB and first.status == "finished"
    assert channel.buffered == sum(held[1:])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.one_of(
            st.binary(max_size=300),
            st.recursive(
                st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                lambda c: (
                    st.lists(c, max_size=4)
                    | st.dictionaries(st.sampled_from(["t", "d", "exit", "opts", "path", "id", "x"]), c, max_size=4)
                ),
                max_leaves=12,
            ).map(lambda v: json.dumps(v).encode()),
            st.fixed_dictionaries(
                {
                    "t": st.sampled_from(
                        [
                            "stdout",
                            "stderr",
                            "finished",
                            "waiting-input",
                            "env",
                            "tunnel",
                            "service",
                            "put-file",
                            "build-finished",
                        ]
                    )
                },
                optional={
                    "d": st.text(max_size=10) | st.integers(),
                    "exit": st.integers() | st.text(max_size=3),
                    "id": st.text(max_size=5),
                    "opts": st.integers() | st.dictionaries(st.text(max_size=3), st.booleans()),
                },
            ).map(lambda v: json.dumps(v).encode()),
        ),
        max_size=20,
    )
)
async def test_any_lines_from_the_kernel_leave_the_channel_working(tmp_path: Path, lines: list[bytes]) -> None:
    """Whatever lines a kernel sends, the agent's channel neither raises nor hangs up: a run started
    afterwards still gets its output and end."""
    path = tmp_path / f"h{secrets.token_hex(3)}.sock"
    channel = RunnerChannel(path, lambda kind, text: None)
    await channel.listen()
    reader, writer = await asyncio.open_unix_connection(str(path))
    try:
        writer.write(b'{"t": "hello"}\n')
        await channel.wait_connected(asyncio.get_running_loop().time() + 5)
        await channel.start_run("before", "query", "x")
        writer.write(b"".join(line.replace(b"\n", b" ") + b"\n" for line in lines))
        writer.write(b'{"t": "finished", "exit": 0}\n')  # ends "before" if nothing did
        read_all: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        channel._put_waiters["sentinel"] = read_all  # answered once every line before it was taken
        writer.write(b'{"t": "put-file", "path": "sentinel", "ok": true}\n')
        await asyncio.wait_for(read_all, 5)
        assert channel.current is None
        await channel.start_run("after", "query", "x")
        writer.write(b'{"t": "stdout", "d": "alive"}\n{"t": "finished", "exit": 3}\n')
        await writer.drain()
        out, code = "", None
        deadline = time.monotonic() + 5
        while code is None:
            assert time.monotonic() < deadline
            result = await channel.next_result("after", 1)
            out += "".join(t for k, t in result.console if k == "stdout")
            if result.status == "finished":
                code = result.exit_code
        assert channel.writer is not None  # still connected
        assert (out, code) == ("alive", 3)
    finally:
        writer.close()
        await channel.close()


async def test_line_reader_bounds_and_splits() -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(b"a\nbb\n" + b"z" * 5000 + b"\nc")
    reader.feed_data(b"d\n")
    reader.feed_eof()
    lines = LineReader(reader, limit=1000, chunk=512)
    got = [await lines.next() for _ in range(5)]
    assert got == [b"a\n", b"bb\n", 5001, b"cd\n", None]


def test_log_throttle_says_a_burst_once_then_counts(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("bai.test.throttle")
    caplog.set_level(logging.INFO, logger="bai.test.throttle")
    throttle = LogThrottle(logger, every=0.2)
    for i in range(1000):
        throttle(logging.INFO, "refused %d", i)
    assert [r.getMessage() for r in caplog.records] == ["refused 0"]
    time.sleep(0.25)
    throttle(logging.INFO, "refused %d", 1000)  # (no loop here: the count comes with the next line)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3 and messages[1].startswith("999 more like this") and messages[2] == "refused 1000"


def test_exit_codes_a_kernel_reports_are_clamped() -> None:
    assert [exit_code_of(v) for v in (0, 137, -9, 10**30, -(10**30), "1", 1.5, True, None)] == [
        0,
        137,
        -9,
        2**31 - 1,
        -(2**31),
        1,
        1,
        1,
        1,
    ]


# -- a kernel's forks --------------------------------------------------------------------------------------

FORK_ALL = r"""
import os, time
kids = []
try:
    while len(kids) < 1000:
        pid = os.fork()
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        kids.append(pid)
except OSError as e:
    print("forked", len(kids), "then errno", e.errno, flush=True)
time.sleep(30)
"""

FORK_SOME = r"""
import os, time
limits = [l for l in open("/proc/self/limits") if l.startswith("Max processes")]
kids = []
for _ in range(20):
    pid = os.fork()
    if pid == 0:
        time.sleep(1)
        os._exit(0)
    kids.append(pid)
for k in kids:
    os.waitpid(k, 0)
pids_max = "/sys/fs/cgroup/pids/pids.max" if os.path.exists("/sys/fs/cgroup/pids") else "/sys/fs/cgroup/pids.max"
print("forked", len(kids), limits[0].split()[2], open(pids_max).read().strip())
"""


@pytest.fixture(scope="module")
def low_pids_node(tmp_path_factory: pytest.TempPathFactory):
    from tests.nodeproc import Node, require_docker

    require_docker()
    node = Node(tmp_path_factory.mktemp("forks"), "docker", agent_config="pids_limit = 96\nnproc = 64\n").start()
    try:
        yield node
    finally:
        node.stop()


def test_one_kernels_forks_do_not_stop_anothers(low_pids_node) -> None:
    """The review saw `nproc = 200` make one user's forks fail other users' kernels (a ulimit counts every
    process of the uid on the node). Now no nproc ulimit is set; `[agent] nproc` (64 here, under pids_limit
    96) becomes the kernel's cgroup pids limit: kernel A forks until that limit stops it, kernel B forks all the
    same."""
    node = low_pids_node
    names = [f"fork-a-{secrets.token_hex(3)}", f"fork-b-{secrets.token_hex(3)}"]
    for name in names:
        node.cli("session", "create", "python", "--name", name, check=True)
    try:
        hog = node.popen("session", "exec", names[0], "-c", FORK_ALL)
        assert hog.stdout is not None
        line = hog.stdout.readline()  # once its forks fail (they hold their places while it sleeps)
        words = line.split()
        assert words[:1] == ["forked"] and words[3:] == ["errno", "11"], line  # EAGAIN
        assert 10 < int(words[1]) < 64  # stopped by its own pids limit (the runner and its threads count too)
        other = node.cli("session", "exec", names[1], "-c", FORK_SOME)
        assert other.returncode == 0, other.stderr
        forks, nproc, pids_max = other.stdout.split()[1:]
        assert forks == "20" and pids_max == "64"
        assert nproc == "unlimited" or int(nproc) > 1000  # no nproc ulimit of the agent's
        hog.kill()
    finally:
        for name in names:
            node.cli("session", "destroy", name)


# -- a kernel's dials ----------------------------------------------------------------------------------------


async def test_refused_dials_are_logged_once_per_burst(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A kernel dialling a port it may not (through its socket, as a peer proxy would) 200 times: each is
    closed, the agent's log says so once (with -v), not 200 times; the kernel's socket keeps working."""
    from decimal import Decimal

    from bai.node.agent.agent import Agent
    from bai.node.agent.backends.base import Kernel as AgentKernel
    from bai.node.agent.backends.base import KernelSpec
    from bai.node.agent.backends.sim import SimBackend
    from bai.node.link.inproc import InprocHub

    caplog.set_level(logging.INFO)
    hub = InprocHub()
    agent = Agent("a1", SimBackend(), hub.agent_link("a1"), {})  # type: ignore[arg-type]
    channel = RunnerChannel(tmp_path / "agent.sock", lambda kind, text: None)
    await channel.listen()
    spec = KernelSpec("k1", "s1", "s1", "AK", "img", {"cpu": Decimal(1)}, {})
    kernel = AgentKernel(spec=spec, channel=channel, run_dir=tmp_path)
    agent.kernels["k1"] = kernel
    agent._watch_exit(kernel)
    try:

        async def one() -> bytes:
            reader, writer = await asyncio.open_unix_connection(str(channel.socket_path))
            writer.write(b'{"dial": {"host": "sub1", "port": 22}}\n')
            try:
                return await asyncio.wait_for(reader.read(), 5)
            finally:
                writer.close()

        for _ in range(4):
            assert await asyncio.gather(*(one() for _ in range(50))) == [b""] * 50
        await settle(channel)
        refusals = [r for r in caplog.records if "may not connect" in r.getMessage()]
        assert len(refusals) == 1, [r.getMessage() for r in refusals]
        assert channel.open_connections == 0
    finally:
        await channel.close()
        for throttle in agent._dial_logs.values():
            throttle.close()


# -- from inside a real Docker kernel -------------------------------------------------------------------------


def test_a_docker_kernel_flooding_its_socket_leaves_the_node_as_it_was(docker_node) -> None:
    """The review's attack as it ran: code in a session opens 100 connections to /opt/bai/run/agent.sock, each
    sending 15 MiB without a newline. The node's RSS grows less than 50 MB, its open files come back, every
    connection was closed by the agent, and the session still runs code."""
    node = docker_node
    name = f"flood-{secrets.token_hex(3)}"
    node.cli("session", "create", "python", "--name", name, check=True)
    try:
        assert node.cli("session", "exec", name, "-c", "print(6 * 7)").stdout.strip() == "42"
        proc = psutil.Process(node.proc.pid)
        rss_before, fds_before = proc.memory_info().rss, proc.num_fds()
        code = f"import sys\nsys.argv = ['x', '/opt/bai/run/agent.sock', '100', '{15 * MB}', '5', '0']\n" + FLOOD
        start = time.monotonic()
        flooded = node.cli("session", "exec", name, "-c", code, timeout=120)
        took = time.monotonic() - start
        assert flooded.returncode == 0, flooded.stderr
        opened, closed, taken = map(int, flooded.stdout.split())
        peak = proc.memory_info().rss
        deadline = time.monotonic() + 10
        while proc.num_fds() > fds_before + 2:
            assert time.monotonic() < deadline, (fds_before, proc.num_fds())
            time.sleep(0.1)
        print(
            f"node RSS {rss_before / MB:.0f} MB -> {peak / MB:.0f} MB, fds {fds_before} -> {proc.num_fds()}, "
            f"{opened} connections, {closed} closed by the agent, {taken / MB:.1f} MB sent, {took:.1f} s"
        )
        assert peak - rss_before < 50 * MB
        assert opened == 100 and closed == 100
        assert node.cli("session", "exec", name, "-c", "print('still here')").stdout.strip() == "still here"
    finally:
        node.cli("session", "destroy", name)
