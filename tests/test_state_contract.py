"""The contract of the state layer's agents, accounts, folders, images and logs: the same tests for every
implementation (SQLite today; PostgreSQL next), through the protocols and records of `bai.node.manager.state`
only: no SQL, nothing of an implementation's insides.

An implementation joins by adding a factory to IMPLEMENTATIONS (an async context manager giving its state).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import pytest

from bai.node.manager.state import AccountState, AgentState, FolderState, ImageState, LogState, StorageFull
from bai.node.manager.state import Store as SQLiteStore
from bai.node.manager.state.records import (
    Agent,
    AgentCapacity,
    Dotfile,
    FolderChanges,
    FolderShare,
    ImageAlias,
    Keypair,
    LogChunk,
    LogKept,
    NewAgent,
    NewKeypair,
    NewVFolder,
    Policy,
    PolicyFields,
    SeenVFolder,
    VFolder,
    stamp,
)


class State(AgentState, AccountState, FolderState, ImageState, LogState, Protocol):
    """Every domain of this contract (an implementation is all of them)."""


@asynccontextmanager
async def sqlite_state(tmp_path: Path) -> AsyncIterator[Any]:
    store = await SQLiteStore.open(tmp_path / "state.db", log_max_bytes=64 * 1024)
    try:
        yield store
    finally:
        await store.close()


IMPLEMENTATIONS: dict[str, Callable[[Path], AbstractAsyncContextManager[Any]]] = {"sqlite": sqlite_state}
T2020 = datetime(2020, 1, 1, 12, 0, tzinfo=UTC)
T2040 = datetime(2040, 6, 30, 23, 59, 59, 123456, tzinfo=UTC)
SLOTS = {"cpu": "4", "mem": "8589934592"}


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
async def state(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[State]:
    async with IMPLEMENTATIONS[request.param](tmp_path) as impl:
        yield impl


@pytest.fixture(params=[T2020, T2040], ids=["2020", "2040"])
def now(request: pytest.FixtureRequest) -> datetime:
    return request.param  # type: ignore[no-any-return]


def agent(agent_id: str = "a1", group: str = "default", slots: dict[str, str] | None = None) -> NewAgent:
    return NewAgent(agent_id, f"host-{agent_id}", "sim", "0.1", group, slots or SLOTS)


# -- agents -----------------------------------------------------------------------------------------------


async def test_an_agent_registers_and_is_stamped_with_the_time_given(state: State, now: datetime) -> None:
    assert await state.agents() == []
    await state.upsert_agent(agent("a2"), now)
    await state.upsert_agent(agent("a1"), now)
    a1 = (await state.agents())[0]
    assert isinstance(a1, Agent)
    assert a1 == Agent("a1", "host-a1", "sim", "0.1", "default", "ALIVE", SLOTS, stamp(now), stamp(now))
    assert [a.id for a in await state.agents()] == ["a1", "a2"]


async def test_registering_again_updates_it_and_keeps_its_first_contact(state: State) -> None:
    await state.upsert_agent(agent("a1"), T2020)
    await state.set_agent_status("a1", "LOST", T2020 + timedelta(seconds=5))
    await state.upsert_agent(agent("a1", "gpu", {"cpu": "2"}), T2040)
    [a1] = await state.agents()
    assert (a1.status, a1.scaling_group, a1.slots) == ("ALIVE", "gpu", {"cpu": "2"})
    assert (a1.first_contact, a1.last_seen) == (stamp(T2020), stamp(T2040))


async def test_status_and_heartbeats_stamp_last_seen(state: State) -> None:
    await state.upsert_agent(agent("a1"), T2020)
    await state.set_agent_status("a1", "LOST", T2020 + timedelta(minutes=1))
    [a1] = await state.agents()
    assert (a1.status, a1.last_seen) == ("LOST", stamp(T2020 + timedelta(minutes=1)))
    await state.touch_agent("a1", T2040)  # a heartbeat: ALIVE again
    [a1] = await state.agents()
    assert (a1.status, a1.last_seen) == ("ALIVE", stamp(T2040))
    await state.touch_agent("no-such-agent", T2040)  # nothing to touch: nothing happens
    assert [a.id for a in await state.agents()] == ["a1"]


async def test_capacities_follow_every_write_and_their_version_says_when(state: State) -> None:
    version, capacities = await state.agent_capacities()
    assert capacities == [] and version == state.capacities_version()
    await state.upsert_agent(agent("a1"), T2020)
    v1, capacities = await state.agent_capacities()
    assert v1 != version and capacities == [AgentCapacity("a1", "default", "ALIVE", SLOTS)]
    assert (await state.agent_capacities())[0] == v1  # no write: the same version
    await state.set_agent_status("a1", "TERMINATED", T2020)
    v2, capacities = await state.agent_capacities()
    assert v2 != v1 and [c.status for c in capacities] == ["TERMINATED"]
    await state.touch_agent("a1", T2020)
    v3, capacities = await state.agent_capacities()
    assert v3 != v2 and [c.status for c in capacities] == ["ALIVE"] and state.capacities_version() == v3


# -- accounts ---------------------------------------------------------------------------------------------


async def test_the_admin_keypair_is_made_once(state: State, now: datetime) -> None:
    assert await state.ensure_admin_keypair("AKADMIN", "secret", now) == ("AKADMIN", "secret")
    assert await state.ensure_admin_keypair("AKOTHER", "other", now) == ("AKADMIN", "secret")
    admin = state.active_keypair("AKADMIN")
    assert admin == Keypair("AKADMIN", "secret", "admin", True, True, "default", stamp(now))
    assert list(await state.keypairs()) == ["AKADMIN"]


async def test_a_keypair_round_trip_and_its_cache_follows_each_write(state: State, now: datetime) -> None:
    assert state.active_keypair("AK1") is None and await state.keypair("AK1") is None
    await state.create_keypair(NewKeypair("AK1", "s1", "alice", False, "default"), now)
    created = Keypair("AK1", "s1", "alice", False, True, "default", stamp(now))
    assert state.active_keypair("AK1") == created  # at once, from memory
    assert await state.keypair("AK1") == created
    assert (await state.keypairs())["AK1"] == created
    assert await state.save_policy("gold", PolicyFields(), create=True, now=now)
    assert await state.update_keypair("AK1", resource_policy="gold", is_admin=True)
    changed = state.active_keypair("AK1")
    assert changed is not None and (changed.resource_policy, changed.is_admin) == ("gold", True)
    assert await state.update_keypair("AK1", is_active=False)
    assert state.active_keypair("AK1") is None  # inactive: authentication knows it no more
    assert "AK1" not in await state.keypairs() and "AK1" in await state.keypairs(active_only=False)
    inactive = await state.keypair("AK1")
    assert inactive is not None and not inactive.is_active
    assert await state.update_keypair("AK1", is_active=True)
    assert state.active_keypair("AK1") is not None
    assert await state.delete_keypair("AK1")
    assert state.active_keypair("AK1") is None and await state.keypair("AK1") is None
    assert not await state.delete_keypair("AK1")
    assert not await state.update_keypair("AK1", is_active=True)


async def test_a_keypair_needs_an_existing_policy(state: State, now: datetime) -> None:
    with pytest.raises(KeyError):
        await state.create_keypair(NewKeypair("AK1", "s", "u", False, "nope"), now)
    assert await state.keypair("AK1") is None
    await state.create_keypair(NewKeypair("AK1", "s", "u"), now)
    with pytest.raises(KeyError):
        await state.update_keypair("AK1", resource_policy="nope")
    kp = state.active_keypair("AK1")
    assert kp is not None and kp.resource_policy == "default"


async def test_policies_round_trip_with_defaults_and_partial_updates(state: State, now: datetime) -> None:
    assert list(await state.policies()) == ["default"]
    fields = PolicyFields(max_concurrent_sessions=3, total_resource_slots={"cpu": "8"}, idle_cpu_pct=5.0)
    assert await state.save_policy("gold", fields, create=True, now=now)
    assert not await state.save_policy("gold", fields, create=True, now=now)  # taken
    gold = await state.policy("gold")
    assert isinstance(gold, Policy) and gold.created_at == stamp(now)
    assert (gold.max_concurrent_sessions, gold.total_resource_slots, gold.idle_cpu_pct) == (3, {"cpu": "8"}, 5.0)
    assert (gold.idle_window, gold.max_session_networks, gold.max_pending_session_count) == (600.0, 2, 1000)
    assert await state.save_policy("gold", PolicyFields(idle_cpu_pct=None, idle_window=90.0), create=False, now=now)
    gold = (await state.policies())["gold"]
    assert (gold.max_concurrent_sessions, gold.idle_cpu_pct, gold.idle_window) == (3, None, 90.0)
    assert not await state.save_policy("nope", PolicyFields(), create=False, now=now)
    assert await state.policy("nope") is None
    assert list(await state.policies()) == ["default", "gold"]


async def test_a_policy_in_use_stays(state: State, now: datetime) -> None:
    assert await state.save_policy("gold", PolicyFields(), create=True, now=now)
    await state.create_keypair(NewKeypair("AK1", "s", "u", False, "gold"), now)
    assert "used by 1" in (await state.delete_policy("gold") or "")
    assert await state.delete_keypair("AK1")
    assert await state.delete_policy("gold") is None
    assert "no resource policy" in (await state.delete_policy("gold") or "")


async def test_queue_limits_follow_policy_and_keypair_writes(state: State, now: datetime) -> None:
    assert await state.pending_queue("AKUNKNOWN") == ("default", 1000, 0)
    assert await state.save_policy("tight", PolicyFields(max_pending_session_count=3), create=True, now=now)
    await state.create_keypair(NewKeypair("AK1", "s", "u", False, "tight"), now)
    assert await state.pending_queue("AK1") == ("tight", 3, 0)
    assert await state.save_policy("tight", PolicyFields(max_pending_session_count=0), create=False, now=now)
    assert await state.pending_queue("AK1") == ("tight", 0, 0)  # 0: unlimited
    assert await state.update_keypair("AK1", resource_policy="default")
    assert await state.pending_queue("AK1") == ("default", 1000, 0)
    assert await state.session_networks_by_keypair(["RUNNING"]) == {}


async def test_dotfiles_round_trip(state: State) -> None:
    assert await state.dotfiles("AK1") == []
    await state.put_dotfile("AK1", ".bashrc", "export A=1\n", "644")
    await state.put_dotfile("AK1", ".profile", "x", "600")
    await state.put_dotfile("AK1", ".bashrc", "export A=2\n", "755")  # replaced
    assert await state.dotfiles("AK1") == [Dotfile(".bashrc", "export A=2\n", "755"), Dotfile(".profile", "x", "600")]
    assert await state.dotfiles("AK2") == []
    assert await state.delete_dotfile("AK1", ".profile")
    assert not await state.delete_dotfile("AK1", ".profile")
    assert [d.path for d in await state.dotfiles("AK1")] == [".bashrc"]


async def test_deleting_a_keypair_deletes_its_dotfiles(state: State, now: datetime) -> None:
    await state.create_keypair(NewKeypair("AK1", "s", "u"), now)
    await state.put_dotfile("AK1", ".bashrc", "x", "644")
    assert await state.delete_keypair("AK1")
    assert await state.dotfiles("AK1") == []


# -- folders ----------------------------------------------------------------------------------------------


def folder(folder_id: str = "f1", name: str = "data", owner: str = "AK1", **kw: Any) -> NewVFolder:
    return NewVFolder(folder_id, name, "local", owner, **kw)


async def test_a_folder_round_trip(state: State, now: datetime) -> None:
    assert await state.get_vfolder("f1") is None
    assert await state.create_vfolder(folder(mount_permission="ro", cloneable=True), now)
    made = VFolder("f1", "data", "local", "AK1", "general", "ready", stamp(now), None, "ro", True)
    assert await state.get_vfolder("f1") == made
    [seen] = await state.vfolders_of("AK1")
    assert isinstance(seen, SeenVFolder) and (seen.permission, seen.is_owner, seen.id) == ("wd", True, "f1")
    assert [f.id for f in await state.vfolders_of(None)] == ["f1"]
    assert await state.vfolders_of("AK2") == []
    assert await state.count_vfolders("AK1") == 1 and await state.count_vfolders("AK2") == 0
    await state.delete_vfolder("f1")
    assert await state.get_vfolder("f1") is None and await state.count_vfolders("AK1") == 0


async def test_an_owner_has_one_ready_folder_of_a_name(state: State, now: datetime) -> None:
    assert await state.create_vfolder(folder("f1", "data"), now)
    assert not await state.create_vfolder(folder("f2", "data"), now)
    assert await state.create_vfolder(folder("f3", "data", owner="AK2"), now)
    assert await state.create_vfolder(folder("f4", "other"), now)
    assert not await state.update_vfolder("f4", FolderChanges(name="data"))  # taken
    assert await state.update_vfolder("f1", FolderChanges(status="trashed", trashed_at=stamp(now)))
    trashed = await state.get_vfolder("f1")
    assert trashed is not None and (trashed.status, trashed.trashed_at) == ("trashed", stamp(now))
    assert [f.id for f in await state.vfolders_of("AK1", "trashed")] == ["f1"]
    assert await state.update_vfolder("f4", FolderChanges(name="data"))  # free now
    assert not await state.update_vfolder("f1", FolderChanges(status="ready", trashed_at=None))  # taken again


async def test_folder_updates_change_only_what_they_say(state: State, now: datetime) -> None:
    assert await state.create_vfolder(folder(), now)
    assert await state.update_vfolder("f1", FolderChanges(mount_permission="ro", cloneable=True))
    assert await state.update_vfolder("f1", FolderChanges(owner="AK2"))
    assert await state.update_vfolder("f1", FolderChanges())
    f1 = await state.get_vfolder("f1")
    assert f1 is not None and (f1.mount_permission, f1.cloneable, f1.owner, f1.name) == ("ro", True, "AK2", "data")


async def test_shares_round_trip(state: State, now: datetime) -> None:
    assert await state.create_vfolder(folder("f1", "data"), now)
    assert await state.create_vfolder(folder("f2", "alpha"), now)
    await state.share_vfolder("f1", "AK2", "ro")
    await state.share_vfolder("f1", "AK3", "ro")
    await state.share_vfolder("f1", "AK3", "rw")  # changed
    await state.share_vfolder("f2", "AK2", "rw")
    assert await state.shares_of("f1") == {"AK2": "ro", "AK3": "rw"}
    seen = await state.vfolders_of("AK2")
    assert [(f.id, f.permission, f.is_owner) for f in seen] == [("f2", "rw", False), ("f1", "ro", False)]
    assert await state.all_shares("f2") == [FolderShare("f2", "AK2", "rw", "alpha", "AK1", "ready")]
    assert [(s.vfolder_id, s.access_key) for s in await state.all_shares()] == [
        ("f2", "AK2"),
        ("f1", "AK2"),
        ("f1", "AK3"),
    ]
    await state.share_vfolder("f1", "AK2", None)
    assert await state.shares_of("f1") == {"AK3": "rw"}
    await state.delete_vfolder("f1")
    assert await state.shares_of("f1") == {} and [s.vfolder_id for s in await state.all_shares()] == ["f2"]


async def test_invitations_round_trip(state: State, now: datetime) -> None:
    assert await state.create_vfolder(folder(), now)
    assert await state.invite("f1", "AK1", ["AK2", "AK3"], "rw", now) == ["AK2", "AK3"]
    assert await state.invite("f1", "AK1", ["AK2"], "ro", now) == []  # one pending already
    [to_ak2] = await state.invitations(invitee="AK2")
    assert (to_ak2.inviter, to_ak2.permission, to_ak2.state, to_ak2.vfolder_name) == ("AK1", "rw", "pending", "data")
    assert to_ak2.created_at == to_ak2.modified_at == stamp(now)
    assert len(await state.invitations(inviter="AK1")) == 2
    assert await state.invitations(invitation_id=to_ak2.id) == [to_ak2]
    later = now + timedelta(hours=1)
    closed = await state.close_invitation(to_ak2.id, "accepted", later)
    assert closed is not None and closed.id == to_ak2.id
    assert await state.shares_of("f1") == {"AK2": "rw"}  # the share appears
    assert await state.close_invitation(to_ak2.id, "rejected", later) is None  # not pending any more
    assert await state.invitations(invitee="AK2") == []
    [to_ak3] = await state.invitations(invitee="AK3")
    assert await state.close_invitation(to_ak3.id, "canceled", later) is not None
    assert await state.shares_of("f1") == {"AK2": "rw"} and await state.invitations(inviter="AK1") == []
    assert await state.close_invitation("no-such-invitation", "accepted", later) is None


# -- images -----------------------------------------------------------------------------------------------


async def test_image_aliases_round_trip(state: State) -> None:
    assert await state.image_aliases() == []
    assert await state.set_image_alias("py", "python:3.11")
    assert await state.set_image_alias("a", "alpine")
    assert await state.set_image_alias("py", "python:3.12")  # changed
    assert await state.image_aliases() == [ImageAlias("a", "alpine"), ImageAlias("py", "python:3.12")]
    assert await state.set_image_alias("py", None)
    assert not await state.set_image_alias("py", None)
    assert await state.image_aliases() == [ImageAlias("a", "alpine")]


# -- logs -------------------------------------------------------------------------------------------------


async def test_logs_round_trip_stamped_with_the_time_given(state: State, now: datetime) -> None:
    assert await state.log_state("k1") is None and await state.newest_log_seq("k1") == 0
    await state.append_logs([("k1", "one\n"), ("k2", "other\n"), ("k1", "two\n")], now)
    await state.append_logs([("k1", "three\n")], now + timedelta(seconds=1))
    chunks = await state.read_log_chunks("k1")
    assert all(isinstance(c, LogChunk) for c in chunks)
    assert [(c.data, c.ts) for c in chunks] == [
        ("one\n", stamp(now)),
        ("two\n", stamp(now)),
        ("three\n", stamp(now + timedelta(seconds=1))),
    ]
    assert [text for _, text in await state.read_logs("k1")] == ["one\n", "two\n", "three\n"]
    assert await state.newest_log_seq("k1") == chunks[-1].seq
    assert await state.log_seq_before("k1", stamp(now + timedelta(seconds=1))) == chunks[1].seq
    assert await state.log_seq_before("k1", stamp(now)) == 0
    assert await state.log_state("k1") == LogKept(bytes=len("one\ntwo\nthree\n"), dropped=0, purged_at=None)
    page = await state.read_log_page("k1", chunks[0].seq, max_bytes=1)
    assert ([c.data for c in page.chunks], page.more) == (["two\n"], True)  # whole chunks, at least one
    tail = await state.read_log_tail("k1", 2)
    assert ([c.data for c in tail.chunks], tail.newest) == (["two\n", "three\n"], chunks[-1].seq)
    assert await state.log_tail_start("k1", 1) == chunks[1].seq
    assert [c.data for c in await state.read_log_chunks("k1", chunks[-1].seq)] == []


async def test_a_log_is_kept_within_its_bound_with_one_marker(state: State, now: datetime) -> None:
    line = "x" * 127 + "\n"
    for _ in range(4):
        await state.append_logs([("k", line * 256)], now)  # 32 KiB each: 128 KiB against a 64 KiB bound
    kept = await state.log_state("k")
    assert kept is not None and kept.bytes <= 64 * 1024 and kept.dropped == 4 * 256 * 128 - kept.bytes
    first = (await state.read_log_chunks("k"))[0]
    assert first.data.startswith("[bai: ") and first.ts == stamp(now)
    assert await state.cut_logs_to_bound(now) == []  # within the bound already


async def test_purging_without_ended_sessions_purges_nothing(state: State, now: datetime) -> None:
    await state.append_logs([("k", "hi\n")], now)
    assert await state.purge_logs(now + timedelta(days=365), now) == []
    assert [text for _, text in await state.read_logs("k")] == ["hi\n"]


async def test_storage_full_is_the_state_layers_own_error() -> None:
    assert issubclass(StorageFull, Exception) and StorageFull.where
