"""The Docker backend: one container per kernel, through aiodocker.

Each container gets the kernel's labels, enforced limits (cpu → NanoCpus, mem → Memory with no
swap, a pids limit), `--network none` unless configured otherwise, the runner mounted read-only at
/opt/bai/runner.py and a per-kernel folder at /opt/bai/run holding the runner's Unix socket (so
exec works without any network). Images without Python run batch commands through docker exec.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import shutil
import signal
import tarfile
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiodocker
from aiodocker.exceptions import DockerError

from bai.node.agent.backends.base import Dotfile, Kernel, KernelSpec, KernelStartError, connect_runner, kernel_env
from bai.node.agent.channel import Channel, ChannelError, wait_for_socket
from bai.node.agent.files import list_script

LABEL_KERNEL = "ai.backend.kernel-id"
LABEL_SESSION = "ai.backend.session-id"
LABEL_AGENT = "bai.agent-id"

# Start the runner with the image's Python, or idle (batch commands then use docker exec).
ENTRYPOINT = (
    "for p in python3 python; do "
    'if command -v "$p" >/dev/null 2>&1; then '
    'exec "$p" -u /opt/bai/runner.py --socket /opt/bai/run/runner.sock --workdir /home/work; fi; done; '
    "echo no python in this image > /opt/bai/run/nopython; "
    "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done"
)


def gpus_from_labels(labels: dict[str, str]) -> list[tuple[str, Decimal]]:
    """The GPUs a kernel's container holds, from its `bai.gpus` label (to rebuild the agent's map)."""
    return [(u, Decimal(a)) for u, a in json.loads(labels.get("bai.gpus") or "[]")]


def dotfiles_tar(dotfiles: list[Dotfile], user: str) -> bytes:
    """A tar of the dotfiles (and their folders) for /home/work, owned by the kernel's user."""
    uid, _, gid = (user or "0:0").partition(":")
    owner = {"uid": int(uid) if uid.isdigit() else 0, "gid": int(gid) if gid.isdigit() else 0}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        dirs: set[str] = set()
        for f in dotfiles:
            parts = f.path.strip("/").split("/")
            for i in range(1, len(parts)):
                folder = "/".join(parts[:i])
                if folder not in dirs:
                    dirs.add(folder)
                    info = tarfile.TarInfo(folder)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    info.uid, info.gid = owner["uid"], owner["gid"]
                    tar.addfile(info)
            data = f.data.encode()
            info = tarfile.TarInfo("/".join(parts))
            info.size, info.mode = len(data), f.mode
            info.uid, info.gid = owner["uid"], owner["gid"]
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class DockerUnavailable(Exception):
    pass


async def docker_available(timeout: float = 3.0) -> bool:
    try:
        docker = aiodocker.Docker()
    except Exception:
        return False
    try:
        await asyncio.wait_for(docker.version(), timeout)
        return True
    except Exception:
        return False
    finally:
        await docker.close()


class DockerBackend:
    name = "docker"

    def __init__(
        self,
        agent_id: str,
        kernels_dir: Path,
        runner_path: Path,
        *,
        network: str = "none",
        pids_limit: int = 4096,
        labels: dict[str, str] | None = None,
        start_timeout: float = 30.0,
        user: str = "",
    ) -> None:
        self.agent_id = agent_id
        self.user = user
        self.kernels_dir = kernels_dir
        self.runner_path = runner_path
        self.network = network
        self.pids_limit = pids_limit
        self.labels = dict(labels or {})
        self.start_timeout = start_timeout
        self.docker: aiodocker.Docker | None = None

    async def start(self) -> None:
        self.kernels_dir.mkdir(parents=True, exist_ok=True)
        self.docker = aiodocker.Docker()
        try:
            await asyncio.wait_for(self.docker.version(), 5)
        except Exception as e:
            await self.docker.close()
            raise DockerUnavailable(f"the Docker daemon does not answer: {e}") from None

    async def images(self) -> list[dict[str, Any]]:
        assert self.docker is not None
        out = []
        for img in await self.docker.images.list():
            for tag in img.get("RepoTags") or []:
                if tag != "<none>:<none>":
                    labels = img.get("Labels") or {}
                    out.append({"name": tag, "id": img["Id"], "size": img.get("Size", 0), "labels": labels})
        return sorted(out, key=lambda i: i["name"])

    def _container_config(self, spec: KernelSpec, run_dir: Path) -> dict[str, Any]:
        env = kernel_env(spec)
        host: dict[str, Any] = {
            "Binds": [
                f"{self.runner_path}:/opt/bai/runner.py:ro",
                f"{run_dir}:/opt/bai/run:rw",
                *(f"{m.host_path}:{m.target}:{'ro' if m.read_only else 'rw'}" for m in spec.mounts),
            ],
            "NetworkMode": spec.network or self.network,
            "PidsLimit": self.pids_limit,
        }
        if spec.gpus:  # the NVIDIA container runtime gives the container exactly these devices
            host["DeviceRequests"] = [
                {"Driver": "nvidia", "DeviceIDs": [u for u, _ in spec.gpus], "Capabilities": [["gpu"]]}
            ]
        cpu, mem = spec.slots.get("cpu"), spec.slots.get("mem")
        if cpu:
            host["NanoCpus"] = int(cpu * 1_000_000_000)
        if mem:
            host["Memory"] = int(mem)
            host["MemorySwap"] = int(mem)
        labels = {
            **self.labels,
            LABEL_KERNEL: spec.kernel_id,
            LABEL_SESSION: spec.session_id,
            LABEL_AGENT: self.agent_id,
            "bai.session-name": spec.session_name,
            "bai.cluster-role": spec.cluster_role,
        }
        if spec.gpus:  # the agent rebuilds its GPU map from these after a restart
            labels["bai.gpus"] = json.dumps([[u, str(a)] for u, a in spec.gpus])
        config: dict[str, Any] = {
            "Image": spec.image,
            "Entrypoint": ["/bin/sh", "-c", ENTRYPOINT],
            "Cmd": [],
            "Env": [f"{k}={v}" for k, v in env.items()],
            "Labels": labels,
            "WorkingDir": "/home/work",
            "Hostname": f"{spec.cluster_role}{spec.cluster_idx}",
            "HostConfig": host,
        }
        if self.user:
            config["User"] = self.user
        return config

    async def create(self, spec: KernelSpec, on_output) -> Kernel:
        assert self.docker is not None
        loop = asyncio.get_running_loop()
        run_dir = self.kernels_dir / spec.kernel_id / "run"
        run_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(run_dir, 0o777)  # the kernel may run as any user
        try:
            container = await self.docker.containers.create(
                self._container_config(spec, run_dir), name=f"bai-{spec.kernel_id}"
            )
        except DockerError as e:
            shutil.rmtree(run_dir.parent, ignore_errors=True)
            if e.status == 404:
                raise KernelStartError(f"image {spec.image!r} not found on agent {self.agent_id}") from None
            raise KernelStartError(f"cannot create the container: {e.message}") from None
        exited: asyncio.Future[int] = loop.create_future()
        try:
            if spec.dotfiles:
                await container.put_archive("/home/work", dotfiles_tar(spec.dotfiles, self.user))
            await container.start()
            watcher = asyncio.create_task(self._watch(container, exited))
            deadline = loop.time() + self.start_timeout
            mode = await wait_for_socket(run_dir, deadline, exited)
            if mode == "runner":
                channel: Channel = await connect_runner(run_dir, on_output, deadline, exited)
            else:
                channel = ExecChannel(self.docker, container.id, on_output)
        except asyncio.CancelledError:  # the manager gave up waiting: leave nothing behind
            with contextlib.suppress(DockerError):
                await asyncio.shield(container.delete(force=True))
            shutil.rmtree(run_dir.parent, ignore_errors=True)
            raise
        except (ChannelError, DockerError) as e:
            detail = await self._tail(container)
            with contextlib.suppress(DockerError):
                await container.delete(force=True)
            shutil.rmtree(run_dir.parent, ignore_errors=True)
            reason = e.message if isinstance(e, DockerError) else str(e)
            if exited.done():
                reason = f"the container exited with code {exited.result()} while starting"
            raise KernelStartError(f"{reason}{': ' + detail if detail else ''}") from None
        kernel = Kernel(spec=spec, channel=channel, run_dir=run_dir, container_id=container.id)
        self._link_exit(kernel, exited, watcher)
        return kernel

    def _link_exit(self, kernel: Kernel, exited: asyncio.Future[int], watcher: asyncio.Task[None]) -> None:
        kernel.watcher = watcher
        exited.add_done_callback(lambda f: kernel.set_exit(f.result()))

    async def _watch(self, container: Any, exited: asyncio.Future[int]) -> None:
        code = 137
        try:
            result = await container.wait()
            code = int(result.get("StatusCode", 137))
        except DockerError as e:
            if e.status != 404:
                code = 137
        except asyncio.CancelledError:
            return
        if not exited.done():
            exited.set_result(code)

    async def _tail(self, container: Any) -> str:
        with contextlib.suppress(Exception):
            lines = await container.log(stdout=True, stderr=True, tail=5)
            return "".join(lines).strip()[-400:]
        return ""

    async def destroy(self, kernel: Kernel) -> None:
        assert self.docker is not None
        kernel.destroying = True
        await kernel.channel.close()
        if kernel.container_id:
            with contextlib.suppress(DockerError):
                await self.docker.containers.container(kernel.container_id).delete(force=True)
        if kernel.watcher is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(kernel.watcher, 5)
        kernel.set_exit(137)
        shutil.rmtree(kernel.run_dir.parent, ignore_errors=True)

    async def adopt(self, on_output) -> list[Kernel]:
        """Re-attach to this agent's running containers; remove its dead ones."""
        assert self.docker is not None
        loop = asyncio.get_running_loop()
        found = await self.docker.containers.list(all=True, filters={"label": [f"{LABEL_AGENT}={self.agent_id}"]})
        kernels = []
        for c in found:
            info = c._container
            labels = info.get("Labels") or {}
            kid = labels.get(LABEL_KERNEL)
            run_dir = self.kernels_dir / str(kid) / "run"
            if not kid or info.get("State") != "running" or not run_dir.exists():
                with contextlib.suppress(DockerError):
                    await c.delete(force=True)
                continue
            container = self.docker.containers.container(c.id)
            exited: asyncio.Future[int] = loop.create_future()
            watcher = asyncio.create_task(self._watch(container, exited))
            try:
                if (run_dir / "runner.sock").exists():
                    channel: Channel = await connect_runner(run_dir, on_output, loop.time() + 5, exited)
                else:
                    channel = ExecChannel(self.docker, c.id, on_output)
            except ChannelError:
                watcher.cancel()
                with contextlib.suppress(DockerError):
                    await c.delete(force=True)
                continue
            spec = KernelSpec(
                kernel_id=kid,
                session_id=labels.get(LABEL_SESSION, ""),
                session_name=labels.get("bai.session-name", ""),
                access_key="",
                image=info.get("Image", ""),
                slots={},
                environ={},
                gpus=gpus_from_labels(labels),
            )
            kernel = Kernel(spec=spec, channel=channel, run_dir=run_dir, container_id=c.id)
            self._link_exit(kernel, exited, watcher)
            kernels.append(kernel)
        return kernels

    async def has_image(self, image: str) -> bool:
        assert self.docker is not None
        try:
            await self.docker.images.inspect(image)
        except DockerError as e:
            if e.status == 404:
                return False
            raise
        return True

    async def pull(self, image: str, progress=None) -> dict[str, Any]:
        """`docker pull` with progress: `progress(done_bytes, total_bytes)` as layers download."""
        assert self.docker is not None
        layers: dict[str, tuple[int, int]] = {}
        try:
            async for event in self.docker.images.pull(image, stream=True, timeout=None):
                detail = event.get("progressDetail") or {}
                if event.get("id") and detail.get("total"):
                    layers[event["id"]] = (int(detail.get("current", 0)), int(detail["total"]))
                elif event.get("id") and event.get("status") in ("Download complete", "Pull complete"):
                    done = layers.get(event["id"])
                    if done:
                        layers[event["id"]] = (done[1], done[1])
                if progress is not None:
                    await progress(sum(c for c, _ in layers.values()), sum(t for _, t in layers.values()))
        except DockerError as e:
            raise KernelStartError(f"cannot pull {image}: {e.message}") from None
        info = await self.docker.images.inspect(image)
        return {
            "name": image,
            "id": info["Id"],
            "size": info.get("Size", 0),
            "labels": info["Config"].get("Labels") or {},
        }

    async def remove_image(self, image: str) -> None:
        assert self.docker is not None
        try:
            await self.docker.images.delete(image)
        except DockerError as e:
            raise KernelStartError(f"cannot remove {image}: {e.message}") from None

    async def list_files(self, kernel: Kernel, path: str) -> dict[str, Any]:
        """Run the listing with the container's Python, so it sees the kernel's files and mounts."""
        assert self.docker is not None
        container = self.docker.containers.container(kernel.container_id)
        try:
            run = await container.exec(["python3", "-c", list_script(), path], workdir="/home/work")
            stream = run.start(detach=False)
            out, err = b"", b""
            async with stream:
                while (msg := await stream.read_out()) is not None:
                    if msg.stream == 1:
                        out += msg.data
                    else:
                        err += msg.data
        except DockerError as e:
            return {"files": "[]", "errors": f"cannot list files: {e.message}", "abspath": path}
        try:
            return json.loads(out)
        except ValueError:
            detail = err.decode(errors="replace").strip()[-300:] or "no Python in this image?"
            return {"files": "[]", "errors": f"cannot list files: {detail}", "abspath": path}

    async def close(self, kernels: list[Kernel]) -> None:
        # Containers keep running; the next start of this agent re-adopts them.
        for kernel in kernels:
            await kernel.channel.close()
            if kernel.watcher is not None:
                kernel.watcher.cancel()
        if self.docker is not None:
            await self.docker.close()


class ExecChannel(Channel):
    """Batch commands through `docker exec`, for images without Python."""

    supports_query = False

    def __init__(self, docker: aiodocker.Docker, container_id: str, on_output) -> None:
        super().__init__(on_output)
        self.docker = docker
        self.container_id = container_id
        self._task: asyncio.Task[None] | None = None
        self._stream: Any = None
        self._exec: Any = None

    async def _start(self, mode: str, code: str) -> None:
        container = self.docker.containers.container(self.container_id)
        self._exec = await container.exec(["/bin/sh", "-c", code], stdin=True, workdir="/home/work")
        self._stream = self._exec.start(detach=False)
        await self._stream._init()
        self._task = asyncio.create_task(self._pump())

    async def _pump(self) -> None:
        code = 1
        try:
            while (msg := await self._stream.read_out()) is not None:
                self.feed({"t": "stdout" if msg.stream == 1 else "stderr", "d": msg.data.decode(errors="replace")})
            info = await self._exec.inspect()
            code = info.get("ExitCode") or 0
        except Exception as e:  # the container went away
            self.feed({"t": "stderr", "d": f"\n[{e}]\n"})
            code = 137
        finally:
            with contextlib.suppress(Exception):
                await self._stream.close()
            self.feed({"t": "finished", "exit": code})

    async def send_input(self, data: str) -> None:
        if self._stream is not None:
            await self._stream.write_in((data if data.endswith("\n") else data + "\n").encode())

    async def interrupt(self) -> None:
        if self._exec is not None:
            info = await self._exec.inspect()
            pid = info.get("Pid")
            if pid:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGINT)

    async def put_file(self, path: str, data: bytes) -> None:
        import io
        import tarfile

        if path.startswith("/") or ".." in Path(path).parts:
            raise ChannelError(f"cannot write {path}: the path must stay inside /home/work")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo(path)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
        await self.docker.containers.container(self.container_id).put_archive("/home/work", buf.getvalue())

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
        await super().close()
