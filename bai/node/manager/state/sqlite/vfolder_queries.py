"""Virtual folders and their shares."""

from __future__ import annotations

import sqlite3
import uuid
from typing import Any

from bai.node.manager.state.sqlite.db import Queries, decode_row, utcnow


class Vfolders(Queries):
    """Virtual folders (their rows; their files live on the folder hosts) and who they are shared with."""

    async def create_vfolder(self, folder: dict[str, Any]) -> bool:
        """Insert a folder; False when its owner already has a ready folder of that name."""

        def fn(conn: sqlite3.Connection) -> bool:
            try:
                conn.execute(
                    "INSERT INTO vfolders(id, name, host, owner, usage_mode, status, created_at, mount_permission, "
                    "cloneable) VALUES (?, ?, ?, ?, ?, 'ready', ?, ?, ?)",
                    (
                        folder["id"], folder["name"], folder["host"], folder["owner"], folder["usage_mode"], utcnow(),
                        folder.get("mount_permission") or "rw", int(bool(folder.get("cloneable"))),
                    ),
                )  # fmt: skip
            except sqlite3.IntegrityError:
                return False
            return True

        return await self.db.transaction(fn)

    async def vfolders_of(self, access_key: str | None, status: str = "ready") -> list[dict[str, Any]]:
        """Folders a keypair owns (permission `wd`) or that are shared with it (`ro` / `rw`), by name;
        every folder (as its owner sees it) when `access_key` is None."""

        def fn(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            if access_key is None:
                sql = "SELECT *, 'wd' AS permission, 1 AS is_owner FROM vfolders WHERE status=? ORDER BY name, id"
                return [dict(r) for r in conn.execute(sql, (status,)).fetchall()]
            sql = (
                "SELECT v.*, 'wd' AS permission, 1 AS is_owner FROM vfolders v WHERE v.owner=? AND v.status=? "
                "UNION ALL SELECT v.*, s.permission AS permission, 0 AS is_owner FROM vfolders v "
                "JOIN vfolder_shares s ON s.vfolder_id = v.id WHERE s.access_key=? AND v.status=? "
                "ORDER BY is_owner DESC, name, id"
            )
            return [dict(r) for r in conn.execute(sql, (access_key, status, access_key, status)).fetchall()]

        return await self.db.run(fn)

    async def get_vfolder(self, folder_id: str) -> dict[str, Any] | None:
        return await self.db.run(
            lambda conn: decode_row(conn.execute("SELECT * FROM vfolders WHERE id=?", (folder_id,)).fetchone())
        )

    async def update_vfolder(self, folder_id: str, **cols: Any) -> bool:
        """Change a folder's name / status / trashed_at; False when the new name is taken."""

        def fn(conn: sqlite3.Connection) -> bool:
            sets = ", ".join(f"{c}=?" for c in cols)
            try:
                conn.execute(f"UPDATE vfolders SET {sets} WHERE id=?", (*cols.values(), folder_id))
            except sqlite3.IntegrityError:
                return False
            return True

        return await self.db.transaction(fn)

    async def delete_vfolder(self, folder_id: str) -> None:
        def fn(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM vfolder_shares WHERE vfolder_id=?", (folder_id,))
            conn.execute("DELETE FROM vfolder_invitations WHERE vfolder_id=?", (folder_id,))
            conn.execute("DELETE FROM vfolders WHERE id=?", (folder_id,))

        await self.db.transaction(fn)

    async def count_vfolders(self, owner: str) -> int:
        return await self.db.run(
            lambda conn: conn.execute("SELECT COUNT(*) FROM vfolders WHERE owner=?", (owner,)).fetchone()[0]
        )

    async def share_vfolder(self, folder_id: str, access_key: str, permission: str | None) -> None:
        """Share with a keypair as `ro` / `rw`, or (permission None) stop sharing."""

        def fn(conn: sqlite3.Connection) -> None:
            if permission is None:
                conn.execute("DELETE FROM vfolder_shares WHERE vfolder_id=? AND access_key=?", (folder_id, access_key))
            else:
                conn.execute(
                    "INSERT INTO vfolder_shares(vfolder_id, access_key, permission) VALUES (?, ?, ?) "
                    "ON CONFLICT(vfolder_id, access_key) DO UPDATE SET permission=excluded.permission",
                    (folder_id, access_key, permission),
                )

        await self.db.transaction(fn)

    async def shares_of(self, folder_id: str) -> dict[str, str]:
        def fn(conn: sqlite3.Connection) -> dict[str, str]:
            rows = conn.execute(
                "SELECT access_key, permission FROM vfolder_shares WHERE vfolder_id=? ORDER BY access_key",
                (folder_id,),
            ).fetchall()
            return {r[0]: r[1] for r in rows}

        return await self.db.run(fn)

    async def all_shares(self, folder_id: str | None = None) -> list[dict[str, Any]]:
        """Every share (of one folder, or of all), with its folder's name, owner and status."""

        def fn(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            sql = (
                "SELECT s.vfolder_id, s.access_key, s.permission, v.name, v.owner, v.status FROM vfolder_shares s "
                "JOIN vfolders v ON v.id = s.vfolder_id"
            )
            args: tuple[Any, ...] = ()
            if folder_id is not None:
                sql += " WHERE s.vfolder_id=?"
                args = (folder_id,)
            return [dict(r) for r in conn.execute(sql + " ORDER BY v.name, s.access_key", args).fetchall()]

        return await self.db.run(fn)

    # -- invitations (a share the invitee accepts or rejects) ------------------------------------------

    async def invite(self, folder_id: str, inviter: str, invitees: list[str], permission: str) -> list[str]:
        """Pending invitations to keypairs; returns those invited now (not those with one pending already)."""

        def fn(conn: sqlite3.Connection) -> list[str]:
            now, done = utcnow(), []
            for invitee in invitees:
                pending = conn.execute(
                    "SELECT 1 FROM vfolder_invitations WHERE vfolder_id=? AND invitee=? AND state='pending'",
                    (folder_id, invitee),
                ).fetchone()
                if pending:
                    continue
                conn.execute(
                    "INSERT INTO vfolder_invitations(id, vfolder_id, inviter, invitee, permission, state, created_at, "
                    "modified_at) VALUES (?, ?, ?, ?, ?, 'pending', ?, ?)",
                    (uuid.uuid4().hex, folder_id, inviter, invitee, permission, now, now),
                )
                done.append(invitee)
            return done

        return await self.db.transaction(fn)

    async def invitations(
        self, *, invitee: str | None = None, inviter: str | None = None, invitation_id: str | None = None
    ) -> list[dict[str, Any]]:
        """Pending invitations to a keypair, from a keypair, or one by id; with the folder's name."""

        def fn(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            where, args = ["i.state='pending'", "v.status='ready'"], []
            for column, value in (("invitee", invitee), ("inviter", inviter), ("id", invitation_id)):
                if value is not None:
                    where.append(f"i.{column}=?")
                    args.append(value)
            sql = (
                "SELECT i.*, v.name AS vfolder_name FROM vfolder_invitations i JOIN vfolders v ON v.id = i.vfolder_id "
                f"WHERE {' AND '.join(where)} ORDER BY i.created_at, i.id"
            )
            return [dict(r) for r in conn.execute(sql, args).fetchall()]

        return await self.db.run(fn)

    async def close_invitation(self, invitation_id: str, state: str) -> dict[str, Any] | None:
        """Accept (the share appears), reject or cancel a pending invitation; None when it is not pending."""

        def fn(conn: sqlite3.Connection) -> dict[str, Any] | None:
            row = conn.execute(
                "SELECT * FROM vfolder_invitations WHERE id=? AND state='pending'", (invitation_id,)
            ).fetchone()
            if row is None:
                return None
            if state == "accepted":
                conn.execute(
                    "INSERT INTO vfolder_shares(vfolder_id, access_key, permission) VALUES (?, ?, ?) "
                    "ON CONFLICT(vfolder_id, access_key) DO UPDATE SET permission=excluded.permission",
                    (row["vfolder_id"], row["invitee"], row["permission"]),
                )
            conn.execute(
                "UPDATE vfolder_invitations SET state=?, modified_at=? WHERE id=?", (state, utcnow(), invitation_id)
            )
            return dict(row)

        return await self.db.transaction(fn)
