"""Clients given several managers: the endpoints in the credentials file, BACKEND_ENDPOINT and `--endpoint`;
moving on to the next manager when one cannot be reached or dies mid-stream (once per move, said once);
no second POST after a broken one; the dashboard's note and top bar. Traffic only to 127.0.0.1."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from bai.client import APIError, Client
from bai.common import credentials
from bai.common.credentials import BadEndpoint, Credentials, parse_endpoints
from bai.tui.app import Dashboard
from tests.nodeproc import Node, free_port
from tests.tui_support import plain, until


def bai(env: dict[str, str], *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bai", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def keys_of(node: Node) -> dict[str, str]:
    with (Path(node.env["XDG_CONFIG_HOME"]) / "bai" / "credentials.toml").open("rb") as f:
        return tomllib.load(f)


def env_with(node: Node, endpoints: list[str]) -> dict[str, str]:
    """The node's CLI environment, reaching it through `endpoints` (BACKEND_ENDPOINT, comma-separated)."""
    keys = keys_of(node)
    return {
        **node.env,
        "BACKEND_ENDPOINT": ",".join(endpoints),
        "BACKEND_ACCESS_KEY": keys["access_key"],
        "BACKEND_SECRET_KEY": keys["secret_key"],
    }


def client_of(node: Node, endpoints: list[str]) -> Client:
    keys = keys_of(node)
    return Client(Credentials(endpoints[0], keys["access_key"], keys["secret_key"], tuple(endpoints)))


def dead() -> str:
    """An endpoint nobody listens on."""
    return f"http://127.0.0.1:{free_port()}"


def moves(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "does not answer; moved to" in line]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    n = Node(tmp_path_factory.mktemp("endpoints"), "local").start()
    yield n
    n.stop()


class Forwarder:
    """A TCP forwarder on 127.0.0.1 in front of a port (a stand-in manager that can die): its own event
    loop in a thread; `close()` stops listening and closes every connection it carries."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.writers: set[asyncio.StreamWriter] = set()
        self.server: asyncio.Server | None = None
        self.port = 0

    def start(self) -> Forwarder:
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(self._listen(), self.loop).result(10)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _listen(self) -> asyncio.Server:
        return await asyncio.start_server(self._carry, "127.0.0.1", 0)

    async def _carry(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self.writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def _close(self) -> None:
        assert self.server is not None
        self.server.close()
        for w in list(self.writers):
            w.transport.abort()  # as a killed process's connections: gone at once
        self.writers.clear()

    def close(self) -> None:
        if self.loop.is_running():
            asyncio.run_coroutine_threadsafe(self._close(), self.loop).result(10)

    def stop(self) -> None:
        self.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def forwarder(node: Node) -> Iterator[Forwarder]:
    f = Forwarder(node.port).start()
    yield f
    f.stop()


class SwallowingServer:
    """A fake manager on 127.0.0.1 that reads each request whole and closes without answering."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.requests: list[str] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data and (more := conn.recv(65536)):
                    data += more
                head, _, body = data.partition(b"\r\n\r\n")
                length = next(
                    (
                        int(v)
                        for k, _, v in (h.partition(b":") for h in head.split(b"\r\n"))
                        if k.lower() == b"content-length"
                    ),
                    0,
                )
                while len(body) < length and (more := conn.recv(65536)):
                    body += more
                self.requests.append(head.split(b"\r\n", 1)[0].decode())

    def close(self) -> None:
        self.sock.close()


# -- where the endpoints come from ------------------------------------------------------------------------


def test_endpoints_of_a_string_a_list_and_commas() -> None:
    assert parse_endpoints("http://127.0.0.1:8091/") == ("http://127.0.0.1:8091",)
    assert parse_endpoints(["http://127.0.0.1:8091", "https://b.example:443"]) == (
        "http://127.0.0.1:8091",
        "https://b.example:443",
    )
    assert parse_endpoints("http://127.0.0.1:8091, http://127.0.0.1:8092") == (
        "http://127.0.0.1:8091",
        "http://127.0.0.1:8092",
    )
    for bad in ("127.0.0.1:8091", "ftp://h:21", "http://h", "http://:80", "http://h:port"):
        with pytest.raises(BadEndpoint, match=repr(bad).replace("?", r"\?")):
            parse_endpoints(f"http://127.0.0.1:8091,{bad}", "BACKEND_ENDPOINT")
    with pytest.raises(BadEndpoint, match="is not a URL"):
        parse_endpoints(["http://127.0.0.1:8091", 8092])
    one = Credentials("http://127.0.0.1:8091", "AK", "SK")  # as code that knows one endpoint makes it
    assert one.endpoints == ("http://127.0.0.1:8091",)


def test_load_reads_a_list_in_the_file_and_a_comma_list_in_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in ("BACKEND_ENDPOINT", "SORNA_ENDPOINT", "BACKEND_ACCESS_KEY", "BACKEND_SECRET_KEY", "BAI_STATE_DIR"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    path = credentials.shared_path()
    path.parent.mkdir(parents=True)
    path.write_text('endpoint = "http://127.0.0.1:8091"\naccess_key = "AK"\nsecret_key = "SK"\n')
    loaded = credentials.load()
    assert loaded is not None and loaded.endpoints == ("http://127.0.0.1:8091",)

    path.write_text(
        'endpoint = ["http://127.0.0.1:8091", "http://127.0.0.1:8092"]\naccess_key = "AK"\nsecret_key = "SK"\n'
    )
    loaded = credentials.load()
    assert loaded is not None
    assert loaded.endpoints == ("http://127.0.0.1:8091", "http://127.0.0.1:8092")
    assert loaded.endpoint == "http://127.0.0.1:8091"  # the first
    saved_again = credentials.save(loaded, tmp_path / "again.toml")
    assert tomllib.loads(saved_again.read_text())["endpoint"] == ["http://127.0.0.1:8091", "http://127.0.0.1:8092"]

    monkeypatch.setenv("BACKEND_ENDPOINT", "http://127.0.0.1:9001,http://127.0.0.1:9002")
    loaded = credentials.load()
    assert loaded is not None
    assert loaded.endpoints == ("http://127.0.0.1:9001", "http://127.0.0.1:9002")
    assert (loaded.access_key, loaded.secret_key) == ("AK", "SK")

    monkeypatch.setenv("BACKEND_ENDPOINT", "http://127.0.0.1:9001,localhost:9002")
    with pytest.raises(BadEndpoint, match="BACKEND_ENDPOINT: bad endpoint 'localhost:9002'"):
        credentials.load()


def test_bad_entries_are_named_without_a_traceback(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "BACKEND_ACCESS_KEY": "AK",
        "BACKEND_SECRET_KEY": "SK",
        "BACKEND_ENDPOINT": "http://127.0.0.1:8091,ftp://127.0.0.1:21",
    }
    env.pop("BAI_STATE_DIR", None)
    for args in (("session", "ls"), ("config", "show"), ("client-env",)):
        out = bai(env, *args)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert "bad endpoint 'ftp://127.0.0.1:21'" in out.stderr and "BACKEND_ENDPOINT" in out.stderr
        assert "Traceback" not in out.stderr

    env["BACKEND_ENDPOINT"] = "http://127.0.0.1:8091"
    out = bai(env, "tui", "--endpoint", "http://127.0.0.1:8091,nonsense")
    assert out.returncode == 2
    assert "--endpoint: bad endpoint 'nonsense'" in out.stderr and "Traceback" not in out.stderr

    path = tmp_path / "config" / "bai" / "credentials.toml"
    path.parent.mkdir(parents=True)
    path.write_text('endpoint = ["http://127.0.0.1:8091", "http//oops"]\naccess_key = "AK"\nsecret_key = "SK"\n')
    file_env = {k: v for k, v in env.items() if not k.startswith("BACKEND_")}
    out = bai(file_env, "session", "ls")
    assert out.returncode == 2 and "bad endpoint 'http//oops'" in out.stderr and str(path) in out.stderr


def test_config_show_and_client_env_print_every_endpoint(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "BACKEND_ACCESS_KEY": "AK",
        "BACKEND_SECRET_KEY": "SK",
        "BACKEND_ENDPOINT": "http://127.0.0.1:8091,http://127.0.0.1:8092",
    }
    env.pop("BAI_STATE_DIR", None)
    shown = bai(env, "config", "show")
    assert shown.returncode == 0, shown.stderr
    assert "endpoints http://127.0.0.1:8091, http://127.0.0.1:8092, keypair AK" in shown.stdout
    exported = bai(env, "client-env")
    assert "export BACKEND_ENDPOINT=http://127.0.0.1:8091,http://127.0.0.1:8092\n" in exported.stdout


# -- moving on ------------------------------------------------------------------------------------------------


def test_a_manager_that_does_not_answer_is_passed_over_once(node: Node) -> None:
    first = dead()
    out = bai(env_with(node, [first, node.endpoint]), "session", "ls")
    assert out.returncode == 0, out.stderr
    assert moves(out.stderr) == [f"bai: the manager at {first} does not answer; moved to {node.endpoint}"]

    out = bai(env_with(node, [node.endpoint, dead()]), "session", "ls")  # the first answers: nothing said
    assert out.returncode == 0 and moves(out.stderr) == []

    a, b = dead(), dead()
    out = bai(env_with(node, [a, b]), "session", "ls")
    assert out.returncode != 0
    assert f"cannot reach the manager at {a}, {b}" in out.stderr
    assert "Traceback" not in out.stderr and moves(out.stderr) == []


def test_a_followed_log_goes_on_through_the_next_manager(node: Node, forwarder: Forwarder) -> None:
    script = "for i in $(seq 1 60); do echo line $i; sleep 0.1; done"
    node.cli("session", "create", "--name", "chatty-move", "--type", "batch", "--startup-command", script, "python",
             check=True)  # fmt: skip
    env = env_with(node, [forwarder.endpoint, node.endpoint])
    proc = subprocess.Popen(
        [sys.executable, "-m", "bai", "session", "logs", "--follow", "chatty-move"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        seen = []
        while len(seen) < 5:  # some output through the forwarder, then it dies
            line = proc.stdout.readline()
            assert line, "the log ended early"
            seen.append(line)
        forwarder.close()
        watchdog = threading.Timer(60, proc.kill)  # (a hung follow fails the test, never hangs it)
        watchdog.start()
        rest = proc.stdout.read()  # (not communicate: it would skip what this reader has buffered)
        assert proc.stderr is not None
        err = proc.stderr.read()
        proc.wait()
        watchdog.cancel()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    got = ("".join(seen) + rest).splitlines()
    assert got == [f"line {i}" for i in range(1, 61)], (got, err)  # each line once, in order
    assert moves(err) == [f"bai: the manager at {forwarder.endpoint} does not answer; moved to {node.endpoint}"]


def test_a_shell_whose_manager_dies_is_opened_again_through_the_next_one(node: Node, forwarder: Forwarder) -> None:
    """`bai session shell` through a manager that dies: a new shell in the same kernel through the next manager,
    said on the terminal; what is typed after goes to it, and its exit status is the command's."""
    node.cli("session", "create", "--name", "shell-move", "python", check=True)
    env = env_with(node, [forwarder.endpoint, node.endpoint])
    proc = subprocess.Popen(
        [sys.executable, "-m", "bai", "session", "shell", "shell-move"],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    out = bytearray()
    threading.Thread(
        target=lambda: [out.extend(b) for b in iter(lambda: proc.stdout.read1(4096), b"")], daemon=True
    ).start()

    def says(text: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while text.encode() not in out:
            assert time.monotonic() < deadline and proc.poll() is None, (text, bytes(out), proc.poll())
            time.sleep(0.05)

    try:
        assert proc.stdin is not None
        proc.stdin.write(b"echo one-$((1+1))\n")
        proc.stdin.flush()
        says("one-2")
        forwarder.close()
        says(f"a new shell, through {node.endpoint}]")
        proc.stdin.write(b"echo two-$((2+2))\n")
        proc.stdin.flush()
        says("two-4")
        proc.stdin.write(b"exit 5\n")
        proc.stdin.close()
        assert proc.wait(30) == 5, bytes(out)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        node.cli("session", "destroy", "shell-move")


def test_session_events_go_on_through_the_next_manager(node: Node, forwarder: Forwarder) -> None:
    node.cli("session", "create", "--name", "events-move", "--type", "batch", "--startup-command", "sleep 6",
             "python", check=True)  # fmt: skip
    env = env_with(node, [forwarder.endpoint, node.endpoint])
    proc = subprocess.Popen(
        [sys.executable, "-m", "bai", "session", "events", "events-move"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not forwarder.writers:  # the stream is open through the forwarder
            assert time.monotonic() < deadline and proc.poll() is None, "the events never came through A"
            time.sleep(0.05)
        time.sleep(0.3)
        forwarder.close()
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "events-move  session_terminated" in out, (out, err)  # the end, seen through the second manager
    assert moves(err) == [f"bai: the manager at {forwarder.endpoint} does not answer; moved to {node.endpoint}"]


async def test_a_post_that_broke_after_it_was_sent_is_not_sent_again(node: Node) -> None:
    fake = SwallowingServer()
    told: list[tuple[str, str]] = []
    try:
        async with client_of(node, [fake.endpoint, node.endpoint]) as c:
            c.on_move = lambda old, new: told.append((old, new))
            with pytest.raises(APIError, match=f"the manager at {fake.endpoint} broke off the POST request"):
                await c.create_session("python", name="not-twice", type="batch", startup_command="true")
            assert [r.split()[0:2] for r in fake.requests] == [["POST", "/session"]]  # seen once
            assert told == [] and c.endpoint == node.endpoint  # the next request goes to the next one
            names = [s["name"] for s in await c.list_sessions(all=True)]
            assert "not-twice" not in names  # nor did the second manager get it
            assert told == [(fake.endpoint, node.endpoint)]
            # a GET that broke is asked again of the next manager; error answers are answers
        async with client_of(node, [fake.endpoint, node.endpoint]) as c:
            assert isinstance(await c.list_sessions(), list)
            assert fake.requests[-1].startswith("GET /session")
            with pytest.raises(APIError) as no_such:
                await c.get_session("no-such-session")
            assert no_such.value.status == 404 and c.endpoint == node.endpoint
    finally:
        fake.close()


async def test_websockets_and_uploads_pass_over_a_manager_that_does_not_answer(node: Node) -> None:
    node.cli("session", "create", "--name", "ws-move", "python", check=True)
    first = dead()
    async with client_of(node, [first, node.endpoint]) as c:
        told: list[tuple[str, str]] = []
        c.on_move = lambda old, new: told.append((old, new))
        async with c.execute("ws-move") as stream:
            await stream.start("query", "print(6 * 7)")
            frames = [f async for f in stream.frames()]
        assert "42" in "".join(str(item) for f in frames for item in f.get("console") or [])
        assert told == [(first, node.endpoint)]
    async with client_of(node, [dead(), node.endpoint]) as c:
        await c.upload("ws-move", [("moved.txt", b"through the second\n")])
        assert len(await c.download("ws-move", ["moved.txt"])) == 1
    node.cli("session", "destroy", "ws-move")


# -- the dashboard ---------------------------------------------------------------------------------------------


async def test_the_dashboard_says_it_moved_and_shows_where(node: Node, forwarder: Forwarder) -> None:
    app = Dashboard(client_of(node, [forwarder.endpoint, node.endpoint]))
    async with app.run_test(size=(140, 40)) as pilot:
        await until(pilot, lambda: app.connected, what="connected")
        assert forwarder.endpoint in plain(app.query_one("#topbar"))
        forwarder.close()
        line = f"the manager at {forwarder.endpoint} does not answer; moved to {node.endpoint}"
        await until(pilot, lambda: any(line in str(n.message) for n in app._notifications), what="the note")
        await until(pilot, lambda: app.connected and app.snapshots >= 2, what="the stream through the second")
        await until(pilot, lambda: node.endpoint in plain(app.query_one("#topbar")), what="the new endpoint")
        assert sum(line in str(n.message) for n in app._notifications) == 1
