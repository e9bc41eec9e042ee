"""One projection of a session, three renderings: the API's JSON (`GET /session`, `GET /session/{ref}`),
the GraphQL items (Backend.AI's snake_case names) and the dashboard stream's rows. The goldens in
test_projection.golden.json were written from the renderings as they were before they shared one
projection; the test proves their shapes (keys, order, values) did not change.

Sessions come from an in-process cluster (rows as the store returns them); ids and timestamps are
replaced by stable placeholders, and `age` (milliseconds since creation) is checked apart.
Regenerate (only when a shape changes on purpose): BAI_WRITE_GOLDEN=1 pytest tests/test_projection.py
"""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path
from typing import Any

import msgspec

from bai.node.manager.http.dashboard import dashboard_row
from bai.node.manager.http.represent import session_graphql, session_json
from bai.node.manager.state.records import Kernel, Session
from tests.harness import Harness

GOLDEN = Path(__file__).with_suffix(".golden.json")
TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(\+00:00|Z)?")


def _normalize(value: Any, names: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {k: _normalize(v, names) for k, v in value.items()}
    if isinstance(value, list):
        return [_normalize(v, names) for v in value]
    if isinstance(value, str):
        for raw, name in names.items():
            value = value.replace(raw, name)
        return TIMESTAMP.sub("<time>", value)
    return value


async def _renderings(h: Harness, row: Session, kernels: list[Kernel]) -> dict[str, Any]:
    listed = await session_json(h.services, row, kernels=kernels)
    detail = await session_json(h.services, row, detail=True, kernels=kernels)
    for item in (listed, detail):
        age = item.pop("age")
        assert isinstance(age, int) and age >= 0
    return {
        "api": listed,
        "api_detail": detail,
        "graphql": await session_graphql(h.services, row, kernels),
        "dashboard": dashboard_row(row, kernels),
    }


async def _cases(h: Harness) -> dict[str, Any]:
    await h.add_agent("a1", cpu=4, mem="8g")
    await h.run("run-1")  # RUNNING
    await h.run("job-exit", type="batch", command="exit 3")  # TERMINATED, FAILURE, exit code 3
    await h.create("too-big", cpu=4)  # PENDING: run-1 holds part of the room (a reason and a queue position)
    await h.create("after-run", depends=["run-1"])  # PENDING until run-1 ends: a dependency
    await h.create("gone-1", cpu=4)
    await h.schedule()
    await h.destroy("gone-1")  # CANCELLED while pending
    await h.wait("gone-1", "CANCELLED")
    await h.create("never", type="batch", starts_at="2999-01-01T00:00:00+00:00")

    names: dict[str, str] = {h.admin: "<access key>"}
    out: dict[str, Any] = {}
    refs = ["run-1", "job-exit", "too-big", "after-run", "gone-1", "never"]
    rows = {ref: await h.row(ref) for ref in refs}
    kernels = await h.store.kernels_of_many([r.id for r in rows.values()])
    for ref, row in rows.items():
        names[row.id] = f"<session {ref}>"
        for i, k in enumerate(kernels.get(row.id, [])):
            names[k.id] = f"<kernel {ref}/{i}>"
            if k.container_id:
                names[k.container_id] = f"<container {ref}/{i}>"
    for ref, row in rows.items():
        out[ref] = await _renderings(h, row, kernels.get(row.id, []))

    # a session with what the harness does not make: mounts, hook notes, shared GPUs, a second kernel,
    # an exit code only in its status data, and the scheduler's bookkeeping the dashboard leaves out
    base = rows["run-1"]
    config = copy.deepcopy(base.config)
    config["mounts"] = [
        {"name": "data", "id": "vf-1", "host": "local", "target": "/home/work/data", "read_only": True},
        {"name": "out", "id": "vf-2", "host": "local", "target": "/home/work/out", "read_only": False},
    ]
    config["hook_notes"] = [{"hook": "audit", "msg": "checked"}]
    status_data = {
        "exitCode": 137,
        "msg": "out of memory",
        "scheduler": {"position": 2, "msg": "m", "retries": 4, "last_try": "x", "passed_predicates": []},
    }
    row = msgspec.structs.replace(base, config=config, status_data=status_data, tag="nightly", environ={"A": "1"})
    main = msgspec.structs.replace(kernels[base.id][0], exit_code=None, devices=[["GPU-a1-0", "0.5"]])
    sub = msgspec.structs.replace(main, id="k-sub", cluster_role="sub", cluster_idx=1, agent_id=None, devices=[])
    out["variant"] = await _renderings(h, row, [sub, main])  # the main kernel is not the first
    out["no-kernels"] = await _renderings(h, msgspec.structs.replace(rows["too-big"], status="PREPARING"), [])
    return _normalize(out, names)


async def test_the_renderings_of_a_session_keep_their_shapes(tmp_path: Path) -> None:
    async with Harness(tmp_path) as h:
        got = json.loads(json.dumps(await _cases(h)))
    if os.environ.get("BAI_WRITE_GOLDEN"):
        GOLDEN.write_text(json.dumps(got, indent=1) + "\n")
    want = json.loads(GOLDEN.read_text())
    assert list(got) == list(want)
    for case in want:
        for kind in want[case]:
            assert list(got[case][kind]) == list(want[case][kind]), (case, kind)  # same keys, same order
            assert got[case][kind] == want[case][kind], (case, kind)
