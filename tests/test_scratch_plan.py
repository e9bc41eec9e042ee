"""`Scratch.plan` says, without doing anything, what `Scratch.prepare` returns: the Docker backend creates
the kernel's container from the plan while the scratch is being prepared."""

from __future__ import annotations

from pathlib import Path

import pytest

from bai.node.agent.scratch import Scratch


@pytest.mark.parametrize("kind", ["hostdir", "memory"])
@pytest.mark.parametrize("volumes", [[], ["/data", "/tmp", "/var/lib/x"]])
def test_plan_is_what_prepare_returns(tmp_path: Path, kind: str, volumes: list[str]) -> None:
    scratch = Scratch(kind, 64 * 2**20)
    kdir = tmp_path / "k1"
    planned = scratch.plan(kdir, None, volumes)
    assert not kdir.exists()  # planning does nothing
    assert scratch.prepare(kdir, None, volumes) == planned
    for folder in planned.binds.values():
        assert folder.is_dir()
