"""JupyterLab in the bai-jupyter kernel image, driven by headless Chromium like a user would.

The container is started directly with docker, confined like a bai kernel (read-only root,
writable /home/work and /tmp, uid 1000), with the command of the image's jupyterlab service
definition.  Chromium opens JupyterLab, creates a Python 3 notebook from the launcher, types
`print(6*7)`, runs it with Shift+Enter and reads the output; a screenshot goes to
build/snapshots/jupyterlab.png.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from tests.browser import CHROMIUM, Browser, run_jupyterlab_cell
from tests.nodeproc import ROOT, has_local_image, require_docker

pytestmark = pytest.mark.docker

JUPYTER_IMAGE = os.environ.get("BAI_TEST_JUPYTER_IMAGE", "bai-jupyter:latest")
SNAPSHOT = ROOT / "build" / "snapshots" / "jupyterlab.png"
APP_PORT = 8090  # jupyterlab:http:8090 in the image's ai.backend.service-ports
TOKEN = secrets.token_urlsafe(24)  # what the runner puts for {token}: the app's secret


@pytest.fixture
def chromium() -> str:
    """Skip (or, with BAI_REQUIRE_DOCKER=1 as in CI, fail) when Chromium is missing."""
    if os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK):
        return CHROMIUM
    reason = f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    if os.environ.get("BAI_REQUIRE_DOCKER") == "1":
        pytest.fail(f"BAI_REQUIRE_DOCKER=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def jupyter_image() -> str:
    """Like the python image fixture: build the image when it is missing, fail if that fails."""
    require_docker()
    if not has_local_image(JUPYTER_IMAGE):
        out = subprocess.run(
            ["bash", str(ROOT / "packaging" / "build-kernel-image.sh"), "jupyter", JUPYTER_IMAGE],
            capture_output=True,
            text=True,
            timeout=900,
        )
        if out.returncode != 0:
            pytest.fail(f"building the jupyter test image failed:\n{out.stdout}\n{out.stderr}")
    return JUPYTER_IMAGE


def service_command(image: str, name: str, port: int) -> tuple[list[str], dict[str, str]]:
    """The start command and env of an app, from the image's service definition."""
    labels = json.loads(
        subprocess.run(
            ["docker", "image", "inspect", "-f", "{{json .Config.Labels}}", image],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert f"{name}:http:{port}" in labels["ai.backend.service-ports"].split(","), labels
    sdef = json.loads(
        subprocess.run(
            ["docker", "run", "--rm", "--network", "none", image, "cat", f"/etc/backend.ai/service-defs/{name}.json"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    runtime = labels["ai.backend.runtime-path"]
    cmd = [
        a.replace("{runtime_path}", runtime).replace("{ports[0]}", str(port)).replace("{token}", TOKEN)
        for a in sdef["command"]
    ]
    return cmd, sdef.get("env", {})


@pytest.fixture
def jupyterlab_url(jupyter_image: str) -> Iterator[str]:
    cmd, env = service_command(jupyter_image, "jupyterlab", APP_PORT)
    env_args = [arg for k, v in env.items() for arg in ("-e", f"{k}={v}")]
    cid = subprocess.run(
        [
            "docker",
            "run",
            "-d",
            "--label",
            "bai.test=1",
            "--read-only",
            "--tmpfs",
            "/tmp",
            "--tmpfs",
            "/home/work:uid=1000,gid=1000,mode=755",
            "--user",
            "1000:1000",
            "-p",
            f"127.0.0.1::{APP_PORT}",
            *env_args,
            jupyter_image,
            *cmd,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    try:
        mapping = subprocess.run(
            ["docker", "port", cid, f"{APP_PORT}/tcp"], capture_output=True, text=True, check=True
        ).stdout.split()[0]
        url = f"http://{mapping}"
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/lab?token={TOKEN}", timeout=5) as r:
                    if r.status == 200:
                        break
            except (OSError, urllib.error.URLError):
                pass
            if time.monotonic() > deadline:
                logs = subprocess.run(["docker", "logs", "--tail", "50", cid], capture_output=True, text=True)
                pytest.fail(f"JupyterLab did not answer at {url}/lab:\n{logs.stdout}{logs.stderr}")
            time.sleep(0.3)
        yield url
    finally:
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True)


@pytest.mark.timeout(900)
async def test_jupyterlab_runs_a_cell_typed_in_chromium(chromium: str, jupyterlab_url: str) -> None:
    async with Browser(chromium) as browser:
        try:
            await browser.navigate(f"{jupyterlab_url}/lab?token={TOKEN}", timeout=60)  # Jupyter's login cookie
            output = await run_jupyterlab_cell(browser, jupyterlab_url, "print(6*7)")
        except BaseException:
            await browser.screenshot(SNAPSHOT.with_name("jupyterlab-failed.png"))
            raise
        await browser.screenshot(SNAPSHOT)
    assert output == "42"
