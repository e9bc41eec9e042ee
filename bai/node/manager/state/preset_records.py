"""The records of resource presets (Backend.AI's `resource_presets`): a named set of resource slots that a session
can be created with, and that `POST /resource/check-presets` says whether it fits now."""

from __future__ import annotations

import msgspec


class ResourcePreset(msgspec.Struct, frozen=True):
    """A resource preset's row: its slots in wire form (decimal strings, bytes in bytes), the shared memory its
    kernels get (bytes; None: the default), and the scaling group it is for (None: every one)."""

    name: str
    resource_slots: dict[str, str]
    shared_memory: int | None
    scaling_group: str | None
    created_at: str
