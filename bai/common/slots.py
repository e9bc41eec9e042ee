"""Resource slots: a mapping of slot name to an exact Decimal amount.

`cpu` is counted in cores, `mem` (and any slot whose name contains "mem") in bytes.
All parsing of user-given amounts ("1g", "512m", "0.5") happens here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation

Slots = dict[str, Decimal]

_BYTE_RE = re.compile(
    r"^\s*(?P<num>[0-9][0-9_]*(?:\.[0-9_]+)?)\s*(?P<suffix>[kmgtpezy]?)(?:i?b|i?bytes?|byte)?\s*$",
    re.IGNORECASE,
)
_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5, "e": 6, "z": 7, "y": 8}
_COUNT_QUANTUM = Decimal("0.001")


class SlotError(ValueError):
    """A resource amount or slot name that cannot be used."""


def is_bytes_slot(name: str) -> bool:
    return "mem" in name


def parse_bytes(value: str | int) -> Decimal:
    """Parse a binary size: ``1g`` = 1024**3 bytes, a plain integer is bytes."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise SlotError(f"a size cannot be negative: {value}")
        return Decimal(value)
    text = str(value).strip()
    if text.lower() in ("inf", "infinity"):
        return Decimal("Infinity")
    m = _BYTE_RE.match(text)
    if not m:
        raise SlotError(f"cannot parse {value!r} as a size (examples: 512m, 1g, 1.5GiB, 1048576)")
    num = Decimal(m["num"].replace("_", ""))
    power = _POWERS[m["suffix"].lower()]
    scale: int = 1024**power  # int ** int is typed Any (a negative power gives a float); power is >= 0
    result = num * scale
    if result != result.to_integral_value():
        raise SlotError(f"{value!r} is not a whole number of bytes")
    return result.to_integral_value()


def parse_count(value: str | int | float) -> Decimal:
    """Parse a count such as a number of cores: a non-negative decimal, 3 places."""
    try:
        num = Decimal(str(value).strip())
    except InvalidOperation:
        raise SlotError(f"cannot parse {value!r} as a number") from None
    if not num.is_finite():
        raise SlotError(f"{value!r} is not a finite number")
    if num < 0:
        raise SlotError(f"an amount cannot be negative: {value}")
    try:
        num = num.quantize(_COUNT_QUANTUM)
    except InvalidOperation:
        raise SlotError(f"{value!r} is too large") from None
    return Decimal(int(num)) if num == num.to_integral_value() else num.normalize()


def parse_amount(name: str, value: str | int | float) -> Decimal:
    if is_bytes_slot(name):
        if isinstance(value, float):
            value = str(value)
        return parse_bytes(value)
    return parse_count(value)


def parse_slots(raw: Mapping[str, object], known: set[str] | None = None) -> Slots:
    """Parse a user-given {slot: amount} mapping, refusing unknown slot names."""
    out: Slots = {}
    for name, value in raw.items():
        if known is not None and name not in known:
            raise SlotError(f"unknown resource slot {name!r} (known: {', '.join(sorted(known))})")
        if value is None or value == "":
            continue
        out[name] = parse_amount(name, value)  # type: ignore[arg-type]
    return out


def add(a: Mapping[str, Decimal], b: Mapping[str, Decimal]) -> Slots:
    return {k: a.get(k, Decimal(0)) + b.get(k, Decimal(0)) for k in a.keys() | b.keys()}


def sub(a: Mapping[str, Decimal], b: Mapping[str, Decimal]) -> Slots:
    return {k: a.get(k, Decimal(0)) - b.get(k, Decimal(0)) for k in a.keys() | b.keys()}


def fits(request: Mapping[str, Decimal], free: Mapping[str, Decimal]) -> bool:
    """True when every requested amount is available (missing keys count as 0)."""
    return all(amount <= free.get(name, Decimal(0)) for name, amount in request.items() if amount > 0)


def shortfall(request: Mapping[str, Decimal], free: Mapping[str, Decimal]) -> list[str]:
    """Human-readable list of the slots that do not fit."""
    out = []
    for name, amount in sorted(request.items()):
        have = free.get(name, Decimal(0))
        if amount > 0 and amount > have:
            out.append(f"{name} {format_amount(name, amount)} requested, {format_amount(name, have)} free")
    return out


def to_wire(slots: Mapping[str, Decimal]) -> dict[str, str]:
    """Serialise as Backend.AI does: decimal strings, integers plain, bytes in bytes."""
    out = {}
    for name, value in sorted(slots.items()):
        if value.is_infinite():
            out[name] = "Infinity"
        elif value == value.to_integral_value():
            out[name] = str(int(value))
        else:
            out[name] = str(value.normalize())
    return out


def from_wire(raw: Mapping[str, str] | None) -> Slots:
    return {k: Decimal(v) for k, v in (raw or {}).items()}


def format_bytes(value: Decimal | int) -> str:
    value = Decimal(value)
    if value.is_infinite():
        return "∞"
    for unit, power in (("T", 4), ("G", 3), ("M", 2), ("K", 1)):
        scale = Decimal(1024) ** power
        if value >= scale:
            shown = (value / scale).quantize(Decimal("0.01")).normalize()
            return f"{shown:f}{unit}iB"
    return f"{int(value)}B"


def format_amount(name: str, value: Decimal) -> str:
    if is_bytes_slot(name):
        return format_bytes(value)
    return f"{value.normalize():f}"


def format_slots(slots: Mapping[str, Decimal]) -> str:
    return ", ".join(f"{name} {format_amount(name, v)}" for name, v in sorted(slots.items()) if v)
