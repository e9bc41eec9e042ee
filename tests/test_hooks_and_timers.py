"""Hooks (rejection, failures, time limits) and the pure idle/lifetime decision."""

from __future__ import annotations

import asyncio
import types
from datetime import UTC, datetime, timedelta

from bai.node.manager.services.hooks import HookRejected, Hooks
from bai.node.manager.services.timers import IDLE_TIMEOUT, LIFETIME, expired
from bai.node.manager.state.records import Session
from tests.records import a_session

SESSION = {"id": "s1", "name": "demo", "access_key": "AK"}


def hook(**fns) -> types.SimpleNamespace:
    return types.SimpleNamespace(**fns)


async def test_a_hook_rejects_by_returning_a_reason() -> None:
    hooks = Hooks([("quota", hook(before_enqueue=lambda s: "over quota"))])
    reason, notes = await hooks.before_enqueue(SESSION)
    assert reason == "over quota (hook quota)"
    assert notes == []


async def test_a_hook_rejects_by_raising() -> None:
    def refuse(session):
        raise HookRejected(f"{session['name']} is not allowed")

    reason, _ = await Hooks([("policy", hook(before_enqueue=refuse))]).before_enqueue(SESSION)
    assert reason == "demo is not allowed (hook policy)"


async def test_async_hooks_and_hooks_that_accept() -> None:
    seen = []

    async def record(session):
        seen.append(session["id"])

    hooks = Hooks([("a", hook(before_enqueue=lambda s: None)), ("b", hook(before_enqueue=record))])
    assert await hooks.before_enqueue(SESSION) == (None, [])
    assert seen == ["s1"]


async def test_failing_and_hanging_hooks_are_noted_not_fatal() -> None:
    async def hang(session):
        await asyncio.sleep(10)

    def crash(session):
        raise RuntimeError("boom")

    hooks = Hooks(
        [("slow", hook(before_enqueue=hang, after_start=hang)), ("bad", hook(before_enqueue=crash))], timeout=0.2
    )
    started = asyncio.get_running_loop().time()
    reason, notes = await hooks.before_enqueue(SESSION)
    assert reason is None
    assert asyncio.get_running_loop().time() - started < 2
    assert notes == [
        "hook slow before_enqueue timed out after 0.2 s",
        "hook bad before_enqueue failed: RuntimeError: boom",
    ]
    assert await hooks.notify("after_start", SESSION) == ["hook slow after_start timed out after 0.2 s"]
    assert await hooks.notify("after_termination", SESSION) == []  # nobody listens


def test_hooks_load_configured_modules() -> None:
    hooks = Hooks.load(["json"])  # any importable module; json has none of the hook functions
    assert hooks.hooks[-1][0] == "json"


NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def running(sid: str, *, age: float, since: float, kind: str = "interactive", key: str = "AK") -> Session:
    return a_session(
        id=sid,
        access_key=key,
        type=kind,
        created_at=(NOW - timedelta(seconds=age)).isoformat(),
        status_changed=(NOW - timedelta(seconds=since)).isoformat(),
    )


def test_idle_sessions_end_but_busy_batch_and_active_ones_do_not() -> None:
    policy = {"AK": {"idle_timeout": 60, "max_session_lifetime": 0}}
    sessions = [
        running("idle", age=300, since=120),
        running("active", age=300, since=120),
        running("busy", age=300, since=120),
        running("batch", age=300, since=120, kind="batch"),
        running("fresh", age=30, since=30),
    ]
    activity = {"active": NOW - timedelta(seconds=10)}
    assert expired(sessions, policy, activity, NOW, busy={"busy"}) == [("idle", IDLE_TIMEOUT)]


def test_lifetime_applies_to_every_session_and_zero_means_none() -> None:
    sessions = [running("old", age=7200, since=1, kind="batch"), running("young", age=60, since=1)]
    assert expired(sessions, {"AK": {"max_session_lifetime": 3600}}, {}, NOW) == [("old", LIFETIME)]
    assert expired(sessions, {"AK": {"max_session_lifetime": 0, "idle_timeout": 0}}, {}, NOW) == []
    assert expired(sessions, {}, {}, NOW) == []  # unknown keypair: no limits
