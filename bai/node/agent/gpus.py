"""NVIDIA GPUs through NVML (nvidia-ml-py, module `pynvml`): what an agent has, and how busy it is.

A host without the driver or without GPUs (`pynvml.NVMLError`, e.g. the library is not found) simply
has no GPU slots; nothing else changes. Errors while sampling (a device falls off the bus, the driver
restarts) mark that sample unavailable and never stop the agent.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from bai.node.link.messages import GpuDevice

log = logging.getLogger("bai.agent.gpus")


@dataclass(frozen=True)
class GPU:
    """One NVIDIA device as NVML describes it."""

    index: int
    uuid: str
    name: str
    memory_total: int  # bytes


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NVML:
    """Discovery once at start; `sample()` for each heartbeat."""

    def __init__(self) -> None:
        self.gpus: list[GPU] = []
        self.error: str | None = None
        self._handles: dict[str, Any] = {}
        try:
            import pynvml
        except ImportError as e:  # not installed: as if there were no driver
            self.error = str(e)
            return
        self.nvml = pynvml
        try:
            pynvml.nvmlInit()
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                gpu = GPU(
                    index=index,
                    uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                    name=_text(pynvml.nvmlDeviceGetName(handle)),
                    memory_total=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                )
                self.gpus.append(gpu)
                self._handles[gpu.uuid] = handle
        except pynvml.NVMLError as e:
            self.error = f"{type(e).__name__}: {e}"
            self.gpus, self._handles = [], {}
            log.info("no GPUs: %s", self.error)

    def sample(self) -> list[dict[str, Any]]:
        """Live utilisation and memory use per device (None where the device did not answer)."""
        out = []
        for gpu in self.gpus:
            item: dict[str, Any] = {"uuid": gpu.uuid, "utilization": None, "memory_used": None}
            try:
                handle = self._handles[gpu.uuid]
                item["utilization"] = int(self.nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                item["memory_used"] = int(self.nvml.nvmlDeviceGetMemoryInfo(handle).used)
            except self.nvml.NVMLError as e:
                item["error"] = f"{type(e).__name__}: {e}"
            out.append(item)
        return out

    def describe(self) -> list[GpuDevice]:
        """The devices as the agent registers them."""
        return [GpuDevice(g.index, g.uuid, g.name, g.memory_total) for g in self.gpus]
