"""One spelling for what the CLI says often: "no limit" is `unlimited`, sizes are `23.5 GiB` (binary units,
a blank before the unit, at most one decimal; bai.common.present.size), also inside sentences that other
parts of bai wrote (`23.54GiB` in a scheduler's reason becomes `23.5 GiB`)."""

from __future__ import annotations

import re

from bai.common.present import size

UNLIMITED = "unlimited"

_POWERS = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4, "P": 5}
_SIZE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?) ?([KMGTP]?)iB\b|(?<![\w.])(\d+)B\b")


def _shown(match: re.Match[str]) -> str:
    if match.group(3) is not None:
        return size(int(match.group(3)))
    return size(float(match.group(1)) * 1024 ** _POWERS[match.group(2)])


def sizes_in(text: str) -> str:
    """`text` with each size written as `size()` writes it: `mem 23.54GiB requested` -> `mem 23.5 GiB
    requested`."""
    return _SIZE.sub(_shown, text) if "B" in text else text


def limit(value: object, shown: str | None = None) -> str:
    """A limit as shown: `unlimited` for 0 / None / empty, else `shown` (or the value itself)."""
    if not value:
        return UNLIMITED
    return shown if shown is not None else str(value)
