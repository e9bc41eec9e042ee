"""`bai user|project|domain|scaling-group …` against a real node (simulated kernels): an admin builds a team (a
domain, a project with limits, a user with a password), the lists show it, a user's keypair creates sessions only in
its own projects, membership and deactivation change what the user may do at once, and bad input is a message and a
non-zero exit, never a traceback. The project table's layout is a golden file (tests/cli_tables_goldens/)."""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.nodeproc import Node

PASSWORD = "correct-horse-battery"  # never printed by any command
GOLDENS = Path(__file__).parent / "cli_tables_goldens"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    n = Node(tmp_path_factory.mktemp("teams"), "sim").start()
    yield n
    n.stop()


def ok(node: Node, *args: str, input: str | None = None, as_keypair: dict[str, str] | None = None) -> str:
    done = node.cli(*args, input=input, as_keypair=as_keypair)
    assert done.returncode == 0, f"bai {' '.join(args)}: {done.stdout}\n{done.stderr}"
    assert PASSWORD not in done.stdout + done.stderr
    return done.stdout


def refused(node: Node, *args: str, input: str | None = None, as_keypair: dict[str, str] | None = None) -> str:
    """The command fails as a user sees it: a non-zero exit and a message, no traceback; its stderr."""
    done = node.cli(*args, input=input if input is not None else "", as_keypair=as_keypair)
    assert done.returncode != 0, f"bai {' '.join(args)} should have failed:\n{done.stdout}"
    assert "Traceback" not in done.stderr and done.stderr.strip(), done.stderr
    assert PASSWORD not in done.stdout + done.stderr
    return done.stderr


def team(node: Node) -> tuple[str, str, str]:
    """A new domain with a project of 8 GPUs and 16 cores and a user in it: (domain, project, email)."""
    tag = secrets.token_hex(3)
    domain, project, email = f"lab-{tag}", f"ml-{tag}", f"alice-{tag}@lab.example"
    ok(node, "domain", "add", domain, "--limit", "cpu=64", "--description", "the lab")
    ok(node, "project", "add", project, "--domain", domain, "--limit", "cuda.device=8", "--limit", "cpu=16,mem=64g")
    ok(node, "user", "add", email, "--password-stdin", "--domain", domain, "--project", project, "--name", "Alice",
       input=PASSWORD + "\n")  # fmt: skip
    return domain, project, email


def test_an_admin_builds_a_team_and_the_lists_show_it(node: Node) -> None:
    domain, project, email = team(node)
    # domains: with their limit
    row = next(line for line in ok(node, "domain", "ls").splitlines() if line.startswith(domain + " "))
    assert "cpu 64" in row and "the lab" in row and "yes" in row
    # projects: sessions and, per capped slot, what is used of the cap
    row = next(line for line in ok(node, "project", "ls", "--domain", domain).splitlines() if line.startswith(project))
    assert domain in row and "cuda.device 0/8" in row and "cpu 0/16" in row and "mem 0 B/64 GiB" in row
    assert "default" not in ok(node, "project", "ls", "--domain", domain)  # only that domain's
    shown = ok(node, "project", "show", project, "--domain", domain)
    assert f"Members   {email}" in shown and "Limits    cpu 16, cuda.device 8, mem 64 GiB" in shown
    # users: in the domain, with the project; no keypair yet, and how to make one
    row = next(line for line in ok(node, "user", "ls", "--domain", domain).splitlines() if line.startswith(email))
    assert f" {domain} " in row and project in row and " user " in row and "active" in row
    assert f"bai keypair create --user {email}" in ok(node, "user", "show", email)
    assert [u["email"] for u in node.json("user", "ls", "--project", project, "--domain", domain)] == [email]

    # --json: what scripts read
    user = node.json("user", "show", email)
    assert (user["domain"], user["projects"], user["fullName"], user["role"]) == (domain, [project], "Alice", "user")
    assert "password" not in json.dumps(user).lower()
    (listed,) = [p for p in node.json("project", "ls") if p["name"] == project]
    assert listed["cap"] == {"cpu": "16", "cuda.device": "8", "mem": str(64 << 30)} and listed["sessions"] == 0
    assert node.json("project", "show", project, "--domain", domain)["members"] == [email]
    assert domain in [d["name"] for d in node.json("domain", "ls")]

    # a change shows at once
    ok(node, "project", "update", project, "--domain", domain, "--limit", "cuda.device=4")
    assert node.json("project", "show", project, "--domain", domain)["cap"] == {"cuda.device": "4"}
    ok(node, "user", "update", email, "--role", "admin")
    assert node.json("user", "show", email)["role"] == "admin"


def test_a_users_keypair_creates_sessions_only_in_its_own_projects(node: Node) -> None:
    domain, project, email = team(node)
    other = f"other-{secrets.token_hex(3)}"
    ok(node, "project", "add", other, "--domain", domain)
    keys = node.json("keypair", "create", "--user", email)
    assert node.json("user", "show", email)["accessKeys"] == [keys["accessKey"]]

    # (half a core each: the simulated agent has 2)
    ok(node, "session", "create", "sim", "--name", "in-mine", "--project", project, "--cpu", "0.5", as_keypair=keys)
    (s,) = [s for s in node.json("session", "ls", as_keypair=keys) if s["name"] == "in-mine"]
    assert (s["project"], s["domain"]) == (project, domain)
    row = next(line for line in ok(node, "project", "ls").splitlines() if line.startswith(project))
    assert "cpu 0.5/16" in row and " 1 " in row  # its session holds half a core of the project's 16
    ran = ok(node, "session", "run", "sim", "--project", project, "--cpu", "0.5", "-c", "print('hi')", as_keypair=keys)
    assert ran == "hi\n"

    # not a member of the other project: refused, saying so
    why = refused(node, "session", "create", "sim", "--name", "in-other", "--project", other, as_keypair=keys)
    assert f"no project '{other}' of yours" in why
    why = refused(node, "session", "run", "sim", "--project", other, "-c", "print(1)", as_keypair=keys)
    assert f"no project '{other}' of yours" in why
    # nor of another domain
    why = refused(node, "session", "create", "sim", "--name", "in-dflt", "--project", "default", "--domain", "default",
                  as_keypair=keys)  # fmt: skip
    assert "you belong to domain" in why

    # a member now: it may; taken out again: it may not
    out = ok(node, "project", "members", "add", other, email, "--domain", domain)
    assert email in out and "1 member(s)" in out
    ok(node, "session", "create", "sim", "--name", "in-other", "--project", other, "--cpu", "0.5", as_keypair=keys)
    assert node.json("user", "show", email)["projects"] == sorted([project, other])
    out = ok(node, "project", "members", "rm", other, email, "--domain", domain)
    assert "0 member(s)" in out
    refused(node, "session", "create", "sim", "--name", "in-other-2", "--project", other, as_keypair=keys)
    for name in ("in-mine", "in-other"):
        ok(node, "session", "destroy", name, as_keypair=keys)


def test_a_deactivated_user_cannot_sign_in_and_an_activated_one_can(node: Node) -> None:
    _, _, email = team(node)
    keys = node.json("keypair", "create", "--user", email)
    ok(node, "whoami", as_keypair=keys)
    assert "no longer sign" in ok(node, "user", "deactivate", email)
    assert "Authentication failed" in refused(node, "session", "ls", as_keypair=keys)
    assert node.json("user", "show", email)["status"] == "inactive"
    ok(node, "user", "activate", email)
    ok(node, "session", "ls", as_keypair=keys)
    # deleted (Backend.AI's delete): stopped at once too; purged: gone
    assert "is deleted" in ok(node, "user", "rm", email)
    assert "Authentication failed" in refused(node, "whoami", as_keypair=keys)
    assert "purged" in ok(node, "user", "rm", email, "--purge")
    assert "no user" in refused(node, "user", "show", email)


def test_bad_input_is_a_message_and_a_non_zero_exit(node: Node) -> None:
    domain, project, _ = team(node)
    assert "email must be an address" in refused(node, "user", "add", "not-an-email", "--password", PASSWORD)
    assert "8 to 1024 characters" in refused(node, "user", "add", "bob@lab.example", "--password", "short")
    assert "8 to 1024 characters" in refused(node, "user", "add", "bob@lab.example", "--password-stdin",
                                            input="short\n")  # fmt: skip
    why = refused(node, "user", "add", "bob@lab.example", "--password", PASSWORD, "--domain", domain,
                  "--project", "no-such")  # fmt: skip
    assert "no project 'no-such'" in why
    assert "no password" in refused(node, "user", "add", "bob@lab.example")  # stdin is no terminal: not asked
    assert "no project" in refused(node, "project", "show", "no-such-project")
    assert f"domain {domain}" in ok(node, "project", "show", project)  # of another domain: found where it is
    assert "SLOT=AMOUNT" in refused(node, "project", "add", "p-bad", "--limit", "cpu")
    assert "no domain" in refused(node, "project", "add", "p-bad", "--domain", "no-such-domain")
    assert "one of --domain, --project or --keypair" in refused(node, "scaling-group", "allow", "default")
    assert "no scaling group" in refused(node, "scaling-group", "allow", "no-such-group", "--domain", domain)
    assert "--status" in refused(node, "user", "ls", "--status", "sleepy")
    # nothing was made of the refused requests
    assert "bob@lab.example" not in [u["email"] for u in node.json("user", "ls")]


def test_a_scaling_group_open_to_a_project_is_closed_to_the_others(node: Node) -> None:
    domain, project, email = team(node)
    keys = node.json("keypair", "create", "--user", email)
    said = ok(node, "scaling-group", "allow", "default", "--project", f"{domain}/{project}")
    try:
        assert f"open to: project {project}" in said
        (group,) = [g for g in node.json("scaling-group", "ls") if g["name"] == "default"]
        assert (group["open"], group["projects"]) == (False, [project])
        # the project's member may use it; the admin, in the default project, may not
        ok(node, "session", "create", "sim", "--name", "sg-member", "--project", project, "--cpu", "0.5",
           as_keypair=keys)  # fmt: skip
        why = refused(node, "session", "create", "sim", "--name", "sg-admin", "--timeout", "10")
        assert "not open to project default" in why
        again = ok(node, "scaling-group", "allow", "default", "--project", f"{domain}/{project}")
        assert "no change" in again
    finally:
        said = ok(node, "scaling-group", "disallow", "default", "--project", f"{domain}/{project}")
    assert "open to: everyone" in said
    ok(node, "session", "destroy", "sg-member", as_keypair=keys)


def test_domains_and_projects_are_deactivated_then_purged(node: Node) -> None:
    tag = secrets.token_hex(3)
    domain, project = f"tmp-{tag}", f"tmp-{tag}"
    ok(node, "domain", "add", domain)
    ok(node, "project", "add", project, "--domain", domain)
    assert "deactivated" in ok(node, "project", "deactivate", project, "--domain", domain)
    assert node.json("project", "show", project, "--domain", domain)["isActive"] is False
    ok(node, "project", "activate", project, "--domain", domain)
    assert node.json("project", "show", project, "--domain", domain)["isActive"] is True
    assert "purged" in ok(node, "project", "rm", project, "--domain", domain, "--purge")
    assert project not in [p["name"] for p in node.json("project", "ls")]
    ok(node, "domain", "update", domain, "--limit", "cpu=4", "--description", "for a while")
    (d,) = [d for d in node.json("domain", "ls") if d["name"] == domain]
    assert (d["totalResourceSlots"], d["description"]) == ({"cpu": "4"}, "for a while")
    assert "deactivated" in ok(node, "domain", "deactivate", domain)
    assert [d["isActive"] for d in node.json("domain", "ls") if d["name"] == domain] == [False]
    assert "purged" in ok(node, "domain", "rm", domain, "--purge")
    assert domain not in [d["name"] for d in node.json("domain", "ls")]


def test_the_password_prompt_asks_twice_and_shows_nothing(node: Node) -> None:
    """On a terminal, without --password: asked twice, hidden; the two must match."""
    import fcntl
    import pty
    import select
    import subprocess
    import sys
    import termios
    import time

    domain, _, _ = team(node)
    email = f"carol-{secrets.token_hex(3)}@lab.example"
    leader, follower = pty.openpty()

    def own_terminal() -> None:  # the pty is the CLI's controlling terminal (/dev/tty), where getpass asks
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen([sys.executable, "-m", "bai", "user", "add", email, "--domain", domain],
                            stdin=follower, stdout=subprocess.PIPE, stderr=follower, env=node.env, cwd=node.base,
                            preexec_fn=own_terminal)  # fmt: skip
    os.close(follower)
    seen = b""

    def read_until(text: bytes) -> None:
        nonlocal seen
        deadline = time.monotonic() + 30
        while text not in seen and time.monotonic() < deadline:
            if select.select([leader], [], [], 0.5)[0]:
                try:
                    seen += os.read(leader, 1024)
                except OSError:  # the CLI exited
                    break
        assert text in seen, seen

    try:
        read_until(b"Password: ")  # (the blank: getpass has turned echo off)
        os.write(leader, PASSWORD.encode() + b"\n")
        read_until(b"Repeat for confirmation: ")
        os.write(leader, PASSWORD.encode() + b"\n")
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
        os.close(leader)
    assert proc.returncode == 0, seen
    assert f"user {email} added".encode() in out
    assert PASSWORD.encode() not in seen + out  # not echoed, not printed
    assert node.json("user", "show", email)["status"] == "active"


def test_the_project_table_fits_80_columns() -> None:
    """`bai project ls` on 80 columns: name, domain and used/cap stay whole; -o wide adds the id."""
    from rich.console import Console

    from bai.cli.output import projects_table

    items = [
        {"id": "1121be7c-30db-5117-8aa0-152e6484b69d", "name": "default", "domain": "default", "isActive": True,
         "description": "the first project", "resourcePolicy": "default", "sessions": 0, "occupied": {}, "cap": {}},
        {"id": "c924bac7-568c-42b4-96a4-63a7e6518703", "name": "ml", "domain": "lab", "isActive": True,
         "description": "", "resourcePolicy": "default", "sessions": 3,
         "occupied": {"cuda.device": "8", "cpu": "6", "mem": str(24 << 30)},
         "cap": {"cuda.device": "8", "cpu": "16", "mem": str(64 << 30)}},
        {"id": "032d4534-d650-43dd-9fe5-3718e984119d", "name": "vision", "domain": "lab", "isActive": False,
         "description": "", "resourcePolicy": "default", "sessions": 1, "occupied": {"cpu": "2"},
         "cap": {"cuda.device": "2"}},
    ]  # fmt: skip
    for wide, name in ((False, "project-ls-80"), (True, "project-ls-wide-80")):
        table = projects_table(items, wide=wide, width=80)  # -o wide: as long as its lines need
        console = Console(width=max(80, table.width or 0), no_color=True, force_terminal=False)
        with console.capture() as captured:
            console.print(table, crop=False)
        text = "".join(line.rstrip() + "\n" for line in captured.get().splitlines())
        path = GOLDENS / f"{name}.txt"
        if os.environ.get("BAI_UPDATE_GOLDENS"):
            path.write_text(text)
        assert text == path.read_text(), f"{name} differs (BAI_UPDATE_GOLDENS=1 rewrites it):\n{text}"
        if not wide:
            assert all(len(line) <= 80 for line in text.splitlines())
            assert "cuda.device 8/8" in text and "cpu 2/unlimited" in text
