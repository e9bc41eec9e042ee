"""Live statistics on the manager (bai/node/manager/services/stats_book.py): the book of samples, the renderings
the official client prints, and what the API shows: `usage` on sessions, kernels and agents, `lastStat`,
GraphQL `live_stat` / `last_stat`, the final statistics a destroy answers (kept across a manager restart),
`GET /bai/session/{ref}/stats` and the dashboard's `usage` event.

Most of it runs on the in-process cluster (tests/harness.py), fed KernelStats events as an agent sends them;
the end-to-end part runs a sim node (its sim kernels' figures come from BAI_SIM_CPU_PCT / BAI_SIM_MEM_MIB).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bai.common.config import ConfigError, check
from bai.node.manager.http.graphql.agent_fields import agent_item
from bai.node.manager.http.represent import agent_items, session_graphql, session_json
from bai.node.manager.services.stats_book import StatsBook, agent_live_stat, last_stat, live_stat, stat_history_of
from bai.node.manager.state.records import Kernel
from tests.harness import Harness
from tests.nodeproc import ROOT, Node, admin_keys, signed_request

MiB = 1024 * 1024
OFFICIAL_PYTHON = ROOT / ".venv-bac" / "bin" / "python"


def sample(at: float, cpu: float = 25.0, mem: int = 64 * MiB, **more: Any) -> dict[str, Any]:
    return {
        "at": at,
        "cpu_util": cpu,
        "cpu_used": 1000.0,
        "mem": mem,
        "mem_peak": mem,
        "net_rx": 10,
        "net_tx": 20,
        "io_read": 30,
        "io_write": 40,
        "pids": 3,
        **more,
    }


NODE = {
    "at": 1.0,
    "cpu_util": 150.0,
    "cpu_count": 4,
    "cpu_per_core": [50.0, 50.0, 25.0, 25.0],
    "mem": 2 << 30,
    "mem_total": 8 << 30,
    "net_rx": 100,
    "net_tx": 200,
}


# -- the book ------------------------------------------------------------------------------------------------


def test_the_book_keeps_a_ring_of_samples_peaks_and_forgets_ended_kernels() -> None:
    book = StatsBook(history=3)
    assert book.unknown(["k1"]) == ["k1"]
    book.bind("k1", "s1", "AK", "a1")
    assert book.record("a1", {"k1": sample(1.0, cpu=90.0), "stray": sample(1.0)}, NODE) == ["k1"]
    for i in range(2, 6):
        book.record("a1", {"k1": sample(float(i), mem=i * MiB)})
    assert [s["at"] for s in book.samples_of("k1")] == [3.0, 4.0, 5.0]  # the last 3, oldest first
    assert book.latest("k1")["at"] == 5.0
    assert book.peaks("k1") == {"cpu_util": 90.0, "mem": 64 * MiB}  # over the whole life, not the ring
    assert book.session_usage("s1")["memBytes"] == 5 * MiB
    usage = book.agent_usages()["a1"]
    assert usage["cpuPct"] == 150.0 and usage["cpuCount"] == 4 and usage["memTotalBytes"] == 8 << 30
    assert usage["kernelsCpuPct"] == 25.0 and usage["kernelsMemBytes"] == 5 * MiB
    book.forget("s1")
    assert book.latest("k1") is None and book.kernels_of("s1") == []
    book.record("a1", {"k1": sample(6.0)})  # a late sample brings nothing back
    assert book.unknown(["k1"]) == [] and book.latest("k1") is None
    book.agent_left("a1")
    assert "a1" not in book.agent_usages()


def test_malformed_samples_are_skipped() -> None:
    book = StatsBook()
    book.bind("k1", "s1", "AK")
    assert book.record("a1", {"k1": {"cpu_util": 5}}, {"no": "at"}) == []  # no `at`
    assert book.record("a1", {"k1": {"at": float("nan")}}) == []
    assert book.record("a1", {"k1": "text"}, "text") == []
    assert book.latest("k1") is None and book.agent_usages() == {}
    assert live_stat(None) is None and last_stat({}) is None and agent_live_stat(None) is None
    # figures of the wrong type are left out of the renderings, not fatal
    odd = live_stat({"at": 1.0, "cpu_util": "x", "mem": None, "net_rx": 5, "gpus": {"g": "x"}})
    assert odd is not None and set(odd) == {"net_rx"}


def test_stat_history_setting_is_checked() -> None:
    assert stat_history_of({"manager": {}}) == 150
    assert stat_history_of({"manager": {"stat_history": 10}}) == 10
    for bad in (0, -1, 10**9, True, "5", 2.5):
        with pytest.raises(ValueError, match="stat_history"):
            stat_history_of({"manager": {"stat_history": bad}})
    with pytest.raises(ConfigError, match="stat_history"):
        check({"manager": {"stat_history": "many"}}, Path("bai.toml"))


# -- renderings ----------------------------------------------------------------------------------------------


def _strings(metrics: dict[str, Any]) -> None:
    for key, metric in metrics.items():
        if key in ("status", "version"):
            continue
        for name, value in metric.items():
            assert value is None or isinstance(value, str), (key, name, value)


def test_live_and_last_stat_are_backend_ai_v2_metrics() -> None:
    s = sample(1.0, cpu=150.0, mem=256 * MiB, gpus={"GPU-1": {"util": 40.0, "mem": 1 << 30}})
    live = live_stat(s, {"cpu": "2", "mem": str(1 << 30)}, {"cpu_util": 190.0, "mem": 300 * MiB})
    assert live is not None
    _strings(live)
    assert live["cpu_util"] == {
        "current": "150",
        "capacity": "200",
        "pct": "150",
        "unit_hint": "percent",
        "stats.max": "190",
    }
    assert live["cpu_used"]["unit_hint"] == "msec" and live["cpu_used"]["current"] == "1000"
    assert live["mem"]["capacity"] == str(1 << 30) and live["mem"]["pct"] == "25"
    assert live["mem"]["stats.max"] == str(300 * MiB)
    for key in ("io_read", "io_write", "net_rx", "net_tx"):
        assert live[key]["unit_hint"] == "bytes"
    assert live["cuda_util"]["pct"] == "40" and live["cuda_mem"]["current"] == str(1 << 30)
    final = last_stat(s, {"cpu": "2"})
    assert final is not None and final["status"] == "terminated" and final["version"] == 2
    agent = agent_live_stat(NODE)
    assert agent is not None and set(agent) == {"node", "devices"}
    assert len(agent["devices"]["cpu_util"]) == 4
    assert agent["node"]["mem"] == {
        "current": str(2 << 30),
        "capacity": str(8 << 30),
        "pct": "25",
        "unit_hint": "bytes",
    }


def _official(script: str, data: Any) -> str:
    if not OFFICIAL_PYTHON.is_file():
        pytest.skip("the official client is not installed in .venv-bac")
    out = subprocess.run(
        [str(OFFICIAL_PYTHON), "-c", script], input=json.dumps(data), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_official_client_prints_the_renderings() -> None:
    s = sample(1.0, cpu=42.5, gpus={"GPU-1": {"util": 40.0, "mem": 1 << 30}})
    node = {**NODE, "gpus": {"GPU-1": {"util": 40.0, "mem": 1 << 30, "mem_total": 16 << 30}}}
    data = {
        "last": last_stat(s, {"cpu": "1", "mem": str(1 << 30)}),
        "live": json.dumps(live_stat(s, {"cpu": "1"})),
        "agents": [
            json.dumps(agent_live_stat(n))
            for n in (node, {"at": 1.0}, {**NODE, "cpu_count": 16, "cpu_per_core": [5.0] * 16})
        ],
    }
    out = _official(
        "import json, sys\n"
        "from ai.backend.client.cli.session.execute import format_stats\n"
        "from ai.backend.client.output.formatters import AgentStatFormatter, KernelStatFormatter\n"
        "d = json.load(sys.stdin)\n"
        "print(format_stats(d['last']))\n"
        "print(KernelStatFormatter().format_console(d['live'], None))\n"
        "print(KernelStatFormatter().format_console(None, None))\n"
        "for a in d['agents'] + [None]:\n"
        "    print(AgentStatFormatter().format_console(a, None))\n",
        data,
    )
    assert "cpu_util" in out and "42.50" in out and "MiB" in out and "msec" in out
    assert "cpu_util: 150 % (4 cores)" in out and "GPU-1" in out
    assert "per-core stats hidden" in out  # 16 cores


# -- the in-process cluster ---------------------------------------------------------------------------------


async def _feed(h: Harness, agent_id: str, samples: dict[str, dict[str, Any]], node: dict | None = None) -> None:
    payload = {"samples": samples, "node": node or {**NODE, "at": time.time()}}
    await h.agent_events.agent_event(agent_id, "kernel_stats", payload)


async def _kernel(h: Harness, ref: str) -> Kernel:
    return (await h.store.kernels_of((await h.row(ref)).id))[0]


async def test_a_session_shows_its_usage_live_stat_and_final_stats(tmp_path: Path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("a1", cpu=4, mem="8g")
        await h.run("stats-one", cpu=2, mem="1g")
        assert (await h.info("stats-one"))["usage"] is None  # before any sample
        kernel = await _kernel(h, "stats-one")
        now = time.time()
        await _feed(h, "a1", {kernel.id: sample(now, cpu=180.0, mem=700 * MiB)})
        await _feed(h, "a1", {kernel.id: sample(now + 1, cpu=60.0, mem=300 * MiB)})

        info = await h.info("stats-one")
        assert info["usage"]["cpuPct"] == 60.0 and info["usage"]["memBytes"] == 300 * MiB
        assert info["usage"]["pids"] == 3 and info["usage"]["netTxBytes"] == 20
        assert info["kernels"][0]["usage"] == info["usage"]
        assert info["lastStat"]["cpu_util"]["stats.max"] == "180"  # live: the live figures
        listed = await session_json(h.services, await h.row("stats-one"))
        assert listed["usage"] == info["usage"] and "lastStat" not in listed

        graphql = await session_graphql(h.services, await h.row("stats-one"))
        (container,) = graphql["containers"]
        assert container["last_stat"] is None
        live = json.loads(container["live_stat"])
        assert live["mem"]["current"] == str(300 * MiB) and live["mem"]["capacity"] == str(1 << 30)

        (agent,) = await agent_items(h.agents, h.services.stats)
        assert agent["usage"]["kernelsCpuPct"] == 60.0 and agent["usage"]["cpuCount"] == 4
        item = agent_item(agent, h.services.stats.nodes["a1"])
        assert json.loads(item["live_stat"])["node"]["cpu_util"]["pct"] == "150"
        assert item["cpu_cur_pct"] == 150.0

        stats = await h.lifecycle.destroy(await h.row("stats-one"), False)
        assert stats["status"] == "terminated" and stats["version"] == 2
        assert stats["mem"]["stats.max"] == str(700 * MiB)  # the peak over its life
        assert not h.services.stats.kernels  # forgotten once ended

        ended = await h.info("stats-one")
        assert ended["lastStat"]["status"] == "terminated" and ended["usage"] is not None
        graphql = await session_graphql(h.services, await h.row("stats-one"))
        (container,) = graphql["containers"]
        assert container["live_stat"] is None and json.loads(container["last_stat"])["status"] == "terminated"
        stored = await _kernel(h, "stats-one")

    async with Harness(tmp_path) as h:  # a manager restart: the final statistics are in the store
        again = await h.info("stats-one")
        assert again["lastStat"] == ended["lastStat"] and again["usage"] == ended["usage"]
        assert (await _kernel(h, "stats-one")).last_stat == stored.last_stat


async def test_the_final_stats_come_from_the_agent_or_the_last_sample(tmp_path: Path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("a1", cpu=4, mem="8g")
        # the agent's own rounds reach the book; the destroy answers its final sample (the sim kernel's figures:
        # BAI_SIM_CPU_PCT, BAI_SIM_MEM_MIB)
        await h.run("from-agent", environ={"BAI_SIM_CPU_PCT": "30", "BAI_SIM_MEM_MIB": "123"})
        await h.send_stats("a1")
        usage = (await h.info("from-agent"))["usage"]
        assert usage["cpuPct"] == 30.0 and usage["memBytes"] == 123 * MiB, usage
        stats = await h.lifecycle.destroy(await h.row("from-agent"), False)
        assert stats["mem"]["current"] == str(123 * MiB) and stats["cpu_util"]["pct"] == "30"
        # a destroy that does not wait answers the latest sample the manager has
        await h.run("no-wait")
        kernel = await _kernel(h, "no-wait")
        await _feed(h, "a1", {kernel.id: sample(time.time(), cpu=11.0)})
        stats = await h.lifecycle.destroy(await h.row("no-wait"), False, wait=False)
        assert stats["cpu_util"]["current"] == "11"
        await h.wait("no-wait", "TERMINATED")
        # a kernel that ended by itself, with its last sample in the event
        await h.run("by-itself")
        kernel = await _kernel(h, "by-itself")
        event = {"kernel_id": kernel.id, "session_id": kernel.session_id, "exit_code": 0}
        await h.agent_events.agent_event("a1", "kernel_terminated", {**event, "stats": sample(time.time(), cpu=7.0)})
        await h.wait("by-itself", "TERMINATED")
        assert (await h.info("by-itself"))["lastStat"]["cpu_util"]["current"] == "7"
        # a session cancelled before it ran has no statistics
        await h.create("never-ran")  # (no round: it stays PENDING)
        assert await h.lifecycle.destroy(await h.row("never-ran"), False) == {}
        assert (await h.info("never-ran"))["lastStat"] is None


async def test_samples_of_unknown_or_ended_kernels_are_ignored(tmp_path: Path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("a1")
        await h.run("ends-soon")
        kernel = await _kernel(h, "ends-soon")
        await h.destroy("ends-soon")
        await _feed(h, "a1", {kernel.id: sample(time.time()), "no-such-kernel": sample(time.time())})
        assert h.services.stats.kernels == {}
        await _feed(h, "a1", {"no-such-kernel": sample(time.time())})  # looked up once only
        assert "no-such-kernel" in h.services.stats.ended
        await h.agent_events.agent_event("a1", "kernel_stats", {"samples": "garbage", "node": 5})
        await h.agent_events.agent_event("a1", "kernel_stats", {"samples": {"k": {"at": "x"}}})


async def test_a_lost_agent_stores_its_kernels_last_samples(tmp_path: Path) -> None:
    async with Harness(tmp_path) as h:
        await h.add_agent("a1")
        await h.run("on-lost")
        kernel = await _kernel(h, "on-lost")
        await _feed(h, "a1", {kernel.id: sample(time.time(), cpu=33.0)})
        await h.agent_events.agent_left("a1", "lost")  # (the link's word; the agent itself stays up)
        h.advance(h.cfg["manager"]["lost_grace"])  # its grace period runs out
        await h.wait("on-lost", "ERROR")
        assert (await h.info("on-lost"))["lastStat"]["cpu_util"]["current"] == "33"
        assert "a1" not in h.services.stats.nodes


# -- end to end: a sim node ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sim_node(tmp_path_factory) -> Iterator[Node]:
    config = 'cpu = "4"\nmem = "8g"\nstat_interval = 0.5\n'
    node = Node(tmp_path_factory.mktemp("stats"), "sim", agent_config=config).start()
    yield node
    node.stop()


def _until(fn, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.2)
    return value


def test_sim_sessions_and_agents_show_their_usage(sim_node: Node) -> None:
    access, secret = admin_keys(sim_node)
    name = "e2e-" + uuid.uuid4().hex[:6]
    sim_node.cli("session", "create", "sim", "--name", name, "-e", "BAI_SIM_CPU_PCT=50", "-e", "BAI_SIM_MEM_MIB=100",
                 check=True)  # fmt: skip

    def usage() -> dict | None:
        status, body = signed_request(sim_node, "GET", f"/session/{name}", access, secret)
        assert status == 200, body
        return body["usage"]  # type: ignore[index]

    got = _until(usage)
    assert got and got["cpuPct"] == 50.0 and got["memBytes"] == 100 * MiB, got
    status, body = signed_request(sim_node, "GET", f"/bai/session/{name}/stats", access, secret)
    assert status == 200, body
    (history,) = body["kernels"].values()  # type: ignore[index]
    assert history and all(u["cpuPct"] == 50.0 for u in history)
    status, body = signed_request(sim_node, "GET", "/bai/agents", access, secret)
    (agent,) = body["items"]  # type: ignore[index]
    assert agent["usage"]["kernelsCpuPct"] >= 50.0 and agent["usage"]["cpuCount"] >= 1, agent

    # the dashboard stream: rows with usage, then `usage` events
    from tests.tui_support import node_client

    async def stream() -> tuple[dict, dict]:
        events = node_client(sim_node).dashboard_events()
        kind, snap = await anext(events)
        assert kind == "snapshot"
        async for kind, data in events:
            if kind == "usage" and data["sessions"]:
                await events.aclose()
                return snap, data
        raise AssertionError("the stream ended")

    import asyncio

    snap, event = asyncio.run(asyncio.wait_for(stream(), 30))
    row = {s["name"]: s for s in snap["sessions"]}[name]
    assert row["usage"]["cpuPct"] == 50.0
    assert all("cpuPct" in u for u in event["sessions"].values())

    out = sim_node.cli("session", "destroy", name, check=True)
    assert out.returncode == 0
    status, body = signed_request(sim_node, "GET", f"/session/{name}", access, secret)
    assert body["lastStat"]["status"] == "terminated", body  # type: ignore[index]


def test_users_see_only_their_own_stats(sim_node: Node) -> None:
    admin = admin_keys(sim_node)
    user = sim_node.json("keypair", "create", "--user", "stats-user")
    name = "mine-" + uuid.uuid4().hex[:6]
    sim_node.cli("session", "create", "sim", "--name", name, check=True)
    sid = sim_node.json("session", "info", name)["id"]
    status, _ = signed_request(sim_node, "GET", f"/bai/session/{sid}/stats", user["accessKey"], user["secretKey"])
    assert status == 404
    status, _ = signed_request(sim_node, "GET", f"/bai/session/{sid}/stats", *admin)
    assert status == 200
    sim_node.cli("session", "destroy", name, check=True)


TEXT = st.text(max_size=40) | st.sampled_from(["", "\x00", "..", "x" * 3000, "\ud800", "%", "?", "#"])


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ref=TEXT, query=st.dictionaries(st.text(max_size=6), st.text(max_size=20), max_size=3), admin=st.booleans())
def test_the_stats_route_never_answers_a_server_error(sim_node: Node, ref: str, query: dict, admin: bool) -> None:
    from urllib.parse import quote

    keys = admin_keys(sim_node)
    if not admin:
        user = getattr(sim_node, "_fuzz_user", None) or sim_node.json("keypair", "create", "--user", "stats-fuzz")
        sim_node._fuzz_user = user  # type: ignore[attr-defined]
        keys = (user["accessKey"], user["secretKey"])
    qs = "&".join(
        f"{quote(k.encode('utf-8', 'surrogatepass'), safe='')}={quote(v.encode('utf-8', 'surrogatepass'), safe='')}"
        for k, v in query.items()
    )
    path = f"/bai/session/{quote(ref.encode('utf-8', 'surrogatepass'), safe='')}/stats" + (f"?{qs}" if qs else "")
    status, answer = signed_request(sim_node, "GET", path, *keys)
    assert status < 500, (path, answer)
    if status >= 400:
        assert isinstance(answer, dict) and "type" in answer, answer


# -- the official client against a sim node ---------------------------------------------------------------


def _official_cli(node: Node, tmp_path: Path, *args: str) -> str:
    from tests.test_official_client import Official, official_client

    if not OFFICIAL_PYTHON.is_file() and not os.environ.get("BAI_OFFICIAL_CLIENT"):
        pytest.skip("the official client is not installed")
    return Official(official_client(), node, tmp_path)(*args)


def test_the_official_client_prints_statistics(sim_node: Node, tmp_path: Path) -> None:
    out = _official_cli(sim_node, tmp_path, "run", "--rm", "-s", "sim", "-c", "print(1)")
    assert "Statistics:" in out and "cpu_util" in out and "Traceback" not in out, out
    name = "oc-" + uuid.uuid4().hex[:6]
    sim_node.cli("session", "create", "sim", "--name", name, "-e", "BAI_SIM_CPU_PCT=20", check=True)
    sid = sim_node.json("session", "info", name)["id"]
    access, secret = admin_keys(sim_node)
    _until(lambda: signed_request(sim_node, "GET", f"/session/{name}", access, secret)[1]["usage"])  # type: ignore[index]
    for args in (("admin", "session", "info", sid), ("session", "info", sid)):
        out = _official_cli(sim_node, tmp_path, *args)
        assert name in out and "Traceback" not in out and "cpu_util" in out, out
    out = _official_cli(sim_node, tmp_path, "admin", "agent", "info", sim_node.agent_id)
    assert "Traceback" not in out and "cores" in out, out
    out = _official_cli(sim_node, tmp_path, "admin", "agent", "list")
    assert "Traceback" not in out and sim_node.agent_id in out, out
    out = _official_cli(sim_node, tmp_path, "session", "destroy", "-s", name)
    assert "Traceback" not in out and "cpu_util" in out, out
