"""Scheduler replay, the pure part: a scheduling round's input (a `Snapshot`) or output (`Decisions`) as bytes, and
what changed between two of them, in lines users read.

    data = encode(snapshot)           # stored with the round
    past = decode(data)               # later: the same snapshot, to re-run with today's core
    decision_changes(recorded, schedule(past))

The encoding is generic: it follows the dataclasses of `bai.node.scheduler.snapshot` (their fields and annotations)
and finds them by name there when decoding, so fields and classes added there are recorded with no change here. A
record made before a field existed decodes with that field's default (one without a default: ValueError); a record
naming a field or class that no longer exists is refused (ValueError) rather than replayed without it. Anything
else that is not a record, or is malformed, is refused with ValueError too.

Format 2 (what `encode` writes), uncompressed: the line `bai.scheduler.record/2`, a JSON header line, then the body:

    {"class":"Snapshot","schema":{"AgentState":["id",…],…},"tuples":["running"]}   typed
    {"class":null}                                                                  tagged

* typed: the body is msgspec's JSON of the dataclass (`msgspec.json.Encoder(order="deterministic")`: fields in
  definition order, dict keys and set members sorted, Decimals as their str (the exponent is kept), datetimes in
  RFC 3339 with their UTC offset, tuples, lists and sets as arrays), decoded with the class's annotations (which
  give back tuples, frozensets, Decimals, datetimes). `schema` lists the fields of every dataclass the class's
  annotations reach, as recorded: decoding checks it against today's classes (a name gone: ValueError). `tuples`
  names the top-level fields given as tuples where the annotation is an abstract `Sequence` (msgspec decodes those
  as lists); they are made tuples again. The encoder uses this form only when decoding it gives back an equal value
  (it checks, at a cost of about as much again as encoding): not for a non-finite float (JSON has none), a value
  of a type its annotation does not decode to (a list where a tuple is declared, a subclass of the declared class,
  a bool for an int), a class with `init=False` fields (msgspec recomputes them), or a value that is not a
  dataclass of the snapshot module. A value of another type that compares equal comes back as the declared type:
  an int declared float as a float, a set declared frozenset as a frozenset, a str enum as its str.
* tagged: anything else (`decode(encode(x)) == x` for any value made of the types below): the body is format 1's
  TREE, as JSON (sorted keys, no spaces, ASCII; non-finite floats as `Infinity`, `NaN`).

Format 1 (read only: records kept before format 2), uncompressed: JSON (sorted keys, no spaces, ASCII) of
`["bai.scheduler.record", 1, TREE]`, where TREE is built from None, bool, int, float, str as they are, and every
other value as a tagged array:

    ["D", "1.50"]                     Decimal (its str: the exponent is kept)
    ["W", "2026-11-29T12:00:00+00:00"]  datetime (isoformat: the UTC offset is kept)
    ["Z", days, seconds, microseconds]  timedelta
    ["L", x, …] / ["T", x, …]          list / tuple
    ["F", x, …] / ["S", x, …]          frozenset / set, members sorted by their canonical JSON
    ["M", {"key": x, …}]               a mapping with str keys (decoded as a dict)
    ["P", [k, v], …]                   any other mapping, pairs sorted by the key's canonical JSON
    ["C", "ClassName", {"field": x, …}]  a dataclass of the snapshot module, every field (init=False ones too)

`encode` compresses the form with zlib; `digest` hashes it uncompressed (so it does not depend on zlib's version):
the format line, the header and the body. The digest is of the form, not of equality: Decimal("1.0") and
Decimal("1"), or 0.0 and -0.0, are equal but digest apart. Mappings come back with their keys in sorted order (the
core decides the same: the tests replay random snapshots). A datetime's zone comes back as its fixed offset at that
instant (a ZoneInfo's name is not kept). Cost for 10k pending sessions on 1k agents: see `_LEVEL`. Pure: no I/O, no
clock.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import typing
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import msgspec

from bai.common.slots import format_amount

from . import snapshot as _model
from .snapshot import Cancel, Decisions, Pending, Placement, Preempt, Snapshot

__all__ = ["canonical", "decision_changes", "decode", "digest", "encode", "encode_and_digest", "snapshot_changes"]

FORMAT = "bai.scheduler.record"
VERSION = 2
MAGIC = b"bai.scheduler.record/2\n"  # (a format 1 record starts with "[")
# zlib level, measured on the 10k × 1k snapshot (a 5.4 MB form): 1: 394 kB in 15 ms, 3: 352 kB in 17 ms, 6: 301 kB in
# 53 ms, 9: 285 kB in 109 ms. Whole encode_and_digest at 3: about 160 ms of CPU (the msgspec encoding 35, the check
# that it decodes back equal 100, zlib 17, sha256 4), against format 1's 570 ms; its decoding 70 ms (format 1: 630)
_LEVEL = 3

# ----------------------------------------------------------------------------------------------
# Encoding


def canonical(obj: object) -> bytes:
    """The canonical, uncompressed encoding of `obj` (a Snapshot, Decisions, or any value made of the types above):
    format 2, typed where it gives `obj` back exactly, tagged otherwise."""
    typed = _typed_form(obj)
    if typed is not None:
        return typed
    return MAGIC + _TAGGED_HEADER + b"\n" + _dumps(_tree(obj)).encode("ascii")


def encode(obj: object) -> bytes:
    """`obj` as compressed bytes: `decode(encode(obj)) == obj`. The same value always gives the same bytes (with
    the same zlib)."""
    return zlib.compress(canonical(obj), _LEVEL)


def encode_and_digest(obj: object) -> tuple[bytes, str]:
    """`(encode(obj), digest(obj))`, building the canonical form once."""
    form = canonical(obj)
    return zlib.compress(form, _LEVEL), hashlib.sha256(form).hexdigest()


def digest(snapshot: object) -> str:
    """The hex sha256 of the canonical encoding (its first 16 characters are enough to tell rounds apart)."""
    return hashlib.sha256(canonical(snapshot)).hexdigest()


def decode(data: bytes) -> Any:
    """The value `encode` was given (format 2, or format 1 as kept by earlier versions). ValueError for data that
    is not a record, is malformed, or names a class or field the snapshot module no longer has."""
    try:
        form = zlib.decompress(data)
    except (zlib.error, TypeError, ValueError) as e:
        raise ValueError(f"not a scheduler record: {e}") from None
    if form.startswith(MAGIC):
        return _decode_v2(form)
    return _decode_v1(form)


# format 2, typed: msgspec's JSON of a dataclass, decoded with its annotations

_JSON = msgspec.json.Encoder(order="deterministic")
_TAGGED_HEADER = b'{"class":null}'


@dataclasses.dataclass(frozen=True, slots=True)
class _Plan:
    """How a class of the snapshot module is recorded in the typed form."""

    name: str
    schema: dict[str, list[str]]  # every dataclass its annotations reach, by name: its fields
    decoder: msgspec.json.Decoder[Any]
    sequences: tuple[str, ...]  # its fields a msgspec decoder gives back as lists whatever they were given as


_PLANS: dict[type, _Plan | None] = {}


def _plan(cls: type) -> _Plan | None:
    """The typed form of `cls`, or None where it has none: a class that is not of the snapshot module or reaches
    one that is not, or with init=False fields, or annotations msgspec cannot decode."""
    if cls in _PLANS:
        return _PLANS[cls]
    if not dataclasses.is_dataclass(cls):
        _PLANS[cls] = None
        return None
    schema: dict[str, list[str]] = {}
    todo: list[Any] = [cls]
    while todo:
        hint: Any = todo.pop()
        if not (isinstance(hint, type) and dataclasses.is_dataclass(hint)):
            todo += [a for a in typing.get_args(hint) if a is not Ellipsis]
            continue
        name = hint.__name__
        if not _in_model(hint):
            return None  # (not remembered: a test may add it to the module; the tagged form says what is wrong)
        if name in schema:
            continue
        fields = dataclasses.fields(hint)
        if not all(f.init for f in fields):
            _PLANS[cls] = None
            return None
        schema[name] = [f.name for f in fields]
        try:
            todo += typing.get_type_hints(hint).values()
        except (NameError, TypeError):  # an annotation that does not resolve
            _PLANS[cls] = None
            return None
    try:
        decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(cls)
    except TypeError:  # an annotation msgspec does not know
        _PLANS[cls] = None
        return None
    hints = typing.get_type_hints(cls)
    sequences = tuple(f.name for f in dataclasses.fields(cls) if typing.get_origin(hints[f.name]) is Sequence)
    plan = _Plan(cls.__name__, dict(sorted(schema.items())), decoder, sequences)
    _PLANS[cls] = plan
    return plan


def _in_model(cls: type) -> bool:
    return getattr(_model, cls.__name__, None) is cls


def _typed_form(obj: object) -> bytes | None:
    """`obj` in the typed form, when decoding it gives back an equal value; else None."""
    plan = _plan(type(obj))
    if plan is None:
        return None
    try:
        body = _JSON.encode(obj)
        back = plan.decoder.decode(body)
    except (TypeError, ValueError, OverflowError, msgspec.MsgspecError):  # (a bool for an int, a mixed set …)
        return None
    tuples = []
    for name in plan.sequences:
        if type(getattr(obj, name)) is tuple and type(getattr(back, name)) is list:
            tuples.append(name)
            object.__setattr__(back, name, tuple(getattr(back, name)))
    if back != obj:  # (a non-finite float, a list declared a tuple, a subclass …)
        return None
    header = _JSON.encode({"class": plan.name, "schema": plan.schema, "tuples": tuples})
    return b"".join((MAGIC, header, b"\n", body))


def _decode_v2(form: bytes) -> Any:
    header_line, sep, body = form[len(MAGIC) :].partition(b"\n")
    try:
        header = json.loads(header_line)
    except ValueError as e:
        raise ValueError(f"scheduler record: malformed header ({e})") from None
    if not sep or not isinstance(header, dict) or "class" not in header:
        raise ValueError("scheduler record: malformed header")
    name = header["class"]
    if name is None:
        try:
            tree = json.loads(body)
        except ValueError as e:
            raise ValueError(f"scheduler record: malformed ({e})") from None
        return _tree_value(tree)
    cls = getattr(_model, name, None) if isinstance(name, str) else None
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise ValueError(f"scheduler record: {_model.__name__} has no dataclass {name}")
    plan = _plan(cls)
    if plan is None:
        raise ValueError(f"scheduler record: {name} is no longer recorded in the typed form")
    recorded, tuples = header.get("schema"), header.get("tuples")
    if not (isinstance(recorded, dict) and isinstance(tuples, list)):
        raise ValueError("scheduler record: malformed header")
    if recorded != plan.schema:  # a record of another version: what it names must still exist
        for cname, fields in sorted(recorded.items()):
            now = plan.schema.get(cname)
            if now is None:
                raise ValueError(f"scheduler record: {_model.__name__} has no dataclass {cname} (in {name})")
            if not isinstance(fields, list):
                raise ValueError("scheduler record: malformed header")
            for field_name in fields:
                if field_name not in now:
                    raise ValueError(
                        f"scheduler record: {cname} has no field {field_name!r} (recorded by another version)"
                    )
    try:
        value = plan.decoder.decode(body)
    except msgspec.ValidationError as e:  # (a field added since, without a default; or a value of another type)
        raise ValueError(f"scheduler record: cannot rebuild {name}: {e}") from None
    except (msgspec.MsgspecError, TypeError, ValueError, ArithmeticError) as e:
        raise ValueError(f"scheduler record: malformed ({type(e).__name__}: {e})") from None
    for field_name in tuples:
        if field_name not in plan.sequences or type(getattr(value, field_name)) is not list:
            raise ValueError(f"scheduler record: {name}.{field_name!s} cannot be a tuple")
        object.__setattr__(value, field_name, tuple(getattr(value, field_name)))  # frozen dataclasses too
    return value


# format 1, and format 2's tagged body: the tagged tree


def _decode_v1(form: bytes) -> Any:
    try:
        top = json.loads(form)
    except ValueError as e:
        raise ValueError(f"not a scheduler record: {e}") from None
    if not (isinstance(top, list) and len(top) == 3 and top[0] == FORMAT):
        raise ValueError("not a scheduler record")
    if top[1] != 1:
        raise ValueError(f"scheduler record of version {top[1]!r}; this code reads versions 1 and {VERSION}")
    return _tree_value(top[2])


def _tree_value(tree: Any) -> Any:
    try:
        return _Decoder().value(tree)
    except (IndexError, KeyError, TypeError, AttributeError, ArithmeticError) as e:  # (Decimal: InvalidOperation)
        raise ValueError(f"scheduler record: malformed ({type(e).__name__}: {e})") from None


def _canonical_v1(obj: object) -> bytes:
    """Format 1's canonical form (what records kept before format 2 hold; the tests make such records)."""
    return _dumps([FORMAT, 1, _tree(obj)]).encode("ascii")


def _dumps(tree: object) -> str:
    return json.dumps(tree, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=True)


_PLAIN = frozenset({str, int, bool, float, type(None)})


def _tree(value: object) -> Any:
    kind = type(value)
    if kind in _PLAIN:
        return value
    encoder = _ENCODERS.get(kind)
    if encoder is None:
        encoder = _encoder_of(kind)
    return encoder(value)


def _decimal_tree(value: Any) -> Any:
    return ["D", str(value)]


def _mapping_tree(value: Any) -> Any:
    out: dict[str, Any] = {}
    for k, v in value.items():
        if type(k) is not str:
            pairs = [[_tree(k), _tree(v)] for k, v in value.items()]
            pairs.sort(key=lambda pair: _dumps(pair[0]))
            return ["P", *pairs]
        kind = type(v)
        out[k] = ["D", str(v)] if kind is Decimal else v if kind in _PLAIN else _tree(v)
    return ["M", out]


def _tuple_tree(value: Any) -> Any:
    return ["T", *map(_tree, value)]


def _list_tree(value: Any) -> Any:
    return ["L", *map(_tree, value)]


def _set_tree(value: Any) -> Any:
    members = sorted(map(_tree, value), key=_dumps)
    return ["F" if isinstance(value, frozenset) else "S", *members]


def _datetime_tree(value: Any) -> Any:
    return ["W", value.isoformat()]


def _timedelta_tree(value: Any) -> Any:
    return ["Z", value.days, value.seconds, value.microseconds]


_ENCODERS: dict[type, Callable[[Any], Any]] = {
    Decimal: _decimal_tree,
    dict: _mapping_tree,
    tuple: _tuple_tree,
    list: _list_tree,
    frozenset: _set_tree,
    set: _set_tree,
    datetime: _datetime_tree,
    timedelta: _timedelta_tree,
}


def _encoder_of(kind: type) -> Callable[[Any], Any]:
    """The encoder of a type met for the first time: a dataclass of the snapshot module (remembered), or a
    subclass of a known type (a str enum, an IntEnum, a named tuple: recorded as the plain value)."""
    if dataclasses.is_dataclass(kind):
        if getattr(_model, kind.__name__, None) is not kind:
            raise TypeError(f"cannot record a {kind.__module__}.{kind.__qualname__}: not a class of {_model.__name__}")
        name = kind.__name__
        names = tuple(f.name for f in dataclasses.fields(kind))

        def encode_dataclass(value: Any) -> Any:
            return ["C", name, {n: _tree(getattr(value, n)) for n in names}]

        _ENCODERS[kind] = encode_dataclass
        return encode_dataclass
    if issubclass(kind, Mapping):
        return _mapping_tree
    plain: tuple[tuple[type, Callable[[Any], Any]], ...] = ((str, str.__str__), (int, int), (float, float))
    for base, convert in plain:
        if issubclass(kind, base):
            return convert
    for base, encoder in _ENCODERS.items():
        if issubclass(kind, base):
            return encoder
    raise TypeError(f"cannot record a {kind.__name__}")


class _Decoder:
    def __init__(self) -> None:
        # by class name: the class, its init fields, its init=False fields
        self.classes: dict[str, tuple[type, frozenset[str], frozenset[str]]] = {}

    def value(self, node: Any) -> Any:
        if type(node) is not list:
            if isinstance(node, dict):
                raise ValueError("scheduler record: a bare JSON object")
            return node
        if not node or type(node[0]) is not str:
            raise ValueError("scheduler record: an untagged array")
        tag = node[0]
        value = self.value
        if tag == "D":
            return Decimal(node[1])
        if tag == "M":
            return {
                k: v if type(v) is not list else Decimal(v[1]) if v[0] == "D" else value(v) for k, v in node[1].items()
            }
        if tag == "T":
            return tuple([v if type(v) is not list else value(v) for v in node[1:]])
        if tag == "C":
            return self.dataclass(node[1], node[2])
        if tag == "W":
            return datetime.fromisoformat(node[1])
        if tag == "L":
            return [v if type(v) is not list else value(v) for v in node[1:]]
        if tag == "F":
            return frozenset(value(x) for x in node[1:])
        if tag == "S":
            return {value(x) for x in node[1:]}
        if tag == "P":
            return {value(k): value(v) for k, v in node[1:]}
        if tag == "Z":
            return timedelta(days=node[1], seconds=node[2], microseconds=node[3])
        raise ValueError(f"scheduler record: unknown tag {tag!r}")

    def dataclass(self, name: str, recorded: Mapping[str, Any]) -> Any:
        known = self.classes.get(name)
        if known is None:
            cls = getattr(_model, name, None)
            if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
                raise ValueError(f"scheduler record: {_model.__name__} has no dataclass {name}")
            fields = dataclasses.fields(cls)
            known = (cls, frozenset(f.name for f in fields if f.init), frozenset(f.name for f in fields if not f.init))
            self.classes[name] = known
        cls, init, late = known
        value = self.value
        kwargs = {k: v if type(v) is not list else value(v) for k, v in recorded.items()}
        after: dict[str, Any] = {}  # init=False fields: set once the object is built
        if not kwargs.keys() <= init:
            for key in kwargs.keys() - init:
                if key not in late:
                    raise ValueError(f"scheduler record: {name} has no field {key!r} (recorded by another version)")
                after[key] = kwargs.pop(key)
        try:
            obj = cls(**kwargs)
        except TypeError as e:  # a field added since, without a default
            raise ValueError(f"scheduler record: cannot rebuild {name}: {e}") from None
        for key in sorted(after):
            object.__setattr__(obj, key, after[key])  # frozen dataclasses too
        return obj


# ----------------------------------------------------------------------------------------------
# What changed between two snapshots

_LABELS = {
    "occupied": "holds",
    "concurrent_sessions": "sessions",
    "total_resource_slots": "limits",
    "gpu_free": "GPUs free",
    "vfolder_hosts": "vfolder hosts",
    "position": "queue position",
    "factors": "score",
}
_KEY_FIELDS = ("id", "session_id", "access_key", "name", "kernel_id")
_CLIP = 60
_WHY_CLIP = 100  # a waiting session's reason in decision_changes


def snapshot_changes(old: Snapshot, new: Snapshot, *, limit: int = 10) -> list[str]:
    """What changed from `old` to `new`, a line each, at most `limit` lines per kind of thing (then "… and K more"):

        time: 2 h 14 min later
        pending: +3 (s7, s8, s9), -2 started or ended (s1, s2)
        s4: priority 10 → 50
        agent a3 joined
        agent a1: free cuda.device 0 → 4
        keypair AK1: holds cpu 2 → 6
        fair-share usage of AK2: 1.2e5 → 3.4e5
        scaling group default: policy fifo → multifactor

    Fields added to the snapshot's classes later show up too, in the same words as the others."""
    out: list[str] = []
    if old.now != new.now:
        delta = (new.now - old.now).total_seconds()
        out.append(f"time: {_span(delta)} {'later' if delta > 0 else 'earlier'}")
    elif (old.now.utcoffset(), old.now.tzinfo) != (new.now.utcoffset(), new.now.tzinfo):
        out.append(f"time: the same, in another time zone ({_short(old.now)} → {_short(new.now)})")
    out += _pending_lines(old.pending, new.pending, limit)
    out += _agent_lines(old.agents, new.agents, limit)
    out += _mapping_lines(
        old.keypairs, new.keypairs, "keypair {}", limit, "keypair changes", removed="removed (no limits)"
    )
    out += _scalar_lines(old.usage, new.usage, "fair-share usage of {}", limit, "usage changes")
    out += _scalar_lines(old.shares, new.shares, "fair-share share of {}", limit, "share changes")
    out += _mapping_lines(
        old.dependencies,
        new.dependencies,
        "dependency {}",
        limit,
        "dependency changes",
        added="known",
        removed="no longer known",
    )
    out += _mapping_lines(
        old.scaling_groups,
        new.scaling_groups,
        "scaling group {}",
        limit,
        "scaling group changes",
        removed="removed (defaults apply)",
    )
    out += _mapping_lines(
        old.projects, new.projects, "project {}", limit, "project changes", removed="removed (no cap)"
    )
    out += _mapping_lines(old.domains, new.domains, "domain {}", limit, "domain changes", removed="removed (no cap)")
    done = {"now", "pending", "agents", "keypairs", "usage", "shares", "dependencies", "scaling_groups"}
    done |= {"projects", "domains"}
    for f in dataclasses.fields(new):  # fields added since: the same generic words
        if f.name in done:
            continue
        a, b = getattr(old, f.name, None), getattr(new, f.name, None)
        if a != b:
            out += _collection_lines(f.name.replace("_", " "), a, b, limit)
    return out


def _pending_lines(old: Sequence[Any], new: Sequence[Any], limit: int) -> list[str]:
    before = {s.id: s for s in old}
    after = {s.id: s for s in new}
    added = [_who(s) for sid, s in after.items() if sid not in before]
    gone = [_who(s) for sid, s in before.items() if sid not in after]
    out: list[str] = []
    if added or gone:
        parts = []
        if added:
            parts.append(f"+{len(added)} ({_some(added, limit)})")
        if gone:
            parts.append(f"-{len(gone)} started or ended ({_some(gone, limit)})")
        out.append("pending: " + ", ".join(parts))
    changed: list[str] = []
    retried: dict[int, int] = {}
    for sid, a in before.items():
        b = after.get(sid)
        if b is None or a == b:
            continue
        frags = _field_frags(a, b, skip=("id", "retries"))
        if frags:
            changed.append(f"{_who(a)}: {'; '.join(frags)}")
        if a.retries != b.retries:
            retried[b.retries - a.retries] = retried.get(b.retries - a.retries, 0) + 1
    out += _bounded(changed, limit, "sessions changed")
    if retried:
        count = sum(retried.values())
        how = f"{next(iter(retried)):+d}" if len(retried) == 1 else "changed"
        out.append(f"retries: {how} for {count} session{'s' if count != 1 else ''}")
    return out


def _agent_lines(old: Sequence[Any], new: Sequence[Any], limit: int) -> list[str]:
    before = {a.id: a for a in old}
    after = {a.id: a for a in new}
    joined = [
        f"agent {aid} joined" + ("" if getattr(a, "schedulable", True) else " (not schedulable)")
        for aid, a in after.items()
        if aid not in before
    ]
    left = [f"agent {aid} left" for aid in before if aid not in after]
    changed: list[str] = []
    for aid, a in before.items():
        b = after.get(aid)
        if b is None or a == b:
            continue
        frags: list[str] = []
        if a.scaling_group != b.scaling_group:
            frags.append(f"scaling group {a.scaling_group} → {b.scaling_group}")
        if a.schedulable != b.schedulable:
            frags.append("schedulable again" if b.schedulable else "not schedulable")
        frags += _value_frags("capacity", a.capacity, b.capacity)
        frags += _value_frags("free", _free(a), _free(b))
        if a.ends != b.ends:
            frags.append(
                f"sessions of known end {len(a.ends)} → {len(b.ends)}"
                if len(a.ends) != len(b.ends)
                else "the known ends changed"
            )
        frags += _field_frags(a, b, skip=("id", "scaling_group", "schedulable", "capacity", "occupied", "ends"))
        changed.append(f"agent {aid}: {'; '.join(frags)}")
    return (
        _bounded(joined, limit, "agents joined")
        + _bounded(left, limit, "agents left")
        + _bounded(changed, limit, "agents changed")
    )


def _free(agent: Any) -> dict[str, Decimal | None]:
    """Each slot's capacity less what is occupied (None where that has no value: infinity less infinity)."""
    capacity: Mapping[str, Decimal] = agent.capacity
    occupied: Mapping[str, Decimal] = agent.occupied
    zero = Decimal(0)
    out: dict[str, Decimal | None] = {}
    for k in capacity.keys() | occupied.keys():
        try:
            out[k] = capacity.get(k, zero) - occupied.get(k, zero)
        except ArithmeticError:
            out[k] = None
    return out


def _mapping_lines(
    old: Mapping[Any, Any],
    new: Mapping[Any, Any],
    title: str,
    limit: int,
    what: str,
    *,
    added: str = "added",
    removed: str = "removed",
) -> list[str]:
    """Keyed things (keypairs, groups …): "keypair AK1 added", "keypair AK1: holds cpu 2 → 6"."""
    out: list[str] = []
    for key in sorted(old.keys() | new.keys(), key=str):
        if key not in old:
            out.append(f"{title.format(key)} {added}")
        elif key not in new:
            out.append(f"{title.format(key)} {removed}")
        elif old[key] != new[key]:
            out.append(f"{title.format(key)}: {'; '.join(_value_frags('', old[key], new[key]))}")
    return _bounded(out, limit, what)


def _scalar_lines(old: Mapping[Any, Any], new: Mapping[Any, Any], title: str, limit: int, what: str) -> list[str]:
    """Keyed numbers: "fair-share usage of AK2: 1.2e5 → 3.4e5" (a missing one is "none")."""
    out = [
        f"{title.format(key)}: {_short(old.get(key))} → {_short(new.get(key))}"
        for key in sorted(old.keys() | new.keys(), key=str)
        if old.get(key) != new.get(key)
    ]
    return _bounded(out, limit, what)


def _collection_lines(label: str, old: Any, new: Any, limit: int) -> list[str]:
    """A field this module knows nothing of: keyed when it can be (a mapping, or dataclasses with an id)."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        return _mapping_lines(old, new, label + " {}", limit, f"{label} changes")
    a, b = _keyed(old), _keyed(new)
    if a is not None and b is not None:
        out: list[str] = []
        added = [_who(x, k) for k, x in b.items() if k not in a]
        gone = [_who(x, k) for k, x in a.items() if k not in b]
        if added or gone:
            parts = [f"+{len(added)} ({_some(added, limit)})"] if added else []
            parts += [f"-{len(gone)} ({_some(gone, limit)})"] if gone else []
            out.append(f"{label}: {', '.join(parts)}")
        changed = [
            f"{label} {_who(x, k)}: {'; '.join(_value_frags('', x, b[k]))}"
            for k, x in a.items()
            if k in b and x != b[k]
        ]
        return out + _bounded(changed, limit, f"{label} changes")
    return [f"{label}: {'; '.join(_value_frags('', old, new))}"]


def _keyed(items: Any) -> dict[Any, Any] | None:
    if not isinstance(items, list | tuple) or not items:
        return {} if isinstance(items, list | tuple) else None
    first = items[0]
    if not dataclasses.is_dataclass(first):
        return None
    names = {f.name for f in dataclasses.fields(first)}
    key = next((k for k in _KEY_FIELDS if k in names), None)
    if key is None or not all(type(x) is type(first) for x in items):
        return None
    return {getattr(x, key): x for x in items}


def _field_frags(old: Any, new: Any, skip: Iterable[str] = (), prefix: str = "") -> list[str]:
    """One fragment per field that differs ("priority 10 → 50"), nested dataclasses field by field."""
    skipped = set(skip)
    out: list[str] = []
    for f in dataclasses.fields(old):
        if f.name in skipped:
            continue
        a, b = getattr(old, f.name), getattr(new, f.name, None)
        if a != b:
            out += _value_frags(prefix + _LABELS.get(f.name, f.name.replace("_", " ")), a, b)
    return out


def _value_frags(label: str, a: Any, b: Any) -> list[str]:
    lead = f"{label} " if label else ""
    if a == b:
        return []
    if dataclasses.is_dataclass(a) and type(a) is type(b):
        return _field_frags(a, b, prefix=lead)
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        parts = []
        for key in sorted(a.keys() | b.keys(), key=str):
            x, y = a.get(key), b.get(key)
            if x != y:
                name = str(key)
                parts.append(f"{name} {_short(x, name)} → {_short(y, name)}")
        return [lead + ", ".join(parts)]
    if isinstance(a, frozenset | set) and isinstance(b, frozenset | set):
        plus = [f"+{_short(x)}" for x in sorted(b - a, key=str)]
        minus = [f"-{_short(x)}" for x in sorted(a - b, key=str)]
        return [lead + " ".join(plus + minus)]
    if (
        isinstance(a, tuple | list)
        and isinstance(b, tuple | list)
        and len(a) == len(b)
        and all(dataclasses.is_dataclass(x) and type(x) is type(y) for x, y in zip(a, b, strict=True))
    ):  # kernels: each one's changes, by its name
        out = []
        for n, (x, y) in enumerate(zip(a, b, strict=True), 1):
            if x != y:
                which = getattr(x, "name", None)
                singular = lead.removesuffix("s ") + " " if lead.endswith("s ") else lead
                out += _field_frags(x, y, prefix=f"{singular}{which if isinstance(which, str) and which else n} ")
        return out
    return [f"{lead}{_short(a)} → {_short(b)}"]


def _short(value: Any, slot: str = "") -> str:
    """A value in few characters: amounts with their unit, floats in 3 digits, long things clipped."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, Decimal):
        try:
            return _clip(format_amount(slot, value), _CLIP)
        except ArithmeticError:  # beyond the default context (an exponent of thousands)
            return _clip(str(value), _CLIP)
    if isinstance(value, float):
        return _num(value)
    if isinstance(value, datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, timedelta):
        return _span(value.total_seconds())
    if isinstance(value, str):
        text = value if value else '""'
    elif isinstance(value, frozenset | set):
        text = "{" + ", ".join(sorted(_short(x) for x in value)) + "}"
    elif isinstance(value, tuple | list):
        text = "(" + ", ".join(_short(x) for x in value) + ")"
    elif isinstance(value, Mapping):
        text = "{" + ", ".join(f"{k}: {_short(v, str(k))}" for k, v in value.items()) + "}"
    elif dataclasses.is_dataclass(value):
        text = (
            type(value).__name__
            + "("
            + ", ".join(_short(getattr(value, f.name)) for f in dataclasses.fields(value))
            + ")"
        )
    else:
        text = str(value)
    return _clip(text, _CLIP)


def _num(x: float) -> str:
    """1.2e5, 0.5, 3, 1e-4."""
    if not math.isfinite(x):
        return str(x)
    if x == int(x) and abs(x) < 1e4:
        return str(int(x))
    if 1e-3 <= abs(x) < 1e4:
        return f"{x:.3g}"
    mantissa, _, exponent = f"{x:.2g}".partition("e")
    return f"{mantissa}e{int(exponent)}" if exponent else mantissa


def _span(seconds: float) -> str:
    """2 h 14 min, 3 d 4 h, 14 min 5 s, 45 s, 0.5 s."""
    s = abs(seconds)
    if s < 60:
        return f"{s:.3g} s"
    whole = int(round(s))
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h" if hours else f"{days} d"
    if hours:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    return f"{minutes} min {secs} s" if secs else f"{minutes} min"


def _who(item: Any, key: Any = None) -> str:
    """A session by its name, or its id where it has none."""
    name = getattr(item, "name", "")
    return name if isinstance(name, str) and name else str(item.id if key is None else key)


def _some(names: Sequence[str], limit: int) -> str:
    if len(names) <= limit:
        return ", ".join(names)
    return f"{', '.join(names[:limit])} … and {len(names) - limit} more"


def _bounded(lines: list[str], limit: int, what: str) -> list[str]:
    if len(lines) <= limit:
        return lines
    return [*lines[:limit], f"… and {len(lines) - limit} more {what}"]


def _clip(text: str, width: int | None) -> str:
    return text if width is None or len(text) <= width else text[: width - 1].rstrip() + "…"


# ----------------------------------------------------------------------------------------------
# What changed between two rounds' decisions

# the fields that make a decision's outcome (the others, such as a waiting session's queue position, are details)
_OUTCOME_FIELDS: dict[type, tuple[str, ...]] = {
    Placement: ("agents",),
    Pending: ("status_info", "msg"),
    Cancel: ("status_info", "msg"),
    Preempt: ("by", "msg"),
}


def decision_changes(
    old: Decisions, new: Decisions, names: Mapping[str, str] | None = None, *, limit: int | None = 50
) -> list[str]:
    """Per session whose outcome differs, a line (sessions named by `names`, session id → name, where given):

        s3: waited (no agent has room: best is a1 with cpu 1 free…) → placed on a2
        s5: placed on a1 → placed on a4
        s9: not in the past round (placed on a3)
        s1: no longer pending (was placed on a1)

    then a line per detail that changed with the same outcome ("queue position changed for 12 waiting sessions
    (…)"), or "same outcomes, decided in another order". Empty when `old == new`, and when they differ only by
    floats within 1e-9 relative (see `_close`). At most `limit` session lines (None: all)."""
    names = names or {}
    before, after = _by_session(old), _by_session(new)
    lines: list[str] = []
    details: dict[str, list[str]] = {}
    for sid in [*before, *(s for s in after if s not in before)]:
        who = names.get(sid) or sid
        a, b = before.get(sid), after.get(sid)
        if a is None:
            lines.append(f"{who}: not in the past round ({_outcome_text(b or [], names, _WHY_CLIP)})")
        elif b is None:
            lines.append(f"{who}: no longer pending (was {_outcome_text(a, names, _WHY_CLIP)})")
        elif [_outcome(x) for x in a] != [_outcome(x) for x in b]:
            was, now = _outcome_text(a, names, _WHY_CLIP), _outcome_text(b, names, _WHY_CLIP)
            if was == now or _same_agents(a, b):  # the difference is past the clipped text, or in which kernel is where
                was, now = _outcome_text(a, names, None, True), _outcome_text(b, names, None, True)
            lines.append(f"{who}: {was} → {now}")
        elif a != b:
            for x, y in zip(a, b, strict=True):
                for f in dataclasses.fields(x) if dataclasses.is_dataclass(x) else ():
                    if not _close(getattr(x, f.name), getattr(y, f.name)):
                        details.setdefault(_LABELS.get(f.name, f.name.replace("_", " ")), []).append(who)
    out = lines if limit is None else _bounded(lines, limit, "sessions changed")
    for label, who_all in details.items():
        unique = list(dict.fromkeys(who_all))
        count = len(unique)
        out.append(f"{label} changed for {count} session{'s' if count != 1 else ''} ({_some(unique, 10)})")
    for f in dataclasses.fields(new):  # a field of the round that is not a list of decisions
        x, y = getattr(old, f.name, None), getattr(new, f.name, None)
        if not isinstance(y, list | tuple) and not _close(x, y):
            out += [f"{f.name.replace('_', ' ')}: {'; '.join(_value_frags('', x, y))}"]
    if not out and _order(old) != _order(new):
        out.append("same outcomes, decided in another order")
    return out


def _close(a: Any, b: Any) -> bool:
    """Equal, floats to 1e-9 relative: the core sums floats (fair-share usage) over sets, whose order differs between
    processes, so a round replayed elsewhere may score a session an ulp apart."""
    if type(a) is float and type(b) is float:
        return a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    if dataclasses.is_dataclass(a) and type(a) is type(b):
        return all(_close(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, list | tuple) and type(a) is type(b):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    return bool(a == b)


def _order(decisions: Decisions) -> list[list[Any]]:
    """The sessions of each list of decisions, in order."""
    return [
        [getattr(item, "session_id", item) for item in items]
        for f in dataclasses.fields(decisions)
        if isinstance(items := getattr(decisions, f.name), list | tuple)
    ]


def _by_session(decisions: Decisions) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for f in dataclasses.fields(decisions):
        items = getattr(decisions, f.name)
        if not isinstance(items, list | tuple):
            continue
        for item in items:
            key = getattr(item, "session_id", None)
            if key is None and dataclasses.is_dataclass(item):
                key = getattr(item, dataclasses.fields(item)[0].name)
            out.setdefault(str(key), []).append(item)
    return out


def _same_agents(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Two placements on the same agents (their kernels swapped)."""
    return (
        len(a) == len(b) == 1
        and isinstance(a[0], Placement)
        and isinstance(b[0], Placement)
        and set(a[0].agents.values()) == set(b[0].agents.values())
    )


def _outcome(item: Any) -> tuple[Any, ...]:
    names = _OUTCOME_FIELDS.get(type(item))
    if names is None:
        if not dataclasses.is_dataclass(item):
            return (item,)
        names = tuple(f.name for f in dataclasses.fields(item))
    return (type(item).__name__, *(_hashable(getattr(item, n)) for n in names))


def _hashable(value: Any) -> Any:
    return tuple(sorted(value.items(), key=str)) if isinstance(value, Mapping) else value


def _outcome_text(items: Sequence[Any], names: Mapping[str, str], width: int | None, full: bool = False) -> str:
    return " and ".join(_describe(item, names, width, full) for item in items) or "nothing"


def _describe(item: Any, names: Mapping[str, str], width: int | None, full: bool) -> str:
    if isinstance(item, Placement):
        text = "placed on " + ", ".join(item.agent_ids)
        if full and len(item.agents) > 1:
            text += " (" + ", ".join(f"{k} on {v}" for k, v in item.agents.items()) + ")"
        return text
    if isinstance(item, Pending):
        return f"waited ({_clip(item.msg, width)})"
    if isinstance(item, Cancel):
        return f"cancelled ({_clip(item.msg, width)})"
    if isinstance(item, Preempt):
        return f"preempted for {names.get(item.by) or item.by} ({_clip(item.msg, width)})"
    if dataclasses.is_dataclass(item):  # a kind of decision added since: its name and fields
        fields = [f for f in dataclasses.fields(item) if f.name != "session_id"]
        parts = ", ".join(f"{f.name.replace('_', ' ')} {_short(getattr(item, f.name))}" for f in fields)
        return _clip(f"{type(item).__name__.lower()} ({parts})", None if width is None else 2 * width)
    return _clip(str(item), width)
