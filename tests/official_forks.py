"""The official client's commands forked from one process that has imported it already (run by the client's own
interpreter, in its own virtualenv: `python tests/official_forks.py`).

Each `backend.ai …` spends about 1.1 s importing the client before it does anything, and the official-client
tests run hundreds of them. This process imports the client's entry point (`ai.backend.cli.__main__.main`,
what the installed `backend.ai` program calls) once, then, for each request, forks: the child takes the
request's environment, folder and arguments, writes its output to the files named, and runs the same entry
point as the program would. The client reads its configuration from the environment when a command
runs (`ai.backend.client.config.get_config`), never at import, so a child is the command as a user runs it.

Requests and answers are JSON lines on stdin / stdout: {"program", "args", "env", "cwd", "in", "out", "err",
"timeout"} (files: the child's stdin, stdout and stderr) ->
{"code": exit status} or {"timeout": true} (the child's process group killed). Only the standard library.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time


def run_child(request: dict) -> None:
    """In the forked child: become the command, and never return."""
    code = 1
    try:
        os.setpgid(0, 0)
        given = os.open(request["in"], os.O_RDONLY)
        out = os.open(request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        err = os.open(request["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(given, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = [request["program"], *request["args"]]
        from ai.backend.cli.__main__ import main

        try:
            main()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 (said on the child's stderr, as the program would)
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code & 0xFF)


def preload_sdk() -> None:
    """The SDK's function modules: 26.x's `Session()` imports them all when it opens (0.4 s of pydantic models
    in each command otherwise); 23.9 has imported them already."""
    import importlib
    import pkgutil

    try:
        import ai.backend.client.func as func
    except ImportError:
        return
    for module in pkgutil.iter_modules(func.__path__):
        try:
            importlib.import_module(f"{func.__name__}.{module.name}")
        except Exception:  # noqa: BLE001 (a module that cannot be imported here is imported, and fails, as before)
            pass


def serve() -> None:
    """Until stdin ends (the test process closed it, or ended): then the folder of the commands' files goes."""
    import shutil
    import tempfile

    import ai.backend.cli.__main__  # noqa: F401 (imported once: what each child would otherwise import)

    preload_sdk()

    folder = tempfile.mkdtemp(prefix="bai-official-")
    try:
        sys.stdout.write(json.dumps({"ready": True, "folder": folder}) + "\n")
        sys.stdout.flush()
        answer_requests()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def answer_requests() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            run_child(request)
        deadline = time.monotonic() + float(request["timeout"])
        answer: dict = {}
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                answer = {"code": os.waitstatus_to_exitcode(status)}
                break
            if time.monotonic() > deadline:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                os.waitpid(pid, 0)
                answer = {"timeout": True}
                break
            time.sleep(0.005)
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve()
