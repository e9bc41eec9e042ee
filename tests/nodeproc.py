"""Test helpers: a real `bai node` subprocess on a free port, and the real CLI against it."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYTHON_IMAGE = os.environ.get("BAI_TEST_IMAGE", "bai-python:3.11")
BUSYBOX_IMAGE = os.environ.get("BAI_TEST_BUSYBOX_IMAGE", "bai-busybox:latest")
WARM_POOL = int(os.environ.get("BAI_TEST_WARM_POOL", "0"))


def _server_ports() -> range:
    """Where tests draw ports for their servers: below the kernel's ephemeral range, from which every outgoing
    connection takes its local port (a port found free there can be taken before the server binds it: CI saw a
    manager's link port go that way), and below the agent's kernel port pool (30000-31000)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return range(20000, min(30000, low))


_SERVER_PORTS = _server_ports()
_draw = random.Random()  # (its own: a test seeding `random` must not give every worker the same ports)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now, for a server a test starts (see `_server_ports`)."""
    for _ in range(200 if len(_SERVER_PORTS) > 1000 else 0):
        port = _draw.choice(_SERVER_PORTS)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # (no room below the ephemeral range on this machine: the kernel's choice)
        s.bind((host, 0))
        return int(s.getsockname()[1])


def docker_ready() -> str | None:
    """None when a Docker daemon answers, else the reason it does not."""
    try:
        out = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True, timeout=20
        )
    except (FileNotFoundError, subprocess.TimeoutExpired) as e:
        return f"docker CLI unusable: {e}"
    if out.returncode != 0:
        return f"no Docker daemon: {out.stderr.strip()[:200]}"
    return None


def require_docker() -> None:
    """Skip (or, with BAI_REQUIRE_DOCKER=1 as in CI, fail) when Docker is missing."""
    reason = docker_ready()
    if reason is None:
        return
    if os.environ.get("BAI_REQUIRE_DOCKER") == "1":
        pytest.fail(f"BAI_REQUIRE_DOCKER=1 but {reason}")
    pytest.skip(reason)


def ensure_image(kind: str, name: str) -> None:
    out = subprocess.run(
        ["bash", str(ROOT / "packaging" / "build-kernel-image.sh"), kind, name],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if out.returncode != 0:
        pytest.fail(f"building the {kind} test image failed:\n{out.stdout}\n{out.stderr}")


def containers(label: str, docker_host: str | None = None) -> list[str]:
    """Ids of the containers with `label`, on the default daemon or on the one at `docker_host` (a URL)."""
    out = subprocess.run(
        ["docker", *(("-H", docker_host) if docker_host else ()), "ps", "-aq", "--filter", f"label={label}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()


class Node:
    """A `bai node` subprocess with its own state, config and credentials folders."""

    def __init__(
        self,
        base: Path,
        backend: str,
        extra_config: str = "",
        agent_config: str = "",
        role: str = "all",
        args: tuple[str, ...] = (),
        warm_pool: dict[str, int] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        """`env`: extra environment of the node process (and its CLI), e.g. DOCKER_HOST for another daemon."""
        base.mkdir(parents=True, exist_ok=True)
        self.base = base
        self.backend = backend
        self.role = role
        self.args = args
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.state_dir = base / "state"
        self.config_file = base / "bai.toml"
        self.agent_id = f"test-{base.name[-12:]}-{self.port}"
        self.config_file.write_text(
            "[agent]\n"
            f'id = "{self.agent_id}"\n'
            "start_timeout = 20.0\n"
            + agent_config
            + "[agent.warm_pool]\n"
            # tests start kernels cold unless they ask for warm ones (BAI_TEST_WARM_POOL=N: N python ones)
            + "".join(f'"{image}" = {n}\n' for image, n in (warm_pool or {"python": WARM_POOL}).items())
            + "[session]\n"
            'default_mem = "512m"\n'
            "[agent.docker]\n"
            'labels = { "bai.test" = "1" }\n'
            "[images.aliases]\n"
            f'python = "{PYTHON_IMAGE}"\n' + extra_config
        )
        self.env = {
            **os.environ,
            "XDG_CONFIG_HOME": str(base / "config"),
            "XDG_DATA_HOME": str(base / "data"),
            "BAI_CONFIG": str(self.config_file),
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        for key in ("BACKEND_ENDPOINT", "BACKEND_ACCESS_KEY", "BACKEND_SECRET_KEY"):
            self.env.pop(key, None)
        self.proc: subprocess.Popen[str] | None = None
        self.banner = ""
        self.log_path = base / "node.log"
        # called when a port free_port() gave was taken before the node could bind it (another process's
        # connection may draw the same ephemeral port): the node's own other ports are drawn again there
        self.on_new_ports: Callable[[], None] | None = None

    def start(self, timeout: float = 30.0) -> Node:
        for attempt in range(3):
            seen = self.log_path.stat().st_size if self.log_path.exists() else 0
            try:
                return self._start(timeout)
            except AssertionError:
                taken = b"Address already in use" in self.log_path.read_bytes()[seen:]
                if not taken or attempt == 2:
                    raise
            self.port = free_port()  # (the API's; the agent link's through on_new_ports)
            self.endpoint = f"http://127.0.0.1:{self.port}"
            if self.on_new_ports is not None:
                self.on_new_ports()
        raise AssertionError("unreachable")

    def _start(self, timeout: float) -> Node:
        log = self.log_path.open("a")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bai",
                "node",
                "--listen",
                f"127.0.0.1:{self.port}",
                "--state-dir",
                str(self.state_dir),
                "--backend",
                self.backend,
                "--role",
                self.role,
                *self.args,
            ],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=self.env,
            cwd=self.base,
        )
        lines = []
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("ready"):
                self.banner = "".join(lines)
                return self
        self.stop()
        raise AssertionError(f"node did not start:\n{''.join(lines)}\n{self.log_path.read_text()}")

    def kill(self) -> None:
        """kill -9: no clean-up of any kind."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.proc = None
        return code

    def cli(
        self,
        *args: str,
        input: str | None = None,
        timeout: float = 90,
        check: bool = False,
        as_keypair: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        env = self.env
        if as_keypair is not None:  # act as another keypair (as a user would, through BACKEND_*)
            env = {
                **env,
                "BACKEND_ENDPOINT": self.endpoint,
                "BACKEND_ACCESS_KEY": as_keypair["accessKey"],
                "BACKEND_SECRET_KEY": as_keypair["secretKey"],
            }
        result = subprocess.run(
            [sys.executable, "-m", "bai", *args],
            capture_output=True,
            text=True,
            env=env,
            input=input,
            timeout=timeout,
            cwd=self.base,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"bai {' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
        return result

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "bai", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
            cwd=self.base,
            bufsize=1,
        )

    def json(self, *args: str, as_keypair: dict[str, str] | None = None):
        return json.loads(self.cli(*args, "--json", check=True, as_keypair=as_keypair).stdout)

    @property
    def docker_host(self) -> str | None:
        """The DOCKER_HOST this node's kernels run on (None: the default daemon)."""
        return self.env.get("DOCKER_HOST") or None

    def leftover_containers(self, settle: float = 0.0) -> list[str]:
        """This node's containers (those still there after up to `settle` seconds: a destroyed kernel is
        killed at once and its container removed in the background, a moment later)."""
        if self.backend != "docker":
            return []
        deadline = time.monotonic() + settle
        while True:
            left = containers(f"bai.agent-id={self.agent_id}", self.docker_host)
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.1)


LINK_CONFIG = "[link]\nheartbeat_interval = 0.5\nmissed_heartbeats = 3\n[manager]\nlost_grace = 3.0\n"


class Cluster:
    """A manager process and agent processes talking over the ZeroMQ link, on 127.0.0.1.

    Offers what `Node` offers to session tests (cli, json, agent_id, leftover_containers)."""

    def __init__(
        self,
        base: Path,
        backend: str,
        agents: int = 1,
        agent_config: str = "",
        extra_config: str = "",
        agent_ids: list[str] | None = None,
        agent_env: dict[int, dict[str, str]] | None = None,
    ) -> None:
        """`agent_env`: extra environment per agent index (e.g. {1: {"DOCKER_HOST": url}}: the second agent's
        kernels on another Docker daemon)."""
        self.base = base
        self.backend = backend
        self.link_port = free_port()
        self.manager = Node(
            base / "manager",
            backend,
            extra_config=LINK_CONFIG + extra_config,
            role="manager",
            args=("--link-listen", f"127.0.0.1:{self.link_port}"),
        )
        self.manager.on_new_ports = self._new_link_port
        self.env = self.manager.env
        self.state_dir = self.manager.state_dir
        self.agent_config = agent_config
        self.agents: list[Node] = []
        self._agent_count = agents
        self.agent_ids = agent_ids or []  # fixed agent ids (by index); otherwise derived from the port
        self.agent_env = agent_env or {}

    @property
    def endpoint(self) -> str:
        return self.manager.endpoint

    @property
    def port(self) -> int:
        return self.manager.port

    def _new_link_port(self) -> None:
        """A manager start that found a port taken draws the link's port again, but only while no agent runs:
        those dial the port they were started with (a restarted manager's next try keeps it)."""
        if any(agent.proc is not None for agent in self.agents):
            return
        self.link_port = free_port()
        self.manager.args = ("--link-listen", f"127.0.0.1:{self.link_port}")

    def add_agent(
        self, index: int, token: str | None = None, extra_config: str = "", env: dict[str, str] | None = None
    ) -> Node:
        info = self.join_info()
        agent = Node(
            self.base / f"agent{index}",
            self.backend,
            extra_config=LINK_CONFIG + extra_config,
            agent_config=self.agent_config,
            role="agent",
            args=(
                "--manager",
                info["endpoint"],
                "--manager-key",
                info["manager_key"],
                "--join-token",
                token or info["join_token"],
                *(("--agent-id", self.agent_ids[index]) if index < len(self.agent_ids) else ()),
            ),
            env={**self.agent_env.get(index, {}), **(env or {})},
        )
        if index < len(self.agent_ids):
            agent.agent_id = self.agent_ids[index]
        return agent

    def join_info(self) -> dict:
        return self.manager.json("cluster", "join-info")

    def start(self) -> Cluster:
        self.manager.start()
        for i in range(self._agent_count):
            self.agents.append(self.add_agent(i).start())
        return self

    def stop(self) -> None:
        for agent in self.agents:
            agent.stop()
        self.manager.stop()

    @property
    def proc(self):
        return self.manager.proc

    @property
    def agent_id(self) -> str:
        return self.agents[0].agent_id

    def cli(self, *args: str, **kw):
        return self.manager.cli(*args, **kw)

    def popen(self, *args: str):
        return self.manager.popen(*args)

    def json(self, *args: str, **kw):
        return self.manager.json(*args, **kw)

    def leftover_containers(self) -> list[str]:
        return [c for agent in self.agents for c in agent.leftover_containers()]


def admin_keys(node: Node) -> tuple[str, str]:
    """The admin keypair a node saved for its CLI."""
    import tomllib

    with (Path(node.env["XDG_CONFIG_HOME"]) / "bai" / "credentials.toml").open("rb") as f:
        creds = tomllib.load(f)
    return creds["access_key"], creds["secret_key"]


def signed_request(
    node: Node,
    method: str,
    path: str,
    access_key: str,
    secret_key: str,
    body: object = None,
    sign_method: str = "HMAC-SHA256",
) -> tuple[int, object]:
    """One raw request signed as Backend.AI clients sign (with `sign_method`, a hash hashlib knows);
    returns (status, JSON body or None). A `bytes` body is sent as it is (as JSON, whatever it holds)."""
    import http.client
    from urllib.parse import urlsplit

    from bai import API_VERSION
    from bai.common import auth

    host = urlsplit(node.endpoint).netloc
    date = auth.now_header()
    ctype = "application/json" if body is not None else "application/octet-stream"
    hash_name = sign_method[5:].lower().replace("-", "")
    sig = auth.sign(secret_key, method, path, date, host, ctype, API_VERSION, hash_name)
    headers = {
        "Date": date,
        "X-BackendAI-Version": API_VERSION,
        "Authorization": f"BackendAI signMethod={sign_method}, credential={access_key}:{sig}",
        "Content-Type": ctype,
    }
    conn = http.client.HTTPConnection(host, timeout=30)
    try:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=raw, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        try:
            return resp.status, json.loads(data) if data else None
        except ValueError:
            return resp.status, data.decode(errors="replace")
    finally:
        conn.close()


def start_registry(program: str, base: Path, htpasswd: Path | None = None) -> tuple[subprocess.Popen, int]:
    """Debian's docker-registry on 127.0.0.1 (with htpasswd auth when given); returns it and its port
    once it answers."""
    import urllib.error
    import urllib.request

    port = free_port()
    auth = f"auth:\n  htpasswd:\n    realm: bai-test\n    path: {htpasswd}\n" if htpasswd else ""
    config = base / "config.yml"
    config.write_text(
        "version: 0.1\nlog:\n  level: error\n"
        f"storage:\n  filesystem:\n    rootdirectory: {base / 'data'}\n{auth}http:\n  addr: 127.0.0.1:{port}\n"
    )
    proc = subprocess.Popen([program, "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2)
            assert htpasswd is None, "the registry answers without credentials"
            return proc, port
        except urllib.error.HTTPError as e:
            assert htpasswd is not None and e.code == 401, e
            return proc, port
        except OSError:
            assert time.monotonic() < deadline and proc.poll() is None, "the registry did not start"
            time.sleep(0.2)


def has_local_image(ref: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", ref], capture_output=True).returncode == 0


def containers_after_destroy(node, timeout: float = 10.0) -> list[str]:
    """The node's containers once a destroy has had time to finish: a destroyed kernel is killed at once and
    its container removed just after, in the background."""
    deadline = time.monotonic() + timeout
    while (left := node.leftover_containers()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def stop_removing_containers(node) -> None:
    """Stop a node (or cluster), then remove the containers it left (kernels outlive their agent), on
    whichever Docker daemon each of its agents uses."""
    nodes = list(node.agents) if isinstance(node, Cluster) else [node]
    leftovers = [n.leftover_containers() for n in nodes]
    node.stop()
    for n, before in zip(nodes, leftovers, strict=True):
        left = sorted(set(before) | set(n.leftover_containers()))  # a warm kernel started meanwhile
        if left:
            host = getattr(n, "docker_host", None)
            subprocess.run(["docker", *(("-H", host) if host else ()), "rm", "-f", *left], capture_output=True)


def wait_status(node, ref: str, status: str, timeout: float = 15) -> dict:
    """A session's info once it has `status` (fails after `timeout` seconds)."""
    deadline = time.monotonic() + timeout
    while (info := node.json("session", "info", ref))["status"] != status and time.monotonic() < deadline:
        time.sleep(0.1)
    assert info["status"] == status, info
    return info
