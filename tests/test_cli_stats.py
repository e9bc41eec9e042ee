"""Live statistics in the CLI (`bai session info`, `bai session top`, `bai agent ls`), first rendered from
row dicts in the API's `usage` shape (bai/common/stats.py), then end to end with a sim node whose kernels
report what their BAI_SIM_* variables say; and, on that node, `session logs --since` and `vfolder download
--force`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from rich.console import Console

from bai.cli.output import agents_table, session_details, top_table
from bai.client import APIError
from bai.common.present import usage_lines
from tests.cli_fake import AGENT, Fake, GiB, MiB, bai, cli_env, serve, session, usage
from tests.nodeproc import Node
from tests.tui_support import node_client


def rendered(table) -> list[str]:
    console = Console(width=250, color_system=None)
    with console.capture() as captured:
        console.print(table)
    return [line.rstrip() for line in captured.get().splitlines()]


def row_of(lines: list[str], name: str) -> list[str]:
    return next(line for line in lines if line.split()[:1] == [name]).split("  ")


# -- rendering from rows ---------------------------------------------------------------------------------------


def test_usage_lines_before_and_after_the_first_sample() -> None:
    assert usage_lines(session("new")) == ["cpu –   mem –   (no sample yet)"]
    lines = usage_lines(session("busy", usage=usage(150.0, 210, memPeakBytes=250 * MiB)))
    assert lines[:2] == ["cpu   1.5 of 2 cores (75 %)", "mem   210 MiB of 1 GiB (peak 250 MiB)"]
    gpu = usage_lines(session("g", usage={**usage(50.0, 100), "gpuPct": 40.0, "gpuMemBytes": 2 * GiB}))
    assert gpu[-1] == "gpu   40 %, memory 2 GiB"
    details = session_details(session("new"))
    assert "Usage       cpu –   mem –   (no sample yet)" in details
    ended = session_details(session("old", status="TERMINATED"))  # no usage line for an ended session
    assert not any(line.startswith("Usage") for line in ended)
    kernel = {"id": "k1", "clusterRole": "main", "status": "RUNNING", "usage": usage(50.0, 100)}
    two = session_details(session("pair", usage=usage(100.0, 200), kernels=[kernel, {**kernel, "id": "k2"}]))
    assert "Kernel      k1 main RUNNING  cpu 50 %, mem 100 MiB" in two  # each kernel's own, with several


def test_top_table_sorts_by_cpu_memory_or_name() -> None:
    items = [
        session("small", usage=usage(5.0, 900)),
        session("busy", usage=usage(180.0, 100), agent="host2"),
        session("cold"),  # no sample yet: last, with dashes
    ]
    lines = rendered(top_table(items, "cpu"))
    assert lines[0].split() == ["NAME", "STATUS", "CPU", "%", "MEM", "USED", "/", "ALLOC", "NET", "IN", "/", "OUT",
                                "IO", "READ", "/", "WRITE", "PIDS", "AGENT"]  # fmt: skip
    assert [line.split()[0] for line in lines[1:]] == ["busy", "small", "cold"]
    busy = lines[1].split()
    assert busy[:3] == ["busy", "RUNNING", "180.0"] and "100 MiB / 1 GiB" in lines[1] and busy[-1] == "host2"
    assert "1.5 KiB / 512 B" in lines[1] and "5 MiB / 1 MiB" in lines[1]
    assert lines[3].split()[:4] == ["cold", "RUNNING", "–", "–"]
    assert [line.split()[0] for line in rendered(top_table(items, "mem"))[1:]] == ["small", "busy", "cold"]
    assert [line.split()[0] for line in rendered(top_table(items, "name"))[1:]] == ["busy", "cold", "small"]


def test_agents_table_shows_use_beside_allocation() -> None:
    lines = rendered(agents_table([AGENT, {**AGENT, "id": "host2", "usage": None}]))
    assert lines[0].split()[:8] == ["ID", "STATUS", "BACKEND", "GROUP", "CPU", "ALLOC", "CPU", "USE"]
    host1 = lines[1]
    assert "3 / 4" in host1 and "50 % of 4 cores" in host1  # 200 % of one core on a 4-core host
    assert "1.5 GiB / 16 GiB" in host1 and "2 GiB / 16 GiB" in host1
    assert lines[2].split()[4:8] == ["3", "/", "4", "–"]  # no sample from host2 yet


# -- the CLI against a fake manager --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fake_env(tmp_path_factory) -> Iterator[dict[str, str]]:
    fake = Fake()
    fake.sessions = [
        session("quiet", usage=usage(2.0, 50)),
        session("hot", usage=usage(190.0, 300)),
        session("queued", status="PENDING", occupiedSlots={}),
    ]
    for endpoint in serve(fake):
        yield cli_env(endpoint, tmp_path_factory.mktemp("fake"))


def test_top_prints_one_table_when_piped(fake_env: dict[str, str]) -> None:
    done = bai(fake_env, "session", "top")  # stdout is a pipe: one frame, no --once needed
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and [line.split()[0] for line in lines[1:]] == ["hot", "quiet"], done.stderr
    assert lines[1].split()[2] == "190.0" and "300 MiB / 1 GiB" in lines[1]
    done = bai(fake_env, "session", "top", "--once", "--sort", "NAME")
    assert [line.split()[0] for line in done.stdout.splitlines()[1:]] == ["hot", "quiet"]
    done = bai(fake_env, "session", "top", "--sort", "disk")
    assert done.returncode == 2 and "cpu, mem, name" in done.stderr


def test_agent_ls_and_info_show_the_hosts_use(fake_env: dict[str, str]) -> None:
    lines = bai(fake_env, "agent", "ls").stdout.splitlines()
    assert "CPU USE" in lines[0] and "MEM USE" in lines[0]
    assert "50 % of 4 cores" in lines[1] and "2 GiB / 16 GiB" in lines[1]
    text = bai(fake_env, "agent", "info", "host1").stdout
    assert "Held      cpu 3, mem 1.5 GiB  (by kernels)" in text and "CPU use   50 % of 4 cores" in text
    assert "Mem use   2 GiB / 16 GiB" in text


# -- end to end on a sim node -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sim_node(tmp_path_factory) -> Iterator[Node]:
    node = Node(
        tmp_path_factory.mktemp("cli-stats"), "sim", agent_config='stat_interval = 0.3\ncpu = "4"\nmem = "8g"\n'
    )
    node.start()
    try:
        yield node
    finally:
        node.stop()


def _output_once(node: Node, needle: str, *args: str, timeout: float = 15.0) -> str:
    """What `bai ARGS` prints once it says `needle` (the first samples take a moment)."""
    deadline = time.monotonic() + timeout
    while True:
        out = node.cli(*args, check=True).stdout
        if needle in out or time.monotonic() > deadline:
            return out
        time.sleep(0.3)


def test_sim_sessions_show_their_figures_in_info_top_and_agent_ls(sim_node: Node) -> None:
    sim_node.cli(
        "session", "create", "python", "--name", "busy", "--cpu", "2", "--mem", "1g",
        "-e", "BAI_SIM_CPU_PCT=150", "-e", "BAI_SIM_MEM_MIB=210", check=True,
    )  # fmt: skip
    sim_node.cli("session", "create", "python", "--name", "idle", "--cpu", "1", "--mem", "512m", check=True)
    info = _output_once(sim_node, "cores", "session", "info", "busy")
    assert "Usage       cpu   1.5 of 2 cores (75 %)" in info
    assert "            mem   210 MiB of 1 GiB (peak 210 MiB)" in info
    assert "            pids  " in info
    top = _output_once(sim_node, "16 MiB / 512 MiB", "session", "top")
    lines = top.splitlines()
    assert [line.split()[0] for line in lines[1:]] == ["busy", "idle"]
    assert lines[1].split()[:3] == ["busy", "RUNNING", "150.0"] and "210 MiB / 1 GiB" in lines[1]
    assert sim_node.agent_id in lines[1]
    agents = sim_node.cli("agent", "ls", check=True).stdout.splitlines()
    assert "CPU USE" in agents[0] and "3 / 4" in agents[1] and "1.5 GiB / 8 GiB" in agents[1]
    assert " % of " in agents[1] and " cores" in agents[1]
    for name in ("busy", "idle"):
        sim_node.cli("session", "destroy", name, check=True)


def test_logs_since_a_time_or_a_duration(sim_node: Node) -> None:
    sim_node.cli("session", "create", "python", "--name", "talker", check=True)
    before = datetime.now(UTC).isoformat()
    sim_node.cli("session", "exec", "talker", "-c", 'print("early")', check=True)
    time.sleep(4)
    middle = datetime.now(UTC).isoformat()
    sim_node.cli("session", "exec", "talker", "-c", 'print("late")', check=True)
    recent = sim_node.cli("session", "logs", "talker", "--since", "3s", check=True).stdout  # early is 4 s old
    assert "late" in recent and "early" not in recent
    assert sim_node.cli("session", "logs", "talker", "--since", middle, check=True).stdout == "late\n"
    everything = sim_node.cli("session", "logs", "talker", "--since", before, check=True).stdout
    assert everything == sim_node.cli("session", "logs", "talker", check=True).stdout == "early\nlate\n"
    assert sim_node.cli("session", "logs", "talker", "--since", "2099-01-01T00:00:00Z", check=True).stdout == ""
    last = sim_node.cli("session", "logs", "talker", "--since", "1h", "--tail", "1", check=True).stdout
    assert last == "late\n"
    sim_node.cli("session", "destroy", "talker", check=True)


def test_the_logs_endpoint_refuses_a_bad_since_time(sim_node: Node) -> None:
    async def ask(query: str) -> tuple[int, str]:
        async with node_client(sim_node) as c:
            try:
                await c.request("GET", f"/session/quiet-one/logs?{query}")
            except APIError as e:
                return e.status, str(e)
            return 200, ""

    sim_node.cli("session", "create", "python", "--name", "quiet-one", check=True)
    status, said = asyncio.run(ask("sinceTime=soon"))
    assert status == 400 and "sinceTime: cannot read 'soon' as a time" in said, said
    status, _ = asyncio.run(ask("sinceTime=10m&tail=5"))  # sinceTime goes with tail
    assert status == 200
    sim_node.cli("session", "destroy", "quiet-one", check=True)


def test_vfolder_download_refuses_to_overwrite_unless_forced(sim_node: Node, tmp_path: Path) -> None:
    src = tmp_path / "up"
    src.mkdir()
    (src / "notes.txt").write_text("from the folder\n")
    sim_node.cli("vfolder", "create", "dl-force", check=True)
    sim_node.cli("vfolder", "upload", "dl-force", str(src / "notes.txt"), check=True)
    dest = tmp_path / "down"
    dest.mkdir()
    (dest / "notes.txt").write_text("mine\n")
    refused = sim_node.cli("vfolder", "download", "dl-force", "notes.txt", "--dst", str(dest))
    assert refused.returncode == 1
    assert f"bai: error: {dest / 'notes.txt'} exists already; not overwriting it (--force does)" in refused.stderr
    assert (dest / "notes.txt").read_text() == "mine\n"
    forced = sim_node.cli("vfolder", "download", "dl-force", "notes.txt", "--dst", str(dest), "--force")
    assert forced.returncode == 0 and "downloaded 1 files (16 B)" in forced.stdout, forced.stderr
    assert (dest / "notes.txt").read_text() == "from the folder\n"


@pytest.mark.parametrize(
    ("key", "no_color"), [(b"q", False), (b"\x03", False), (b"q", True)], ids=["q", "ctrl-c", "q-no-color"]
)
def test_top_on_a_terminal_refreshes_until_q(fake_env: dict[str, str], key: bytes, no_color: bool) -> None:
    """On a terminal `top` keeps redrawing; q or Ctrl-C leaves at once, with status 0 and the terminal as it
    was."""
    import os
    import pty
    import select
    import subprocess
    import sys
    import termios

    leader, follower = pty.openpty()
    before = termios.tcgetattr(follower)
    proc = subprocess.Popen(
        [sys.executable, "-m", "bai", "session", "top", "--interval", "0.2"],
        env={**fake_env, "COLUMNS": "150", "TERM": "xterm", **({"NO_COLOR": "1"} if no_color else {})},
        stdin=follower,
        stdout=follower,
        stderr=follower,
        preexec_fn=_own_terminal,
    )
    seen = b""
    deadline = time.monotonic() + 20
    while seen.count(b"hot") < 2 and time.monotonic() < deadline:  # drawn, then redrawn
        if select.select([leader], [], [], 0.5)[0]:
            seen += os.read(leader, 65536)
    os.write(leader, key)
    try:
        code = proc.wait(10)
    finally:
        proc.kill()
    while select.select([leader], [], [], 0.2)[0]:
        try:
            seen += os.read(leader, 65536)
        except OSError:
            break
    after = termios.tcgetattr(follower)
    os.close(leader)
    os.close(follower)
    assert code == 0, seen.decode(errors="replace")
    text = seen.decode(errors="replace")
    assert "NAME" in text and "190.0" in text and "Traceback" not in text
    assert after[3] == before[3]  # the local modes (echo, canonical input) are back
    if no_color:
        assert "\x1b" not in text and text.count("NAME") >= 2  # one table after another
    else:
        assert "\x1b[" in text  # redrawn in place


def _own_terminal() -> None:
    """In the child: a session of its own whose controlling terminal is its stdin (so ^C is SIGINT)."""
    import fcntl
    import os
    import termios

    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
