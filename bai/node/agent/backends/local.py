"""The local backend: kernels are runner.py subprocesses of the node's own user.

For single-user workstations without Docker. Kernels run UNSANDBOXED as the node's user; each
has its own process group, working folder and an address-space limit (RLIMIT_AS) from `mem`.
CPU amounts are accounted for scheduling but not enforced.

Memory: RLIMIT_AS is a limit on each process's address space, not a cgroup, so there is no OOM kill and
no OOM event to report: an allocation over the limit fails, query code gets a MemoryError (the run ends
with exit 1 and its traceback, the kernel lives on) and a command gets whatever its program does on a
failed allocation. (Docker kernels are killed by the OOM killer instead, and report `out-of-memory`.)

A kernel that mounts virtual folders runs under bubblewrap (`bwrap`, Debian package bubblewrap): it
sees the host read-write as usual, but /home is a fresh tmpfs holding its own scratch home at
/home/work and the folders at their targets (read-only ones read-only). Without bubblewrap such a
kernel is refused with a message saying so; kernels without mounts do not need it.

Multi-container sessions (`KernelSpec.cluster` of more than one kernel) are refused: they need a Docker
agent (the kernels find each other by name on a network of their own).
"""

from __future__ import annotations

import asyncio
import ctypes
import io
import logging
import os
import posixpath
import resource
import shutil
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bai.node.agent import leftovers
from bai.node.agent.backends.base import (
    BackendBase,
    Dotfile,
    Kernel,
    KernelSpec,
    KernelStartError,
    Mount,
    kernel_env,
    listen_for_runner,
)
from bai.node.agent.channel import AGENT_SOCKET, ChannelError, OutputSink
from bai.node.agent.download import tar_path
from bai.node.agent.files import list_dir
from bai.node.agent.terminal import PtyProcess, Terminal

if TYPE_CHECKING:
    from bai.node.agent.stats import Sampler

log = logging.getLogger("bai.agent.local")
PR_SET_PDEATHSIG = 1  # prctl(2)


def write_dotfiles(home: Path, dotfiles: list[Dotfile]) -> None:
    for f in dotfiles:
        parts = [p for p in f.path.split("/") if p not in ("", ".")]
        if not parts or ".." in parts:
            continue  # the manager refuses such paths; never write outside the home
        target = home.joinpath(*parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(f.data)
        target.chmod(f.mode)


def sandbox(bwrap: str, kdir: Path, work_dir: Path, runner: Path, mounts: list[Mount]) -> list[str]:
    """The bubblewrap prefix of a kernel with mounts: the host as it is, a tmpfs /home with the
    kernel's home at /home/work and each folder at its target, then what the kernel itself needs from
    under /home (the interpreter, the runner, its own folder) put back."""
    args = [bwrap, "--bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--die-with-parent"]
    args += ["--tmpfs", "/home", "--bind", str(work_dir), "/home/work"]
    needed = {Path(sys.prefix), Path(sys.base_prefix), Path(os.path.realpath(sys.executable)).parent, runner.parent}
    for path in sorted(needed):
        if path.is_relative_to("/home"):
            args += ["--ro-bind", str(path), str(path)]
    if kdir.is_relative_to("/home"):
        args += ["--bind", str(kdir), str(kdir)]
    for m in mounts:
        args += ["--ro-bind" if m.read_only else "--bind", m.host_path, m.target]
    return [*args, "--chdir", "/home/work", "--"]


class LocalBackend(BackendBase):
    """Kernels as local processes (in a bubblewrap sandbox where available), for machines without Docker."""

    name = "local"

    def __init__(self, kernels_dir: Path, runner_path: Path, start_timeout: float) -> None:
        self.kernels_dir = kernels_dir
        self.runner_path = runner_path
        self.start_timeout = start_timeout
        self._procs: dict[str, asyncio.subprocess.Process] = {}
        self._terminals: dict[str, set[PtyProcess]] = {}  # kernel id -> its open terminals (end with it)

    async def start(self) -> None:
        self.kernels_dir.mkdir(parents=True, exist_ok=True)

    def sampler(self) -> Sampler:
        """psutil over each kernel's process group (agent.stats.LocalSampler)."""
        from bai.node.agent.stats import LocalSampler

        return LocalSampler()

    async def images(self) -> list[dict[str, Any]]:
        return [{"name": "python", "id": "local", "size": 0, "python": sys.version.split()[0]}]

    async def create(self, spec: KernelSpec, on_output: OutputSink) -> Kernel:
        if spec.clustered():  # its kernels would share the host's network and names: nothing to tell them apart
            raise KernelStartError(
                "the local backend runs one kernel per session: multi-container sessions need a Docker agent"
            )
        if spec.image not in ("python", "local", "python3") and not spec.image.startswith("bai-python"):
            raise KernelStartError(
                f"image {spec.image!r} is not available on the local backend (it runs the host's Python)"
            )
        loop = asyncio.get_running_loop()
        kdir = self.kernels_dir / spec.kernel_id
        run_dir, work_dir = kdir / "run", kdir / "work"
        run_dir.mkdir(parents=True, exist_ok=True)
        work_dir.mkdir(parents=True, exist_ok=True)
        mem = int(spec.slots.get("mem", 0))
        env = dict(os.environ)
        env.update(kernel_env(spec))
        env["HOME"] = str(work_dir)
        write_dotfiles(work_dir, spec.dotfiles)
        # the agent listens, the runner connects (as in containers; here the run folder stays writable)
        channel = await listen_for_runner(run_dir, on_output, (os.getuid(), os.getgid()))
        command = [sys.executable, "-u", str(self.runner_path), "--connect", str(run_dir / AGENT_SOCKET)]
        if spec.mounts:
            bwrap = shutil.which("bwrap")
            if bwrap is None:
                await channel.close()
                leftovers.remove_tree(kdir, "kernel folder", logger=log)
                raise KernelStartError(
                    "mounting virtual folders in a local kernel needs bubblewrap (apt-get install bubblewrap)"
                )
            outside = [m.target for m in spec.mounts if not m.target.startswith("/home/work/")]
            if outside:
                await channel.close()
                leftovers.remove_tree(kdir, "kernel folder", logger=log)
                raise KernelStartError(f"the local backend mounts folders under /home/work only, not at {outside[0]}")
            env["HOME"] = "/home/work"
            command = [
                *sandbox(bwrap, kdir, work_dir, self.runner_path, spec.mounts),
                *command,
                "--workdir",
                "/home/work",
            ]
        else:
            command += ["--workdir", str(work_dir)]

        libc = ctypes.CDLL(None, use_errno=True)

        def limit() -> None:  # runs in the child before exec
            # the kernel ends with its agent, even one killed with -9 (the runner handles SIGTERM)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
            if mem > 0:
                resource.setrlimit(resource.RLIMIT_AS, (mem, mem))

        log_file = open(kdir / "runner.log", "ab")  # noqa: SIM115 - handed to the child
        try:
            proc = await asyncio.create_subprocess_exec(
                *command,
                cwd=work_dir,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log_file,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=limit,
            )
        except BaseException:
            await channel.close()
            leftovers.remove_tree(kdir, "kernel folder", logger=log)
            raise
        finally:
            log_file.close()
        self._procs[spec.kernel_id] = proc
        watcher = asyncio.ensure_future(proc.wait())
        deadline = loop.time() + self.start_timeout
        try:
            await channel.wait_connected(deadline, watcher)
        except (ChannelError, asyncio.CancelledError) as e:  # failed, or the manager gave up waiting
            tail = (kdir / "runner.log").read_text(errors="replace")[-500:].strip()
            self._procs.pop(spec.kernel_id, None)
            await channel.close()
            await self._kill(proc, spec.kernel_id)
            leftovers.remove_tree(kdir, "kernel folder", logger=log)
            if isinstance(e, asyncio.CancelledError):
                raise
            raise KernelStartError(f"{e}: {tail or 'no output'}") from None
        kernel = Kernel(spec=spec, channel=channel, run_dir=run_dir, pid=proc.pid)
        watcher.add_done_callback(lambda f: kernel.set_exit(_exit_status(f.result())))
        return kernel

    async def _kill(self, proc: asyncio.subprocess.Process, kernel_id: str) -> None:
        """Kill the kernel's process group (one already gone is fine) and reap its runner."""
        what = f"process group {proc.pid} (kernel {kernel_id})"
        with leftovers.step(what, action="kill", remedy=f"kill -9 -{proc.pid}", gone=(ProcessLookupError,), logger=log):
            os.killpg(proc.pid, signal.SIGKILL)
        with leftovers.step(f"runner {proc.pid} (kernel {kernel_id})", action="reap", left_behind=False, logger=log):
            await proc.wait()

    async def open_terminal(self, kernel: Kernel, command: list[str], rows: int, cols: int) -> Terminal:
        """The command on a PTY with the kernel's environment and home (in its sandbox when it mounts
        folders, as the kernel itself runs)."""
        spec = kernel.spec
        kdir = kernel.run_dir.parent
        work_dir = kdir / "work"
        env = {**os.environ, **kernel_env(spec), "HOME": str(work_dir)}
        cwd = str(work_dir)
        if spec.mounts:
            bwrap = shutil.which("bwrap")
            if bwrap is None:
                raise KernelStartError("this kernel's sandbox needs bubblewrap (apt-get install bubblewrap)")
            env["HOME"] = "/home/work"
            command = [*sandbox(bwrap, kdir, work_dir, self.runner_path, spec.mounts), *command]
        try:
            terminal = await PtyProcess.start(command, env, cwd, rows, cols)
        except OSError as e:
            raise KernelStartError(f"cannot start {command[0]!r}: {e.strerror}") from None
        mine = self._terminals.setdefault(spec.kernel_id, set())
        mine.add(terminal)
        terminal.proc_done = asyncio.ensure_future(terminal.proc.wait())
        terminal.proc_done.add_done_callback(lambda _: mine.discard(terminal))
        return terminal

    async def list_files(self, kernel: Kernel, path: str) -> dict[str, Any]:
        """List the host folder behind a path of the kernel's view (its home, or a mounted folder)."""
        work = kernel.run_dir.parent / "work"
        full = posixpath.normpath(posixpath.join("/home/work", path))
        host = None
        for m in sorted(kernel.spec.mounts, key=lambda m: len(m.target), reverse=True):
            if full == m.target or full.startswith(m.target + "/"):
                host = m.host_path + full[len(m.target) :]
                break
        if host is None and (full == "/home/work" or full.startswith("/home/work/")):
            host = str(work) + full[len("/home/work") :]
        if host is None:
            return {"files": "[]", "errors": f"{full}: only /home/work and its folders can be listed", "abspath": full}
        result = await asyncio.to_thread(list_dir, host)
        return {**result, "abspath": full, "errors": result["errors"].replace(host, full)}

    def _host_path(self, kernel: Kernel, full: str) -> str | None:
        """The host path behind a path of the kernel's view (its home, or a mounted folder); None elsewhere."""
        for m in sorted(kernel.spec.mounts, key=lambda m: len(m.target), reverse=True):
            if full == m.target or full.startswith(m.target + "/"):
                return m.host_path + full[len(m.target) :]
        if full == "/home/work" or full.startswith("/home/work/"):
            return str(kernel.run_dir.parent / "work") + full[len("/home/work") :]
        return None

    async def download(self, kernel: Kernel, path: str, limit: int) -> bytes:
        """The archive is made from the host folder behind the path; a symbolic link is archived as a link
        (never followed out of the kernel's folders)."""
        host = self._host_path(kernel, path)
        if host is None:
            raise ChannelError(f"{path}: only files under /home/work can be downloaded")
        buffer = io.BytesIO()
        try:
            await asyncio.to_thread(tar_path, host, buffer, limit)
        except OSError as e:
            raise ChannelError(str(e).replace(host, path)) from None
        return buffer.getvalue()

    async def destroy(self, kernel: Kernel) -> None:
        kernel.destroying = True
        proc = self._procs.pop(kernel.spec.kernel_id, None)
        for terminal in list(self._terminals.pop(kernel.spec.kernel_id, ())):  # processes outside the kernel's group
            await terminal.close()
        await kernel.channel.close()
        if proc is not None:
            await self._kill(proc, kernel.spec.kernel_id)
        leftovers.remove_tree(kernel.run_dir.parent, "kernel folder", logger=log)

    async def adopt(self, on_output: OutputSink) -> list[Kernel]:
        # Local kernels die with the node; leftovers are only folders.
        if self.kernels_dir.exists():
            for child in self.kernels_dir.iterdir():
                leftovers.remove_tree(child, "kernel folder", logger=log)
        return []

    async def close(self, kernels: list[Kernel]) -> None:
        for kernel in kernels:
            await self.destroy(kernel)


def _exit_status(code: int) -> int:
    return 128 - code if code < 0 else code
