"""GPU slots and how a request is packed onto devices (pure; used by the agent and the scheduler).

Slots: `cuda.device` counts whole devices; `cuda.shares` counts fractions (a device is 1 share).
A kernel asks for whole devices (`cuda.device` N: N devices nobody uses), for a fraction
(`cuda.shares` S < 1: one device with S free), or for more than one share (whole devices for the
integral part, then the fraction). Fractions fill partly used devices before fresh ones (best fit: the
device with the least room that is still enough), so whole devices stay free for whole requests.
"""

from __future__ import annotations

from decimal import Decimal

DEVICE = "cuda.device"
SHARES = "cuda.shares"
ONE = Decimal(1)
ZERO = Decimal(0)


def request_of(slots: dict[str, Decimal]) -> tuple[int, Decimal]:
    """(whole devices, fraction) a kernel's slots ask for."""
    whole = int(slots.get(DEVICE, ZERO))
    shares = Decimal(slots.get(SHARES, ZERO))
    whole += int(shares)  # more than one share: whole devices first
    return whole, shares - int(shares)


def pack(free: list[Decimal], whole: int, fraction: Decimal) -> list[tuple[int, Decimal]] | None:
    """Which devices (by position in `free`) and how much of each a request takes, or None if it
    does not fit. `free` is what each device has left (1 = unused)."""
    taken: list[tuple[int, Decimal]] = []
    left = list(free)
    for _ in range(whole):
        unused = next((i for i, f in enumerate(left) if f >= ONE), None)
        if unused is None:
            return None
        left[unused] -= ONE
        taken.append((unused, ONE))
    if fraction > 0:
        partly = [(f, i) for i, f in enumerate(left) if ZERO < f < ONE and f >= fraction]
        fresh = [(f, i) for i, f in enumerate(left) if f >= ONE]
        choice = min(partly) if partly else (min(fresh, key=lambda x: x[1]) if fresh else None)
        if choice is None:
            return None
        left[choice[1]] -= fraction
        taken.append((choice[1], fraction))
    return taken


def describe_shortage(free: list[Decimal], whole: int, fraction: Decimal) -> str:
    """Why a request does not fit: what it wants and what each device has left."""
    want = []
    if whole:
        want.append(f"{whole} whole GPU{'s' if whole > 1 else ''}")
    if fraction:
        want.append(f"{fraction.normalize():f} of one GPU")
    room = ", ".join(f"{f.normalize():f}" for f in free) or "no GPUs"
    return f"wants {' and '.join(want)}; free per GPU: {room}"
