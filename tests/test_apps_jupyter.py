"""JupyterLab in a bai session, opened through the tunnel as a user would: `bai session app NB jupyterlab`
prints a URL (with the app's token: without it the listener and Jupyter answer 403, see
tests/test_apps_auth.py), headless Chromium loads it, creates a notebook, types `print(6*7)`, runs it with
Shift+Enter and reads 42. The kernel has no network: every byte (the page, its WebSockets, the Jupyter
kernel's messages) goes through the manager and the agent's link. Screenshot:
build/snapshots/jupyterlab-through-bai.png."""

from __future__ import annotations

import re
import uuid

import pytest

from tests.browser import Browser, run_jupyterlab_cell
from tests.nodeproc import ROOT, Node, free_port
from tests.test_browser_driver import chromium, jupyter_image  # noqa: F401 (fixtures)

pytestmark = pytest.mark.docker
SNAPSHOT = ROOT / "build" / "snapshots" / "jupyterlab-through-bai.png"


@pytest.mark.timeout(900)
async def test_jupyterlab_through_the_tunnel_runs_a_cell(
    docker_node: Node,
    chromium: str,  # noqa: F811
    jupyter_image: str,  # noqa: F811
) -> None:
    name = f"nb-{uuid.uuid4().hex[:6]}"
    docker_node.cli("session", "create", "--name", name, "--mem", "1g", jupyter_image, check=True, timeout=120)
    port = free_port()
    proc = docker_node.popen("session", "app", name, "jupyterlab", "--bind", f"127.0.0.1:{port}")
    try:
        url = proc.stdout.readline().strip()
        base = f"http://127.0.0.1:{port}"
        assert re.fullmatch(rf"{re.escape(base)}/lab\?token=[A-Za-z0-9_-]{{32}}", url), (url, proc.stderr.readline())
        async with Browser(chromium) as browser:
            try:
                # the URL bai printed (its token lets the browser in: the listener's cookie and Jupyter's)
                await browser.navigate(url, timeout=60)
                output = await run_jupyterlab_cell(browser, base, "print(6*7)")
            except BaseException:
                await browser.screenshot(SNAPSHOT.with_name("jupyterlab-through-bai-failed.png"))
                raise
            SNAPSHOT.parent.mkdir(parents=True, exist_ok=True)
            await browser.screenshot(SNAPSHOT)
        assert output == "42"
        info = docker_node.json("session", "info", name)
        assert [a["name"] for a in info["servicePorts"]] == ["jupyter", "jupyterlab"]
    finally:
        docker_node.cli("session", "destroy", name, check=True)
        proc.wait(30)
    assert f"session {name} ended" in proc.stderr.read()  # the tunnel says why it closed
