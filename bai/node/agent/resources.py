"""What this host offers: resource slots from psutil, overridable by configuration."""

from __future__ import annotations

from decimal import Decimal

import psutil

from bai.common.slots import Slots, parse_bytes, parse_count


def discover_slots(cpu_override: str = "", mem_override: str = "") -> Slots:
    cpu = parse_count(cpu_override) if cpu_override else Decimal(psutil.cpu_count() or 1)
    mem = parse_bytes(mem_override) if mem_override else Decimal(psutil.virtual_memory().total)
    return {"cpu": cpu, "mem": mem}
