"""Session and kernel records for tests that build them by hand (fake stores, pure functions): every field
given a plain default, the ones a test cares about passed by name."""

from __future__ import annotations

from typing import Any

from bai.node.manager.state.records import Kernel, Session

STAMP = "2026-01-01T00:00:00+00:00"


def a_session(**fields: Any) -> Session:
    """A RUNNING interactive session `s1` of one kernel, made and last changed at STAMP, unless told."""
    defaults: dict[str, Any] = {
        "id": "s1",
        "name": "sess-s1",
        "access_key": "AK",
        "image": "python",
        "type": "interactive",
        "status": "RUNNING",
        "status_info": "",
        "status_data": {},
        "status_changed": STAMP,
        "requested_slots": {},
        "environ": {},
        "config": {},
        "scaling_group": "default",
        "cluster_size": 1,
        "tag": None,
        "result": "UNDEFINED",
        "created_at": STAMP,
        "terminated_at": None,
        "seq": 1,
    }
    return Session(**{**defaults, **fields})


def a_kernel(**fields: Any) -> Kernel:
    """The RUNNING main kernel `k1` of session `s1`, on agent `a1`, made at STAMP, unless told."""
    defaults: dict[str, Any] = {
        "id": "k1",
        "session_id": "s1",
        "cluster_role": "main",
        "cluster_idx": 1,
        "image": "python",
        "agent_id": "a1",
        "container_id": None,
        "status": "RUNNING",
        "status_info": "",
        "status_changed": STAMP,
        "occupied_slots": {},
        "exit_code": None,
        "created_at": STAMP,
        "terminated_at": None,
        "devices": [],
        "service_ports": [],
        "last_stat": None,
    }
    return Kernel(**{**defaults, **fields})
