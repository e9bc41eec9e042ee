"""A session in ERROR (or any live status) can always be forced to an end by its owner or an admin, and its
kernels go from every agent that has one, now or when the agent comes back; an agent that comes back with (or
still runs) the kernel of a session the manager has ended has it removed and its slots freed, said once in the
log. On the in-process harness (tests/harness.py)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from bai.common.problems import Problem
from bai.node.manager.domain_errors import DomainError, Forbidden
from bai.node.manager.http.problems import as_problem, problem_of
from tests.harness import Harness


async def _errored(h: Harness, name: str, owner: str, agent: str = "a1") -> dict:
    """A running session of `owner` whose agent is lost: ERROR (agent-lost), its kernel still on the agent."""
    await h.run(name, owner=owner, cpu=1)
    return await h.row(name)


async def test_a_session_lost_with_its_agent_is_forced_to_an_end_by_its_owner_and_by_an_admin(tmp_path) -> None:
    async with Harness(tmp_path, lost_grace=0.01) as h:
        await h.add_agent("a1", cpu=2, keeps_kernels=True)  # its kernels outlive it, as containers do
        user = await h.keypair("user-1")
        await _errored(h, "mine-1", user)
        await _errored(h, "mine-2", user)
        kernels = h.kernels_on("a1")
        assert len(kernels) == 2
        await h.lose_agent("a1")
        for name in ("mine-1", "mine-2"):
            assert (await h.wait(name, "ERROR")).status_info == "agent-lost"
        # not forced: a clear 403 that says to use forced (Backend.AI's), and nothing changes
        with pytest.raises(Forbidden) as refused:
            await h.destroy("mine-1", owner=user)
        problem = problem_of(refused.value)
        assert problem.status == 403 and "forced=true" in (problem.msg or "")
        assert await h.status("mine-1") == "ERROR"
        # forced, by the owner (by name) and by an admin (by id): ended, never an IllegalTransition
        await h.destroy("mine-1", forced=True, owner=user)
        other = await h.row("mine-2")
        await h.lifecycle.destroy(await h.reads.resolve(other.id, h.admin, ids_of=None), forced=True)
        for name in ("mine-1", "mine-2"):
            ended = await h.wait(name, "TERMINATED")
            assert ended.status_info == "force-terminated"
            assert "stopped heartbeating" in ended.status_data["msg"]  # why it failed is kept
        assert h.kernels_on("a1") == kernels  # the agent is away: it could not be told yet
        # the agent comes back with both kernels: the manager has ended their sessions, so they go
        await h.start_agent("a1", keep_kernels=True)
        assert h.kernels_on("a1") == set()
        await h.run("takes-all", cpu=2)  # and their slots are free


async def test_an_agent_back_with_the_kernel_of_a_session_in_error_has_it_removed_said_once(tmp_path, caplog) -> None:
    async with Harness(tmp_path, lost_grace=0.01) as h:
        await h.add_agent("a1", cpu=2, keeps_kernels=True)
        await h.run("holds-slots", cpu=2)
        await h.lose_agent("a1")
        await h.wait("holds-slots", "ERROR")
        with caplog.at_level(logging.WARNING, logger="bai.manager"):
            await h.start_agent("a1", keep_kernels=True)
        ended = await h.wait("holds-slots", "TERMINATED")
        assert ended.status_info == "agent-lost"  # the reason stays
        assert "its kernel was removed when agent a1 came back" in ended.status_data["msg"]
        assert h.kernels_on("a1") == set()
        said = [r.getMessage() for r in caplog.records if "of sessions that have ended" in r.getMessage()]
        assert len(said) == 1 and "agent a1 came back with 1 kernel(s)" in said[0], said
        await h.run("after-it", cpu=2)  # its slots are free, on the manager and on the agent


async def test_a_kernel_an_agent_still_runs_of_an_ended_session_goes_at_its_next_heartbeat(tmp_path, caplog) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("a1", cpu=2)
        await h.run("left-behind", cpu=2)
        kernels = h.kernels_on("a1")
        real = h.lifecycle._remove_kernel

        async def fails(*args, **kw):  # the agent did not answer the removal (a timeout): the kernel stays
            return None

        h.lifecycle._remove_kernel = fails  # type: ignore[method-assign]
        await h.destroy("left-behind", forced=True)
        h.lifecycle._remove_kernel = real  # type: ignore[method-assign]
        assert await h.status("left-behind") == "TERMINATED"
        assert h.kernels_on("a1") == kernels  # still running, its slots taken on the agent
        with caplog.at_level(logging.WARNING, logger="bai.manager"):
            await h.heartbeat("a1")
            await h.until(lambda: not h.kernels_on("a1"), what="the stray kernel is removed")
            await h.heartbeat("a1")
            await h.heartbeat("a1")
        said = [r.getMessage() for r in caplog.records if "still runs" in r.getMessage()]
        assert len(said) == 1, said
        await h.run("next-one", cpu=2)


async def test_forced_destroy_from_every_live_status_ends_the_session_and_removes_its_kernels(tmp_path) -> None:
    """PENDING, SCHEDULED, PREPARING, PULLING, RUNNING, RESTARTING, RUNNING_DEGRADED, TERMINATING, ERROR: each
    forced destroy ends the session (CANCELLED or TERMINATED) and leaves no kernel on the agent."""
    from bai.common.status import SessionStatus as S
    from bai.node.link.messages import KernelPulling

    async with Harness(tmp_path, lost_grace=0.01) as h:
        await h.add_agent("slow", cpu=16, mem="64g", start_delay=60)
        ended = {}
        # PENDING: never scheduled; SCHEDULED: placed by a round whose start has not begun
        await h.create("st-pending")
        await h.destroy("st-pending", forced=True)
        ended["st-pending"] = await h.status("st-pending")
        scheduled = await h.create("st-scheduled")
        [kernel] = await h.store.kernels_of(scheduled.id)
        await h.store.apply_round([(scheduled.id, {kernel.id: "slow"})], [], [], [], h.clock.now())
        # PREPARING and PULLING: being created on the slow agent
        preparing = await h.create("st-preparing")
        pulling = await h.create("st-pulling")
        await h.dispatcher.round()
        await h.wait("st-preparing", "PREPARING")
        [pk] = await h.store.kernels_of(pulling.id)
        await h.wait("st-pulling", "PREPARING")
        await h.lifecycle.kernel_pulling(KernelPulling(pk.id, pulling.id, "python", 1, 2))
        assert await h.status("st-pulling") == "PULLING"
        for row in (scheduled, preparing, pulling):
            await h.destroy(row.name, forced=True)
            ended[row.name] = await h.status(row.name)
        # the running ones, on an agent that starts at once
        await h.add_agent("fast", cpu=16, mem="64g", keeps_kernels=True)
        await h.drain("slow")
        for name, status in (
            ("st-running", None),
            ("st-restarting", S.RESTARTING),
            ("st-degraded", S.RUNNING_DEGRADED),
            ("st-terminating", S.TERMINATING),
        ):
            row = await h.run(name)
            if status is not None:
                await h.lifecycle.transition(row.id, status, "", {}, allowed_from=[S.RUNNING])
            await h.destroy(name, forced=True)
            ended[name] = await h.status(name)
        await h.run("st-error")
        await h.lose_agent("fast")
        await h.wait("st-error", "ERROR")
        await h.destroy("st-error", forced=True)
        ended["st-error"] = await h.status("st-error")
        assert ended == {
            "st-pending": "CANCELLED",
            "st-scheduled": "CANCELLED",
            "st-preparing": "TERMINATED",
            "st-pulling": "CANCELLED",
            "st-running": "TERMINATED",
            "st-restarting": "TERMINATED",
            "st-degraded": "TERMINATED",
            "st-terminating": "TERMINATED",
            "st-error": "TERMINATED",
        }
        await h.start_agent("fast", keep_kernels=True)  # the ERROR one's kernel goes when its agent is back
        assert h.kernels_on("fast") == set()
        assert h.kernels_on("slow") == set()


def test_every_live_status_has_a_forced_destroy_and_it_is_a_legal_move() -> None:
    """The table a forced destroy follows (bai/common/status.py): ERROR→TERMINATING was the 500."""
    from bai.common.status import ACTIVE_STATUSES, FORCED_DESTROY, SESSION_TRANSITIONS
    from bai.common.status import SessionStatus as S

    assert set(FORCED_DESTROY) == set(ACTIVE_STATUSES)
    for status, target in FORCED_DESTROY.items():
        assert target in SESSION_TRANSITIONS[status], (status, target)
        if target == S.TERMINATING:
            assert S.TERMINATED in SESSION_TRANSITIONS[S.TERMINATING]


async def test_many_sessions_forced_to_an_end_from_error_leave_no_task_fd_or_kernel_behind(tmp_path) -> None:
    """200 sessions that end in ERROR and are forced to an end: afterwards the agent holds no kernel, and the
    manager no more tasks, file descriptors or bookkeeping than before (RSS measured too)."""
    import asyncio

    import psutil

    from bai.common.status import SessionStatus as S

    async with Harness(tmp_path) as h:
        await h.add_agent("a1", cpu=64, mem="256g")

        async def cycle(name: str) -> None:
            row = await h.run(name, cpu=1, mem="1g")
            await h.lifecycle.transition(row.id, S.ERROR, "agent-lost", {"msg": "gone"}, allowed_from=[S.RUNNING])
            await h.destroy(name, forced=True)

        for i in range(10):  # warm up (lazily made statements, caches)
            await cycle(f"warm-{i}")
        me = psutil.Process()
        fds, tasks, rss = me.num_fds(), len(asyncio.all_tasks()), me.memory_info().rss
        for i in range(200):
            await cycle(f"err-{i}")
        await h.heartbeat("a1")
        await asyncio.sleep(0.05)
        after_fds, after_tasks, after_rss = me.num_fds(), len(asyncio.all_tasks()), me.memory_info().rss
        print(f"fds {fds} -> {after_fds}, tasks {tasks} -> {after_tasks}, rss {rss >> 20} -> {after_rss >> 20} MiB")
        assert h.kernels_on("a1") == set()
        assert after_fds <= fds + 2 and after_tasks <= tasks + 2, (fds, after_fds, tasks, after_tasks)
        assert after_rss - rss < 32 << 20, (rss, after_rss)
        assert not h.lifecycle.starting and not h.lifecycle._removing and len(h.lifecycle._stray_looks) <= 1
        statuses = {r.status for r in await h.store.list_sessions(None, None)}
        assert statuses == {"TERMINATED"}


async def _cli(env: dict[str, str], *argv: str) -> tuple[int, str]:
    """A client program run without blocking the loop the node's API is served from."""
    import asyncio

    proc = await asyncio.create_subprocess_exec(
        *argv, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode or 0, out.decode(errors="replace")


async def test_the_cli_and_the_official_client_force_a_session_in_error_to_an_end(tmp_path) -> None:
    """`bai session destroy NAME` is refused saying to use --force; `bai session destroy --force NAME` and
    `backend.ai session rm -f NAME` (the official client, when installed) end it."""
    import os
    import sys

    from aiohttp.test_utils import TestClient, TestServer

    from bai.node.manager.http.app import make_app
    from tests.test_official_client import official_client

    async with Harness(tmp_path, lost_grace=0.01) as h:
        await h.add_agent("a1", cpu=4, keeps_kernels=True)
        user = await h.keypair("cli-user")
        for name in ("by-bai", "by-official"):
            await h.run(name, owner=user)
        await h.lose_agent("a1")
        keypairs = await h.store.keypairs()
        settings = {"keypairs": keypairs, "default_resources": h.defaults, "cluster": None}
        client = TestClient(TestServer(make_app(h.manager.services, settings)))
        await client.start_server()
        try:
            env = {
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "HOME": str(tmp_path),
                "XDG_CONFIG_HOME": str(tmp_path / "config"),
                "LANG": "C.UTF-8",
                "BACKEND_ENDPOINT": f"http://{client.host}:{client.port}",
                "BACKEND_ACCESS_KEY": user,
                "BACKEND_SECRET_KEY": keypairs[user].secret_key,
            }
            bai = [sys.executable, "-m", "bai", "session", "destroy"]
            code, out = await _cli(env, *bai, "by-bai")
            assert code != 0 and "forced" in out and "ERROR" in out, out
            assert await h.status("by-bai") == "ERROR"
            code, out = await _cli(env, *bai, "--force", "by-bai")
            assert code == 0, out
            assert (await h.row("by-bai")).status == "TERMINATED"
            program = official_client()
            code, out = await _cli(env, program, "session", "rm", "-f", "by-official")
            assert "Traceback" not in out and "error" not in out.lower(), out
            assert (await h.row("by-official")).status == "TERMINATED"
        finally:
            await client.close()
        await h.start_agent("a1", keep_kernels=True)
        assert h.kernels_on("a1") == set()


# -- any sequence of what users, admins and agents do: a forced end always works, nothing is left behind ------

OPS = [
    "create",
    "schedule",
    "destroy",
    "force",
    "admin-force",
    "restart",
    "execute",
    "lose",
    "back",
    "heartbeat",
    "removal-fails",
]


async def _scenario(base, ops: list[tuple[str, int]]) -> None:
    from bai.common.status import DEAD_STATUSES
    from bai.common.status import SessionStatus as S

    async with Harness(base, lost_grace=0.01) as h:
        await h.add_agent("a1", cpu=4, keeps_kernels=True)
        user = await h.keypair("fuzz-user")
        up = True
        names = ["fz-0", "fz-1"]
        real_remove = h.lifecycle._remove_kernel
        failing = {"left": 0}

        async def remove(agent_id, kernel_id, reason, timeout=30):
            if failing["left"] > 0:  # the agent did not answer this removal (a timeout)
                failing["left"] -= 1
                return None
            return await real_remove(agent_id, kernel_id, reason, timeout)

        h.lifecycle._remove_kernel = remove  # type: ignore[method-assign]
        await h.run(names[0], owner=user, cpu=1)  # one running, one waiting: interesting states come sooner
        await h.create(names[1], owner=user, cpu=1)

        async def live(name: str):
            rows = await h.store.find_sessions(name, user, active_only=True)
            return rows[0] if rows else None

        async def settle() -> None:
            await h.until(lambda: not h.lifecycle.starting, what="starts are done")
            for _ in range(5):
                await asyncio.sleep(0)

        for op, i in ops:
            name = names[i % len(names)]
            row = await live(name)
            try:
                if op == "create" and row is None:
                    await h.create(name, owner=user, cpu=1)
                elif op == "schedule":
                    await h.schedule()
                elif op in ("destroy", "force") and row is not None:
                    await h.lifecycle.destroy(row, forced=op == "force")
                elif op == "admin-force" and row is not None:
                    await h.lifecycle.destroy(await h.reads.resolve(row.id, h.admin, ids_of=None), forced=True)
                elif op == "restart" and row is not None:
                    await h.ops.restart(row)
                elif op == "execute" and row is not None:
                    await h.ops.execute(row, "r" + str(len(ops)), "query", "print(1)", {}, 1.0)
                elif op == "lose" and up:
                    await h.lose_agent("a1")
                    up = False
                elif op == "back" and not up:
                    await h.start_agent("a1", keep_kernels=True)
                    up = True
                elif op == "heartbeat" and up:
                    await h.heartbeat("a1")
                elif op == "removal-fails":
                    failing["left"] += 1
            except (Problem, DomainError) as e:
                p = as_problem(e)
                # a refusal, never a failure of the node (503: the agent is away, as Backend.AI says it)
                assert p.status < 500 or p.slug == "instance-not-available", (op, p.status, p.msg)
            await settle()
        # the end: every live session is forced to an end by its owner (its agent there or not), the agent is
        # back, and nothing is left
        failing["left"] = 0
        for name in names:
            row = await live(name)
            if row is not None:
                await h.lifecycle.destroy(row, forced=True)
        if not up:
            await h.start_agent("a1", keep_kernels=True)
        await settle()
        await h.heartbeat("a1")
        await h.until(lambda: not h.kernels_on("a1"), what="every kernel of an ended session is removed")
        for row in await h.store.list_sessions(None, None):
            assert S(row.status) in DEAD_STATUSES, row
        assert not h.lifecycle._removing


def test_any_sequence_of_user_admin_and_agent_actions_ends_with_a_forced_end_and_nothing_left(tmp_path) -> None:
    import tempfile
    from pathlib import Path

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 1)), max_size=14))
    def run(ops: list[tuple[str, int]]) -> None:
        with tempfile.TemporaryDirectory(dir=tmp_path) as base:
            asyncio.run(_scenario(Path(base), ops))

    run()
