"""A fake `pynvml` for tests, at the module boundary: put this folder first on PYTHONPATH.

Devices come from the JSON in $BAI_FAKE_NVML (a list of {"uuid", "name", "memory", "util", "used"});
unset or "init-error": nvmlInit fails as on a host without the driver; a device with "fail": true raises
NVMLError when sampled (a device that stops answering mid-run); $BAI_FAKE_NVML_FILE (a path) is read
instead when set, so a test can change the devices while the agent runs.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace


class NVMLError(Exception):
    pass


class NVMLError_LibraryNotFound(NVMLError):  # noqa: N801 - pynvml's own name
    pass


def _devices() -> list[dict]:
    path = os.environ.get("BAI_FAKE_NVML_FILE")
    text = open(path).read() if path else os.environ.get("BAI_FAKE_NVML", "init-error")  # noqa: SIM115
    if text.strip() == "init-error":
        raise NVMLError_LibraryNotFound("NVML Shared Library Not Found")
    return json.loads(text)


def nvmlInit() -> None:  # noqa: N802
    _devices()


def nvmlShutdown() -> None:  # noqa: N802
    pass


def nvmlDeviceGetCount() -> int:  # noqa: N802
    return len(_devices())


def nvmlDeviceGetHandleByIndex(index: int) -> int:  # noqa: N802
    return index


def nvmlDeviceGetUUID(handle: int) -> str:  # noqa: N802
    return _devices()[handle]["uuid"]


def nvmlDeviceGetName(handle: int) -> str:  # noqa: N802
    return _devices()[handle].get("name", "Fake GPU")


def nvmlDeviceGetMemoryInfo(handle: int) -> SimpleNamespace:  # noqa: N802
    d = _devices()[handle]
    if d.get("fail"):
        raise NVMLError("GPU is lost")
    return SimpleNamespace(total=d.get("memory", 16 << 30), used=d.get("used", 0), free=0)


def nvmlDeviceGetUtilizationRates(handle: int) -> SimpleNamespace:  # noqa: N802
    d = _devices()[handle]
    if d.get("fail"):
        raise NVMLError("GPU is lost")
    return SimpleNamespace(gpu=d.get("util", 0), memory=0)
