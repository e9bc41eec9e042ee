"""The systemd units pass `systemd-analyze verify` (with the zipapp's path pointing at a real file)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.nodeproc import ROOT

UNITS = ["bai-manager.service", "bai-agent.service", "bai-watcher.service"]


def test_systemd_units_verify(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        if os.environ.get("BAI_REQUIRE_DOCKER") == "1":
            pytest.fail("systemd-analyze is missing (CI installs systemd)")
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    program = tmp_path / "bai.pyz"
    program.write_text("#!/bin/sh\nexit 0\n")
    program.chmod(0o755)
    paths = []
    for name in UNITS:
        text = (ROOT / "packaging" / "systemd" / name).read_text()
        assert "ExecStart=/usr/local/bin/bai.pyz " in text and "Restart=" in text
        assert "KillSignal=SIGTERM" in text
        unit = tmp_path / name
        unit.write_text(text.replace("/usr/local/bin/bai.pyz", str(program)))
        paths.append(str(unit))
    result = subprocess.run(["systemd-analyze", "verify", *paths], capture_output=True, text=True, timeout=60)
    problems = [line for line in result.stderr.splitlines() if "bai-" in line]
    assert result.returncode == 0 and not problems, result.stderr
