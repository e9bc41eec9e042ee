"""A full disk on the node: writes are `507 Insufficient Storage` saying which storage is full and that
nothing was changed; reads keep working; background writers warn once and carry on; once space is
freed, writes work again and the database is intact (every earlier row there, integrity_check ok).

For real: the node's state folder (its database, and the `local` vfolder host under it) is a small
tmpfs, filled up to the last block by a filler file. Mounting needs root (CI runs the tests as root).
"""

from __future__ import annotations

import asyncio
import errno
import http.client
import json
import os
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode, urlsplit

import pytest

from bai.node.manager.services.diskfull import (
    DATABASE,
    StorageFull,
    insufficient_storage,
    is_disk_full,
    storage_of,
)
from bai.node.manager.state.errors import StorageFull as StateStorageFull
from bai.node.manager.state.sqlite.db import sqlite_full
from tests.nodeproc import Node, admin_keys, signed_request, wait_status

PROBLEM = "https://api.backend.ai/probs/insufficient-storage"


# -- the mapping, without a node ------------------------------------------------------------------------


def test_disk_full_errors_are_recognised() -> None:
    assert is_disk_full(StateStorageFull("the node's database is on a full disk"))
    assert sqlite_full(sqlite3.OperationalError("database or disk is full"))  # (the state layer's to know)
    assert not sqlite_full(sqlite3.OperationalError("database is locked"))
    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert is_disk_full(StorageFull("virtual folder host 'local'"))
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not is_disk_full(sqlite3.OperationalError("database is locked"))
    assert not is_disk_full(ValueError("database or disk is full"))


def test_problem_says_which_storage_and_that_nothing_changed() -> None:
    p = insufficient_storage(StateStorageFull("database or disk is full"))
    assert (p.status, p.slug, p.title) == (507, "insufficient-storage", "Insufficient storage.")
    assert DATABASE in p.msg and "nothing was changed" in p.msg
    with pytest.raises(StorageFull) as caught, storage_of("virtual folder host 'local'"):
        raise OSError(errno.EDQUOT, "Disk quota exceeded")
    p = insufficient_storage(caught.value)
    assert p.status == 507 and "virtual folder host 'local'" in p.msg and "quota" in p.msg
    with pytest.raises(PermissionError), storage_of("virtual folder host 'local'"):
        raise PermissionError(errno.EACCES, "Permission denied")  # not a full disk: passes through


# -- the store on a full disk ----------------------------------------------------------------------------


@pytest.fixture
def full_dir(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "small"
    mount_tmpfs(folder, "2m")
    try:
        yield folder
    finally:
        unmount(folder)


def test_store_write_on_full_disk_changes_nothing(full_dir: Path) -> None:
    """A write fails with SQLITE_FULL as it is (at COMMIT, or mid-statement once the page cache spills:
    SQLite has rolled back already there, and a second ROLLBACK must not hide the error); the database is
    as before, and writes work once space is freed."""
    import asyncio

    from bai.node.manager.state import Store

    async def go() -> None:
        store = await Store.open(full_dir / "bai.db")
        try:
            await store.put_dotfile("AK", ".before", "kept", "644")
            filler = fill(full_dir)
            for data in ("small", "x" * (8 << 20)):  # at COMMIT; mid-statement (more than the page cache)
                with pytest.raises(StateStorageFull) as caught:  # (the state layer's, raised from SQLite's)
                    await store.put_dotfile("AK", ".during", data, "644")
                assert is_disk_full(caught.value) and isinstance(caught.value.__cause__, sqlite3.Error), caught.value
                assert [d.path for d in await store.dotfiles("AK")] == [".before"]
            filler.unlink()
            await store.put_dotfile("AK", ".after", "ok", "644")
            assert [d.path for d in await store.dotfiles("AK")] == [".after", ".before"]
            assert await store.db.run(lambda c: c.execute("PRAGMA integrity_check").fetchone()[0]) == "ok"
        finally:
            await store.close()

    asyncio.run(go())


# -- a node on a full disk -------------------------------------------------------------------------------


def mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if out.returncode != 0:
        pytest.fail(
            f"this test mounts a small tmpfs to fill it up, which needs root (CI runs as root): "
            f"`mount -t tmpfs` failed ({out.returncode}): {out.stderr.decode(errors='replace').strip()}"
        )


def unmount(path: Path) -> None:
    if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(folder: Path) -> Path:
    """Write a filler file in `folder` until its file system has not one block left."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        chunk = 1 << 20
        while chunk:
            try:
                if os.write(fd, b"\0" * chunk) < chunk:
                    chunk //= 2
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
                chunk //= 2
    finally:
        os.close(fd)
    assert os.statvfs(folder).f_bavail == 0
    return filler


@pytest.fixture
def full_node(tmp_path: Path) -> Iterator[Node]:
    base = tmp_path / "node"
    state = base / "state"
    mount_tmpfs(state, "8m")
    # log output of kernels goes to the database too: let it be read back promptly
    node = Node(base, "local", extra_config="[link]\nheartbeat_interval = 0.5\n")
    try:
        node.start()
        yield node
    finally:
        node.stop()
        unmount(state)


def assert_full(status: int, body, where: str) -> None:
    assert status == 507, (status, body)
    assert body["type"] == PROBLEM and body["title"] == "Insufficient storage.", body
    assert where in body["msg"] and "nothing was changed" in body["msg"], body


def tus_patch(node: Node, grant: dict, data: bytes, offset: int = 0) -> tuple[int, dict | None]:
    """Send an upload's bytes to the token-bound TUS endpoint, as the client does."""
    host = urlsplit(node.endpoint).netloc
    conn = http.client.HTTPConnection(host, timeout=30)
    try:
        path = f"{urlsplit(grant['url']).path}?{urlencode({'token': grant['token']})}"
        headers = {
            "Upload-Offset": str(offset),
            "Content-Type": "application/offset+octet-stream",
            "Tus-Resumable": "1.0.0",
        }
        conn.request("PATCH", path, body=data, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
        return resp.status, json.loads(raw) if raw else None
    finally:
        conn.close()


def test_full_disk_is_507_reads_work_nothing_is_corrupted(full_node: Node, tmp_path: Path) -> None:
    node = full_node
    ak, sk = admin_keys(node)

    def api(method: str, path: str, body: object = None):
        return signed_request(node, method, path, ak, sk, body)

    # what is there before the disk fills up
    user = node.json("keypair", "create", "--user", "before-full")
    node.cli("vfolder", "create", "keep", check=True)
    (tmp_path / "notes.txt").write_text("kept\n")
    node.cli("vfolder", "upload", "keep", str(tmp_path / "notes.txt"), check=True)
    status, made = api("POST", "/session", {"image": "python", "name": "before", "enqueueOnly": True})
    assert status in (200, 201), made
    wait_status(node, "before", "RUNNING")
    keypairs = api("GET", "/bai/admin/keypairs")[1]["items"]
    folders_dir = node.state_dir / "vfolders"
    folder_dirs = sorted(p.name for p in folders_dir.iterdir())

    filler = fill(node.state_dir)

    # a vfolder upload: 507 naming the folder host (through the API, then the CLI)
    status, grant = api("POST", "/folders/keep/request-upload", {"path": "big.bin", "size": 256 * 1024})
    assert status == 200, grant
    status, body = tus_patch(node, grant, b"x" * 256 * 1024)
    assert_full(status, body, "virtual folder host 'local'")
    (tmp_path / "big.bin").write_bytes(b"y" * 256 * 1024)
    out = node.cli("vfolder", "upload", "keep", str(tmp_path / "big.bin"))
    assert out.returncode != 0, out
    assert "Insufficient storage." in out.stderr and "virtual folder host 'local'" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr, out.stderr

    # writes to the database: 507 naming it, never a 500
    status, body = api("POST", "/bai/admin/keypairs", {"user_id": "during-full"})
    assert_full(status, body, "the node's database")
    status, body = api("POST", "/folders", {"name": "during-full"})
    assert_full(status, body, "the node's database")
    status, body = api("POST", "/session", {"image": "python", "name": "during", "enqueueOnly": True})
    assert_full(status, body, "the node's database")
    out = node.cli("keypair", "create", "--user", "during-full-cli")
    assert out.returncode != 0 and "Insufficient storage." in out.stderr, out

    # reads keep working, and show nothing of the writes that failed
    status, listed = api("GET", "/session")
    assert status == 200 and [s["name"] for s in listed["items"]] == ["before"], listed
    status, folders = api("GET", "/folders")
    assert status == 200 and [f["name"] for f in folders] == ["keep"], folders
    status, info = api("GET", "/folders/keep")
    assert status == 200 and info["numFiles"] == 1, info
    status, now = api("GET", "/bai/admin/keypairs")
    assert status == 200 and now["items"] == keypairs, now
    assert node.json("vfolder", "ls-files", "keep")  # and through the CLI
    assert sorted(p.name for p in folders_dir.iterdir()) == folder_dirs  # no folder made half-way

    # code still runs: its output reaches the client (storing it, and the run's result, is dropped)
    console: list = []
    status, reply = api("POST", "/session/before", {"mode": "query", "code": "print('while full')", "runId": "r1"})
    for _ in range(100):
        assert status == 200, reply
        console += reply["result"]["console"]
        if reply["result"]["status"] == "finished":
            break
        status, reply = api("POST", "/session/before", {"mode": "continue", "code": "", "runId": "r1"})
    stdout = "".join(text for kind, text in console if kind == "stdout")
    assert reply["result"]["exitCode"] == 0 and stdout == "while full\n", (console, reply)

    # background writers (heartbeats, kernel logs) hit the full disk too: one warning each, and the node
    # carries on
    time.sleep(2)
    assert node.proc is not None and node.proc.poll() is None
    log = node.log_path.read_text()
    assert log.count("heartbeats failed: the node's database is on a full disk") == 1, log[-3000:]
    assert log.count("kernel logs failed: the node's database is on a full disk") == 1, log[-3000:]
    assert log.count("agent-status.json") <= 1, log[-3000:]  # the agent's status file: warned about once too
    assert "Traceback" not in log and "ERROR" not in log, log[-3000:]

    # space again: writes work, what failed left nothing behind, and the database is intact
    filler.unlink()
    status, created = api("POST", "/bai/admin/keypairs", {"user_id": "after-full"})
    assert status == 201, created
    status, body = api("POST", "/folders", {"name": "after-full"})
    assert status == 201, body
    node.cli("vfolder", "upload", "keep", str(tmp_path / "big.bin"), check=True)
    status, body = api("POST", "/session", {"image": "python", "name": "after", "enqueueOnly": True})
    assert status in (200, 201), body
    assert node.stop() == 0

    db = sqlite3.connect(node.state_dir / "bai.db")
    try:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        users = {r[0] for r in db.execute("SELECT user_id FROM keypairs")}
        assert {"admin", "before-full", "after-full"} <= users and not users & {"during-full", "during-full-cli"}
        assert user["accessKey"] in {r[0] for r in db.execute("SELECT access_key FROM keypairs")}
        assert sorted(r[0] for r in db.execute("SELECT name FROM vfolders")) == ["after-full", "keep"]
        assert sorted(r[0] for r in db.execute("SELECT name FROM sessions")) == ["after", "before"]
        assert db.execute("SELECT COUNT(*) FROM kernels").fetchone()[0] == 2
    finally:
        db.close()
    keep = next(p for p in folders_dir.iterdir() if (p / "notes.txt").exists())
    assert (keep / "notes.txt").read_text() == "kept\n" and (keep / "big.bin").stat().st_size == 256 * 1024


# -- a start on a full disk (the in-process harness, its database on a small tmpfs) -----------------------


async def test_a_start_on_a_full_disk_removes_its_kernel_and_ends_once_space_is_freed(tmp_path: Path) -> None:
    """The kernel does not come up within the preparing timeout and the disk is full: the timeout still fires
    (it is no write), the kernel is removed from its agent even while nothing can be recorded (also one whose
    creation finishes late), the session is CANCELLED saying the disk is full once space is freed, and the node
    then starts sessions again without a restart."""
    from tests.harness import Harness

    state = tmp_path / "state"
    mount_tmpfs(state, "8m")
    try:
        async with Harness(state, start_timeout=0.3) as h:
            await h.add_agent("a1", cpu=2, start_delay=1.0)  # comes up after the preparing timeout
            await h.create("on-full-disk", cpu=2)
            await h.schedule()
            row = await h.wait("on-full-disk", "PREPARING")
            await h.until(lambda: h.kernels_starting("a1"), what="the agent creates the kernel")
            filler = fill(state)
            try:
                # its creation ends (late), and the kernel is removed all the same, the disk still full
                await h.until(lambda: not h.kernels_starting("a1"), timeout=5, what="the creation ends")
                await h.until(lambda: not h.kernels_on("a1"), timeout=10, what="the kernel is removed")
                assert await h.status("on-full-disk") == "PREPARING"  # (nothing can be written yet)
                assert row.id in h.lifecycle.starting  # its end is under way, waiting for space
            finally:
                filler.unlink()
            ended = await h.wait("on-full-disk", "CANCELLED", timeout=10)
            assert ended.status_info == "failed-to-start"
            error = ended.status_data["error"]
            assert error["name"] == "DiskFull" and "full disk" in error["repr"], error
            assert h.kernels_on("a1") == set()
            h.nodes["a1"].backend.start_delay = 0.0
            await h.run("after-space-freed", cpu=2)  # its slots are free; no restart needed
    finally:
        unmount(state)


async def test_scheduling_rounds_on_a_full_disk_warn_once_and_place_the_session_once_space_is_freed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    from tests.harness import Harness

    state = tmp_path / "state"
    mount_tmpfs(state, "8m")
    try:
        async with Harness(state) as h:
            await h.add_agent("a1")
            await h.create("waits-for-space")
            filler = fill(state)
            try:
                with caplog.at_level(logging.WARNING):
                    h.start_dispatcher()
                    for _ in range(5):  # rounds, each refused by the full disk
                        rounds = h.wakes
                        h.wake()
                        await h.until(lambda r=rounds: h.wakes > r)
                        await asyncio.sleep(0.1)
                assert await h.status("waits-for-space") == "PENDING"
                said = [r for r in caplog.records if "scheduling round" in r.getMessage()]
                assert len(said) == 1 and "full disk" in said[0].getMessage() and not said[0].exc_info, said
            finally:
                filler.unlink()
            h.wake()
            await h.wait("waits-for-space", "RUNNING")
    finally:
        unmount(state)


async def test_an_idle_session_on_a_full_disk_is_ended_once_space_is_freed_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    from tests.harness import Harness

    state = tmp_path / "state"
    mount_tmpfs(state, "8m")
    try:
        async with Harness(state) as h:
            await h.policy("brief", idle_timeout=10)
            user = await h.keypair("idler", "brief")
            await h.add_agent("a1")
            await h.run("idles", owner=user)
            filler = fill(state)
            try:
                h.advance(11)
                with caplog.at_level(logging.WARNING):
                    for _ in range(4):  # a sweep a second: each end refused by the full disk
                        await h.sweep()
                        await asyncio.sleep(0.05)
                        h.advance(1)
                assert await h.status("idles") == "RUNNING"
                said = [r for r in caplog.records if "past their limits" in r.getMessage()]
                assert len(said) == 1 and not said[0].exc_info, [r.getMessage() for r in caplog.records]
            finally:
                filler.unlink()
            await h.sweep()
            ended = await h.wait("idles", "TERMINATED")
            assert ended.status_info == "idle-timeout"
            assert h.kernels_on("a1") == set()
    finally:
        unmount(state)
