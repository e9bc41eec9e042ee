"""`bai whoami` and `bai quota`: the caller's own keypair, its role and resource policy, and what the policy
allows beside what the keypair holds now (GET /bai/quota, bai/node/manager/http/quota.py)."""

from __future__ import annotations

from typing import Any

UNLIMITED = "unlimited"


async def whoami_of(c: Any) -> dict[str, Any]:
    """{accessKey, role: admin | user, endpoint, resourcePolicy}. The role: whether the admin-only keypair
    list answers (403 for users)."""
    from bai.client import APIError

    quota = await c.request("GET", "/bai/quota")
    try:
        await c.request("GET", "/bai/admin/keypairs")
        role = "admin"
    except APIError as e:
        if e.status not in (401, 403):
            raise
        role = "user"
    return {
        "accessKey": quota["accessKey"],
        "role": role,
        "endpoint": c.endpoint,
        "resourcePolicy": quota["resourcePolicy"],
    }


def whoami_lines(me: dict[str, Any]) -> list[str]:
    return [
        f"Access key  {me['accessKey']}",
        f"Role        {me['role']}",
        f"Endpoint    {me['endpoint']}",
        f"Policy      {me['resourcePolicy']}",
    ]


def _count(used: int, most: int) -> str:
    return f"{used} of {most}" if most else f"{used} ({UNLIMITED})"


def _amount(name: str, value: Any) -> str:
    from bai.common.present import number, size
    from bai.common.slots import is_bytes_slot

    return size(value) if is_bytes_slot(name) else number(value)


def quota_lines(q: dict[str, Any]) -> list[str]:
    """The policy's limits beside current use, one a line: `Sessions  1 of 3`, `cpu  2 of 4`."""
    from decimal import Decimal

    from bai.common.slots import from_wire

    lines = [
        f"Policy            {q['resourcePolicy']}   (keypair {q['accessKey']})",
        f"Sessions          {_count(int(q['concurrentSessions']), int(q['maxConcurrentSessions']))}",
        f"Queued sessions   {_count(int(q['pendingSessions']), int(q['maxPendingSessions']))}",
        f"Session networks  {_count(int(q['sessionNetworks']), int(q['maxSessionNetworks']))}",
    ]
    limits = from_wire(q.get("totalResourceSlots"))
    used = from_wire(q.get("occupiedSlots"))
    limited = q.get("defaultForUnspecified") == "LIMITED"
    names = ["cpu", "mem", *sorted((limits.keys() | used.keys()) - {"cpu", "mem"})]
    for name in names:
        have = used.get(name, Decimal(0))
        limit = limits.get(name)
        if limit is not None and limit.is_finite():
            shown = f"{_amount(name, have)} of {_amount(name, limit)}"
        elif limit is None and limited:
            shown = f"{_amount(name, have)} of 0 (not in the policy: none allowed)"
        else:
            shown = f"{_amount(name, have)} ({UNLIMITED})"
        lines.append(f"{name:<17} {shown}")
    return lines
