"""A clean-up that fails says what it left behind (bai/node/agent/leftovers.py): a WARNING naming the container,
folder or process group, the error, and how to remove it by hand; a thing already gone stays silent."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

import pytest
from aiodocker.exceptions import DockerError

from bai.node.agent import leftovers
from bai.node.agent import scratch as scratchlib
from bai.node.agent.backends.docker import DockerBackend
from bai.node.agent.backends.local import LocalBackend
from tests.nodeproc import BUSYBOX_IMAGE, ensure_image, require_docker


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_failed_step_is_logged_with_what_is_left_and_how_to_remove_it(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="bai")
    with leftovers.step("folder /x/y", remedy="rm -rf /x/y"):
        raise PermissionError(13, "Permission denied", "/x/y/z")
    (message,) = warnings_of(caplog)
    assert message == (
        "could not remove folder /x/y: [Errno 13] Permission denied: '/x/y/z'; it is left behind: rm -rf /x/y"
    )


def test_a_step_on_something_already_gone_is_silent(caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="bai")
    with leftovers.step("file /x"):
        raise FileNotFoundError(2, "No such file or directory", "/x")
    with leftovers.step("process group 1", action="kill", gone=(ProcessLookupError,)):
        raise ProcessLookupError(3, "No such process")
    assert not caplog.records


def test_a_step_lets_errors_it_is_not_told_of_and_cancellation_through(caplog) -> None:
    with pytest.raises(asyncio.CancelledError), leftovers.step("container c"):
        raise asyncio.CancelledError
    with pytest.raises(KeyError), leftovers.step("container c", errors=(OSError,)):
        raise KeyError("x")
    assert not warnings_of(caplog)


def test_remove_tree_removes_and_reports_what_it_cannot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    caplog.set_level(logging.WARNING, logger="bai")
    gone = tmp_path / "gone"
    (gone / "a" / "b").mkdir(parents=True)
    (gone / "a" / "b" / "f").write_text("x")
    assert leftovers.remove_tree(gone) and not gone.exists()
    assert leftovers.remove_tree(tmp_path / "never-was")  # nothing there: fine, silent
    (tmp_path / "a-file").write_text("x")
    assert leftovers.remove_tree(tmp_path / "a-file") and not (tmp_path / "a-file").exists()
    assert not caplog.records

    stuck = tmp_path / "stuck"
    (stuck / "inner").mkdir(parents=True)
    real_rmdir = os.rmdir

    def rmdir(path, *args, **kwargs):
        if os.fspath(path) in ("inner", str(stuck / "inner")):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_rmdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "rmdir", rmdir)
    assert not leftovers.remove_tree(stuck, "kernel folder")
    monkeypatch.undo()
    assert stuck.exists()
    (message,) = warnings_of(caplog)
    assert message.startswith(f"could not remove kernel folder {stuck} (")
    assert "Permission denied" in message and message.endswith(f"it is left behind: rm -rf {stuck}")


def test_a_kernel_folder_that_cannot_be_removed_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    caplog.set_level(logging.WARNING, logger="bai")
    kdir = tmp_path / "kernels" / "k-1"
    (kdir / "run").mkdir(parents=True)

    def busy(*args, **kwargs) -> None:
        raise OSError(16, "Device or resource busy")

    monkeypatch.setattr(os, "rmdir", busy)
    scratchlib.remove_kernel_dir(kdir)
    monkeypatch.undo()
    (message,) = warnings_of(caplog)
    assert message.startswith(f"could not remove kernel folder {kdir}") and "Device or resource busy" in message
    assert [r.name for r in caplog.records] == ["bai.agent.scratch"]


async def test_local_kill_names_a_process_group_it_cannot_kill(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    caplog.set_level(logging.WARNING, logger="bai")
    backend = LocalBackend(tmp_path, Path("runner.py"), 5)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import time; time.sleep(60)", start_new_session=True
    )
    real_killpg = os.killpg

    def refuse(pgid: int, sig: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    try:
        monkeypatch.setattr(os, "killpg", refuse)
        proc_wait = proc.wait

        async def no_wait() -> int:  # the runner is still there: do not wait for it here
            return 0

        monkeypatch.setattr(proc, "wait", no_wait)
        await backend._kill(proc, "k-1")
    finally:
        monkeypatch.undo()
        real_killpg(proc.pid, signal.SIGKILL)
        await proc_wait()
    (message,) = warnings_of(caplog)
    assert message == (
        f"could not kill process group {proc.pid} (kernel k-1): [Errno 1] Operation not permitted; "
        f"it is left behind: kill -9 -{proc.pid}"
    )
    assert caplog.records[0].name == "bai.agent.local"


async def test_local_kill_of_a_kernel_already_gone_is_silent(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="bai")
    backend = LocalBackend(tmp_path, Path("runner.py"), 5)
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass", start_new_session=True)
    await proc.wait()
    await backend._kill(proc, "k-2")  # its process group is gone: ProcessLookupError, expected
    assert not caplog.records


class FakeContainer:
    def __init__(self, error: DockerError | None) -> None:
        self.id = "1a2b3c4d5e6f7a8b9c0d"
        self.error = error

    async def delete(self, **kwargs) -> None:
        if self.error is not None:
            raise self.error


@pytest.mark.parametrize(
    "error",
    [
        None,
        DockerError(404, "No such container: 1a2b3c"),
        DockerError(409, "removal of container is already in progress"),
    ],
)
async def test_a_container_removed_or_already_gone_is_silent(tmp_path: Path, caplog, error) -> None:
    caplog.set_level(logging.DEBUG, logger="bai")
    backend = DockerBackend("agent-1", tmp_path, tmp_path / "runner.py")
    await backend._remove_container(FakeContainer(error), "k-3")
    assert not caplog.records


async def test_a_container_that_cannot_be_removed_is_named_with_its_remedy(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="bai")
    backend = DockerBackend("agent-1", tmp_path, tmp_path / "runner.py")
    error = DockerError(500, "driver failed to remove root filesystem: device or resource busy")
    await backend._remove_container(FakeContainer(error), "k-4")
    (message,) = warnings_of(caplog)
    assert message == (
        "could not remove container 1a2b3c4d5e6f (kernel k-4): driver failed to remove root filesystem: "
        "device or resource busy (status 500); it is left behind: remove it with `docker rm -f 1a2b3c4d5e6f`"
    )
    assert caplog.records[0].name == "bai.agent.docker"


@pytest.mark.docker
async def test_removing_a_real_container_twice_is_silent(tmp_path: Path, caplog) -> None:
    require_docker()
    ensure_image("busybox", BUSYBOX_IMAGE)
    caplog.set_level(logging.DEBUG, logger="bai")
    backend = DockerBackend("agent-1", tmp_path, tmp_path / "runner.py")
    await backend.start()
    assert backend.docker is not None
    label = f"bai.test=cleanup-logging-{os.getpid()}-{tmp_path.name}"
    try:
        config = {"Image": BUSYBOX_IMAGE, "Cmd": ["sleep", "60"], "Labels": dict([label.split("=", 1)])}
        container = await backend.docker.containers.create(config)
        await container.start()
        await backend._remove_container(container, "k-5")
        await backend._remove_container(container, "k-5")  # 404 now: already gone
        left = await backend.docker.containers.list(all=True, filters={"label": [label]})
    finally:
        for c in await backend.docker.containers.list(all=True, filters={"label": [label]}):
            await c.delete(force=True)
        await backend.docker.close()
    assert not left
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
