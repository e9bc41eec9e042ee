"""Get-or-create by name: how the live session a create found (and reused) differs from what was asked.

`bai session create --name N …` (and `run`) asks the manager for session N; when N is already live the
manager answers with it (`created: false`) as Backend.AI does, and refuses only a different image (a 409).
The CLI compares every asked field that `GET /session/N` shows: type, each requested slot (per kernel),
cluster size and mode, environment variables, network, scaling group and mounted folders. What it does
not show (a batch session's startup command, when to start, dependencies) is not compared.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

from bai.common import slots as slotlib


def _amount(slot: str, value: Any) -> Decimal | None:
    try:
        return slotlib.parse_amount(slot, value)
    except (slotlib.SlotError, ValueError, ArithmeticError, InvalidOperation):
        return None


def _slots(asked: dict[str, str], info: dict[str, Any]) -> list[str]:
    """The asked slots the session holds another amount of, per kernel (its requestedSlots are for all of its
    kernels together)."""
    size = int(info.get("clusterSize") or 1)
    held = info.get("requestedSlots") or {}
    out = []
    for slot, value in sorted(asked.items()):
        want = _amount(slot, value)
        raw = held.get(slot)
        have = None if raw is None else _amount(slot, raw)
        if have is not None:
            have = have / size
        if want is None or have == want:
            continue
        shown = "none" if have is None else slotlib.format_amount(slot, have)
        out.append(f"{slot} {shown} (asked {slotlib.format_amount(slot, want)})")
    return out


def _environ(asked: dict[str, str], info: dict[str, Any]) -> list[str]:
    held = info.get("environ") or {}
    out = []
    for key, value in sorted(asked.items()):
        if key not in held:
            out.append(f"no {key} in its environment (asked {key}={value})")
        elif str(held[key]) != value:
            out.append(f"{key}={held[key]} (asked {key}={value})")
    return out


def _mounts(asked: dict[str, Any], info: dict[str, Any]) -> list[str]:
    held = {m.get("name"): m for m in info.get("mounts") or []}
    targets = asked.get("mount_map") or {}
    options = asked.get("mount_options") or {}
    out = []
    for name in asked.get("mounts") or []:
        mount = held.get(name)
        if mount is None:
            out.append(f"folder {name} not mounted (asked --mount {name})")
            continue
        want = targets.get(name)
        if want and mount.get("target") not in (want, f"/home/work/{want}"):
            out.append(f"folder {name} at {mount.get('target')} (asked {want})")
        read_only = (options.get(name) or {}).get("permission") == "ro"
        if read_only != bool(mount.get("readOnly")):
            shown = "read-only" if mount.get("readOnly") else "writable"
            out.append(f"folder {name} {shown} (asked {'read-only' if read_only else 'writable'})")
    return out


def differences(asked: dict[str, Any], info: dict[str, Any]) -> list[str]:
    """What of `asked` (the create's fields: resources, type, cluster_size, cluster_mode, environ, network,
    scaling_group, mounts as `bai.common.mounts.mount_config` makes them) the session `info` (as `GET
    /session/{ref}` shows it) does not have, one phrase each; empty when it has all of it."""
    out = []
    kind = asked.get("type")
    if kind and str(info.get("type", "")).lower() != kind:
        out.append(f"type {str(info.get('type', '?')).lower()} (asked {kind})")
    out += _slots(asked.get("resources") or {}, info)
    size = asked.get("cluster_size") or 1
    if int(info.get("clusterSize") or 1) != size:
        out.append(f"{info.get('clusterSize') or 1} kernel(s) (asked --cluster-size {size})")
    mode = asked.get("cluster_mode")
    if size > 1 and mode and (info.get("clusterMode") or "single-node") != mode:
        out.append(f"cluster mode {info.get('clusterMode') or 'single-node'} (asked {mode})")
    out += _environ(asked.get("environ") or {}, info)
    network = asked.get("network")
    if network is not None and info.get("network") != network:
        out.append(f"network {info.get('network') or 'the agents default'} (asked {network})")
    group = asked.get("scaling_group")
    if group is not None and info.get("scalingGroup") != group:
        out.append(f"scaling group {info.get('scalingGroup')} (asked {group})")
    out += _mounts(asked.get("mounts") or {}, info)
    return out


def reused_line(name: str, session_id: str, status: str, found: list[str]) -> str:
    """What `create` (or `run`) says on stderr when it reused the live session of the name."""
    head = f"bai: session {name} ({session_id}) already existed ({status}) and was reused, not created"
    if not found:
        return f"{head}: it has what was asked"
    return (
        f"{head}; it differs from what was asked: {'; '.join(found)}. To get what you asked for, destroy it "
        f"first (`bai session destroy {name}`) or pick another --name"
    )
