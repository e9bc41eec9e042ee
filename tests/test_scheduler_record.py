"""Scheduler replay (bai/node/scheduler/record.py): a round's snapshot and decisions as bytes and back, exactly and
deterministically; re-running the core on a decoded snapshot decides the same; and the lines that say what changed
between two snapshots or two rounds' decisions."""

from __future__ import annotations

import dataclasses
import json
import zlib
from collections.abc import Iterator
from dataclasses import KW_ONLY, dataclass, field, replace
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bai.common.status import StatusInfo
from bai.node.scheduler import snapshot as model
from bai.node.scheduler.core import schedule
from bai.node.scheduler.record import (
    MAGIC,
    _canonical_v1,
    canonical,
    decision_changes,
    decode,
    digest,
    encode,
    encode_and_digest,
    snapshot_changes,
)
from bai.node.scheduler.snapshot import (
    BATCH,
    DEPENDENCY_FAILED,
    INTERACTIVE,
    MULTI_NODE,
    POLICIES,
    PREEMPTION_ORDERS,
    SELECTIONS,
    SINGLE_NODE,
    AgentState,
    Cancel,
    Decisions,
    DependencyState,
    Factors,
    KernelRequest,
    KeypairState,
    Pending,
    PendingSession,
    Placement,
    Preempt,
    ProjectState,
    ResourcePolicy,
    RunningSession,
    ScalingGroup,
    Snapshot,
    Weights,
)
from bench.scheduler import build

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
GiB = 1024**3
FAST = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ----------------------------------------------------------------------------------------------
# Random snapshots: `wild` values for the codec (any Decimal exponent, infinities, unicode, odd time zones), and
# `sane` ones the core schedules without refusing them (to compare its decisions before and after a round trip)

ZONES = st.sampled_from([UTC, timezone(timedelta(hours=2)), timezone(timedelta(hours=-3, minutes=-30))])
WILD_TIMES = st.datetimes(datetime(2000, 1, 1), datetime(2100, 1, 1), timezones=ZONES)
SANE_TIMES = st.integers(-7200, 7200).map(lambda s: NOW + timedelta(seconds=s))
WILD_AMOUNTS = st.decimals(allow_nan=False)
WILD_FLOATS = st.floats(allow_nan=False)
SANE_FLOATS = st.floats(0, 1e6, allow_nan=False)
IDS = st.text("abcdef0123456789-", min_size=1, max_size=5)
KEYS = st.sampled_from(["AK1", "AK2", "AK3"])
GROUPS = st.sampled_from(["default", "g2"])
SLOT_NAMES = st.sampled_from(["cpu", "mem", "cuda.shares", "cuda.device", "tpu.device"])
HOSTS = st.sampled_from(["h1", "h2"])


def decimals(*values: str) -> st.SearchStrategy[Decimal]:
    return st.sampled_from([Decimal(v) for v in values])


def slot_maps(amounts: st.SearchStrategy[Decimal], size: int = 4) -> st.SearchStrategy[dict[str, Decimal]]:
    return st.dictionaries(SLOT_NAMES, amounts, max_size=size)


@st.composite
def snapshots(draw: st.DrawFn, wild: bool = True) -> Snapshot:
    """`wild`: anything the codec must carry; otherwise snapshots where sessions mostly fit, some wait, a few are
    held by a predicate or cancelled (to compare the core's decisions)."""
    times = WILD_TIMES if wild else SANE_TIMES
    floats = WILD_FLOATS if wild else SANE_FLOATS
    text = st.text(max_size=6) if wild else IDS
    maybe: st.SearchStrategy[Any] = st.just(())  # (sane: most sessions depend on nothing, start now …)
    if wild:
        requests = capacities = occupied = slot_maps(WILD_AMOUNTS)
        image_min = requests
        hosts = st.frozensets(text, max_size=3)
        depends_on = st.lists(IDS, max_size=2).map(tuple)
        starts_at = st.none() | times
    else:
        # mostly cpu and mem, the slots every agent has; now and then a GPU share, which few have
        requests = st.fixed_dictionaries(
            {"cpu": decimals("0.5", "1", "2", "4"), "mem": decimals("1073741824", "4294967296")},
            optional={"cuda.shares": decimals("0.5", "1")},
        )
        capacities = st.fixed_dictionaries(
            {"cpu": decimals("4", "8", "16"), "mem": decimals("8589934592", "17179869184")},
            optional={"cuda.shares": decimals("1", "4")},
        )
        occupied = slot_maps(decimals("0", "1", "2.5"), 2)
        image_min = maybe.map(dict) | maybe.map(dict) | slot_maps(decimals("0", "0.5"), 1)
        hosts = st.frozensets(HOSTS, max_size=1)
        depends_on = maybe | maybe | maybe | st.lists(st.sampled_from(["dep1", "dep2", "ghost"]), max_size=2).map(tuple)
        starts_at = st.none() | st.none() | times

    kernel = st.builds(
        KernelRequest,
        kernel_id=IDS,
        slots=requests,
        cluster_role=st.sampled_from(["main", "sub"]),
        cluster_idx=st.integers(1, 4),
    )
    session = st.builds(
        PendingSession,
        id=IDS,
        name=text,
        access_key=KEYS,
        session_type=st.sampled_from([INTERACTIVE, BATCH]),
        scaling_group=GROUPS,
        kernels=st.lists(kernel, min_size=1, max_size=3, unique_by=lambda k: k.kernel_id).map(tuple),
        created_at=times,
        cluster_mode=st.sampled_from([SINGLE_NODE, MULTI_NODE]),
        starts_at=starts_at,
        depends_on=depends_on,
        image=text,
        image_min=image_min,
        retries=st.integers(0, 10**6),
        vfolder_hosts=hosts,
        project_id=st.sampled_from(["", "p1"]),
        domain_name=st.sampled_from(["", "d1"]),
        priority=st.integers(0, 100),
        duration=st.none() | floats,
    )
    if wild:
        agent = st.builds(
            AgentState,
            id=IDS,
            scaling_group=GROUPS,
            capacity=capacities,
            occupied=occupied,
            schedulable=st.booleans(),
            vfolder_hosts=hosts,
            gpu_free=st.lists(WILD_AMOUNTS, max_size=3).map(tuple),
            ends=st.lists(st.tuples(times, occupied), max_size=2).map(tuple),
        )
    else:
        agent = sane_agents(capacities, times)
    policy = st.builds(
        ResourcePolicy,
        name=text,
        max_concurrent_sessions=st.integers(0, 5) if wild else st.sampled_from([0, 0, 0, 3]),
        max_session_networks=st.integers(0, 3),
        total_resource_slots=capacities if wild else maybe.map(dict) | maybe.map(dict) | capacities,
        default_for_unspecified=st.sampled_from(["UNLIMITED", "LIMITED"]),
    )
    keypairs = draw(st.lists(KEYS, unique=True, max_size=3))
    group = st.builds(
        ScalingGroup,
        name=GROUPS,
        policy=st.sampled_from(POLICIES),
        agent_selection=st.sampled_from(SELECTIONS),
        allowed_session_types=st.frozensets(st.sampled_from([INTERACTIVE, BATCH]))
        if wild
        else st.sampled_from([frozenset({INTERACTIVE, BATCH}), frozenset({INTERACTIVE, BATCH}), frozenset({BATCH})]),
        resource_priority=st.permutations(["cuda", "cpu", "mem"]).map(tuple),
        weights=st.builds(Weights, priority=floats, fair_share=floats, age=floats, size=floats),
        reservations=st.none() | st.integers(0, 5),
        preemption=st.booleans(),
        preemptible_priority=st.integers(0, 100),
        preemption_order=st.sampled_from(PREEMPTION_ORDERS),
        preemption_min_runtime=floats,
    )
    cap = st.builds(ProjectState, id=st.just("p1"), name=text, cap=capacities, occupied=occupied)
    deps = st.dictionaries(
        IDS if wild else st.sampled_from(["dep1", "dep2"]),
        st.builds(
            DependencyState,
            session_id=IDS,
            name=text,
            status=st.sampled_from(["RUNNING", "TERMINATED", "ERROR"]),
            result=st.sampled_from(["UNDEFINED", "SUCCESS", "FAILURE"]),
        ),
        max_size=2,
    )
    sequence = st.sampled_from([list, tuple]) if wild else st.just(list)
    agents = draw(st.lists(agent, min_size=0 if wild else 1, max_size=4, unique_by=lambda a: a.id))
    running = st.builds(
        RunningSession,
        id=IDS,
        name=text,
        access_key=KEYS,
        session_type=st.sampled_from([INTERACTIVE, BATCH]),
        scaling_group=GROUPS,
        priority=st.integers(0, 100),
        held=st.lists(st.tuples(IDS if wild or not agents else st.sampled_from([a.id for a in agents]), occupied)).map(
            tuple
        ),
        started_at=times,
        preemptible=st.booleans(),
        preempting_for=st.none() | IDS,
    )
    return Snapshot(
        now=draw(times),
        pending=draw(sequence)(draw(st.lists(session, max_size=6, unique_by=lambda s: s.id))),
        agents=draw(sequence)(agents),
        keypairs={
            k: draw(st.builds(KeypairState, st.just(k), policy, st.integers(0, 5), occupied, st.integers(0, 2)))
            for k in keypairs
        },
        dependencies=draw(deps),
        scaling_groups={g.name: g for g in draw(st.lists(group, max_size=2))},
        projects=draw(st.dictionaries(st.just("p1"), cap)),
        domains=draw(st.dictionaries(st.just("d1"), cap)),
        usage=draw(st.dictionaries(KEYS, floats)),
        shares=draw(st.dictionaries(KEYS, floats)),
        running=draw(sequence)(draw(st.lists(running, max_size=3, unique_by=lambda r: r.id))),
    )


@st.composite
def sane_agents(draw: st.DrawFn, capacities: st.SearchStrategy[dict[str, Decimal]], times: Any) -> AgentState:
    """An agent whose occupied slots and known ends are slots it has."""
    capacity = draw(capacities)
    busy = {k: draw(decimals("0", "1", "2.5")) for k in sorted(capacity) if draw(st.booleans())}
    ends = tuple((draw(times), busy) for _ in range(draw(st.integers(0, 2))))
    return AgentState(
        draw(IDS),
        draw(GROUPS),
        capacity,
        busy,
        draw(st.sampled_from([True, True, True, False])),
        draw(st.frozensets(HOSTS)),
        tuple(draw(st.lists(decimals("0", "0.5", "1"), max_size=3))),
        ends,
    )


# ----------------------------------------------------------------------------------------------
# The round trip


@FAST
@given(snapshots())
def test_a_snapshot_comes_back_equal_with_its_types_and_the_same_bytes(snap: Snapshot) -> None:
    data = encode(snap)
    back = decode(data)
    assert back == snap
    assert encode(snap) == data  # deterministic
    # the canonical form holds every type tag and every Decimal's str: equal forms, nothing lost
    assert canonical(back) == canonical(snap)
    assert type(back.pending) is type(snap.pending) and type(back.agents) is type(snap.agents)
    for before, after in zip(snap.pending, back.pending, strict=True):
        assert type(after.kernels) is tuple and type(after.vfolder_hosts) is frozenset
        assert type(after.image_min) is dict
        assert [str(v) for _, v in sorted(after.image_min.items())] == [
            str(v) for _, v in sorted(before.image_min.items())
        ]
        assert after.created_at.utcoffset() == before.created_at.utcoffset()


def leaves(obj: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """The paths to every value a snapshot holds (fields, mapping values, sequence items, sets)."""
    if dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            yield from leaves(getattr(obj, f.name), (*path, f.name))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from leaves(v, (*path, k))
    elif isinstance(obj, list | tuple):
        for n, v in enumerate(obj):
            yield from leaves(v, (*path, n))
    elif obj is not None:
        yield path


def perturbed(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, Decimal | float):
        return -value if value != 0 else type(value)(1)
    if isinstance(value, int):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, datetime):
        return value + timedelta(microseconds=1)
    if isinstance(value, frozenset):
        return value - {min(value)} if value else frozenset({"x"})
    raise AssertionError(value)


def changed_at(obj: Any, path: tuple[Any, ...]) -> Any:
    if not path:
        return perturbed(obj)
    head, rest = path[0], path[1:]
    if dataclasses.is_dataclass(obj):
        return replace(obj, **{head: changed_at(getattr(obj, head), rest)})  # type: ignore[type-var]
    if isinstance(obj, dict):
        return {**obj, head: changed_at(obj[head], rest)}
    items = list(obj)
    items[head] = changed_at(items[head], rest)
    return type(obj)(items)


@FAST
@given(snapshots(), st.data())
def test_any_change_changes_the_digest_and_shows_in_snapshot_changes(snap: Snapshot, data: st.DataObject) -> None:
    path = data.draw(st.sampled_from(list(leaves(snap))))
    other = changed_at(snap, path)
    assert other != snap
    assert digest(other) != digest(snap), path
    assert decode(encode(other)) == other
    assert digest(snap) == digest(decode(encode(snap))) and len(digest(snap)) == 64
    # and the change shows in the lines users read, both ways
    assert snapshot_changes(snap, other) and snapshot_changes(other, snap), path
    assert snapshot_changes(snap, snap) == [] and snapshot_changes(snap, decode(encode(snap))) == []


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots(wild=False))
def test_the_core_decides_the_same_on_a_decoded_snapshot(snap: Snapshot) -> None:
    back = decode(encode(snap))
    try:
        expected = schedule(snap)
    except (ValueError, TypeError) as e:  # the core refuses it: the same way after the round trip
        with pytest.raises(type(e)) as again:
            schedule(back)
        assert str(again.value) == str(e)
        return
    decided = schedule(back)
    assert decided == expected
    assert decode(encode(expected)) == expected
    assert decision_changes(expected, decided) == []


@pytest.mark.parametrize("policy", POLICIES)
def test_a_bench_snapshot_replays_to_the_same_decisions(policy: str) -> None:
    snap = build(600, 60, seed=3)
    snap = replace(snap, scaling_groups={"default": ScalingGroup("default", policy=policy, reservations=2)})
    decisions = schedule(snap)
    assert decisions.placements and decisions.pending  # a contended round: both kinds
    assert schedule(decode(encode(snap))) == decisions
    back = decode(encode(decisions))
    assert back == decisions and type(back.placements) is list
    assert all(type(p.predicates) is tuple for p in back.pending)


def test_ten_thousand_sessions_on_a_thousand_agents_stay_small() -> None:
    snap = build(10_000, 1_000, seed=7)
    data = encode(snap)
    assert len(data) < 400_000  # 352 kB with zlib 3 (a 5.4 MB form; format 1: 295 kB with zlib 9 of 6.6 MB)
    assert decode(data) == snap
    assert encode_and_digest(snap) == (data, digest(snap))


def test_values_keep_their_exact_form() -> None:
    values = (
        Decimal("1.50"),
        Decimal("1E+3"),
        Decimal("-0"),
        Decimal("Infinity"),
        datetime(2026, 1, 2, 3, 4, 5, 678, tzinfo=timezone(timedelta(hours=5, minutes=30))),
        datetime(2026, 1, 2),  # naive (not in snapshots, but kept as it is)
        timedelta(days=-1, seconds=5),
        -0.0,
        float("inf"),
        [1, (2, 3)],
        frozenset({1, "1"}),
        {"b": 1, "a": Decimal("2.0")},
        {3: "x", (1, 2): None},
        True,
        "ü\n",
    )
    back = decode(encode(values))
    assert back == values
    assert [str(v) for v in back[:4]] == ["1.50", "1E+3", "-0", "Infinity"]
    assert back[4].utcoffset() == timedelta(hours=5, minutes=30) and back[5].tzinfo is None
    assert str(back[7]) == "-0.0" and type(back[9][1]) is tuple and type(back[10]) is frozenset
    assert list(back[11]) == ["a", "b"]  # mappings come back with their keys sorted


def test_the_same_value_gives_the_same_bytes_whatever_the_order_it_was_built_in() -> None:
    names = [f"host{n}" for n in range(50)]
    one = AgentState("a1", "default", {"cpu": Decimal(1), "mem": Decimal(2)}, {}, vfolder_hosts=frozenset(names))
    two = AgentState("a1", "default", {"mem": Decimal(2), "cpu": Decimal(1)}, {}, vfolder_hosts=frozenset(names[::-1]))
    assert encode(one) == encode(two) and digest(one) == digest(two)


@dataclass(frozen=True, slots=True)
class Probe:
    """A class as someone may add to the snapshot module: keyword-only fields, one computed (init=False)."""

    id: str
    _: KW_ONLY
    at: datetime
    extra: tuple[Decimal, ...] = ()
    total: Decimal = field(init=False, default=Decimal(0))

    def __post_init__(self) -> None:
        object.__setattr__(self, "total", sum(self.extra, Decimal(0)))


def test_classes_added_to_the_snapshot_module_are_recorded_with_no_change(monkeypatch: pytest.MonkeyPatch) -> None:
    probe = Probe("p", at=NOW, extra=(Decimal("1.5"), Decimal(2)))
    with pytest.raises(TypeError, match="not a class of bai.node.scheduler.snapshot"):
        encode(probe)
    monkeypatch.setattr(model, "Probe", Probe, raising=False)
    data = encode([probe, Decisions()])
    back = decode(data)
    assert back == [probe, Decisions()] and back[0].total == Decimal("3.5")
    assert decode(encode(probe)) == probe
    # a class with an init=False field is recorded in the tagged form, and the field is set from the record, not
    # recomputed
    header, tree = _parts(encode(probe))
    assert header == {"class": None}
    tree[2]["total"] = ["D", "7"]
    odd = decode(_joined(header, tree))
    assert odd.total == Decimal(7) and odd.extra == probe.extra


def _parts(data: bytes) -> tuple[Any, Any]:
    """A format 2 record's header and body, as JSON."""
    form = zlib.decompress(data)
    assert form.startswith(MAGIC)
    header, body = form[len(MAGIC) :].split(b"\n", 1)
    return json.loads(header), json.loads(body)


def _joined(header: Any, body: Any) -> bytes:
    return zlib.compress(MAGIC + json.dumps(header).encode() + b"\n" + json.dumps(body).encode())


def test_the_typed_form_of_a_round() -> None:
    snap = replace(
        base(), pending=tuple(base().pending), now=datetime(2026, 1, 2, 3, tzinfo=timezone(timedelta(hours=9)))
    )
    header, body = _parts(encode(snap))
    assert header["class"] == "Snapshot" and header["tuples"] == ["pending", "running"]  # (running: its default ())
    assert header["schema"]["PendingSession"][:3] == ["id", "name", "access_key"] and "Weights" in header["schema"]
    assert body["now"] == "2026-01-02T03:00:00+09:00"
    assert body["agents"][0]["capacity"] == {"cpu": "8", "cuda.device": "4", "mem": "34359738368"}
    assert body["pending"][0]["vfolder_hosts"] == [] and body["pending"][0]["kernels"][0]["cluster_idx"] == 1
    back = decode(encode(snap))
    assert back == snap and type(back.pending) is tuple and type(back.agents) is list and type(back.running) is tuple
    # what the typed form cannot carry exactly goes in the tagged form: a non-finite float (JSON has none), a list
    # where the annotation says tuple
    for odd in (
        replace(snap, usage={"AK1": float("inf")}),
        replace(snap, agents=[replace(snap.agents[0], gpu_free=[])]),
    ):
        assert _parts(encode(odd))[0] == {"class": None} and decode(encode(odd)) == odd
    assert _parts(encode(schedule(build(50, 5, seed=1))))[0]["class"] == "Decisions"


def test_a_record_of_format_1_still_decodes() -> None:
    snap = replace(base(), pending=tuple(base().pending), usage={"AK2": float("inf")})
    decisions = schedule(base())
    for value in (snap, decisions, (Decimal("1.50"), frozenset({1, "1"}), {3: "x"}, timedelta(days=-1, seconds=5))):
        old = zlib.compress(_canonical_v1(value))
        assert zlib.decompress(old).startswith(b'["bai.scheduler.record",1,[')
        assert decode(old) == value
    literal = zlib.compress(
        b'["bai.scheduler.record",1,["C","KernelRequest",{"cluster_idx":2,"cluster_role":"sub","kernel_id":"k1",'
        b'"slots":["M",{"cpu":["D","1.50"]}]}]]'
    )
    assert decode(literal) == KernelRequest("k1", {"cpu": Decimal("1.50")}, "sub", 2)
    assert str(decode(literal).slots["cpu"]) == "1.50"


def test_a_record_older_than_a_field_gets_its_default_and_unknown_names_are_refused() -> None:
    session = PendingSession("s1", "one", "AK1", BATCH, "default", (), created_at=NOW, priority=50)
    header, body = _parts(encode(session))
    assert header["class"] == "PendingSession"

    def edited(fields: list[str], values: dict[str, Any], name: str = "PendingSession") -> bytes:
        return _joined({**header, "class": name, "schema": {"PendingSession": fields}}, values)

    fields = header["schema"]["PendingSession"]
    older = edited([f for f in fields if f != "priority"], {k: v for k, v in body.items() if k != "priority"})
    assert decode(older) == replace(session, priority=10)
    with pytest.raises(ValueError, match="PendingSession has no field 'colour'"):
        decode(edited([*fields, "colour"], {**body, "colour": "blue"}))
    with pytest.raises(ValueError, match="no dataclass GoneSession"):
        decode(edited(fields, body, name="GoneSession"))
    with pytest.raises(ValueError, match="no dataclass GoneKernel"):
        decode(_joined({**header, "schema": {**header["schema"], "GoneKernel": ["id"]}}, body))
    with pytest.raises(ValueError, match="cannot rebuild PendingSession"):
        decode(edited([f for f in fields if f != "id"], {k: v for k, v in body.items() if k != "id"}))
    # the same in the tagged form
    tagged = ["C", "PendingSession", {"id": "s1"}]
    with pytest.raises(ValueError, match="cannot rebuild PendingSession"):
        decode(_joined({"class": None}, tagged))
    with pytest.raises(ValueError, match="PendingSession has no field 'colour'"):
        decode(_joined({"class": None}, ["C", "PendingSession", {"colour": "blue"}]))
    for garbage in (
        b"",
        b"not zlib",
        zlib.compress(b"[1, 2, 3]"),
        zlib.compress(b'["bai.scheduler.record", 99, 1]'),
        zlib.compress(MAGIC),
        zlib.compress(MAGIC + b"{}\n{}"),
        zlib.compress(MAGIC + b'{"class":"Snapshot"}\n{}'),
        zlib.compress(MAGIC + b'{"class":null}\n[1,'),
        zlib.compress(MAGIC + b"\xff\n"),
        _joined({**header, "tuples": ["kernels"]}, body),
        _joined(header, {**body, "priority": "high"}),
        _joined(header, {**body, "created_at": "yesterday"}),
        _joined(header, [1]),
    ):
        with pytest.raises(ValueError):
            decode(garbage)
    with pytest.raises(TypeError, match="cannot record a bytes"):
        encode(b"raw")


# ----------------------------------------------------------------------------------------------
# What changed between two snapshots


def sess(sid: str, cpu: int = 1, **kw: Any) -> PendingSession:
    kernels = (KernelRequest(f"{sid}-k", {"cpu": Decimal(cpu), "mem": Decimal(GiB)}),)
    return PendingSession(sid, kw.pop("name", f"job-{sid}"), "AK1", BATCH, "default", kernels, created_at=NOW, **kw)


def agent(aid: str, cpu: int = 8, used: int = 0, **kw: Any) -> AgentState:
    capacity = {"cpu": Decimal(cpu), "mem": Decimal(32 * GiB), **kw.pop("extra", {})}
    return AgentState(aid, "default", capacity, {"cpu": Decimal(used), **kw.pop("busy", {})}, **kw)


def base() -> Snapshot:
    return Snapshot(
        NOW,
        [sess("s1"), sess("s2"), sess("s4", priority=10)],
        [agent("a1", extra={"cuda.device": Decimal(4)}, busy={"cuda.device": Decimal(4)}), agent("a2"), agent("a5")],
        keypairs={"AK1": KeypairState("AK1", ResourcePolicy(), 1, {"cpu": Decimal(2)})},
        scaling_groups={"default": ScalingGroup("default")},
        usage={"AK2": 1.2e5},
    )


def test_snapshot_changes_in_the_words_users_read() -> None:
    old = base()
    a1, a2, a5 = old.agents
    new = replace(
        old,
        now=NOW + timedelta(hours=2, minutes=14),
        pending=[replace(old.pending[2], priority=50, retries=1), sess("s7"), sess("s8", name=""), sess("s9")],
        agents=[
            replace(a1, occupied={"cpu": Decimal(0)}),
            replace(a5, schedulable=False),
            agent("a3"),
        ],
        keypairs={"AK1": KeypairState("AK1", ResourcePolicy(), 3, {"cpu": Decimal(6)})},
        scaling_groups={"default": ScalingGroup("default", policy="multifactor")},
        usage={"AK2": 3.4e5},
    )
    assert snapshot_changes(old, new) == [
        "time: 2 h 14 min later",
        "pending: +3 (job-s7, s8, job-s9), -2 started or ended (job-s1, job-s2)",
        "job-s4: priority 10 → 50",
        "retries: +1 for 1 session",
        "agent a3 joined",
        "agent a2 left",
        "agent a1: free cuda.device 0 → 4",
        "agent a5: not schedulable",
        "keypair AK1: sessions 1 → 3; holds cpu 2 → 6",
        "fair-share usage of AK2: 1.2e5 → 3.4e5",
        "scaling group default: policy fifo → multifactor",
    ]
    assert snapshot_changes(old, old) == [] and snapshot_changes(old, decode(encode(old))) == []
    assert snapshot_changes(new, old)[0] == "time: 2 h 14 min earlier"


def test_snapshot_changes_of_nested_and_keyed_things() -> None:
    old = base()
    a1 = old.agents[0]
    group = old.scaling_groups["default"]
    new = replace(
        old,
        pending=[*old.pending[:2], replace(old.pending[2], kernels=(replace(old.pending[2].kernels[0], slots={}),))],
        agents=[
            replace(a1, capacity={**a1.capacity, "mem": Decimal(64 * GiB)}, vfolder_hosts=frozenset({"nfs"})),
            *old.agents[1:],
        ],
        keypairs={},
        dependencies={"d1": DependencyState("d1", "prep", "TERMINATED", "SUCCESS")},
        scaling_groups={
            "default": replace(group, weights=replace(group.weights, age=1000.0)),
            "g2": ScalingGroup("g2"),
        },
        projects={"p1": ProjectState("p1", "team", {"cpu": Decimal(10)})},
        shares={"AK2": 2.0},
    )
    assert snapshot_changes(old, new) == [
        "job-s4: kernel main1 slots cpu 1 → none, mem 1GiB → none",
        "agent a1: capacity mem 32GiB → 64GiB; free mem 32GiB → 64GiB; vfolder hosts +nfs",
        "keypair AK1 removed (no limits)",
        "fair-share share of AK2: none → 2",
        "dependency d1 known",
        "scaling group default: weights age 500 → 1000",
        "scaling group g2 added",
        "project p1 added",
    ]


def test_snapshot_changes_stay_short() -> None:
    old = base()
    many = [sess(f"n{n}", priority=n) for n in range(30)]
    new = replace(old, pending=many, agents=[agent(f"b{n:02d}") for n in range(25)])
    changed = replace(new, pending=[replace(s, priority=99) for s in many])
    lines = snapshot_changes(old, new, limit=5)
    assert lines[0] == "pending: +30 (job-n0, job-n1, job-n2, job-n3, job-n4 … and 25 more), -3 started or ended " + (
        "(job-s1, job-s2, job-s4)"
    )
    assert lines[1:] == [
        "agent b00 joined",
        "agent b01 joined",
        "agent b02 joined",
        "agent b03 joined",
        "agent b04 joined",
        "… and 20 more agents joined",
        "agent a1 left",
        "agent a2 left",
        "agent a5 left",
    ]
    lines = snapshot_changes(new, changed, limit=3)
    assert lines == ["job-n0: priority 0 → 99", "job-n1: priority 1 → 99", "job-n2: priority 2 → 99"] + [
        "… and 27 more sessions changed"
    ]


# ----------------------------------------------------------------------------------------------
# What changed between two rounds' decisions

ROOM = "no agent has room: best is a1 with cpu 1 free of 2 requested"


def waited(sid: str, msg: str = ROOM, position: int = 1) -> Pending:
    return Pending(sid, StatusInfo.NO_AVAILABLE_INSTANCES, msg, (), position)


def test_decision_changes_say_what_each_session_got_instead() -> None:
    old = Decisions(
        placements=[Placement("s1", {"s1-k": "a1"}), Placement("s5", {"s5-k": "a1"})],
        pending=[waited("s3"), waited("s4", position=2)],
        cancels=[Cancel("s6", DEPENDENCY_FAILED, "session prep (d1) ended without success: TERMINATED/FAILURE")],
    )
    new = Decisions(
        placements=[Placement("s3", {"s3-k": "a2"}), Placement("s5", {"s5-k": "a4"}), Placement("s6", {"s6-k": "a2"})],
        pending=[waited("s4", position=1), waited("s9", "no schedulable agent in scaling group default")],
    )
    names = {"s3": "train", "s9": "eval"}
    assert decision_changes(old, new, names) == [
        "s1: no longer pending (was placed on a1)",
        "s5: placed on a1 → placed on a4",
        "train: waited (no agent has room: best is a1 with cpu 1 free of 2 requested) → placed on a2",
        "s6: cancelled (session prep (d1) ended without success: TERMINATED/FAILURE) → placed on a2",
        "eval: not in the past round (waited (no schedulable agent in scaling group default))",
        "queue position changed for 1 session (s4)",
    ]
    assert decision_changes(old, old) == [] and decision_changes(new, decode(encode(new)), names) == []


def test_decision_changes_that_only_the_details_tell() -> None:
    one = Placement("s1", {"s1-k0": "a1", "s1-k1": "a2"})
    two = Placement("s1", {"s1-k0": "a2", "s1-k1": "a1"})
    long_msg = "x" * 80
    assert decision_changes(Decisions([one]), Decisions([two])) == [
        "s1: placed on a1, a2 (s1-k0 on a1, s1-k1 on a2) → placed on a2, a1 (s1-k0 on a2, s1-k1 on a1)"
    ]
    a, b = waited("s2", long_msg + "a"), waited("s2", long_msg + "b")
    assert decision_changes(Decisions(pending=[a]), Decisions(pending=[b])) == [
        f"s2: waited ({long_msg}a) → waited ({long_msg}b)"
    ]
    p1, p2 = Placement("p", {"k": "a1"}), Placement("q", {"k": "a2"})
    assert decision_changes(Decisions([p1, p2]), Decisions([p2, p1])) == ["same outcomes, decided in another order"]
    # a score an ulp apart (the core sums fair-share usage in set order, which differs between processes) is the
    # same score; one that moved is told
    scored = replace(waited("s3"), factors=Factors(0.1, 0.36733103888020247, 0.0, 0.5, 420.0))
    ulp = replace(scored, factors=replace(scored.factors, fair_share=0.3673310388802024))
    moved = replace(scored, factors=replace(scored.factors, fair_share=0.5), position=2)
    assert ulp != scored and decision_changes(Decisions(pending=[scored]), Decisions(pending=[ulp])) == []
    assert decision_changes(Decisions(pending=[scored]), Decisions(pending=[moved])) == [
        "queue position changed for 1 session (s3)",
        "score changed for 1 session (s3)",
    ]


def test_decision_changes_of_a_replayed_round() -> None:
    """A past round re-run after an agent joined: the session that waited for room is placed."""
    past = Snapshot(
        NOW, [sess("s1", 6), sess("s2", 6)], [agent("a1")], scaling_groups={"default": ScalingGroup("default")}
    )
    today = replace(past, agents=[*past.agents, agent("a2")])
    assert snapshot_changes(past, today) == ["agent a2 joined"]
    recorded = schedule(past)
    replayed = schedule(decode(encode(today)))
    lines = decision_changes(recorded, replayed, {s.id: s.name for s in past.pending})
    assert lines == ["job-s2: waited (no agent has room: best is a1 with cpu 2 free of 6 requested) → placed on a2"]


# ----------------------------------------------------------------------------------------------
# Fields and kinds of decision added later get the same generic words


@dataclass(frozen=True, slots=True)
class Watch:
    id: str
    agent: str
    slots: dict[str, Decimal] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SnapshotLater(Snapshot):
    watching: tuple[Watch, ...] = ()


@dataclass(frozen=True, slots=True)
class Nudge:
    session_id: str
    towards: str


@dataclass(slots=True)
class DecisionsLater(Decisions):
    nudges: list[Nudge] = field(default_factory=list)


def test_fields_added_later_show_in_the_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    for cls in (Watch, SnapshotLater, Nudge, DecisionsLater):
        monkeypatch.setattr(model, cls.__name__, cls, raising=False)
    old = SnapshotLater(NOW, [], [], watching=(Watch("w1", "a1"), Watch("w3", "a1", {"cpu": Decimal(2)})))
    new = replace(old, watching=(Watch("w2", "a1"), Watch("w3", "a2", {"cpu": Decimal(4)})))
    assert decode(encode(new)) == new
    assert snapshot_changes(old, new) == ["watching: +1 (w2), -1 (w1)", "watching w3: agent a1 → a2; slots cpu 2 → 4"]
    before = DecisionsLater([Placement("s1", {"k": "a1"})])
    after = DecisionsLater([Placement("s1", {"k": "a1"})], nudges=[Nudge("w3", towards="a2")])
    assert decode(encode(after)) == after
    assert decision_changes(before, after) == ["w3: not in the past round (nudge (towards a2))"]


def test_running_sessions_and_preemptions_in_the_changes() -> None:
    def run(sid: str, name: str, **kw: Any) -> RunningSession:
        held = (("a1", {"cpu": Decimal(2)}),)
        return RunningSession(sid, name, "AK1", BATCH, "default", 0, held, started_at=NOW, **kw)

    old = replace(base(), running=[run("r1", "etl"), run("r2", "", preemptible=True)])
    new = replace(old, running=[run("r2", "", preemptible=False), run("r3", "nightly")])
    assert snapshot_changes(old, new) == ["running: +1 (nightly), -1 (etl)", "running r2: preemptible yes → no"]
    group = ScalingGroup("default", preemption=True)
    assert snapshot_changes(old, replace(old, scaling_groups={"default": group})) == [
        "scaling group default: preemption no → yes"
    ]
    was = Decisions(pending=[waited("s9")])
    now = Decisions(
        pending=[replace(waited("s9", "preempting etl"), preempting=("r1",))],
        preemptions=[Preempt("r1", "s9", "stopped for a session of priority 50")],
    )
    assert decision_changes(was, now, {"r1": "etl", "s9": "train"}) == [
        f"train: waited ({ROOM}) → waited (preempting etl)",
        "etl: not in the past round (preempted for train (stopped for a session of priority 50))",
    ]
    assert decode(encode(now)) == now


def test_malformed_records_are_refused() -> None:
    for tree in (["D"], ["D", "zz"], ["C", "Snapshot", {"now": 1}], ["Q", 1], {"a": 1}, ["M", []]):
        with pytest.raises(ValueError, match="scheduler record"):
            decode(zlib.compress(MAGIC + b'{"class":null}\n' + json.dumps(tree).encode()))
    for tree in (["D"], ["D", "zz"], ["C", "Snapshot", {"now": 1}], ["Q", 1], {"a": 1}, ["M", []]):
        with pytest.raises(ValueError, match="scheduler record"):
            decode(zlib.compress(json.dumps(["bai.scheduler.record", 1, tree]).encode()))
