"""The SSH keypair of a multi-container session, as files for every kernel's home (as Backend.AI does for MPI).

Each session of more than one kernel gets a fresh ed25519 keypair (made by OpenSSH's ssh-keygen on the manager's
host; without it, sessions get no keypair and the manager says so in its log), made when it starts and never
stored: its
kernels get, in /home/work/.ssh, the private key `id_cluster` (0600), `id_cluster.pub`, `authorized_keys`
(the public key) and a `config` naming every kernel of the session with the port its sshd listens on
(SSH_PORT), so `ssh sub1` works without a password where the image has an sshd. Host keys are the kernels'
own and new each time: they are not checked (the names only reach the session's own kernels).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

from bai.common.cluster import SSH_DIR, SSH_PORT
from bai.node.link.messages import DotfileSpec


class NoKeygen(Exception):
    """The manager's host has no ssh-keygen (OpenSSH's client tools): sessions get no keypair."""


async def new_keypair() -> tuple[str, str]:
    """A fresh ed25519 keypair in OpenSSH's formats, made by OpenSSH's own `ssh-keygen` (in a private temporary
    folder, removed at once): (private key file text, public key line). NoKeygen when there is none."""
    keygen = shutil.which("ssh-keygen")
    if keygen is None:
        raise NoKeygen("ssh-keygen is not installed (Debian: openssh-client)")
    with tempfile.TemporaryDirectory(prefix="bai-key-") as folder:
        path = Path(folder) / "id_cluster"
        proc = await asyncio.create_subprocess_exec(
            keygen,
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            "bai-cluster",
            "-f",
            str(path),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await proc.communicate()
        if proc.returncode != 0:
            raise NoKeygen(f"ssh-keygen failed: {err.decode(errors='replace').strip()[:200]}")
        return path.read_text(), path.with_suffix(".pub").read_text().strip()


def ssh_config(hosts: list[str]) -> str:
    """~/.ssh/config of a session's kernels: each of them by name, on SSH_PORT, with the session's key."""
    lines = []
    for host in hosts:
        lines += [
            f"Host {host}",
            f"    HostName {host}",
            f"    Port {SSH_PORT}",
            f"    IdentityFile ~/{SSH_DIR}/id_cluster",
            "    StrictHostKeyChecking no",
            "    UserKnownHostsFile /dev/null",
            "    LogLevel ERROR",
            "",
        ]
    return "\n".join(lines)


def cluster_dotfiles(hosts: list[str], keypair: tuple[str, str] | None) -> list[DotfileSpec]:
    """The files each kernel of a session of `hosts` gets in its home's .ssh folder (only the config without a
    keypair)."""
    files = [DotfileSpec(f"{SSH_DIR}/config", ssh_config(hosts), "600")]
    if keypair is not None:
        private, public = keypair
        line = f"{public}\n"
        files += [
            DotfileSpec(f"{SSH_DIR}/id_cluster", private, "600"),
            DotfileSpec(f"{SSH_DIR}/id_cluster.pub", line, "644"),
            DotfileSpec(f"{SSH_DIR}/authorized_keys", line, "600"),
        ]
    return files
