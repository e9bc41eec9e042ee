"""How sessions and agents look on the API: one representation for every endpoint that shows them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from bai.common import slots as slotlib
from bai.common.status import OCCUPYING_STATUSES, SessionStatus
from bai.node.manager.agents import Agents
from bai.node.manager.sessions import Sessions


def _age_ms(created: str) -> int:
    return int((datetime.now(UTC) - datetime.fromisoformat(created)).total_seconds() * 1000)


async def session_json(
    sessions: Sessions, row: dict[str, Any], *, detail: bool = False, kernels: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    if kernels is None:
        kernels = await sessions.kernels_of(row["id"])
    main = next((k for k in kernels if k["cluster_role"] == "main"), kernels[0] if kernels else None)
    occupying = row["requested_slots"] if SessionStatus(row["status"]) in OCCUPYING_STATUSES else {}
    out: dict[str, Any] = {
        "id": row["id"],
        "sessionId": row["id"],
        "name": row["name"],
        "sessionName": row["name"],
        "accessKey": row["access_key"],
        "image": row["image"],
        "lang": row["image"],
        "type": row["type"].upper(),
        "status": row["status"],
        "statusInfo": row["status_info"],
        "statusData": {**row["status_data"], "hooks": row["config"]["hook_notes"]}
        if row["config"].get("hook_notes")
        else row["status_data"],
        "startsAt": row["config"].get("starts_at"),
        "dependsOn": row["config"].get("depends_on", []),
        "statusChanged": row["status_changed"],
        "result": row["result"],
        "creationTime": row["created_at"],
        "terminationTime": row["terminated_at"],
        "age": _age_ms(row["created_at"]),
        "scalingGroup": row["scaling_group"],
        "requestedSlots": row["requested_slots"],
        "occupyingSlots": occupying,
        "occupiedSlots": occupying,
        "environ": row["environ"],
        "tag": row["tag"],
        "mounts": [
            {"name": m["name"], "id": m["id"], "target": m["target"], "readOnly": m["read_only"]}
            for m in row["config"].get("mounts") or []
        ],
        "network": row["config"].get("network"),  # null: the agent's own (none unless configured)
        "agent": main["agent_id"] if main else None,
        "containerId": main["container_id"] if main else None,
        "exitCode": main["exit_code"] if main else None,
        "kernels": [
            {
                "id": k["id"],
                "clusterRole": k["cluster_role"],
                "clusterIdx": k["cluster_idx"],
                "agent": k["agent_id"],
                "containerId": k["container_id"],
                "status": k["status"],
                "exitCode": k["exit_code"],
                "devices": [{"uuid": u, "share": str(a)} for u, a in k.get("devices") or []],
            }
            for k in kernels
        ],
    }
    if detail:
        out["transitions"] = await sessions.transitions_of(row["id"])
        if row["status"] == SessionStatus.PENDING:
            # the scheduler's own order (per policy) once it has looked; until then, arrival order
            position = (row["status_data"].get("scheduler") or {}).get("position")
            if position is None:
                pending = await sessions.list(None, [SessionStatus.PENDING])
                position = next((i for i, r in enumerate(pending, 1) if r["id"] == row["id"]), None)
            out["queuePosition"] = position
    return out


async def agent_items(agents: Agents) -> list[dict[str, Any]]:
    """Every agent the manager knows, with its capacity and what its kernels occupy (two reads)."""
    occupied = await agents.occupied_by_agent()
    connected = agents.connected()
    gpus = agents.gpu_devices()
    items = []
    for a in await agents.rows():
        items.append(
            {
                "id": a["id"],
                "hostname": a["hostname"],
                "backend": a["backend"],
                "version": a["version"],
                "scalingGroup": a["scaling_group"],
                "status": a["status"] if a["id"] in connected or a["status"] != "ALIVE" else "LOST",
                "availableSlots": a["slots"],
                "occupiedSlots": slotlib.to_wire(occupied.get(a["id"], {})),
                "firstContact": a["first_contact"],
                "lastSeen": a["last_seen"],
                "schedulable": agents.record(a["id"]).schedulable,
                "gpus": _gpus(gpus.get(a["id"])),
            }
        )
    return items


def _gpus(info: dict[str, Any] | None) -> list[dict[str, Any]]:
    """An agent's GPUs: what they are, and (from its last heartbeat) how busy and how much is held."""
    if not info:
        return []
    live = {g["uuid"]: g for g in info.get("live") or []}
    out = []
    for d in info["devices"]:
        now = live.get(d["uuid"], {})
        out.append(
            {
                **d,
                "utilization": now.get("utilization"),
                "memory_used": now.get("memory_used"),
                "allocated": now.get("allocated", "0"),
            }
        )
    return out
