"""Usage per month and per period, as Backend.AI answers them, and bai's own report (`bai usage`, `GET /bai/usage`).

First the pure rules (bai/node/manager/rules/usage.py); then one sim node: sessions of two users in two projects
run and end, and the month / period answers hold them with their figures and their projects; a user reads only
its own; bad parameters are 400s; the official clients' usage commands print without a traceback."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bai.common.problems import Problem
from bai.node.manager.rules import usage as rules
from bai.node.manager.rules.usage import KernelFacts, Period
from tests.nodeproc import ROOT, Node, admin_keys, signed_request

FAKE_NVML = ROOT / "tests" / "fake_nvml"
GPUS = [{"uuid": f"GPU-{i}", "name": "Fake H200", "memory": 141 << 30, "util": 0, "used": 0} for i in range(2)]

T0 = datetime(2026, 11, 30, 23, 0, tzinfo=UTC)


def facts(
    started: datetime | None = T0,
    ended: datetime | None = T0 + timedelta(hours=2),
    slots: dict[str, str] | None = None,
    sample: dict[str, Any] | None = None,
    **more: Any,
) -> KernelFacts:
    base: dict[str, Any] = {
        "kernel_id": "k1",
        "session_id": "s1",
        "session_name": "one",
        "access_key": "AKUSER",
        "project_id": "p1",
        "domain_name": "default",
        "image": "python",
        "agent_id": "a1",
        "container_id": "c1",
        "status": "TERMINATED",
        "status_info": "user-requested",
        "status_changed": "",
        "cluster_role": "main1",
        "cluster_size": 1,
        "created_at": T0 - timedelta(minutes=1),
        "started_at": started,
        "terminated_at": ended,
        "slots": slots if slots is not None else {"cpu": "2", "mem": str(1 << 30), "cuda.device": "1"},
        "sample": sample if sample is not None else {"cpu_used": 3_600_000.0, "mem": 100, "mem_peak": 300},
    }
    base.update(more)
    return KernelFacts(**base)


# -- the rules --------------------------------------------------------------------------------------------------


def test_months_and_days_are_periods_and_bad_ones_say_why() -> None:
    dec = rules.month_period("202612")
    assert (dec.start, dec.end) == (datetime(2026, 12, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC))
    assert rules.month_period("202602").seconds == 28 * 86400
    days = rules.days_period("20261201", "20261210")
    assert (days.start, days.end, days.label) == (
        datetime(2026, 12, 1, tzinfo=UTC),
        datetime(2026, 12, 11, tzinfo=UTC),
        "20261201..20261210",
    )
    assert rules.days_period("20261201", "20261201").seconds == 86400  # (one day: both ends included)
    assert rules.period_of("2026-12-01..2026-12-03").seconds == 3 * 86400
    assert rules.period_of("202612") == dec
    bad = [
        (lambda: rules.month_period("2026-13"), "YYYYMM"),
        (lambda: rules.month_period("202613"), "01 to 12"),
        (lambda: rules.month_period(202612), "YYYYMM"),
        (lambda: rules.days_period("20261210", "20261201"), "before start_date"),
        (lambda: rules.days_period("20260101", "20260501"), "at most 100 days"),
        (lambda: rules.days_period("20260230", "20260301"), "no date"),
        (lambda: rules.period_of("last week"), "YYYYMM"),
        (lambda: rules.check_uuid("not-a-uuid", "group_id"), "UUID"),
        (lambda: rules.month_period("999912"), "between 1970 and 9998"),
        (lambda: rules.days_period("99991231", "99991231"), "between 1970 and 9998"),
    ]
    for make, words in bad:
        with pytest.raises(Problem) as e:
            make()
        assert e.value.status == 400 and words in str(e.value.msg), e.value.msg
    assert rules.days_period("20260101", "20260410").seconds == 100 * 86400  # (100 days: allowed)


def test_a_kernel_counts_the_part_of_its_run_inside_the_period() -> None:
    dec = rules.month_period("202612")
    now = T0 + timedelta(days=10)
    u = rules.kernel_usage(facts(), dec, now)  # 23:00 Nov 30 .. 01:00 Dec 1: one hour in December
    assert u is not None
    assert (u.cpu_allocated, u.mem_allocated, u.gpu_allocated) == (2.0, 1 << 30, 1.0)
    assert (u.run_seconds, u.seconds, u.share) == (7200.0, 3600.0, 0.5)
    assert (u.cpu_used_ms, u.mem_used, u.mem_max_used, u.used_days) == (3_600_000.0, 100, 300, 2)
    assert rules.kernel_usage(facts(), rules.month_period("202610"), now) is None  # ran outside October
    assert rules.kernel_usage(facts(started=None), dec, now) is None  # never ran: used nothing
    live = rules.kernel_usage(facts(ended=None), dec, T0 + timedelta(hours=3))  # still running: until now
    assert live is not None and (live.seconds, live.used_days) == (2 * 3600.0, None)
    gpus = {"GPU-0": ("Fake H200", 80 << 30), "GPU-1": ("Fake H200", 80 << 30)}
    held = rules.kernel_usage(facts(devices=(("GPU-0", "1"), ("GPU-1", "0.5"), ("GPU-9", "1"))), dec, now, gpus)
    assert held is not None and (held.device_types, held.gpu_mem_allocated) == (("Fake H200",), 120 << 30)
    nothing = rules.kernel_usage(facts(sample={}, slots={}), dec, now)
    assert nothing is not None and (nothing.cpu_used_ms, nothing.mem_allocated, nothing.cpu_allocated) == (0, 0, 0)


def test_totals_per_key_count_allocation_times_time_and_the_share_of_use() -> None:
    dec = rules.month_period("202612")
    now = T0 + timedelta(days=10)
    inside = T0 + timedelta(days=2)
    a = rules.kernel_usage(facts(), dec, now)  # half inside
    b = rules.kernel_usage(facts(inside, inside + timedelta(hours=1), kernel_id="k2", session_id="s2"), dec, now)
    c = rules.kernel_usage(facts(inside, inside + timedelta(hours=4), kernel_id="k3", access_key="AKOTHER"), dec, now)
    assert a and b and c
    sums = rules.totals_by([a, b, c], lambda u: u.facts.access_key)
    assert list(sums) == ["AKUSER", "AKOTHER"]
    mine = sums["AKUSER"]
    assert (len(mine.sessions), mine.kernels, mine.seconds) == (2, 2, 7200.0)
    assert mine.cpu_seconds == 2 * 7200.0 and mine.gpu_seconds == 7200.0
    assert mine.cpu_used_ms == 3_600_000 * 0.5 + 3_600_000  # half of a's, all of b's
    assert mine.mem_max_used == 300
    other = sums["AKOTHER"]
    assert (other.kernels, other.seconds, other.mem_byte_seconds) == (1, 4 * 3600.0, (1 << 30) * 4 * 3600.0)


def test_fifteen_minute_buckets_hold_the_kernels_that_ran_in_them() -> None:
    now = T0 + timedelta(hours=1)
    p = Period(now - timedelta(days=30), now, "last 30 days")
    u = rules.kernel_usage(facts(T0 - timedelta(minutes=30), T0), p, now)
    assert u is not None
    out = rules.buckets([u], now)
    assert len(out) == rules.BUCKETS and out[-1].start == now.timestamp() - rules.BUCKET_SECONDS
    busy = [b for b in out if b.num_sessions]
    assert len(busy) == 3  # 22:30 .. 23:00 touches three windows (its end falls on a window's start)
    assert all(b.cpu_allocated == 2.0 and b.mem_allocated == 1 << 30 and b.gpu_allocated == 1.0 for b in busy)
    assert busy[0].start <= (T0 - timedelta(minutes=30)).timestamp() < busy[0].start + rules.BUCKET_SECONDS
    old = rules.kernel_usage(
        facts(T0 - timedelta(days=40), T0 - timedelta(days=35)), Period(T0 - timedelta(days=50), now, ""), now
    )
    assert old is not None and not any(b.num_sessions for b in rules.buckets([old], now))


# -- a sim node -------------------------------------------------------------------------------------------------


class Caller:
    def __init__(self, node: Node, access_key: str, secret_key: str) -> None:
        self.node, self.access_key, self.secret_key = node, access_key, secret_key

    def __call__(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return signed_request(self.node, method, path, self.access_key, self.secret_key, body=body)

    def ok(self, method: str, path: str, body: Any = None) -> Any:
        status, answer = self(method, path, body)
        assert status < 300, (method, path, status, answer)
        return answer


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    node = Node(tmp_path_factory.mktemp("usage"), "sim", agent_config='cpu = "32"\nmem = "64g"\nstat_interval = 0.2\n')
    node.env["PYTHONPATH"] = os.pathsep.join([str(FAKE_NVML), node.env.get("PYTHONPATH", "")])
    node.env["BAI_FAKE_NVML"] = json.dumps(GPUS)
    node.start()
    yield node
    node.stop()


@pytest.fixture(scope="module")
def team(node: Node) -> dict[str, Any]:
    """Projects usage-a (alice) and usage-b (bob); alice runs two sessions, bob one, each ends after a moment;
    every figure comes from the sim kernels' BAI_SIM_* variables."""
    admin = Caller(node, *admin_keys(node))
    pa = admin.ok("POST", "/bai/projects", {"name": "usage-a", "domain": "default"})
    pb = admin.ok("POST", "/bai/projects", {"name": "usage-b", "domain": "default"})
    callers: dict[str, Any] = {"admin": admin}
    for name, project in (("alice", "usage-a"), ("bob", "usage-b")):
        email = f"{name}@usage.example"
        admin.ok("POST", "/bai/users", {"email": email, "password": "pw-pw-pw-pw", "projects": [project]})
        keys = node.json("keypair", "create", "--user", email)
        callers[name] = Caller(node, keys["accessKey"], keys["secretKey"])
        callers[name].keys = keys
    runs = [
        ("alice", "a-one", "usage-a", 2, "1g"),
        ("alice", "a-two", "usage-a", 1, "512m"),
        ("bob", "b-one", "usage-b", 4, "2g"),
    ]
    for who, name, project, cpu, mem in runs:
        env = {"BAI_SIM_CPU_PCT": "100", "BAI_SIM_MEM_MIB": "64"}
        gpu = {"cuda.device": 1} if who == "bob" else {}  # (bob's holds a fake GPU)
        body = {
            "name": name,
            "image": "python",
            "group": project,
            "config": {"resources": {"cpu": cpu, "mem": mem, **gpu}, "environ": env},
        }
        callers[who].ok("POST", "/session", body)
    time.sleep(1.5)  # (some samples: the sim kernels' CPU time grows at 100 % of a core)
    for who, name, *_ in runs:
        callers[who].ok("DELETE", f"/session/{name}")
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        states = [callers[who].ok("GET", f"/session/{name}")["status"] for who, name, *_ in runs]
        if all(s == "TERMINATED" for s in states):
            break
        time.sleep(0.2)
    return {"callers": callers, "a": pa, "b": pb, "month": f"{datetime.now(UTC):%Y%m}"}


def _month(caller: Caller, month: str, group_ids: list[str] | None = None) -> tuple[int, Any]:
    return caller("GET", "/resource/usage/month", {"month": month, "group_ids": group_ids or []})


def test_usage_per_month_holds_each_projects_sessions_with_their_figures(team: dict[str, Any]) -> None:
    admin, a, b = team["callers"]["admin"], team["a"], team["b"]
    status, groups = _month(admin, team["month"])
    assert status == 200, groups
    by_id = {g["g_id"]: g for g in groups}
    assert {a["id"], b["id"]} <= set(by_id)
    ga, gb = by_id[a["id"]], by_id[b["id"]]
    assert (ga["g_name"], gb["g_name"], ga["domain_name"]) == ("usage-a", "usage-b", "default")
    assert sorted(c["name"] for c in ga["c_infos"]) == ["a-one", "a-two"]
    assert [c["name"] for c in gb["c_infos"]] == ["b-one"]
    assert ga["g_cpu_allocated"] == 3.0 and gb["g_cpu_allocated"] == 4.0
    assert ga["g_mem_allocated"] == (1 << 30) + (512 << 20) and gb["g_mem_allocated"] == 2 << 30
    assert (ga["g_gpu_allocated"], ga["g_device_type"], ga["g_gpu_mem_allocated"]) == (0.0, [], 0.0)
    assert (gb["g_gpu_allocated"], gb["g_device_type"], gb["g_gpu_mem_allocated"]) == (1.0, ["Fake H200"], 141 << 30)
    alice = team["callers"]["alice"]
    for c in ga["c_infos"]:
        assert c["access_key"] == alice.access_key and c["email"] == "alice@usage.example"
        assert c["group_id"] == a["id"] and c["status"] == "TERMINATED" and c["terminated_at"] != "None"
        assert c["used_days"] in (1, 2) and c["used_time"].startswith("0:00:")
        assert 0 < c["cpu_used"] < 60_000  # milliseconds: a second or two at 100 % of a core
        assert c["mem_used"] == 64 << 20
    assert ga["g_cpu_used"] == pytest.approx(sum(c["cpu_used"] for c in ga["c_infos"]), abs=0.01)
    # the later managers' tree, in the same answer
    assert ga["project_id"] == a["id"] and ga["project_name"] == "usage-a" and ga["group_unit"] == "project"
    assert ga["total_usage"]["cpu_allocated"] == 3.0 and len(ga["sessions"]) == 2
    one = next(s for s in ga["sessions"].values() if s["session_name"] == "a-one")
    assert one["group_unit"] == "session" and len(one["kernels"]) == 1
    # only the projects asked for
    status, only_b = _month(admin, team["month"], [b["id"]])
    assert status == 200 and [g["g_id"] for g in only_b] == [b["id"]]
    # another month: nothing
    assert _month(admin, "200001") == (200, [])


def test_usage_per_period_and_the_query_form_of_later_clients(team: dict[str, Any]) -> None:
    admin, a = team["callers"]["admin"], team["a"]
    today = f"{datetime.now(UTC):%Y%m%d}"
    status, groups = admin(
        "GET", "/resource/usage/period", {"group_id": a["id"], "start_date": today, "end_date": today}
    )
    assert status == 200 and [g["project_name"] for g in groups] == ["usage-a"], groups
    assert groups[0]["total_usage"]["mem_allocated"] == (1 << 30) + (512 << 20)
    path = f"/resource/usage/period?project_id={a['id']}&start_date={today}&end_date={today}"
    assert admin("GET", path)[1] == groups
    path = f"/resource/usage/month?month={team['month']}&group_ids={a['id']},{team['b']['id']}"
    status, both = admin("GET", path)
    assert status == 200 and {g["g_name"] for g in both} == {"usage-a", "usage-b"}


def test_bad_parameters_are_400s_that_say_why(team: dict[str, Any]) -> None:
    admin = team["callers"]["admin"]
    cases = [
        ("/resource/usage/month", {"month": "2026-13"}, "YYYYMM"),
        ("/resource/usage/month", {"month": "202613"}, "01 to 12"),
        ("/resource/usage/month", {}, "month is required"),
        ("/resource/usage/month", {"month": "202612", "group_ids": ["not-a-uuid"]}, "UUID"),
        ("/resource/usage/period", {"start_date": "20261210", "end_date": "20261201"}, "before start_date"),
        ("/resource/usage/period", {"start_date": "20260101", "end_date": "20260601"}, "at most 100 days"),
        ("/resource/usage/period", {"group_id": "x", "start_date": "20261201", "end_date": "20261202"}, "UUID"),
        ("/resource/usage/period", {"start_date": "20261201"}, "end_date is required"),
    ]
    for path, body, words in cases:
        status, answer = admin("GET", path, body)
        assert status == 400 and words in answer["msg"], (path, body, status, answer)
    for query in ("period=2026-13", "by=nobody", "all=maybe", "period=20261210..20261201"):
        status, answer = admin("GET", f"/bai/usage?{query}")
        assert status == 400, (query, answer)


def test_users_read_their_own_usage_only(team: dict[str, Any]) -> None:
    alice, admin = team["callers"]["alice"], team["callers"]["admin"]
    for path in ("/resource/usage/month", "/resource/usage/period", "/resource/stats/admin/month"):
        body = {"month": team["month"], "start_date": "20261201", "end_date": "20261202"}
        status, answer = alice("GET", path, body)
        assert status == 403, (path, answer)
    assert alice("POST", "/resource/recalculate-usage")[0] == 403
    mine = alice.ok("GET", f"/bai/usage?period={team['month']}")
    assert mine["scope"] == "own" and [r["key"] for r in mine["items"]] == [alice.access_key]
    row = mine["items"][0]
    assert row["sessions"] == 2 and row["name"] == "alice@usage.example"
    assert row["cpuCoreHours"] > 0 and row["memGiBHours"] > 0 and row["cpuUsedSeconds"] > 0
    assert alice("GET", "/bai/usage?all=true")[0] == 403
    every = admin.ok("GET", f"/bai/usage?period={team['month']}&by=project&all=1")
    names = {r["name"]: r for r in every["items"]}
    assert names["usage-a"]["sessions"] == 2 and names["usage-b"]["sessions"] == 1
    assert names["usage-a"]["gpuHours"] == 0 and names["usage-b"]["gpuHours"] > 0
    users = admin.ok("GET", f"/bai/usage?period={team['month']}&by=user&all=1")
    assert {"alice@usage.example", "bob@usage.example"} <= {r["name"] for r in users["items"]}
    # the 15-minute buckets: alice's hold her two sessions, everyone's bob's too
    buckets = alice.ok("GET", "/resource/stats/user/month")
    assert len(buckets) == rules.BUCKETS and max(b["num_sessions"]["value"] for b in buckets) == 2
    assert buckets[-1]["mem_allocated"]["unit_hint"] == "bytes"
    assert max(b["cpu_allocated"]["value"] for b in admin.ok("GET", "/resource/stats/admin/month")) >= 7
    answer = admin.ok("POST", "/resource/recalculate-usage")
    assert "nothing to recalculate" in answer["msg"]


def test_bai_usage_prints_a_table_and_json(node: Node, team: dict[str, Any]) -> None:
    alice = team["callers"]["alice"]
    out = node.cli("usage", "--month", team["month"], as_keypair=alice.keys, check=True).stdout
    assert alice.access_key in out and "CPU·H" in out and "alice@usage.example" in out
    assert "bob@usage.example" not in out
    found = json.loads(node.cli("usage", "--all", "--by", "project", "--json", check=True).stdout)
    assert {"usage-a", "usage-b"} <= {r["name"] for r in found["items"]}
    today = f"{datetime.now(UTC):%Y%m%d}"
    found = json.loads(node.cli("usage", "--since", today, "--until", today, "--all", "--json", check=True).stdout)
    assert found["period"]["label"] == f"{today}..{today}" and len(found["items"]) >= 2
    bad = node.cli("usage", "--month", "202612", "--since", today)
    assert bad.returncode == 2 and "not both" in bad.stderr
    bad = node.cli("usage", "--month", "2026-13")
    assert bad.returncode != 0 and "YYYYMM" in bad.stderr


# -- the official clients -----------------------------------------------------------------------------------------


def _program(version: str) -> str:
    from tests.test_official_client import official_client

    if version == "23.9":
        return official_client()
    path = os.environ.get("BAI_OFFICIAL_CLIENT26") or str(ROOT / ".venv-bac26" / "bin" / "backend.ai")
    if not Path(path).is_file():
        if os.environ.get("BAI_REQUIRE_DOCKER") == "1":
            pytest.fail(f"BAI_REQUIRE_DOCKER=1 but the official client 26.9 is not installed at {path}")
        pytest.skip(f"the official client 26.9 is not installed at {path} (backend.ai-client==26.9.6)")
    return path


@pytest.mark.parametrize("version", ["23.9", "26.9"])
def test_the_official_clients_usage_commands_print_without_a_traceback(
    version: str, node: Node, team: dict[str, Any], tmp_path: Path
) -> None:
    from tests.test_official_client import Official

    client = Official(_program(version), node, tmp_path)
    a = team["a"]["id"]
    today = f"{datetime.now(UTC):%Y%m%d}"
    month = client("admin", "resource", "usage-per-month", *_month_args(client, team["month"], a))
    assert "Traceback" not in month and "usage-a" in month and "a-one" in month, month
    period = client("admin", "resource", "usage-per-period", *_period_args(client, a, today))
    assert "Traceback" not in period, period
    if version == "23.9":  # (it reads the list Backend.AI answers as one project: so against Backend.AI 23.09 too)
        assert "No usage information during the period." in period, period
    else:
        assert "Project: usage-a" in period and "Total CPU / Memory Used:" in period, period
    recalc = client("admin", "resource", "recalculate-usage")
    assert "Traceback" not in recalc and "re-calculated" in recalc, recalc
    for command in ("user-stats", "admin-stats"):
        if command in client("admin", "resource", "--help"):
            out = client("admin", "resource", command)
            assert "Traceback" not in out, out
    sdk = _sdk(client, team["month"], a, today)
    assert "Traceback" not in sdk and "SDK-OK" in sdk, sdk


def _month_args(client: Any, month: str, group: str) -> list[str]:
    helps = client("admin", "resource", "usage-per-month", "--help")
    return ["--month", month, "-g", group] if "--month" in helps else [month, group]


def _period_args(client: Any, group: str, day: str) -> list[str]:
    helps = client("admin", "resource", "usage-per-period", "--help")
    if "--start-date" in helps:
        return ["--start-date", day, "--end-date", day, *(["-g", group] if "-g" in helps else ["--group", group])]
    return [group, day, day]


def _sdk(client: Any, month: str, group: str, day: str) -> str:
    """The SDK's Resource functions, run by the client's own interpreter."""
    import subprocess

    python = str(Path(client.program).with_name("python"))
    script = (
        "from ai.backend.client.session import Session\n"
        "with Session() as s:\n"
        f"    m = s.Resource.usage_per_month({month!r}, [{group!r}])\n"
        f"    p = s.Resource.usage_per_period({group!r}, {day!r}, {day!r})\n"
        "    names = [n for n in dir(s.Resource) if 'stats' in n and not n.startswith('_')]\n"
        "    sizes = [len(getattr(s.Resource, n)()) for n in names]\n"
        "    assert m and p and sizes == [2880] * len(names) == [2880] * 2, (m, p, names, sizes)\n"
        "    print('SDK-OK', names)\n"
    )
    out = subprocess.run(
        [python, "-c", script], capture_output=True, text=True, env=client.env, cwd=client.cwd, timeout=60
    )
    return out.stdout + out.stderr


def test_uuid_helper_accepts_uppercase_ids() -> None:
    u = str(uuid.uuid4())
    assert rules.check_uuid(u.upper(), "group_id") == u


def test_a_domain_admin_sees_its_domains_projects_and_running_kernels_count_with_their_live_figures(
    team: dict[str, Any], node: Node
) -> None:
    admin, a = team["callers"]["admin"], team["a"]
    admin.ok("POST", "/bai/domains", {"name": "usage-dom"})
    pc = admin.ok("POST", "/bai/projects", {"name": "usage-c", "domain": "usage-dom"})
    callers = {}
    for name, projects, role in (("dora", [], "admin"), ("cy", ["usage-c"], "user")):
        email = f"{name}@usage-dom.example"
        body = {"email": email, "password": "pw-pw-pw-pw", "domain": "usage-dom", "projects": projects, "role": role}
        admin.ok("POST", "/bai/users", body)
        keys = node.json("keypair", "create", "--user", email)
        callers[name] = Caller(node, keys["accessKey"], keys["secretKey"])
    dora, cy = callers["dora"], callers["cy"]
    env = {"BAI_SIM_CPU_PCT": "100", "BAI_SIM_MEM_MIB": "32"}
    body = {"name": "c-live", "image": "python", "config": {"resources": {"cpu": 1}, "environ": env}}
    cy.ok("POST", "/session", body)
    try:
        deadline = time.monotonic() + 10
        while True:  # (its first samples)
            status, groups = _month(dora, team["month"])
            assert status == 200, groups
            live = [c for g in groups for c in g["c_infos"]]
            if live and live[0]["cpu_used"] > 0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert [g["g_id"] for g in groups] == [pc["id"]]  # its domain's project only
        (c,) = live
        assert (c["name"], c["status"], c["terminated_at"], c["used_time"], c["used_days"]) == (
            "c-live",
            "RUNNING",
            "None",
            None,
            None,
        )
        assert c["cpu_used"] > 0 and c["mem_used"] == 32 << 20 and c["cpu_allocated"] == 1.0
        status, answer = _month(dora, team["month"], [a["id"]])
        assert status == 403 and "usage-dom" not in answer["msg"] and "default" in answer["msg"], answer
        rows = dora.ok("GET", f"/bai/usage?period={team['month']}&by=project&all=1")["items"]
        assert [r["name"] for r in rows] == ["usage-c"] and rows[0]["cpuUsedSeconds"] > 0
        assert cy("GET", "/resource/usage/month", {"month": team["month"]})[0] == 403
        buckets = cy.ok("GET", "/resource/stats/user/month")
        assert buckets[-1]["num_sessions"]["value"] == 1  # (running now: in the last window)
    finally:
        cy.ok("DELETE", "/session/c-live")


def test_the_cli_says_the_period_and_shows_short_amounts() -> None:
    from bai.cli import usage as cli

    assert cli.period_param("202612", None, None) == "202612"
    assert cli.period_param(None, "20261201", "20261203") == "20261201..20261203"
    assert cli.period_param(None, None, None) is None
    for bad in (("202612", "20261201", None), (None, "20261201", None)):
        with pytest.raises(ValueError):
            cli.period_param(*bad)
    assert (cli._hours(0), cli._hours(0.00123), cli._hours(12.345), cli._hours(1234.5)) == (
        "0",
        "0.0012",
        "12.35",
        "1,234.50",
    )
    assert (cli._duration(3.21), cli._duration(150), cli._duration(7200)) == ("3.2 s", "2.5 min", "2.00 h")
    found = {"period": {"start": "2026-12-01T00:00:00+00:00", "end": "2027-01-01T00:00:00+00:00", "label": "202612"}}
    assert cli.usage_heading({**found, "scope": "all"}) == "Everyone's usage in 202612 (2026-12-01 to 2026-12-31, UTC)"
