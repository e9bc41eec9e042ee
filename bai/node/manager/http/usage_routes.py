"""Usage: Backend.AI's resource usage reports, and bai's own (`services/usage.py` computes them when asked).

GET  /resource/usage/month   {group_ids, month YYYYMM}                 per project, the kernels that ran (admins)
GET  /resource/usage/period  {project_id|group_id, start_date, end_date YYYYMMDD, at most 100 days} (admins)
GET  /resource/stats/user/month                                         the caller's 15-minute buckets, 30 days
GET  /resource/stats/admin/month                                        everyone's (admins; a domain admin its domain's)
POST /resource/recalculate-usage                                        nothing to do: 200 (superadmins)
GET  /bai/usage?period=YYYYMM|START..END&by=keypair|user|project&all=1  bai's rows (own; `all`: admins, everyone's)

Backend.AI's clients send the parameters as a JSON body of the GET (23.x) or in the query (24.x on): both are read.
Each project of the month / period answers has both shapes Backend.AI has had: the `g_*` sums with `c_infos` (one
per kernel) and the `project_*` / `total_usage` / `sessions` → `kernels` tree of later managers.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from aiohttp import web

from bai.common.problems import invalid
from bai.node.manager.http.context import read_json, services_of
from bai.node.manager.rules import usage as rules
from bai.node.manager.rules.access import Actor
from bai.node.manager.rules.usage import Bucket, KernelUsage
from bai.node.manager.services.usage import BY, ProjectKernels, Usage, UsageRow

RECALCULATED = "bai computes usage when it is asked, from the sessions it keeps: there is nothing to recalculate"


def _usage(request: web.Request) -> tuple[Usage, Actor]:
    services = services_of(request)
    usage = services.usage
    if usage is None:  # (built by build_manager; a bare Services in a test gets one here)
        usage = services.usage = Usage(
            services.state, services.teams, services.stats, services.clock, services.agents.gpu_devices
        )
    return usage, services.teams.actor(request["access_key"])


async def _params(request: web.Request) -> dict[str, Any]:
    """The query's parameters, and the JSON body's (a GET with a body, as the 23.x SDK sends): the body wins."""
    out: dict[str, Any] = {k: request.query.getall(k) if k == "group_ids" else v for k, v in request.query.items()}
    body = await read_json(request) if request.body_exists else {}
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    out.update({k: v for k, v in body.items() if v is not None})
    return out


def _group_ids(value: Any) -> list[str]:
    """`group_ids`: a list, a comma-separated string (the 24.x SDK's query), repeated keys, or none."""
    if value is None or value == "":
        return []
    items = value if isinstance(value, list) else [value]
    out: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise invalid(f"group_ids must be project ids (UUIDs), not {item!r}")
        out.extend(rules.check_uuid(part.strip(), "group_ids") for part in item.split(",") if part.strip())
    return out


# -- Backend.AI's shapes ----------------------------------------------------------------------------------------


def _stamp(when: datetime | None) -> str:
    return str(when) if when is not None else "None"  # (Backend.AI's str() of a timestamp, "None" when unset)


def _used_time(u: KernelUsage) -> str | None:
    return str(timedelta(seconds=round(u.run_seconds, 6))) if u.facts.terminated_at is not None else None


def _resource_usage(u: KernelUsage) -> dict[str, Any]:
    """Backend.AI's `ResourceUsage` of one kernel."""
    return {
        "nfs": list(u.facts.mounts),
        "cpu_allocated": u.cpu_allocated,
        "cpu_used": round(u.cpu_used_ms, 3),  # (milliseconds, as Backend.AI's cpu_used)
        "mem_allocated": u.mem_allocated,
        "mem_used": u.mem_used,
        "mem_max_used": u.mem_max_used,
        "shared_memory": 0,
        "disk_allocated": 0,
        "disk_used": 0,
        "io_read": u.io_read,
        "io_write": u.io_write,
        "device_type": list(u.device_types),
        "smp": 0.0,
        "gpu_mem_allocated": float(u.gpu_mem_allocated),
        "gpu_allocated": u.gpu_allocated,
    }


_SUMMED = (
    "cpu_allocated",
    "cpu_used",
    "mem_allocated",
    "mem_used",
    "mem_max_used",
    "shared_memory",
    "disk_allocated",
    "disk_used",
    "io_read",
    "io_write",
    "smp",
    "gpu_mem_allocated",
    "gpu_allocated",
)


def _summed(parts: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {k: sum(p[k] for p in parts) for k in _SUMMED}
    out["cpu_used"] = round(out["cpu_used"], 3)
    out["mem_max_used"] = max((p["mem_max_used"] for p in parts), default=0)
    out["nfs"] = sorted({n for p in parts for n in p["nfs"]})
    out["device_type"] = sorted({d for p in parts for d in p["device_type"]})
    return {k: out[k] for k in _RESOURCE_KEYS}


_RESOURCE_KEYS = ("nfs", *_SUMMED[:10], "device_type", *_SUMMED[10:])  # (as `_resource_usage` orders them)


class _People:
    """Users and projects by what a kernel names (for its rows)."""

    def __init__(self, usage: Usage) -> None:
        self.usage = usage

    def user(self, access_key: str) -> tuple[str | None, str | None, str | None]:
        user = self.usage.user_of(access_key)
        return (user.uuid, user.email, user.full_name) if user is not None else (None, None, None)


def _c_info(u: KernelUsage, group: ProjectKernels, people: _People) -> dict[str, Any]:
    """Backend.AI's `c_info`: one kernel of a project's month / period."""
    f = u.facts
    _uid, email, full_name = people.user(f.access_key)
    total = _resource_usage(u)
    return {
        "id": f.kernel_id,
        "session_id": f.session_id,
        "container_id": f.container_id,
        "domain_name": f.domain_name,
        "group_id": group.project_id,
        "group_name": _project_name(group),
        "name": f.session_name,
        "access_key": f.access_key,
        "email": email,
        "full_name": full_name,
        "agent": f.agent_id,
        **{k: total[k] for k in _SUMMED},
        "used_time": _used_time(u),
        "used_days": u.used_days,
        "used_seconds_in_period": round(u.seconds, 3),
        "device_type": total["device_type"],
        "nfs": total["nfs"],
        "image_id": f.image,
        "image_name": f.image,
        "created_at": _stamp(f.created_at),
        "started_at": _stamp(f.started_at),
        "terminated_at": _stamp(f.terminated_at),
        "status": f.status,
        "status_info": f.status_info,
        "status_changed": f.status_changed,
        "status_history": {},
        "cluster_mode": "single-node",
        "cluster_role": f.cluster_role,
    }


def _project_name(group: ProjectKernels) -> str:
    return group.project.name if group.project is not None else ""


def _kernel_node(u: KernelUsage, group: ProjectKernels, people: _People) -> dict[str, Any]:
    f = u.facts
    uid, email, full_name = people.user(f.access_key)
    return {
        "created_at": _stamp(f.created_at),
        "used_time": _used_time(u),
        "used_days": u.used_days,
        "user_id": uid,
        "user_email": email,
        "access_key": f.access_key,
        "project_id": group.project_id,
        "project_name": _project_name(group),
        "kernel_id": f.kernel_id,
        "container_ids": [f.container_id] if f.container_id else [],
        "session_id": f.session_id,
        "session_name": f.session_name,
        "domain_name": f.domain_name,
        "last_stat": None,
        "extra_info": {},
        "full_name": full_name,
        "images": [f.image],
        "agents": [f.agent_id] if f.agent_id else [],
        "agent": f.agent_id,
        "status": f.status,
        "status_info": f.status_info,
        "status_history": None,
        "cluster_mode": "single-node",
        "scheduled_at": None,
        "terminated_at": _stamp(f.terminated_at) if f.terminated_at is not None else None,
        "group_unit": "kernel",
        "total_usage": _resource_usage(u),
    }


def _tree_node(nodes: list[dict[str, Any]], unit: str, **fields: Any) -> dict[str, Any]:
    """A session's or a project's node of the later managers' tree: its children's usage summed."""
    return {
        **fields,
        "images": sorted({i for n in nodes for i in n["images"]}),
        "agents": sorted({a for n in nodes for a in n["agents"]}),
        "container_ids": sorted({c for n in nodes for c in n["container_ids"]}),
        "group_unit": unit,
        "total_usage": _summed([n["total_usage"] for n in nodes]),
    }


def group_json(group: ProjectKernels, people: _People) -> dict[str, Any]:
    """One project of Backend.AI's usage per month / period, in both of Backend.AI's shapes."""
    c_infos = [_c_info(u, group, people) for u in group.kernels]
    total = _summed([_resource_usage(u) for u in group.kernels])
    sessions: dict[str, list[KernelUsage]] = {}
    for u in group.kernels:
        sessions.setdefault(u.facts.session_id, []).append(u)
    session_nodes: dict[str, dict[str, Any]] = {}
    for sid, kernels in sessions.items():
        kernel_nodes = {u.facts.kernel_id: _kernel_node(u, group, people) for u in kernels}
        first = next(iter(kernel_nodes.values()))
        keep = ("created_at", "used_time", "used_days", "user_id", "user_email", "access_key", "full_name")
        session_nodes[sid] = _tree_node(
            list(kernel_nodes.values()),
            "session",
            **{k: first[k] for k in keep},
            project_id=group.project_id,
            project_name=_project_name(group),
            session_id=sid,
            session_name=kernels[0].facts.session_name,
            domain_name=group.domain_name,
            status=first["status"],
            status_info=first["status_info"],
            terminated_at=first["terminated_at"],
            kernels=kernel_nodes,
        )
    tree = _tree_node(
        list(session_nodes.values()),
        "project",
        created_at=group.project.created_at if group.project is not None else None,
        project_id=group.project_id,
        project_name=_project_name(group),
        domain_name=group.domain_name,
        sessions=session_nodes,
    )
    return {
        "domain_name": group.domain_name,
        "g_id": group.project_id,
        "g_name": _project_name(group),
        **{f"g_{k}": total[k] for k in _SUMMED},
        "g_device_type": total["device_type"],
        "c_infos": c_infos,
        **tree,
    }


def bucket_json(b: Bucket) -> dict[str, Any]:
    def value(v: Any, unit: str) -> dict[str, Any]:
        return {"value": v, "unit_hint": unit}

    return {
        "date": b.start,
        "num_sessions": value(b.num_sessions, "count"),
        "cpu_allocated": value(b.cpu_allocated, "count"),
        "mem_allocated": value(b.mem_allocated, "bytes"),
        "gpu_allocated": value(b.gpu_allocated, "count"),
        "io_read_bytes": value(b.io_read_bytes, "bytes"),
        "io_write_bytes": value(b.io_write_bytes, "bytes"),
        "disk_used": value(b.disk_used, "bytes"),
    }


def row_json(r: UsageRow) -> dict[str, Any]:
    return {
        "key": r.key,
        "name": r.name,
        "domain": r.domain,
        "sessions": r.sessions,
        "kernels": r.kernels,
        "hours": r.hours,
        "cpuCoreHours": r.cpu_core_hours,
        "memGiBHours": r.mem_gib_hours,
        "gpuHours": r.gpu_hours,
        "cpuUsedSeconds": r.cpu_used_seconds,
        "memPeakBytes": r.mem_peak_bytes,
        "ioReadBytes": r.io_read_bytes,
        "ioWriteBytes": r.io_write_bytes,
    }


# -- the handlers -------------------------------------------------------------------------------------------------


async def usage_per_month(request: web.Request) -> web.Response:
    usage, actor = _usage(request)
    params = await _params(request)
    usage.check_admin(actor, "usage per month")
    if "month" not in params:
        raise invalid("month is required (YYYYMM, e.g. 202612)")
    period = rules.month_period(params["month"])
    groups = await usage.per_project(actor, period, _group_ids(params.get("group_ids")))
    people = _People(usage)
    return web.json_response([group_json(g, people) for g in groups])


async def usage_per_period(request: web.Request) -> web.Response:
    usage, actor = _usage(request)
    params = await _params(request)
    usage.check_admin(actor, "usage per period")
    for key in ("start_date", "end_date"):
        if key not in params:
            raise invalid(f"{key} is required (YYYYMMDD)")
    period = rules.days_period(params["start_date"], params["end_date"])
    project = params.get("project_id", params.get("group_id"))
    ids = [rules.check_uuid(project, "project_id")] if project not in (None, "") else []
    groups = await usage.per_project(actor, period, ids)
    people = _People(usage)
    return web.json_response([group_json(g, people) for g in groups])


async def user_month_stats(request: web.Request) -> web.Response:
    usage, actor = _usage(request)
    return web.json_response([bucket_json(b) for b in await usage.buckets(actor, everyone=False)])


async def admin_month_stats(request: web.Request) -> web.Response:
    usage, actor = _usage(request)
    usage.check_admin(actor, "everyone's monthly stats")
    return web.json_response([bucket_json(b) for b in await usage.buckets(actor, everyone=True)])


async def recalculate_usage(request: web.Request) -> web.Response:
    _, actor = _usage(request)
    if not actor.is_superadmin:
        raise rules.forbidden("only superadmins recalculate usage")
    return web.json_response({"recalculated": False, "msg": RECALCULATED})


def _flag(value: str | None, what: str) -> bool:
    if value in (None, "", "0", "false"):
        return False
    if value in ("1", "true"):
        return True
    raise invalid(f"{what} is true or false, not {value!r}")


async def bai_usage(request: web.Request) -> web.Response:
    """`GET /bai/usage?period=YYYYMM|START..END&by=keypair|user|project&all=true`: bai's rows (the current month by
    default; the caller's own usage, `all`: everyone's an admin manages)."""
    usage, actor = _usage(request)
    q = request.query
    by = q.get("by", "keypair")
    if by not in BY:
        raise invalid(f"by is one of {', '.join(BY)}, not {by!r}")
    text = q.get("period") or f"{usage.clock.now():%Y%m}"
    period = rules.period_of(text)
    everyone = _flag(q.get("all"), "all")
    rows = await usage.rows(actor, period, by, everyone)
    return web.json_response(
        {
            "period": {"start": period.start.isoformat(), "end": period.end.isoformat(), "label": period.label},
            "by": by,
            "scope": "all" if everyone else "own",
            "items": [row_json(r) for r in rows],
        }
    )


def add_usage_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/resource/usage/month", usage_per_month)
    r.add_get("/resource/usage/period", usage_per_period)
    r.add_get("/resource/stats/user/month", user_month_stats)
    r.add_get("/resource/stats/admin/month", admin_month_stats)
    r.add_post("/resource/recalculate-usage", recalculate_usage)
    r.add_get("/bai/usage", bai_usage)
