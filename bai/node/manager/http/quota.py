"""`GET /bai/quota`: the caller's own keypair, its resource policy's limits and what it holds now (a bai
extension; read-only). The dashboard's header shows it.

    {"accessKey", "resourcePolicy": NAME,
     "maxConcurrentSessions": N (0: unlimited), "concurrentSessions": N,
     "totalResourceSlots": {slot: amount} (the policy's; a slot not named is `defaultForUnspecified`:
                           "UNLIMITED" or "LIMITED", i.e. 0),
     "defaultForUnspecified", "occupiedSlots": {slot: amount},
     "maxSessionNetworks": N (0: unlimited), "sessionNetworks": N,
     "maxPendingSessions": N (0: unlimited), "pendingSessions": N}

`sessionNetworks` counts the keypair's sessions of several kernels from SCHEDULED to TERMINATING (each holds
a Docker network on every agent it runs on, until its last kernel there is removed): the scheduler keeps a
new one PENDING while it has `maxSessionNetworks` of them.

`pendingSessions` counts the keypair's sessions waiting PENDING: while it has `maxPendingSessions` of them
(the policy's max_pending_session_count) a new session is refused at creation (412, quota-exceeded).

Amounts are in wire form (decimal strings, bytes in bytes). What counts is what the scheduler counts
against a keypair (sessions from SCHEDULED to RUNNING, not TERMINATING). No parameters: everyone sees
only their own keypair (an administrator too; `/bai/admin/keypairs` lists the others).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from aiohttp import web

from bai.common import slots as slotlib
from bai.common.problems import invalid
from bai.common.status import OCCUPYING_STATUSES, SessionStatus
from bai.node.manager.http.context import services_of
from bai.node.manager.http.maintenance_routes import FREEZE
from bai.node.manager.services.dispatcher import QUOTA_STATUSES


async def my_quota(request: web.Request) -> web.Response:
    if request.query:
        raise invalid(f"/bai/quota takes no parameters (got {', '.join(sorted(request.query))})")
    services = services_of(request)
    access_key = request["access_key"]
    keypair = await services.accounts.keypair(access_key)
    name = (keypair.resource_policy if keypair else "") or "default"
    policy = await services.accounts.policy(name)
    holding = await services.state.list_sessions(access_key, OCCUPYING_STATUSES)
    held = [s for s in holding if s.status in QUOTA_STATUSES]
    occupied: dict[str, Decimal] = {}
    for session in held:
        occupied = slotlib.add(occupied, slotlib.from_wire(session.requested_slots))
    return web.json_response(
        {
            "accessKey": access_key,
            "resourcePolicy": name,
            "maxConcurrentSessions": int(policy.max_concurrent_sessions or 0) if policy else 0,
            "concurrentSessions": len(held),
            "totalResourceSlots": slotlib.to_wire(slotlib.from_wire(policy.total_resource_slots if policy else None)),
            "defaultForUnspecified": (policy.default_for_unspecified if policy else "") or "UNLIMITED",
            "occupiedSlots": slotlib.to_wire({k: v for k, v in occupied.items() if v}),
            "maxSessionNetworks": int(policy.max_session_networks or 0) if policy else 0,
            "sessionNetworks": sum(1 for s in holding if (s.cluster_size or 1) > 1),
            "maxPendingSessions": int(policy.max_pending_session_count or 0) if policy else 0,
            "pendingSessions": await services.state.count_sessions_of(access_key, [SessionStatus.PENDING]),
            # the manager answering, and the one leading the managers of its database (the dashboard's header)
            "manager": _managers(services.leadership),
            # the operator's word to everyone (the dashboard's header shows both)
            "frozen": request.app[FREEZE].frozen,
            "announcement": request.app[FREEZE].announcement["message"]
            if request.app[FREEZE].announcement["enabled"]
            else None,
        }
    )


def _managers(leadership: Any) -> dict[str, Any] | None:
    if leadership is None:
        return None
    return {"self": leadership.me.id, "leader": leadership.leader}  # (the database: admins, /manager/status)
