"""Tests for bai/common/status.py: the session lifecycle's legal and illegal moves."""

from __future__ import annotations

import pytest

from bai.common.status import (
    ACTIVE_STATUSES,
    DEAD_STATUSES,
    OCCUPYING_STATUSES,
    IllegalTransition,
    SessionStatus,
    check_transition,
)

S = SessionStatus


@pytest.mark.parametrize(
    ("current", "target"),
    [
        (S.PENDING, S.SCHEDULED),
        (S.SCHEDULED, S.PREPARING),
        (S.PREPARING, S.RUNNING),
        (S.RUNNING, S.TERMINATING),
        (S.TERMINATING, S.TERMINATED),
        (S.ERROR, S.TERMINATED),
        (S.PENDING, S.CANCELLED),
    ],
)
def test_legal_moves_pass(current: SessionStatus, target: SessionStatus) -> None:
    check_transition(current, target)  # does not raise


@pytest.mark.parametrize(
    ("current", "target"),
    [
        (S.TERMINATED, S.RUNNING),
        (S.RUNNING, S.PENDING),
        (S.PULLING, S.TERMINATING),
        (S.TERMINATING, S.RUNNING),
        (S.RUNNING, S.CANCELLED),
    ],
)
def test_illegal_moves_raise(current: SessionStatus, target: SessionStatus) -> None:
    with pytest.raises(IllegalTransition) as exc:
        check_transition(current, target)
    assert exc.value.current == current
    assert exc.value.target == target
    assert str(current) in str(exc.value) and str(target) in str(exc.value)


@pytest.mark.parametrize("target", list(SessionStatus))
def test_cancelled_goes_nowhere(target: SessionStatus) -> None:
    with pytest.raises(IllegalTransition):
        check_transition(S.CANCELLED, target)


@pytest.mark.parametrize("dead", sorted(DEAD_STATUSES))
@pytest.mark.parametrize("target", list(SessionStatus))
def test_dead_statuses_have_no_way_out(dead: SessionStatus, target: SessionStatus) -> None:
    with pytest.raises(IllegalTransition):
        check_transition(dead, target)


def test_status_sets() -> None:
    assert DEAD_STATUSES == {S.TERMINATED, S.CANCELLED}
    assert ACTIVE_STATUSES.isdisjoint(DEAD_STATUSES)
    assert ACTIVE_STATUSES | DEAD_STATUSES == set(SessionStatus)
    assert S.PENDING not in OCCUPYING_STATUSES
    assert S.RUNNING in OCCUPYING_STATUSES


def test_every_live_status_can_reach_an_end() -> None:
    for status in ACTIVE_STATUSES:
        seen, frontier = {status}, [status]
        while frontier:
            current = frontier.pop()
            for nxt in legal_targets(current):
                if nxt not in seen:
                    seen.add(nxt)
                    frontier.append(nxt)
        assert S.TERMINATED in seen, status


def legal_targets(status: SessionStatus) -> list[SessionStatus]:
    out = []
    for target in SessionStatus:
        try:
            check_transition(status, target)
        except IllegalTransition:
            continue
        out.append(target)
    return out
