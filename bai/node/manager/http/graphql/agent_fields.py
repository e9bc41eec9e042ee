"""Agents: `agent`, `agent_list`, `agent_summary_list` (and the older `agents`). Admins only, except
the summary (what Backend.AI shows users of their scaling groups)."""

from __future__ import annotations

import json
from typing import Any

from graphql import GraphQLArgument, GraphQLField, GraphQLResolveInfo

from bai.node.manager.http.graphql.base import (
    NN,
    B,
    BigInt,
    DateTime,
    F,
    I,
    JSONString,
    L,
    S,
    args_of,
    ctx,
    field_names,
    list_of,
    obj,
    page,
    page_args,
    require_admin,
)
from bai.node.manager.http.graphql.session_fields import ComputeContainer, containers_on_agent
from bai.node.manager.http.represent import agent_items
from bai.node.manager.services.stats_book import agent_live_stat


async def resolve_compute_containers(agent: dict[str, Any], info: GraphQLResolveInfo, **args: Any) -> Any:
    return await containers_on_agent(info, agent["id"], args.get("status"))


Agent = obj(
    "Agent",
    lambda: {
        "id": S,
        "status": S,
        "status_changed": DateTime,
        "region": S,
        "scaling_group": S,
        "schedulable": B,
        "available_slots": JSONString,
        "occupied_slots": JSONString,
        "addr": S,
        "architecture": S,
        "first_contact": DateTime,
        "lost_at": DateTime,
        "live_stat": JSONString,
        "version": S,
        "compute_plugins": JSONString,
        "hardware_metadata": JSONString,
        "auto_terminate_abusing_kernel": B,
        "local_config": JSONString,
        "container_count": I,
        "compute_containers": GraphQLField(
            L(ComputeContainer), args=args_of(status=S), resolve=resolve_compute_containers
        ),
        # legacy fields
        "cpu_cur_pct": F,
        "mem_cur_bytes": BigInt,
        "mem_slots": I,
        "cpu_slots": F,
        "gpu_slots": F,
        "tpu_slots": F,
        "used_mem_slots": I,
        "used_cpu_slots": F,
        "used_gpu_slots": F,
        "used_tpu_slots": F,
        # bai's own
        "hostname": S,
        "backend": S,
        "last_seen": DateTime,
        "warm_kernels": JSONString,  # image -> warm kernels ready (the agent's warm pool)
    },
)
AgentSummary = obj(
    "AgentSummary",
    lambda: {
        "id": S,
        "status": S,
        "scaling_group": S,
        "schedulable": B,
        "available_slots": JSONString,
        "occupied_slots": JSONString,
        "architecture": S,
    },
)
AgentList = list_of("AgentList", Agent)
AgentSummaryList = list_of("AgentSummaryList", AgentSummary)
AGENT_FIELDS = field_names(Agent)
SUMMARY_FIELDS = field_names(AgentSummary)


def _number(value: Any, default: float = 0) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def agent_item(a: dict[str, Any], node: dict[str, Any] | None = None) -> dict[str, Any]:
    """An agent (as `represent.agent_items` shows it) as Backend.AI's `Agent`; `node`: its host's last
    statistics sample (its `live_stat`)."""
    available, occupied = a["availableSlots"], a["occupiedSlots"]
    live = agent_live_stat(node)
    usage = a.get("usage") or {}
    gpus = [k for k in available if k.startswith("cuda.")]
    return {
        "id": a["id"],
        "status": a["status"],
        "status_changed": None,
        "region": None,
        "scaling_group": a["scalingGroup"],
        "schedulable": bool(a["schedulable"]),
        "available_slots": json.dumps(available),
        "occupied_slots": json.dumps(occupied),
        "addr": a["hostname"],
        "architecture": "x86_64",
        "first_contact": a["firstContact"],
        "lost_at": a["lastSeen"] if a["status"] == "LOST" else None,
        "live_stat": json.dumps(live) if live else None,
        "version": a["version"],
        "compute_plugins": json.dumps({"cuda": {}} if gpus else {}),
        "hardware_metadata": None,
        "auto_terminate_abusing_kernel": False,
        "local_config": json.dumps({"backend": a["backend"], "hostname": a["hostname"]}),
        "container_count": None,
        "cpu_cur_pct": float(usage.get("cpuPct") or 0.0),
        "mem_cur_bytes": int(usage.get("memBytes") or 0),
        "mem_slots": int(_number(available.get("mem")) // 2**20),
        "cpu_slots": _number(available.get("cpu")),
        "gpu_slots": _number(available.get("cuda.device")),
        "tpu_slots": 0.0,
        "used_mem_slots": int(_number(occupied.get("mem")) // 2**20),
        "used_cpu_slots": _number(occupied.get("cpu")),
        "used_gpu_slots": _number(occupied.get("cuda.device")),
        "used_tpu_slots": 0.0,
        "hostname": a["hostname"],
        "backend": a["backend"],
        "last_seen": a["lastSeen"],
        "warm_kernels": json.dumps(a.get("warm") or {}),
    }


async def _agents(info: GraphQLResolveInfo, args: dict[str, Any]) -> list[dict[str, Any]]:
    services = ctx(info).services
    book = services.stats
    items = [agent_item(a, book.nodes.get(a["id"])) for a in await agent_items(services.agents, book)]
    if args.get("scaling_group"):
        items = [i for i in items if i["scaling_group"] == args["scaling_group"]]
    if args.get("status"):
        wanted = {s.strip().upper() for s in args["status"].split(",")}
        items = [i for i in items if i["status"] in wanted]
    return items


async def resolve_agent(_root: Any, info: GraphQLResolveInfo, **args: Any) -> dict[str, Any] | None:
    require_admin(info)
    return next((i for i in await _agents(info, {}) if i["id"] == args.get("agent_id")), None)


async def resolve_agents(_root: Any, info: GraphQLResolveInfo, **args: Any) -> list[dict[str, Any]]:
    require_admin(info)
    return await _agents(info, args)


async def resolve_agent_list(_root: Any, info: GraphQLResolveInfo, **args: Any) -> dict[str, Any]:
    require_admin(info)
    return page(await _agents(info, args), args, AGENT_FIELDS, "id")


async def resolve_agent_summary_list(_root: Any, info: GraphQLResolveInfo, **args: Any) -> dict[str, Any]:
    items = [{k: i[k] for k in SUMMARY_FIELDS} for i in await _agents(info, args)]
    return page(items, args, SUMMARY_FIELDS, "id")


QUERIES = {
    "agent": GraphQLField(Agent, args={"agent_id": GraphQLArgument(NN(S))}, resolve=resolve_agent),
    "agents": GraphQLField(L(Agent), args=args_of(scaling_group=S, status=S), resolve=resolve_agents),
    "agent_list": GraphQLField(AgentList, args=page_args(scaling_group=S, status=S), resolve=resolve_agent_list),
    "agent_summary_list": GraphQLField(
        AgentSummaryList,
        args=page_args(scaling_group=S, status=S, domain_name=S),
        resolve=resolve_agent_summary_list,
    ),
}
