"""A warm kernel's session, kept on the host: `assignment.json` in the kernel's folder on the agent.

A pooled kernel's container was created before its session existed, so its labels and configuration
cannot say whose it is. The agent writes this file (atomically, mode 0600, in a folder the container
never sees) when it hands the kernel over: first `claimed` (the kernel is no longer the pool's: nothing
else may take it), then `ready` once the kernel has its limits, environment and dotfiles, before the
manager hears that the kernel was created. A restarted agent adopts a kernel whose file says `ready` as
that session's kernel, one without the file as a pooled kernel, and removes one left `claimed` (its
hand-over was cut short: it is neither).
"""

from __future__ import annotations

import json
import os
from decimal import Decimal
from pathlib import Path
from typing import Any

from bai.node.agent.backends.base import KernelSpec
from bai.node.link.messages import ClusterSpec, MessageError

FILE = "assignment.json"
CLAIMED = "claimed"
READY = "ready"


def write(kdir: Path, spec: KernelSpec, env: dict[str, str], state: str) -> None:
    """Record that the kernel in `kdir` is `spec`'s (`state`: CLAIMED, then READY); atomic."""
    data: dict[str, Any] = {
        "state": state,
        "kernel_id": spec.kernel_id,
        "session_id": spec.session_id,
        "session_name": spec.session_name,
        "access_key": spec.access_key,
        "image": spec.image,
        "slots": {k: str(v) for k, v in spec.slots.items()},
        "cluster_role": spec.cluster_role,
        "cluster_idx": spec.cluster_idx,
        "cluster": spec.cluster.to_wire() if spec.cluster is not None else None,
        "env": env,  # the session's variables (may hold secrets: 0600, in the agent's own state)
    }
    tmp = kdir / f".{FILE}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, kdir / FILE)


def read(kdir: Path) -> dict[str, Any] | None:
    """The kernel's assignment, or None when it has none (a pooled kernel). An unreadable file counts as
    an unfinished hand-over (state CLAIMED): such a kernel is removed, never reused."""
    try:
        data = json.loads((kdir / FILE).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {"state": CLAIMED}
    if not isinstance(data, dict) or not isinstance(data.get("kernel_id"), str):
        return {"state": CLAIMED}
    return data


def spec_of(data: dict[str, Any]) -> KernelSpec:
    """The session's kernel as the assignment describes it (for adoption)."""
    return KernelSpec(
        kernel_id=str(data["kernel_id"]),
        session_id=str(data.get("session_id") or ""),
        session_name=str(data.get("session_name") or ""),
        access_key=str(data.get("access_key") or ""),
        image=str(data.get("image") or ""),
        slots={str(k): Decimal(str(v)) for k, v in (data.get("slots") or {}).items()},
        environ={},
        cluster_role=str(data.get("cluster_role") or "main"),
        cluster_idx=int(data.get("cluster_idx") or 1),
        cluster=cluster_of(data.get("cluster")),
    )


def cluster_of(raw: Any) -> ClusterSpec | None:
    """A kernel's cluster spec as stored (assignment.json, a container's label), or None (none, or unreadable)."""
    if raw is None:
        return None
    try:
        spec = ClusterSpec.from_wire(raw)
    except MessageError:
        return None
    ints = (spec.size, spec.rank, spec.local_rank)
    if any(isinstance(n, bool) or not isinstance(n, int) for n in ints):
        return None
    if not isinstance(spec.mode, str) or not isinstance(spec.network, str):
        return None
    if not isinstance(spec.hosts, list) or not all(isinstance(h, str) for h in spec.hosts):
        return None
    return spec


def env_of(data: dict[str, Any]) -> dict[str, str]:
    env = data.get("env") or {}
    return {str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {}
