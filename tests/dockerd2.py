"""A second Docker daemon beside the first, for kernels on two daemons (multi-node cluster sessions).

It runs with its own socket, data root, exec root, pid file and containerd (namespaced apart), on a
bridge of its own (`br2`, 172.31.250.1/24: created when absent, reused when present, and left in place
afterwards: it is inert and the next run reuses it). Never `--bridge none`: that deletes the first
daemon's docker0. It runs with `--iptables=false` so that it never touches the first daemon's rules
(kernels of multi-node sessions have no network, so it needs none).

An agent uses it through DOCKER_HOST (aiodocker reads it): `Node(..., env={"DOCKER_HOST": url})`.

Under pytest-xdist every worker that asks for it shares one daemon: the first starts it and loads the
images (`docker save | docker -H … load`, once per image), the last one to let go stops it. The daemon's
folders live under /tmp (a unix socket path must stay short); its state file and lock under pytest's
shared temp root.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

BRIDGE = "br2"
BRIDGE_ADDR = "172.31.250.1/24"
NAMESPACE = "bai-dockerd2"


def unavailable() -> str | None:
    """None when a second daemon can be started here, else why not."""
    if os.geteuid() != 0:
        return "a second dockerd needs root"
    for tool in ("dockerd", "docker", "ip"):
        if shutil.which(tool) is None:
            return f"{tool} not found"
    return None


def ensure_bridge(name: str = BRIDGE, addr: str = BRIDGE_ADDR) -> None:
    """The second daemon's bridge, up and addressed (created when absent)."""
    if subprocess.run(["ip", "link", "show", name], capture_output=True).returncode != 0:
        out = subprocess.run(["ip", "link", "add", name, "type", "bridge"], capture_output=True, text=True)
        # another process may have created it meanwhile
        if out.returncode != 0 and "File exists" not in out.stderr:
            raise RuntimeError(f"ip link add {name}: {out.stderr.strip()}")
    have = subprocess.run(["ip", "-o", "addr", "show", "dev", name], capture_output=True, text=True).stdout
    if f" {addr} " not in have:
        out = subprocess.run(["ip", "addr", "add", addr, "dev", name], capture_output=True, text=True)
        if out.returncode != 0 and "File exists" not in out.stderr:
            raise RuntimeError(f"ip addr add {addr} dev {name}: {out.stderr.strip()}")
    subprocess.run(["ip", "link", "set", name, "up"], check=True, capture_output=True)


class SecondDockerd:
    """One extra dockerd: start(), load(images), host (the DOCKER_HOST URL), stop()."""

    def __init__(self, base: Path, pid: int | None = None) -> None:
        self.base = base
        self.sock = base / "docker.sock"
        self.host = f"unix://{self.sock}"
        self.data_root = base / "data"
        self.exec_root = base / "exec"
        self.pidfile = base / "docker.pid"
        self.log = base / "dockerd.log"
        self.pid = pid

    @classmethod
    def create(cls) -> SecondDockerd:
        return cls(Path(tempfile.mkdtemp(prefix="bai-d2-", dir="/tmp")))

    def docker(self, *args: str, timeout: float = 60, check: bool = False) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(["docker", "-H", self.host, *args], capture_output=True, text=True, timeout=timeout)
        if check and out.returncode != 0:
            raise RuntimeError(f"docker -H {self.host} {' '.join(args)}: {out.stderr.strip()}")
        return out

    def answers(self) -> bool:
        try:
            return self.docker("version", "--format", "{{.Server.Version}}", timeout=10).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def alive(self) -> bool:
        """Whether the daemon process runs (a zombie does not: under xdist the worker that stops it may not
        be its parent, which reaps it only when that worker exits)."""
        if self.pid is None:
            return False
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except OSError:
            return False
        return stat.rpartition(")")[2].split()[0] != "Z"

    def start(self, timeout: float = 60.0) -> SecondDockerd:
        ensure_bridge()
        config = self.base / "daemon.json"
        config.write_text("{}\n")  # not /etc/docker/daemon.json: its hosts or bridge would clash
        cmd = [
            "dockerd",
            "--host",
            self.host,
            "--data-root",
            str(self.data_root),
            "--exec-root",
            str(self.exec_root),
            "--pidfile",
            str(self.pidfile),
            "--config-file",
            str(config),
            "--bridge",
            BRIDGE,
            "--iptables=false",
            "--containerd-namespace",
            NAMESPACE,
            "--containerd-plugins-namespace",
            f"{NAMESPACE}-plugins",
        ]
        with self.log.open("ab") as log:
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        self.pid = proc.pid
        deadline = time.monotonic() + timeout
        while not self.answers():
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log.read_text(errors="replace")[-3000:]
                self.stop()
                raise RuntimeError(f"the second dockerd did not come up (exit {proc.poll()}):\n{tail}")
            time.sleep(0.1)
        return self

    def load(self, images: Sequence[str]) -> None:
        """Copy images from the first daemon, those it lacks."""
        copy_images(self.host, images)

    def remove_containers(self) -> None:
        if not self.answers():
            return
        ids = self.docker("ps", "-aq").stdout.split()
        if ids:
            self.docker("rm", "-f", *ids, timeout=120)

    def stop(self) -> None:
        """Remove its containers, stop it (SIGTERM, then SIGKILL), unmount what it left and remove its folders."""
        try:
            self.remove_containers()
        except subprocess.TimeoutExpired:
            pass
        if self.alive():
            assert self.pid is not None
            os.kill(self.pid, signal.SIGTERM)
            deadline = time.monotonic() + 30
            while self.alive() and time.monotonic() < deadline:
                _reap(self.pid)
                time.sleep(0.1)
            if self.alive():
                os.kill(self.pid, signal.SIGKILL)
                time.sleep(0.5)
                _reap(self.pid)
        # overlay, shm and netns mounts under its folders (a clean shutdown leaves none; a killed one may)
        prefix = str(self.base) + "/"
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
        for mount in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
            subprocess.run(["umount", "-l", mount], capture_output=True)
        shutil.rmtree(self.base, ignore_errors=True)


def copy_images(host: str, images: Sequence[str]) -> None:
    """Copy images from the first daemon to the one at `host` (`docker save | docker -H … load`), those it lacks."""
    for image in images:
        if subprocess.run(["docker", "-H", host, "image", "inspect", image], capture_output=True).returncode == 0:
            continue
        save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert save.stdout is not None
        load = subprocess.run(["docker", "-H", host, "load", "-q"], stdin=save.stdout, capture_output=True, timeout=300)
        save.stdout.close()
        _, save_err = save.communicate(timeout=60)
        if save.returncode != 0 or load.returncode != 0:
            raise RuntimeError(
                f"copying {image} to the daemon at {host} failed: {save_err.decode(errors='replace')}"
                f" {load.stderr.decode(errors='replace')}"
            )


def _reap(pid: int) -> None:
    """Collect the daemon's exit status when this process started it (else it stays a zombie)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextmanager
def shared_dockerd(state_root: Path, images: Sequence[str]) -> Iterator[SecondDockerd]:
    """A second dockerd holding `images`, shared by every process that passes the same `state_root` (pytest's
    temp root, common to the xdist workers of a run): started by the first, stopped by the last to leave."""
    lock = state_root / "dockerd2.lock"
    state_file = state_root / "dockerd2.json"
    me = f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-{os.getpid()}"
    with _locked(lock):
        state = json.loads(state_file.read_text()) if state_file.exists() else None
        daemon = SecondDockerd(Path(state["base"]), state["pid"]) if state else None
        if daemon is None or not daemon.alive() or not daemon.answers():
            if daemon is not None:
                daemon.stop()
            daemon = SecondDockerd.create().start()
            state = {"base": str(daemon.base), "pid": daemon.pid, "users": []}
        try:
            daemon.load(images)
        except BaseException:
            if not state["users"]:
                daemon.stop()
                state_file.unlink(missing_ok=True)
            raise
        state["users"].append(me)
        state_file.write_text(json.dumps(state))
    try:
        yield daemon
    finally:
        with _locked(lock):
            state = json.loads(state_file.read_text()) if state_file.exists() else {"users": []}
            users = list(state["users"])
            if me in users:
                users.remove(me)  # (one entry: the same process may hold it twice)
            if users:
                state_file.write_text(json.dumps({**state, "users": users}))
            else:
                daemon.stop()
                state_file.unlink(missing_ok=True)


def docker_ps(host: str, label: str) -> list[str]:
    """Ids of the containers (any state) with `label` on the daemon at `host` (a DOCKER_HOST URL)."""
    out = subprocess.run(
        ["docker", "-H", host, "ps", "-aq", "--filter", f"label={label}"], capture_output=True, text=True, check=True
    )
    return out.stdout.split()


if __name__ == "__main__":  # a quick manual check: start, load the python image, run a container, stop
    import sys

    t0 = time.monotonic()
    d = SecondDockerd.create().start()
    t1 = time.monotonic()
    try:
        d.load(sys.argv[1:] or ["bai-python:3.11"])
        t2 = time.monotonic()
        print(f"up in {t1 - t0:.2f} s, images loaded in {t2 - t1:.2f} s; DOCKER_HOST={d.host}")
        image = (sys.argv[1:] or ["bai-python:3.11"])[0]
        print(d.docker("run", "--rm", "--network", "none", image, "echo", "ok").stdout)
    finally:
        d.stop()
        print(f"stopped after {time.monotonic() - t0:.2f} s")
