"""Smaller CLI behaviours against a real node (local kernels): `bai node status` / `stop`, two nodes under one
HOME with their own keypairs, `bai whoami` / `bai quota`, folder downloads as trees, `--dest` (and the old
`--dst`), completion of values."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.nodeproc import Node

BAI_SCRIPT = Path(sys.executable).parent / "bai"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    n = Node(tmp_path_factory.mktemp("misc"), "local").start()
    yield n
    n.stop()


def bai(env: dict[str, str], *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bai", *args], env=env, capture_output=True, text=True, timeout=90,
                          cwd=cwd)  # fmt: skip


# -- bai node status / stop ---------------------------------------------------------------------------------


def test_node_status_and_stop_of_a_state_dir(tmp_path: Path) -> None:
    n = Node(tmp_path / "n", "local").start()
    try:
        assert "bai node stop" in n.banner  # the banner says how to stop it
        state = str(n.state_dir)
        shown = n.cli("node", "status", "--state-dir", state)
        assert shown.returncode == 0, shown.stderr
        assert f"pid {n.proc.pid}" in shown.stdout
        assert "Role      all" in shown.stdout
        assert f"Endpoint  {n.endpoint}" in shown.stdout and "does not answer" not in shown.stdout
        assert "Uptime    " in shown.stdout
        data = json.loads(n.cli("node", "status", "--state-dir", state, "--json", check=True).stdout)
        assert (data["running"], data["pid"], data["role"], data["endpoint"]) == (True, n.proc.pid, "all", n.endpoint)
        assert data["answers"] is True
        # BAI_STATE_DIR names the folder too
        by_env = bai({**n.env, "BAI_STATE_DIR": state}, "node", "status")
        assert by_env.returncode == 0 and f"pid {n.proc.pid}" in by_env.stdout

        stopped = n.cli("node", "stop", "--state-dir", state, timeout=60)
        assert stopped.returncode == 0, stopped.stderr
        assert f"node stopped (pid {n.proc.pid})" in stopped.stdout
        assert n.proc.wait(5) == 0  # it had exited by the time stop said so (cleanly)
        assert not (n.state_dir / "node.json").exists()

        none = n.cli("node", "status", "--state-dir", state)
        assert none.returncode == 1 and f"no node runs for {n.state_dir}" in none.stdout
        again = n.cli("node", "stop", "--state-dir", state)
        assert again.returncode == 1 and "no node runs for" in again.stderr
    finally:
        n.stop()


def test_a_stale_node_file_is_not_a_running_node(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    (state / "node.json").write_text(json.dumps({"pid": dead.pid, "role": "all", "endpoint": "", "started": ""}))
    env = {**os.environ, "BAI_STATE_DIR": str(state)}
    result = bai(env, "node", "status", "--json")
    assert result.returncode == 1 and json.loads(result.stdout)["running"] is False
    # a pid reused by another program is not the node: nothing is sent a signal
    other = subprocess.Popen(["sleep", "30"])
    try:
        (state / "node.json").write_text(json.dumps({"pid": other.pid, "role": "all", "endpoint": "", "started": ""}))
        stopped = bai(env, "node", "stop")
        assert stopped.returncode == 1 and "no node runs for" in stopped.stderr
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_uptime_reads_as_people_say_it() -> None:
    from datetime import UTC, datetime, timedelta

    from bai.cli.nodectl import uptime_text

    now = datetime(2026, 1, 2, 12, 0, tzinfo=UTC)
    assert uptime_text((now - timedelta(seconds=40)).isoformat(), now) == "40s"
    assert uptime_text((now - timedelta(minutes=3, seconds=12)).isoformat(), now) == "3m 12s"
    assert uptime_text((now - timedelta(hours=2, minutes=5)).isoformat(), now) == "2h 05m"
    assert uptime_text("not a time", now) == "unknown"


# -- two nodes under one HOME --------------------------------------------------------------------------------


def test_two_nodes_under_one_home_keep_their_own_keypairs(tmp_path: Path) -> None:
    home = {"XDG_CONFIG_HOME": str(tmp_path / "config")}
    first = Node(tmp_path / "first", "local", env=home).start()
    second = None
    try:
        second = Node(tmp_path / "second", "local", env=home).start()
        # the second does not take the shared file from the first (which runs), and says how to reach it
        assert f"export BAI_STATE_DIR={second.state_dir}" in second.banner
        assert (second.state_dir / "credentials.toml").stat().st_mode & 0o777 == 0o600
        default = json.loads(first.cli("whoami", "--json", check=True).stdout)
        assert default["endpoint"] == first.endpoint
        chosen = json.loads(bai({**first.env, "BAI_STATE_DIR": str(second.state_dir)}, "whoami", "--json").stdout)
        assert chosen["endpoint"] == second.endpoint and chosen["accessKey"] != default["accessKey"]
        flagged = bai(first.env, "--state-dir", str(second.state_dir), "whoami")
        assert flagged.returncode == 0 and f"Endpoint    {second.endpoint}" in flagged.stdout
        # config show says which keypair the CLI uses, and from which file
        shown = first.cli("config", "show", check=True).stdout
        assert (
            f"keypair {default['accessKey']}" in shown
            and str(tmp_path / "config" / "bai" / "credentials.toml") in shown
        )
        other = bai({**first.env, "BAI_STATE_DIR": str(second.state_dir)}, "config", "show").stdout
        assert f"{second.state_dir / 'credentials.toml'} (BAI_STATE_DIR)" in other
    finally:
        if second is not None:
            second.stop()
        first.stop()


# -- whoami / quota ------------------------------------------------------------------------------------------


def test_whoami_and_quota_of_an_admin_and_of_a_user(node: Node) -> None:
    me = node.cli("whoami", check=True).stdout
    assert "Role        admin" in me and f"Endpoint    {node.endpoint}" in me and "Policy      default" in me
    node.cli("policy", "create", "small", "--max-sessions", "2", "--slots", "cpu=4,mem=8g", check=True)
    user = node.json("keypair", "create", "--user", "alice@example.com", "--policy", "small")
    who = node.json("whoami", as_keypair=user)
    assert who == {"accessKey": user["accessKey"], "role": "user", "endpoint": node.endpoint, "resourcePolicy": "small"}
    shown = node.cli("quota", as_keypair=user, check=True).stdout
    assert "Policy            small" in shown
    assert "Sessions          0 of 2" in shown
    assert "cpu               0 of 4" in shown
    assert "mem               0 B of 8 GiB" in shown
    data = node.json("quota", as_keypair=user)
    assert data["maxConcurrentSessions"] == 2 and data["resourcePolicy"] == "small"
    admin_quota = node.cli("quota", check=True).stdout
    assert "Sessions          0 (unlimited)" in admin_quota


# -- vfolder download ----------------------------------------------------------------------------------------


def test_a_folder_downloads_as_a_folder_tree_and_a_file_as_a_file(node: Node, tmp_path: Path) -> None:
    tree = tmp_path / "results"
    (tree / "run1").mkdir(parents=True)
    (tree / "a.txt").write_text("a")
    (tree / "run1" / "b.txt").write_text("bb")
    (tree / "run1" / "empty").mkdir()
    node.cli("vfolder", "create", "trees", check=True)
    up = node.cli("vfolder", "upload", "trees", str(tree), "--dest", "out", check=True)
    assert "uploaded 2 files" in up.stdout
    dest = tmp_path / "dl"
    dest.mkdir()
    down = node.cli("vfolder", "download", "trees", "out/results", "--dest", str(dest), check=True)
    assert f"downloaded 2 files (3 B) to {dest}" in down.stdout
    assert (dest / "results" / "a.txt").read_text() == "a"
    assert (dest / "results" / "run1" / "b.txt").read_text() == "bb"
    assert (dest / "results" / "run1" / "empty").is_dir()
    assert not (dest / "results").is_file()
    again = node.cli("vfolder", "download", "trees", "out/results", "--dest", str(dest))
    assert again.returncode == 1 and "exists already" in again.stderr
    forced = node.cli("vfolder", "download", "trees", "out/results", "--dest", str(dest), "--force", check=True)
    assert "downloaded 2 files" in forced.stdout
    # a file: that file; the old spelling --dst still works
    single = tmp_path / "single"
    single.mkdir()
    one = node.cli("vfolder", "download", "trees", "out/results/run1/b.txt", "--dst", str(single), check=True)
    assert "downloaded 1 files (2 B)" in one.stdout and (single / "b.txt").read_text() == "bb"
    missing = node.cli("vfolder", "download", "trees", "nothing-here", "--dest", str(single))
    assert missing.returncode == 1 and not (single / "nothing-here").exists()


def test_dest_is_the_one_spelling_in_help() -> None:
    for words in (["vfolder", "download"], ["vfolder", "upload"], ["session", "download"]):
        result = bai({**os.environ, "COLUMNS": "200"}, *words, "--help")
        assert result.returncode == 0 and "--dest" in result.stdout, words
        assert "--dst" not in result.stdout, words


# -- completion of values ------------------------------------------------------------------------------------


def _complete(env: dict[str, str], words: str, cword: int) -> subprocess.CompletedProcess[str]:
    env = {**env, "_BAI_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(cword)}
    env["_TYPER_COMPLETE_ARGS"] = words
    return subprocess.run([str(BAI_SCRIPT)], env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(not BAI_SCRIPT.exists(), reason="the bai script is not installed beside this Python")
def test_folder_names_complete_from_the_manager(node: Node) -> None:
    node.cli("vfolder", "create", "complete-me", check=True)
    node.cli("vfolder", "create", "complete-too", check=True)
    done = _complete(node.env, "bai vfolder info complete-", 3)
    assert done.returncode == 0, done.stderr
    assert set(done.stdout.split()) == {"complete-me", "complete-too"}


def test_completion_is_silent_and_quick_without_a_manager(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    from bai.cli import complete

    with socket.socket() as listener:  # accepts connections, never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        monkeypatch.setenv("BACKEND_ENDPOINT", f"http://127.0.0.1:{listener.getsockname()[1]}")
        monkeypatch.setenv("BACKEND_ACCESS_KEY", "AKIAXXXXXXXXXXXXXXXX")
        monkeypatch.setenv("BACKEND_SECRET_KEY", "x" * 40)
        started = time.monotonic()
        assert complete.complete_sessions("") == []
        assert complete.complete_images("py") == []
        assert time.monotonic() - started < 2 * complete.TIMEOUT + 1
    monkeypatch.setenv("BACKEND_ENDPOINT", "http://127.0.0.1:1")  # refused at once
    assert complete.complete_folders("") == []


def test_statuses_complete_in_lists() -> None:
    from bai.cli.complete import complete_statuses

    assert complete_statuses("ru") == ["running", "running_degraded"]
    assert complete_statuses("running,pe") == ["running,pending"]
    assert "running,running" not in complete_statuses("running,r")
    assert "terminated" in complete_statuses("")


@pytest.mark.skipif(not BAI_SCRIPT.exists(), reason="the bai script is not installed beside this Python")
def test_image_names_and_aliases_complete_from_the_manager(node: Node) -> None:
    images = node.json("image", "ls")
    assert images, "the local node lists its images"
    first = images[0]["name"]
    done = _complete(node.env, f"bai image rm {first[:3]}", 3)
    assert done.returncode == 0 and first in done.stdout.split(), (done.stdout, done.stderr)


def test_keypair_create_prints_exports_a_user_can_paste(node: Node) -> None:
    shown = node.cli("keypair", "create", "--user", "paste@example.com", check=True).stdout
    assert "…" not in shown
    exports = [line.strip() for line in shown.splitlines() if line.strip().startswith("export ")]
    assert [e.split("=")[0] for e in exports] == [
        "export BACKEND_ENDPOINT",
        "export BACKEND_ACCESS_KEY",
        "export BACKEND_SECRET_KEY",
    ]
    script = "; ".join([*exports, f"{sys.executable} -m bai whoami --json"])
    env = {k: v for k, v in node.env.items() if not k.startswith("BACKEND_")}
    env["HOME"] = str(node.base / "elsewhere")  # no saved credentials: only what was pasted
    who = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert who.returncode == 0, who.stderr
    assert json.loads(who.stdout)["role"] == "user"


@pytest.mark.skipif(not BAI_SCRIPT.exists(), reason="the bai script is not installed beside this Python")
def test_session_names_images_and_statuses_complete(node: Node) -> None:
    node.cli("session", "create", "python", "--name", "complete-sess", check=True)
    assert _complete(node.env, "bai session info complete-", 3).stdout.split() == ["complete-sess"]
    assert _complete(node.env, "bai session destroy complete-", 3).stdout.split() == ["complete-sess"]
    assert "running" in _complete(node.env, "bai session ls --status run", 4).stdout.split()
    images = _complete(node.env, "bai session run ", 3).stdout.split()
    assert images, "no image names completed"
