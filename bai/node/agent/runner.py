"""Kernel runner: executes code inside a kernel container on behalf of the agent.

This file is copied into arbitrary container images and started with whatever
Python (3.8 or newer) the image provides, so it uses the standard library only
and never imports ``bai``::

    python3 -u /opt/bai/runner.py --connect /opt/bai/run/agent.sock [--workdir /home/work]
    python3 -u /opt/bai/runner.py --socket PATH [--workdir DIR]
    python3 -u /opt/bai/runner.py --relay NAME --connect /opt/bai/run/agent.sock [--ports 2200,12345-12364]

With ``--connect`` (what the agent uses) the AGENT listens on a Unix stream
socket and the runner connects to it; when the connection ends (the agent
restarted) the runner connects again, retrying every 10-250 ms for as long as
it lives.  Connecting needs no write access to the socket's folder, so the
agent mounts that folder read-only in a container.  With ``--socket`` the
runner listens instead (bound via its directory, so paths longer than 108
bytes work; a stale socket file is removed; mode 0o666) and serves ONE
connection at a time until it closes, then accepts the next one.  Either way
the protocol below is the same, work continues while no connection is up,
and output produced meanwhile is dropped.  SIGTERM makes the runner exit
with status 0 (after a SIGTERM to the process group of every app that
start-service started).

Wire protocol: newline-delimited JSON (UTF-8), one object per line.

Agent -> runner (``op``):
  query       {"op": "query", "code": STR, "id": ID?}   run Python source in one persistent
              namespace (module ``__main__``); compiled as "<cell>", exec
              semantics (a trailing expression is not echoed).
  batch       {"op": "batch", "cmd": STR, "id": ID?}    run ``/bin/sh -c cmd`` in the
              workdir, in its own process group, stdout/stderr streamed.
  input       {"op": "input", "data": STR}   query: the pending (or next)
              ``input()`` returns data minus one trailing newline.  batch: write
              data (newline-terminated) to the process's stdin.  Else ignored.
  input-eof   {"op": "input-eof"}            query: the pending (or next) ``input()``
              raises EOFError, and so does every later one in the same job
              (inputs sent before it are still read first).  batch: close
              stdin.  Else ignored.
  interrupt   {"op": "interrupt", "id": ID?}  query: KeyboardInterrupt in the
              running code; batch: SIGINT to the process group.  Else ignored
              (and when "id" is given and is not the running job's).
  A job's "id" (a string of at most 64 characters, the agent's run id) comes
  back on each of its records (stdout, stderr, waiting-input, finished) as "id".
  put-file    {"op": "put-file", "path": REL, "b64": BASE64, "mode": INT?}
              write a file under the workdir (parents created); absolute paths,
              ".." components and paths resolving outside are refused.
  ping        {"op": "ping"}
  env         {"op": "env", "env": {STR: STR}}   set these variables in the
              runner's environment (query code's os.environ, and every batch
              command, app and restarted runner started afterwards inherits
              them): how a kernel started ahead of its session (the agent's
              warm pool) gets the session's variables.  Answered by an env
              record.
  restart     {"op": "restart"}              start afresh: kill the running job's
              process group and every app's (and, as a container's PID 1,
              every other process of the container), then execute this runner
              again in the same process (a new Python and namespace), which
              connects again with a new hello.  No record (an error record if
              the runner cannot be executed again).
  start-service {"op": "start-service", "id": STR, "name": NAME, "port": INT,
              "command": [STR, ...] or null, "env": {STR: STR}, "timeout": NUMBER}
              start the app NAME ([A-Za-z0-9_.-]{1,64}) listening on TCP port
              INT in the kernel, unless it listens already: answered by a
              service record (below).  A Backend.AI service definition
              ``SERVICE_DEFS_DIR/NAME.json`` (``/etc/backend.ai/service-defs``;
              the environment variable BAI_SERVICE_DEFS names another folder),
              an object with "command": [STR, ...] and optional "env": {STR: STR},
              wins over the op's command; with neither the start fails.  In the
              command and env values "{ports[0]}" and "{port}" become the port,
              "{runtime_path}" this Python (sys.executable) and "{token}" the
              app's secret (below); other braces stay.  An app whose command or
              env names "{token}" gets a secret of its own: made once
              (24 random bytes, 32 URL-safe characters) and kept in the runner's
              own folder (PRIVATE/app-NAME.token, mode 0600; PRIVATE is
              ~/.bai-runner, else /tmp/.bai-runner-UID) so that a restarted
              runner, and a start of an app that listens already, answer the
              same one; the service record carries it as "token" (only then).
              The command runs in the workdir in its own session with
              the runner's environment + the definition's env + the op's env,
              stdin /dev/null, stdout and stderr appended to
              /tmp/bai-service-NAME.log (the workdir when /tmp is not
              writable).  It has started once a TCP connection to
              127.0.0.1:INT (or [::1]:INT) succeeds; it fails when the process
              exits first or "timeout" seconds pass (its process group is then
              killed).  A process started earlier for NAME that is alive but
              not listening is waited for the same way instead of starting
              another.  Starts of one NAME never overlap: a second one waits
              for the first's outcome (a failure is its answer too).
  tunnel      {"op": "tunnel", "id": STR, "port": INT}
              open a TCP connection to 127.0.0.1:INT (else [::1]:INT; 5 s
              timeout) in the kernel and a NEW connection to the agent's socket
              (``--connect`` only) whose first line is {"tunnel": ID}; after it
              the bytes of both are spliced both ways (an EOF one way becomes a
              shutdown(SHUT_WR) of the other side, the other way goes on) until
              both ways end or either fails.  Success has no record: the new
              connection is the answer; a failure is a tunnel record (below).
query/batch jobs run strictly one at a time in arrival order; input,
interrupt, put-file and ping are handled immediately, even while code runs;
start-service and tunnel are handled in threads of their own (any number at
once), so neither waits for nor holds up jobs or each other.
input/input-eof that arrive while no job executes but one is queued are kept
for the next job to start (so an input sent right after a batch op is not lost).

Runner -> agent (``t``):
  hello          {"t": "hello", "pid": INT, "python": "3.11.7", "busy": BOOL,
                  "job": {"id": ID, "kind": "query"|"batch"} or null, "queued": [ID, ...],
                  "done": [[ID, EXIT], ...], "backlog": [ID, ...], "sshd": BOOL}
                 first message on every connection: the job running now and
                 the jobs waiting (those with an id), and the last jobs that
                 ended while an agent was connected, with their exit codes (at
                 most 16), so that an agent that restarted re-attaches to them.
                 Records of a job made while no agent is connected are kept
                 (at most 1 MiB of them: older output goes first, with a note)
                 and sent after the next hello, in order; "backlog" names the
                 jobs they belong to (at most 16), so that the agent knows
                 them before their records (a job that ended meanwhile among
                 them) arrive.  "sshd": the kernel offers its session's owner an
                 sshd (see "SSH for the session's owner" below).
  stdout/stderr  {"t": "stdout", "d": STR}  output chunks, sent as produced.
  waiting-input  {"t": "waiting-input", "opts": {"is_password": BOOL}}
                 query code called input() (prompt already sent as stdout) or
                 getpass.getpass() (is_password true); answer with an input op.
  finished       {"t": "finished", "exit": INT}  after all output of a job.
                 query: 0 ok; 1 uncaught exception (traceback on stderr);
                 SystemExit code (None -> 0, int -> int, other -> printed, 1);
                 130 KeyboardInterrupt.  batch: return code, 128+N on signal N.
  put-file       {"t": "put-file", "path": REL, "ok": BOOL, "error": STR?}
  pong           {"t": "pong"}
  env            {"t": "env", "ok": BOOL, "error": STR?}  the outcome of an env op.
  service        {"t": "service", "id": ID, "ok": BOOL, "started": BOOL,
                 "token": STR?, "error": STR?, "output": STR?}  the outcome of start-service:
                 ok with started false when the app listened already (or
                 another start-service started it); "output" is the last 4 KiB
                 of the app's log when it failed to start.
  tunnel         {"t": "tunnel", "id": ID, "ok": false, "error": STR}
                 a tunnel could not be opened (nothing listens on the port, no
                 --connect, the agent's socket refused).
  error          {"t": "error", "msg": STR}  malformed line or unknown op.

Cluster sessions (see bai/common/cluster.py).  The kernels of a session on one
agent share a Docker network of the session and reach each other by name on
every port; a kernel on another agent is stood in for on that network by a
"peer proxy": a small container under that kernel's name that runs this file
in relay mode (below).  So a kernel's own network namespace is its own: any
app binds 0.0.0.0:ANY.
When BACKENDAI_CLUSTER_SIZE > 1 (at start, or when an env op brings it) and
the image has an sshd (/usr/sbin/sshd or on PATH) the runner starts it once
(not again while something listens on its port, as after a restart) as the
kernel's user on 0.0.0.0:2200, with a host key that ssh-keygen makes in a
folder of the runner's own (~/.bai-runner, else /tmp/.bai-runner-UID),
public-key logins only, keys from WORKDIR/.ssh/authorized_keys (and the owner's
key, below).  Without ssh-keygen, or when sshd fails, a note goes to stderr and
nothing else changes.

SSH for the session's owner (Backend.AI's `backend.ai ssh` / `scp`: the client
downloads /home/work/id_container and logs in as the kernel's user through the
app tunnel to the "sshd" app, port 2200).  When the workdir is /home/work (a
container's), the runner is not root, its user has a passwd entry and the image
has sshd and ssh-keygen, the runner makes, before its first connection, the
kernel's own ed25519 keypair: the private key is WORKDIR/id_container (mode
0600: only the kernel's user reads it, and from outside only whoever may
download the session's files), the public one PRIVATE/authorized_keys (PRIVATE:
the runner's folder above), which sshd accepts besides WORKDIR/.ssh/authorized_keys.
A kept pair (a restarted runner) is used again.  Its hello then says "sshd":
true (the agent offers the app "sshd", tcp 2200), and a start-service of "sshd"
without a service definition or command starts the sshd above (one start at a
time; what listens on the port already is it) on 127.0.0.1 only (on 0.0.0.0 in
a cluster session, for the other kernels).

Relay mode (a peer proxy)::

    python3 -u /opt/bai/runner.py --relay NAME --connect /opt/bai/run/agent.sock [--ports 2200,12345-12364]

listens on 0.0.0.0:PORT for each PORT of --ports (the default: the cluster's
ports, 2200 and 12345-12364).  Each connection it accepts there becomes a NEW
connection to the agent's socket (a kernel's of the session on this agent,
mounted read-only) whose first line is {"dial": {"host": NAME, "port": PORT}};
after it the bytes are spliced both ways as a tunnel's.  The agent treats it
as that kernel dialling: it connects it to PORT of kernel NAME (through the
manager over the agents' link: no host opens a port), or closes it when it
cannot.  It does nothing else, never exits on its own (a port it cannot bind
is skipped with a note; none at all is exit 1), and SIGTERM makes it exit 0.

The runner survives whatever it is sent: a line that is not valid UTF-8 or
JSON, a message that is not an object, fields of the wrong type, NUL bytes,
unknown ops and lines over ``--max-line`` bytes (default 256 MiB, discarded)
each get an error record; a batch command that cannot start (a NUL byte in
it, say) finishes with exit 127 and the reason on stderr; a start-service or
tunnel op with a string "id" but bad fields (a port outside 1..65535, a bad
name) gets a service/tunnel record with ok false (an error record without a
usable id).  In query code
``sys.stdin`` is the runner's own (normally /dev/null: at end of input).
"""

from __future__ import annotations

import argparse
import base64
import builtins
import codecs
import getpass
import io
import json
import os
import pwd
import queue
import re
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import types

TYPE_CHECKING = False  # typing is not imported at run time (it costs start-up time); the checker reads True
if TYPE_CHECKING:
    from typing import Any, Callable

PYTHON_VERSION = "%d.%d.%d" % tuple(sys.version_info[:3])
READ_CHUNK = 64 * 1024
OUTPUT_RECORD = 512 * 1024  # characters of output per record (the agent reads lines of at most 4 MiB)
MAX_LINE = 256 * 1024 * 1024  # --max-line: longer lines are discarded with an error record
JOB_RECORDS = ("stdout", "stderr", "finished", "waiting-input")  # a job's records: tagged with its id
MAX_JOB_ID = 64  # characters of a job's id (a longer or non-string one: the job has none)
BACKLOG_MAX = 1024 * 1024  # bytes of a job's records kept while no agent is connected
DONE_KEPT = 16  # jobs whose end the hello repeats


class _EndOfInput:
    """The type of `_EOF`."""


_EOF = _EndOfInput()  # what an input-eof op puts in a query's input queue
if TYPE_CHECKING:
    # a job's input queue: a query's input (str, or _EOF once input has ended), a batch command's stdin
    # (str, or None: close it); the early inputs of a queued job (str, or None for an input-eof)
    _Input = str | _EndOfInput | None
# Backend.AI's service definitions (NAME.json); BAI_SERVICE_DEFS names another folder (tests).
SERVICE_DEFS_DIR = os.environ.get("BAI_SERVICE_DEFS") or "/etc/backend.ai/service-defs"
SERVICE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}\Z")
SERVICE_LOG_TAIL = 4096  # bytes of an app's log sent back when it fails to start
SERVICE_POLL = 0.1  # seconds between checks of a starting app
DEFAULT_SERVICE_TIMEOUT = 60.0
SERVICE_DEF_MAX = 1 << 20  # bytes of a service definition read (a bigger one is not JSON: refused)
APP_TOKEN_BYTES = 24  # an app's secret: 24 random bytes, 32 URL-safe characters


def _app_token() -> str:
    """A new app secret: as secrets.token_urlsafe(APP_TOKEN_BYTES), whose module (hmac, random) costs about 6 ms of
    every start."""
    return base64.urlsafe_b64encode(os.urandom(APP_TOKEN_BYTES)).rstrip(b"=").decode("ascii")


APP_TOKEN = re.compile(r"[A-Za-z0-9_-]{16,128}\Z")
TUNNEL_CONNECT_TIMEOUT = 5.0
TUNNEL_CHUNK = 256 * 1024
# cluster sessions (the values of bai/common/cluster.py: the runner imports nothing of bai)
SSH_PORT = 2200
MASTER_PORT = 12345
CLUSTER_PORTS = "%d,%d-%d" % (SSH_PORT, MASTER_PORT, MASTER_PORT + 19)  # relay mode's default --ports
MAX_RELAY_LISTENERS = 4096  # relay mode: more ports is a malformed --ports
PEER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
SSH_START_TIMEOUT = 30.0
OWNER_HOME = "/home/work"  # the official client downloads /home/work/id_container and logs in as the kernel's user
OWNER_KEY = "id_container"  # in the workdir: the private key of the session's owner
OWNER_KEYS = "authorized_keys"  # in the runner's folder: its public key, which sshd accepts
SSHD_APP = "sshd"  # the app (service port) that is this sshd
REAP_INTERVAL = 2.0  # seconds between looks for sshd's zombies (PID 1 only)
_RUNNER_GLOBALS = globals()
RUNNER_FILE = os.path.abspath(__file__)  # before main() changes directory: what `restart` executes again


def _sigint_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGINT to a batch command's process group, unless it has ended."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGINT)
        except OSError:
            pass


def _ignore_signal(signum: int, frame: types.FrameType | None) -> None:
    # A Python-level no-op handler (unlike SIG_IGN it is not inherited by
    # children across exec), used for SIGINT while no query is executing.
    pass


class _Stream(io.TextIOBase):
    """Text stream that forwards every write() to the agent immediately."""

    def __init__(self, runner: Runner, kind: str) -> None:
        super().__init__()
        self._runner = runner
        self._kind = kind

    # io.TextIOBase's encoding and errors are read-only properties at run time, as here; typeshed
    # declares them plain attributes, which a property may not override
    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    @property
    def errors(self) -> str:  # type: ignore[override]
        return "strict"

    @property
    def name(self) -> str:
        return "<%s>" % self._kind

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        if self.closed:
            raise ValueError("I/O operation on closed file.")
        if not isinstance(s, str):
            raise TypeError("write() argument must be str, not %s" % type(s).__name__)
        # in records the agent takes (it drops a line over 4 MiB): at most OUTPUT_RECORD characters each,
        # which JSON writes in at most 6 bytes a character (a control character's \u escape)
        for start in range(0, len(s), OUTPUT_RECORD):
            self._runner.send({"t": self._kind, "d": s[start : start + OUTPUT_RECORD]})
        return len(s)


class Runner:
    """The kernel-side runner: runs query code and batch commands for the agent, one at a time."""

    def __init__(self, workdir: str, max_line: int = MAX_LINE, connect_path: str | None = None) -> None:
        self.workdir = workdir
        self.connect_path = connect_path  # the agent's socket (--connect): where tunnels connect to
        self.max_line = max_line
        self.input_eof = False  # the current query's input has ended (main thread only)
        self.pid = os.getpid()
        self.main_ident = threading.get_ident()
        self.send_lock = threading.Lock()
        self.state_lock = threading.Lock()
        self.conn: socket.socket | None = None
        # All fields below are guarded by state_lock.
        self.jobs: queue.Queue[tuple[str, str, str | None]] = queue.Queue()  # (kind, code or command, id)
        self.queued = 0  # jobs accepted but not yet started
        self.queued_ids: list[str] = []  # the ids of those that have one, in order
        self.current_id: str | None = None  # the running job's id
        self.done: list[list[Any]] = []  # [id, exit] of the last jobs that ended (DONE_KEPT)
        # guarded by send_lock: a job's records made while no agent is connected (encoded lines), their size,
        # and the bytes of output dropped from them (BACKLOG_MAX)
        self.backlog: list[tuple[bytes, bool, str | None]] = []  # (line, is output, its job's id)
        self.backlog_bytes = 0
        self.backlog_dropped = 0
        self.early: list[str | None] = []  # input/input-eof received while a job was queued
        self.inputs: queue.Queue[_Input] = queue.Queue()
        self.current: str | None = None  # "query" / "batch" while executing
        self.interruptible = False  # main thread is inside a query's exec()
        self.proc: subprocess.Popen[bytes] | None = None
        self.stdin_q: queue.Queue[_Input] | None = None
        self.out: _Stream | None = None
        # app name -> the Popen of the process start-service started for it
        self.services: dict[str, subprocess.Popen[bytes]] = {}
        # app name -> (its log's path, the log's size when it started)
        self.service_logs: dict[str, tuple[str, int]] = {}
        # app name -> (Event, outcome dict) while a start of it runs
        self.service_starts: dict[str, tuple[threading.Event, dict[str, Any]]] = {}
        self.app_tokens: dict[str, str] = {}  # app name -> its secret ({token} in its command), once made or read
        self.cluster_lock = threading.Lock()
        self.sshd_tried = False
        self.sshd_lock = threading.Lock()  # one start of sshd at a time (the cluster's, start-service's)
        self.sshd_proc: subprocess.Popen[bytes] | None = None  # the last sshd started
        self.reaping = False  # the thread that reaps sshd's leftovers runs (PID 1 only)
        # the owner's keypair is there (see "SSH for the session's owner"); set before connecting
        self.owner_ssh = False
        # The persistent user namespace is a real module installed as __main__,
        # so pickle/multiprocessing can find user-defined functions and classes.
        self.runner_module = sys.modules.get("__main__")
        self.module = types.ModuleType("__main__")
        self.module.__dict__["__builtins__"] = builtins
        sys.modules["__main__"] = self.module
        os.register_at_fork(after_in_child=self._after_fork_child)

    def _after_fork_child(self) -> None:
        # Locks may have been held by other (now vanished) threads.
        self.send_lock = threading.Lock()
        self.state_lock = threading.Lock()

    # -- sending ---------------------------------------------------------

    def send(self, obj: dict[str, Any]) -> None:
        kind = obj.get("t")
        job = kind in JOB_RECORDS
        if job and "id" not in obj and self.current_id is not None:
            obj["id"] = self.current_id
        try:
            data = json.dumps(obj, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates: escape them instead
            data = json.dumps(obj).encode("ascii")
        if len(data) > 16384 and self.interruptible and threading.get_ident() == self.main_ident:
            # An interrupt landing inside a blocked sendall() could leave half a
            # line on the wire: hold SIGINT until the message is complete.  (On
            # Linux, Unix stream sends this small are never split, and masking
            # every write would slow print() floods down by half.)
            old = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])
            try:
                with self.send_lock:
                    self._send_locked(data + b"\n", job, kind in ("stdout", "stderr"), obj.get("id"))
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, old)
        else:
            with self.send_lock:
                self._send_locked(data + b"\n", job, kind in ("stdout", "stderr"), obj.get("id"))

    def _send_locked(self, data: bytes, job: bool = False, output: bool = False, job_id: str | None = None) -> None:
        conn = self.conn
        if conn is not None:
            try:
                conn.sendall(data)
                return
            except OSError:
                self.conn = None
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        if job:  # nobody listening: a job's record waits for the next agent (answers to ops are dropped)
            self._keep(data, output, job_id)

    def _keep(self, data: bytes, output: bool, job_id: str | None) -> None:
        """Keep a job's record for the next connection; beyond BACKLOG_MAX the oldest output goes (a job's end
        and its waiting-input records are always kept: they are small)."""
        self.backlog.append((data, output, job_id))
        self.backlog_bytes += len(data)
        if self.backlog_bytes <= BACKLOG_MAX:
            return
        kept: list[tuple[bytes, bool, str | None]] = []
        for entry in self.backlog:
            if entry[1] and self.backlog_bytes > BACKLOG_MAX // 2:
                self.backlog_bytes -= len(entry[0])
                self.backlog_dropped += len(entry[0])
            else:
                kept.append(entry)
        self.backlog = kept

    def _hello(self) -> dict[str, Any]:
        """The first line of a connection (see the protocol above): at most about 3 KiB. (send_lock held: the
        jobs whose records wait in the backlog are not said ended here: their records, their end last, follow.)"""
        waiting = {entry[2] for entry in self.backlog}
        backlog = list(dict.fromkeys(entry[2] for entry in self.backlog if entry[2] is not None))
        with self.state_lock:
            job = {"id": self.current_id, "kind": self.current} if self.current_id is not None else None
            return {
                "t": "hello",
                "pid": self.pid,
                "python": PYTHON_VERSION,
                "busy": self.current is not None or self.queued > 0,
                "job": job,
                "queued": self.queued_ids[:16],
                "done": [d for d in self.done if d[0] not in waiting][-DONE_KEPT:],
                "backlog": backlog[:DONE_KEPT],
                "sshd": self.owner_ssh,
            }

    def _flush_backlog(self, conn: socket.socket) -> None:
        """After the hello (send_lock held): what the jobs said while no agent was connected, in order."""
        lines = [entry[0] for entry in self.backlog]
        if self.backlog_dropped:
            note = {
                "t": "stderr",
                "d": "[%d bytes of output were dropped while the agent was away]\n" % self.backlog_dropped,
            }
            first = json.loads(lines[0]) if lines else {}
            if isinstance(first, dict) and "id" in first:
                note["id"] = first["id"]
            lines.insert(0, json.dumps(note).encode() + b"\n")
        self.backlog, self.backlog_bytes, self.backlog_dropped = [], 0, 0
        for line in lines:
            if self.conn is not conn:
                break
            self._send_locked(line, True)

    # -- connections (runs in the "conn" thread) -------------------------

    def serve(self, server: socket.socket) -> None:
        """--socket: accept one connection at a time."""
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                time.sleep(0.1)
                continue
            self._serve_conn(conn)

    def connect_forever(self, path: str) -> None:
        """--connect: connect to the agent's socket, and again whenever the connection ends."""
        delay = 0.01
        while True:
            try:
                conn = connect_socket(path)
            except OSError:
                time.sleep(delay)
                delay = min(delay * 2, 0.25)
                continue
            delay = 0.01
            self._serve_conn(conn)

    def _serve_conn(self, conn: socket.socket) -> None:
        with self.send_lock:
            hello = self._hello()
            self.conn = conn
            self._send_locked(json.dumps(hello).encode() + b"\n")
            self._flush_backlog(conn)
        try:
            self._read_loop(conn)
        finally:
            with self.send_lock:
                if self.conn is conn:
                    self.conn = None
            conn.close()

    def _read_loop(self, conn: socket.socket) -> None:
        buf = bytearray()
        skipping = False  # inside a line over max_line: drop bytes until its newline
        while True:
            try:
                data = conn.recv(READ_CHUNK)
            except OSError:
                return
            if not data:
                return
            if skipping:
                nl = data.find(b"\n")
                if nl < 0:
                    continue
                data = data[nl + 1 :]
                skipping = False
            start = len(buf)
            buf += data
            end = buf.find(b"\n", start)
            while end >= 0:
                line = bytes(buf[:end])
                del buf[: end + 1]
                if line.strip():
                    self._dispatch_safely(line)
                end = buf.find(b"\n")
            if len(buf) > self.max_line:
                buf = bytearray()
                skipping = True
                self.send({"t": "error", "msg": "line longer than %d bytes: discarded" % self.max_line})

    def _dispatch_safely(self, line: bytes) -> None:
        """dispatch(), but nothing a client sends may end the connection thread."""
        try:
            self.dispatch(line)
        except Exception as e:
            try:
                self.send({"t": "error", "msg": "cannot handle the message: %s" % _short(repr(e))})
            except Exception:
                pass

    def dispatch(self, line: bytes) -> None:
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as e:
            self.send({"t": "error", "msg": "message is not valid UTF-8: %s" % e})
            return
        try:
            msg = json.loads(text)
        except (ValueError, RecursionError) as e:
            self.send({"t": "error", "msg": "malformed JSON: %s" % _short(str(e))})
            return
        if not isinstance(msg, dict):
            self.send({"t": "error", "msg": "message must be a JSON object"})
            return
        op = msg.get("op")
        if op == "ping":
            self.send({"t": "pong"})
        elif op in ("query", "batch"):
            field = "code" if op == "query" else "cmd"
            if not isinstance(msg.get(field), str):
                self.send({"t": "error", "msg": "%s: %r must be a string" % (op, field)})
                return
            job_id = msg.get("id")
            if not isinstance(job_id, str) or not 0 < len(job_id) <= MAX_JOB_ID:
                job_id = None
            with self.state_lock:
                self.queued += 1
                if job_id is not None:
                    self.queued_ids.append(job_id)
                self.jobs.put((op, msg[field], job_id))
        elif op == "input":
            data = msg.get("data")
            if not isinstance(data, str):
                self.send({"t": "error", "msg": "input: 'data' must be a string"})
                return
            self._route_input(data)
        elif op == "input-eof":
            self._route_input(None)
        elif op == "interrupt":
            with self.state_lock:
                named = msg.get("id")
                if isinstance(named, str) and named != self.current_id:
                    pass  # a run that is not running (any more): nothing to interrupt
                elif self.current == "query" and self.interruptible:
                    signal.pthread_kill(self.main_ident, signal.SIGINT)
                elif self.current == "batch" and self.proc is not None:
                    proc = self.proc
                    _sigint_group(proc)
                    # A shell can swallow a SIGINT that lands between its fork and the exec of
                    # the command: say it again if the command is still running.
                    for delay in (0.5, 1.5):
                        timer = threading.Timer(delay, _sigint_group, (proc,))
                        timer.daemon = True
                        timer.start()
        elif op == "put-file":
            self.send(self.put_file(msg))
        elif op == "env":
            self.send(self.set_env(msg))
        elif op == "restart":
            self.restart()
        elif op == "start-service":
            self._in_thread("service", self.start_service, msg)
        elif op == "tunnel":
            self._in_thread("tunnel", self.open_tunnel, msg)
        else:
            self.send({"t": "error", "msg": "unknown op: %s" % _short(repr(op))})

    def _route_input(self, data: str | None) -> None:
        """Deliver input (None: EOF) to the running job, or keep it for the
        next job if one is queued; drop it when idle."""
        with self.state_lock:
            if self.current is None:
                if self.queued:
                    self.early.append(data)
            elif self.current == "query":
                self.inputs.put(_EOF if data is None else data)
            elif self.stdin_q is not None:
                if data is not None and not data.endswith("\n"):
                    data += "\n"
                self.stdin_q.put(data)

    def _start_job(self, kind: str, job_id: str | None = None) -> queue.Queue[_Input]:
        """Mark a dequeued job as current and hand it the early input."""
        q: queue.Queue[_Input] = queue.Queue()
        with self.state_lock:
            self.queued -= 1
            if job_id is not None and job_id in self.queued_ids:
                self.queued_ids.remove(job_id)
            self.current = kind
            self.current_id = job_id
            for data in self.early:
                if kind == "batch" and data is not None and not data.endswith("\n"):
                    data += "\n"
                q.put(_EOF if kind == "query" and data is None else data)
            self.early = []
            if kind == "query":
                self.inputs = q
            else:
                self.stdin_q = q
        return q

    def _end_job(self, code: int) -> None:
        """The job ended with `code`: it is no longer current (input that comes once its end is known is the next
        job's), then its end is sent, tagged with its id, and remembered for the hello."""
        with self.state_lock:
            job_id = self.current_id
            self.current = None
            self.current_id = None
            self.proc = self.stdin_q = None
            if job_id is not None:
                self.done.append([job_id, code])
                del self.done[:-DONE_KEPT]
        end: dict[str, Any] = {"t": "finished", "exit": code}
        if job_id is not None:
            end["id"] = job_id
        self.send(end)

    def set_env(self, msg: dict[str, Any]) -> dict[str, Any]:
        global SERVICE_DEFS_DIR
        try:
            env = _str_dict(msg.get("env"), "env")
            for name in env:
                if not name or "=" in name:
                    raise ValueError("bad variable name %r" % _short(name, 60))
            os.environ.update(env)  # putenv: what every process started from now on inherits
        except (TypeError, ValueError) as e:
            return {"t": "env", "ok": False, "error": _short(str(e))}
        if "BAI_SERVICE_DEFS" in env:
            SERVICE_DEFS_DIR = env["BAI_SERVICE_DEFS"] or "/etc/backend.ai/service-defs"
        if "BACKENDAI_CLUSTER_SIZE" in env:  # a warm kernel joins a cluster
            self.start_cluster()
        return {"t": "env", "ok": True}

    def put_file(self, msg: dict[str, Any]) -> dict[str, Any]:
        path = msg.get("path")
        reply: dict[str, Any] = {"t": "put-file", "path": path, "ok": False}
        try:
            if not isinstance(path, str) or not path:
                raise ValueError("path must be a non-empty string")
            if os.path.isabs(path) or ".." in path.split("/"):
                raise ValueError("path must be relative and must not contain '..'")
            mode = msg.get("mode")
            if mode is not None and (not isinstance(mode, int) or isinstance(mode, bool)):
                raise ValueError("mode must be an integer")
            b64 = msg.get("b64")
            if not isinstance(b64, str):
                raise ValueError("b64 must be a string")
            data = base64.b64decode(b64, validate=True)
            root = os.path.realpath(self.workdir)
            target = os.path.realpath(os.path.join(root, path))
            if os.path.commonpath([root, target]) != root or target == root:
                raise ValueError("path resolves outside the workdir")
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb") as f:
                f.write(data)
            if mode is not None:
                os.chmod(target, mode & 0o7777)
        except Exception as e:
            reply["error"] = "%s: %s" % (type(e).__name__, e)
            return reply
        reply["ok"] = True
        return reply

    # -- apps and tunnels (each op in a thread of its own) ----------------

    def _in_thread(
        self, kind: str, handler: Callable[[str, dict[str, Any]], dict[str, Any] | None], msg: dict[str, Any]
    ) -> None:
        """Run handler(op_id, msg) in a new thread; what it returns (a record, or None) is sent, and
        an exception becomes a *kind* record with ok false."""
        op_id = msg.get("id")
        if not isinstance(op_id, str):
            self.send({"t": "error", "msg": "%s: 'id' must be a string" % msg.get("op")})
            return

        def run() -> None:
            try:
                reply = handler(op_id, msg)
            except Exception as e:
                reply = {"t": kind, "id": op_id, "ok": False, "error": _short("%s: %s" % (type(e).__name__, e))}
                if kind == "service":
                    reply["started"] = False
            if reply is not None:
                self.send(reply)

        threading.Thread(target=run, name="%s-%s" % (kind, _short(op_id, 40)), daemon=True).start()

    def start_service(self, op_id: str, msg: dict[str, Any]) -> dict[str, Any]:
        """start-service: the service record to answer with."""
        reply: dict[str, Any] = {"t": "service", "id": op_id, "ok": False, "started": False}
        try:
            name = msg.get("name")
            if not isinstance(name, str) or not SERVICE_NAME.match(name):
                raise ValueError("name must match [A-Za-z0-9_.-]{1,64}, not %s" % _short(repr(name), 80))
            port = _port(msg.get("port"))
            command = msg.get("command")
            if command is not None:
                command = _str_list(command, "command")
            env = msg.get("env")
            env = {} if env is None else _str_dict(env, "env")
            timeout = msg.get("timeout")
            if timeout is None:
                timeout = DEFAULT_SERVICE_TIMEOUT
            elif isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < 1e9:
                raise ValueError("timeout must be a positive number of seconds")
        except ValueError as e:
            reply["error"] = "start-service: %s" % e
            return reply
        while True:  # one start of an app at a time: a second one waits for the first's outcome
            with self.state_lock:
                pending = self.service_starts.get(name)
                if pending is None:
                    done = threading.Event()
                    outcome: dict[str, Any] = {}
                    self.service_starts[name] = (done, outcome)
                    break
            pending[0].wait()
            if not pending[1].get("ok"):
                reply.update(pending[1])
                reply["started"] = False
                return reply
            # it started: look again (normally it listens now, and nothing more is started)
        try:
            outcome.update(self._start_service(name, port, command, env, float(timeout)))
        except Exception as e:
            outcome.update(ok=False, error=_short("cannot start %s: %s: %s" % (name, type(e).__name__, e)))
        finally:
            with self.state_lock:
                del self.service_starts[name]
            done.set()
        reply.update(outcome)
        return reply

    def _start_service(
        self, name: str, port: int, command: list[str] | None, env: dict[str, str], timeout: float
    ) -> dict[str, Any]:
        """Start app *name* unless it listens already (no other start of it runs meanwhile)."""
        defs_path = os.path.join(SERVICE_DEFS_DIR, name + ".json")
        def_env: dict[str, str] = {}
        error = ""
        if os.path.isfile(defs_path):
            try:
                with open(defs_path, "rb") as f:
                    sdef = json.loads(f.read(SERVICE_DEF_MAX + 1)[:SERVICE_DEF_MAX].decode("utf-8"))
                if not isinstance(sdef, dict):
                    raise ValueError("not a JSON object")
                command = _str_list(sdef.get("command"), "command")
                if sdef.get("env") is not None:
                    def_env = _str_dict(sdef["env"], "env")
            except (OSError, ValueError, RecursionError) as e:
                command = None
                error = _short("bad service definition %s: %s" % (defs_path, e))
        elif command is None:
            if name == SSHD_APP and self.owner_ssh:
                return self.ensure_sshd(port)
            error = "no command is known to start %s" % name
        if command is None:  # what listens there already (the image started it itself) is the app
            return {"ok": True, "started": False} if _listening(port) else {"ok": False, "error": error}
        token = ""
        if any("{token}" in text for text in (*command, *def_env.values(), *env.values())):
            token = self._app_token(name)
        done: dict[str, Any] = {"ok": True, "started": False}
        if token:
            done["token"] = token
        if _listening(port):
            return done
        with self.state_lock:
            proc = self.services.get(name)
            log_path, log_start = self.service_logs.get(name, ("", 0))
        if proc is None or proc.poll() is not None:
            argv = [_substitute(arg, port, token) for arg in command]
            full_env = dict(os.environ)
            for extra in (def_env, env):
                for key, value in extra.items():
                    full_env[key] = _substitute(value, port, token)
            log_fd, log_path = self._open_service_log(name)
            try:
                log_start = os.fstat(log_fd).st_size
                proc = subprocess.Popen(
                    argv,
                    cwd=self.workdir,
                    env=full_env,
                    start_new_session=True,
                    stdin=subprocess.DEVNULL,
                    stdout=log_fd,
                    stderr=subprocess.STDOUT,
                )
            except (OSError, ValueError) as e:  # no such program; a NUL byte in an argument
                return {"ok": False, "error": _short("cannot start %s: %s" % (name, e))}
            finally:
                os.close(log_fd)
            done["started"] = True
            with self.state_lock:
                self.services[name] = proc
                self.service_logs[name] = (log_path, log_start)
        deadline = time.monotonic() + timeout
        while True:
            if _listening(port):
                return done
            rc = proc.poll()
            if rc is not None:
                if rc < 0:
                    error = "%s was killed by signal %d while starting" % (name, -rc)
                else:
                    error = "%s exited with code %d while starting" % (name, rc)
                return {"ok": False, "error": error, "output": _log_tail(log_path, log_start)}
            if time.monotonic() >= deadline:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                proc.wait()
                error = "%s did not listen on port %d within %g s" % (name, port, timeout)
                return {"ok": False, "error": error, "output": _log_tail(log_path, log_start)}
            time.sleep(SERVICE_POLL)

    def _app_token(self, name: str) -> str:
        """App *name*'s secret: the one kept in the runner's folder, else a new one kept there (in memory
        only when no folder can be had: it then lasts as long as this runner)."""
        with self.state_lock:
            token = self.app_tokens.get(name)
            if token:
                return token
            try:
                token = _kept_token(os.path.join(_private_folder(), "app-%s.token" % name))
            except OSError as e:
                _note("the secret of %s is kept in memory only: %s" % (name, e))
                token = _app_token()
            self.app_tokens[name] = token
            return token

    def _open_service_log(self, name: str) -> tuple[int, str]:
        """(fd, path) of app *name*'s log, opened for appending: in /tmp, else in the workdir."""
        filename = "bai-service-%s.log" % name
        error: OSError | None = None
        for folder in ("/tmp", self.workdir):
            path = os.path.join(folder, filename)
            try:
                return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644), path
            except OSError as e:
                error = e
        raise error  # type: ignore[misc]  # set: the loop ran, and each folder failed

    def open_tunnel(self, op_id: str, msg: dict[str, Any]) -> dict[str, Any] | None:
        """tunnel: None once the tunnel is up, else the tunnel record saying why not."""
        reply = {"t": "tunnel", "id": op_id, "ok": False}
        try:
            port = _port(msg.get("port"))
        except ValueError as e:
            reply["error"] = "tunnel: %s" % e
            return reply
        if self.connect_path is None:
            reply["error"] = "tunnels need --connect"
            return reply
        try:
            app = _connect_local(port, TUNNEL_CONNECT_TIMEOUT)
        except OSError as e:
            reply["error"] = _short("nothing listens on port %d in the kernel (%s)" % (port, e), 400)
            return reply
        agent = None
        try:
            app.settimeout(None)
            app.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            agent = connect_socket(self.connect_path)
            agent.sendall(json.dumps({"tunnel": op_id}).encode("utf-8") + b"\n")
            _Tunnel(app, agent).start()
        except Exception as e:
            for sock in (app, agent):
                if sock is not None:
                    sock.close()
            reply["error"] = _short("cannot open a tunnel to port %d: %s" % (port, e), 400)
            return reply
        return None

    # -- cluster sessions: sshd (the kernels reach each other on their session's network) --

    def start_cluster(self) -> None:
        """What a kernel of a cluster session runs besides its code: sshd, in a thread of its own (it may take
        seconds).  It may be asked again (an env op): what runs is left alone."""
        threading.Thread(target=self._start_sshd_safely, name="sshd", daemon=True).start()

    def _start_sshd_safely(self) -> None:
        try:
            self.start_sshd()
        except Exception as e:
            _note("sshd was not started: %s: %s" % (type(e).__name__, e))

    def start_sshd(self) -> None:
        """sshd on SSH_PORT for the other kernels (see "Cluster sessions" above), once."""
        try:
            size = int(os.environ.get("BACKENDAI_CLUSTER_SIZE") or "1")
        except ValueError:
            return
        with self.cluster_lock:
            if size <= 1 or self.sshd_tried:
                return
            self.sshd_tried = True
        if not _program("sshd", "/usr/sbin/sshd"):
            return
        outcome = self.ensure_sshd(SSH_PORT)
        if not outcome["ok"]:
            output = _short(str(outcome.get("output") or "").strip(), 600)
            _note("sshd was not started: %s%s" % (outcome["error"], ": " + output if output else ""))

    # -- SSH for the session's owner (see the module's docstring) --

    def prepare_owner_ssh(self) -> None:
        """The owner's keypair, made unless it is there (sets owner_ssh); before the first connection, so that
        the first hello says whether the kernel offers sshd and the key can be downloaded once it runs."""
        try:
            self.owner_ssh = self._owner_keypair()
        except Exception as e:
            _note("no sshd for the session's owner: %s: %s" % (type(e).__name__, e))
        if self.owner_ssh:
            self._start_reaper()  # (an sshd may run from before a restart)

    def _owner_keypair(self) -> bool:
        if self.workdir != OWNER_HOME or os.getuid() == 0:
            return False
        keygen = _program("ssh-keygen", "/usr/bin/ssh-keygen")
        if not keygen or not _program("sshd", "/usr/sbin/sshd"):
            return False
        try:
            pwd.getpwuid(os.getuid())
        except KeyError:
            _note("no sshd for the session's owner: uid %d has no passwd entry to log in as" % os.getuid())
            return False
        folder = _private_folder()
        private, public = os.path.join(self.workdir, OWNER_KEY), os.path.join(folder, OWNER_KEYS)
        if os.path.isfile(private) and os.path.isfile(public) and os.path.getsize(public) > 0:
            return True  # kept (the runner was restarted)
        made = os.path.join(folder, "owner_key")
        for path in (made, made + ".pub"):
            if os.path.lexists(path):
                os.unlink(path)
        done = subprocess.run(
            [keygen, "-q", "-t", "ed25519", "-N", "", "-C", "bai-session", "-f", made],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=SSH_START_TIMEOUT,
        )
        if done.returncode != 0:
            output = _short(done.stdout.decode("utf-8", "replace"))
            _note("no sshd for the session's owner: ssh-keygen failed: %s" % output)
            return False
        try:
            with open(made, "rb") as f:
                private_key = f.read()
            with open(made + ".pub", "rb") as f:
                public_key = f.read()
            _write_private(private, private_key)
            _write_private(public, public_key)  # (last: a pair is complete once this is there)
        finally:
            for path in (made, made + ".pub"):
                if os.path.lexists(path):
                    os.unlink(path)
        return True

    def _start_reaper(self) -> None:
        """Where the runner is PID 1: a thread that reaps what sshd leaves it (once)."""
        with self.cluster_lock:
            if os.getpid() != 1 or self.reaping:
                return
            self.reaping = True
        threading.Thread(target=self._reap_forever, name="reaper", daemon=True).start()

    def _reap_forever(self) -> None:
        while True:
            time.sleep(REAP_INTERVAL)
            try:
                self.reap_sshd_orphans()
            except Exception as e:  # (a bug: the kernel goes on, its zombies stay)
                _note("reaping sshd's leftovers failed: %s: %s" % (type(e).__name__, e))
                return

    def reap_sshd_orphans(self) -> None:
        """Reap the zombies named sshd whose parent is this runner and that it did not start itself: as a
        container's PID 1 it inherits one per SSH connection (a process of sshd's whose parent ended first),
        and every zombie counts against the kernel's pids limit.  Only those: a blanket waitpid(-1) would
        take the exit status of a batch command's, an app's or query code's own child from its waiter."""
        own = {self.pid}
        with self.state_lock:
            procs = [self.proc, self.sshd_proc, *self.services.values()]
        own.update(p.pid for p in procs if p is not None)
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in own:
                continue
            try:
                with open("/proc/%s/stat" % entry, "rb") as f:
                    stat = f.read(1024)
            except OSError:
                continue
            # "PID (COMM) STATE PPID ...": COMM may hold spaces and parentheses, so split after the last ")"
            comm = stat[stat.find(b"(") + 1 : stat.rfind(b")")]
            fields = stat[stat.rfind(b")") + 2 :].split()
            if comm == b"sshd" and len(fields) > 1 and fields[0] == b"Z" and fields[1] == str(self.pid).encode():
                try:
                    os.waitpid(int(entry), os.WNOHANG)
                except OSError:
                    pass

    def ensure_sshd(self, port: int) -> dict[str, Any]:
        """sshd on *port* unless something listens there (one start at a time): a service record's outcome,
        {"ok", "started", "error"?, "output"?}."""
        with self.sshd_lock:
            if _listening(port):
                return {"ok": True, "started": False}
            return self._run_sshd(port)

    def _run_sshd(self, port: int) -> dict[str, Any]:
        """Start sshd as the runner's user on *port* (see "Cluster sessions" above): on 0.0.0.0 in a cluster
        session (its other kernels reach it), else on 127.0.0.1 only (the owner reaches it through a tunnel)."""
        sshd = _program("sshd", "/usr/sbin/sshd")
        if not sshd:
            return {"ok": False, "error": "the image has no sshd"}
        keygen = _program("ssh-keygen", "/usr/bin/ssh-keygen")
        if not keygen:
            return {"ok": False, "error": "the image has no ssh-keygen to make sshd's host key"}
        folder = _private_folder()
        key = os.path.join(folder, "ssh_host_ed25519_key")
        if not os.path.exists(key):
            made = subprocess.run(
                [keygen, "-q", "-t", "ed25519", "-N", "", "-f", key],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                timeout=SSH_START_TIMEOUT,
            )
            if made.returncode != 0:
                output = made.stdout.decode("utf-8", "replace").strip()
                return {"ok": False, "error": "ssh-keygen failed: %s" % _short(output, 400)}
        if os.getuid() == 0:  # a root sshd separates privileges and wants its (empty) folder
            try:
                os.makedirs("/run/sshd", 0o755, exist_ok=True)
            except OSError:
                pass
        try:
            cluster = int(os.environ.get("BACKENDAI_CLUSTER_SIZE") or "1") > 1
        except ValueError:
            cluster = False
        keys = [os.path.join(self.workdir, ".ssh", "authorized_keys")]
        if self.owner_ssh:
            keys.append(os.path.join(folder, OWNER_KEYS))
        log_path = os.path.join(folder, "sshd.log")
        argv = [os.path.abspath(sshd), "-f", "/dev/null", "-E", log_path]
        options = [
            "Port=%d" % port,
            "ListenAddress=%s" % ("0.0.0.0" if cluster else "127.0.0.1"),
            "HostKey=%s" % key,
            "PidFile=none",
            "UsePAM=no",
            "StrictModes=no",
            "PasswordAuthentication=no",
            "KbdInteractiveAuthentication=no",
            "PubkeyAuthentication=yes",
            "AuthorizedKeysFile=%s" % " ".join(keys),
            "PrintMotd=no",
            "X11Forwarding=no",
            "Subsystem=sftp internal-sftp",
        ]
        for option in options:
            argv += ["-o", option]
        log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            log_start = os.fstat(log_fd).st_size
            # Without -D it forks into the background and this one exits, except where the runner is PID 1 (a
            # container's): then sshd, a session leader whose parent is init, stays (it deems itself a daemon
            # already).  It runs in a session of its own (a restart ends it only where the runner is PID 1).
            proc = subprocess.Popen(
                argv,
                cwd=self.workdir,
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=log_fd,
                stderr=log_fd,
            )
        finally:
            os.close(log_fd)
        self.sshd_proc = proc
        self._start_reaper()
        deadline = time.monotonic() + SSH_START_TIMEOUT
        while not _listening(port):
            code = proc.poll()
            if code:
                error = "sshd exited with code %s while starting" % code
                return {"ok": False, "error": error, "output": _log_tail(log_path, log_start)}
            if time.monotonic() >= deadline:
                error = "sshd did not listen on port %d within %g s" % (port, SSH_START_TIMEOUT)
                return {"ok": False, "error": error, "output": _log_tail(log_path, log_start)}
            time.sleep(0.02 if code is None else SERVICE_POLL)
        return {"ok": True, "started": True}

    # -- job execution (main thread) ------------------------------------

    def run_forever(self) -> None:
        while True:
            try:
                kind, payload, job_id = self.jobs.get(timeout=1.0)
            except queue.Empty:
                continue
            stdin_q = self._start_job(kind, job_id)
            self.input_eof = False
            try:
                if kind == "query":
                    code = self.run_query(payload)
                else:
                    code = self.run_batch(payload, stdin_q)
            except Exception as e:  # a runner bug must not end the runner: report it as the job's end
                self.send({"t": "stderr", "d": "bai runner: %s\n" % _short(repr(e))})
                code = 1
            self._end_job(code)

    def run_query(self, source: str) -> int:
        out, err = _Stream(self, "stdout"), _Stream(self, "stderr")
        saved = (sys.stdout, sys.stderr, builtins.input, getpass.getpass)
        sys.stdout, sys.stderr = out, err
        builtins.input, getpass.getpass = self._input, self._getpass
        self.out = out
        exit_code = 0
        try:
            try:
                signal.signal(signal.SIGINT, signal.default_int_handler)
                with self.state_lock:
                    self.interruptible = True
                exec(compile(source, "<cell>", "exec"), self.module.__dict__)
            finally:
                with self.state_lock:
                    self.interruptible = False
                signal.signal(signal.SIGINT, _ignore_signal)
        except SystemExit as e:
            if e.code is None:
                exit_code = 0
            elif isinstance(e.code, int):
                exit_code = e.code
            else:
                err.write("%s\n" % (e.code,))
                exit_code = 1
        except KeyboardInterrupt as e:
            self._print_exc(e, err)
            exit_code = 130
        except BaseException as e:
            self._print_exc(e, err)
            exit_code = 1
        finally:
            signal.signal(signal.SIGINT, _ignore_signal)
            if os.getpid() != self.pid:
                # A fork()ed child returned from the cell: it must not go on
                # to act as a second runner.
                os._exit(exit_code & 0xFF)
            sys.stdout, sys.stderr, builtins.input, getpass.getpass = saved
            self.out = None
        return exit_code

    @staticmethod
    def _print_exc(exc: BaseException, stream: _Stream) -> None:
        tb = exc.__traceback__
        # Hide the runner's own frames (the exec() call in run_query).
        while tb is not None and tb.tb_frame.f_globals is _RUNNER_GLOBALS:
            tb = tb.tb_next
        import traceback  # (only for an error: about 4 ms of every start otherwise)

        lines = traceback.format_exception(type(exc), exc, tb)
        stream.write("".join(lines))

    def _input(self, prompt: object = "") -> str:
        return self._read_input(str(prompt), False)

    def _getpass(self, prompt: str = "Password: ", stream: object = None) -> str:
        return self._read_input(prompt, True)

    def _read_input(self, prompt: str, is_password: bool) -> str:
        out = self.out
        if prompt and out is not None:
            out.write(prompt)
        if self.input_eof:
            raise EOFError
        self.send({"t": "waiting-input", "opts": {"is_password": is_password}})
        while True:
            try:
                data = self.inputs.get(timeout=0.2)
                break
            except queue.Empty:
                continue
        if isinstance(data, _EndOfInput):  # _EOF
            self.input_eof = True  # as on a pipe: every later input() of this job ends too
            raise EOFError
        assert data is not None  # a query's input-eof is _EOF in its queue
        return data[:-1] if data.endswith("\n") else data

    def run_batch(self, cmd: str, stdin_q: queue.Queue[_Input]) -> int:
        try:
            proc = subprocess.Popen(
                cmd,
                shell=True,
                cwd=self.workdir,
                start_new_session=True,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        except (OSError, ValueError) as e:  # ValueError: a NUL byte, an unencodable character
            self.send({"t": "stderr", "d": "cannot start batch command: %s\n" % _short(str(e))})
            return 127
        with self.state_lock:
            self.proc = proc
        feeder = threading.Thread(target=self._feed_stdin, args=(proc, stdin_q), daemon=True)
        feeder.start()
        pumps = [
            threading.Thread(target=self._pump, args=(proc.stdout, "stdout"), daemon=True),
            threading.Thread(target=self._pump, args=(proc.stderr, "stderr"), daemon=True),
        ]
        for t in pumps:
            t.start()
        for t in pumps:
            t.join()
        rc = proc.wait()
        with self.state_lock:
            self.proc = self.stdin_q = None
        stdin_q.put(None)
        feeder.join()
        return rc if rc >= 0 else 128 - rc

    @staticmethod
    def _feed_stdin(proc: subprocess.Popen[bytes], stdin_q: queue.Queue[_Input]) -> None:
        stdin = proc.stdin
        assert stdin is not None  # Popen(stdin=PIPE)
        while True:
            data = stdin_q.get()
            if not isinstance(data, str):  # None: the command ended (a batch's queue never holds _EOF)
                break
            try:
                stdin.write(data.encode("utf-8", errors="replace"))
                stdin.flush()
            except (OSError, ValueError):
                break  # process closed its stdin or exited
        try:
            stdin.close()
        except OSError:
            pass

    def _pump(self, pipe: io.BufferedReader, kind: str) -> None:
        fd = pipe.fileno()
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        while True:
            try:
                chunk = os.read(fd, READ_CHUNK)
            except InterruptedError:
                continue
            except OSError:
                chunk = b""
            text = decoder.decode(chunk, final=not chunk)
            if text:
                self.send({"t": kind, "d": text})
            if not chunk:
                break
        pipe.close()

    def restart(self) -> None:
        """restart: end what runs, then execute this runner afresh in this process."""
        procs = [self.proc]
        with self.state_lock:
            procs += list(self.services.values())
        for proc in procs:
            if proc is not None and proc.returncode is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
        if os.getpid() == 1:  # a container's first process: nothing the kernel started outlives the restart
            try:
                os.kill(-1, signal.SIGKILL)
            except OSError:
                pass
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:  # reap what was killed (orphans are ours as PID 1): no zombies
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                time.sleep(0.01)
        try:
            os.execv(sys.executable, [sys.executable, "-u", RUNNER_FILE] + sys.argv[1:])
        except OSError as e:
            self.send({"t": "error", "msg": "restart: cannot execute the runner again: %s" % e})

    def terminate(self, signum: int, frame: object) -> None:
        # No locks here: this handler may interrupt the main thread while it holds one.
        procs = [self.proc]
        for _ in range(3):
            try:
                procs += list(self.services.values())
                break
            except RuntimeError:  # the dict changed during the copy
                continue
        for proc in procs:
            if proc is not None and proc.returncode is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except OSError:
                    pass
        os._exit(0)


class _Tunnel:
    """Splices two connected sockets both ways, one thread per direction.  EOF one way shuts the
    other side's writing down and the other way goes on; both sockets close once both ways have
    ended, or at once (both ways) on an error."""

    def __init__(self, a: socket.socket, b: socket.socket) -> None:
        self.socks = (a, b)
        self.lock = threading.Lock()
        self.running = 2

    def start(self) -> None:
        a, b = self.socks
        threading.Thread(target=self._pipe, args=(a, b), name="tunnel", daemon=True).start()
        threading.Thread(target=self._pipe, args=(b, a), name="tunnel", daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        # ACK the app's data at once (Linux forgets TCP_QUICKACK after each read): an app that writes an
        # answer in pieces (headers, then body) with Nagle on would otherwise wait for a delayed ACK
        quickack = getattr(socket, "TCP_QUICKACK", None) if src.family != socket.AF_UNIX else None
        try:
            while True:
                data = src.recv(TUNNEL_CHUNK)
                if not data:
                    break
                if quickack is not None:
                    try:
                        src.setsockopt(socket.IPPROTO_TCP, quickack, 1)
                    except OSError:
                        quickack = None
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            for sock in self.socks:  # wake the other direction up: it ends too
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        finally:
            with self.lock:
                self.running -= 1
                last = self.running == 0
            if last:
                for sock in self.socks:
                    sock.close()


def _note(text: str) -> None:
    """A line for the kernel's log (the runner's stderr: the container's output), never an error."""
    try:
        sys.stderr.write("bai runner: %s\n" % text)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _parse_ports(text: str) -> list[int]:
    """--ports ("2200,12345-12364") as a sorted list of ports; malformed items are skipped with a note."""
    ports: set[int] = set()
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        low, _, high = item.partition("-")
        try:
            first, last = int(low), int(high or low)
            if not 1 <= first <= last <= 65535 or last - first >= MAX_RELAY_LISTENERS:
                raise ValueError
        except ValueError:
            _note("--ports: skipped %s" % _short(repr(item), 80))
            continue
        ports.update(range(first, last + 1))
    return sorted(ports)


def _private_folder() -> str:
    """A folder only the runner's user may use (sshd's host key and log): ~/.bai-runner, else /tmp."""
    errors = []
    home = os.path.expanduser("~")
    for folder in (os.path.join(home, ".bai-runner"), "/tmp/.bai-runner-%d" % os.getuid()):
        try:
            os.makedirs(folder, 0o700, exist_ok=True)
            st = os.lstat(folder)
            if st.st_uid != os.getuid() or not os.path.isdir(folder) or os.path.islink(folder):
                raise OSError("%s is not the runner's own folder" % folder)
            os.chmod(folder, 0o700)
            return folder
        except OSError as e:
            errors.append(str(e))
    raise OSError("no folder for the runner's files: %s" % "; ".join(errors))


def _program(name: str, usual: str) -> str | None:
    """The path of program *name*: *usual* when it is there, else the one on PATH (None: neither)."""
    if os.access(usual, os.X_OK):
        return usual
    import shutil  # (rarely needed: about 4 ms of every start otherwise)

    return shutil.which(name)


def _write_private(path: str, data: bytes) -> None:
    """*data* as the file *path*, readable by this user only (mode 0600), replaced at once (never half written)."""
    tmp = "%s.%d.tmp" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _short(text: str, limit: int = 200) -> str:
    """*text*, cut to *limit* characters (an error record must not echo a huge field)."""
    return text if len(text) <= limit else text[:limit] + "... (%d characters)" % len(text)


def _port(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise ValueError("port must be an integer in 1..65535, not %s" % _short(repr(value), 80))
    return value


def _str_list(value: object, what: str) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ValueError("%s must be a non-empty list of strings" % what)
    return value


def _str_dict(value: object, what: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ValueError("%s must be an object of strings" % what)
    return value


def _kept_token(path: str) -> str:
    """The secret in *path* (a file only this user may read), made and written there first when there is
    none or it is not one (OSError when it can be neither read nor written)."""
    try:
        with open(path, "rb") as f:
            token = f.read(256).decode("ascii", "replace").strip()
        if APP_TOKEN.match(token):
            return token
    except FileNotFoundError:
        pass
    token = _app_token()
    tmp = "%s.%d.tmp" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, token.encode("ascii") + b"\n")
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return token


def _substitute(text: str, port: int, token: str = "") -> str:
    """Backend.AI's placeholders in a service command (str.replace: other braces stay as they are)."""
    text = text.replace("{ports[0]}", str(port)).replace("{port}", str(port))
    if token:
        text = text.replace("{token}", token)
    return text.replace("{runtime_path}", sys.executable or "python3")


def _connect_local(port: int, timeout: float) -> socket.socket:
    """A TCP connection to *port* on 127.0.0.1, else on ::1 (OSError naming both failures)."""
    errors = []
    for host in ("127.0.0.1", "::1"):
        try:
            return socket.create_connection((host, port), timeout)
        except OSError as e:
            errors.append("%s: %s" % (host, e.strerror or e))
    raise OSError("; ".join(errors))


def _listening(port: int) -> bool:
    """Something in the kernel accepts TCP connections on *port*."""
    try:
        sock = _connect_local(port, 1.0)
    except OSError:
        return False
    sock.close()
    return True


def _log_tail(path: str, start: int) -> str:
    """The last SERVICE_LOG_TAIL bytes written to *path* after offset *start*, decoded."""
    try:
        with open(path, "rb") as f:
            end = f.seek(0, os.SEEK_END)
            f.seek(max(start, end - SERVICE_LOG_TAIL))
            data = f.read(SERVICE_LOG_TAIL)
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace")


def bind_socket(path: str) -> socket.socket:
    """Bind a Unix socket at *path*, which may exceed the sun_path limit."""
    directory, name = os.path.split(os.path.abspath(path))
    os.chdir(directory)
    if os.path.lexists(name):
        os.unlink(name)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(name)
    os.chmod(name, 0o666)
    server.listen(1)
    return server


def connect_socket(path: str) -> socket.socket:
    """Connect to the Unix socket at *path*, which may exceed the sun_path limit."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if len(path.encode()) < 100:
            sock.connect(path)
        else:
            directory, name = os.path.split(os.path.abspath(path))
            fd = os.open(directory, getattr(os, "O_PATH", os.O_RDONLY))
            try:
                sock.connect("/proc/self/fd/%d/%s" % (fd, name))
            finally:
                os.close(fd)
    except OSError:
        sock.close()
        raise
    return sock


# -- relay mode: a peer proxy ----------------------------------------------


def relay_forever(name: str, connect_path: str, ports: list[int]) -> None:
    """Relay mode (see the module's docstring): listen on 0.0.0.0 for each port, and hand each connection to
    the agent as a dial of `name`:PORT.  Never returns; exit 1 when no port can be listened on."""
    selector = selectors.DefaultSelector()
    skipped = []
    for port in ports:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(("0.0.0.0", port))
            server.listen(128)
            server.setblocking(False)
        except OSError as e:
            server.close()
            skipped.append("%d (%s)" % (port, e.strerror or e))
            continue
        selector.register(server, selectors.EVENT_READ, port)
    if skipped:
        _note("relay %s: cannot listen on %d ports: %s" % (name, len(skipped), _short(", ".join(skipped), 600)))
    if not selector.get_map():
        _note("relay %s: no port to listen on" % name)
        sys.exit(1)
    while True:
        try:
            events = selector.select(None)
        except OSError:
            time.sleep(0.1)
            continue
        for key, _ in events:
            listener = key.fileobj
            assert isinstance(listener, socket.socket)  # only listening sockets are registered
            try:
                conn, _ = listener.accept()
            except OSError:  # BlockingIOError (another wakeup took it), or a connection already reset
                continue
            args = (conn, connect_path, name, key.data)
            try:
                threading.Thread(target=_dial, args=args, name="dial", daemon=True).start()
            except RuntimeError:  # no thread to be had (the pids limit): this connection is refused
                conn.close()


def _dial(conn: socket.socket, connect_path: str, name: str, port: int) -> None:
    """One relayed connection: a new connection to the agent's socket that says where it goes, then both
    spliced.  When the agent cannot connect it, it closes its side (and so the app sees the end)."""
    agent = None
    try:
        conn.setblocking(True)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        agent = connect_socket(connect_path)
        agent.sendall(json.dumps({"dial": {"host": name, "port": port}}).encode("utf-8") + b"\n")
        _Tunnel(conn, agent).start()
    except Exception:
        for sock in (conn, agent):
            if sock is not None:
                sock.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="bai kernel runner")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--connect", help="the agent's Unix socket to connect to (and reconnect to)")
    where.add_argument("--socket", help="Unix socket path to listen on")
    parser.add_argument("--workdir", default=None, help="working directory (default: cwd)")
    parser.add_argument("--max-line", type=int, default=MAX_LINE, help="longest message line (bytes)")
    parser.add_argument("--relay", metavar="NAME", default=None, help="relay mode: a peer proxy for kernel NAME")
    parser.add_argument("--ports", default=CLUSTER_PORTS, help="relay mode: the ports (default %(default)s)")
    args = parser.parse_args(argv)
    if args.relay is not None:
        if not PEER_NAME.match(args.relay):
            parser.error("--relay: %r is not a kernel's name" % _short(args.relay, 80))
        if not args.connect:
            parser.error("--relay needs --connect")
        ports = _parse_ports(args.ports)
        if not ports or len(ports) > MAX_RELAY_LISTENERS:
            parser.error("--ports: %r names no ports (or too many)" % _short(args.ports, 80))
        signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(0))  # (as a container's PID 1 too)
        signal.signal(signal.SIGINT, lambda signum, frame: os._exit(0))
        relay_forever(args.relay, os.path.abspath(args.connect), ports)
        return
    workdir = os.path.abspath(args.workdir or os.getcwd())
    connect_to = os.path.abspath(args.connect) if args.connect else None
    server = bind_socket(args.socket) if args.socket else None
    os.chdir(workdir)
    # Like `python -c`, make modules in the working directory importable
    # (instead of the directory holding this file).
    if sys.path and sys.path[0] == os.path.dirname(os.path.abspath(__file__)):
        sys.path[0] = workdir
    else:
        sys.path.insert(0, workdir)
    runner = Runner(workdir, max(args.max_line, 1024), connect_to)
    signal.signal(signal.SIGTERM, runner.terminate)
    signal.signal(signal.SIGINT, _ignore_signal)
    runner.prepare_owner_ssh()
    runner.start_cluster()
    if server is not None:
        threading.Thread(target=runner.serve, args=(server,), name="conn", daemon=True).start()
    else:
        threading.Thread(target=runner.connect_forever, args=(connect_to,), name="conn", daemon=True).start()
    runner.run_forever()


if __name__ == "__main__":
    main()
