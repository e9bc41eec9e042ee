"""Virtual folders and their shares."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from bai.node.manager.state.records import (
    FolderChanges,
    FolderShare,
    Invitation,
    NewVFolder,
    SeenVFolder,
    VFolder,
    changed_fields,
    stamp,
)
from bai.node.manager.state.sqlite.db import Queries

FOLDER_COLUMNS = (
    "id, name, host, owner, usage_mode, status, created_at, trashed_at, mount_permission, cloneable, project_id"
)
_V_COLUMNS = ", ".join(f"v.{c}" for c in FOLDER_COLUMNS.split(", "))
INVITATION_COLUMNS = (
    "i.id, i.vfolder_id, i.inviter, i.invitee, i.permission, i.state, i.created_at, i.modified_at, v.name"
)


def _folder(r: sqlite3.Row) -> VFolder:
    return VFolder(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], bool(r[9]), r[10])


def _seen(r: sqlite3.Row) -> SeenVFolder:
    return SeenVFolder(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], bool(r[9]), r[10], r[11], bool(r[12]))


def _invitation(r: sqlite3.Row) -> Invitation:
    return Invitation(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8] or "")


class Vfolders(Queries):
    """Virtual folders (their rows; their files live on the folder hosts) and who they are shared with."""

    async def create_vfolder(self, folder: NewVFolder, now: datetime) -> bool:
        """Insert a folder (ready, created `now`); False when its owner already has a ready folder of that name."""
        at = stamp(now)

        def fn(conn: sqlite3.Connection) -> bool:
            try:
                conn.execute(
                    "INSERT INTO vfolders(id, name, host, owner, usage_mode, status, created_at, mount_permission, "
                    "cloneable, project_id) VALUES (?, ?, ?, ?, ?, 'ready', ?, ?, ?, ?)",
                    (
                        folder.id, folder.name, folder.host, folder.owner, folder.usage_mode, at,
                        folder.mount_permission or "rw", int(folder.cloneable), folder.project_id,
                    ),
                )  # fmt: skip
            except sqlite3.IntegrityError:
                return False
            return True

        return await self.db.transaction(fn)

    async def vfolders_of(
        self, access_key: str | None, status: str = "ready", projects: Iterable[str] = ()
    ) -> list[SeenVFolder]:
        """Folders a keypair owns (permission `wd`), that are shared with it (`ro` / `rw`), or that belong to one
        of these projects (its members': the folder's own permission), by name; every folder (as its owner sees it)
        when `access_key` is None."""
        in_projects = list(projects)

        def fn(conn: sqlite3.Connection) -> list[SeenVFolder]:
            if access_key is None:
                sql = f"SELECT {FOLDER_COLUMNS}, 'wd', 1 FROM vfolders WHERE status=? ORDER BY name, id"
                return [_seen(r) for r in conn.execute(sql, (status,)).fetchall()]
            sql = (
                f"SELECT {_V_COLUMNS}, 'wd' AS permission, 1 AS is_owner FROM vfolders v "
                "WHERE v.owner=? AND v.status=? "
                f"UNION ALL SELECT {_V_COLUMNS}, s.permission AS permission, 0 AS is_owner FROM vfolders v "
                "JOIN vfolder_shares s ON s.vfolder_id = v.id WHERE s.access_key=? AND v.status=? "
            )
            params: list[Any] = [access_key, status, access_key, status]
            if in_projects:
                sql += (
                    f"UNION ALL SELECT {_V_COLUMNS}, v.mount_permission AS permission, 0 AS is_owner FROM vfolders v "
                    f"WHERE v.project_id IN ({','.join('?' * len(in_projects))}) AND v.status=? "
                )
                params += [*in_projects, status]
            sql += "ORDER BY is_owner DESC, name, id"
            return [_seen(r) for r in conn.execute(sql, params).fetchall()]

        return await self.db.run(fn)

    async def get_vfolder(self, folder_id: str) -> VFolder | None:
        sql = f"SELECT {FOLDER_COLUMNS} FROM vfolders WHERE id=?"
        row = await self.db.run(lambda conn: conn.execute(sql, (folder_id,)).fetchone())
        return _folder(row) if row is not None else None

    async def update_vfolder(self, folder_id: str, changes: FolderChanges) -> bool:
        """Change a folder's name / owner / status / trashed_at / options; False when the new name is taken."""
        cols: dict[str, Any] = changed_fields(changes)
        if "cloneable" in cols:
            cols["cloneable"] = int(cols["cloneable"])

        def fn(conn: sqlite3.Connection) -> bool:
            if not cols:
                return True
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
        def fn(conn: sqlite3.Connection) -> int:
            return int(conn.execute("SELECT COUNT(*) FROM vfolders WHERE owner=?", (owner,)).fetchone()[0])

        return await self.db.run(fn)

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
        """Access key -> permission (ro / rw) of a folder's shares, by access key."""

        def fn(conn: sqlite3.Connection) -> dict[str, str]:
            rows = conn.execute(
                "SELECT access_key, permission FROM vfolder_shares WHERE vfolder_id=? ORDER BY access_key",
                (folder_id,),
            ).fetchall()
            return {r[0]: r[1] for r in rows}

        return await self.db.run(fn)

    async def all_shares(self, folder_id: str | None = None) -> list[FolderShare]:
        """Every share (of one folder, or of all), with its folder's name, owner and status."""

        def fn(conn: sqlite3.Connection) -> list[FolderShare]:
            sql = (
                "SELECT s.vfolder_id, s.access_key, s.permission, v.name, v.owner, v.status FROM vfolder_shares s "
                "JOIN vfolders v ON v.id = s.vfolder_id"
            )
            args: tuple[Any, ...] = ()
            if folder_id is not None:
                sql += " WHERE s.vfolder_id=?"
                args = (folder_id,)
            rows = conn.execute(sql + " ORDER BY v.name, s.access_key", args).fetchall()
            return [FolderShare(r[0], r[1], r[2], r[3], r[4], r[5]) for r in rows]

        return await self.db.run(fn)

    # -- invitations (a share the invitee accepts or rejects) ------------------------------------------

    async def invite(
        self, folder_id: str, inviter: str, invitees: list[str], permission: str, now: datetime
    ) -> list[str]:
        """Pending invitations to keypairs (made `now`); returns those invited now (not those with one pending
        already)."""
        at = stamp(now)

        def fn(conn: sqlite3.Connection) -> list[str]:
            done = []
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
                    (uuid.uuid4().hex, folder_id, inviter, invitee, permission, at, at),
                )
                done.append(invitee)
            return done

        return await self.db.transaction(fn)

    async def invitations(
        self, *, invitee: str | None = None, inviter: str | None = None, invitation_id: str | None = None
    ) -> list[Invitation]:
        """Pending invitations to a keypair, from a keypair, or one by id; with the folder's name."""

        def fn(conn: sqlite3.Connection) -> list[Invitation]:
            where, args = ["i.state='pending'", "v.status='ready'"], []
            for column, value in (("invitee", invitee), ("inviter", inviter), ("id", invitation_id)):
                if value is not None:
                    where.append(f"i.{column}=?")
                    args.append(value)
            sql = (
                f"SELECT {INVITATION_COLUMNS} FROM vfolder_invitations i JOIN vfolders v ON v.id = i.vfolder_id "
                f"WHERE {' AND '.join(where)} ORDER BY i.created_at, i.id"
            )
            return [_invitation(r) for r in conn.execute(sql, args).fetchall()]

        return await self.db.run(fn)

    async def close_invitation(self, invitation_id: str, state: str, now: datetime) -> Invitation | None:
        """Accept (the share appears), reject or cancel a pending invitation (modified `now`); the invitation as
        it was, None when it is not pending."""
        at = stamp(now)

        def fn(conn: sqlite3.Connection) -> Invitation | None:
            row = conn.execute(
                f"SELECT {INVITATION_COLUMNS} FROM vfolder_invitations i LEFT JOIN vfolders v ON v.id = i.vfolder_id "
                "WHERE i.id=? AND i.state='pending'",
                (invitation_id,),
            ).fetchone()
            if row is None:
                return None
            invitation = _invitation(row)
            if state == "accepted":
                conn.execute(
                    "INSERT INTO vfolder_shares(vfolder_id, access_key, permission) VALUES (?, ?, ?) "
                    "ON CONFLICT(vfolder_id, access_key) DO UPDATE SET permission=excluded.permission",
                    (invitation.vfolder_id, invitation.invitee, invitation.permission),
                )
            conn.execute("UPDATE vfolder_invitations SET state=?, modified_at=? WHERE id=?", (state, at, invitation_id))
            return invitation

        return await self.db.transaction(fn)
