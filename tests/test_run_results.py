"""Under misuse: a run's exit code and result are the session's, and bad execute requests are refused
(a 400, or an error frame) while the kernel's runner survives whatever reaches it."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.nodeproc import Node, admin_keys, signed_request, wait_status


def ls_row(node: Node, name: str) -> list[str]:
    table = node.cli("session", "ls", "--all", check=True).stdout
    rows = [line.split() for line in table.splitlines() if line.split()[:1] == [name]]
    assert len(rows) == 1, table
    return rows[0]


def execute(node: Node, session_id: str, body: object) -> tuple[int, Any]:
    return signed_request(node, "POST", f"/session/{session_id}", *admin_keys(node), body=body)


def test_a_query_run_that_exits_records_its_code_and_result(node: Node) -> None:
    name = f"exit3-{node.backend}"
    result = node.cli("session", "run", "python", "--name", name, "-c", "raise SystemExit(3)")
    assert result.returncode == 3, result.stderr
    info = wait_status(node, name, "TERMINATED")
    assert info["statusInfo"] == "user-requested"  # `run` destroyed it afterwards...
    assert (info["exitCode"], info["result"]) == (3, "FAILURE")  # ...and the run's outcome stays
    assert info["kernels"][0]["exitCode"] == 3
    row = ls_row(node, name)
    assert "3" in row and "FAILURE" in row
    text = node.cli("session", "info", name, check=True).stdout
    assert "Exit code   3" in text and "Result      FAILURE" in text


def test_the_last_run_of_a_kept_session_is_its_outcome(node: Node) -> None:
    name = f"kept-{node.backend}"
    ok = node.cli("session", "run", "python", "--name", name, "--keep", "-c", "x = 1")
    assert ok.returncode == 0, ok.stderr
    try:
        info = node.json("session", "info", name)
        assert (info["status"], info["exitCode"], info["result"]) == ("RUNNING", 0, "SUCCESS")
        assert "SUCCESS" in ls_row(node, name)
        failed = node.cli("session", "run", "python", "--name", name, "--keep", "-c", "x += 1\nraise ValueError(x)")
        assert failed.returncode == 1 and "ValueError: 2" in failed.stderr
        info = node.json("session", "info", name)
        assert (info["status"], info["exitCode"], info["result"]) == ("RUNNING", 1, "FAILURE")
        batch = node.cli("session", "run", "python", "--name", name, "--keep", "--", "sh", "-c", "exit 0")
        assert batch.returncode == 0
        assert node.json("session", "info", name)["result"] == "SUCCESS"
        node.cli("session", "run", "python", "--name", name, "--keep", "--", "sh", "-c", "exit 7")
    finally:
        node.cli("session", "destroy", name, check=True)
    info = wait_status(node, name, "TERMINATED")
    assert (info["statusInfo"], info["exitCode"], info["result"]) == ("user-requested", 7, "FAILURE")


@pytest.fixture
def kept(node: Node):
    name = f"misuse-{node.backend}-{secrets.token_hex(3)}"
    node.cli("session", "create", "python", "--name", name, check=True)
    info = node.json("session", "info", name)
    yield info["id"]
    node.cli("session", "destroy", name, check=True)


def _run(node: Node, session_id: str, body: dict[str, Any]) -> dict[str, Any]:
    """Execute over HTTP and poll until the run finishes; the combined console and the exit code."""
    run_id = secrets.token_hex(4)
    console: list[list[str]] = []
    status, reply = execute(node, session_id, {**body, "runId": run_id})
    for _ in range(100):
        assert status == 200, reply
        console += reply["result"]["console"]
        if reply["result"]["status"] == "finished":
            return {"console": console, "exitCode": reply["result"]["exitCode"]}
        status, reply = execute(node, session_id, {"mode": "continue", "runId": run_id})
    raise AssertionError("the run did not finish")


def _text(run: dict[str, Any], kind: str) -> str:
    return "".join(text for k, text in run["console"] if k == kind)


BAD_BODIES: list[object] = [
    {"mode": "batch", "code": "", "options": {"exec": "echo a\0b"}},
    {"mode": "batch", "code": "echo a\0b"},
    {"mode": "batch", "options": {"exec": ["ls"]}},
    {"mode": "batch", "options": "ls"},
    {"mode": "query", "code": 5},
    {"mode": "query", "code": ["print(1)"]},
    {"mode": 1, "code": "print(1)"},
    {"mode": "frobnicate", "code": "print(1)"},
    {"code": "print(1)"},
    {"mode": "query", "code": "print(1)", "runId": 5},
    {"mode": "query", "code": "print('\ud800')"},
    {"mode": "batch", "options": {"exec": "echo \ud800"}},
    {"mode": "input", "code": "\udcff"},
    ["query", "print(1)"],
]


def test_bad_execute_requests_are_400_and_the_kernel_lives_on(node: Node, kept: str) -> None:
    """Each bad request in turn at one kernel: each a 400, and the kernel's state there after every one."""
    assert _run(node, kept, {"mode": "query", "code": "state = 'kept'"})["exitCode"] == 0
    for body in BAD_BODIES:
        status, reply = execute(node, kept, body)
        assert status == 400, (body, reply)
        assert reply["type"].endswith("invalid-api-params") and reply["title"], (body, reply)
        run = _run(node, kept, {"mode": "query", "code": "print(state)"})
        assert (_text(run, "stdout"), run["exitCode"]) == ("kept\n", 0), body


def test_odd_input_reaching_the_runner_ends_the_run_not_the_kernel(node: Node, kept: str) -> None:
    assert _run(node, kept, {"mode": "query", "code": "state = 'kept'"})["exitCode"] == 0
    nul = _run(node, kept, {"mode": "query", "code": "print(1)\0"})
    assert nul["exitCode"] == 1 and "null" in _text(nul, "stderr")
    bad_shell = _run(node, kept, {"mode": "batch", "options": {"exec": "echo ((; exit 9"}})
    assert bad_shell["exitCode"] != 0
    big = _run(node, kept, {"mode": "query", "code": "print(len('" + "x" * 4_000_000 + "'))"})
    assert (_text(big, "stdout"), big["exitCode"]) == ("4000000\n", 0)
    run = _run(node, kept, {"mode": "query", "code": "print(state)"})
    assert (_text(run, "stdout"), run["exitCode"]) == ("kept\n", 0)
    assert node.json("session", "info", kept)["status"] == "RUNNING"


async def test_a_bad_first_frame_gets_an_error_frame(node: Node, kept: str) -> None:
    from bai.client import Client
    from bai.common.credentials import Credentials

    access, secret = admin_keys(node)
    async with Client(Credentials(node.endpoint, access, secret)) as c:
        for first in (
            {"mode": "batch", "options": {"exec": "echo a\0b"}},
            {"mode": "query", "code": 5},
            {"mode": "batch", "options": {"exec": 5}},
            {"mode": ["query"]},
        ):
            async with c.execute(kept) as stream:
                await stream.start(first["mode"], first.get("code", ""), first.get("options"))  # type: ignore[arg-type]
                frames = [f async for f in stream.frames()]
            assert [f["status"] for f in frames] == ["error"], (first, frames)
            assert frames[0]["msg"]
        async with c.execute(kept) as stream:
            await stream.start("query", "print('alive')")
            frames = [f async for f in stream.frames()]
        assert frames[-1]["status"] == "finished" and frames[-1]["exitCode"] == 0


def test_the_dashboard_row_and_views_show_the_outcome() -> None:
    from rich.console import Console

    from bai.node.manager.http.dashboard import dashboard_row
    from bai.tui.views import render_detail, run_outcome
    from tests.records import a_kernel, a_session

    now = datetime.now(UTC).isoformat()
    row = a_session(
        name="n", access_key="AK", status="TERMINATED", status_info="user-requested", status_changed=now,
        created_at=now, terminated_at=now, result="FAILURE",
    )  # fmt: skip
    kernel = a_kernel(
        agent_id="a", status="TERMINATED", status_changed=now, created_at=now, terminated_at=now, exit_code=3
    )
    item = dashboard_row(row, [kernel])
    assert (item["exitCode"], item["result"]) == (3, "FAILURE")
    assert run_outcome(item) == "exit 3 FAILURE"
    assert run_outcome({**item, "exitCode": None, "result": "UNDEFINED"}) == ""
    detail = {**item, "kernels": [], "mounts": [], "transitions": []}
    console = Console(width=100, record=True)
    console.print(render_detail(detail, None, datetime.now(UTC)))
    text = console.export_text()
    assert "Exit code" in text and "Result" in text and "FAILURE" in text
