"""Resource presets (the records of `state/preset_records.py`, in `resource_presets`): the same queries for SQLite and
PostgreSQL."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

import msgspec

from bai.node.manager.state.preset_records import ResourcePreset
from bai.node.manager.state.sqlite.db import Queries

_COLUMNS = "name, resource_slots, shared_memory, scaling_group, created_at"
_slots = msgspec.json.Decoder(dict[str, str])


def _row(r: Sequence[object]) -> ResourcePreset:
    return ResourcePreset(
        name=str(r[0]),
        resource_slots=_slots.decode(str(r[1])),
        shared_memory=None if r[2] is None else int(str(r[2])),
        scaling_group=None if r[3] is None else str(r[3]),
        created_at=str(r[4]),
    )


def _values(p: ResourcePreset) -> tuple[object, ...]:
    return (p.name, msgspec.json.encode(p.resource_slots).decode(), p.shared_memory, p.scaling_group, p.created_at)


class Presets(Queries):
    """Resource presets, by name."""

    async def resource_presets(self) -> list[ResourcePreset]:
        """Every preset, by name."""

        def fn(conn: sqlite3.Connection) -> list[ResourcePreset]:
            return [_row(r) for r in conn.execute(f"SELECT {_COLUMNS} FROM resource_presets ORDER BY name")]

        return await self.db.run(fn)

    async def create_resource_preset(self, preset: ResourcePreset) -> bool:
        """Store a new preset (False: one has its name)."""

        def fn(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                f"INSERT INTO resource_presets({_COLUMNS}) VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                _values(preset),
            )
            return cur.rowcount > 0

        return await self.db.transaction(fn)

    async def replace_resource_preset(self, name: str, preset: ResourcePreset) -> bool:
        """The preset `name` replaced by `preset`, which may have another name (False: there is no preset `name`,
        or another one has the new name)."""

        def fn(conn: sqlite3.Connection) -> bool:
            if preset.name != name:
                taken = conn.execute("SELECT 1 FROM resource_presets WHERE name=?", (preset.name,)).fetchone()
                if taken is not None:
                    return False
            cur = conn.execute(
                "UPDATE resource_presets SET name=?, resource_slots=?, shared_memory=?, scaling_group=? WHERE name=?",
                (*_values(preset)[:4], name),
            )
            return cur.rowcount > 0

        return await self.db.transaction(fn)

    async def delete_resource_preset(self, name: str) -> bool:
        def fn(conn: sqlite3.Connection) -> bool:
            return conn.execute("DELETE FROM resource_presets WHERE name=?", (name,)).rowcount > 0

        return await self.db.transaction(fn)
