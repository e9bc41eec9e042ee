"""Backend.AI's scheduling history over REST (its 26.x `backend.ai scheduling-history session list`; superadmins):
`POST /scheduling-history/sessions/search` with `{filter, order, limit, offset}` answers
`{items: [...], pagination: {total, offset, limit}}`.

bai keeps, per session, one row for each outcome of the scheduling rounds that considered it, merged while the
outcome stays the same (what `bai session explain` shows). A row reads as Backend.AI's record of one phase:

| outcome   | phase    | from_status | to_status | result  | error_code                                 |
|-----------|----------|-------------|-----------|---------|--------------------------------------------|
| scheduled | schedule | PENDING     | SCHEDULED | SUCCESS | -                                          |
| pending   | schedule | PENDING     | PENDING   | FAILURE | no-available-instances, predicate-checks-failed |
| cancelled | schedule | PENDING     | CANCELLED | FAILURE | dependency-failed                          |
| preempted | preempt  | RUNNING     | PREEMPTED | SUCCESS | -                                          |

`message` is the reason (for a placement, the agents), `sub_steps` the checks that failed, `attempts` the rounds
merged into the row, `created_at` / `updated_at` its first and last round. The row's `id` is a UUID made from its
number. Deployments and routes (model serving) are not part of bai: their searches stay 404.

Parsing is pure (`parse_search`): every field is checked as Backend.AI's request model checks it (a clear 400
otherwise), so that a client gets the same refusals from either server.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from bai.common.problems import Problem, invalid
from bai.node.manager.http.context import read_json, services_of
from bai.node.manager.state.records import HistorySearch, SchedulingAttempt

MAX_LIMIT = 1000  # (Backend.AI's bounds for a page)
DEFAULT_LIMIT = 50

# outcome -> (phase, from_status, to_status, result)
OUTCOMES: dict[str, tuple[str, str, str, str]] = {
    "scheduled": ("schedule", "PENDING", "SCHEDULED", "SUCCESS"),
    "pending": ("schedule", "PENDING", "PENDING", "FAILURE"),
    "cancelled": ("schedule", "PENDING", "CANCELLED", "FAILURE"),
    "preempted": ("preempt", "RUNNING", "PREEMPTED", "SUCCESS"),
}
RESULTS = ("SUCCESS", "FAILURE", "STALE")
_STRING_OPS = ("equals", "contains", "starts_with", "ends_with")
STRING_FILTER_KEYS = tuple(f"{p}{op}" for p in ("", "not_", "i_", "i_not_") for op in _STRING_OPS)
_FILTER_KEYS = ("session_id", "phase", "from_status", "to_status", "result", "error_code", "message")
_ORDER_FIELDS = {"created_at": "first_at", "updated_at": "last_at"}

Test = Callable[[str], bool]


@dataclass(frozen=True)
class Search:
    """A parsed search: the rows the store selects (`rows`), the string tests on what it reads (`keep`), the page."""

    rows: HistorySearch
    tests: tuple[tuple[str, Test], ...]  # (the field of an item: error_code | message, its test)
    offset: int
    limit: int

    def keep(self, attempt: SchedulingAttempt) -> bool:
        if not self.tests:
            return True
        error_code, message = _texts(attempt)
        shown = {"error_code": error_code or "", "message": message or ""}
        return all(test(shown[name]) for name, test in self.tests)


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise invalid(f"{what} must be an object")
    return value


def _known(body: dict[str, Any], keys: tuple[str, ...], what: str) -> None:
    unknown = sorted(str(k)[:40] for k in body if k not in keys)
    if unknown:
        raise invalid(f"{what} takes {', '.join(keys)} (not {unknown[0]!r})")


def _whole(value: Any, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise invalid(f"{what} must be a whole number from {low} to {high}")
    return value


def _strings(value: Any, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise invalid(f"{what} must be a list of strings")
    return value


def _uuid(value: Any, what: str) -> str:
    try:
        if not isinstance(value, str):
            raise ValueError
        return str(uuid.UUID(value))
    except ValueError:
        raise invalid(f"{what} must be a UUID") from None


def string_test(body: Any, what: str) -> Test | None:
    """A StringFilter's test (every operation given must hold), or None when it gives none."""
    ops = _object(body, what)
    _known(ops, STRING_FILTER_KEYS, what)
    tests: list[Test] = []
    for key, value in ops.items():
        if value is None:
            continue
        if not isinstance(value, str):
            raise invalid(f"{what}.{key} must be a string")
        fold = key.startswith("i_")
        negated = key.removeprefix("i_").startswith("not_")
        op = key.removeprefix("i_").removeprefix("not_")
        wanted = value.casefold() if fold else value
        tests.append(_string_op(op, wanted, fold, negated))
    if not tests:
        return None
    return lambda text: all(test(text) for test in tests)


def _string_op(op: str, wanted: str, fold: bool, negated: bool) -> Test:
    def test(text: str) -> bool:
        seen = text.casefold() if fold else text
        if op == "equals":
            hit = seen == wanted
        elif op == "contains":
            hit = wanted in seen
        elif op == "starts_with":
            hit = seen.startswith(wanted)
        else:
            hit = seen.endswith(wanted)
        return hit != negated

    return test


def _session_ids(body: Any) -> tuple[list[str] | None, list[str]]:
    """A UUIDFilter (equals, in, not_equals, not_in) as (the sessions wanted or None, those not wanted)."""
    ops = _object(body, "filter.session_id")
    _known(ops, ("equals", "in", "in_", "not_equals", "not_in"), "filter.session_id")
    wanted: list[str] | None = None
    unwanted: list[str] = []
    for key, value in ops.items():
        if value is None:
            continue
        if key in ("equals", "not_equals"):
            ids = [_uuid(value, f"filter.session_id.{key}")]
        else:
            if not isinstance(value, list):
                raise invalid(f"filter.session_id.{key} must be a list of UUIDs")
            ids = [_uuid(v, f"filter.session_id.{key}") for v in value]
        if key.startswith("not_"):
            unwanted += ids
        else:
            wanted = ids if wanted is None else [i for i in wanted if i in ids]
    return wanted, unwanted


def parse_search(body: Any) -> Search:
    """A search request's body, checked field by field (a 400 names the first wrong one)."""
    body = _object({} if body is None else body, "the body")
    _known(body, ("filter", "order", "limit", "offset"), "a scheduling-history search")
    limit = _whole(body.get("limit", DEFAULT_LIMIT), "limit", 1, MAX_LIMIT)
    offset = _whole(body.get("offset", 0), "offset", 0, 2**62)
    outcomes = set(OUTCOMES)
    session_ids: list[str] | None = None
    not_session_ids: list[str] = []
    tests: list[tuple[str, Test]] = []
    found = body.get("filter")
    if found is not None:
        conditions = _object(found, "filter")
        _known(conditions, _FILTER_KEYS, "filter")
        if conditions.get("session_id") is not None:
            session_ids, not_session_ids = _session_ids(conditions["session_id"])
        if conditions.get("phase") is not None and (phase := string_test(conditions["phase"], "filter.phase")):
            outcomes = {o for o in outcomes if phase(OUTCOMES[o][0])}
        for key, column in (("from_status", 1), ("to_status", 2)):
            if conditions.get(key) is not None:
                named = {s.upper() for s in _strings(conditions[key], f"filter.{key}")}
                outcomes = {o for o in outcomes if OUTCOMES[o][column] in named}
        if conditions.get("result") is not None:
            results = _strings(conditions["result"], "filter.result")
            for result in results:
                if result not in RESULTS:
                    raise invalid(f"filter.result: {result[:40]!r} is not one of {', '.join(RESULTS)}")
            outcomes = {o for o in outcomes if OUTCOMES[o][3] in results}
        for key in ("error_code", "message"):
            if conditions.get(key) is not None and (test := string_test(conditions[key], f"filter.{key}")):
                tests.append((key, test))
    by, descending = "first_at", True
    order = body.get("order")
    if order is not None:
        if not isinstance(order, list):
            raise invalid("order must be a list of {field, direction}")
        for n, spec in enumerate(order[:1]):  # (one key orders the rows; the rows' numbers break its ties)
            spec = _object(spec, f"order[{n}]")
            _known(spec, ("field", "direction"), f"order[{n}]")
            field = spec.get("field")
            if field not in _ORDER_FIELDS:
                raise invalid(f"order[{n}].field must be one of {', '.join(_ORDER_FIELDS)}")
            direction = spec.get("direction", "desc")
            if not isinstance(direction, str) or direction.lower() not in ("asc", "desc"):
                raise invalid(f"order[{n}].direction must be asc or desc")
            by, descending = _ORDER_FIELDS[field], direction.lower() == "desc"
    rows = HistorySearch(sorted(outcomes), session_ids, not_session_ids, by, descending)
    return Search(rows, tuple(tests), offset, limit)


def _outcome(attempt: SchedulingAttempt) -> tuple[str, str, str, str]:
    return OUTCOMES.get(attempt.outcome, ("schedule", "PENDING", "PENDING", "FAILURE"))


def _texts(attempt: SchedulingAttempt) -> tuple[str | None, str | None]:
    """A row's error code (a failure's status info) and message (the reason; for a placement, the agents)."""
    failed = _outcome(attempt)[3] == "FAILURE"
    message = attempt.msg or (f"placed on {attempt.agents}" if attempt.agents else None)
    return (attempt.status_info or None) if failed else None, message


def item_fields(attempt: SchedulingAttempt) -> dict[str, Any]:
    """A history row as Backend.AI's SessionHistoryDTO."""
    phase, before, after, result = _outcome(attempt)
    error_code, message = _texts(attempt)
    return {
        "id": str(uuid.UUID(int=attempt.number)),
        "session_id": attempt.session_id,
        "phase": phase,
        "from_status": before,
        "to_status": after,
        "result": result,
        "error_code": error_code,
        "message": message,
        "sub_steps": [
            {
                "step": str(check.get("name", "")),
                "result": "FAILURE",
                "error_code": None,
                "message": str(check.get("msg", "")),
                "started_at": attempt.first_at,
                "ended_at": attempt.last_at,
            }
            for check in attempt.predicates
            if isinstance(check, dict)
        ],
        "attempts": attempt.rounds,
        "created_at": attempt.first_at,
        "updated_at": attempt.last_at,
    }


async def search_session_history(request: web.Request) -> web.Response:
    services = services_of(request)
    if not services.teams.actor(request["access_key"]).is_superadmin:
        raise Problem("insufficient-privilege", "Insufficient privilege.", "only superadmins read scheduling history")
    search = parse_search(await read_json(request) if request.body_exists else {})
    page, total = await services.state.search_scheduling_history(search.rows, search.keep, search.offset, search.limit)
    return web.json_response(
        {
            "items": [item_fields(attempt) for attempt in page],
            "pagination": {"total": total, "offset": search.offset, "limit": search.limit},
        }
    )


def add_history_routes(app: web.Application) -> None:
    app.router.add_post("/scheduling-history/sessions/search", search_session_history)
