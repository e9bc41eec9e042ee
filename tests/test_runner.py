"""Tests for bai/node/agent/runner.py, run as a real subprocess over its Unix socket."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

RUNNER = Path(__file__).resolve().parent.parent / "bai" / "node" / "agent" / "runner.py"
# The runner must work on any Python 3.8+; set BAI_RUNNER_PYTHON to try another one.
PYTHON = os.environ.get("BAI_RUNNER_PYTHON", sys.executable)


class Client:
    def __init__(self, path: str, timeout: float = 10.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.buf = b""

    def send(self, **msg: object) -> None:
        self.sock.sendall(json.dumps(msg).encode() + b"\n")

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self, timeout: float = 10.0) -> dict:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no message from runner")
            self.sock.settimeout(remaining)
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("runner closed the connection")
            self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def until_finished(self, timeout: float = 10.0) -> tuple[str, str, int, list[dict]]:
        events = []
        while True:
            msg = self.recv(timeout)
            events.append(msg)
            if msg["t"] == "finished":
                break
        out = "".join(m["d"] for m in events if m["t"] == "stdout")
        err = "".join(m["d"] for m in events if m["t"] == "stderr")
        return out, err, msg["exit"], events

    def query(self, code: str, timeout: float = 10.0) -> tuple[str, str, int, list[dict]]:
        self.send(op="query", code=code)
        return self.until_finished(timeout)

    def batch(self, cmd: str, timeout: float = 10.0) -> tuple[str, str, int, list[dict]]:
        self.send(op="batch", cmd=cmd)
        return self.until_finished(timeout)

    def close(self) -> None:
        self.sock.close()


class RunnerProc:
    def __init__(
        self, sock_path: str, workdir: Path, connect_path: str | None = None, extra: tuple[str, ...] = ()
    ) -> None:
        self.sock_path = sock_path
        self.connect_path = connect_path or sock_path
        self.workdir = workdir
        self.proc = subprocess.Popen(
            [PYTHON, "-u", str(RUNNER), "--socket", sock_path, "--workdir", str(workdir), *extra],
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                self.client = Client(self.connect_path)
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("runner did not start") from None
                time.sleep(0.02)
        self.hello = self.client.recv()

    def reconnect(self) -> Client:
        self.client.close()
        self.client = Client(self.connect_path)
        self.hello = self.client.recv()
        return self.client

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    d = tmp_path / "work"
    d.mkdir()
    return d


@pytest.fixture
def runner(tmp_path: Path, workdir: Path):
    r = RunnerProc(str(tmp_path / "runner.sock"), workdir)
    yield r
    r.stop()


@pytest.fixture
def client(runner: RunnerProc) -> Client:
    return runner.client


# -- connection basics --------------------------------------------------------


def test_hello_and_socket_mode(runner: RunnerProc) -> None:
    hello = runner.hello
    assert hello["t"] == "hello"
    assert hello["pid"] == runner.proc.pid
    version = subprocess.run(
        [PYTHON, "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert hello["python"] == version
    assert hello["busy"] is False
    assert stat.S_IMODE(os.stat(runner.sock_path).st_mode) == 0o666


def test_stale_socket_file_is_replaced(tmp_path: Path, workdir: Path) -> None:
    path = tmp_path / "stale.sock"
    path.write_text("stale")
    r = RunnerProc(str(path), workdir)
    try:
        assert stat.S_ISSOCK(os.stat(path).st_mode)
        r.client.send(op="ping")
        assert r.client.recv() == {"t": "pong"}
    finally:
        r.stop()


def test_long_socket_path(tmp_path: Path, workdir: Path) -> None:
    deep = tmp_path
    while len(str(deep)) < 150:
        deep = deep / ("d" * 20)
    deep.mkdir(parents=True)
    sock_path = deep / "runner.sock"
    assert len(str(sock_path).encode()) > 108
    fd = os.open(deep, os.O_PATH)
    try:
        r = RunnerProc(str(sock_path), workdir, connect_path=f"/proc/self/fd/{fd}/runner.sock")
        try:
            out, _, code, _ = r.client.query("import os; print(os.getcwd())")
            assert (code, out) == (0, str(workdir) + "\n")
        finally:
            r.stop()
    finally:
        os.close(fd)


def test_malformed_lines_and_unknown_op(client: Client) -> None:
    client.send_raw(b"{not json\n")
    assert client.recv()["t"] == "error"
    client.send_raw(b"[1, 2]\n")
    assert client.recv()["t"] == "error"
    client.send(op="frobnicate")
    msg = client.recv()
    assert msg["t"] == "error" and "frobnicate" in msg["msg"]
    client.send(op="query", code=5)
    assert client.recv()["t"] == "error"
    client.send(op="ping")
    assert client.recv() == {"t": "pong"}
    assert client.query("print('still alive')")[:3] == ("still alive\n", "", 0)


def test_idle_control_ops_are_ignored(client: Client) -> None:
    client.send(op="interrupt")
    client.send(op="input", data="x")
    client.send(op="input-eof")
    client.send(op="ping")
    assert client.recv() == {"t": "pong"}
    # The stray input must not be consumed by a later input() call.
    client.send(op="query", code="v = input()\nprint('got', v)")
    assert client.recv()["t"] == "waiting-input"
    client.send(op="input", data="fresh")
    assert client.until_finished()[:3] == ("got fresh\n", "", 0)


def test_sigterm_exits_zero_even_while_busy(runner: RunnerProc) -> None:
    runner.client.send(op="query", code="import time; time.sleep(100)")
    time.sleep(0.2)
    runner.proc.send_signal(signal.SIGTERM)
    assert runner.proc.wait(timeout=5) == 0


# -- query mode ---------------------------------------------------------------


def test_persistent_namespace(client: Client) -> None:
    assert client.query("x = 1\ndef f(a):\n    return a + x")[2] == 0
    out, err, code, _ = client.query("print(x, f(41), __name__)")
    assert (out, err, code) == ("1 42 __main__\n", "", 0)


def test_last_expression_not_echoed(client: Client) -> None:
    assert client.query("1 + 1")[:3] == ("", "", 0)


def test_output_order_and_cwd(client: Client, workdir: Path) -> None:
    out, err, code, events = client.query(
        "import sys, os\nprint('a')\nprint('b', file=sys.stderr)\nsys.stdout.write('c')\n"
        "print(os.getcwd())\nprint(sys.stdout.isatty(), sys.stdout.encoding)"
    )
    assert code == 0
    assert out == f"a\nc{workdir}\nFalse utf-8\n"
    assert err == "b\n"
    kinds = [(m["t"], m["d"]) for m in events if m["t"] in ("stdout", "stderr") and m["d"].strip()]
    assert kinds[:3] == [("stdout", "a"), ("stderr", "b"), ("stdout", "c")]


def test_output_streams_before_sleep_ends(client: Client) -> None:
    start = time.monotonic()
    client.send(op="query", code="import time\nprint('early')\ntime.sleep(2)\nprint('late')")
    msg = client.recv()
    first_at = time.monotonic() - start
    assert msg == {"t": "stdout", "d": "early"}
    assert first_at < 1.0
    out, _, code, _ = client.until_finished()
    assert time.monotonic() - start >= 1.9
    assert (code, out) == (0, "\nlate\n")


def test_stream_object_properties(client: Client) -> None:
    code = (
        "import io, sys\n"
        "try:\n    sys.stdout.fileno()\nexcept io.UnsupportedOperation:\n    print('nofileno')\n"
        "print(sys.stdout.writable(), sys.stdout.readable(), sys.stdout.seekable(), sys.stdout.closed)\n"
        "sys.stdout.writelines(['x', 'y\\n'])\nsys.stdout.flush()"
    )
    assert client.query(code)[:3] == ("nofileno\nTrue False False False\nxy\n", "", 0)
    # The originals are restored afterwards: the next query gets fresh streams.
    assert client.query("print('ok')")[:3] == ("ok\n", "", 0)


def test_output_from_user_threads(client: Client) -> None:
    code = (
        "import sys, threading\n"
        "def work(i):\n    for _ in range(50):\n        sys.stdout.write('t%d\\n' % i)\n"
        "ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]\n"
        "[t.start() for t in ts]; [t.join() for t in ts]"
    )
    out, _, code_, _ = client.query(code)
    assert code_ == 0
    lines = out.split()
    assert sorted(lines) == sorted([f"t{i}" for i in range(4) for _ in range(50)])


def test_exception_exit_code_and_traceback(client: Client) -> None:
    client.query("y = 'kept'")
    out, err, code, _ = client.query("def g():\n    return 1 / 0\ng()")
    assert code == 1
    assert "ZeroDivisionError" in err and "<cell>" in err and 'File "<cell>", line 3' in err
    assert "runner.py" not in err
    assert client.query("print(y)")[:3] == ("kept\n", "", 0)


def test_syntax_error(client: Client) -> None:
    _, err, code, _ = client.query("def (:")
    assert code == 1
    assert "SyntaxError" in err and "<cell>" in err


@pytest.mark.parametrize(
    ("code", "expected_exit", "expected_err"),
    [
        ("raise SystemExit(3)", 3, ""),
        ("exit(3)", 3, ""),
        ("import sys; sys.exit()", 0, ""),
        ("import sys; sys.exit(0)", 0, ""),
        ("import sys; sys.exit('bye')", 1, "bye\n"),
        ("raise KeyboardInterrupt", 130, "KeyboardInterrupt"),
    ],
)
def test_exit_codes(client: Client, code: str, expected_exit: int, expected_err: str) -> None:
    client.query("z = 7")
    _, err, exit_code, _ = client.query(code)
    assert exit_code == expected_exit
    assert expected_err in err if expected_err else err == ""
    assert client.query("print(z)")[:3] == ("7\n", "", 0)


def test_input_round_trip(client: Client) -> None:
    client.send(op="query", code="name = input('name? ')\nprint('hi', name)")
    assert client.recv() == {"t": "stdout", "d": "name? "}
    assert client.recv() == {"t": "waiting-input", "opts": {"is_password": False}}
    client.send(op="input", data="bob\n")
    assert client.until_finished()[:3] == ("hi bob\n", "", 0)
    assert client.query("print(repr(name))")[0] == "'bob'\n"


def test_getpass_is_password(client: Client) -> None:
    client.send(op="query", code="import getpass\npw = getpass.getpass()\nprint(len(pw))")
    msgs = [client.recv(), client.recv()]
    assert msgs[-1] == {"t": "waiting-input", "opts": {"is_password": True}}
    client.send(op="input", data="secret")
    assert client.until_finished()[:3] == ("6\n", "", 0)


@pytest.mark.parametrize(
    "code",
    ["import time\ntime.sleep(100)", "while True:\n    pass", "input()"],
    ids=["sleep", "busy-loop", "input"],
)
def test_query_interrupt(client: Client, code: str) -> None:
    client.query("w = 'alive'")
    client.send(op="query", code="print('started')\n" + code)
    assert client.recv()["d"] == "started"
    time.sleep(0.2)
    start = time.monotonic()
    client.send(op="interrupt")
    _, err, exit_code, _ = client.until_finished(timeout=5)
    assert exit_code == 130
    assert "KeyboardInterrupt" in err
    assert time.monotonic() - start < 2
    assert client.query("print(w)")[:3] == ("alive\n", "", 0)


def test_jobs_queue_in_order_and_ping_while_busy(client: Client) -> None:
    client.send(op="query", code="import time\ntime.sleep(0.5)\nprint('one')")
    client.send(op="batch", cmd="echo two")
    client.send(op="query", code="print('three')")
    start = time.monotonic()
    client.send(op="ping")
    assert client.recv() == {"t": "pong"}
    assert time.monotonic() - start < 0.4
    assert client.until_finished()[:3] == ("one\n", "", 0)
    assert client.until_finished()[:3] == ("two\n", "", 0)
    assert client.until_finished()[:3] == ("three\n", "", 0)


def test_fork_in_query_does_not_duplicate_runner(client: Client) -> None:
    code = (
        "import os\npid = os.fork()\n"
        "if pid == 0:\n    print('child')\n"
        "else:\n    os.waitpid(pid, 0)\n    print('parent')"
    )
    out, _, exit_code, _ = client.query(code)
    assert exit_code == 0
    assert "child\n" in out and "parent\n" in out
    # Exactly one finished: the next message after a ping is the pong.
    client.send(op="ping")
    assert client.recv() == {"t": "pong"}
    assert client.query("print('after')")[:3] == ("after\n", "", 0)


# -- batch mode ---------------------------------------------------------------


def test_batch_output_and_exit(client: Client, workdir: Path) -> None:
    out, err, code, _ = client.batch("echo hi; echo err >&2; exit 4")
    assert (out, err, code) == ("hi\n", "err\n", 4)
    assert client.batch("pwd")[0] == str(workdir) + "\n"


def test_batch_stdin_via_input(client: Client) -> None:
    client.send(op="batch", cmd="read x; echo got $x")
    client.send(op="input", data="hello")
    assert client.until_finished()[:3] == ("got hello\n", "", 0)


def test_batch_input_eof(client: Client) -> None:
    client.send(op="batch", cmd="cat; echo done")
    client.send(op="input", data="line1\n")
    client.send(op="input", data="line2")
    client.send(op="input-eof")
    assert client.until_finished()[:3] == ("line1\nline2\ndone\n", "", 0)


def test_batch_streams_before_exit(client: Client) -> None:
    start = time.monotonic()
    client.send(op="batch", cmd="echo early; sleep 2; echo late")
    assert client.recv() == {"t": "stdout", "d": "early\n"}
    assert time.monotonic() - start < 1.0
    assert client.until_finished()[:3] == ("late\n", "", 0)


def test_batch_interrupt(client: Client) -> None:
    client.send(op="batch", cmd="echo started; sleep 100")
    assert client.recv()["d"] == "started\n"
    start = time.monotonic()
    client.send(op="interrupt")
    assert client.until_finished(timeout=5)[2] == 130
    assert time.monotonic() - start < 2


def test_batch_killed_by_signal(client: Client) -> None:
    assert client.batch("kill -9 $$")[2] == 128 + 9


def test_batch_invalid_utf8_is_replaced(client: Client) -> None:
    out, _, code, _ = client.batch("printf 'a\\377b\\n'")
    assert (out, code) == ("a\ufffdb\n", 0)


# -- put-file -----------------------------------------------------------------


def _put(client: Client, path: str, data: bytes, **extra: object) -> dict:
    client.send(op="put-file", path=path, b64=base64.b64encode(data).decode(), **extra)
    return client.recv()


def test_put_file_writes_under_workdir(client: Client, workdir: Path) -> None:
    reply = _put(client, "sub/dir/hello.sh", b"#!/bin/sh\necho put\n", mode=0o755)
    assert reply == {"t": "put-file", "path": "sub/dir/hello.sh", "ok": True}
    target = workdir / "sub" / "dir" / "hello.sh"
    assert target.read_bytes() == b"#!/bin/sh\necho put\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    assert client.batch("./sub/dir/hello.sh")[:3] == ("put\n", "", 0)


def test_put_file_refuses_escapes(client: Client, workdir: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (workdir / "link").symlink_to(outside)
    for bad in ["../x", "/etc/x", "a/../../x", "link/x", ""]:
        reply = _put(client, bad, b"nope")
        assert reply["t"] == "put-file" and reply["path"] == bad
        assert reply["ok"] is False and reply["error"]
    assert not (tmp_path / "x").exists() and not (outside / "x").exists()
    reply = _put(client, "ok.txt", b"")
    assert reply["ok"] is True
    client.send(op="put-file", path="bad.txt", b64="!!!not base64")
    assert client.recv()["ok"] is False


def test_put_file_while_busy(client: Client, workdir: Path) -> None:
    client.send(op="query", code="import time\ntime.sleep(1)")
    start = time.monotonic()
    assert _put(client, "busy.txt", b"data")["ok"] is True
    assert time.monotonic() - start < 0.5
    assert (workdir / "busy.txt").read_bytes() == b"data"
    assert client.until_finished()[2] == 0


# -- reconnect ----------------------------------------------------------------


def test_reconnect_keeps_namespace(runner: RunnerProc) -> None:
    runner.client.query("kept = 'yes'")
    client = runner.reconnect()
    assert runner.hello["t"] == "hello" and runner.hello["busy"] is False
    assert client.query("print(kept)")[:3] == ("yes\n", "", 0)


def test_work_continues_while_disconnected(runner: RunnerProc) -> None:
    runner.client.send(op="query", code="import time\nprint('lost')\ntime.sleep(0.5)\nlater = 42")
    time.sleep(0.1)
    client = runner.reconnect()
    assert runner.hello["busy"] is True
    out, _, code, _ = client.until_finished()
    assert code == 0 and "lost" not in out
    assert client.query("print(later)")[:3] == ("42\n", "", 0)


# -- robustness ---------------------------------------------------------------


def test_interrupt_output_flood_keeps_stream_intact(client: Client) -> None:
    client.send(op="query", code="while True:\n    print('x' * 300000)")
    time.sleep(0.5)  # do not read: the runner blocks in sendall() on a full socket
    client.send(op="interrupt")
    # Every line must still be a complete JSON object (recv() would raise otherwise).
    _, err, code, events = client.until_finished(timeout=10)
    assert code == 130 and "KeyboardInterrupt" in err
    assert all(m["d"] in ("x" * 300000, "\n") for m in events if m["t"] == "stdout")
    client.send(op="ping")
    assert client.recv() == {"t": "pong"}


def test_large_put_file(client: Client, workdir: Path) -> None:
    data = os.urandom(16 * 1024 * 1024)
    start = time.monotonic()
    assert _put(client, "big.bin", data)["ok"] is True
    assert time.monotonic() - start < 5
    assert (workdir / "big.bin").read_bytes() == data


def test_workdir_modules_importable_and_main_picklable(client: Client) -> None:
    assert _put(client, "mymod.py", b"VALUE = 'from workdir'\n")["ok"] is True
    code = (
        "import mymod, pickle, sys\n"
        "def f():\n    return 1\n"
        "print(mymod.VALUE, pickle.loads(pickle.dumps(f)) is f, sys.modules['__main__'].f is f)"
    )
    assert client.query(code)[:3] == ("from workdir True True\n", "", 0)


# -- misuse: the runner survives anything it is sent ---------------------------


def _alive(client: Client, runner: RunnerProc) -> None:
    assert runner.proc.poll() is None
    client.send(op="ping")
    assert client.recv() == {"t": "pong"}
    assert client.query("print(kept)")[:3] == ("state\n", "", 0)


def test_nul_byte_in_batch_command_does_not_kill_the_runner(runner: RunnerProc) -> None:
    client = runner.client
    client.query("kept = 'state'")
    out, err, code, _ = client.batch("echo a\x00b")
    assert code == 127 and "null byte" in err
    _alive(client, runner)


@pytest.mark.parametrize(
    "line",
    [
        b"\xff\xfe not utf-8\n",
        b'{"op": "query", "code": "print(1)\xff"}\n',
        b"[" * 100000 + b"\n",
        b'"just a string"\n',
        b"null\n",
        b'{"op": null}\n',
        b'{"op": ["query"]}\n',
        b'{"op": {"a": 1}}\n',
        b'{"op": "batch", "cmd": null}\n',
        b'{"op": "batch", "cmd": ["ls"]}\n',
        b'{"op": "input", "data": 5}\n',
        b'{"op": "put-file", "path": "a\\u0000b", "b64": ""}\n',
        b'{"op": "put-file", "path": "x", "b64": "", "mode": "rwx"}\n',
        b'{"op": "put-file", "path": ["x"], "b64": 5}\n',
        b'{"op": "' + b"x" * 1000000 + b'"}\n',
    ],
    ids=lambda line: repr(line[:40]),
)
def test_malformed_messages_get_an_error_record(runner: RunnerProc, line: bytes) -> None:
    client = runner.client
    client.query("kept = 'state'")
    client.send_raw(line)
    reply = client.recv()
    assert reply["t"] in ("error", "put-file"), reply
    assert reply.get("ok") is not True
    assert len(json.dumps(reply)) < 2000  # a huge field is not echoed back
    _alive(client, runner)


def test_odd_but_valid_jobs_finish(runner: RunnerProc) -> None:
    client = runner.client
    client.query("kept = 'state'")
    _, err, code, _ = client.query("print('a\x00b')\x00")
    assert code == 1 and "null" in err
    assert client.query("print(len('\ud800'))")[2] in (0, 1)  # a lone surrogate: an error, not a dead runner
    _, _, code, _ = client.batch("echo \ud800")
    assert code == 127
    client.send(op="batch", cmd="cat")
    client.send(op="input", data="\ud800 and \x00\n")
    client.send(op="input-eof")
    out, _, code, _ = client.until_finished()
    assert code == 0 and out == "? and \x00\n"
    big = "x" * (8 * 1024 * 1024)
    assert client.query(f"s = '{big}'\nprint(len(s))")[:3] == (f"{len(big)}\n", "", 0)
    _alive(client, runner)


def test_lines_over_the_limit_are_discarded(tmp_path: Path, workdir: Path) -> None:
    r = RunnerProc(str(tmp_path / "limited.sock"), workdir, extra=("--max-line", "4096"))
    try:
        r.client.query("kept = 'state'")
        r.client.send(op="query", code="print('%s')" % ("y" * 100000))
        reply = r.client.recv()
        assert reply["t"] == "error" and "longer than" in reply["msg"]
        _alive(r.client, r)
    finally:
        r.stop()


def test_input_at_eof_raises_eoferror(client: Client) -> None:
    client.send(op="query", code="try:\n    input('> ')\nexcept EOFError:\n    print('EOF')")
    assert client.recv() == {"t": "stdout", "d": "> "}
    assert client.recv()["t"] == "waiting-input"
    client.send(op="input-eof")
    assert client.until_finished()[:3] == ("EOF\n", "", 0)


def test_eof_after_inputs_and_it_sticks(client: Client) -> None:
    code = (
        "got = []\n"
        "for _ in range(4):\n"
        "    try:\n        got.append(input())\n"
        "    except EOFError:\n        got.append('EOF')\n"
        "print(got)"
    )
    client.send(op="query", code=code)
    client.send(op="input", data="a")
    client.send(op="input", data="b\n")
    client.send(op="input-eof")
    out, _, exit_code, events = client.until_finished()
    assert (out, exit_code) == ("['a', 'b', 'EOF', 'EOF']\n", 0)
    assert sum(m["t"] == "waiting-input" for m in events) == 3  # none once input has ended
    # the next job reads input afresh
    client.send(op="query", code="print(input())")
    assert client.recv()["t"] == "waiting-input"
    client.send(op="input", data="again")
    assert client.until_finished()[:3] == ("again\n", "", 0)


def test_uncaught_eoferror_and_stdin_at_eof(client: Client) -> None:
    client.send(op="query", code="input()")
    assert client.recv()["t"] == "waiting-input"
    client.send(op="input-eof")
    _, err, exit_code, _ = client.until_finished()
    assert exit_code == 1 and "EOFError" in err
    out, _, exit_code, _ = client.query("import sys\nprint(repr(sys.stdin.readline()), repr(sys.stdin.read()))")
    assert (out, exit_code) == ("'' ''\n", 0)


def test_a_huge_print_goes_out_in_records_the_agent_takes(client: Client) -> None:
    """One print() of 6 M characters (control characters among them, 6 bytes each in JSON) reaches the agent
    whole, in records whose lines stay under the agent's 4 MiB line bound."""
    from bai.node.agent.channel import MAX_RUNNER_LINE

    client.send(op="query", code="import sys\nsys.stdout.write('\\x01' * 1_000_000 + 'y' * 5_000_000)")
    out, records = [], []
    while True:
        rec = client.recv(timeout=30)
        records.append(rec)
        if rec["t"] == "stdout":
            out.append(rec["d"])
        if rec["t"] == "finished":
            break
    text = "".join(out)
    assert text == "\x01" * 1_000_000 + "y" * 5_000_000
    longest = max(len(json.dumps(r, ensure_ascii=False).encode()) for r in records if r["t"] == "stdout")
    assert longest < MAX_RUNNER_LINE, longest
