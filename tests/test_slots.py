"""Tests for bai/common/slots.py: parsing, arithmetic and formatting of resource slots."""

from __future__ import annotations

from decimal import Decimal

import pytest

from bai.common import slots
from bai.common.slots import SlotError

GiB = 1024**3
MiB = 1024**2


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1g", GiB),
        ("1G", GiB),
        ("512m", 512 * MiB),
        ("1.5GiB", 3 * GiB // 2),
        ("1_024", 1024),
        ("2k", 2048),
        ("1gb", GiB),
        (" 64 MiB ", 64 * MiB),
        ("1048576", 1048576),
        (4096, 4096),
        (0, 0),
    ],
)
def test_parse_bytes(value: str | int, expected: int) -> None:
    result = slots.parse_bytes(value)
    assert result == expected
    assert result == result.to_integral_value()


@pytest.mark.parametrize("value", ["inf", "Infinity", "INF"])
def test_parse_bytes_infinity(value: str) -> None:
    assert slots.parse_bytes(value) == Decimal("Infinity")


def test_parse_bytes_rejects_fractional_bytes() -> None:
    with pytest.raises(SlotError, match="whole number"):
        slots.parse_bytes("1.5")


@pytest.mark.parametrize("value", ["abc", "-1g", "1x", "", "1.5.2g", -1])
def test_parse_bytes_rejects_garbage(value: str | int) -> None:
    with pytest.raises(SlotError):
        slots.parse_bytes(value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0.5", Decimal("0.5")),
        ("2", Decimal(2)),
        (2, Decimal(2)),
        (0.25, Decimal("0.25")),
        ("0", Decimal(0)),
        ("1.23456", Decimal("1.235")),
        ("0.1234", Decimal("0.123")),
    ],
)
def test_parse_count(value: str | int | float, expected: Decimal) -> None:
    assert slots.parse_count(value) == expected


def test_parse_count_is_quantised_to_three_places() -> None:
    assert slots.parse_count("1.23456").as_tuple().exponent >= -3


@pytest.mark.parametrize("value", ["-1", "-0.5", "nan", "NaN", "inf", "-inf", "abc", ""])
def test_parse_count_rejects(value: str) -> None:
    with pytest.raises(SlotError):
        slots.parse_count(value)


def test_parse_count_huge_number_is_slot_error() -> None:
    with pytest.raises(SlotError):
        slots.parse_count("1e30")


def test_parse_slots_uses_bytes_for_mem_and_counts_for_cpu() -> None:
    parsed = slots.parse_slots({"cpu": "2", "mem": "512m", "cuda.mem": "1g"}, {"cpu", "mem", "cuda.mem"})
    assert parsed == {"cpu": Decimal(2), "mem": Decimal(512 * MiB), "cuda.mem": Decimal(GiB)}


def test_parse_slots_skips_empty_values() -> None:
    assert slots.parse_slots({"cpu": "1", "mem": None, "x": ""}, None) == {"cpu": Decimal(1)}


def test_parse_slots_rejects_unknown_slot_and_names_it() -> None:
    with pytest.raises(SlotError, match="cuda.device"):
        slots.parse_slots({"cpu": "1", "cuda.device": "1"}, {"cpu", "mem"})


def test_parse_slots_rejects_bad_amount() -> None:
    with pytest.raises(SlotError):
        slots.parse_slots({"mem": "lots"}, {"cpu", "mem"})


def test_add_and_sub() -> None:
    a = {"cpu": Decimal(4), "mem": Decimal(GiB)}
    b = {"cpu": Decimal("1.5"), "cuda.device": Decimal(1)}
    assert slots.add(a, b) == {"cpu": Decimal("5.5"), "mem": Decimal(GiB), "cuda.device": Decimal(1)}
    assert slots.sub(a, b) == {"cpu": Decimal("2.5"), "mem": Decimal(GiB), "cuda.device": Decimal(-1)}
    assert slots.sub(slots.add(a, b), b) == {**a, "cuda.device": Decimal(0)}


def test_fits() -> None:
    free = {"cpu": Decimal(2), "mem": Decimal(GiB)}
    assert slots.fits({"cpu": Decimal(2), "mem": Decimal(GiB)}, free)
    assert slots.fits({"cpu": Decimal("0.5")}, free)
    assert not slots.fits({"cpu": Decimal("2.001")}, free)
    assert not slots.fits({"mem": Decimal(GiB + 1)}, free)
    assert not slots.fits({"cuda.device": Decimal(1)}, free)  # a missing slot has nothing free
    assert slots.fits({"cuda.device": Decimal(0)}, free)  # asking for zero always fits


def test_shortfall_lists_only_what_does_not_fit() -> None:
    free = {"cpu": Decimal(2), "mem": Decimal(GiB)}
    request = {"cpu": Decimal(4), "mem": Decimal(GiB // 2), "cuda.device": Decimal(1)}
    assert slots.shortfall(request, free) == [
        "cpu 4 requested, 2 free",
        "cuda.device 1 requested, 0 free",
    ]
    assert slots.shortfall({"mem": Decimal(2 * GiB)}, free) == ["mem 2GiB requested, 1GiB free"]
    assert slots.shortfall({"cpu": Decimal(1)}, free) == []


def test_to_wire_and_from_wire_round_trip() -> None:
    original = {
        "cpu": slots.parse_count("10"),
        "mem": slots.parse_bytes("1g"),
        "cuda.shares": Decimal("0.5"),
        "disk": Decimal("Infinity"),
    }
    wire = slots.to_wire(original)
    assert wire == {"cpu": "10", "mem": "1073741824", "cuda.shares": "0.5", "disk": "Infinity"}
    assert all(isinstance(v, str) for v in wire.values())
    assert list(wire) == sorted(wire)
    assert slots.from_wire(wire) == original


def test_to_wire_integers_are_plain() -> None:
    assert slots.to_wire({"cpu": Decimal("2.000")}) == {"cpu": "2"}
    assert slots.to_wire({"cpu": Decimal("1E+1")}) == {"cpu": "10"}


def test_from_wire_none_is_empty() -> None:
    assert slots.from_wire(None) == {}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, "0B"),
        (512, "512B"),
        (1024, "1KiB"),
        (512 * MiB, "512MiB"),
        (GiB, "1GiB"),
        (3 * GiB // 2, "1.5GiB"),
        (2 * 1024**4, "2TiB"),
        (Decimal("Infinity"), "∞"),
    ],
)
def test_format_bytes(value: int | Decimal, expected: str) -> None:
    assert slots.format_bytes(value) == expected


def test_format_slots() -> None:
    assert slots.format_slots({"mem": Decimal(GiB), "cpu": Decimal("0.5"), "cuda.device": Decimal(0)}) == (
        "cpu 0.5, mem 1GiB"
    )
