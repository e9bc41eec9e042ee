"""Kernel output is bounded: per session `[manager] log_max_bytes` (the oldest dropped, one marker line
saying how much), a logs endpoint with tail / since / limit, purging after `[manager] log_retention`, and
a database file that stays within the bound plus a small margin.

Store tests run on a Store in tmp_path; node tests on a real docker node whose kernel prints 3x the bound.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bai.client.api import APIError
from bai.common.status import SessionStatus
from bai.node.manager.state import Store, drop_marker
from bai.node.manager.state.records import NewKernel, NewSession
from tests.nodeproc import Node
from tests.tui_support import node_client

NOW = datetime(2026, 1, 1, tzinfo=UTC)  # when these tests' writes are stamped

MiB = 2**20
MARGIN = 1 * MiB  # what the database files may hold beyond the log bound
MARKER = re.compile(r"^\[bai: ([0-9.]+) (bytes|KiB|MiB|GiB) of older output dropped\]\n")
UNIT = {"bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


def numbered(start: int, stop: int) -> str:
    """Lines of 128 bytes: an 8-digit number, a space, 118 x's."""
    return "".join(f"{i:08d} {'x' * 118}\n" for i in range(start, stop))


def dropped_of(text: str) -> float:
    m = MARKER.match(text)
    assert m, f"no marker line at the start: {text[:100]!r}"
    return float(m[1]) * UNIT[m[2]]


async def all_text(store: Store, kernel_id: str) -> str:
    parts, after = [], 0
    while chunks := await store.read_log_chunks(kernel_id, after):
        parts.extend(c[1] for c in chunks)
        after = chunks[-1][0]
    return "".join(parts)


def db_bytes(state_dir: Path) -> int:
    """The database on disk: bai.db and its -wal and -shm files."""
    total = 0
    for path in state_dir.glob("bai.db*"):
        try:
            total += path.stat().st_size
        except FileNotFoundError:
            pass
    return total


# -- the store ----------------------------------------------------------------------------------------


async def test_a_log_keeps_its_newest_bytes_after_one_marker_line(tmp_path: Path) -> None:
    bound = 64 * 1024
    store = await Store.open(tmp_path / "bai.db", log_max_bytes=bound)
    try:
        lines = 3 * bound // 128
        for start in range(0, lines, 32):  # 4 KiB appends
            await store.append_logs([("k1", numbered(start, start + 32)), ("k2", "other kernel\n")], NOW)
        text = await all_text(store, "k1")
        marker = MARKER.match(text)
        assert marker is not None
        kept = text[marker.end() :]
        assert len(kept.encode()) <= bound
        assert len(kept) >= bound * 7 // 8  # dropping whole rows keeps most of the bound
        assert text.count("older output dropped") == 1  # one marker, updated, not one per drop
        assert kept.endswith(numbered(lines - 1, lines))  # the newest output is intact
        assert kept in numbered(0, lines)  # a contiguous tail of what was printed
        assert dropped_of(text) == pytest.approx(lines * 128 - len(kept), rel=0.01)
        state = await store.log_state("k1")
        assert state is not None and state.bytes == len(kept) and state.dropped == lines * 128 - len(kept)
        # the other kernel's log is bounded on its own and lost nothing
        assert await all_text(store, "k2") == "other kernel\n" * (lines // 32)
    finally:
        await store.close()


async def test_one_chunk_larger_than_the_bound_keeps_its_tail(tmp_path: Path) -> None:
    bound = 64 * 1024
    store = await Store.open(tmp_path / "bai.db", log_max_bytes=bound)
    try:
        await store.append_logs([("k", "early\n")], NOW)
        big = "é" * (bound * 2)  # two bytes a character: the cut must not split one
        await store.append_logs([("k", big + "last line\n")], NOW)
        text = await all_text(store, "k")
        kept = MARKER.sub("", text)
        assert len(kept.encode()) <= bound and kept.endswith("é" * 100 + "last line\n")
        assert set(kept[: -len("last line\n")]) == {"é"}
        assert dropped_of(text) == pytest.approx(
            len(("early\n" + big + "last line\n").encode()) - len(kept.encode()), rel=0.01
        )
    finally:
        await store.close()


async def test_a_batch_beyond_the_bound_keeps_its_last_bytes_and_its_chunks(tmp_path: Path) -> None:
    bound = 64 * 1024
    store = await Store.open(tmp_path / "bai.db", log_max_bytes=bound)
    try:
        await store.append_logs([("k", "a" * 40_000), ("j", "other\n"), ("k", "b" * 40_000), ("k", "end\n")], NOW)
        text = await all_text(store, "k")
        assert text == drop_marker(80_004 - bound) + "a" * (bound - 40_004) + "b" * 40_000 + "end\n"
        assert [c[1] for c in await store.read_log_chunks("j")] == ["other\n"]
    finally:
        await store.close()


async def test_concurrent_appends_keep_the_running_total_right(tmp_path: Path) -> None:
    bound = 64 * 1024
    store = await Store.open(tmp_path / "bai.db", log_max_bytes=bound)
    try:
        await asyncio.gather(*(store.append_logs([("k", numbered(i * 10, i * 10 + 10))], NOW) for i in range(300)))
        kept = MARKER.sub("", await all_text(store, "k"))
        state = await store.log_state("k")
        assert state is not None and state.bytes == len(kept) <= bound
        assert state.dropped + state.bytes == 300 * 10 * 128
    finally:
        await store.close()


async def test_readers_see_the_marker_before_what_was_kept(tmp_path: Path) -> None:
    bound = 64 * 1024
    store = await Store.open(tmp_path / "bai.db", log_max_bytes=bound)
    try:
        await store.append_logs([("k", numbered(0, 32))], NOW)
        [(first_seq, _, _)] = await store.read_log_chunks("k")
        for start in range(32, 3 * bound // 128, 32):
            await store.append_logs([("k", numbered(start, start + 32))], NOW)
        # a follower whose cursor points at dropped output reads the marker next, then what was kept
        chunks = await store.read_log_chunks("k", first_seq)
        assert MARKER.match(chunks[0][1]) and not any(MARKER.match(c[1]) for c in chunks[1:])
        assert [c[0] for c in chunks] == sorted(c[0] for c in chunks)
        # a follower past the marker never sees it again
        marker_seq = chunks[0][0]
        await store.append_logs([("k", numbered(10_000, 10_100))], NOW)
        later = await store.read_log_chunks("k", chunks[-1][0])
        assert "".join(c[1] for c in later) == numbered(10_000, 10_100)
        assert (await store.read_log_chunks("k"))[0][0] > marker_seq  # the marker moved up with the drops
    finally:
        await store.close()


async def test_tail_and_pages(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "bai.db", log_max_bytes=1 * MiB)
    try:
        for start in range(0, 1000, 100):
            await store.append_logs([("k", numbered(start, start + 100))], NOW)
        await store.append_logs([("k", "no newline at the end")], NOW)
        chunks, newest = await store.read_log_tail("k", 3)
        assert "".join(c[1] for c in chunks) == numbered(998, 1000) + "no newline at the end"
        assert newest == (await store.read_log_chunks("k"))[-1][0]
        chunks, _ = await store.read_log_tail("k", 250)
        assert "".join(c[1] for c in chunks) == numbered(751, 1000) + "no newline at the end"
        assert (await store.read_log_tail("k", 0))[0] == []
        assert await store.read_log_tail("none", 5) == ([], 0)
        # pages of at most 30 000 bytes (whole chunks of 12 800), each ending where the next starts
        pages, after, more = [], 0, True
        while more:
            chunks, more = await store.read_log_page("k", after, 30_000)
            assert sum(len(c[1]) for c in chunks) <= 30_000
            pages.append("".join(c[1] for c in chunks))
            after = chunks[-1][0]
        assert len(pages) == 5 and "".join(pages) == await all_text(store, "k")
    finally:
        await store.close()


async def test_the_database_file_stays_within_the_bound(tmp_path: Path) -> None:
    bound = 1 * MiB
    store = await Store.open(tmp_path / "bai.db", log_max_bytes=bound)
    try:
        await store.reclaim_space()
        empty = db_bytes(tmp_path)  # (the schema's own pages: every table and index, whatever the logs)
        peak = 0
        for start in range(0, 3 * bound // 128, 256):  # 32 KiB appends, 3x the bound
            await store.append_logs([("k", numbered(start, start + 256))], NOW)
            peak = max(peak, db_bytes(tmp_path) - empty)
        await store.reclaim_space()
        after = db_bytes(tmp_path) - empty
    finally:
        await store.close()
    assert empty < 512 * 1024, f"{empty / MiB:.2f} MiB for an empty database"
    # the margin: the -wal file (checkpointed at a quarter of the bound, plus one transaction), page overhead
    assert peak <= bound + MARGIN, f"{peak / MiB:.2f} MiB more on disk for a log bound of 1 MiB"
    assert after <= bound + bound // 4, f"{after / MiB:.2f} MiB more on disk after reclaiming"


async def test_purge_deletes_ended_sessions_logs_and_gives_the_space_back(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "bai.db", log_max_bytes=1 * MiB)
    try:
        ended, running = str(uuid.uuid4()), str(uuid.uuid4())
        for sid in (ended, running):
            session = NewSession(
                id=sid,
                name=sid[:8],
                access_key="AK",
                image="img",
                type="interactive",
                requested_slots={},
                environ={},
                config={},
                scaling_group="default",
                created_at=datetime.now(UTC),
            )
            await store.create_session(session, [NewKernel(f"k-{sid}", "main", 1, {})])
            for start in range(0, 8192, 256):
                await store.append_logs([(f"k-{sid}", numbered(start, start + 256))], NOW)
        await store.transition(ended, SessionStatus.CANCELLED, "user-requested", now=datetime.now(UTC))
        await store.reclaim_space()
        full = db_bytes(tmp_path)
        assert await store.purge_logs(datetime.now(UTC) - timedelta(hours=1), NOW) == []
        assert await store.purge_logs(datetime.now(UTC) + timedelta(seconds=1), NOW) == [f"k-{ended}"]
        state = await store.log_state(f"k-{ended}")
        assert state is not None and state.purged_at and state.bytes == 0
        assert await store.read_log_chunks(f"k-{ended}") == []
        assert len(MARKER.sub("", await all_text(store, f"k-{running}"))) > MiB // 2  # untouched
        await store.reclaim_space()
        assert db_bytes(tmp_path) < full - MiB // 2  # the pages went back to the file system
    finally:
        await store.close()


async def test_a_database_of_an_older_version_opens_and_is_cut_to_the_bound(tmp_path: Path) -> None:
    path = tmp_path / "bai.db"
    with closing(sqlite3.connect(path)) as conn:  # the kernel_logs of an older bai, no auto-vacuum
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(
            "CREATE TABLE kernel_logs (seq INTEGER PRIMARY KEY AUTOINCREMENT, kernel_id TEXT NOT NULL, "
            "data TEXT NOT NULL, ts TEXT)"
        )
        conn.executemany(
            "INSERT INTO kernel_logs(kernel_id, data, ts) VALUES ('old', ?, NULL)",
            [(numbered(start, start + 256),) for start in range(0, 3 * MiB // 128, 256)],
        )
        conn.commit()
    store = await Store.open(path, log_max_bytes=1 * MiB)
    try:
        text = await all_text(store, "old")
        kept = MARKER.sub("", text)
        assert MiB * 7 // 8 <= len(kept) <= MiB and kept.endswith(numbered(3 * MiB // 128 - 1, 3 * MiB // 128))
        assert dropped_of(text) == pytest.approx(3 * MiB - len(kept), abs=0.05 * MiB)
        await store.append_logs([("old", "more\n")], NOW)
        assert (await all_text(store, "old")).endswith("more\n")
        await store.reclaim_space()
        assert db_bytes(tmp_path) < 1.5 * MiB
    finally:
        await store.close()
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # incremental from now on


# -- through a real node ------------------------------------------------------------------------------

BOUND = 1 * MiB
LINES = 3 * BOUND // 128  # 3x the bound


@pytest.fixture(scope="module")
def bounded_node(python_image: str, tmp_path_factory) -> Iterator[Node]:
    config = f'[manager]\nlog_max_bytes = {BOUND}\nlog_retention = "1s"\n'
    node = Node(tmp_path_factory.mktemp("logbound"), "docker", extra_config=config).start()
    yield node
    left = node.leftover_containers(settle=10)  # (removals finish in the background)
    node.stop()
    assert not left


def print_lines(node: Node, name: str, start: int, stop: int) -> None:
    code = f"import sys\nfor i in range({start}, {stop}):\n sys.stdout.write(f'{{i:08d}} ' + 'x' * 118 + '\\n')\n"
    result = node.cli("session", "exec", name, "-c", code, timeout=120)
    assert result.returncode == 0, result.stderr


def wait_for_tail(client, name: str, last_line: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if asyncio.run(client.logs(name, tail=1)) == last_line:
            return
        time.sleep(0.1)
    raise AssertionError(f"the log of {name} never ended with {last_line!r}")


class DiskWatch:
    """The largest size of the node's database files, sampled every 10 ms in a thread."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, db_bytes(self.state_dir))
            time.sleep(0.01)

    def __enter__(self) -> DiskWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def test_three_times_the_bound_keeps_the_newest_and_the_database_small(bounded_node: Node) -> None:
    node, client = bounded_node, node_client(bounded_node)
    node.cli("session", "create", "python", "--name", "flood", check=True)
    base = db_bytes(node.state_dir)
    with DiskWatch(node.state_dir) as disk:
        print_lines(node, "flood", 0, LINES)
        wait_for_tail(client, "flood", numbered(LINES - 1, LINES))
    result = asyncio.run(client.log_page("flood"))
    text = result["logs"]
    kept = MARKER.sub("", text)
    assert len(kept.encode()) <= BOUND and len(text) - len(kept) < 80  # the bound plus one marker line
    assert result["more"] is False and result["next"] > 0
    lines = kept.splitlines(keepends=True)
    assert lines[-1] == numbered(LINES - 1, LINES)  # the newest output is intact
    first = int(lines[1][:8])
    assert "".join(lines[1:]) == numbered(first, LINES)  # and what is kept runs on to it
    assert dropped_of(text) == pytest.approx(LINES * 128 - len(kept), abs=0.06 * MiB)
    print(f"\ndatabase files: {base / MiB:.2f} MiB before, peak {disk.peak / MiB:.2f} MiB for a 1 MiB bound")
    assert disk.peak <= base + BOUND + MARGIN, f"peak {disk.peak / MiB:.2f} MiB (base {base / MiB:.2f} MiB)"
    node.cli("session", "destroy", "flood", check=True)


def test_tail_since_and_pages(bounded_node: Node) -> None:
    node, client = bounded_node, node_client(bounded_node)
    node.cli("session", "create", "python", "--name", "pages", check=True)
    for start in range(0, 4000, 1000):  # several exec runs: several stored chunks
        print_lines(node, "pages", start, start + 1000)
    wait_for_tail(client, "pages", numbered(3999, 4000))
    assert asyncio.run(client.logs("pages", tail=3)) == numbered(3997, 4000)
    cli_tail = node.cli("session", "logs", "pages", "--tail", "2", check=True).stdout
    assert cli_tail == numbered(3998, 4000)

    whole = asyncio.run(client.log_page("pages"))
    assert whole["logs"] == numbered(0, 4000) and whole["more"] is False
    pages, since, more = [], 0, True
    while more:
        page = asyncio.run(client.log_page("pages", since=since, limit=100_000))
        assert len(page["logs"]) <= 100_000 or page["logs"].count("\n") * 128 == len(page["logs"])
        pages.append(page["logs"])
        since, more = page["next"], page["more"]
    assert len(pages) >= 2 and "".join(pages) == whole["logs"] and since == whole["next"]
    print_lines(node, "pages", 4000, 4010)
    wait_for_tail(client, "pages", numbered(4009, 4010))
    newer = asyncio.run(client.log_page("pages", since=whole["next"]))
    assert newer["logs"] == numbered(4000, 4010) and newer["more"] is False
    node.cli("session", "destroy", "pages", check=True)


def test_bad_parameters_are_400(bounded_node: Node) -> None:
    client = node_client(bounded_node)
    bounded_node.cli("session", "create", "python", "--name", "params", check=True)
    bad = [
        {"tail": "-1"},
        {"tail": "x"},
        {"since": "abc"},
        {"since": "-5"},
        {"limit": "0"},
        {"tail": "3", "since": "1"},
    ]
    for params in bad + [{"follow": "true", "limit": "10"}]:
        with pytest.raises(APIError) as err:
            asyncio.run(client.request("GET", "/session/params/logs", params=params))
        assert err.value.status == 400 and err.value.slug == "invalid-api-params", params
    bounded_node.cli("session", "destroy", "params", check=True)


def test_ended_sessions_logs_are_purged_after_the_retention(bounded_node: Node) -> None:
    node, client = bounded_node, node_client(bounded_node)
    node.cli("session", "create", "python", "--name", "gone", check=True)
    print_lines(node, "gone", 0, LINES)
    wait_for_tail(client, "gone", numbered(LINES - 1, LINES))
    full = db_bytes(node.state_dir)
    node.cli("session", "destroy", "gone", check=True)
    deadline = time.monotonic() + 20
    while not (page := asyncio.run(client.log_page("gone"))).get("purged") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert page.get("purged") is True and "purged" in page["logs"] and "x" * 118 not in page["logs"]
    result = node.cli("session", "logs", "gone")
    assert result.returncode == 0 and result.stdout == "" and "purged" in result.stderr
    # the pages went back to the file system and the -wal file was cut back
    deadline = time.monotonic() + 10
    while db_bytes(node.state_dir) > full - BOUND // 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert db_bytes(node.state_dir) <= full - BOUND // 2, f"{full} -> {db_bytes(node.state_dir)} bytes"
