"""Apps in a kernel through its runner: start-service and tunnels (runner.py) and RunnerChannel's
start_service / open_tunnel, with the real runner as a subprocess connected to a listening channel."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bai.node.agent.channel import NO_RUNNER, Channel, ChannelError, RunnerChannel
from tests.nodeproc import free_port

RUNNER = Path(__file__).resolve().parent.parent / "bai" / "node" / "agent" / "runner.py"
PYTHON = os.environ.get("BAI_RUNNER_PYTHON", sys.executable)
HTTP_SERVER = ["{runtime_path}", "-m", "http.server", "{port}", "--bind", "127.0.0.1"]


def unique(base: str) -> str:
    """An app name no other test (or test run) uses: their logs in /tmp stay apart."""
    return f"{base}-{secrets.token_hex(4)}"


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


async def wait_for_file(path: Path, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text()):
        assert time.monotonic() < deadline, f"{path} did not appear"
        await asyncio.sleep(0.02)
    return path.read_text()


class Kernel:
    """A runner process (--connect) and the channel it connected to."""

    def __init__(self, channel: RunnerChannel, proc: asyncio.subprocess.Process, workdir: Path, defs: Path) -> None:
        self.channel = channel
        self.proc = proc
        self.workdir = workdir
        self.defs = defs
        self.records: list[dict[str, Any]] = []  # everything that reached feed()
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

    async def ping(self) -> None:
        before = sum(r.get("t") == "pong" for r in self.records)
        await self.channel._send({"op": "ping"})
        deadline = time.monotonic() + 5
        while sum(r.get("t") == "pong" for r in self.records) == before:
            assert time.monotonic() < deadline, "no pong"
            await asyncio.sleep(0.01)


@pytest.fixture
async def kernel(tmp_path: Path) -> AsyncIterator[Kernel]:
    workdir, defs = tmp_path / "work", tmp_path / "defs"
    workdir.mkdir()
    defs.mkdir()
    channel = RunnerChannel(tmp_path / "agent.sock", lambda kind, text: None)
    await channel.listen()
    proc = await asyncio.create_subprocess_exec(
        *[PYTHON, "-u", str(RUNNER), "--connect", str(tmp_path / "agent.sock"), "--workdir", str(workdir)],
        env={**os.environ, "BAI_SERVICE_DEFS": str(defs), "HOME": str(tmp_path / "home")},
    )
    try:
        await channel.wait_connected(asyncio.get_running_loop().time() + 10)
        yield Kernel(channel, proc, workdir, defs)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)  # its apps get a SIGTERM too
        await asyncio.wait_for(proc.wait(), 10)
        await channel.close()


async def http_get(kernel: Kernel, port: int, path: str = "/") -> bytes:
    reader, writer = await kernel.channel.open_tunnel(port)
    writer.write(f"GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n".encode())
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return data


async def test_http_server_through_a_tunnel_and_a_second_start(kernel: Kernel) -> None:
    (kernel.workdir / "hello-there.txt").write_text("hi")
    port, name = free_port(), unique("web")
    reply = await kernel.channel.start_service(name, port, HTTP_SERVER, {}, 10)
    assert reply["t"] == "service" and reply["ok"] is True and reply["started"] is True, reply
    response = await http_get(kernel, port)
    assert response.startswith(b"HTTP/1.0 200"), response[:200]
    assert b"Directory listing" in response and b"hello-there.txt" in response
    again = await kernel.channel.start_service(name, port, HTTP_SERVER, {}, 10)
    assert again["ok"] is True and again["started"] is False, again
    # Something the image started itself (here: the first server, under another name) counts too.
    other = await kernel.channel.start_service(unique("other"), port, ["false"], {}, 10)
    assert other["ok"] is True and other["started"] is False, other
    assert not any(r.get("t") in ("service", "tunnel") for r in kernel.records)


async def test_concurrent_starts_start_one_process(kernel: Kernel) -> None:
    port, name = free_port(), unique("slow")
    command = [
        "sh",
        "-c",
        "echo started >> starts.txt; sleep 0.5; exec {runtime_path} -m http.server {port} --bind 127.0.0.1",
    ]
    replies = await asyncio.gather(*(kernel.channel.start_service(name, port, command, {}, 10) for _ in range(2)))
    assert all(r["ok"] for r in replies), replies
    assert sorted(r["started"] for r in replies) == [False, True]
    assert (kernel.workdir / "starts.txt").read_text() == "started\n"


async def test_an_app_that_exits_while_starting(kernel: Kernel) -> None:
    name = unique("boom")
    command = ["{runtime_path}", "-c", "import sys; print('boom'); sys.exit(3)"]
    reply = await kernel.channel.start_service(name, free_port(), command, {}, 10)
    assert reply["ok"] is False and reply["started"] is False
    assert reply["error"] == f"{name} exited with code 3 while starting"
    assert "boom" in reply["output"]


async def test_an_app_that_never_listens_is_killed(kernel: Kernel) -> None:
    port, name = free_port(), unique("mute")
    command = ["{runtime_path}", "-c", "import os, time; open('pid', 'w').write(str(os.getpid())); time.sleep(30)"]
    started = time.monotonic()
    reply = await kernel.channel.start_service(name, port, command, {}, 1)
    assert time.monotonic() - started < 5
    assert reply["ok"] is False
    assert reply["error"] == f"{name} did not listen on port {port} within 1 s"
    assert gone(int((kernel.workdir / "pid").read_text()))


async def test_service_definition_wins_and_placeholders(kernel: Kernel) -> None:
    port, name = free_port(), unique("defined")
    code = (
        "import os, socket, time; d = {'k': 1}; "
        "open('env.txt', 'w').write(os.environ['FROM_DEF'] + ' ' + os.environ['FROM_OP'] + ' ' + str(d)); "
        "s = socket.socket(); s.bind(('127.0.0.1', {ports[0]})); s.listen(); time.sleep(60)"
    )
    definition = {"command": ["{runtime_path}", "-c", code], "env": {"FROM_DEF": "def:{port}"}}
    (kernel.defs / f"{name}.json").write_text(json.dumps(definition))
    reply = await kernel.channel.start_service(name, port, ["false"], {"FROM_OP": "op"}, 10)
    assert reply["ok"] is True and reply["started"] is True, reply
    assert await wait_for_file(kernel.workdir / "env.txt") == f"def:{port} op {{'k': 1}}"

    reply = await kernel.channel.start_service(unique("unknown"), free_port(), None, {}, 10)
    assert reply["ok"] is False and reply["error"].startswith("no command is known to start unknown-")

    bad = unique("bad")
    (kernel.defs / f"{bad}.json").write_text('{"command": "not a list"}')
    reply = await kernel.channel.start_service(bad, free_port(), ["true"], {}, 10)
    assert reply["ok"] is False and "bad service definition" in reply["error"]


async def test_tunnel_to_a_closed_port(kernel: Kernel) -> None:
    port = free_port()
    with pytest.raises(ChannelError, match=f"nothing listens on port {port} in the kernel"):
        await kernel.channel.open_tunnel(port)


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(256 * 1024):
        writer.write(data)
        await writer.drain()
    writer.write_eof()
    await writer.drain()
    writer.close()


async def test_concurrent_tunnels_carry_data_intact(kernel: Kernel) -> None:
    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    size = 5 * 1024 * 1024

    async def one() -> None:
        payload = os.urandom(size)
        reader, writer = await kernel.channel.open_tunnel(port)

        async def send() -> None:
            for i in range(0, size, 100_000):
                writer.write(payload[i : i + 100_000])
                await writer.drain()
            writer.write_eof()

        sender = asyncio.create_task(send())
        back = await asyncio.wait_for(reader.read(-1), 20)
        await sender
        writer.close()
        assert len(back) == size and hashlib.sha256(back).digest() == hashlib.sha256(payload).digest()

    async with server:
        await asyncio.gather(*(one() for _ in range(5)))


async def test_half_close_still_gets_the_reply(kernel: Kernel) -> None:
    async def count(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.read(-1)  # until our client shuts its writing down
        writer.write(b"got %d bytes" % len(data))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(count, "127.0.0.1", 0)
    async with server:
        reader, writer = await kernel.channel.open_tunnel(server.sockets[0].getsockname()[1])
        writer.write(b"x" * 1000)
        writer.write_eof()
        assert await asyncio.wait_for(reader.read(-1), 10) == b"got 1000 bytes"
        writer.close()


async def test_garbage_fields_get_answers_and_the_runner_lives(kernel: Kernel) -> None:
    channel = kernel.channel
    loop = asyncio.get_running_loop()
    bad_services = {
        "s1": {"name": "web", "port": "x", "command": ["true"]},
        "s2": {"name": "../etc", "port": 8080, "command": ["true"]},
        "s3": {"name": "web", "port": 0, "command": ["true"]},
        "s4": {"name": "web", "port": 8080, "command": "true"},
        "s5": {"name": "web", "port": 8080, "command": ["true"], "env": {"A": 1}},
        "s6": {"name": "web", "port": 8080, "command": ["true"], "timeout": "soon"},
        "s7": {"name": "web", "port": True, "command": ["true"]},
        "s8": {"name": "x" * 65, "port": 8080, "command": ["true"]},
    }
    bad_tunnels = {"t1": {"port": 70000}, "t2": {"port": True}, "t3": {}, "t4": {"port": "22"}}
    futures = {}
    for op_id in bad_services:
        futures[op_id] = channel._service_waiters[op_id] = loop.create_future()
    for op_id in bad_tunnels:
        futures[op_id] = channel._tunnel_waiters[op_id] = loop.create_future()
    for op_id, fields in bad_services.items():
        await channel._send({"op": "start-service", "id": op_id, **fields})
    for op_id, fields in bad_tunnels.items():
        await channel._send({"op": "tunnel", "id": op_id, **fields})
    await channel._send({"op": "tunnel", "id": 5, "port": 80})
    await channel._send({"op": "start-service", "id": None})
    done, _ = await asyncio.wait(futures.values(), timeout=10)
    assert len(done) == len(futures)
    for op_id in bad_services:
        reply = futures[op_id].result()
        assert reply["ok"] is False and reply["started"] is False and reply["error"].startswith("start-service:")
    assert "port" in futures["s1"].result()["error"] and "name" in futures["s2"].result()["error"]
    for op_id in bad_tunnels:
        with pytest.raises(ChannelError, match="tunnel: port must be"):
            futures[op_id].result()
    await kernel.ping()
    errors = [r["msg"] for r in kernel.records if r.get("t") == "error"]
    assert errors == ["tunnel: 'id' must be a string", "start-service: 'id' must be a string"]
    assert await kernel.query("print(6 * 7)") == ("42\n", 0)


async def test_queries_run_while_an_app_starts(kernel: Kernel) -> None:
    port, name = free_port(), unique("sleepy")
    command = [
        "sh",
        "-c",
        "while [ ! -e go ]; do sleep 0.05; done; exec {runtime_path} -m http.server {port} --bind 127.0.0.1",
    ]
    starting = asyncio.create_task(kernel.channel.start_service(name, port, command, {}, 10))
    await asyncio.sleep(0.2)
    assert await kernel.query("print('meanwhile')") == ("meanwhile\n", 0)
    await kernel.ping()
    assert not starting.done()
    (kernel.workdir / "go").touch()
    reply = await starting
    assert reply["ok"] is True and reply["started"] is True


async def test_sigterm_ends_the_apps(kernel: Kernel) -> None:
    port = free_port()
    command = [
        "{runtime_path}",
        "-c",
        "import os, socket, time; open('pid', 'w').write(str(os.getpid())); "
        "s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen(); time.sleep(60)",
    ]
    reply = await kernel.channel.start_service(unique("doomed"), port, command, {}, 10)
    assert reply["ok"] is True
    pid = int(await wait_for_file(kernel.workdir / "pid"))
    kernel.proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(kernel.proc.wait(), 10) == 0
    deadline = time.monotonic() + 5
    while not gone(pid):
        assert time.monotonic() < deadline, "the app outlived its runner's SIGTERM"
        await asyncio.sleep(0.05)


async def test_strangers_on_the_socket_are_closed(kernel: Kernel, tmp_path: Path) -> None:
    for first_line in (b'{"tunnel": "nobody-asked"}\n', b'{"t": "hello", "pid": 1}\n', b"[1]\n"):
        reader, writer = await asyncio.open_unix_connection(str(tmp_path / "agent.sock"))
        writer.write(first_line)
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
    await kernel.ping()  # the runner's connection is still the one


async def test_channel_close_ends_tunnels_and_waiters(kernel: Kernel) -> None:
    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    async with server:
        reader, writer = await kernel.channel.open_tunnel(server.sockets[0].getsockname()[1])
        await kernel.channel.close()
        assert writer.is_closing()
    with pytest.raises(ChannelError):
        await kernel.channel.open_tunnel(1)


async def test_kernels_without_a_runner_have_no_apps() -> None:
    channel = Channel(lambda kind, text: None)
    with pytest.raises(ChannelError, match=NO_RUNNER.replace("(", r"\(").replace(")", r"\)")):
        await channel.start_service("web", 8080, None, {}, 10)
    with pytest.raises(ChannelError, match="no runner"):
        await channel.open_tunnel(8080)


def test_socket_mode_has_no_tunnels(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    sock_path = str(tmp_path / "runner.sock")
    proc = subprocess.Popen([PYTHON, "-u", str(RUNNER), "--socket", sock_path, "--workdir", str(workdir)])
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                client.connect(sock_path)
                break
            except OSError:
                client.close()
                assert time.monotonic() < deadline and proc.poll() is None, "the runner did not start"
                time.sleep(0.02)
        with client, client.makefile("rb") as lines:
            client.settimeout(10)
            assert json.loads(lines.readline())["t"] == "hello"
            client.sendall(json.dumps({"op": "tunnel", "id": "a", "port": free_port()}).encode() + b"\n")
            reply = json.loads(lines.readline())
            assert reply == {"t": "tunnel", "id": "a", "ok": False, "error": "tunnels need --connect"}
    finally:
        proc.kill()
        proc.wait()


# an app that writes the argument and variable it got, then listens (what Jupyter does with its token)
TOKEN_APP = [
    "{runtime_path}",
    "-c",
    "import os, socket, sys, time; open('got.txt', 'w').write(sys.argv[1] + ' ' + os.environ['APP_SECRET']); "
    "open('pid', 'w').write(str(os.getpid())); "
    "s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen(); time.sleep(60)",
    "--token={token}",
]


async def test_an_app_naming_token_gets_a_secret_that_outlives_its_runner(kernel: Kernel, tmp_path: Path) -> None:
    """{token} becomes a secret of the app's own, answered with every start (while it listens too) and kept
    in a file only the kernel's user reads, so a new runner (the agent's next one) answers the same one."""
    port, name = free_port(), unique("secret")
    (kernel.defs / f"{name}.json").write_text(json.dumps({"command": TOKEN_APP, "env": {"APP_SECRET": "{token}"}}))
    reply = await kernel.channel.start_service(name, port, None, {}, 10)
    token = reply.get("token", "")
    assert reply["ok"] and reply["started"] and len(token) == 32 and token.isascii(), reply
    assert await wait_for_file(kernel.workdir / "got.txt") == f"--token={token} {token}"
    kept = tmp_path / "home" / ".bai-runner" / f"app-{name}.token"
    assert kept.read_text().strip() == token and kept.stat().st_mode & 0o777 == 0o600
    assert (kept.parent.stat().st_mode & 0o777) == 0o700
    pid = int((kernel.workdir / "pid").read_text())
    again = await kernel.channel.start_service(name, port, None, {}, 10)
    assert (again["ok"], again["started"], again.get("token")) == (True, False, token)

    # the runner dies (SIGKILL: its app lives on, as when the agent's kernel is re-adopted); a new one is asked
    kernel.proc.kill()
    await kernel.proc.wait()
    await kernel.channel.close()
    channel = RunnerChannel(tmp_path / "agent2.sock", lambda kind, text: None)
    await channel.listen()
    proc = await asyncio.create_subprocess_exec(
        *[PYTHON, "-u", str(RUNNER), "--connect", str(tmp_path / "agent2.sock"), "--workdir", str(kernel.workdir)],
        env={**os.environ, "BAI_SERVICE_DEFS": str(kernel.defs), "HOME": str(tmp_path / "home")},
    )
    try:
        await channel.wait_connected(asyncio.get_running_loop().time() + 10)
        later = await channel.start_service(name, port, None, {}, 10)
        assert (later["ok"], later["started"], later.get("token")) == (True, False, token)
    finally:
        os.kill(pid, signal.SIGKILL)
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 10)
        await channel.close()
    kernel.proc = proc  # the fixture's teardown waits for this one (ended already)


async def test_apps_without_token_get_none_and_each_app_its_own(kernel: Kernel) -> None:
    plain = await kernel.channel.start_service(unique("plain"), free_port(), HTTP_SERVER, {}, 10)
    assert plain["ok"] and "token" not in plain, plain
    ports = free_port(), free_port()
    names = unique("a"), unique("b")
    start = kernel.channel.start_service
    replies = [await start(n, p, TOKEN_APP, {"APP_SECRET": "x"}, 10) for n, p in zip(names, ports, strict=True)]
    tokens = [r.get("token") for r in replies]
    assert all(r["ok"] for r in replies) and all(tokens) and tokens[0] != tokens[1], replies


async def test_a_kept_secret_that_is_not_one_is_replaced(kernel: Kernel, tmp_path: Path) -> None:
    name = unique("tampered")
    folder = tmp_path / "home" / ".bai-runner"
    folder.mkdir(parents=True, mode=0o700)
    (folder / f"app-{name}.token").write_text("short\n")
    reply = await kernel.channel.start_service(name, free_port(), TOKEN_APP, {"APP_SECRET": "x"}, 10)
    assert reply["ok"] and len(reply["token"]) == 32 and reply["token"] != "short", reply
