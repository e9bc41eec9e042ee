"""The SSH keypair of a multi-container session, as files for every kernel's home (as Backend.AI does for MPI).

Each session of more than one kernel gets a fresh ed25519 keypair, made when it starts and never stored: its
kernels get, in /home/work/.ssh, the private key `id_cluster` (0600), `id_cluster.pub`, `authorized_keys`
(the public key) and a `config` naming every kernel of the session with the port its sshd listens on
(SSH_PORT), so `ssh sub1` works without a password where the image has an sshd. Host keys are the kernels'
own and new each time: they are not checked (the names only reach the session's own kernels).
"""

from __future__ import annotations

from bai.common.cluster import SSH_DIR, SSH_PORT
from bai.node.link.messages import DotfileSpec


def new_keypair() -> tuple[str, str]:
    """A fresh ed25519 keypair in OpenSSH's formats: (private key file text, public key line)."""
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.OpenSSH, ser.NoEncryption()).decode()
    public = key.public_key().public_bytes(ser.Encoding.OpenSSH, ser.PublicFormat.OpenSSH).decode()
    return private, public


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


def cluster_dotfiles(hosts: list[str], keypair: tuple[str, str] | None = None) -> list[DotfileSpec]:
    """The files each kernel of a session of `hosts` gets in its home's .ssh folder."""
    private, public = keypair or new_keypair()
    comment = f"{public} bai-cluster\n"
    return [
        DotfileSpec(f"{SSH_DIR}/id_cluster", private, "600"),
        DotfileSpec(f"{SSH_DIR}/id_cluster.pub", comment, "644"),
        DotfileSpec(f"{SSH_DIR}/authorized_keys", comment, "600"),
        DotfileSpec(f"{SSH_DIR}/config", ssh_config(hosts), "600"),
    ]
