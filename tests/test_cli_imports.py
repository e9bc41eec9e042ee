"""The CLI imports what a command needs and no more (checked by what is in sys.modules, not by timing),
and the ways it avoids the rest (lazy groups, typer_fast) leave what it prints unchanged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from bai.cli import typer_fast
from bai.cli.main import BaiGroup, app
from tests import ws_frames
from tests.cli_fake import JsonHandler

# never needed to start the CLI: the node, the dashboard, the GraphQL schema, aiohttp, pydantic (typer's)
NEVER = ("aiohttp", "textual", "graphql", "pydantic", "pydantic_core", "bai.node", "bai.tui")
# rich beyond what tables and typer's help panels use
RICH_EXTRAS = ("rich.markdown", "rich.traceback", "rich.syntax", "markdown_it", "pygments")

# runs bai's main() with the given arguments, then writes the names in sys.modules to a file
PROBE = """
import json, os, sys
out = sys.argv[1]
sys.argv = ["bai", *sys.argv[2:]]
exit_now = os._exit
def dump(code=0):
    with open(out, "w") as f:
        json.dump(sorted(sys.modules), f)
    exit_now(code)
os._exit = dump
from bai.cli.main import main
main()
"""

SESSION = {
    "id": "d406f297-a2b4-4fb5-a651-3a9d2a760e05",
    "sessionId": "d406f297-a2b4-4fb5-a651-3a9d2a760e05",
    "name": "keep1",
    "sessionName": "keep1",
    "image": "bai-python:3.11",
    "type": "INTERACTIVE",
    "status": "RUNNING",
    "statusInfo": "",
    "statusData": {},
    "startsAt": None,
    "dependsOn": [],
    "statusChanged": "2026-11-30T23:05:25.304544+00:00",
    "result": "UNDEFINED",
    "creationTime": "2026-11-30T23:05:25.244407+00:00",
    "terminationTime": None,
    "scalingGroup": "default",
    "requestedSlots": {"cpu": "1", "mem": "1073741824"},
    "occupiedSlots": {"cpu": "1", "mem": "1073741824"},
    "environ": {},
    "mounts": [],
    "agent": "a1",
    "exitCode": None,
    "servicePorts": [],
    "kernels": [],
}


EXECUTED: list[dict[str, Any]] = []  # the first frames of the execute WebSockets the fake manager took


class _Manager(JsonHandler):
    """Answers GET /session (the list) and GET /session/NAME, POST /session (a create: keep1, running),
    DELETE /session/ID, and the execute WebSocket (one run: it prints the code and exits 3); anything else
    is a 404 problem."""

    def do_GET(self) -> None:  # noqa: N802
        path = self.path.split("?")[0]
        if path == "/session":
            self._answer(200, {"items": [SESSION]})
        elif path in ("/session/keep1", f"/session/{SESSION['id']}"):
            self._answer(200, SESSION)
        elif path == f"/stream/session/{SESSION['id']}/execute" and self.headers["Upgrade"] == "websocket":
            self._execute()
        else:
            self._answer(404, {"type": "https://api.backend.ai/probs/not-found", "title": "No such session."})

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"] or 0))
        if self.path.split("?")[0] == "/session":
            created = {"sessionId": SESSION["id"], "sessionName": "keep1", "status": "RUNNING", "created": True}
            self._answer(201, created)
        else:
            self._answer(404, {"type": "https://api.backend.ai/probs/not-found", "title": "Not found."})

    def do_DELETE(self) -> None:  # noqa: N802
        self._answer(200, {"stats": {}})

    def _execute(self) -> None:
        """The execute WebSocket (tests.ws_frames): the first frame's code printed, exit code 3, then the close."""
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", ws_frames.accept_of(self.headers["Sec-WebSocket-Key"]))
        self.end_headers()
        self.close_connection = True
        first = json.loads(ws_frames.read_frame(self.rfile)[2])
        EXECUTED.append(first)
        done = {"status": "finished", "console": [["stdout", f"ran {first['code']}\n"]], "exitCode": 3}
        self.wfile.write(ws_frames.frame(ws_frames.TEXT, json.dumps(done).encode()))
        self.wfile.flush()
        _, opcode, payload, _ = ws_frames.read_frame(self.rfile)
        if opcode == ws_frames.CLOSE:
            self.wfile.write(ws_frames.frame(ws_frames.CLOSE, payload))


@pytest.fixture(scope="module")
def manager() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Manager)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def env(manager: str, tmp_path: Path) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("BACKEND_", "BAI_"))}
    return {
        **keep,
        "BACKEND_ENDPOINT": manager,
        "BACKEND_ACCESS_KEY": "AKIAEXAMPLEEXAMPLE00",
        "BACKEND_SECRET_KEY": "secret",
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "COLUMNS": "100",
    }


def modules_of(env: dict[str, str], tmp_path: Path, *args: str) -> tuple[set[str], subprocess.CompletedProcess]:
    out = tmp_path / "modules.json"
    result = subprocess.run(
        [sys.executable, "-c", PROBE, str(out), *args], env=env, capture_output=True, text=True, timeout=60
    )
    return set(json.loads(out.read_text())), result


def imported(modules: set[str], prefixes: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes))


def test_version_imports_no_command_module_nor_rich(env: dict[str, str], tmp_path: Path) -> None:
    modules, result = modules_of(env, tmp_path, "--version")
    assert result.returncode == 0 and result.stdout.startswith("bai "), result.stderr
    assert imported(modules, (*NEVER, "rich", "asyncio", "bai.cli.session", "bai.cli.vfolder", "bai.client")) == []


def test_session_ls_json_needs_neither_rich_nor_asyncio(env: dict[str, str], tmp_path: Path) -> None:
    modules, result = modules_of(env, tmp_path, "session", "ls", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)[0]["name"] == "keep1"
    assert imported(modules, (*NEVER, "rich", "asyncio", "bai.cli.vfolder", "bai.cli.admin")) == []
    assert "http.client" in modules and "bai.cli.session" in modules


def test_session_ls_table_imports_only_rich_table(env: dict[str, str], tmp_path: Path) -> None:
    modules, result = modules_of(env, tmp_path, "session", "ls")
    assert result.returncode == 0, result.stderr
    assert "keep1" in result.stdout and "RUNNING" in result.stdout
    assert {"rich.console", "rich.table"} <= modules
    assert imported(modules, (*NEVER, *RICH_EXTRAS, "asyncio", "typer.rich_utils")) == []


def test_session_info_and_an_api_error_need_no_event_loop(env: dict[str, str], tmp_path: Path) -> None:
    modules, result = modules_of(env, tmp_path, "session", "info", "keep1")
    assert result.returncode == 0 and "keep1" in result.stdout, result.stderr
    assert imported(modules, (*NEVER, *RICH_EXTRAS, "asyncio", "rich.table")) == []
    modules, result = modules_of(env, tmp_path, "session", "info", "nosuch")
    assert result.returncode == 1 and "bai: error: No such session." in result.stderr
    assert imported(modules, (*NEVER, "asyncio")) == []


@pytest.mark.parametrize(
    "args",
    [
        ["session", "run", "--priority", "5", "--cluster-size", "1", "python", "-c", "print(42)"],
        ["session", "exec", "keep1", "-c", "print(42)"],
    ],
    ids=["run", "exec"],
)
def test_session_run_and_exec_stream_without_aiohttp_nor_pydantic(
    env: dict[str, str], tmp_path: Path, args: list[str]
) -> None:
    """The execute WebSocket is bai.client.wsclient's; int options are read without pydantic."""
    EXECUTED.clear()
    modules, result = modules_of(env, tmp_path, *args)
    assert (result.returncode, result.stdout) == (3, "ran print(42)\n"), result.stderr
    assert [(f["mode"], f["code"]) for f in EXECUTED] == [("query", "print(42)")]
    assert imported(modules, NEVER) == []
    assert {"asyncio", "bai.client.wsclient"} <= modules


def test_session_create_reads_numbers_without_pydantic(env: dict[str, str], tmp_path: Path) -> None:
    args = ["--priority", "7", "--cluster-size", "1", "--timeout", "30.5"]
    modules, result = modules_of(env, tmp_path, "session", "create", "--name", "keep1", *args, "python")
    assert result.returncode == 0 and "session keep1" in result.stdout and "RUNNING" in result.stdout, result.stderr
    assert imported(modules, NEVER) == []
    # a value typer_fast does not read itself goes to typer's own coercion (pydantic), with typer's message
    modules, result = modules_of(env, tmp_path, "session", "create", "--priority", "101", "python")
    assert result.returncode == 2 and "Input should be less than or equal to 100" in result.stderr
    assert "pydantic" in modules


def test_help_and_usage_errors_use_typers_rich_panels_without_markdown(env: dict[str, str], tmp_path: Path) -> None:
    modules, result = modules_of(env, tmp_path, "--help")
    assert result.returncode == 0 and "Commands" in result.stdout and "╭─" in result.stdout
    assert "typer.rich_utils" in modules
    assert imported(modules, (*NEVER, *RICH_EXTRAS)) == []
    modules, result = modules_of(env, tmp_path, "session", "nope")
    assert result.returncode == 2 and "No such command 'nope'." in result.stderr and "╭─ Error" in result.stderr
    assert imported(modules, (*NEVER, *RICH_EXTRAS, "bai.cli.vfolder")) == []


def test_the_real_rich_modules_still_load_after_typers_help(env: dict[str, str], tmp_path: Path) -> None:
    """The stand-ins are only there while typer.rich_utils imports: rich.markdown stays itself."""
    code = (
        "from bai.cli import typer_fast; typer_fast.light_rich_help()\n"
        "import typer.rich_utils as r, rich.markdown as m, rich.traceback as t\n"
        "assert m.Markdown.__module__ == 'rich.markdown' and hasattr(m, 'MarkdownIt'), m\n"
        "assert isinstance(r.Markdown('x'), m.Markdown) and r.Traceback.from_exception is not None\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "ok", result.stderr


# -- typer_fast: the same values and messages as typer's own coercion ------------------------------------------

toy = typer.Typer()


@toy.command()
def _toy(
    name: str = typer.Argument(...),
    tag: list[str] = typer.Option(None, "--tag"),
    count: int = typer.Option(None, "--count"),
    flag: bool = typer.Option(False, "--flag"),
    label: str = typer.Option(None, "--label", envvar="TOY_LABEL"),
    level: int = typer.Option(1, "--level", min=0, max=10),
    ratio: float = typer.Option(None, "--ratio"),
    share: float = typer.Option(0.5, "--share", min=0, max=1),
    dest: Path = typer.Option(Path("."), "--dest"),
    files: list[Path] = typer.Option(None, "--file"),
    folder: Path = typer.Option(None, "--folder", exists=True, file_okay=False),
) -> None:
    print(repr((name, tag, count, flag, label, level, ratio, share, dest, files, folder)))


CASES = [
    ["a"],
    ["a", "--tag", "x", "--tag", "y", "--count", "3", "--flag", "--label", ""],
    ["a", "--count", "x"],
    ["a", "--count", " 7 "],
    ["a", "--count", "-7", "--level", "+3", "--ratio", "2", "--share", "1"],
    ["a", "--count", "1_000", "--level", "7.0", "--ratio", "1e3", "--share", ".25"],
    ["a", "--ratio", "inf", "--share", " 1e-1 "],
    ["a", "--level", "11"],
    ["a", "--level", "-1"],
    ["a", "--share", "1.5"],
    ["a", "--ratio", "nan", "--share", "nan"],
    ["a", "--ratio", "1.5.5"],
    ["a", "--dest", "out/x", "--file", "a.txt", "--file", "", "--folder", "/"],
    ["a", "--folder", "/no/such/folder"],
    ["a", "--folder", "/etc/hostname"],
    ["--tag"],
    [],
]


def test_plain_values_coerce_as_typer_does(monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CliRunner()
    before = [runner.invoke(toy, case, env={"TOY_LABEL": "from-env"}) for case in CASES]
    monkeypatch.setattr(typer.core, "build_runtime_param", typer.core.build_runtime_param)  # restored after
    assert typer_fast.plain_string_values()
    after = [runner.invoke(toy, case, env={"TOY_LABEL": "from-env"}) for case in CASES]
    assert [(r.exit_code, r.output) for r in after] == [(r.exit_code, r.output) for r in before]
    assert "('a', ['x', 'y'], 3, True, ''," in after[1].output
    assert "None, -7, False, 'from-env', 3, 2.0, 1.0," in after[4].output
    assert "Invalid value for '--level'" in after[7].output and "does not exist" in after[13].output
    for case in (CASES[1], CASES[4], CASES[12]):  # read by typer_fast alone: no parameter built typer's own adapter
        command = typer.main.get_command(toy)
        command.main(case, standalone_mode=False)
        built = [p.name for p in command.params if p._runtime_param is not None and p._runtime_param.typers]
        assert built == [], case


SAMPLES = ["7", " 7 ", "+7", "-0", "007", "7.0", "7.5", "1_000", "1e3", ".5", "1.", "inf", "nan", "", "+", "1e", "٣"]


@pytest.mark.parametrize(
    ("annotation", "low", "high"), [(int, None, None), (int, 0, 100), (float, None, None), (float, 0, 1)]
)
def test_numbers_read_without_pydantic_are_what_pydantic_reads(
    annotation: type, low: int | None, high: int | None
) -> None:
    """Where typer_fast reads a number itself, typer's own adapter reads the same; where it does not, it leaves
    it to that adapter (TYPERS)."""
    from typer._adapters import build_adapter
    from typer.models import OptionInfo

    info = OptionInfo(min=low, max=high)
    adapter = build_adapter(annotation, info)
    read = 0
    for value in [*SAMPLES, 3, 0.25, True, "101", "-1", "0.75"]:
        plain = typer_fast.plain_value(annotation, info, value, None, None)
        if plain is typer_fast.TYPERS:
            continue
        read += 1
        want = adapter.validate_python(value)
        assert (type(plain), plain) == (type(want), want), value
    assert read >= 5


# -- lazy groups: every group and command is there, in the order typer listed them ---------------------------


def test_root_lists_commands_then_groups_in_their_order() -> None:
    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    names = [line.split()[1] for line in result.output.splitlines() if line.startswith("│ ") and "--" not in line]
    names = [n for n in names if n in {"node", "watcher", "client-env", "tui", *BaiGroup.lazy_groups}]
    assert names == ["node", "watcher", "client-env", "tui", *BaiGroup.lazy_groups]


def test_every_command_of_every_group_builds_and_shows_its_help() -> None:
    runner = CliRunner()
    group = typer.main.get_command(app)
    ctx = group.make_context("bai", ["--help"], resilient_parsing=True)
    for name in group.list_commands(ctx):
        sub = group.get_command(ctx, name)
        assert sub is not None, name
        for command in getattr(sub, "commands", {}):
            result = runner.invoke(app, [name, command, "--help"])
            assert result.exit_code == 0 and "Usage:" in result.output, (name, command, result.output)


def test_a_typo_still_gets_a_suggestion() -> None:
    result = CliRunner().invoke(app, ["sesion"])
    assert result.exit_code == 2 and "Did you mean 'session'?" in result.output
