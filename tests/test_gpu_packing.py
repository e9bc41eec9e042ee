"""How GPU requests are packed onto devices (pure)."""

from __future__ import annotations

from decimal import Decimal as D

from bai.common.gpus import describe_shortage, pack, request_of


def test_requests_from_slots() -> None:
    assert request_of({"cuda.device": D(2)}) == (2, D(0))
    assert request_of({"cuda.shares": D("0.25")}) == (0, D("0.25"))
    assert request_of({"cuda.shares": D("1.5")}) == (1, D("0.5"))
    assert request_of({"cpu": D(1)}) == (0, D(0))


def test_whole_devices_take_unused_ones_only() -> None:
    assert pack([D(1), D("0.5"), D(1)], 2, D(0)) == [(0, D(1)), (2, D(1))]
    assert pack([D(1), D("0.5")], 2, D(0)) is None


def test_fractions_fill_partly_used_devices_first_best_fit() -> None:
    free = [D(1), D("0.5"), D("0.3"), D(1)]
    assert pack(free, 0, D("0.25")) == [(2, D("0.25"))]  # 0.3 is the tightest that fits
    assert pack(free, 0, D("0.4")) == [(1, D("0.4"))]
    assert pack(free, 0, D("0.6")) == [(0, D("0.6"))]  # no partly used device has room: a fresh one
    assert pack([D("0.5"), D("0.3")], 0, D("0.6")) is None  # never more than a device has


def test_more_than_one_share_and_shortage_words() -> None:
    assert pack([D("0.5"), D(1), D(1)], 1, D("0.5")) == [(1, D(1)), (0, D("0.5"))]
    assert (
        describe_shortage([D("0.5"), D("0.2")], 1, D("0.5"))
        == "wants 1 whole GPU and 0.5 of one GPU; free per GPU: 0.5, 0.2"
    )
