"""What a user of the `bai` command line sees: shell completion, help without type noise and with an
example, NO_COLOR, tables when piped, one unit style, and `session ls --status / --failed`,
`session logs --since`, `vfolder download --force`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
import typer
from typer.testing import CliRunner, Result

from bai.cli import typer_fast
from bai.cli.lazy import lean_command
from bai.cli.main import app
from bai.common.present import reason, size, slots_text
from tests.cli_fake import Fake, GiB, bai, cli_env, serve, session, usage

BAI_SCRIPT = Path(sys.executable).parent / "bai"
ESC = "\x1b"


@pytest.fixture(scope="module")
def fake() -> Iterator[tuple[Fake, str]]:
    f = Fake()
    f.sessions = [
        session("busy", usage=usage(150.0, 210, memPeakBytes=250 * 2**20)),
        session("waiting", status="PENDING", occupiedSlots={}, statusInfo="no-available-instances"),
        session("crashed", status="TERMINATED", exitCode=3, result="FAILURE"),
        session("broken", status="ERROR", statusData={"error": {"name": "ImageNotFound", "repr": "no such image"}}),
        session("fine", status="TERMINATED", exitCode=0, result="SUCCESS"),
        session("a-session-with-a-rather-long-name-that-would-fold", requestedSlots={"cpu": "0.5", "mem": "536870912"}),
    ]
    yield from ((f, endpoint) for endpoint in serve(f))


@pytest.fixture
def env(fake: tuple[Fake, str], tmp_path: Path) -> dict[str, str]:
    return cli_env(fake[1], tmp_path)


# -- shell completion -------------------------------------------------------------------------------------------


def _complete(words: str, cword: int, shell: str = "bash") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "_BAI_COMPLETE": f"complete_{shell}", "COMP_WORDS": words, "COMP_CWORD": str(cword)}
    env["_TYPER_COMPLETE_ARGS"] = words
    return subprocess.run([str(BAI_SCRIPT)], env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(not BAI_SCRIPT.exists(), reason="the bai script is not installed beside this Python")
def test_completion_of_groups_and_of_a_lazy_groups_commands() -> None:
    done = _complete("bai ses", 1)
    assert done.returncode == 0 and done.stdout.split() == ["session"], done.stderr
    done = _complete("bai session ", 2)
    assert done.returncode == 0, done.stderr
    assert {"ls", "info", "top", "logs", "run", "destroy"} <= set(done.stdout.split())
    done = _complete("bai vfolder down", 2)
    assert done.stdout.split() == ["download"]
    done = _complete("bai session l", 2, shell="zsh")
    assert '"ls":"List sessions' in done.stdout and '"logs":' in done.stdout


@pytest.mark.skipif(not BAI_SCRIPT.exists(), reason="the bai script is not installed beside this Python")
def test_show_completion_prints_the_script_to_source() -> None:
    # typer detects the shell from the process's ancestors (`--show-completion` takes no value): run it from bash, as
    # a user does (`; exit $?` keeps bash from replacing itself with the command, and keeps its status), whatever
    # started the tests
    done = subprocess.run(
        ["bash", "-c", f"'{BAI_SCRIPT}' --show-completion; exit $?"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "_BAI_COMPLETE=complete_bash" in done.stdout and "complete " in done.stdout
    helped = subprocess.run([str(BAI_SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert "--install-completion" in helped.stdout and "--show-completion" in helped.stdout


# -- help ---------------------------------------------------------------------------------------------------------


def _all_commands() -> list[list[str]]:
    group = typer.main.get_command(app)
    ctx = group.make_context("bai", ["--help"], resilient_parsing=True)
    out = []
    for name in group.list_commands(ctx):
        sub = group.get_command(ctx, name)
        subs = getattr(sub, "commands", None)
        out += [[name]] if subs is None else [[name, c] for c in subs]
    return out


def _invoke(*args: str) -> Result:
    """bai's command line as main() builds it (lazily, typer_fast installed), run in this process."""
    typer_fast.install()
    with mock.patch("typer.testing._get_command", lambda command: command):  # a click command already
        return CliRunner().invoke(lean_command(app), list(args), env={"COLUMNS": "200"}, prog_name="bai")


def test_every_commands_help_has_an_example_and_no_type_noise() -> None:
    commands = _all_commands()
    assert len(commands) > 50
    for words in commands:
        result = _invoke(*words, "--help")
        text = result.output
        assert result.exit_code == 0 and "Usage: bai " + " ".join(words) in text, (words, text)
        assert re.search(r"^ Examples?:", text, re.M), (words, text)
        noise = re.findall(r"<(?:bool|str|int|float|path|list\[str\])>|\{[a-z_]+\}|\bTEXT\b|\bINTEGER\b", text)
        assert noise == [], (words, noise)


def test_help_shows_placeholders_and_keeps_brackets() -> None:
    text = _invoke("session", "run", "--help").output
    assert "Usage: bai session run [OPTIONS] IMAGE [ARGS]..." in text
    assert re.search(r"--mem\s+SIZE\s+Memory", text) and re.search(r"--keep\s+Keep the session", text)
    assert re.search(r"Examples: *\n bai session run python -c 'print\(1 \+ 1\)'", text), text
    text = _invoke("session", "logs", "--help").output
    assert "until [manager] log_retention" in text  # not eaten as rich markup
    assert re.search(r"--since\s+WHEN\s+Only output from then on", text) and re.search(r"--tail\s+-n\s+N\s", text)
    missing = _invoke("session", "info")
    assert missing.exit_code == 2 and "Missing argument 'REF'." in missing.output


# -- NO_COLOR, piped tables ---------------------------------------------------------------------------------------


def test_no_color_means_no_escapes_anywhere(env: dict[str, str]) -> None:
    forced = {**env, "FORCE_COLOR": "1", "COLUMNS": "150"}  # rich colours even a pipe: NO_COLOR must win
    assert ESC in bai(forced, "session", "ls").stdout  # (the check below means something)
    plain = {**forced, "NO_COLOR": "1"}
    for args in (["session", "ls"], ["session", "info", "busy"], ["agent", "ls"], ["session", "top", "--once"]):
        done = bai(plain, *args)
        assert done.returncode == 0 and ESC not in done.stdout + done.stderr, (args, done.stdout, done.stderr)
        assert "busy" in done.stdout or "host1" in done.stdout
    for args, code in ((["--help"], 0), (["session", "nope"], 2), (["session", "info", "nosuch"], 1)):
        done = bai(plain, *args)
        assert done.returncode == code and ESC not in done.stdout + done.stderr, (args, done.stdout, done.stderr)
    assert "No such command 'nope'" in bai(plain, "session", "nope").stderr


def test_piped_tables_keep_each_row_on_one_line(env: dict[str, str]) -> None:
    done = bai({**env, "COLUMNS": "40"}, "session", "ls")
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["NAME", "STATUS", "REASON", "IMAGE", "SLOTS", "AGE"]
    long = [line for line in lines if line.startswith("a-session-with-a-rather-long-name-that-would-fold ")]
    assert len(long) == 1 and "cpu 0.5, mem 512 MiB" in long[0]
    assert all(line == line.rstrip() for line in lines)  # no trailing blanks
    assert len(lines) == 4  # the header and the three active sessions: nothing folded
    waiting = bai(env, "session", "ls", "--status", "pending").stdout
    assert "waiting" in waiting and "no-available-instances" in waiting


# -- units ----------------------------------------------------------------------------------------------------


def test_a_waiting_sessions_reason_says_what_is_planned_for_it_first() -> None:
    """Where a table cuts a reason short, the reservation's start (or the preemption under way) still shows."""

    def waiting(msg: str) -> dict:
        return {"status": "PENDING", "statusInfo": "no-available-instances", "statusData": {"scheduler": {"msg": msg}}}

    room = "no agent has room: best is a1 with cpu 0 free of 2 requested"
    assert reason(waiting(f"{room}; reserved: starts by 2026-12-07 15:32 UTC on a1, a2")) == (
        f"no-available-instances: reserved: starts by 2026-12-07 15:32 UTC on a1, a2 ({room})"
    )
    assert reason(waiting(f"{room}; preempting low1 on a1: starts once they have ended")) == (
        f"no-available-instances: preempting low1 on a1: starts once they have ended ({room})"
    )
    assert reason(waiting(room)) == f"no-available-instances: {room}"


def test_one_unit_style_for_bytes() -> None:
    assert [size(n) for n in (0, 512, 1536, 512 * 2**20, 1.5 * GiB, GiB, GiB - 1)] == [
        "0 B", "512 B", "1.5 KiB", "512 MiB", "1.5 GiB", "1 GiB", "1 GiB",
    ]  # fmt: skip
    assert slots_text({"cpu": "2", "mem": str(GiB), "cuda.shares": "0"}) == "cpu 2, mem 1 GiB"


def test_session_info_shows_use_next_to_allocation(env: dict[str, str]) -> None:
    text = bai(env, "session", "info", "busy").stdout
    assert "Resources   cpu 2, mem 1 GiB" in text
    assert "Usage       cpu   1.5 of 2 cores (75 %)" in text
    assert "            mem   210 MiB of 1 GiB (peak 250 MiB)" in text
    assert "            net   1.5 KiB received, 512 B sent" in text
    assert "            io    5 MiB read, 1 MiB written" in text
    assert "            pids  3" in text


# -- session ls --status / --failed ----------------------------------------------------------------------------


def test_status_is_case_insensitive_and_an_unknown_one_lists_the_valid_ones(env: dict[str, str]) -> None:
    done = bai(env, "session", "ls", "--status", "Running", "--json")
    assert done.returncode == 0 and {s["name"] for s in json.loads(done.stdout)} == {
        "busy", "a-session-with-a-rather-long-name-that-would-fold",
    }  # fmt: skip
    done = bai(env, "session", "ls", "--status", "running,bogus")
    assert done.returncode == 2 and done.stdout == ""
    said = " ".join(done.stderr.replace("│", " ").split())
    assert "unknown status BOGUS" in said and "valid: pending, scheduled, pulling" in said and "cancelled" in said
    done = bai(env, "session", "ls", "--status", "terminated", "--all")
    assert {line.split()[0] for line in done.stdout.splitlines()[1:]} == {"crashed", "fine"}


def test_failed_lists_sessions_that_ended_badly(env: dict[str, str]) -> None:
    done = bai(env, "session", "ls", "--failed")
    names = {line.split()[0] for line in done.stdout.splitlines()[1:]}
    assert done.returncode == 0 and names == {"crashed", "broken"}, done.stdout
    assert "exit 3 FAILURE" in done.stdout and "no such image" in done.stdout
    done = bai(env, "session", "ls", "--failed", "--status", "error", "--json")
    assert [s["name"] for s in json.loads(done.stdout)] == ["broken"]


def test_logs_since_and_tail_are_checked_before_asking(env: dict[str, str]) -> None:
    done = bai(env, "session", "logs", "busy", "--since", "yesterday")
    assert done.returncode == 2 and "cannot read 'yesterday' as a time" in done.stderr.replace("│", "")
    done = bai(env, "session", "logs", "busy", "--tail", "-1")
    assert done.returncode == 2 and "lines >= 0" in done.stderr
