"""The node process and the API edge: start-up, shutdown, credentials, signatures, bad input."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import tomllib
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bai import API_VERSION
from bai.common import auth
from tests.nodeproc import Node


@pytest.fixture(scope="module")
def local_node(tmp_path_factory):
    node = Node(tmp_path_factory.mktemp("local"), "local").start()
    yield node
    node.stop()


def creds_of(node: Node) -> dict[str, str]:
    with (Path(node.env["XDG_CONFIG_HOME"]) / "bai" / "credentials.toml").open("rb") as f:
        return tomllib.load(f)


def request(
    node: Node,
    method: str,
    path: str,
    *,
    body: bytes | None = None,
    ctype: str = "text/plain",
    secret: str | None = None,
    date: str | None = None,
    sign: bool = True,
) -> tuple[int, dict, dict]:
    creds = creds_of(node)
    host = f"127.0.0.1:{node.port}"
    date = date or datetime.now(UTC).isoformat()
    headers = {"Date": date, "X-BackendAI-Version": API_VERSION, "Content-Type": ctype}
    if sign:
        sig = auth.sign(secret or creds["secret_key"], method, path, date, host, ctype, API_VERSION)
        headers["Authorization"] = auth.authorization_header(creds["access_key"], sig)
    req = urllib.request.Request(f"http://{host}{path}", data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.loads(e.read())


def test_banner_says_endpoint_backend_and_slots(local_node: Node) -> None:
    banner = local_node.banner
    assert f"http://127.0.0.1:{local_node.port}" in banner
    assert "local" in banner and "UNSANDBOXED" in banner
    assert "cpu" in banner and "mem" in banner


def test_credentials_are_saved_privately(local_node: Node) -> None:
    path = Path(local_node.env["XDG_CONFIG_HOME"]) / "bai" / "credentials.toml"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    creds = creds_of(local_node)
    assert creds["endpoint"] == local_node.endpoint
    out = local_node.cli("client-env", check=True).stdout
    assert f"export BACKEND_ENDPOINT={local_node.endpoint}\n" in out
    assert f"export BACKEND_ACCESS_KEY={creds['access_key']}\n" in out
    assert f"export BACKEND_SECRET_KEY={creds['secret_key']}" in out


def test_client_env_credentials_work_for_the_cli(local_node: Node) -> None:
    creds = creds_of(local_node)
    env = {k: v for k, v in local_node.env.items() if k != "XDG_CONFIG_HOME"}
    env.update(
        XDG_CONFIG_HOME="/nonexistent",
        BACKEND_ENDPOINT=local_node.endpoint,
        BACKEND_ACCESS_KEY=creds["access_key"],
        BACKEND_SECRET_KEY=creds["secret_key"],
    )
    out = subprocess.run(
        [sys.executable, "-m", "bai", "agent", "ls", "--json"], env=env, capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout)[0]["id"] == local_node.agent_id


def test_version_probe_is_public(local_node: Node) -> None:
    status, _, body = request(local_node, "GET", "/", sign=False)
    assert status == 200
    assert body["version"] == API_VERSION


@pytest.mark.parametrize(
    "case",
    ["missing", "wrong-secret", "stale", "future"],
)
def test_bad_signatures_are_refused(local_node: Node, case: str) -> None:
    kwargs: dict = {}
    if case == "missing":
        kwargs["sign"] = False
    elif case == "wrong-secret":
        kwargs["secret"] = "not-the-secret"
    elif case == "stale":
        kwargs["date"] = (datetime.now(UTC) - timedelta(minutes=16)).isoformat()
    else:
        kwargs["date"] = (datetime.now(UTC) + timedelta(minutes=16)).isoformat()
    status, headers, body = request(local_node, "GET", "/session", **kwargs)
    assert status == 401
    assert headers["Content-Type"].startswith("application/problem+json")
    assert body["type"].startswith("https://api.backend.ai/probs/")
    assert body["title"]
    assert "items" not in body


def test_signed_requests_pass(local_node: Node) -> None:
    status, _, body = request(local_node, "GET", "/session")
    assert status == 200
    assert isinstance(body["items"], list)


def test_unknown_paths_and_bad_bodies_get_problem_bodies(local_node: Node) -> None:
    status, _, body = request(local_node, "GET", "/no/such/thing")
    assert status == 404 and body["type"].endswith("/url-not-found")
    status, _, body = request(local_node, "POST", "/session", body=b"{not json", ctype="application/json")
    assert status == 400 and body["type"].endswith("/invalid-api-params")
    status, _, body = request(
        local_node,
        "POST",
        "/session",
        body=json.dumps({"image": "python", "name": "x"}).encode(),
        ctype="application/json",
    )
    assert status == 400 and "session name" in body["msg"]
    status, _, body = request(local_node, "GET", "/session/nosuchsession")
    assert status == 404 and body["title"] == "No such session."


@pytest.mark.parametrize(
    "args, message",
    [
        (["--mem", "lots"], "cannot parse"),
        (["--mem", "-1g"], "cannot parse"),
        (["--cpu", "-1"], "negative"),
        (["--cpu", "0"], "more than 0"),
        (["--cpu", "two"], "cannot parse"),
        (["--env", "NOEQUALS"], "KEY=VALUE"),
        (["--env", "1X=y"], "KEY=VALUE"),
        (["--name", "a b"], "invalid session name"),
        (["--name", "ab"], "invalid session name"),
    ],
)
def test_bad_cli_input_is_refused_before_anything_is_created(local_node: Node, args: list[str], message: str) -> None:
    before = local_node.json("session", "ls", "--all")
    result = local_node.cli("session", "run", "python", *args, "-c", "print(1)")
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert local_node.json("session", "ls", "--all") == before


def test_nothing_to_run_is_an_error(local_node: Node) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "bai", "session", "run", "python", "missing-file.py"],
        env=local_node.env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert "no such file" in result.stderr


def test_commands_on_unknown_sessions_fail_clearly(local_node: Node) -> None:
    for args in (["info", "ghost"], ["logs", "ghost"], ["destroy", "ghost"], ["exec", "ghost", "-c", "1"]):
        result = local_node.cli("session", *args)
        assert result.returncode == 1, args
        assert "No such session" in result.stderr, args
        assert "Traceback" not in result.stderr


def test_cli_without_a_node_says_so(tmp_path) -> None:
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path)}
    for key in ("BACKEND_ENDPOINT", "BACKEND_ACCESS_KEY", "BACKEND_SECRET_KEY"):
        env.pop(key, None)
    result = subprocess.run([sys.executable, "-m", "bai", "session", "ls"], env=env, capture_output=True, text=True)
    assert result.returncode == 1
    assert "no credentials" in result.stderr
    env.update(BACKEND_ENDPOINT="http://127.0.0.1:9", BACKEND_ACCESS_KEY="AK", BACKEND_SECRET_KEY="SK")
    result = subprocess.run([sys.executable, "-m", "bai", "session", "ls"], env=env, capture_output=True, text=True)
    assert result.returncode == 1
    assert "cannot reach the manager" in result.stderr


def test_port_in_use_gives_one_clear_line(tmp_path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        node = Node(tmp_path, "local")
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "bai",
                "node",
                "--listen",
                f"127.0.0.1:{port}",
                "--state-dir",
                str(node.state_dir),
                "--backend",
                "local",
            ],
            env=node.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert str(port) in lines[0] and "--listen" in lines[0]


def test_sigterm_and_sigint_stop_the_node_cleanly(tmp_path) -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        node = Node(tmp_path / sig.name, "local").start()
        node.cli("session", "create", "python", "--name", "kept-record", check=True)
        assert node.stop(sig) == 0
        assert "Traceback" not in node.log_path.read_text()
        node.start()  # the record is still there after the restart
        info = node.json("session", "info", "kept-record")
        assert info["status"] == "TERMINATED"  # local kernels end with their node
        assert info["statusInfo"] == "agent-termination"
        node.stop()


def test_config_show_reports_files_and_values(local_node: Node) -> None:
    out = local_node.cli("config", "show", check=True).stdout
    assert str(local_node.config_file) in out
    assert f'id = "{local_node.agent_id}"' in out
    data = json.loads(local_node.cli("config", "show", "--json", check=True).stdout)
    assert data["config"]["session"]["default_mem"] == "512m"
    assert data["config"]["node"]["listen"] == "127.0.0.1:8091"


def test_bad_config_file_is_reported(tmp_path) -> None:
    bad = tmp_path / "bai.toml"
    bad.write_text("[node\n")
    env = {**os.environ, "BAI_CONFIG": str(bad)}
    result = subprocess.run([sys.executable, "-m", "bai", "config", "show"], env=env, capture_output=True, text=True)
    assert result.returncode == 2
    assert str(bad) in result.stderr


async def test_polling_and_streaming_execute_speak_backend_ai(local_node: Node) -> None:
    from bai.client import Client
    from bai.common.credentials import Credentials

    creds = creds_of(local_node)
    async with Client(Credentials(creds["endpoint"], creds["access_key"], creds["secret_key"])) as c:
        created = await c.create_session("python", name="poll-exec")
        assert created["status"] == "RUNNING" and created["created"] is True
        again = await c.create_session("python", name="poll-exec")
        assert again["sessionId"] == created["sessionId"] and again["created"] is False
        try:
            # polling execute (§2.4): query, then continue with the run id until finished
            body = {"mode": "query", "code": "x = 6 * 7\nprint(x)", "runId": None, "options": {}}
            result = (await c.request("POST", "/session/poll-exec", json_body=body))["result"]
            console = list(result["console"])
            while result["status"] != "finished":
                body = {"mode": "continue", "code": "", "runId": result["runId"], "options": {}}
                result = (await c.request("POST", "/session/poll-exec", json_body=body))["result"]
                console += result["console"]
            assert result["exitCode"] == 0
            assert "".join(d for k, d in console if k == "stdout") == "42\n"
            # streaming execute (§2.3) sees the same namespace; every frame has the full shape
            async with c.execute(created["sessionId"]) as stream:
                await stream.start("query", "print(x + 1)")
                frames = [f async for f in stream.frames()]
            assert all(set(f) >= {"status", "console", "exitCode", "options", "files"} for f in frames)
            assert all(isinstance(f["console"], list) for f in frames)
            assert frames[-1]["status"] == "finished" and frames[-1]["exitCode"] == 0
            assert "".join(d for f in frames for k, d in f["console"] if k == "stdout") == "43\n"
        finally:
            await c.destroy_session("poll-exec")
        info = await c.get_session(created["sessionId"])
        assert info["status"] == "TERMINATED"


def test_local_kernels_get_a_memory_limit(local_node: Node) -> None:
    result = local_node.cli("session", "run", "python", "--mem", "256m", "-c", "b = bytearray(1024 ** 3)")
    assert result.returncode == 1
    assert "MemoryError" in result.stderr
    ok = local_node.cli("session", "run", "python", "--mem", "256m", "-c", "print(len(bytearray(64 * 1024 ** 2)))")
    assert ok.stdout == f"{64 * 1024**2}\n"


async def test_graphql_answers_the_official_clients_queries(local_node: Node) -> None:
    from bai.client import Client
    from bai.common.credentials import Credentials

    creds = creds_of(local_node)
    async with Client(Credentials(creds["endpoint"], creds["access_key"], creds["secret_key"])) as c:
        created = await c.create_session("python", name="gql-listed", resources={"cpu": "0.5"})
        try:
            query = (
                "query($limit:Int!, $offset:Int!, $status: String) { compute_session_list(limit:$limit, "
                "offset:$offset, status:$status) { items { status name id occupying_slots type } total_count } }"
            )
            body = {"query": query, "variables": {"limit": 20, "offset": 0, "status": "RUNNING"}}
            data = (await c.request("POST", "/admin/gql", json_body=body))["data"]["compute_session_list"]
            assert data["total_count"] >= 1
            item = next(i for i in data["items"] if i["name"] == "gql-listed")
            assert list(item) == ["status", "name", "id", "occupying_slots", "type"]  # the order asked for
            assert item["type"] == "INTERACTIVE" and item["status"] == "RUNNING"
            assert json.loads(item["occupying_slots"])["cpu"] == "0.5"  # a JSON string, as the client expects
            one = {
                "query": "query($id: UUID!) { compute_session(id: $id) { id containers { cluster_role } } }",
                "variables": {"id": created["sessionId"]},
            }
            session = (await c.request("POST", "/admin/gql", json_body=one))["data"]["compute_session"]
            assert session == {"id": created["sessionId"], "containers": [{"cluster_role": "main"}]}
            kp = await c.request("POST", "/admin/gql", json_body={"query": "{ keypair { access_key is_admin } }"})
            assert kp["data"]["keypair"] == {"access_key": creds["access_key"], "is_admin": True}
            bad = await c.request("POST", "/admin/gql", json_body={"query": "{ no_such_thing { id } }"})
            assert bad["errors"] and "no_such_thing" in bad["errors"][0]["message"]
        finally:
            await c.destroy_session("gql-listed")


async def test_concurrent_creates_with_one_name_make_one_session(local_node: Node) -> None:
    import asyncio

    from bai.client import Client
    from bai.common.credentials import Credentials

    creds = creds_of(local_node)
    async with Client(Credentials(creds["endpoint"], creds["access_key"], creds["secret_key"])) as c:
        results = await asyncio.gather(
            *(c.create_session("python", name="only-one", enqueue_only=True) for _ in range(8))
        )
        try:
            assert len({r["sessionId"] for r in results}) == 1
            assert sum(r["created"] for r in results) == 1
            listed = [s for s in await c.list_sessions(all=True) if s["name"] == "only-one"]
            assert len(listed) == 1
        finally:
            await c.destroy_session("only-one", forced=True)


def test_config_show_says_where_each_value_came_from(tmp_path) -> None:
    cfg = tmp_path / "bai.toml"
    cfg.write_text('[node]\nlisten = "127.0.0.1:9555"\n')
    env = {**os.environ, "BAI_CONFIG": str(cfg)}
    out = subprocess.run([sys.executable, "-m", "bai", "config", "show"], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any(line.startswith('listen = "127.0.0.1:9555"') and line.endswith(f"# {cfg}") for line in lines)
    assert any(line.startswith('role = "all"') and line.endswith("# default") for line in lines)


def test_a_node_with_an_unknown_config_key_does_not_start(tmp_path) -> None:
    cfg = tmp_path / "bai.toml"
    cfg.write_text("[agent]\ncpus = 4\n")
    env = {**os.environ, "BAI_CONFIG": str(cfg)}
    cmd = [sys.executable, "-m", "bai", "node", "--state-dir", str(tmp_path / "state"), "--listen", "127.0.0.1:0"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert f"{cfg}: [agent] cpus: unknown key (expected one of: app_start_timeout, cpu," in out.stderr


def test_json_logs_are_one_object_per_line(tmp_path) -> None:
    node = Node(tmp_path / "jsonlog", "sim", args=("--log-format", "json", "-v")).start()
    node.stop()
    lines = [line for line in node.log_path.read_text().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line is JSON
    assert records and all({"time", "level", "logger", "message"} <= r.keys() for r in records)
    assert any(r["logger"].startswith("bai.") and r["level"] == "info" for r in records)


def test_https_with_a_self_signed_certificate(tmp_path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    made = subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        capture_output=True,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    node = Node(tmp_path / "tls", "sim", args=("--tls-cert", str(cert), "--tls-key", str(key))).start()
    try:
        assert f"endpoint  https://127.0.0.1:{node.port}" in node.banner
        untrusted = node.cli("agent", "ls")
        assert untrusted.returncode == 1 and "certificate bai does not trust" in untrusted.stderr
        assert "--ca" in untrusted.stderr
        trusted = node.cli("--ca", str(cert), "session", "run", "sim", "-c", "print(7)")
        assert trusted.returncode == 0 and trusted.stdout.strip() == "7", trusted.stderr
        # plain HTTP to the HTTPS port gets nowhere
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", node.port, timeout=10)
        with pytest.raises((http.client.HTTPException, OSError)):
            conn.request("GET", "/")
            conn.getresponse().read()
    finally:
        node.stop()
    half = Node(tmp_path / "half", "sim", args=("--tls-cert", str(cert)))
    with pytest.raises(AssertionError, match="needs both --tls-cert and --tls-key"):
        half.start(timeout=15)
