"""What `--json` prints: the API's objects with their keys in one style, camelCase, naming the unit of a
number that has one (`usedBytes`, `maxSessionLifetimeSeconds`, `cpuPct`).

bai's own endpoints already answer so; the endpoints Backend.AI defines (folders, policies) answer in its
snake_case, which the official client needs, so the CLI converts those keys. Keys that are data, not
field names (environment variables, slot names, labels, shares by access key, image aliases) are left as
they are, and so is everything under them.
"""

from __future__ import annotations

import json
import re
from typing import Any

# snake_case fields whose number has a unit that the name does not say
UNIT_NAMES = {
    "idle_timeout": "idleTimeoutSeconds",
    "max_session_lifetime": "maxSessionLifetimeSeconds",
    "idle_window": "idleWindowSeconds",
    "max_vfolder_size": "maxVfolderSizeBytes",
}
# fields whose keys are data: kept as they are, with everything under them
DATA_FIELDS = frozenset(
    {
        "environ",
        "env",
        "labels",
        "shares",
        "requestedSlots",
        "occupiedSlots",
        "occupyingSlots",
        "occupied_slots",
        "total_resource_slots",
        "totalResourceSlots",
        "occupied",  # (a project's usage and cap: slot -> amount)
        "cap",
        "slots",
        "available_slots",
        "capacity",
        "aliases",
        "statusData",
        "status_data",
        "config",
        "resourceOpts",
        "resource_opts",
        "warm",
        "lastStat",  # Backend.AI's statistics objects, in its metric names
        "liveStat",
        "last_stat",
        "live_stat",
        "stats",
    }
)
_SNAKE = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)+")


def camel(name: str) -> str:
    """`used_bytes` -> `usedBytes`; a name that is not snake_case is returned unchanged."""
    if name in UNIT_NAMES:
        return UNIT_NAMES[name]
    if not _SNAKE.fullmatch(name):
        return name
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def keys_in_style(value: Any) -> Any:
    """`value` with every field name in the CLI's JSON style (data keys untouched)."""
    if isinstance(value, dict):
        return {camel(k): (v if k in DATA_FIELDS else keys_in_style(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [keys_in_style(v) for v in value]
    return value


def dumps(value: Any, indent: int | None = 2) -> str:
    """The JSON that `--json` prints."""
    return json.dumps(keys_in_style(value), indent=indent)
