"""The simulated backend: kernels that exist only in memory, for scale tests and benchmarks ONLY.

Nothing runs. A kernel is a `Kernel` whose channel is a `SimChannel`; creating one waits `start_delay`
seconds (asyncio.sleep) and costs a few KiB, so one process can host hundreds of agents with thousands
of kernels. Every image name is accepted. The kernel's environment and resource slots are accounted
(`SimBackend.occupied()`) but not enforced: nothing is isolated or limited. Kernels of multi-container
sessions are accepted as they are (no network: `Kernel.spec.cluster` says where each one stands).

What a `SimChannel` does with code, deterministically and without executing anything:

query mode (the code is parsed, never run)
  `print(<literal>, ...)`            stdout `str(value)` (joined by spaces) + "\\n", then exit 0
  `raise SystemExit(N)`, `exit(N)`,  exit N (no argument or None: 0; a non-integer literal is
  `quit(N)`, `sys.exit(N)`           written to stderr and the exit is 1, as Python does)
  anything else                      no output, exit 0 (input() is not supported: no prompt)
batch mode (the command is split like a shell word list, never run)
  `true` → 0   `false` → 1   `exit [N]` → N   `echo WORDS` → stdout "WORDS\\n", 0
  `sleep S`                          exit 0 after S seconds; an interrupt ends it with 130
  anything else                      no output, exit 0
put_file
  accepted and discarded; the paths are recorded in `SimChannel.files` (and listed by `list_files`).
apps (`SimBackend(apps="echo:tcp:7000,...")`, Backend.AI's service-ports label; none by default)
  starting one opens a real TCP echo server on 127.0.0.1 (a free port) that tunnels reach; an app named
  `broken` fails to start, saying "boom" on its output.
"""

from __future__ import annotations

import ast
import asyncio
import shlex
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bai.common import service_ports as apps
from bai.common import slots as slotlib
from bai.common.service_ports import ServicePort
from bai.node.agent import leftovers
from bai.node.agent.backends.base import BackendBase, Kernel, KernelSpec, kernel_env
from bai.node.agent.channel import Channel, ChannelError, OutputSink

if TYPE_CHECKING:
    from bai.node.agent.stats import Sampler

SIM_IMAGE = "sim"
SIM_RUN_DIR = Path("/nonexistent/bai-sim")  # kernels have no folder; nothing is ever written here
INTERRUPTED = 130


def _exit_call(node: ast.AST) -> ast.Call | None:
    """The call of `raise SystemExit(..)`, `exit(..)`, `quit(..)` or `sys.exit(..)`, if the statement is one."""
    if isinstance(node, ast.Raise) and node.exc is not None:
        exc = node.exc
        if isinstance(exc, ast.Name) and exc.id == "SystemExit":
            return ast.Call(func=exc, args=[], keywords=[])
        if isinstance(exc, ast.Call) and isinstance(exc.func, ast.Name) and exc.func.id == "SystemExit":
            return exc
        return None
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        func = node.value.func
        if isinstance(func, ast.Name) and func.id in ("exit", "quit"):
            return node.value
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "exit"
            and isinstance(func.value, ast.Name)
            and func.value.id == "sys"
        ):
            return node.value
    return None


def simulate_query(code: str) -> tuple[str, str, int]:
    """(stdout, stderr, exit code) of query-mode code, without running it."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return "", "", 0
    if len(tree.body) != 1:
        return "", "", 0
    stmt = tree.body[0]
    call = _exit_call(stmt)
    if call is not None:
        if call.keywords or len(call.args) > 1:
            return "", "", 0
        try:
            value = ast.literal_eval(call.args[0]) if call.args else None
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return "", "", 0
        if value is None:
            return "", "", 0
        if isinstance(value, int) and not isinstance(value, bool):
            return "", "", value
        return "", f"{value}\n", 1
    if (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Call)
        and isinstance(stmt.value.func, ast.Name)
        and stmt.value.func.id == "print"
        and not stmt.value.keywords
    ):
        try:
            values = [ast.literal_eval(arg) for arg in stmt.value.args]
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return "", "", 0
        return " ".join(str(v) for v in values) + "\n", "", 0
    return "", "", 0


def parse_batch(command: str) -> tuple[str, list[str]]:
    """The command's name and arguments (shell-like splitting; unbalanced quotes split on blanks)."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    if not words:
        return "", []
    return words[0], words[1:]


class SimChannel(Channel):
    """A kernel's channel that answers from `simulate_query` / a tiny batch interpreter."""

    def __init__(self, on_output: OutputSink) -> None:
        super().__init__(on_output)
        self.files: list[str] = []  # paths of put_file, in order (the data is discarded)
        self.closed = False
        self._sleeper: asyncio.Task[None] | None = None

    def _finish(self, stdout: str, stderr: str, code: int) -> None:
        if stdout:
            self.feed({"t": "stdout", "d": stdout})
        if stderr:
            self.feed({"t": "stderr", "d": stderr})
        self.feed({"t": "finished", "exit": code})

    async def _start(self, mode: str, code: str) -> None:
        if self.closed:
            raise ChannelError("the kernel was destroyed")
        if mode == "query":
            self._finish(*simulate_query(code))
            return
        name, args = parse_batch(code)
        if name == "true":
            self._finish("", "", 0)
        elif name == "false":
            self._finish("", "", 1)
        elif name == "exit":
            try:
                status = int(args[0]) & 0xFF if args else 0
            except ValueError:
                self._finish("", f"exit: Illegal number: {args[0]}\n", 2)
                return
            self._finish("", "", status)
        elif name == "echo":
            self._finish(" ".join(args) + "\n", "", 0)
        elif name == "sleep":
            try:
                seconds = sum(float(a) for a in args) if args else float("nan")
                if not seconds >= 0:
                    raise ValueError
            except ValueError:
                self._finish("", "sleep: invalid time interval\n", 1)
                return
            self._sleeper = asyncio.create_task(self._sleep(seconds), name="sim-sleep")
        else:
            self._finish("", "", 0)

    async def _sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        self._sleeper = None
        self._finish("", "", 0)

    def _stop_sleeper(self) -> bool:
        task, self._sleeper = self._sleeper, None
        if task is not None and not task.done():
            task.cancel()
            return True
        return False

    async def send_input(self, data: str) -> None:
        pass  # no simulated code ever waits for input

    async def send_eof(self) -> None:
        pass

    async def interrupt(self) -> None:
        if self._stop_sleeper() and self.run_id is not None:
            self._finish("", "", INTERRUPTED)

    async def put_file(self, path: str, data: bytes, mode: int | None = None) -> None:
        if self.closed:
            raise ChannelError("the kernel was destroyed")
        self.files.append(path)

    async def close(self) -> None:
        self.closed = True
        self._stop_sleeper()
        await super().close()


class SimTerminal:
    """A pretend shell for tests: echoes what is typed, says its size on `size`, ends on `exit N`."""

    def __init__(self, rows: int, cols: int) -> None:
        self.out: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.size = (rows, cols)
        self.code: int | None = None
        self.line = b""

    async def read(self) -> bytes | None:
        data = await self.out.get()
        if data is None:
            self.out.put_nowait(None)
        return data

    async def write(self, data: bytes) -> None:
        if self.code is not None:
            return
        self.out.put_nowait(data.replace(b"\r", b"\r\n"))
        self.line += data
        while b"\r" in self.line or b"\n" in self.line:
            cut = min(i for i in (self.line.find(b"\r"), self.line.find(b"\n")) if i >= 0)
            command, self.line = self.line[:cut].decode(errors="replace").split(), self.line[cut + 1 :]
            if command[:1] == ["size"]:
                self.out.put_nowait(f"{self.size[0]} {self.size[1]}\r\n".encode())
            elif command[:1] == ["exit"]:
                self.code = int(command[1]) if len(command) > 1 and command[1].isdigit() else 0
                self.out.put_nowait(None)
                return

    async def resize(self, rows: int, cols: int) -> None:
        self.size = (rows, cols)

    async def wait(self) -> int:
        return self.code if self.code is not None else 129

    async def close(self) -> None:
        if self.code is None:
            self.code = 129  # hung up
            self.out.put_nowait(None)


class SimBackend(BackendBase):
    """Kernels in memory (see the module docstring): for scale tests and benchmarks only."""

    name = "sim"

    def __init__(self, start_delay: float = 0.05, *, image: str = SIM_IMAGE, apps: str = "") -> None:
        self.start_delay = start_delay
        self.image = image
        self.apps_label = apps
        self.app_servers: dict[tuple[str, str], asyncio.Server] = {}  # (kernel id, app) -> echo server
        self.kernels: dict[str, Kernel] = {}
        self.terminals: list[SimTerminal] = []  # every terminal opened (for tests)
        self.created = 0  # kernels created since start, for tests and benchmarks

    async def start(self) -> None:
        pass

    def sampler(self) -> Sampler:
        """Synthetic figures from each session's BAI_SIM_* variables (agent.stats.SimSampler)."""
        from bai.node.agent.stats import SimSampler

        return SimSampler()

    async def images(self) -> list[dict[str, Any]]:
        labels = {apps.LABEL: self.apps_label} if self.apps_label else {}
        return [{"name": self.image, "id": "sim", "size": 0, "labels": labels}]

    async def start_app(self, kernel: Kernel, app: ServicePort, timeout: float) -> dict[str, Any]:
        key = (kernel.spec.kernel_id, app.name)
        if key in self.app_servers:
            return {"ok": True, "started": False}
        if app.name == "broken":
            error = "broken exited with code 1 while starting"
            return {"ok": False, "started": False, "error": error, "output": "boom\n"}

        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while data := await reader.read(256 * 1024):
                    writer.write(data)
                    await writer.drain()
                writer.write_eof()
            except (ConnectionError, OSError):
                pass
            finally:
                writer.close()

        self.app_servers[key] = await asyncio.start_server(echo, "127.0.0.1", 0)
        return {"ok": True, "started": True}

    async def connect_app(self, kernel: Kernel, app: ServicePort) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        server = self.app_servers.get((kernel.spec.kernel_id, app.name))
        if server is None:
            raise ChannelError(f"nothing listens on port {app.port} in the kernel (is {app.name} started?)")
        port = server.sockets[0].getsockname()[1]
        return await asyncio.open_connection("127.0.0.1", port)

    async def open_terminal(self, kernel: Kernel, command: list[str], rows: int, cols: int) -> SimTerminal:
        terminal = SimTerminal(rows, cols)
        self.terminals.append(terminal)
        return terminal

    async def list_files(self, kernel: Kernel, path: str) -> dict[str, Any]:
        """The names put_file received (sizes unknown: the data was discarded), for /home/work."""
        import json

        channel = kernel.channel
        names = sorted(getattr(channel, "files", [])) if path.rstrip("/") in ("/home/work", "", ".") else []
        files = [
            {"filename": n, "size": 0, "mode": "-rw-r--r--", "mtime": 0.0, "ctime": 0.0, "atime": 0.0} for n in names
        ]
        return {"files": json.dumps(files), "errors": "", "abspath": "/home/work"}

    async def download(self, kernel: Kernel, path: str, limit: int) -> bytes:
        """An archive of an uploaded file (empty: the data was discarded); ChannelError for any other path."""
        import io
        import tarfile

        name = path.removeprefix("/home/work/")
        if name not in getattr(kernel.channel, "files", []):
            raise ChannelError(f"{path}: no such file or folder")
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            tar.addfile(tarfile.TarInfo(name.rsplit("/", 1)[-1]), io.BytesIO(b""))
        return buffer.getvalue()

    async def create(self, spec: KernelSpec, on_output: OutputSink) -> Kernel:
        if self.start_delay > 0:
            await asyncio.sleep(self.start_delay)
        kernel = Kernel(spec=spec, channel=SimChannel(on_output), run_dir=SIM_RUN_DIR / spec.kernel_id)
        kernel.container_id = f"sim-{spec.kernel_id[:12]}"
        kernel.service_ports = apps.parse(self.apps_label)
        self.kernels[spec.kernel_id] = kernel
        self.created += 1
        return kernel

    async def destroy(self, kernel: Kernel) -> None:
        kernel.destroying = True
        self.kernels.pop(kernel.spec.kernel_id, None)
        for key in [k for k in self.app_servers if k[0] == kernel.spec.kernel_id]:
            self.app_servers.pop(key).close()
        what = f"the channel of simulated kernel {kernel.spec.kernel_id}"  # nothing real: no remedy needed
        with leftovers.step(what, action="close", gone=(), left_behind=False):
            await kernel.channel.close()
        kernel.set_exit(137)

    async def adopt(self, on_output: OutputSink) -> list[Kernel]:
        return []  # simulated kernels do not outlive their process

    async def close(self, kernels: list[Kernel]) -> None:
        every = {id(k): k for k in [*kernels, *self.kernels.values()]}
        for kernel in every.values():
            await self.destroy(kernel)

    # -- accounting (nothing is enforced) ------------------------------------------------------

    def occupied(self) -> dict[str, Decimal]:
        total: dict[str, Decimal] = {}
        for kernel in self.kernels.values():
            total = slotlib.add(total, kernel.spec.slots)
        return total

    def environ(self, kernel: Kernel) -> dict[str, str]:
        """What the kernel's environment would be (BACKENDAI_* and the session's variables)."""
        return kernel_env(kernel.spec)


__all__ = ["SimBackend", "SimChannel", "simulate_query", "parse_batch"]
