"""Apps in kernels, agent side: starting one on first use and serving tunnels to it over link streams.

A tunnel is one TCP connection to an app's port inside a kernel (the backend makes it: through the
kernel's runner, so no network is needed), relayed over a link stream to the manager, which relays it to
the client's WebSocket. Frames both ways: {"t": "data", "d": bytes}, {"t": "eof"} (that direction is done).
The stream's flow control bounds what is in flight, so a saturated tunnel waits instead of flooding the
link; a tunnel ends when both directions are done, either side closes, or the kernel ends.

Kernels of a multi-node cluster session on different agents reach each other the same way
(bai/common/cluster.py): the peer proxy standing in for the far kernel on the session's network hands the
connection to its agent through a local kernel's socket (agent.py `dial`), which
relays it over a `peer-dialed` stream that the manager (manager/peers.py) pipes to a `peer-tunnel` stream
on the target kernel's agent: `serve_peer` connects that one to the port in the target kernel. Two kernels
of a session on the same agent are spliced here directly (`splice`), without the manager.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from bai.common.cluster import CLUSTER_PORTS, SSH_PORT
from bai.common.service_ports import TOKEN, ServicePort
from bai.node.agent.backends.base import Backend, Kernel, KernelStartError
from bai.node.agent.channel import ChannelError
from bai.node.link.streams import MAX_FRAME, LinkStream, StreamClosed

log = logging.getLogger("bai.agent.apps")
READ_SIZE = min(MAX_FRAME, 256 * 1024)
MAX_TUNNELS = 256  # per kernel: each is a connection a client holds open
MAX_PEER_TUNNELS = 256  # per kernel: connections other kernels of its session hold open to it


class AppError(Exception):
    """An app cannot be started or reached; the message says why (and the app's output, when it failed)."""


SSHD = "sshd"  # the app Backend.AI's `ssh` / `scp` tunnel to (tcp, SSH_PORT in the kernel)


def offered(kernel: Kernel) -> list[ServicePort]:
    """The kernel's apps: its image's (`service_ports`), and `sshd` (tcp, SSH_PORT) where the kernel's runner
    said in its hello that it offers its session's owner an sshd (it made the owner's keypair: runner.py, "SSH
    for the session's owner"), unless the image declares an app of that name or port itself. The hello is the
    kernel's word: believing it offers nothing beyond a port of the kernel's own, to the session's owner."""
    apps = list(kernel.service_ports)
    hello = getattr(kernel.channel, "hello", None)
    if isinstance(hello, dict) and hello.get("sshd") is True:
        if not any(sp.name == SSHD or SSH_PORT in sp.container_ports for sp in apps):
            apps.append(ServicePort(SSHD, "tcp", (SSH_PORT,)))
    return apps


def find_app(kernel: Kernel, name: str) -> ServicePort:
    apps = offered(kernel)
    for sp in apps:
        if sp.name == name:
            return sp
    names = ", ".join(sp.name for sp in apps) or "none"
    raise AppError(f"the kernel offers no app {name!r} (its apps: {names})")


class Apps:
    """Starts apps and serves tunnels for the agent's kernels."""

    def __init__(self, backend: Backend, start_timeout: float = 60.0) -> None:
        self.backend = backend
        self.start_timeout = start_timeout
        self.tunnels: dict[str, int] = {}  # kernel id -> tunnels open to it
        self.peer_tunnels: dict[str, int] = {}  # kernel id -> connections of its session's other kernels to it

    async def start(self, kernel: Kernel, name: str) -> dict[str, Any]:
        app = find_app(kernel, name)
        try:
            reply = await self.backend.start_app(kernel, app, self.start_timeout)
        except ChannelError as e:
            return {"ok": False, "started": False, "error": str(e), "output": ""}
        token = reply.get("token")
        return {
            "ok": bool(reply.get("ok")),
            "started": bool(reply.get("started")),
            "error": str(reply.get("error") or ""),
            "output": str(reply.get("output") or "")[-4096:],
            # the app's secret, for the manager to show its session's owner (never logged)
            "token": token if isinstance(token, str) and TOKEN.fullmatch(token) else "",
        }

    async def serve(self, kernel: Kernel, name: str, stream: LinkStream) -> None:
        """Connect to the app and relay until the tunnel ends. A failure closes the stream with the reason."""
        async with _slot(self.tunnels, kernel, MAX_TUNNELS) as ok:
            if not ok:
                await stream.close(f"a kernel has at most {MAX_TUNNELS} app connections open at once")
                return
            try:
                app = find_app(kernel, name)
                reader, writer = await self._connect(kernel, app)
            except (AppError, ChannelError, KernelStartError, OSError) as e:
                await stream.close(str(e) or type(e).__name__)
                return
            await relay(reader, writer, stream, kernel.exited)

    async def serve_peer(self, kernel: Kernel, port: int, stream: LinkStream) -> None:
        """A `peer-tunnel` stream: relay it to TCP `port` in the kernel (one of CLUSTER_PORTS) until it ends.
        A failure closes the stream with the reason."""
        if port not in CLUSTER_PORTS:
            await stream.close(f"port {port} is not one a cluster's kernels reach each other on")
            return
        async with _slot(self.peer_tunnels, kernel, MAX_PEER_TUNNELS) as ok:
            if not ok:
                await stream.close(f"a kernel has at most {MAX_PEER_TUNNELS} connections of other kernels open")
                return
            try:
                reader, writer = await kernel.channel.open_tunnel(port)
            except (ChannelError, OSError) as e:
                await stream.close(str(e) or type(e).__name__)
                return
            await relay(reader, writer, stream, kernel.exited)

    async def splice_peer(
        self, source: Kernel, target: Kernel, port: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """A connection of kernel `source` to `port` in `target`, a kernel of its session on this agent:
        connected through the target's runner and spliced until both ways end (the caller closes `writer`)."""
        async with _slot(self.peer_tunnels, target, MAX_PEER_TUNNELS) as ok:
            if not ok:
                log.warning("kernel %s has too many peer connections: one is refused", target.spec.kernel_id)
                return
            try:
                far_reader, far_writer = await target.channel.open_tunnel(port)
            except (ChannelError, OSError) as e:
                log.info(
                    "kernel %s cannot reach port %d of kernel %s: %s",
                    source.spec.kernel_id,
                    port,
                    target.spec.kernel_id,
                    e,
                )
                return
            await splice((reader, writer), (far_reader, far_writer), [source.exited, target.exited])

    async def _connect(self, kernel: Kernel, app: ServicePort) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to the app; one that is not listening (it went away since it was started) is
        started again first."""
        try:
            return await self.backend.connect_app(kernel, app)
        except ChannelError as first:
            reply = await self.start(kernel, app.name)
            if not reply["ok"]:
                output = f"\n{reply['output'].rstrip()}" if reply["output"].strip() else ""
                raise AppError(f"{app.name} did not start: {reply['error']}{output}") from first
            return await self.backend.connect_app(kernel, app)


@contextlib.asynccontextmanager
async def _slot(counts: dict[str, int], kernel: Kernel, limit: int) -> AsyncIterator[bool]:
    """One of the kernel's `limit` places in `counts` (kernel id -> connections open) while the body runs
    (False: none is free)."""
    kid = kernel.spec.kernel_id
    if counts.get(kid, 0) >= limit:
        yield False
        return
    counts[kid] = counts.get(kid, 0) + 1
    try:
        yield True
    finally:
        counts[kid] -= 1
        if not counts[kid]:
            del counts[kid]


async def relay(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, stream: LinkStream, kernel_exited: asyncio.Future[int]
) -> None:
    """Bytes between the app's connection and the stream, both ways, until both are done."""

    async def upstream() -> None:  # client -> app
        while (frame := await stream.receive()) is not None:
            kind = frame.get("t")
            if kind == "data":
                data = frame.get("d")
                if isinstance(data, bytes | bytearray) and data:
                    writer.write(data)
                    await writer.drain()
            elif kind == "eof":
                if writer.can_write_eof():
                    writer.write_eof()
                return
        raise StreamClosed(stream.closed_reason or "closed")

    async def downstream() -> None:  # app -> client
        while data := await reader.read(READ_SIZE):
            await stream.send({"t": "data", "d": data})
        await stream.send({"t": "eof"})

    up = asyncio.create_task(upstream(), name="tunnel-up")
    down = asyncio.create_task(downstream(), name="tunnel-down")
    ended = asyncio.ensure_future(asyncio.shield(kernel_exited))
    reason = ""
    try:
        pending: set[asyncio.Future[Any]] = {up, down, ended}
        while up in pending or down in pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if ended in done:
                reason = "the kernel ended"
                break
            failed = [t for t in done if t is not ended and t.exception() is not None]
            if failed:
                exc = failed[0].exception()
                if not isinstance(exc, StreamClosed):  # the client's side closed: nothing to tell it
                    reason = f"the app's connection failed: {exc}"
                break
    finally:
        for task in (up, down, ended):
            task.cancel()
        for task in (up, down):
            with contextlib.suppress(asyncio.CancelledError, StreamClosed, ConnectionError, OSError):
                await task
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
        await stream.close(reason)


async def splice(
    a: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    b: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ended: list[asyncio.Future[int]],
) -> None:
    """Bytes between two connections, both ways (an EOF one way shuts the other's writing down), until both
    ways are done, either fails, or one of `ended` (the kernels' exits) is done; then both are closed."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(READ_SIZE):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()

    ways = [asyncio.create_task(pipe(a[0], b[1]), name="splice"), asyncio.create_task(pipe(b[0], a[1]), name="splice")]
    exits = [asyncio.ensure_future(asyncio.shield(f)) for f in ended]
    try:
        pending: set[asyncio.Future[Any]] = {*ways, *exits}
        while any(w in pending for w in ways):
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if any(f in done for f in exits) or any(w in done and w.exception() is not None for w in ways):
                break
    finally:
        started: tuple[asyncio.Future[Any], ...] = (*ways, *exits)
        for task in started:
            task.cancel()
        for task in ways:
            with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
                await task
        for _, writer in (a, b):
            writer.close()
