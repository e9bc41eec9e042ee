"""`bai db copy`: a SQLite node's state moved into PostgreSQL, checked through the store API a user's manager
uses (what it lists, reads and writes next), on a real PostgreSQL server (tests/pgserver.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import psycopg
import pytest

from bai.common.dburl import locate
from bai.common.status import SessionStatus as S
from bai.node.manager.state import Store
from bai.node.manager.state.copy import CopyError, CopyReport, copy_state
from bai.node.manager.state.postgres import PgDatabase, PgStore
from bai.node.manager.state.records import (
    NewAgent,
    NewKernel,
    NewKeypair,
    NewSession,
    NewVFolder,
    PolicyFields,
    SchedulingAttempt,
)
from tests import pgserver

T0 = datetime(2024, 3, 1, 9, 0, tzinfo=UTC)
SLOTS = {"cpu": "2", "mem": "1073741824"}
LOG_MAX = 4096  # small: one log is cut, with its dropped-marker
BAI = str(Path(sys.executable).parent / "bai")


def sid(i: int) -> str:
    return f"00000000-0000-4000-8000-{i:012d}"


async def make_source(path: Path, sessions: int = 6) -> None:
    """A node's state made through the store API: sessions in several statuses (transitions, scheduling
    history), keypairs and a custom policy, folders with shares and an invitation, dotfiles, image aliases,
    logs (one cut to the bound, with its marker; one holding NUL)."""
    store = await Store.open(path, log_max_bytes=LOG_MAX)
    try:
        await store.upsert_agent(NewAgent("a1", "host-a1", "sim", "0.1", "default", SLOTS), T0)
        assert await store.save_policy(
            "gold", PolicyFields(max_concurrent_sessions=3, total_resource_slots={"cpu": "8"}, idle_cpu_pct=5.0),
            create=True, now=T0,
        )  # fmt: skip
        await store.create_keypair(NewKeypair("AK1", "s1", "alice", False, "gold"), T0)
        await store.create_keypair(NewKeypair("AK2", "s2", "bob", True, "default"), T0)
        await store.ensure_admin_keypair("AKADMIN", "admin-secret", T0)
        for i in range(sessions):
            at = T0 + timedelta(minutes=i)
            new = NewSession(
                sid(i), f"s{i}", "AK1" if i % 2 else "AK2", "python:3.11", "INTERACTIVE", SLOTS, {"A": str(i)},
                {"mounts": [], "nested": {"a": [1, None]}}, "default", at, tag=f"t{i}",
            )  # fmt: skip
            kernels = [
                NewKernel(f"{sid(i)}-sub1", "sub", 1, {"cpu": "1"}),
                NewKernel(f"{sid(i)}-main1", "main", 1, SLOTS),
            ]
            assert await store.create_session(new, kernels) is None
        waits = SchedulingAttempt(sid(0), "pending", "predicate-checks-failed", "too many", "", [{"name": "c"}])
        await store.apply_round([], [], [(sid(5), "no-available-instances", {"msg": "full"})], [waits], T0)
        await store.apply_round([], [], [], [waits], T0 + timedelta(seconds=5))
        placed = SchedulingAttempt(sid(0), "scheduled", "scheduled", "", "a1", [])
        agents = {f"{sid(i)}-main1": "a1" for i in range(4)} | {f"{sid(i)}-sub1": "a1" for i in range(4)}
        await store.apply_round(
            [(sid(i), {k: v for k, v in agents.items() if k.startswith(sid(i))}) for i in range(4)],
            [(sid(4), "pending-timeout", {"waited": 60})], [], [placed], T0 + timedelta(seconds=10),
        )  # fmt: skip
        at = T0 + timedelta(minutes=30)
        assert await store.transition(sid(1), S.PREPARING, "", now=at) is not None
        assert await store.transition(sid(2), S.CANCELLED, "user-requested", {"by": "me"}, now=at) is not None
        assert await store.transition(sid(3), S.TERMINATED, "task-done", result="SUCCESS", now=at) is not None
        assert await store.create_vfolder(NewVFolder("f1", "data", "local", "AK1", cloneable=True), T0)
        assert await store.create_vfolder(NewVFolder("f2", "models", "local", "AK2", mount_permission="ro"), T0)
        await store.share_vfolder("f1", "AK2", "ro")
        assert await store.invite("f2", "AK2", ["AK1"], "rw", T0) == ["AK1"]
        await store.put_dotfile("AK1", ".bashrc", "export A=1\n", "644")
        await store.put_dotfile("AK2", ".vimrc", "set nu\n", "600")
        assert await store.set_image_alias("py", "python:3.11")
        line = "y" * 99 + "\n"
        await store.append_logs([(f"{sid(0)}-main1", line * 30)], T0)  # 3000 bytes
        await store.append_logs([(f"{sid(0)}-main1", line * 30)], T0 + timedelta(seconds=1))  # over: cut, marked
        await store.append_logs([(f"{sid(1)}-main1", "one\n"), (f"{sid(1)}-main1", "nul\x00here\n")], T0)
        await store.append_logs([(f"{sid(2)}-main1", f"{n}\n") for n in range(50)], T0)
    finally:
        await store.close()


async def seen(store: Any) -> dict[str, Any]:
    """What a user of the manager sees of the state made by make_source."""
    ids = [s.id for s in await store.list_sessions(None, None)]
    kernel_ids = [k.id for i in ids for k in await store.kernels_of(i)]
    return {
        "sessions": await store.list_sessions(None, None),
        "kernels": [await store.kernels_of(i) for i in ids],
        "transitions": [await store.transitions_of(i) for i in ids],
        "history": [await store.scheduling_history(i) for i in ids],
        "agents": await store.agents(),
        "keypairs": await store.keypairs(active_only=False),
        "policies": await store.policies(),
        "vfolders": await store.vfolders_of(None),
        "vfolders_ak1": await store.vfolders_of("AK1"),
        "shares": await store.all_shares(),
        "invitations": await store.invitations(inviter="AK2"),
        "dotfiles": [await store.dotfiles(k) for k in ("AK1", "AK2")],
        "aliases": await store.image_aliases(),
        "logs": {k: await store.read_logs(k) for k in kernel_ids},
        "chunks": {k: await store.read_log_chunks(k) for k in kernel_ids},
        "log_state": {k: await store.log_state(k) for k in kernel_ids},
    }


def counts(url: str) -> dict[str, int]:
    """Every bai table's rows in a PostgreSQL database."""
    with psycopg.connect(url) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND tablename NOT LIKE 'bai_%'"
            )
        ]
        return {t: conn.execute(f'SELECT COUNT(*) FROM "{t}"').fetchone()[0] for t in sorted(tables)}  # type: ignore[index]


@pytest.fixture
def database() -> str:
    return pgserver.shared().new_database()


async def test_a_copied_state_reads_the_same_and_takes_new_writes_without_collisions(
    tmp_path: Path, database: str
) -> None:
    source = tmp_path / "bai.db"
    await make_source(source)
    src = await Store.open(source, log_max_bytes=LOG_MAX)
    before = await seen(src)
    await src.close()
    assert before["log_state"][f"{sid(0)}-main1"].dropped > 0  # (the case is there: a cut log)
    assert before["chunks"][f"{sid(0)}-main1"][0].data.startswith("[bai: ")
    lines: list[str] = []
    report = await copy_state(locate(str(source), tmp_path), locate(database, tmp_path), progress=lines.append)
    assert isinstance(report, CopyReport)
    assert all(t.source == t.destination for t in report.tables)
    by_name = {t.name: t for t in report.tables}
    assert by_name["sessions"].destination == 6 and by_name["session_transitions"].destination > 6
    assert by_name["resource_policies"].destination == 2  # default and gold: the source's default replaced the schema's
    assert report.nul_replaced == 1
    assert any(line.startswith("kernel_logs: ") for line in lines)

    dst = await PgStore.open_url(database, "the copy", log_max_bytes=LOG_MAX)
    try:
        after = await seen(dst)
        nul_kernel = f"{sid(1)}-main1"
        assert [t for _, t in after["logs"][nul_kernel]] == ["one\n", "nul\ufffdhere\n"]
        after["logs"][nul_kernel] = before["logs"][nul_kernel] = None
        after["chunks"][nul_kernel] = before["chunks"][nul_kernel] = None
        # NUL is 1 byte in UTF-8, U+FFFD 3: the log's kept bytes count what the destination holds
        kept_before, kept_after = before["log_state"].pop(nul_kernel), after["log_state"].pop(nul_kernel)
        assert kept_after == msgspec.structs.replace(kept_before, bytes=kept_before.bytes + 2)
        assert kept_after.bytes == len(b"one\n") + len("nul\ufffdhere\n".encode())
        with psycopg.connect(database) as conn:
            sizes = conn.execute("SELECT size, data FROM kernel_logs WHERE kernel_id = %s", (nul_kernel,)).fetchall()
        assert all(size == len(data.encode()) for size, data in sizes), sizes
        for key in before:
            assert after[key] == before[key], key
        assert dst.active_keypair("AK1") is not None and dst.active_keypair("AK2") is not None

        # new writes after the copy: numbers of their own, after the copied ones
        last_seq = max(c.seq for chunks in before["chunks"].values() if chunks for c in chunks)
        await dst.append_logs([(f"{sid(0)}-main1", "new\n")], T0 + timedelta(hours=1))
        newest = (await dst.read_log_chunks(f"{sid(0)}-main1"))[-1]
        assert (newest.data, newest.seq > last_seq) == ("new\n", True)
        new = NewSession(
            sid(99), "fresh", "AK1", "python:3.11", "INTERACTIVE", SLOTS, {}, {}, "default", T0 + timedelta(hours=1)
        )
        assert await dst.create_session(new, [NewKernel(f"{sid(99)}-main1", "main", 1, SLOTS)]) is None
        fresh = await dst.get_session(sid(99))
        assert fresh is not None and fresh.seq > max(s.seq for s in before["sessions"])
        at = T0 + timedelta(hours=2)
        assert await dst.transition(sid(0), S.PREPARING, "", now=at) is not None  # appended last, not between
        assert [t.status for t in await dst.transitions_of(sid(0))] == [
            *(t.status for t in before["transitions"][[s.id for s in before["sessions"]].index(sid(0))]),
            "PREPARING",
        ]
        await dst.apply_round([], [], [], [SchedulingAttempt(sid(5), "pending", "x", "", "", [])], at)
        assert (await dst.scheduling_history(sid(5)))[-1].outcome == "pending"
    finally:
        await dst.close()


async def test_a_destination_holding_state_is_refused_and_left_as_it_was(tmp_path: Path, database: str) -> None:
    source = tmp_path / "bai.db"
    await make_source(source)
    store = await PgStore.open_url(database, "dst")
    await store.create_keypair(NewKeypair("AKX", "s", "x"), T0)
    await store.close()
    held = counts(database)
    with pytest.raises(CopyError, match=r"already holds 1 keypairs.*copy into an empty database"):
        await copy_state(locate(str(source), tmp_path), locate(database, tmp_path), progress=lambda _: None)
    assert counts(database) == held


async def test_a_destination_a_manager_serves_now_is_refused_and_one_that_stopped_is_not(
    tmp_path: Path, database: str
) -> None:
    from bai.node.manager.state.postgres.cluster_queries import ManagerInfo

    source = tmp_path / "bai.db"
    await make_source(source)
    store = await PgStore.open_url(database, "dst")  # (a manager started on it, before any state of its own)
    await store.announce_manager(ManagerInfo("m-1", "host-1", "http://127.0.0.1:1", "in-process", 1, "0"))
    await store.close()
    with pytest.raises(CopyError, match=r"a manager serves the destination .*\(m-1 on host-1\): stop it"):
        await copy_state(locate(str(source), tmp_path), locate(database, tmp_path), progress=lambda _: None)
    assert counts(database)["sessions"] == 0
    with psycopg.connect(database, autocommit=True) as conn:  # it stopped a minute ago
        conn.execute("UPDATE bai_managers SET last_seen = clock_timestamp() - interval '1 minute'")
    report = await copy_state(locate(str(source), tmp_path), locate(database, tmp_path), progress=lambda _: None)
    copied = {t.name: t.destination for t in report.tables}
    assert copied["sessions"] == counts(database)["sessions"] == 6


async def test_counts_that_differ_fail_the_copy_naming_the_table_and_roll_it_all_back(
    tmp_path: Path, database: str
) -> None:
    source = tmp_path / "bai.db"
    await make_source(source)
    db = await PgDatabase.open_url(database, "dst")  # (the schema made, then a row of the logs lost on the way)
    await db.close()
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute(
            "CREATE FUNCTION lose_one() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF NEW.data = '7\n' THEN RETURN NULL; END IF; RETURN NEW; END $$"
        )
        conn.execute("CREATE TRIGGER lose_one BEFORE INSERT ON kernel_logs FOR EACH ROW EXECUTE FUNCTION lose_one()")
    empty = counts(database)
    with pytest.raises(CopyError) as failed:
        await copy_state(locate(str(source), tmp_path), locate(database, tmp_path), progress=lambda _: None)
    message = str(failed.value)
    assert "kernel_logs:" in message and "rolled back" in message
    src_logs = int(message.split("kernel_logs: ")[1].split(" ")[0])
    assert f"kernel_logs: {src_logs} in the source, {src_logs - 1} in the destination" in message
    assert counts(database) == empty  # the schema's own rows alone (the default policies, domain and project)
    assert {t for t, n in empty.items() if n} == {
        "resource_policies",
        "domains",
        "projects",
        "user_resource_policies",
        "project_resource_policies",
    }
    assert sum(empty.values()) == 5


async def test_a_schema_newer_than_this_bai_is_refused(tmp_path: Path, database: str) -> None:
    import sqlite3

    source = tmp_path / "bai.db"
    await make_source(source)
    with sqlite3.connect(source) as conn:
        conn.execute("PRAGMA user_version=999")
    with pytest.raises(CopyError, match="newer than this bai knows"):
        await copy_state(locate(str(source), tmp_path), locate(database, tmp_path), progress=lambda _: None)


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BAI, "db", "copy", *args], capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}
    )


async def test_the_command_copies_and_prints_a_summary_without_the_password(tmp_path: Path) -> None:
    server = pgserver.shared()
    url = server.new_database()
    name = url.rsplit("/", 1)[1]
    secret = "pw-s3cret-never-shown"
    server.sql(f"CREATE ROLE copier LOGIN SUPERUSER PASSWORD '{secret}'") if not _role_exists(server) else None
    source = tmp_path / "bai.db"
    await make_source(source)
    dst = f"postgresql://copier@127.0.0.1:{server.port}/{name}?password_env=BAI_TEST_PW"
    done = run_cli(str(source), dst, env={"BAI_TEST_PW": secret})
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert secret not in out
    assert "kernel_logs: " in out  # a progress line
    rows = {line.split()[0]: line.split()[1:] for line in done.stdout.splitlines() if len(line.split()) == 3}
    assert rows["sessions"] == ["6", "6"] and rows["keypairs"] == [str(n := counts(url)["keypairs"]), str(n)]
    assert (
        f'point the manager at it with `[manager] database = "postgresql://copier@127.0.0.1:{server.port}/{name}' in out
    )
    assert "?password_env=BAI_TEST_PW" in out
    assert counts(url)["sessions"] == 6
    again = run_cli(str(source), dst, env={"BAI_TEST_PW": secret})  # now it holds state: refused
    assert again.returncode == 1 and again.stderr.startswith("bai: error: the destination")
    assert "already holds 6 sessions" in again.stderr and secret not in again.stdout + again.stderr


def _role_exists(server: pgserver.PostgresServer) -> bool:
    with psycopg.connect(server.admin_url) as conn:
        return conn.execute("SELECT 1 FROM pg_roles WHERE rolname = 'copier'").fetchone() is not None


async def test_the_command_fails_in_one_line_for_an_unreachable_server_or_a_missing_source(tmp_path: Path) -> None:
    source = tmp_path / "bai.db"
    await make_source(source)
    (tmp_path / "pw").write_text("hunter2-secret\n")
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # (nothing listens there once closed)
    done = run_cli(str(source), f"postgresql://u@127.0.0.1:{port}/db?password_file={tmp_path / 'pw'}")
    assert done.returncode == 1, done.stdout + done.stderr
    err = done.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bai: error: ") and "cannot be reached" in err[0]
    assert "hunter2" not in done.stdout + done.stderr and "Traceback" not in done.stderr
    missing = run_cli(str(tmp_path / "nope.db"), pgserver.shared().new_database())
    assert missing.returncode == 1 and missing.stderr.strip() == (
        f"bai: error: the source sqlite://{tmp_path / 'nope.db'} does not exist"
    )
    bad = run_cli(str(source), "postgresql://u:pw@host/db")
    assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1 and ":pw@" not in bad.stderr


async def test_a_source_in_use_is_copied_from_one_snapshot(tmp_path: Path, database: str) -> None:
    source = tmp_path / "bai.db"
    await make_source(source)
    node = await Store.open(source)  # a node holding it open
    try:
        lines: list[str] = []
        report = await copy_state(locate(str(source), tmp_path), locate(database, tmp_path), progress=lines.append)
        assert report.source_in_use and "in use" in lines[0]
        assert {t.name: t.destination for t in report.tables}["sessions"] == 6
    finally:
        await node.close()


async def test_copy_speed_on_many_log_rows(tmp_path: Path, database: str) -> None:
    """100k log rows: the figure the report gives (rows/s), and that they all arrive."""
    source = tmp_path / "bai.db"
    store = await Store.open(source, log_max_bytes=1 << 30)
    for b in range(20):
        await store.append_logs([(f"k{i % 50}", f"line {b} {i} " + "x" * 60 + "\n") for i in range(5000)], T0)
    await store.close()
    started = time.monotonic()
    report = await copy_state(locate(str(source), tmp_path), locate(database, tmp_path), progress=lambda _: None)
    took = time.monotonic() - started
    logs = {t.name: t for t in report.tables}["kernel_logs"]
    assert logs.source == logs.destination == 100_000
    print(
        f"\ncopied {report.rows} rows in {took:.2f} s ({report.rows / took:,.0f} rows/s; "
        f"the copy itself {report.seconds:.2f} s)"
    )
