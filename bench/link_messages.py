"""The cost of the link's typed messages: decode (`from_wire`) + encode (`to_wire`) of a typical `Execute`
call and of a `KernelLogs` event with 100 chunks, as the link's messages do it now (msgspec Structs, every
field's type checked) against the dataclasses of before (which checked only that fields exist), kept here
as the baseline and measured in the same run.

    .venv/bin/python bench/link_messages.py [--rounds 20000]

Prints µs per message (decode + encode; median of 7 repeats) for each, the ratio new/old, and for scale what
msgpack's pack + unpack of the same message costs (what the ZeroMQ link adds to every message anyway).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from bai.node.link.messages import Execute, KernelLogs
from bai.node.link.wire import carried

# -- the decode path of before (bai/node/link/messages.py at 93c0422), the baseline ------------------------

M = TypeVar("M", bound="OldMessage")


class OldMessageError(ValueError):
    pass


_FIELDS: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


class OldMessage:
    _nested: ClassVar[dict[str, type[OldMessage]]] = {}
    _single: ClassVar[frozenset[str]] = frozenset()

    def to_wire(self) -> dict[str, Any]:
        out = {}
        for name in _field_names(type(self)):
            value = getattr(self, name)
            if name in self._nested and value is not None:
                value = value.to_wire() if isinstance(value, OldMessage) else [item.to_wire() for item in value]
            out[name] = value
        return out

    @classmethod
    def from_wire(cls: type[M], data: Any) -> M:
        if not isinstance(data, dict):
            raise OldMessageError(f"{cls.__name__}: expected a mapping, got {type(data).__name__}")
        names = _field_names(cls)
        values = {k: v for k, v in data.items() if k in names}
        for name, kind in cls._nested.items():
            if name in values:
                items = values[name]
                if name in cls._single:
                    values[name] = None if items is None else kind.from_wire(items)
                    continue
                if not isinstance(items, list):
                    raise OldMessageError(f"{cls.__name__}.{name}: expected a list")
                values[name] = [kind.from_wire(item) for item in items]
        try:
            return cls(**values)
        except TypeError as e:
            raise OldMessageError(f"{cls.__name__}: {e}") from None


@dataclass
class OldExecute(OldMessage):
    method: ClassVar[str] = "execute"

    kernel_id: str
    run_id: str
    mode: str
    code: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    flush_timeout: float = 2.0


@dataclass
class OldKernelLogs(OldMessage):
    name: ClassVar[str] = "kernel_logs"

    chunks: list[list[str]] = field(default_factory=list)


# -- measuring ------------------------------------------------------------------------------------------------


def per_message_us(round_trip: Callable[[], object], rounds: int) -> float:
    """Median µs of one call of `round_trip` over 7 repeats of `rounds` calls."""
    times = []
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(rounds):
            round_trip()
        times.append((time.perf_counter() - start) / rounds * 1e6)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20_000, help="decodes + encodes per repeat (default 20000)")
    args = ap.parse_args()
    execute = {
        "kernel_id": "3f1c2a9e-5b7d-4c1e-9a0f-2d6e8b4c1a7f",
        "run_id": "a1b2c3d4e5f60718",
        "mode": "query",
        "code": "import numpy as np\nprint(np.arange(10).sum())\n",
        "options": {"exec": "python main.py"},
        "flush_timeout": 2.0,
    }
    logs = {"chunks": [[f"kernel-{i % 4}", f"step {i}: loss 0.{i:04d} accuracy 0.9{i:03d}\n"] for i in range(100)]}
    cases = [
        ("Execute", OldExecute, Execute, execute, args.rounds),
        ("KernelLogs (100 chunks)", OldKernelLogs, KernelLogs, logs, max(1, args.rounds // 10)),
    ]
    for label, old, new, wire, rounds in cases:
        # the same dicts as they travel
        assert carried(old.from_wire(wire).to_wire()) == carried(new.from_wire(wire).to_wire()) == wire
        old_us = per_message_us(lambda old=old, wire=wire: old.from_wire(wire).to_wire(), rounds)
        new_us = per_message_us(lambda new=new, wire=wire: new.from_wire(wire).to_wire(), rounds)
        wire_us = per_message_us(lambda wire=wire: carried(wire), rounds)
        print(
            f"{label:24} decode+encode  old {old_us:6.2f} µs   new {new_us:6.2f} µs   new/old {new_us / old_us:.2f}"
            f"   (for scale: msgpack pack+unpack of it, as the ZeroMQ link does, {wire_us:6.2f} µs)"
        )


if __name__ == "__main__":
    main()
