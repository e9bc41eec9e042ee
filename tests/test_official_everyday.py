"""Issue 32's acceptance: both official clients (23.9.10 in `.venv-bac/`, 26.9.6 in `.venv-bac26/`), unchanged,
pass at least 95 % of the everyday list (tests/official_everyday.py), its CLI commands and its SDK calls each.

One sim node for the module (a Docker node only for the rows that need a container); the fixtures make what the
rows use (a session, a folder with files, a second user, …), then every row runs with each client, in the
list's order (later rows use what earlier ones made), and must behave as the list says: a ✓ row's output has
its `want` and no traceback nor failure mark, a ◐ / ✗ row still fails the way the list says. The list's counts
are docs/compat/everyday.md (`BAI_WRITE_GOLDEN=1` writes it; otherwise it must be what the list gives).

The CLI commands run as forks of one process that imported the client (tests/official_forks.py), the SDK
snippets in one process of the client's interpreter (`python tests/official_everyday.py`).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import official_everyday as everyday
from tests.nodeproc import ROOT, Node, admin_keys, free_port, signed_request
from tests.official_everyday import CLIENTS, FAIL, OK, PART, ROWS, Row
from tests.test_official_client import Official, official_client, official_client26

pytestmark = pytest.mark.xdist_group("official-everyday")  # one worker: one node, the rows in order

DOC = ROOT / "docs" / "compat" / "everyday.md"
USER = "evmate@ev.test"
KPUSER = "evkeys@ev.test"  # (its own user: bai shares a folder with a user's keypairs of the moment)
BAD = ("Traceback (most recent call last)", "✗", "✘", "Aborted!")  # (Aborted!: click.Abort, a refusal)
TEMPLATE = """\
api_version: "6"
kind: task_template
metadata:
  name: ev-template
spec:
  session_type: interactive
  kernel:
    image: python
  resources:
    cpu: "1"
    mem: 256m
"""


def program(client: str) -> str:
    return official_client() if client == "23" else official_client26()


def rest(node: Node, method: str, path: str, body: object = None) -> object:
    status, answer = signed_request(node, method, path, *admin_keys(node), body=body)
    assert status < 300, (method, path, status, answer)
    return answer


class Fields(dict):
    """The values rows name; those made by earlier rows are looked up when a row first names them."""

    def __init__(self, node: Node, client: str, values: dict[str, str]) -> None:
        super().__init__(values)
        self.node, self.client = node, client

    def __missing__(self, key: str) -> str:
        c, node = self.client, self.node
        if key == "bid":  # the batch session a row made
            value = node.json("session", "info", f"ev{c}-batch")["id"]
        elif key == "ngid":  # the group a row made
            (value,) = [p["id"] for p in node.json("project", "ls") if p["name"] == f"ev{c}-grp"]
        elif key in ("tpl", "tpl2"):
            value = make_template(node)
        else:
            raise KeyError(key)
        self[key] = value
        return value


def make_template(node: Node) -> str:
    """A session template's id (POST /template/session, Backend.AI's shape), or a made-up id where the node has
    no templates (the rows then say how they fail)."""
    status, answer = signed_request(
        node, "POST", "/template/session", *admin_keys(node), body={"payload": TEMPLATE, "domain": "default"}
    )
    if status < 300 and isinstance(answer, list) and answer and isinstance(answer[0], dict):
        return str(answer[0].get("id"))
    if status < 300 and isinstance(answer, dict) and "id" in answer:
        return str(answer["id"])
    return str(uuid.UUID(int=0))


class Everyday:
    """The node, and per client: its fields, its CLI (as the admin and as the second user) and its SDK."""

    def __init__(self, node: Node, base: Path) -> None:
        self.node, self.base = node, base
        made = rest(node, "POST", "/bai/admin/keypairs", {"user_id": USER})
        assert isinstance(made, dict)
        self.user_keys = {"accessKey": made["accessKey"], "secretKey": made["secretKey"]}
        preset = {"name": "ev-preset", "resource_slots": {"cpu": "1", "mem": "256m"}, "shared_memory": "64m"}
        rest(node, "POST", "/bai/presets", preset)
        users = {u["email"]: u for u in node.json("user", "ls")}
        self.uid = users[USER]["uuid"]
        self.gid = next(p["id"] for p in node.json("project", "ls") if p["name"] == "default")
        self.fields: dict[str, Fields] = {}
        self.drivers: dict[tuple[str, bool], subprocess.Popen[str]] = {}

    def for_client(self, client: str) -> Fields:
        if client in self.fields:
            return self.fields[client]
        node, c = self.node, client
        home = self.base / f"home{c}"
        (home / "dl").mkdir(parents=True)
        (home / "up.txt").write_text("uploaded by the everyday list\n")
        (home / "main.py").write_text("print('from main.py')\n")
        (home / "tpl.yaml").write_text(TEMPLATE)
        sessions = {}
        for name in (f"ev{c}-sess", f"ev{c}-run2", f"ev{c}-run3"):
            sessions[name] = rest(node, "POST", "/session", {"image": "python", "clientSessionToken": name})
        rest(node, "POST", "/folders", {"name": f"ev{c}-data", "host": "local"})
        (home / "seed" / "sub").mkdir(parents=True)
        (home / "seed" / "hello.txt").write_text("hello everyday\n")
        (home / "seed" / "sub" / "inner.txt").write_text("inner\n")
        seeder = Official(official_client(), node, home)
        out = seeder("vfolder", "upload", f"ev{c}-data", "hello.txt", "sub", "-r", "-b", str(home / "seed"))
        assert "Done" in out, out
        shared = {}
        for name in (f"ev{c}-shared", f"ev{c}-lv"):  # (one for the admin rows, one the second user leaves)
            shared[name] = rest(node, "POST", "/folders", {"name": name, "host": "local"})
            rest(node, "POST", f"/folders/{name}/share", {"permission": "ro", "emails": [USER]})
        spare = [rest(node, "POST", "/bai/admin/keypairs", {"user_id": KPUSER}) for _ in range(2)]
        now = datetime.datetime.now(datetime.UTC)
        values = {
            "c": c,
            "s": f"ev{c}-sess",
            "sid": sessions[f"ev{c}-sess"]["sessionId"],  # type: ignore[index]
            "f": f"ev{c}-data",
            "fid": str(uuid.UUID(shared[f"ev{c}-shared"]["id"])),  # type: ignore[index]
            "agent": node.agent_id,
            "ak": admin_keys(node)[0],
            "umail": USER,
            "kpmail": KPUSER,
            "uid": self.uid,
            "gid": self.gid,
            "month": now.strftime("%Y%m"),
            "today": now.strftime("%Y%m%d"),
            "port": str(free_port()),
            "nak": spare[0]["accessKey"],  # type: ignore[index]
            "sak": spare[1]["accessKey"],  # type: ignore[index]
        }
        self.fields[client] = Fields(node, client, values)
        self.fields[client].home = home  # type: ignore[attr-defined]
        return self.fields[client]

    def official(self, client: str, as_user: bool) -> Official:
        fields = self.for_client(client)
        bac = Official(program(client), self.node, fields.home)  # type: ignore[attr-defined]
        if as_user:
            bac.env["BACKEND_ACCESS_KEY"] = self.user_keys["accessKey"]
            bac.env["BACKEND_SECRET_KEY"] = self.user_keys["secretKey"]
        return bac

    def sdk(self, client: str, row: Row) -> str:
        fields = self.for_client(client)
        key = (client, row.as_user)
        driver = self.drivers.get(key)
        if driver is None or driver.poll() is not None:
            bac = self.official(client, row.as_user)
            driver = subprocess.Popen(
                [str(Path(bac.program).with_name("python")), str(Path(everyday.__file__))],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                env=bac.env, cwd=bac.cwd,
            )  # fmt: skip
            assert driver.stdout is not None
            assert json.loads(driver.stdout.readline() or "{}").get("ready"), "the SDK driver did not start"
            self.drivers[key] = driver
        code = row.code[client]
        names = set(re.findall(r"[A-Za-z_]\w*", code))
        values = {k: fields[k] for k in (names & (set(fields) | {"bid", "ngid", "tpl", "tpl2"}))}
        assert driver.stdin is not None and driver.stdout is not None
        driver.stdin.write(json.dumps({"code": code, "asynchronous": row.asynchronous, "fields": values}) + "\n")
        driver.stdin.flush()
        return json.loads(driver.stdout.readline())["out"]

    def close(self) -> None:
        for driver in self.drivers.values():
            if driver.stdin is not None:
                driver.stdin.close()
            try:
                driver.wait(10)
            except subprocess.TimeoutExpired:
                driver.kill()


@pytest.fixture(scope="module")
def ev(tmp_path_factory) -> Iterator[Everyday]:
    base = tmp_path_factory.mktemp("everyday")
    capacity = 'cpu = "64"\nmem = "128g"\nsim_apps = "echo:tcp:7000"\n'
    node = Node(base / "node", "sim", agent_config=capacity).start()
    everyday_ = Everyday(node, base)
    try:
        yield everyday_
    finally:
        everyday_.close()
        node.stop()


def run_cli(bac: Official, row: Row, client: str, fields: Fields, node: Node) -> str:
    args = [a.format_map(fields) for a in row.argv[client]]
    given = row.input.format_map(fields) if row.input is not None else None
    if not row.stream:
        try:
            return bac(*args, input=given, timeout=60)
        except subprocess.TimeoutExpired as e:
            return f"(timed out after 60 s)\n{e.output or ''}"
    trigger = None
    if row.stream != "-":  # (the session it watches ends a moment after it started: a fork starts at once)
        path = f"/session/{row.stream.format_map(fields)}"
        trigger = threading.Timer(0.8, lambda: rest(node, "DELETE", path))
        trigger.start()
    try:
        return bac(*args, timeout=2.5)
    except subprocess.TimeoutExpired as e:  # (it runs until killed: what it printed until then)
        return str(e.output or "")
    finally:
        if trigger is not None:
            trigger.join()


def check(row: Row, client: str, out: str, fields: dict) -> None:
    mark, why = row.state[client]
    want = row.want[client].format_map(fields)
    shown = f"{row.shown(client)}\n--- output ---\n{out}"
    if mark == OK:
        assert want in out, f"wanted {want!r}: {shown}"
        assert not [b for b in BAD if b in out], f"a ✓ row failed: {shown}"
    else:
        assert want in out, f"the list says {mark} ({why}), wanted {want!r}: {shown}"
        if mark == FAIL:
            assert [b for b in BAD if b in out] or want, shown


def params(kind: str, docker: bool) -> list:
    return [
        pytest.param(c, r, id=f"{c}-{r.id}", marks=[pytest.mark.docker] if docker else [])
        for c in CLIENTS
        for r in ROWS
        if r.kind == kind and r.docker == docker and c in r.clients()
    ]


@pytest.mark.parametrize(("client", "row"), params("cli", False))
def test_cli(ev: Everyday, client: str, row: Row) -> None:
    fields = ev.for_client(client)
    out = run_cli(ev.official(client, row.as_user), row, client, fields, ev.node)
    if os.environ.get("BAI_EVERYDAY_DUMP"):
        with open(os.environ["BAI_EVERYDAY_DUMP"], "a") as dump:
            dump.write(f"===== {client} {row.id}: {row.shown(client)}\n{out}\n")
    check(row, client, out, fields)


@pytest.mark.parametrize(("client", "row"), params("sdk", False))
def test_sdk(ev: Everyday, client: str, row: Row) -> None:
    fields = ev.for_client(client)
    out = ev.sdk(client, row)
    if os.environ.get("BAI_EVERYDAY_DUMP"):
        with open(os.environ["BAI_EVERYDAY_DUMP"], "a") as dump:
            dump.write(f"===== {client} {row.id}: {row.shown(client)}\n{out}\n")
    check(row, client, out, fields)


# -- the rows that need a container (a Docker node) ------------------------------------------------------------


@pytest.fixture
def docker_session(docker_node: Node) -> Iterator[tuple[str, str]]:
    """A session of a Docker kernel (name, id), destroyed after the row (no container may outlive a test)."""
    name = f"evd-{uuid.uuid4().hex[:6]}"
    answer = rest(docker_node, "POST", "/session", {"image": "python", "clientSessionToken": name})
    yield name, answer["sessionId"]  # type: ignore[index]
    signed_request(docker_node, "DELETE", f"/session/{name}", *admin_keys(docker_node))


@pytest.mark.parametrize(("client", "row"), params("cli", True) + params("sdk", True))
def test_docker_rows(docker_node: Node, docker_session: tuple[str, str], tmp_path: Path, client: str, row: Row) -> None:
    fields = {"c": client, "ds": docker_session[0], "dsid": docker_session[1]}
    bac = Official(program(client), docker_node, tmp_path)
    if row.kind == "cli":
        out = bac(*[a.format_map(fields) for a in row.argv[client]], timeout=120)
    else:
        given = "".join(f"{k} = {v!r}\n" for k, v in fields.items())
        code = f"{given}from ai.backend.client.session import Session\nwith Session() as api:\n    {row.code[client]}"
        proc = subprocess.run(
            [str(Path(bac.program).with_name("python")), "-c", code], capture_output=True, text=True,
            env=bac.env, cwd=tmp_path, timeout=120,
        )  # fmt: skip
        out = proc.stdout + proc.stderr
    check(row, client, out, fields)


# -- the list's own numbers, and the docs ---------------------------------------------------------------------


def counts(client: str, kind: str) -> dict[str, int]:
    marks = [r.state[client][0] for r in ROWS if r.kind == kind and client in r.clients()]
    return {m: marks.count(m) for m in (OK, PART, FAIL)}


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("kind", ["cli", "sdk"])
def test_at_least_95_percent_work(client: str, kind: str) -> None:
    n = counts(client, kind)
    total = sum(n.values())
    assert total >= (100 if kind == "cli" else 60), n
    assert n[OK] / total >= 0.95, n
    for row in ROWS:
        if client in row.clients() and row.state[client][0] != OK:
            assert row.state[client][1], f"{row.id}: a {row.state[client][0]} needs its why"


def test_row_ids_are_unique() -> None:
    ids = [r.id for r in ROWS]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)


def render() -> str:
    lines = [
        "# The everyday list: both official clients against bai",
        "",
        "What users do every day with the official Backend.AI client, its CLI and its SDK, in both versions users",
        "install: `backend.ai-client==23.9.10` (Python 3.11, `yarl<1.17.1`; `.venv-bac/`) and `26.9.6` (Python",
        "3.13; `.venv-bac26/`), unchanged, against one bai node. The rows are `tests/official_everyday.py`;",
        "`tests/test_official_everyday.py` runs each of them with each client and checks it does what its mark",
        "says (✓ works: its output has what is wanted and no traceback nor failure mark; ◐ works partly; ✗ fails,",
        "and the row says why). This page is written from the list (`BAI_WRITE_GOLDEN=1 .venv/bin/python -m pytest",
        "tests/test_official_everyday.py`); the test fails when it differs.",
        "",
        "The rows name what the test's fixtures made: " + ", ".join(f"`{{{k}}}` {v}" for k, v in
                                                              everyday.FIELDS.items()) + ".",
        "SDK rows run inside an open `Session()` (`api`), or an `AsyncSession()` for the rows marked async.",
        "",
        "| client | CLI ✓ / ◐ / ✗ | CLI ✓ share | SDK ✓ / ◐ / ✗ | SDK ✓ share |",
        "|---|---|---|---|---|",
    ]  # fmt: skip
    for c in CLIENTS:
        cells = []
        for kind in ("cli", "sdk"):
            n = counts(c, kind)
            cells += [f"{n[OK]} / {n[PART]} / {n[FAIL]}", f"{100 * n[OK] / sum(n.values()):.1f} %"]
        lines.append(f"| {everyday.NAMES[c]} | " + " | ".join(cells) + " |")
    for c in CLIENTS:
        for kind, title in (("cli", "CLI"), ("sdk", "SDK")):
            lines += [
                "",
                f"## {everyday.NAMES[c]}: {title}",
                "",
                "| area | command | state | why |",
                "|---|---|---|---|",
            ]
            for r in ROWS:
                if r.kind != kind or c not in r.clients():
                    continue
                mark, why = r.state[c]
                shown = r.shown(c).replace("|", "\\|")
                tag = " (async)" if r.asynchronous else ""
                who = " (as the second user)" if r.as_user else ""
                where = " (Docker)" if r.docker else ""
                why = why.replace("|", "\\|")
                lines.append(f"| {r.area} | `{shown}`{tag}{who}{where} | {mark} | {why} |")
    return "\n".join(lines) + "\n"


def test_the_docs_are_the_list() -> None:
    text = render()
    if os.environ.get("BAI_WRITE_GOLDEN") == "1":
        DOC.write_text(text)
    assert DOC.read_text() == text, "docs/compat/everyday.md differs from the list: BAI_WRITE_GOLDEN=1 writes it"
