"""What `bai session ls`, `session top`, `agent ls` and `session info` print on a terminal of 80, 120 and 200
columns, against a fake manager: golden text files a person reads (tests/cli_tables_goldens/; rewrite them
with BAI_UPDATE_GOLDENS=1 and look at the diff). Names, statuses and headers stay whole at 80 columns, the
reason takes the width left, secondary columns are dropped rather than squeezed; `-o wide` shows them all."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bai.cli.layout import Column, fit, wants
from bai.cli.output import policies_table, sessions_table, why
from bai.cli.words import sizes_in
from bai.common.timing import timing_sentence
from tests.cli_fake import AGENT, Fake, GiB, cli_env, serve, session, usage

GOLDENS = Path(__file__).parent / "cli_tables_goldens"
ALICE, BOB = "AKIAEXAMPLEEXAMPLE00", "AKIABOBEXAMPLEBOB001"
WIDTHS = (80, 120, 200)
LONG_REASON = "cpu 8 requested, 2 free; mem 23.54GiB requested, 4GiB free on every agent of scaling group default"


def ago(now: datetime, seconds: float) -> str:
    return (now - timedelta(seconds=seconds)).isoformat()


def rows(now: datetime) -> list[dict]:
    """An admin's view: two owners; times far enough from a minute's edge that a slow test prints the same."""
    big = {"cpu": "4", "mem": str(16 * GiB), "cuda.shares": "0.5"}
    return [
        session("train-resnet50-imagenet", creationTime=ago(now, 2 * 3600 + 610), startedAt=ago(now, 2 * 3600 + 490),
                requestedSlots=big, occupiedSlots=big, agent="vm-8f3a2c1d-gpu-worker-01",
                usage=usage(385.5, 9.5 * 1024, gpuPct=71.0, gpuMemBytes=30 * GiB)),
        session("notebook", accessKey=BOB, creationTime=ago(now, 5430), startedAt=ago(now, 5425), exitCode=137,
                result="FAILURE", usage=usage(50.0, 300), agent="vm-8f3a2c1d-cpu-worker-02"),
        session("wait-for-gpus-finetune-llama", accessKey=BOB, status="PENDING", creationTime=ago(now, 3 * 3600 + 920),
                agent=None, occupiedSlots={}, queuePosition=2, statusInfo="no-available-instances",
                statusData={"scheduler": {"msg": LONG_REASON}}, requestedSlots={"cpu": "8", "mem": str(24 * GiB)}),
        session("etl-nightly", type="BATCH", status="TERMINATED", creationTime=ago(now, 5 * 3600 + 1200),
                startedAt=ago(now, 5 * 3600 + 1170), terminationTime=ago(now, 4 * 3600 + 1030), exitCode=3,
                result="FAILURE", statusInfo="task-failed", statusData={"exitCode": 3}),
    ]  # fmt: skip


def agents(now: datetime) -> list[dict]:
    gpus = [{"index": i, "name": "H200", "uuid": f"GPU-{i}", "memory_total": 141 * GiB, "allocated": "0.25"}
            for i in range(2)]  # fmt: skip
    return [
        {**AGENT, "id": "vm-8f3a2c1d-gpu-worker-01", "hostname": "gpu01", "backend": "docker", "gpus": gpus,
         "warm": {"bai-python:3.11": 2}, "lastSeen": ago(now, 200), "version": "0.9.0"},
        {**AGENT, "id": "vm-8f3a2c1d-cpu-worker-02", "hostname": "cpu02", "schedulable": False,
         "lastSeen": ago(now, 200), "version": "0.9.0", "scalingGroup": "batch-jobs"},
    ]  # fmt: skip


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    now = datetime.now(UTC)
    fake = Fake()
    fake.sessions = rows(now)
    fake.agents = agents(now)
    yield from serve(fake)


def on_terminal(endpoint: str, tmp_path: Path, columns: int, *args: str) -> str:
    """What `bai ARGS` shows on a terminal `columns` wide (NO_COLOR: the text alone), blanks at line ends
    removed."""
    env = cli_env(endpoint, tmp_path, COLUMNS=str(columns), LINES="40", NO_COLOR="1", TERM="xterm")
    leader, follower = pty.openpty()
    try:
        done = subprocess.run([sys.executable, "-m", "bai", *args], env=env, stdin=subprocess.DEVNULL, stdout=follower,
                              stderr=subprocess.PIPE, text=True, timeout=60)  # fmt: skip
    finally:
        os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed: all read
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    assert done.returncode == 0, done.stderr
    return "".join(line.rstrip() + "\n" for line in out.decode().replace("\r\n", "\n").splitlines())


ISO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?\+00:00")


def golden(name: str, text: str) -> None:
    """`text` is the golden `name` (times of day written as they are now, which changes, are masked)."""
    text = ISO_TIME.sub("YYYY-MM-DDTHH:MM:SS+00:00", text)
    path = GOLDENS / f"{name}.txt"
    if os.environ.get("BAI_UPDATE_GOLDENS"):
        GOLDENS.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden {path.name}: run with BAI_UPDATE_GOLDENS=1 and read it"
    assert text == path.read_text(), f"{name} differs from {path} (BAI_UPDATE_GOLDENS=1 rewrites it):\n{text}"


CASES = {
    "session-ls": ("session", "ls", "--all"),
    "session-top": ("session", "top", "--once"),
    "agent-ls": ("agent", "ls"),
}


@pytest.mark.parametrize("columns", WIDTHS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_compact_tables_fit_the_terminal_by_importance(endpoint: str, tmp_path: Path, case: str, columns: int) -> None:
    text = on_terminal(endpoint, tmp_path, columns, *CASES[case])
    golden(f"{case}-{columns}", text)
    lines = text.splitlines()
    assert all(len(line) <= columns for line in lines), text  # one line per row, nothing folded
    assert "…" not in lines[0]  # every header whole
    names = {line.split()[0] for line in lines[1:]}
    wanted = {"vm-8f3a2c1d-gpu-worker-01", "vm-8f3a2c1d-cpu-worker-02"} if case == "agent-ls" else {
        "train-resnet50-imagenet", "notebook"}  # fmt: skip
    assert wanted <= names, text  # every name whole
    assert not re.search(r"\b\w…", " ".join(line.split("  ")[0] for line in lines))


def test_at_80_columns_the_reason_takes_the_width_left_and_secondary_columns_go(endpoint: str, tmp_path: Path) -> None:
    lines = on_terminal(endpoint, tmp_path, 80, "session", "ls").splitlines()
    assert lines[0].split() == ["NAME", "STATUS", "REASON"]  # the owner is secondary to why a session waits
    pending = next(line for line in lines if line.startswith("wait-for-gpus-finetune-llama "))
    assert len(pending) == 80 and pending.endswith("…") and "#2 in queue: no-available-instances" in pending
    notebook = next(line for line in lines if line.startswith("notebook "))
    assert "RUNNING  last run: exit 137 FAILURE" in notebook  # its last run failed, not the session
    middle = on_terminal(endpoint, tmp_path, 120, "session", "ls").splitlines()
    assert middle[0].split() == ["NAME", "OWNER", "STATUS", "REASON", "AGE"]  # two owners: whose each is
    assert middle[1].split()[:3] == ["train-resnet50-imagenet", ALICE, "RUNNING"]
    wide = on_terminal(endpoint, tmp_path, 200, "session", "ls")
    assert wide.splitlines()[0].split() == ["NAME", "OWNER", "STATUS", "REASON", "IMAGE", "SLOTS", "AGE"]
    assert re.search(r"cpu 8 requested, 2 free; mem 23\.5 GiB re\w*…  bai-python:3\.11", wide)  # cut: the rest fits
    whole = "mem 23.5 GiB requested, 4 GiB free on every agent of scaling group default  bai-python:3.11"
    assert whole in on_terminal(endpoint, tmp_path, 200, "session", "ls", "-o", "wide")


@pytest.mark.parametrize("columns", (80, 200))
def test_wide_output_has_every_column(endpoint: str, tmp_path: Path, columns: int) -> None:
    text = on_terminal(endpoint, tmp_path, columns, "session", "ls", "--all", "-o", "wide")
    golden(f"session-ls-wide-{columns}", text)
    header = text.splitlines()[0].split()
    assert header == ["NAME", "OWNER", "ID", "STATUS", "REASON", "IMAGE", "SLOTS", "AGENT", "QUEUED", "RAN", "AGE"]
    train = next(line for line in text.splitlines() if line.startswith("train-resnet50-imagenet "))
    assert "2m 0s   2h 8m" in train  # queued two minutes, then ran: apart, not one sum
    etl = next(line for line in text.splitlines() if line.startswith("etl-nightly "))
    assert "30s     1h 2m" in etl  # an ended session ran until it ended
    agents_wide = on_terminal(endpoint, tmp_path, columns, "agent", "ls", "-o", "wide").splitlines()[0].split()
    assert "HOSTNAME" in agents_wide and "VERSION" in agents_wide and "BACKEND" in agents_wide
    top_wide = on_terminal(endpoint, tmp_path, columns, "session", "top", "--once", "-o", "wide")
    assert "71 %, 30 GiB" in top_wide and "bai-python:3.11" in top_wide


def test_session_info_says_queued_and_running_apart_and_a_last_run_is_the_runs(endpoint: str, tmp_path: Path) -> None:
    text = on_terminal(endpoint, tmp_path, 80, "session", "info", "notebook")
    golden("session-info-notebook-80", text)
    assert "Last run    exit 137 FAILURE (the session goes on)" in text
    assert "Exit code" not in text and "Result" not in text
    assert re.search(r"^Started     \S+ \(queued 5s, running 1h 30m\)$", text, re.M), text
    pending = on_terminal(endpoint, tmp_path, 80, "session", "info", "wait-for-gpus-finetune-llama")
    golden("session-info-pending-80", pending)
    assert all(len(line) <= 80 for line in pending.splitlines())
    assert "23.5 GiB" in pending and "Queued      3h 15m so far" in pending
    ended = on_terminal(endpoint, tmp_path, 120, "session", "info", "etl-nightly")
    assert "Exit code   3" in ended and "Result      FAILURE" in ended and "(queued 30s, ran 1h 2m)" in ended


def test_top_json_is_the_sessions_shown_and_o_json_is_json(endpoint: str, tmp_path: Path) -> None:
    env = cli_env(endpoint, tmp_path)
    run = [sys.executable, "-m", "bai", "session", "top"]
    items = json.loads(subprocess.run([*run, "--json"], env=env, capture_output=True, text=True, timeout=60).stdout)
    assert [s["name"] for s in items] == ["train-resnet50-imagenet", "notebook"]  # busiest first, running only
    assert items[0]["usage"]["cpuPct"] == 385.5
    by_name = json.loads(subprocess.run([*run, "-o", "json", "--sort", "name"], env=env, capture_output=True,
                                        text=True, timeout=60).stdout)  # fmt: skip
    assert [s["name"] for s in by_name] == ["notebook", "train-resnet50-imagenet"]
    bad = subprocess.run([*run, "-o", "yaml"], env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "wants wide or json, got 'yaml'" in bad.stderr


# -- the layout, rendered from rows ------------------------------------------------------------------------------


def test_columns_are_dropped_least_important_first_never_squeezed() -> None:
    columns = [
        Column("NAME", lambda r: r["n"]),
        Column("STATUS", lambda r: "RUNNING"),
        Column("REASON", lambda r: r["r"], rest=True),
        Column("AGE", lambda r: "5m", rank=1),
        Column("IMAGE", lambda r: "bai-python:3.11", rank=2),
        Column("ID", lambda r: "0123abcd", wide=True),
    ]
    items = [{"n": "a-rather-long-session-name", "r": "x" * 60}]
    header = [c.header for c in fit(columns, items, 200).columns]
    assert header == ["NAME", "STATUS", "REASON", "AGE", "IMAGE"]  # ID only with wide
    assert [c.header for c in fit(columns, items, 80).columns] == ["NAME", "STATUS", "REASON", "AGE"]
    assert [c.header for c in fit(columns, items, 60).columns] == ["NAME", "STATUS", "REASON"]
    assert [c.header for c in fit(columns, items, 60, wide=True).columns] == [h for h in (*header, "ID")]
    assert wants("WIDE", False) == (True, False) and wants(None, True) == (False, True)


def test_no_limit_is_unlimited_and_sizes_have_one_form() -> None:
    from rich.console import Console

    policy = {
        "name": "default", "max_concurrent_sessions": 0, "total_resource_slots": {}, "default_for_unspecified":
        "UNLIMITED", "idle_timeout": 0, "max_session_lifetime": 0, "max_vfolder_count": 0, "max_vfolder_size": 0,
        "max_pending_session_count": 0, "max_session_networks": 0,
    }  # fmt: skip
    console = Console(width=250, color_system=None)
    with console.capture() as captured:
        console.print(policies_table([policy, {**policy, "name": "small", "max_vfolder_size": str(GiB),
                                               "idle_timeout": 1800, "max_concurrent_sessions": 3}]))  # fmt: skip
    default, small = captured.get().splitlines()[1:]
    assert default.split()[1:] == ["unlimited"] * 9  # sessions, slots, unlisted slots, timeouts, folders, queue
    assert small.split()[1:4] == ["3", "unlimited", "unlimited"] and "30m" in small and "1 GiB" in small
    assert sizes_in("mem 23.54GiB requested, 512MiB free, 100B") == "mem 23.5 GiB requested, 512 MiB free, 100 B"
    narrow = Console(width=80, color_system=None)
    with narrow.capture() as captured:
        narrow.print(policies_table([policy], width=80))
    header = captured.get().splitlines()[0]
    assert re.split(r"\s{2,}", header)[:3] == ["NAME", "MAX SESSIONS", "TOTAL SLOTS"] and "…" not in header
    assert len(header) <= 80 and "NETWORKS" not in header


def test_a_pending_sessions_reason_leads_with_its_place_and_times_are_apart() -> None:
    now = datetime.now(UTC)
    train, notebook, waiting, etl = rows(now)
    assert why(waiting).startswith("#2 in queue: no-available-instances: cpu 8 requested")
    listed = {**waiting, "queuePosition": None, "statusData": {"scheduler": {"msg": "no room", "position": 3}}}
    assert why(listed) == "#3 in queue: no-available-instances: no room"  # a list item: the scheduler's word
    assert why({**listed, "status": "CANCELLED"}) == "no-available-instances: no room"
    assert why(notebook) == "last run: exit 137 FAILURE" and why(etl) == "task-failed: exit code 3; FAILURE"
    assert timing_sentence(train, now) == "queued 2m 0s, running 2h 8m"
    assert timing_sentence(etl, now) == "queued 30s, ran 1h 2m"
    detail = {**train, "startedAt": None, "transitions": [{"status": "RUNNING", "at": ago(now, 60), "status_info": ""}]}
    assert timing_sentence(detail, now) == "queued 2h 9m, running 1m 0s"  # no startedAt: the RUNNING transition
    one_owner = [s for s in rows(now) if s["accessKey"] == ALICE]
    assert "OWNER" not in [c.header for c in sessions_table(one_owner, width=200).columns]
