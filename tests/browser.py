"""A small headless-Chromium driver over the Chrome DevTools Protocol (aiohttp only), and a
helper that runs a cell in JupyterLab the way a user does.

    async with Browser() as browser:
        await browser.navigate("http://127.0.0.1:8888/lab")
        await browser.wait_for("document.querySelector('.jp-LabShell')")
        await browser.screenshot("shot.png")
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM = os.environ.get("BAI_TEST_CHROMIUM", "/usr/bin/chromium")


class BrowserError(Exception):
    """A DevTools command failed, or JavaScript threw."""


# modifier bit masks of Input.dispatchKeyEvent / dispatchMouseEvent
MODIFIERS = {"Alt": 1, "Control": 2, "Ctrl": 2, "Meta": 4, "Shift": 8}

# key -> (code, windowsVirtualKeyCode, text)
_KEYS: dict[str, tuple[str, int, str]] = {
    "Enter": ("Enter", 13, "\r"),
    "Tab": ("Tab", 9, "\t"),
    "Escape": ("Escape", 27, ""),
    "Backspace": ("Backspace", 8, ""),
    "Delete": ("Delete", 46, ""),
    "ArrowLeft": ("ArrowLeft", 37, ""),
    "ArrowUp": ("ArrowUp", 38, ""),
    "ArrowRight": ("ArrowRight", 39, ""),
    "ArrowDown": ("ArrowDown", 40, ""),
    "Home": ("Home", 36, ""),
    "End": ("End", 35, ""),
    " ": ("Space", 32, " "),
}


def _key_info(key: str) -> tuple[str, int, str]:
    if key in _KEYS:
        return _KEYS[key]
    if len(key) == 1:
        if key.isalpha():
            return f"Key{key.upper()}", ord(key.upper()), key
        if key.isdigit():
            return f"Digit{key}", ord(key), key
        return "", 0, key
    raise ValueError(f"unknown key {key!r}")


class Browser:
    """Headless Chromium with one page, driven over its DevTools websocket."""

    def __init__(self, executable: str = CHROMIUM, width: int = 1280, height: int = 900) -> None:
        self.executable = executable
        self.width = width
        self.height = height
        self.proc: asyncio.subprocess.Process | None = None
        self.user_data_dir: str | None = None
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._reader: asyncio.Task | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._waiters: list[tuple[str, asyncio.Future]] = []

    # -- life cycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> Browser:
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self, timeout: float = 30) -> None:
        if not (os.path.isfile(self.executable) and os.access(self.executable, os.X_OK)):
            raise FileNotFoundError(f"no Chromium at {self.executable}")
        self.user_data_dir = tempfile.mkdtemp(prefix="bai-chromium-")
        log = open(os.path.join(self.user_data_dir, "chromium.log"), "wb")  # noqa: SIM115
        try:
            self.proc = await asyncio.create_subprocess_exec(
                self.executable,
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--mute-audio",
                "--hide-scrollbars",
                f"--window-size={self.width},{self.height}",
                "--remote-debugging-port=0",
                f"--user-data-dir={self.user_data_dir}",
                "about:blank",
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,  # its own process group: close() ends its helpers too
            )
        finally:
            log.close()
        # Chromium writes the port it picked (and the browser target's path) once it listens
        port_file = Path(self.user_data_dir, "DevToolsActivePort")
        deadline = time.monotonic() + timeout
        port = None
        while port is None:
            if self.proc.returncode is not None:
                raise BrowserError(f"chromium exited with {self.proc.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise BrowserError(f"chromium wrote no DevToolsActivePort in {timeout} s:\n{self.log_tail()}")
            with contextlib.suppress(FileNotFoundError, ValueError, IndexError):
                port = int(port_file.read_text().splitlines()[0])
            if port is None:
                await asyncio.sleep(0.05)
        self._http = aiohttp.ClientSession()
        ws_url = None
        while ws_url is None:
            async with self._http.get(f"http://127.0.0.1:{port}/json/list") as r:
                targets = await r.json(content_type=None)
            ws_url = next((t["webSocketDebuggerUrl"] for t in targets if t.get("type") == "page"), None)
            if ws_url is None:
                if time.monotonic() > deadline:
                    raise BrowserError(f"no page target: {targets}")
                await asyncio.sleep(0.05)
        self._ws = await self._http.ws_connect(ws_url, max_msg_size=0)
        self._reader = asyncio.create_task(self._read())
        await self.send("Page.enable")
        await self.send("Runtime.enable")
        await self.send(
            "Emulation.setDeviceMetricsOverride",
            width=self.width,
            height=self.height,
            deviceScaleFactor=1,
            mobile=False,
        )

    async def close(self) -> None:
        """Stop Chromium and remove its profile directory (safe to call twice)."""
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(BaseException):
                await self._reader
            self._reader = None
        if self._ws is not None:
            with contextlib.suppress(Exception):
                await self._ws.close()
            self._ws = None
        if self._http is not None:
            await self._http.close()
            self._http = None
        if self.proc is not None:
            if self.proc.returncode is None:
                self._signal_group(signal.SIGTERM)
                try:
                    await asyncio.wait_for(self.proc.wait(), 5)
                except TimeoutError:
                    pass
            # the browser's helper processes (renderer, network service...) may outlive it
            self._signal_group(signal.SIGKILL)
            await self.proc.wait()
            self.proc = None
        if self.user_data_dir is not None:
            for _ in range(20):
                shutil.rmtree(self.user_data_dir, ignore_errors=True)
                if not os.path.exists(self.user_data_dir):
                    break
                await asyncio.sleep(0.1)
            self.user_data_dir = None

    def _signal_group(self, sig: int) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def log_tail(self, chars: int = 3000) -> str:
        if self.user_data_dir is None:
            return ""
        try:
            return Path(self.user_data_dir, "chromium.log").read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    # -- protocol -----------------------------------------------------------------------------

    async def _read(self) -> None:
        assert self._ws is not None
        try:
            async for msg in self._ws:
                if msg.type != aiohttp.WSMsgType.TEXT:
                    continue
                data = json.loads(msg.data)
                if "id" in data:
                    fut = self._pending.pop(data["id"], None)
                    if fut is not None and not fut.done():
                        if "error" in data:
                            fut.set_exception(BrowserError(f"{data['error']}"))
                        else:
                            fut.set_result(data.get("result", {}))
                else:
                    if data.get("method") == "Page.javascriptDialogOpening":
                        # alert/confirm/beforeunload ("leave the page?"): accept, like a user
                        # who wants to go on; otherwise Page.navigate would hang
                        asyncio.create_task(self._accept_dialog())
                    for method, fut in list(self._waiters):
                        if method == data.get("method") and not fut.done():
                            fut.set_result(data.get("params", {}))
        finally:
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(BrowserError("the DevTools connection closed"))

    async def _accept_dialog(self) -> None:
        with contextlib.suppress(Exception):
            await self.send("Page.handleJavaScriptDialog", accept=True)

    async def send(self, method: str, timeout: float = 30, **params: Any) -> dict:
        """Send one DevTools command and return its result."""
        if self._ws is None:
            raise BrowserError("browser not started")
        msg_id = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._pending[msg_id] = fut
        await self._ws.send_str(json.dumps({"id": msg_id, "method": method, "params": params}))
        try:
            return await asyncio.wait_for(fut, timeout)
        finally:
            self._pending.pop(msg_id, None)

    def _expect(self, method: str) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        entry = (method, fut)
        self._waiters.append(entry)
        fut.add_done_callback(lambda _: self._waiters.remove(entry))
        return fut

    # -- page actions -------------------------------------------------------------------------

    async def navigate(self, url: str, timeout: float = 30) -> None:
        """Load `url` and wait for its load event."""
        loaded = self._expect("Page.loadEventFired")
        try:
            result = await self.send("Page.navigate", url=url)
            if result.get("errorText"):
                raise BrowserError(f"navigating to {url}: {result['errorText']}")
            await asyncio.wait_for(loaded, timeout)
        finally:
            loaded.cancel()

    async def evaluate(self, js: str, timeout: float = 30) -> Any:
        """The value of a JavaScript expression (promises are awaited)."""
        result = await self.send(
            "Runtime.evaluate",
            timeout=timeout,
            expression=js,
            returnByValue=True,
            awaitPromise=True,
            userGesture=True,
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise BrowserError(f"JavaScript error: {text}")
        return result.get("result", {}).get("value")

    async def wait_for(self, js_condition: str, timeout: float = 30, interval: float = 0.1) -> Any:
        """Poll a JavaScript expression until it is truthy; return its value."""
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        # a DOM node cannot be returned by value: report it as true
        js = f"(async () => {{ const v = await ({js_condition}); return v instanceof Node ? true : v; }})()"
        while True:
            try:
                value = await self.evaluate(js)
                if value:
                    return value
            except BrowserError as e:  # e.g. the page is between documents
                last_error = e
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"waited {timeout} s for {js_condition!r}" + (f" (last error: {last_error})" if last_error else "")
                )
            await asyncio.sleep(interval)

    async def insert_text(self, text: str) -> None:
        """Type `text` into the focused element (like an IME commit: one input event)."""
        await self.send("Input.insertText", text=text)

    async def press(self, key: str, modifiers: Iterable[str] | int = ()) -> None:
        """Press and release one key, e.g. press("Enter", ["Shift"])."""
        mask = modifiers if isinstance(modifiers, int) else sum(MODIFIERS[m] for m in modifiers)
        code, vk, text = _key_info(key)
        if mask & (MODIFIERS["Control"] | MODIFIERS["Meta"] | MODIFIERS["Alt"]):
            text = ""
        common = {"key": key, "code": code, "windowsVirtualKeyCode": vk, "nativeVirtualKeyCode": vk, "modifiers": mask}
        if text:
            await self.send("Input.dispatchKeyEvent", type="keyDown", text=text, unmodifiedText=text, **common)
        else:
            await self.send("Input.dispatchKeyEvent", type="rawKeyDown", **common)
        await self.send("Input.dispatchKeyEvent", type="keyUp", **common)

    async def click(self, selector: str) -> None:
        """Click the middle of the first element matching a CSS selector."""
        box = await self.evaluate(
            f"""(() => {{
                const el = document.querySelector({json.dumps(selector)});
                if (!el) return null;
                el.scrollIntoView({{block: "center", inline: "center"}});
                const r = el.getBoundingClientRect();
                return {{x: r.left + r.width / 2, y: r.top + r.height / 2, w: r.width, h: r.height}};
            }})()"""
        )
        if not box:
            raise BrowserError(f"no element matches {selector!r}")
        if box["w"] == 0 or box["h"] == 0:
            raise BrowserError(f"element {selector!r} is not visible")
        x, y = box["x"], box["y"]
        await self.send("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
        for kind in ("mousePressed", "mouseReleased"):
            await self.send("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", buttons=1, clickCount=1)

    async def screenshot(self, path: str | os.PathLike) -> Path:
        """Save the viewport as a PNG."""
        result = await self.send("Page.captureScreenshot", format="png")
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(base64.b64decode(result["data"]))
        return out


# ---------------------------------------------------------------------------------------------
# JupyterLab
# ---------------------------------------------------------------------------------------------

# the notebook panel in front (lumino hides the others with lm-mod-hidden)
NOTEBOOK = ".jp-NotebookPanel:not(.lm-mod-hidden)"
FIRST_CELL = f"{NOTEBOOK} .jp-Notebook .jp-Cell"
LAUNCHER_PYTHON = '.jp-LauncherCard[data-category="Notebook"]'


async def _create_notebook_via_api(browser: Browser, base_url: str, timeout: float) -> None:
    """PUT an empty Python 3 notebook through Jupyter's contents API (from the page, so that
    the _xsrf cookie is there) and open it."""
    name = f"bai-{uuid.uuid4().hex[:8]}.ipynb"
    notebook = {
        "cells": [{"cell_type": "code", "source": "", "metadata": {}, "outputs": [], "execution_count": None}],
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"},
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    body = json.dumps({"type": "notebook", "format": "json", "content": notebook})
    status = await browser.evaluate(
        f"""(async () => {{
            const xsrf = (document.cookie.match(/(?:^|;\\s*)_xsrf=([^;]*)/) || [])[1] || "";
            const r = await fetch("/api/contents/{name}", {{
                method: "PUT",
                headers: {{"Content-Type": "application/json", "X-XSRFToken": decodeURIComponent(xsrf)}},
                body: {json.dumps(body)},
            }});
            return r.status;
        }})()"""
    )
    if status not in (200, 201):
        raise BrowserError(f"creating {name} through the contents API: HTTP {status}")
    await browser.navigate(f"{base_url}/lab/tree/{name}", timeout=timeout)


async def run_jupyterlab_cell(
    browser: Browser, base_url: str, code: str, timeout: float = 90, via: str = "launcher"
) -> str:
    """Open JupyterLab at `base_url`, create a Python 3 notebook (by clicking the launcher's
    notebook card, or with via="api" through the contents API), type `code` into the first
    cell, run it with Shift+Enter and return the text of its output."""
    base_url = base_url.rstrip("/")
    deadline = time.monotonic() + timeout

    def left() -> float:
        return max(1.0, deadline - time.monotonic())

    await browser.navigate(f"{base_url}/lab", timeout=left())
    # JupyterLab is ready when its shell is laid out and the file browser and the launcher (or
    # the documents of a restored workspace) are there
    await browser.wait_for(
        f"""document.querySelector('.jp-LabShell') && document.querySelector('.jp-DirListing-content')
            && (document.querySelector({json.dumps(LAUNCHER_PYTHON)})
                || document.querySelector('#jp-main-dock-panel .lm-TabBar-tab'))""",
        timeout=left(),
    )
    if via == "launcher" and not await browser.evaluate(f"!!document.querySelector({json.dumps(LAUNCHER_PYTHON)})"):
        via = "api"  # a restored workspace without a launcher
    if via == "launcher":
        await browser.click(LAUNCHER_PYTHON)
    elif via == "api":
        await _create_notebook_via_api(browser, base_url, left())
    else:
        raise ValueError(f"unknown way to create a notebook: {via!r}")
    editor = f"{FIRST_CELL} .cm-content"
    await browser.wait_for(f"document.querySelector({json.dumps(editor)})", timeout=left())
    # focus the cell editor (this also makes the notebook the current widget, whose kernel the
    # status bar shows), and type only once the kernel is there: JupyterLab does not run cells
    # while the notebook says "No Kernel"
    await browser.click(editor)
    await browser.wait_for(_kernel_idle_js(), timeout=left())
    # a "Select Kernel" dialog (seen with restored workspaces): take the proposed kernel
    if await browser.evaluate("!!document.querySelector('.jp-Dialog .jp-mod-accept')"):
        await browser.click(".jp-Dialog .jp-mod-accept")
        await browser.wait_for("!document.querySelector('.jp-Dialog')", timeout=left())
        await browser.click(editor)
        await browser.wait_for(_kernel_idle_js(), timeout=left())
    await browser.wait_for(f"document.activeElement && document.activeElement.matches({json.dumps(editor)})")
    await browser.insert_text(code)
    typed = await browser.evaluate(f"document.querySelector({json.dumps(editor)}).innerText")
    if typed.strip() != code.strip():
        raise BrowserError(f"the cell editor holds {typed!r}, not {code!r}")
    await browser.press("Enter", ["Shift"])
    output = f"{FIRST_CELL} .jp-OutputArea-output"
    text = await browser.wait_for(
        f"""(() => {{
            const el = document.querySelector({json.dumps(output)});
            return el && el.innerText.trim() ? el.innerText : null;
        }})()""",
        timeout=left(),
    )
    # and the execution finished: the prompt shows [1] instead of [*]
    await browser.wait_for(
        f"""(() => {{
            const p = document.querySelector({json.dumps(f"{FIRST_CELL} .jp-InputArea-prompt")});
            return p && /\\[\\d+\\]/.test(p.innerText);
        }})()""",
        timeout=left(),
    )
    return text.strip()


def _kernel_idle_js() -> str:
    """JS: true once the front notebook's kernel is idle, as JupyterLab 4's status bar says
    ("Python 3 (ipykernel) | Idle").  (The toolbar's execution indicator is no help: it says
    idle before a kernel is attached, while the status bar says "No Kernel | Initializing".)"""
    return """(() => {
        const bar = document.querySelector('#jp-main-statusbar');
        if (!bar) return false;
        const m = bar.innerText.match(/([^\\n|]*)\\|\\s*Idle\\b/);
        return !!m && !/No Kernel/.test(m[1]);
    })()"""
