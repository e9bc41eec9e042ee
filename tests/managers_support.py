"""Several managers on one PostgreSQL database and one agent that dials them all, as real processes (tests of
killing managers: test_managers_failover.py, test_managers_kill_moments.py), and what those tests count
afterwards, from the database itself and from the agent's host: sessions by name and id, the status changes
each went through, the kernels that are live by the database, and the kernels the agent really runs (Docker
containers by label, local kernel processes by their folder).
"""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.nodeproc import Node, admin_keys, free_port, signed_request

# statuses a session passes through on its own way to running or to its end: a count waits until none is in one
MOVING = ("SCHEDULED", "PREPARING", "PULLING", "TERMINATING")
# heartbeats as tests/nodeproc.py's LINK_CONFIG, but an agent is lost after 5 s of silence, not 1.5: these tests
# start tens of kernels at once on small machines, and an agent starved that long is not what they are about
LINK_CONFIG = "[link]\nheartbeat_interval = 0.5\nmissed_heartbeats = 10\n[manager]\nlost_grace = 10.0\n"
LIVE = ("SCHEDULED", "PREPARING", "PULLING", "RUNNING", "RUNNING_DEGRADED", "RESTARTING", "TERMINATING")


def wait_for(what: Callable[[], Any], timeout: float, step: float = 0.1) -> Any:
    """`what()` once it is truthy, else its last value after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        time.sleep(step)
    return what()


class Managers:
    """`count` managers of the database at `url` (sharing the link's key and join token, as the README says
    to) and one agent dialing every one of them."""

    def __init__(
        self,
        base: Path,
        url: str,
        count: int = 2,
        backend: str = "local",
        agent_config: str = 'cpu = "64"\nmem = "64g"\n',
        extra_config: str = "",
    ) -> None:
        from bai.node.link.keys import load_or_create

        self.base = base
        self.url = url
        self.backend = backend
        self.managers: list[Node] = []
        self.links: list[int] = []
        for i in range(count):
            link = free_port()
            node = Node(
                base / f"m{i + 1}", backend, extra_config=LINK_CONFIG + extra_config, role="manager",
                args=("--link-listen", f"127.0.0.1:{link}", "--database", url),
            )  # fmt: skip
            node.on_new_ports = self._new_link_port(i)
            self.managers.append(node)
            self.links.append(link)
        secrets = load_or_create(self.managers[0].state_dir)
        for node in self.managers[1:]:
            shutil.copytree(self.managers[0].state_dir / "link", node.state_dir / "link")
        self.secrets = secrets
        self.agent = Node(
            base / "agent", backend, extra_config=LINK_CONFIG + extra_config, role="agent", agent_config=agent_config,
        )  # fmt: skip

    def _new_link_port(self, i: int) -> Callable[[], None]:
        """A manager whose start found a port it was given taken draws its link's port again, but only until
        the agent has been started: the agent dials the managers' link ports it was started with, and a
        manager moved elsewhere after that would never get it (its next try keeps the port)."""

        def renew() -> None:
            if self.agent.proc is not None:
                return
            self.links[i] = free_port()
            self.managers[i].args = ("--link-listen", f"127.0.0.1:{self.links[i]}", "--database", self.url)

        return renew

    def start_agent(self) -> None:
        """The agent, dialing every manager's link port as the managers started with it."""
        self.agent.args = (
            *(a for link in self.links for a in ("--manager", f"tcp://127.0.0.1:{link}")),
            "--manager-key", self.secrets.public_key, "--join-token", self.secrets.join_token,
        )  # fmt: skip
        self.agent.start()

    # -- processes ------------------------------------------------------------------------------------

    def start(self) -> Managers:
        """Every manager (together), then the agent, once every manager has it."""
        self.start_managers(range(len(self.managers)))
        self.start_agent()
        assert wait_for(lambda: all(self.agents_seen(i) for i in range(len(self.managers))), 20), "agent not seen"
        return self

    def start_managers(self, which: Iterable[int], timeout: float = 40.0) -> dict[int, BaseException]:
        """Start the managers `which` at once (threads: each waits for its own `ready`); those that did not
        start, and why. Raises when any did not and none was meant to fail (see `start_racing`)."""
        failed = self.start_racing(which, timeout)
        assert not failed, failed
        return failed

    def start_racing(self, which: Iterable[int], timeout: float = 40.0) -> dict[int, BaseException]:
        failed: dict[int, BaseException] = {}

        def one(i: int) -> None:
            try:
                self.managers[i].start(timeout)
            except BaseException as e:  # noqa: BLE001 (reported to the caller)
                failed[i] = e

        threads = [threading.Thread(target=one, args=(i,)) for i in which]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return failed

    def pid(self, i: int) -> int | None:
        proc = self.managers[i].proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def kill(self, i: int) -> None:
        """kill -9 manager i (no clean-up of any kind)."""
        self.managers[i].kill()

    def signal(self, i: int, sig: int) -> None:
        pid = self.pid(i)
        assert pid is not None, f"manager {i + 1} is not running"
        os.kill(pid, sig)

    def stop(self) -> None:
        """Stop the agent and the managers, then remove the agent's containers (kernels outlive their agent)."""
        for node in self.managers:  # (a frozen one would not hear SIGTERM)
            if node.proc is not None and node.proc.poll() is None:
                os.kill(node.proc.pid, signal.SIGCONT)
        self.agent.stop()
        for node in self.managers:
            node.stop()
        if self.backend == "docker":
            left = self.containers()
            if left:
                subprocess.run(["docker", "rm", "-f", *left], capture_output=True, timeout=120)

    # -- the API --------------------------------------------------------------------------------------

    def call(self, i: int, method: str, path: str, body: object = None) -> tuple[int, Any]:
        """One signed request to manager i as the admin; (0, reason) when it cannot be reached."""
        node = self.managers[i]
        access, secret = admin_keys(node)
        try:
            return signed_request(node, method, path, access, secret, body)
        except OSError as e:
            return 0, str(e)

    def status(self, i: int) -> dict[str, Any] | None:
        """GET /manager/status of manager i (None when it does not answer)."""
        if self.pid(i) is None:
            return None
        code, body = self.call(i, "GET", "/manager/status")
        return body if code == 200 and isinstance(body, dict) else None

    def leads(self, i: int) -> bool | None:
        """Whether manager i says it leads (None: it does not answer)."""
        status = self.status(i)
        return None if status is None else status["leader"] == status["self"]

    def leader(self) -> int | None:
        """The one manager that says it leads, when exactly one of those that answer does."""
        leading = [i for i in range(len(self.managers)) if self.leads(i)]
        return leading[0] if len(leading) == 1 else None

    def wait_leader(self, timeout: float, among: Iterable[int] | None = None) -> int | None:
        """The index of the manager that leads (one of `among`) once one does and the others that answer follow."""
        wanted = set(range(len(self.managers)) if among is None else among)

        def one() -> int | None:  # (only `among` are asked: a frozen manager would hold the question up)
            leading = [i for i in sorted(wanted) if self.leads(i)]
            return leading[0] if len(leading) == 1 else None

        found = wait_for(lambda: (i := one()) is not None and (i,), timeout, 0.2)
        return found[0] if found else None

    def agents_seen(self, i: int) -> bool:
        code, body = self.call(i, "GET", "/bai/agents") if self.pid(i) else (0, None)
        return code == 200 and isinstance(body, dict) and bool(body.get("items"))

    def creds(self, i: int) -> Any:
        from bai.common.credentials import Credentials

        node = self.managers[i]
        access, secret = admin_keys(node)
        return Credentials(node.endpoint, access, secret)

    def create(self, i: int, name: str, **config: Any) -> tuple[int, Any]:
        body = {
            "name": name, "image": "python", "type": config.pop("type", "interactive"), "enqueueOnly": True,
            "reuseIfExists": True, "config": {"resources": config.pop("resources", {})}, **config,
        }  # fmt: skip
        return self.call(i, "POST", "/session", body)

    def create_many(
        self,
        names: list[str],
        through: Callable[[int], int],
        workers: int = 16,
        on_accept: Callable[[int], None] = lambda n: None,
        others: bool = True,
        **config: Any,
    ) -> dict[str, set[str]]:
        """Create sessions of `names` concurrently (`workers` at a time), name k through manager `through(k)`;
        a create that fails (its manager was killed meanwhile) is sent again through the others, as a client
        given every manager would (get-or-create by name; not with `others` False: a frozen manager would
        hold it up). Returns the ids each name was answered with
        (`on_accept(accepted so far)` after each)."""
        answers: dict[str, set[str]] = {}
        lock = threading.Lock()
        count = len(self.managers)

        def one(k: int) -> None:
            name, first = names[k], through(k)
            deadline = time.monotonic() + 30
            attempt = 0
            while time.monotonic() < deadline:
                i = (first + attempt) % count if others else first
                attempt += 1
                code, body = self.create(i, name, **dict(config))
                if code in (200, 201) and isinstance(body, dict) and body.get("sessionId"):
                    with lock:
                        answers.setdefault(name, set()).add(body["sessionId"])
                        accepted = len(answers)
                    on_accept(accepted)
                    return
                if code not in (0, 500, 502, 503):
                    raise AssertionError(f"creating {name} through manager {i + 1}: {code} {body}")
                time.sleep(0.1)
            raise AssertionError(f"creating {name}: no manager accepted it in 30 s")

        with ThreadPoolExecutor(workers) as pool:
            for f in [pool.submit(one, k) for k in range(len(names))]:
                f.result()
        return answers

    # -- what is there --------------------------------------------------------------------------------

    def sql(self, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
            return list(conn.execute(statement, params).fetchall())  # type: ignore[arg-type]

    def sessions(self) -> list[tuple[str, str, str]]:
        """(id, name, status) of every session in the database."""
        return [(r[0], r[1], r[2]) for r in self.sql("SELECT id, name, status FROM sessions")]

    def described(self, *statuses: str) -> list[tuple[str, str, str, str]]:
        """(name, status, status_info, status_data) of the sessions in `statuses` (for failure messages)."""
        marks = ",".join(["%s"] * len(statuses))
        rows = self.sql(
            f"SELECT name, status, status_info, status_data FROM sessions WHERE status IN ({marks})", statuses
        )
        return [(r[0], r[1], r[2], r[3]) for r in rows]

    def statuses(self) -> Counter[str]:
        return Counter(status for _, _, status in self.sessions())

    def transitions(self) -> Counter[tuple[str, str]]:
        """How many times each session moved to each status."""
        return Counter((r[0], r[1]) for r in self.sql("SELECT session_id, status FROM session_transitions"))

    def live_kernels(self) -> dict[str, str]:
        """kernel id -> session id, for the kernels of sessions that hold an agent's resources."""
        marks = ",".join(["%s"] * len(LIVE))
        rows = self.sql(
            "SELECT k.id, k.session_id FROM kernels k JOIN sessions s ON s.id = k.session_id "
            f"WHERE s.status IN ({marks})",
            LIVE,
        )
        return {r[0]: r[1] for r in rows}

    def settled(self, timeout: float, also: Callable[[Counter[str]], bool] = lambda c: True) -> Counter[str]:
        """The sessions' statuses once none is on its way (starting, terminating) and `also(statuses)` holds."""

        def done() -> Counter[str] | None:
            counts = self.statuses()
            return None if any(counts[s] for s in MOVING) or not also(counts) else counts

        counts = wait_for(done, timeout, 0.3)
        assert counts, (
            f"sessions still on their way after {timeout} s: {self.statuses()}; "
            f"ended: {self.described('CANCELLED', 'ERROR')[:3]}"
        )
        return counts

    def containers(self) -> list[str]:
        """The agent's containers (by its label), running or not."""
        out = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"label=bai.agent-id={self.agent.agent_id}"],
            capture_output=True, text=True, check=True, timeout=60,
        )  # fmt: skip
        return out.stdout.split()

    def agent_kernels(self) -> Counter[str]:
        """How many of each kernel the agent's host runs: Docker containers by their kernel label, or the
        local backend's kernel processes (children of the agent working in its kernels folder)."""
        if self.backend == "docker":
            out = subprocess.run(
                ["docker", "ps", "-a", "--filter", f"label=bai.agent-id={self.agent.agent_id}",
                 "--format", '{{.Label "ai.backend.kernel-id"}}'],
                capture_output=True, text=True, check=True, timeout=60,
            )  # fmt: skip
            return Counter(out.stdout.split())
        agent = self.agent.proc
        assert agent is not None
        kernels = (self.agent.state_dir / "kernels").resolve()
        found: Counter[str] = Counter()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                cwd = Path(os.readlink(entry / "cwd"))
            except (OSError, ValueError, IndexError):
                continue
            if ppid == agent.pid and cwd.is_relative_to(kernels):
                found[cwd.relative_to(kernels).parts[0]] += 1
        return found

    def check(self, accepted: dict[str, set[str]] | None = None, settle: float = 30) -> list[tuple[str, str, str]]:
        """Once no session is on its way: every accepted name is there exactly once, with the one id it was
        answered with; no name twice; no session started or ended twice; the kernels the agent runs are
        exactly the live ones, each once. Returns the sessions."""
        self.settled(settle)
        rows = self.sessions()
        names = Counter(name for _, name, _ in rows)
        twice = {n: c for n, c in names.items() if c > 1}
        assert not twice, f"sessions there twice: {twice}"
        ids = {name: sid for sid, name, _ in rows}
        for name, answered in (accepted or {}).items():
            assert len(answered) == 1, f"{name} was answered with several ids: {answered}"
            assert name in ids, f"the accepted session {name} is not there"
            assert ids[name] in answered, f"{name} is {ids[name]}, the client was told {answered}"
        moves = self.transitions()
        for (sid, status), n in moves.items():
            if status in ("PREPARING", "RUNNING", "TERMINATED", "CANCELLED"):
                assert n == 1, f"session {sid} went {n} times to {status}"
        live = self.live_kernels()

        def same() -> tuple[Counter[str], dict[str, str]] | None:
            nonlocal live
            ran, live = self.agent_kernels(), self.live_kernels()
            return (ran, live) if set(ran) == set(live) and all(n == 1 for n in ran.values()) else None

        counted = wait_for(same, 15, 0.3)  # (a destroyed kernel's container is removed a moment later)
        ran = self.agent_kernels()
        assert counted, (
            f"the agent runs {len(ran)} kernels, {len(live)} are live: twice {[k for k, n in ran.items() if n > 1]}, "
            f"orphans {sorted(set(ran) - set(live))}, missing {sorted(set(live) - set(ran))}"
        )
        return rows


@dataclass
class Exec:
    """What one run in a session printed and how it ended."""

    out: str = ""
    code: int | None = None
    frames: list[dict[str, Any]] = field(default_factory=list)


async def run_code(client: Any, session_id: str, code: str, timeout: float = 30) -> Exec:
    """Run Python `code` in a session through `client` (bai.client.Client); its output and exit code."""
    result = Exec()

    async def go() -> None:
        async with client.execute(session_id) as stream:
            await stream.start("query", code)
            async for frame in stream.frames():
                result.frames.append(frame)
                for item in frame.get("console") or []:
                    if isinstance(item, list | tuple) and len(item) == 2 and item[0] == "stdout":
                        result.out += str(item[1])
                if frame.get("status") == "finished":
                    result.code = int(frame.get("exitCode") or 0)

    await asyncio.wait_for(go(), timeout)
    return result


async def terminal_says(client: Any, session_id: str, typed: str, expect: str, timeout: float = 20) -> str:
    """Open a terminal in the session through `client`, type `typed`, and read until `expect` is shown."""
    import aiohttp

    ws = await client.terminal(session_id)
    seen = ""
    try:
        await ws.send_json({"type": "stdin", "chars": base64.b64encode(typed.encode()).decode()})
        deadline = time.monotonic() + timeout
        while expect not in seen:
            left = deadline - time.monotonic()
            assert left > 0, f"{expect!r} not shown by the terminal, which showed {seen!r}"
            msg = await ws.receive(timeout=left)
            if msg.type != aiohttp.WSMsgType.TEXT:
                raise AssertionError(f"the terminal closed ({msg.type}); it showed {seen!r}")
            frame = msg.json()
            if frame.get("type") == "out":
                seen += base64.b64decode(frame["data"]).decode(errors="replace")
    finally:
        await ws.close()
    return seen
