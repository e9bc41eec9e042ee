"""A kernel's writable space (its scratch): /home/work, /tmp and /var/tmp, bounded per kernel.

A container's root filesystem is read-only, so the scratch is all a kernel can write besides its
virtual folders. `[agent] scratch_type` says what backs it (as Backend.AI's scratch types do):

- `hostfile`: a sparse file of `scratch_size` in the kernel's folder, formatted ext4 and loop-mounted
  there (root, loop devices and mkfs.ext4 needed). Writing past the size fails with ENOSPC; the file
  takes only what is written. /home/work, /tmp and /var/tmp share the one bound.
- `memory`: tmpfs of `scratch_size` each at /home/work, /tmp and /var/tmp (made by the container
  runtime). Its pages count against the kernel's memory limit.
- `hostdir`: plain folders in the kernel's folder: NO bound, a kernel can fill the node's disk.
- `auto` (the default): hostfile where it works, else hostdir with a warning.

No Docker here: `prepare` sets up the host side and says what to mount where; the backend mounts it,
then `detach`es the host's mount (the container keeps it: it ends with the container).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from bai.common.slots import parse_amount
from bai.node.agent import leftovers

log = logging.getLogger("bai.agent.scratch")

TYPES = ("hostdir", "hostfile", "memory")
# what the scratch provides in a kernel: target path -> (sub-folder of the scratch, mode)
TARGETS = {"/home/work": ("work", 0o755), "/tmp": ("tmp", 0o1777), "/var/tmp": ("var-tmp", 0o1777)}
IMAGE = "scratch.img"  # hostfile: the file holding the filesystem, in the kernel's folder
MOUNTPOINT = "scratch"  # where the scratch lies on the host, in the kernel's folder
# fast mkfs of a sparse file (about 10-25 ms for 1 GiB): no journal (scratch does not outlive its
# kernel), no discard pass, inode tables initialised lazily, no blocks reserved for root
MKFS = ["mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal", "-E", "nodiscard,lazy_itable_init=1"]
MOUNT_OPTIONS = "loop,nosuid,nodev"


class ScratchError(Exception):
    """The scratch cannot be set up; the message says why."""


@dataclass
class Layout:
    """What to mount in a kernel: host folders (binds) and sized tmpfs, by target path."""

    binds: dict[str, Path] = field(default_factory=dict)
    tmpfs: dict[str, tuple[int, int]] = field(default_factory=dict)  # target -> (size in bytes, mode)
    home: Path | None = None  # the host folder behind /home/work, when there is one


def _gib(size: int) -> str:
    if size % 2**30 == 0:
        return f"{size // 2**30} GiB"
    if size >= 2**30:
        return f"{size / 2**30:.1f} GiB"
    return f"{size / 2**20:.0f} MiB"


def _run(args: list[str]) -> None:
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode != 0:
        detail = (out.stderr or out.stdout).strip().splitlines()
        raise ScratchError(f"{' '.join(args[:2])} failed: {detail[-1] if detail else f'exit {out.returncode}'}")


@dataclass(frozen=True)
class Scratch:
    """Where kernels may write: the scratch space of each kernel (a host folder, a size-limited file or memory)."""

    kind: str  # one of TYPES
    size: int  # bytes per kernel; unused by hostdir
    note: str = ""  # why `auto` did not choose hostfile

    @property
    def bounded(self) -> bool:
        return self.kind != "hostdir"

    def describe(self) -> str:
        """For the start banner: which bound is in force."""
        if self.kind == "hostfile":
            return f"hostfile, {_gib(self.size)} per kernel (loop-mounted ext4)"
        if self.kind == "memory":
            return f"memory, {_gib(self.size)} tmpfs per kernel (counts against its memory)"
        why = f" (no hostfile: {self.note})" if self.note else ""
        return f"hostdir, UNBOUNDED{why}: WARNING, a kernel can fill the node's disk ([agent] scratch_type)"

    def prepare(self, kdir: Path, owner: tuple[int, int] | None, volumes: Iterable[str] = ()) -> Layout:
        """Set up a new kernel's scratch in its folder; `owner` (uid, gid) gets /home/work (without
        one, /home/work is writable by all: the kernel's user is not known). `volumes`: the image's
        VOLUME paths, which would otherwise become unbounded Docker volumes on the node's disk; they
        get a folder of the scratch too."""
        _, modes = self._targets(owner, volumes)
        layout = self.plan(kdir, owner, volumes)
        if self.kind == "memory":
            return layout
        root = kdir / MOUNTPOINT
        root.mkdir(parents=True, exist_ok=True)
        if self.kind == "hostfile":
            image = kdir / IMAGE
            with image.open("wb") as f:
                f.truncate(self.size)
            try:
                _run([*MKFS, str(image)])
                _run(["mount", "-t", "ext4", "-o", MOUNT_OPTIONS, str(image), str(root)])
            except ScratchError:
                image.unlink(missing_ok=True)
                raise
            with contextlib.suppress(FileNotFoundError):
                (root / "lost+found").rmdir()
        for target, folder in layout.binds.items():
            sub = folder.name
            folder.mkdir(exist_ok=True)
            folder.chmod(modes[target])
            if sub == "work" and owner is not None:
                try:
                    os.chown(folder, *owner)
                except PermissionError:  # an agent that is not root (hostdir): writable by all instead
                    folder.chmod(0o777)
        return layout

    def plan(self, kdir: Path, owner: tuple[int, int] | None, volumes: Iterable[str] = ()) -> Layout:
        """What `prepare` with the same arguments returns, known without doing it (no I/O): the kernel's
        container can be created while its scratch is being prepared (it is started only after)."""
        targets, modes = self._targets(owner, volumes)
        if self.kind == "memory":
            return Layout(tmpfs={target: (self.size, mode) for target, mode in modes.items()})
        root = kdir / MOUNTPOINT
        return Layout(binds={target: root / sub for target, (sub, _) in targets.items()}, home=root / "work")

    @staticmethod
    def _targets(
        owner: tuple[int, int] | None, volumes: Iterable[str]
    ) -> tuple[dict[str, tuple[str, int]], dict[str, int]]:
        """The scratch's folders by target path (folder name, mode), and the mode each target gets."""
        targets = dict(TARGETS)
        for i, path in enumerate(v for v in volumes if v not in TARGETS):
            targets[path] = (f"volume-{i}", 0o1777)
        modes = {target: mode if sub != "work" or owner else 0o777 for target, (sub, mode) in targets.items()}
        return targets, modes

    def release(self, kdir: Path) -> None:
        """Undo `prepare` (unmount, remove the file); the caller removes the kernel's folder."""
        release(kdir)

    def detach(self, kdir: Path) -> None:
        """Once the kernel has started (its container holds the scratch mounted), take the mount off
        the host: the filesystem then lives exactly as long as the container, and its loop device goes
        with it, even when the container is removed while no agent runs."""
        root = kdir / MOUNTPOINT
        if self.kind == "hostfile" and os.path.ismount(root):
            out = subprocess.run(["umount", "-l", str(root)], capture_output=True, text=True)
            if out.returncode != 0:
                log.warning("cannot detach %s: %s", root, out.stderr.strip())


def release(kdir: Path) -> None:
    """Unmount a kernel's scratch if it is mounted and remove its file; safe to call more than once."""
    root = kdir / MOUNTPOINT
    if os.path.ismount(root):
        out = subprocess.run(["umount", str(root)], capture_output=True, text=True)
        if out.returncode != 0:  # still busy somewhere: detach it now, the kernel is gone anyway
            lazy = subprocess.run(["umount", "-l", str(root)], capture_output=True, text=True)
            if lazy.returncode != 0:
                log.warning(
                    "could not unmount scratch %s: %s; it is left mounted: unmount it with `umount -l %s`",
                    root,
                    (lazy.stderr or out.stderr).strip(),
                    root,
                )
                return
    image = kdir / IMAGE
    with leftovers.step(f"scratch file {image}", remedy=f"rm -f {image}", logger=log):
        image.unlink()


def remove_kernel_dir(kdir: Path) -> None:
    """Release the scratch, then remove the kernel's folder (never through a mount still in place)."""
    release(kdir)
    if os.path.ismount(kdir / MOUNTPOINT):
        root = kdir / MOUNTPOINT
        log.warning(
            "could not remove kernel folder %s: its scratch is still mounted; it is left behind: "
            "remove it with `umount -l %s && rm -rf %s`",
            kdir,
            root,
            kdir,
        )
        return
    leftovers.remove_tree(kdir, "kernel folder", logger=log)


def cleanup(kernels_dir: Path, keep: set[str]) -> list[str]:
    """Remove the folders (and unmount the scratch) of kernels not in `keep`; returns their ids."""
    removed = []
    if kernels_dir.is_dir():
        for kdir in kernels_dir.iterdir():
            if kdir.is_dir() and kdir.name not in keep and not kdir.name.startswith("."):
                remove_kernel_dir(kdir)
                removed.append(kdir.name)
    return removed


def hostfile_unavailable(work_dir: Path) -> str | None:
    """Why a loop-mounted scratch cannot be used here (None: it can): tried once with a small file."""
    if os.geteuid() != 0:
        return "the agent does not run as root"
    for tool in ("mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if not Path("/dev/loop-control").exists():
        return "no loop devices (/dev/loop-control)"
    work_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".scratch-probe-", dir=work_dir) as tmp:
        probe = Scratch("hostfile", 8 * 2**20)
        try:
            probe.prepare(Path(tmp), None)
        except (ScratchError, OSError) as e:
            return str(e)
        finally:
            release(Path(tmp))
        if os.path.ismount(Path(tmp) / MOUNTPOINT):
            return "cannot unmount a test scratch"
    return None


def choose(kind: str, size: str, work_dir: Path) -> Scratch:
    """The scratch of `[agent] scratch_type` / `scratch_size`; `auto` picks hostfile where it works."""
    kind = kind.strip().lower()
    if kind not in (*TYPES, "auto"):
        raise ScratchError(f"[agent] scratch_type: {kind!r} is not one of auto, {', '.join(TYPES)}")
    try:
        amount = int(parse_amount("mem", size))
    except (ValueError, ArithmeticError) as e:
        raise ScratchError(f"[agent] scratch_size: {size!r} is not a size like 1g or 512m ({e})") from None
    if kind != "hostdir" and amount < 2**20:
        raise ScratchError(f"[agent] scratch_size: {size!r} is too small (at least 1m)")
    if kind == "auto":
        reason = hostfile_unavailable(work_dir)
        if reason is None:
            return Scratch("hostfile", amount)
        log.warning("kernel scratch is UNBOUNDED (hostdir): a loop-mounted scratch is not possible: %s", reason)
        return Scratch("hostdir", amount, reason)
    if kind == "hostfile":
        reason = hostfile_unavailable(work_dir)
        if reason is not None:
            raise ScratchError(f"[agent] scratch_type hostfile: {reason}")
    if kind == "hostdir":
        log.warning("kernel scratch is UNBOUNDED (scratch_type hostdir): a kernel can fill the node's disk")
    return Scratch(kind, amount)
