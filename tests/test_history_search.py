"""Backend.AI's scheduling-history search as bai reads it (bai/node/manager/http/history_routes.py), pure: what a
body selects, every StringFilter operation, how a history row reads as Backend.AI's record, and that no body,
however malformed, gets anything but a parsed search or a 400."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bai.common.problems import Problem
from bai.node.manager.http.history_routes import (
    OUTCOMES,
    STRING_FILTER_KEYS,
    item_fields,
    parse_search,
    string_test,
)
from bai.node.manager.state.records import SchedulingAttempt

SID = str(uuid.UUID(int=7))
OTHER = str(uuid.UUID(int=8))


def attempt(outcome: str, info: str = "", msg: str = "", agents: str = "") -> SchedulingAttempt:
    return SchedulingAttempt(SID, outcome, info, msg, agents, [], "2026-12-07T10:00:00Z", "2026-12-07T10:05:00Z", 3, 42)


def test_an_empty_search_reads_every_outcome_newest_first_a_page_of_50() -> None:
    search = parse_search({})
    assert sorted(search.rows.outcomes) == sorted(OUTCOMES) and search.rows.session_ids is None
    assert (search.rows.by, search.rows.descending, search.offset, search.limit) == ("first_at", True, 0, 50)
    assert parse_search(None).rows == search.rows


def test_statuses_phases_and_results_narrow_the_outcomes_read() -> None:
    def outcomes(conditions: dict[str, Any]) -> list[str]:
        return parse_search({"filter": conditions}).rows.outcomes

    assert outcomes({"result": ["SUCCESS"]}) == ["preempted", "scheduled"]
    assert outcomes({"result": ["FAILURE"], "to_status": ["pending", "CANCELLED"]}) == ["cancelled", "pending"]
    assert outcomes({"from_status": ["RUNNING"]}) == ["preempted"]
    assert outcomes({"phase": {"contains": "preempt"}}) == ["preempted"]
    assert outcomes({"phase": {"i_not_equals": "SCHEDULE"}}) == ["preempted"]
    assert outcomes({"result": ["STALE"]}) == []  # (a result bai never records: nothing)


def test_session_ids_equals_in_and_their_negations() -> None:
    def ids(body: dict[str, Any]) -> tuple[Any, Any]:
        rows = parse_search({"filter": {"session_id": body}}).rows
        return rows.session_ids, rows.not_session_ids

    assert ids({"equals": SID.upper()}) == ([SID], [])  # (any spelling of the UUID)
    assert ids({"in_": [SID, OTHER]}) == ([SID, OTHER], [])  # the client sends the field's name, "in_" …
    assert ids({"in": [SID, OTHER], "equals": OTHER}) == ([OTHER], [])  # … or its alias; both hold
    assert ids({"not_equals": SID, "not_in": [OTHER]}) == (None, [SID, OTHER])


def test_order_by_first_or_last_round_either_way() -> None:
    rows = parse_search({"order": [{"field": "updated_at", "direction": "ASC"}]}).rows
    assert (rows.by, rows.descending) == ("last_at", False)
    rows = parse_search({"order": [{"field": "created_at"}]}).rows
    assert (rows.by, rows.descending) == ("first_at", True)


@pytest.mark.parametrize(
    ("op", "value", "hits"),
    [
        ("equals", "No-room", ["No-room"]),
        ("contains", "room", ["No-room", "a room"]),
        ("starts_with", "a ", ["a room"]),
        ("ends_with", "ROOM", []),
        ("not_equals", "No-room", ["a room", "other"]),
        ("not_contains", "room", ["other"]),
        ("not_starts_with", "No", ["a room", "other"]),
        ("not_ends_with", "m", ["other"]),
        ("i_equals", "NO-ROOM", ["No-room"]),
        ("i_contains", "ROOM", ["No-room", "a room"]),
        ("i_starts_with", "A R", ["a room"]),
        ("i_ends_with", "ROOM", ["No-room", "a room"]),
        ("i_not_equals", "no-room", ["a room", "other"]),
        ("i_not_contains", "ROOM", ["other"]),
        ("i_not_starts_with", "NO", ["a room", "other"]),
        ("i_not_ends_with", "ER", ["No-room", "a room"]),
    ],
)
def test_every_string_filter_operation(op: str, value: str, hits: list[str]) -> None:
    test = string_test({op: value}, "filter.message")
    assert test is not None
    assert [text for text in ("No-room", "a room", "other") if test(text)] == hits


def test_string_operations_together_must_all_hold_and_none_given_filters_nothing() -> None:
    assert set(STRING_FILTER_KEYS) >= {"equals", "i_not_ends_with"} and len(STRING_FILTER_KEYS) == 16
    test = string_test({"contains": "room", "not_starts_with": "a"}, "filter.message")
    assert test is not None and test("No-room") and not test("a room")
    assert string_test({"contains": None}, "filter.message") is None


def test_message_and_error_code_filters_apply_to_what_the_item_shows() -> None:
    search = parse_search({"filter": {"error_code": {"equals": "no-available-instances"}}})
    assert search.keep(attempt("pending", "no-available-instances", "no agent has room"))
    assert not search.keep(attempt("scheduled", "scheduled", "", "a1"))  # (a success has no error code)
    search = parse_search({"filter": {"message": {"contains": "placed on a1"}}})
    assert search.keep(attempt("scheduled", "scheduled", "", "a1"))


def test_a_row_reads_as_backend_ais_session_history_record() -> None:
    waiting = SchedulingAttempt(
        SID, "pending", "predicate-checks-failed", "too many sessions", "",
        [{"name": "concurrency", "msg": "keypair has 3/3 concurrent sessions"}],
        "2026-12-07T10:00:00Z", "2026-12-07T10:05:00Z", 6, 42,
    )  # fmt: skip
    item = item_fields(waiting)
    assert item["id"] == str(uuid.UUID(int=42)) and item["session_id"] == SID
    assert (item["phase"], item["from_status"], item["to_status"], item["result"]) == (
        "schedule", "PENDING", "PENDING", "FAILURE"
    )  # fmt: skip
    assert (item["error_code"], item["message"], item["attempts"]) == (
        "predicate-checks-failed", "too many sessions", 6
    )  # fmt: skip
    assert item["sub_steps"] == [
        {
            "step": "concurrency", "result": "FAILURE", "error_code": None,
            "message": "keypair has 3/3 concurrent sessions",
            "started_at": "2026-12-07T10:00:00Z", "ended_at": "2026-12-07T10:05:00Z",
        }
    ]  # fmt: skip
    assert (item["created_at"], item["updated_at"]) == ("2026-12-07T10:00:00Z", "2026-12-07T10:05:00Z")
    placed = item_fields(attempt("scheduled", "scheduled", "", "a1,a2"))
    assert (placed["to_status"], placed["result"], placed["error_code"], placed["message"]) == (
        "SCHEDULED", "SUCCESS", None, "placed on a1,a2"
    )  # fmt: skip
    preempted = item_fields(attempt("preempted", "preempted", "preempted by vip (priority 70)"))
    assert (preempted["phase"], preempted["from_status"], preempted["to_status"]) == ("preempt", "RUNNING", "PREEMPTED")


@pytest.mark.parametrize(
    "body",
    [
        [], "x", 3, {"limit": 0}, {"limit": 1001}, {"limit": True}, {"limit": 1.5}, {"offset": -1}, {"other": 1},
        {"filter": []}, {"filter": {"name": {}}}, {"filter": {"result": "FAILURE"}}, {"filter": {"result": ["maybe"]}},
        {"filter": {"to_status": [1]}}, {"filter": {"session_id": {"equals": "nope"}}},
        {"filter": {"session_id": {"in": SID}}}, {"filter": {"session_id": {"in": [5]}}},
        {"filter": {"message": {"regex": "x"}}}, {"filter": {"message": {"contains": 5}}}, {"filter": {"phase": "x"}},
        {"order": "x"}, {"order": [5]}, {"order": [{"field": "name"}]}, {"order": [{"field": "created_at", "x": 1}]},
        {"order": [{"field": "created_at", "direction": "up"}]}, {"order": [{"field": "created_at", "direction": 1}]},
    ],
)  # fmt: skip
def test_a_malformed_search_is_a_400_naming_what_is_wrong(body: Any) -> None:
    with pytest.raises(Problem) as refused:
        parse_search(body)
    assert refused.value.status == 400


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
KEYS = st.sampled_from(["filter", "order", "limit", "offset", "in", "in_", "equals", "not_in", "field", "direction",
                        "session_id", "phase", "from_status", "to_status", "result", "error_code", "message",
                        *STRING_FILTER_KEYS])  # fmt: skip
NEAR = st.recursive(
    st.none() | st.integers(-2, 2000) | st.sampled_from(["asc", "DESC", "created_at", "FAILURE", SID, "x"]) | JSON,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(NEAR)
def test_any_body_is_parsed_or_refused_with_a_400(body: Any) -> None:
    try:
        search = parse_search(body)
    except Problem as refused:
        assert refused.status == 400
    else:
        assert 1 <= search.limit <= 1000 and search.offset >= 0
        search.keep(attempt("pending", "no-available-instances", "waits"))
