"""Multi-container sessions ("cluster sessions"): the kernels' names and the environment each gets.

A session of N kernels has one `main` kernel and N-1 `sub` kernels, named by role and one-based index
within the role: `main1`, `sub1` … `sub{N-1}`; each kernel's hostname is its name, and the kernels find
each other by these names. As Backend.AI does, every kernel gets variables that describe the cluster:

    BACKENDAI_CLUSTER_SIZE        4                       the number of kernels
    BACKENDAI_CLUSTER_HOSTS       main1,sub1,sub2,sub3    every kernel's hostname, main first
    BACKENDAI_CLUSTER_REPLICAS    main:1,sub:3            kernels per role
    BACKENDAI_CLUSTER_HOST        sub2                    this kernel's hostname
    BACKENDAI_CLUSTER_ROLE        sub                     this kernel's role
    BACKENDAI_CLUSTER_IDX         2                       its one-based index within its role
    BACKENDAI_CLUSTER_LOCAL_RANK  2                       its zero-based index in the whole session
    BACKENDAI_CLUSTER_MODE        single-node             single-node | multi-node

and, for PyTorch / TensorFlow launchers, WORLD_SIZE, WORLD_RANK, LOCAL_RANK (the index among the session's
kernels on the same agent), MASTER_ADDR (`main1`), MASTER_PORT and TF_CONFIG.

Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Protocol

SINGLE_NODE = "single-node"
MULTI_NODE = "multi-node"
MODES = (SINGLE_NODE, MULTI_NODE)
MAX_CLUSTER_SIZE = 64
MASTER_PORT = 12345
SSH_PORT = 2200  # where a kernel's sshd listens (as Backend.AI's kernels do), when its image has one
# multi-node: the ports of a kernel on another agent that a kernel reaches by its name (a peer proxy on its
# session's network relays them through the agents' link): its sshd, MASTER_PORT and the 19 after it (the
# kernels of a session on one agent share its Docker network: every port)
CLUSTER_PORTS = (SSH_PORT, *range(MASTER_PORT, MASTER_PORT + 20))
SSH_DIR = ".ssh"  # in the kernel's home: id_cluster, id_cluster.pub, authorized_keys, config
NETWORK_PREFIX = "bai-cluster-"


_UNSAFE = re.compile(r"[^a-z0-9_.-]+")
AGENT_TAG_CHARS = 16  # of the agent's id kept readable in Docker names (then a digest of all of it)


def agent_tag(agent_id: str) -> str:
    """A short, Docker-safe form of an agent's id: up to 16 of its characters (lower case, [a-z0-9_.-]) and
    8 hex digits of a digest of the whole id, so that two agents never get the same tag: `node-a-1f0c9e2b`."""
    digest = hashlib.sha256(agent_id.encode()).hexdigest()[:8]
    safe = _UNSAFE.sub("-", agent_id.lower()).strip("-_.")[:AGENT_TAG_CHARS].rstrip("-_.")
    return f"{safe}-{digest}" if safe else digest


def network_name(session_id: str, agent_id: str) -> str:
    """The Docker network of a session's kernels on one agent: bai-cluster-<session id>-<agent tag>. Each
    agent of a multi-node session has its own, named for it, so two agents on one Docker daemon never make
    (or remove, or adopt) the same network."""
    return f"{NETWORK_PREFIX}{session_id}-{agent_tag(agent_id)}"


def is_agents_network(name: str, agent_id: str) -> bool:
    """Whether a network name is one of `agent_id`'s session networks (bai-cluster-…-<its tag>)."""
    return name.startswith(NETWORK_PREFIX) and name.endswith(f"-{agent_tag(agent_id)}")


def parse_hostname(name: str) -> tuple[str, int] | None:
    """`main1` -> ("main", 1), `sub3` -> ("sub", 3); None for anything else."""
    for role in ("main", "sub"):
        rest = name[len(role) :] if name.startswith(role) else ""
        if rest.isdigit() and rest == str(int(rest)) and int(rest) >= 1 and rest.isascii():
            return role, int(rest)
    return None


def kernel_name(role: str, idx: int) -> str:
    """main1, sub1 …: a kernel's name (and hostname) from its role and one-based index within the role."""
    return f"{role}{idx}"


class ClusterPlace(Protocol):
    """What has a place in a cluster: a kernel's record."""

    @property
    def cluster_role(self) -> str: ...

    @property
    def cluster_idx(self) -> int: ...


def kernel_name_of(kernel: ClusterPlace) -> str:
    """The name of a kernel (from its `cluster_role` and `cluster_idx`)."""
    return kernel_name(kernel.cluster_role, kernel.cluster_idx)


@dataclass(frozen=True)
class Member:
    """One kernel of a cluster session: its role, one-based index within the role, and global rank."""

    role: str
    idx: int
    rank: int

    @property
    def hostname(self) -> str:
        return kernel_name(self.role, self.idx)


def members(size: int) -> list[Member]:
    """The kernels of a session of `size` kernels, main first: main1, sub1 … sub{size-1}."""
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_CLUSTER_SIZE:
        raise ValueError(f"a session has 1 to {MAX_CLUSTER_SIZE} kernels, not {size!r}")
    return [Member("main", 1, 0)] + [Member("sub", i, i) for i in range(1, size)]


def cluster_environ(size: int, mode: str, rank: int, local_rank: int = 0) -> dict[str, str]:
    """The variables of the kernel of global `rank` in a session of `size` kernels; `local_rank`: its index
    among the session's kernels on the same agent (0 for single-node sessions' first kernel …)."""
    if mode not in MODES:
        raise ValueError(f"cluster mode must be one of {', '.join(MODES)}, not {mode!r}")
    everyone = members(size)
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is not in a session of {size} kernels")
    me = everyone[rank]
    hosts = [m.hostname for m in everyone]
    replicas = {"main": 1, "sub": size - 1}
    return {
        "BACKENDAI_CLUSTER_SIZE": str(size),
        "BACKENDAI_CLUSTER_HOSTS": ",".join(hosts),
        "BACKENDAI_CLUSTER_REPLICAS": ",".join(f"{role}:{n}" for role, n in replicas.items() if n),
        "BACKENDAI_CLUSTER_HOST": me.hostname,
        "BACKENDAI_CLUSTER_ROLE": me.role,
        "BACKENDAI_CLUSTER_IDX": str(me.idx),
        "BACKENDAI_CLUSTER_LOCAL_RANK": str(me.rank),
        "BACKENDAI_CLUSTER_MODE": mode,
        "WORLD_SIZE": str(size),
        "WORLD_RANK": str(me.rank),
        "LOCAL_RANK": str(local_rank),
        "MASTER_ADDR": hosts[0],
        "MASTER_PORT": str(MASTER_PORT),
        "TF_CONFIG": json.dumps(
            {"cluster": {"worker": [f"{h}:{MASTER_PORT}" for h in hosts]}, "task": {"type": "worker", "index": me.rank}}
        ),
    }
