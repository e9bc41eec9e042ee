"""Which GPU (and how much of it) each kernel of this agent holds.

The map is the truth on the agent: it never hands out more than a device has, whatever the manager
believed when it placed a session, and it is rebuilt from the kernels' container labels (`bai.gpus`)
when the agent restarts. Changes happen between awaits, so concurrent creates cannot both take the
last room of a device.
"""

from __future__ import annotations

from decimal import Decimal

from bai.common.gpus import ONE, describe_shortage, pack, request_of
from bai.node.agent.backends.base import KernelStartError


class GpuAllocator:
    """Which kernel holds how much of each of this agent's GPUs."""

    def __init__(self, uuids: list[str]) -> None:
        self.uuids = list(uuids)
        self.holders: dict[str, list[tuple[str, Decimal]]] = {}

    def free(self) -> list[Decimal]:
        used = dict.fromkeys(self.uuids, Decimal(0))
        for devices in self.holders.values():
            for uuid, amount in devices:
                if uuid in used:
                    used[uuid] += amount
        return [ONE - used[u] for u in self.uuids]

    def allocate(self, kernel_id: str, slots: dict[str, Decimal]) -> list[tuple[str, Decimal]]:
        whole, fraction = request_of(slots)
        if not whole and not fraction:
            return []
        taken = pack(self.free(), whole, fraction)
        if taken is None:
            raise KernelStartError(f"no room on this agent's GPUs: {describe_shortage(self.free(), whole, fraction)}")
        devices = [(self.uuids[i], amount) for i, amount in taken]
        self.holders[kernel_id] = devices
        return devices

    def adopt(self, kernel_id: str, devices: list[tuple[str, Decimal]]) -> None:
        """A kernel that already holds these devices (re-adopted after a restart)."""
        if devices:
            self.holders[kernel_id] = [(u, Decimal(a)) for u, a in devices]

    def release(self, kernel_id: str) -> None:
        self.holders.pop(kernel_id, None)

    def held(self, kernel_id: str) -> list[tuple[str, Decimal]]:
        return self.holders.get(kernel_id, [])
