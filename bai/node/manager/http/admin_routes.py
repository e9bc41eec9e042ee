"""Admin API: keypairs and resource policies (admins only)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from bai.common import auth
from bai.common import slots as slotlib
from bai.common.problems import Problem, invalid
from bai.common.status import ACTIVE_STATUSES
from bai.node.manager.domain_errors import DomainError
from bai.node.manager.http.context import SETTINGS, STREAMS, read_json, services_of
from bai.node.manager.services.accounts import Accounts
from bai.node.manager.state import POLICY_FIELDS, UnknownPolicy
from bai.node.manager.state.records import Keypair, NewKeypair, Policy, PolicyFields
from bai.node.scheduler.snapshot import PRIORITY_MAX, PRIORITY_MIN


def require_admin(request: web.Request) -> None:
    if not request["is_admin"]:
        raise Problem("insufficient-privilege", "Insufficient privilege.", "only admin keypairs may do this")


def accounts_of(request: web.Request) -> Accounts:
    return services_of(request).accounts


def keypair_json(row: Keypair, *, with_secret: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {
        "accessKey": row.access_key,
        "userId": row.user_id,
        "isAdmin": row.is_admin,
        "isActive": row.is_active,
        "resourcePolicy": row.resource_policy,
        "createdAt": row.created_at,
    }
    if with_secret:
        out["secretKey"] = row.secret_key
    return out


MAX_SESSION_NETWORKS = 10_000  # a bound on the number itself (a daemon has about 31 address pools by default)
MAX_PENDING_SESSION_COUNT = 1_000_000  # a bound on the number itself (each PENDING session is a row and an entry in
# every scheduling round's snapshot: a million of them is already a slow round)
MAX_IDLE_WINDOW = 7 * 86400  # seconds: the longest window of idle detection by utilisation


def parse_pending_limit(value: Any) -> int:
    """`max_pending_session_count` as the REST and GraphQL admin APIs take it: a whole number from 0 (unlimited)
    to MAX_PENDING_SESSION_COUNT."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_PENDING_SESSION_COUNT:
        raise invalid(
            f"max_pending_session_count must be a whole number from 0 to {MAX_PENDING_SESSION_COUNT:,} (sessions a "
            "keypair may have waiting PENDING at once; 0 = unlimited)"
        )
    return value


def policy_fields(body: Any, *, partial: bool) -> PolicyFields:
    """The resource-policy fields of a request body, validated (`parse_policy`), as a write takes them."""
    return PolicyFields(**parse_policy(body, partial=partial))


def parse_policy(body: Any, *, partial: bool) -> dict[str, Any]:
    """Validate resource-policy fields, by name; with `partial`, only the fields given."""
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    unknown = set(body) - set(POLICY_FIELDS) - {"name"}
    if unknown:
        raise invalid(f"unknown policy fields: {', '.join(sorted(unknown))}")
    out: dict[str, Any] = {}
    if "max_concurrent_sessions" in body:
        value = body["max_concurrent_sessions"]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise invalid("max_concurrent_sessions must be a whole number >= 0 (0 = unlimited)")
        out["max_concurrent_sessions"] = value
    if "max_session_networks" in body:
        value = body["max_session_networks"]
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SESSION_NETWORKS:
            raise invalid(
                f"max_session_networks must be a whole number from 0 to {MAX_SESSION_NETWORKS} (sessions of several "
                "kernels a keypair may hold at once, each with a Docker network; 0 = unlimited)"
            )
        out["max_session_networks"] = value
    if "max_pending_session_count" in body:
        out["max_pending_session_count"] = parse_pending_limit(body["max_pending_session_count"])
    if "max_priority" in body:
        value = body["max_priority"]
        if value is None:  # (Backend.AI's null: no bound)
            value = PRIORITY_MAX
        if isinstance(value, bool) or not isinstance(value, int) or not PRIORITY_MIN <= value <= PRIORITY_MAX:
            raise invalid(
                f"max_priority must be a whole number from {PRIORITY_MIN} to {PRIORITY_MAX} (the highest priority "
                "the keypair's sessions may have)"
            )
        out["max_priority"] = value
    if "total_resource_slots" in body:
        raw = body["total_resource_slots"]
        if not isinstance(raw, dict):
            raise invalid("total_resource_slots must be an object of slot amounts")
        try:
            out["total_resource_slots"] = slotlib.to_wire(slotlib.parse_slots(raw))
        except slotlib.SlotError as e:
            raise invalid(str(e)) from None
    if "default_for_unspecified" in body:
        value = str(body["default_for_unspecified"]).upper()
        if value not in ("LIMITED", "UNLIMITED"):
            raise invalid("default_for_unspecified must be LIMITED or UNLIMITED")
        out["default_for_unspecified"] = value
    if "max_vfolder_count" in body:
        value = body["max_vfolder_count"]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise invalid("max_vfolder_count must be a whole number >= 0 (0 = unlimited)")
        out["max_vfolder_count"] = value
    if "max_vfolder_size" in body:
        try:
            out["max_vfolder_size"] = int(slotlib.parse_bytes(body["max_vfolder_size"]))
        except (slotlib.SlotError, TypeError, ValueError, OverflowError):
            raise invalid("max_vfolder_size must be a size such as 10g or a number of bytes (0 = unlimited)") from None
    for key in ("idle_timeout", "max_session_lifetime"):
        if key in body:
            value = body[key]
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
                raise invalid(f"{key} must be a number of seconds >= 0 (0 = none)")
            out[key] = float(value)
    for key in ("idle_cpu_pct", "idle_gpu_pct"):
        if key in body:
            value = body[key]
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 100
            ):
                raise invalid(f"{key} must be a percentage above 0 and at most 100, or null (not checked)")
            out[key] = None if value is None else float(value)
    if "idle_window" in body:
        value = body["idle_window"]
        if isinstance(value, bool) or not isinstance(value, int | float) or not 1 <= value <= MAX_IDLE_WINDOW:
            raise invalid(f"idle_window must be a number of seconds from 1 to {MAX_IDLE_WINDOW:g}")
        out["idle_window"] = float(value)
    if not partial and not out and "name" not in body:
        raise invalid("nothing to set")
    return out


def policy_json(row: Policy) -> dict[str, Any]:
    return {"name": row.name, **{k: getattr(row, k) for k in POLICY_FIELDS}}


async def list_keypairs(request: web.Request) -> web.Response:
    require_admin(request)
    rows = await accounts_of(request).keypairs(active_only=False)
    return web.json_response({"items": [keypair_json(r) for r in rows.values()]})


async def create_keypair(request: web.Request) -> web.Response:
    require_admin(request)
    body = await read_json(request)
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    user_id = body.get("user_id") or "user"
    if not isinstance(user_id, str) or not user_id.strip() or "\0" in user_id:
        raise invalid("user_id must be a non-empty string")
    policy = body.get("resource_policy") or "default"
    if not isinstance(policy, str):
        raise invalid("resource_policy must be the name of a resource policy")
    if not isinstance(body.get("is_admin", False), bool):
        raise invalid("is_admin must be true or false")
    fresh = auth.Keypair.generate()
    row = NewKeypair(fresh.access_key, fresh.secret_key, user_id.strip(), body.get("is_admin", False), policy)
    try:
        await accounts_of(request).create_keypair(row)
    except UnknownPolicy as e:
        raise invalid(str(e)) from None
    created = accounts_of(request).active_keypair(fresh.access_key)
    assert created is not None
    return web.json_response(keypair_json(created, with_secret=True), status=201)


async def update_keypair(request: web.Request) -> web.Response:
    require_admin(request)
    access_key = request.match_info["access_key"]
    body = await read_json(request)
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    unknown = set(body) - {"resource_policy", "is_active", "terminate_sessions"}
    if unknown:
        raise invalid(f"unknown keypair fields: {', '.join(sorted(unknown))}")
    resource_policy: str | None = None
    is_active: bool | None = None
    if "resource_policy" in body:
        if not isinstance(body["resource_policy"], str) or not body["resource_policy"]:
            raise invalid("resource_policy must be the name of a resource policy")
        resource_policy = body["resource_policy"]
    if "is_active" in body:
        if not isinstance(body["is_active"], bool):
            raise invalid("is_active must be true or false")
        if access_key == request["access_key"] and not body["is_active"]:
            raise invalid("you cannot deactivate the keypair you are using")
        is_active = body["is_active"]
    terminate = body.get("terminate_sessions", False)
    if not isinstance(terminate, bool):
        raise invalid("terminate_sessions must be true or false")
    if terminate and body.get("is_active") is not False:
        raise invalid("terminate_sessions goes with is_active = false (deactivate --terminate)")
    if resource_policy is None and is_active is None:
        raise invalid("give resource_policy and/or is_active")
    try:
        found = await accounts_of(request).update_keypair(
            access_key, resource_policy=resource_policy, is_active=is_active
        )
    except UnknownPolicy as e:
        raise invalid(str(e)) from None
    updated = await accounts_of(request).keypair(access_key) if found else None
    if updated is None:
        raise Problem("object-not-found", "No such keypair.", f"keypair {access_key} does not exist")
    out = keypair_json(updated)
    if is_active is False:
        # a deactivated keypair signs nothing more: its open streams end now, not at their next request;
        # its sessions keep running (as in Backend.AI) unless the admin asks to terminate them
        out["closedStreams"] = request.app[STREAMS].close_all(access_key)
        if terminate:
            out["terminatedSessions"] = await terminate_sessions_of(request, access_key)
    return web.json_response(out)


async def terminate_sessions_of(request: web.Request, access_key: str) -> list[str]:
    """End every active session of a keypair (pending ones are cancelled); their names."""
    services = services_of(request)
    ended = []
    for row in await services.state.list_sessions(access_key, ACTIVE_STATUSES):
        try:
            await services.lifecycle.destroy(row, forced=True, wait=False)
        except (Problem, DomainError):  # ended meanwhile
            continue
        ended.append(row.name)
    return ended


async def list_policies(request: web.Request) -> web.Response:
    require_admin(request)
    rows = await accounts_of(request).policies()
    return web.json_response({"items": [policy_json(r) for r in rows.values()]})


async def create_policy(request: web.Request) -> web.Response:
    require_admin(request)
    body = await read_json(request)
    name = body.get("name") if isinstance(body, dict) else None
    if not isinstance(name, str) or not name.strip():
        raise invalid("a policy needs a name")
    fields = policy_fields(body, partial=False)
    if not await accounts_of(request).save_policy(name, fields, create=True):
        raise Problem("generic-bad-request", "Bad request.", f"policy {name!r} already exists")
    return web.json_response(policy_json(await _saved_policy(request, name)), status=201)


async def update_policy(request: web.Request) -> web.Response:
    require_admin(request)
    name = request.match_info["name"]
    body = await read_json(request)
    fields = policy_fields(body, partial=True)
    if not await accounts_of(request).save_policy(name, fields, create=False):
        raise Problem("object-not-found", "No such resource policy.", f"policy {name!r} does not exist")
    return web.json_response(policy_json(await _saved_policy(request, name)))


async def _saved_policy(request: web.Request, name: str) -> Policy:
    policy = await accounts_of(request).policy(name)
    if policy is None:  # (removed meanwhile)
        raise Problem("object-not-found", "No such resource policy.", f"policy {name!r} does not exist")
    return policy


async def cluster_info(request: web.Request) -> web.Response:
    require_admin(request)
    info = request.app[SETTINGS].get("cluster")
    if not info:
        raise Problem(
            "generic-bad-request",
            "Not a cluster.",
            "this node runs with --role all (manager and agent in one process): there is nothing to join",
        )
    return web.json_response(info)


def add_admin_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/bai/admin/cluster", cluster_info)
    r.add_get("/bai/admin/keypairs", list_keypairs)
    r.add_post("/bai/admin/keypairs", create_keypair)
    r.add_patch("/bai/admin/keypairs/{access_key}", update_keypair)
    r.add_get("/bai/admin/policies", list_policies)
    r.add_post("/bai/admin/policies", create_policy)
    r.add_patch("/bai/admin/policies/{name}", update_policy)
