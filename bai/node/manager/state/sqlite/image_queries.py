"""Image aliases (set with `bai image alias`)."""

from __future__ import annotations

import sqlite3

from bai.node.manager.state.records import ImageAlias
from bai.node.manager.state.sqlite.db import Queries


class Images(Queries):
    """Image aliases kept in the database (they override [images.aliases])."""

    async def image_aliases(self) -> list[ImageAlias]:
        """Every alias set with `bai image alias`, by alias."""

        def fn(conn: sqlite3.Connection) -> list[ImageAlias]:
            rows = conn.execute("SELECT alias, image FROM image_aliases ORDER BY alias").fetchall()
            return [ImageAlias(r[0], r[1]) for r in rows]

        return await self.db.run(fn)

    async def set_image_alias(self, alias: str, image: str | None) -> bool:
        """Set an alias (image None: remove it); False when removing one that does not exist."""

        def fn(conn: sqlite3.Connection) -> bool:
            if image is None:
                return conn.execute("DELETE FROM image_aliases WHERE alias=?", (alias,)).rowcount > 0
            conn.execute(
                "INSERT INTO image_aliases(alias, image) VALUES (?, ?) "
                "ON CONFLICT(alias) DO UPDATE SET image=excluded.image",
                (alias, image),
            )
            return True

        return await self.db.transaction(fn)
