"""Virtual folders: hosts, who may do what, quotas, transfer tokens, and mounts for new kernels.

A host is a named root directory (the same path on every node of a cluster). A folder is the directory
`<host root>/<folder id>`; its name, owner, status and shares live in the store. Files are only touched
through `fsops` (which never leaves a folder, whatever a kernel planted in it); uploads land in the
host's staging directory and appear in the folder only when complete.

Permissions: the owner has `wd` (read, write, delete, rename, share); a folder can be shared with
another keypair as `ro` or `rw`. Anyone else — existence included — gets 404. Admins act as owners.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import shutil
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from bai.common.clock import Clock
from bai.common.mounts import MountRequest
from bai.common.problems import Problem, invalid
from bai.common.status import ACTIVE_STATUSES
from bai.node.manager.rules.access import Actor, actor_of, project_for
from bai.node.manager.services import vfolder_fs as fsops
from bai.node.manager.services.accounts import email_of
from bai.node.manager.services.diskfull import DATABASE, StorageFull, is_disk_full, storage_of, vfolder_host
from bai.node.manager.state import State
from bai.node.manager.state.protocols import AccountState, FolderState
from bai.node.manager.state.records import (
    FolderChanges,
    FolderShare,
    NewVFolder,
    Policy,
    SeenVFolder,
    VFolder,
    stamp,
)

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
MOUNT_PERMISSIONS = ("ro", "rw", "wd")
SHARE_PERMISSIONS = ("ro", "rw")
TOKEN_TTL = 3600.0  # seconds an upload / download token stays valid
READ, WRITE, OWNER = "read", "write", "owner"


def check_name(name: Any) -> None:
    if not isinstance(name, str) or not NAME_RE.match(name) or name in (".", ".."):
        raise invalid("a folder name is 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit")


def not_found(ref: str) -> Problem:
    return Problem("object-not-found", "No such virtual folder.", f"virtual folder {ref!r} does not exist")


def shown_permission(folder: SeenVFolder) -> str:
    """The permission the API shows, as Backend.AI does: the folder's innate one to its owner (ro, rw or wd),
    the share's to others (read-only when the folder itself is)."""
    innate = folder.mount_permission or "rw"
    if folder.is_owner:
        return innate
    return "ro" if innate == "ro" else folder.permission


@dataclass
class Grant:
    """What an upload or download token allows."""

    op: str  # "upload" | "download"
    folder_id: str
    path: str
    size: int
    expires: float
    archive: bool = False  # a download of a directory, as a zip


class VFolders:
    """Virtual folders: who may see and change which, their files, quotas, uploads and downloads."""

    def __init__(
        self,
        store: State,
        hosts: dict[str, Path],
        default_host: str,
        uid: int | None = None,
        gid: int | None = None,
        clock: Clock | None = None,
    ) -> None:
        if default_host not in hosts:
            raise ValueError(f"the default vfolder host {default_host!r} is not one of the hosts ({', '.join(hosts)})")
        self.store = store  # (the sessions that mount a folder)
        self.folders: FolderState = store
        self.accounts: AccountState = store
        self.clock = clock or Clock()
        self.hosts = hosts
        self.default_host = default_host
        self.uid, self.gid = uid, gid
        self.grants: dict[str, Grant] = {}
        self.staging = {}
        for name, root in hosts.items():
            root.mkdir(parents=True, exist_ok=True)
            self.staging[name] = fsops.Staging(root / ".staging")

    # -- finding folders ------------------------------------------------------------------------------

    def use_clock(self, clock: Clock) -> None:
        """Stamp with the manager's clock (the folders are made before the manager is built)."""
        self.clock = clock

    def path_of(self, folder: VFolder | Mapping[str, Any]) -> Path:
        """The directory of a folder (or of a session's mount of one: {"host", "id", …})."""
        if isinstance(folder, VFolder):
            return self.hosts[folder.host] / folder.id
        return self.hosts[str(folder["host"])] / str(folder["id"])

    def _actor(self, access_key: str) -> Actor | None:
        keypair = self.accounts.active_keypair(access_key)
        return actor_of(self.store.teams(), keypair) if keypair is not None else None

    def _as_member(self, actor: Actor | None, folder: SeenVFolder) -> SeenVFolder:
        """A project's folder as a keypair of that project sees it: the folder's own permission (at most rw), or wd
        for an admin of the project's domain."""
        if folder.project_id is None or folder.is_owner:
            return folder
        project = self.store.teams().projects.get(folder.project_id)
        if actor is not None and project is not None and actor.may_manage(project.domain_name):
            return msgspec.structs.replace(folder, permission="wd")
        return msgspec.structs.replace(folder, permission="ro" if folder.mount_permission == "ro" else "rw")

    async def _seen(self, access_key: str | None, status: str) -> list[SeenVFolder]:
        """The folders a keypair owns, that are shared with it, or of the projects it belongs to (every folder:
        None)."""
        if access_key is None:
            return await self.folders.vfolders_of(None, status)
        actor = self._actor(access_key)
        projects = sorted(actor.projects) if actor is not None else []
        rows = await self.folders.vfolders_of(access_key, status, projects)
        return [self._as_member(actor, r) for r in rows]

    async def visible(self, access_key: str, is_admin: bool, status: str = "ready") -> list[SeenVFolder]:
        """The folders a keypair owns, that are shared with it or of its projects (admins: every folder with
        all=True)."""
        return await self._seen(None if is_admin else access_key, status)

    async def resolve(
        self, ref: str, access_key: str, is_admin: bool, need: str = READ, status: str = "ready"
    ) -> SeenVFolder:
        """A folder by name or id as this keypair sees it (with `permission` and `is_owner`)."""
        rows = [r for r in await self._seen(access_key, status) if ref in (r.name, r.id)]
        if not rows and is_admin:
            rows = [r for r in await self.folders.vfolders_of(None, status) if ref in (r.id, r.name)]
        owned = [r for r in rows if r.is_owner]
        rows = owned or rows
        if not rows:
            raise not_found(ref)
        if len(rows) > 1:
            raise invalid(f"several folders called {ref!r} are shared with you: use the folder's id")
        folder = rows[0]
        if is_admin:
            folder = msgspec.structs.replace(
                folder, permission="wd", is_owner=folder.is_owner or folder.owner == access_key
            )
        if need == WRITE and folder.permission not in ("rw", "wd"):
            raise Problem("generic-forbidden", "Read-only folder.", f"folder {ref!r} is shared with you read-only")
        if need == OWNER and folder.permission != "wd":
            raise Problem(
                "generic-forbidden", "Not the owner.", f"only the owner of folder {ref!r} may do that (you may use it)"
            )
        return folder

    async def _policy(self, access_key: str) -> Policy:
        keypair = await self.accounts.keypair(access_key)
        policies = await self.accounts.policies()
        return policies.get(keypair.resource_policy if keypair else "default") or policies["default"]

    # -- folders --------------------------------------------------------------------------------------

    async def create(
        self,
        access_key: str,
        name: Any,
        host: Any = None,
        usage_mode: Any = "general",
        permission: Any = "rw",
        cloneable: Any = False,
        fill: Any = None,
        project: Any = None,
    ) -> SeenVFolder:
        """A new folder; `permission` is Backend.AI's innate permission (ro: every mount is read-only),
        `fill(path)` (in a thread) puts files in it before it appears (a clone). With `project` (a name or id: one
        the keypair belongs to), the project's folder: its members mount it with its permission."""
        check_name(name)
        owner, project_id, limit_of = access_key, None, None
        if project not in (None, ""):
            actor = self._actor(access_key)
            if actor is None:
                raise invalid(f"keypair {access_key} is inactive")
            teams = self.store.teams()
            found = project_for(teams, actor, None, project if isinstance(project, str) else str(project)[:256])
            owner, project_id = f"project:{found.id}", found.id
            policy = teams.project_policies.get(found.resource_policy)
            limit_of = policy.max_vfolder_count if policy is not None else 0
        host = host or self.default_host
        if not isinstance(host, str) or host not in self.hosts:
            raise invalid(f"no vfolder host {host!r} (hosts: {', '.join(sorted(self.hosts))})")
        if usage_mode not in ("general", "model", "data"):
            raise invalid("usage_mode must be general, model or data")
        permission = permission or "rw"
        if permission not in MOUNT_PERMISSIONS:
            raise invalid("permission must be ro, rw or wd")
        if not isinstance(cloneable, bool):
            raise invalid("cloneable must be true or false")
        limit = (await self._policy(access_key)).max_vfolder_count if limit_of is None else limit_of
        if limit and await self.folders.count_vfolders(owner) >= limit:
            whose = "your resource policy" if project_id is None else "the project's resource policy"
            raise Problem(
                "quota-exceeded",
                "Too many folders.",
                f"{whose} allows {limit} folders (folders in the trash count until purged)",
            )
        if project_id is None:
            await self._check_user_folders(access_key)
        if any(r.name == name and r.owner == owner for r in await self.folders.vfolders_of(owner)):
            raise Problem("generic-bad-request", "Folder exists.", f"there is already a folder called {name!r}")
        folder = NewVFolder(uuid.uuid4().hex, name, host, owner, usage_mode, permission, cloneable, project_id)
        path = self.hosts[host] / folder.id
        with storage_of(vfolder_host(host)):
            await asyncio.to_thread(fsops.make_folder, path, self.uid, self.gid)
        try:
            if fill is not None:
                with storage_of(vfolder_host(host)):
                    await asyncio.to_thread(fill, path)
            created = await self.folders.create_vfolder(folder, self.clock.now())
        except BaseException:  # (a full disk, say): no folder without its row, nor a half copy
            await asyncio.to_thread(shutil.rmtree, path, True)
            raise
        if not created:
            await asyncio.to_thread(shutil.rmtree, path, True)
            raise Problem("generic-bad-request", "Folder exists.", f"there is already a folder called {name!r}")
        return await self.resolve(folder.id, access_key, False)

    async def _check_user_folders(self, access_key: str) -> None:
        """A 412 when the keypair's user has as many folders (over all its keypairs) as its user resource policy
        allows (max_vfolder_count; 0: unlimited)."""
        teams = self.store.teams()
        user = teams.user_of(access_key)
        policy = teams.user_policies.get(user.resource_policy) if user is not None else None
        if user is None or policy is None or not policy.max_vfolder_count:
            return
        held = sum([await self.folders.count_vfolders(key) for key in teams.keys_of(user.uuid)])
        if held >= policy.max_vfolder_count:
            raise Problem(
                "quota-exceeded",
                "Too many folders.",
                f"user resource policy {policy.name} allows {policy.max_vfolder_count} folders per user, and "
                f"{user.email} has {held} (folders in the trash count until purged)",
            )

    async def clone(self, source: SeenVFolder, access_key: str, p: dict[str, Any]) -> SeenVFolder:
        """A new folder of the caller's with a copy of the source's files (Backend.AI's clone: the source
        must be cloneable; links are copied as links, fifos and devices left out)."""
        if not source.cloneable:
            raise Problem(
                "generic-forbidden", "Not cloneable.", f"folder {source.name!r} does not allow cloning "
                "(its owner may allow it: update-options --set-cloneable true)",
            )  # fmt: skip
        limit = (await self._policy(access_key)).max_vfolder_size
        if limit:
            used, _ = await asyncio.to_thread(fsops.usage, self.path_of(source))
            if used > limit:
                raise Problem(
                    "quota-exceeded",
                    "Folder quota exceeded.",
                    f"folder {source.name!r} holds {used} bytes; your folders may hold {limit}",
                )
        src_path = self.path_of(source)
        return await self.create(
            access_key,
            p.get("target_name"),
            p.get("target_host"),
            p.get("usage_mode") or "general",
            p.get("permission") or "rw",
            False if p.get("cloneable") is None else p.get("cloneable"),
            fill=lambda dst: fsops.copy_tree(src_path, dst, self.uid, self.gid),
        )

    async def update_options(self, folder: VFolder, permission: Any, cloneable: Any) -> None:
        if permission is not None and permission not in MOUNT_PERMISSIONS:
            raise invalid("permission must be ro, rw or wd")
        if cloneable is not None and not isinstance(cloneable, bool):
            raise invalid("cloneable must be true or false")
        if permission is not None or cloneable is not None:
            changes = FolderChanges(
                mount_permission=msgspec.UNSET if permission is None else permission,
                cloneable=msgspec.UNSET if cloneable is None else cloneable,
            )
            await self.folders.update_vfolder(folder.id, changes)

    async def describe(self, folder: SeenVFolder, with_usage: bool = True) -> dict[str, Any]:
        """The folder as the API shows it (Backend.AI's field names where the client reads them)."""
        out: dict[str, Any] = {
            "id": folder.id,
            "name": folder.name,
            "host": folder.host,
            "usage_mode": folder.usage_mode,
            "permission": shown_permission(folder),
            "is_owner": folder.is_owner,
            "owner": folder.owner,
            "user": folder.owner,
            "creator": folder.owner,
            "group": folder.project_id,
            "group_name": self._project_name(folder),
            "type": "group" if folder.project_id else "user",
            "ownership_type": "group" if folder.project_id else "user",
            "cloneable": folder.cloneable,
            "mount_permission": folder.mount_permission or "rw",
            "status": folder.status,
            "created_at": folder.created_at,
            "trashed_at": folder.trashed_at,
        }
        if with_usage:
            used, files = await asyncio.to_thread(fsops.usage, self.path_of(folder))
            out.update(used_bytes=used, numFiles=files, num_files=files)
            if folder.is_owner:
                out["shares"] = await self.folders.shares_of(folder.id)
        return out

    def _project_name(self, folder: VFolder) -> str | None:
        if folder.project_id is None:
            return None
        found = self.store.teams().projects.get(folder.project_id)
        return found.name if found is not None else folder.project_id

    async def shares_of(self, folder: VFolder) -> dict[str, str]:
        """Access key -> permission (ro / rw) of the folder's shares."""
        return await self.folders.shares_of(folder.id)

    async def all_shares(self, folder_id: str | None = None) -> list[FolderShare]:
        """Every share (of one folder, or of all), with its folder's name, owner and status."""
        return await self.folders.all_shares(folder_id)

    async def rename(self, folder: VFolder, new_name: Any) -> None:
        check_name(new_name)
        if not await self.folders.update_vfolder(folder.id, FolderChanges(name=new_name)):
            raise Problem("generic-bad-request", "Folder exists.", f"a folder called {new_name!r} exists already")

    async def _mounted_by(self, folder_id: str) -> list[str]:
        rows = await self.store.list_sessions(None, ACTIVE_STATUSES)
        return [r.name for r in rows if any(m["id"] == folder_id for m in r.config.get("mounts") or [])]

    async def trash(self, folder: VFolder) -> None:
        if users := await self._mounted_by(folder.id):
            raise Problem("generic-bad-request", "Folder in use.", f"folder {folder.name!r} is mounted by {users}")
        trashed = FolderChanges(status="trashed", trashed_at=stamp(self.clock.now()))
        await self.folders.update_vfolder(folder.id, trashed)

    async def restore(self, folder: VFolder) -> None:
        if not await self.folders.update_vfolder(folder.id, FolderChanges(status="ready", trashed_at=None)):
            raise Problem("generic-bad-request", "Folder exists.", f"you have another folder called {folder.name!r}")

    async def purge(self, folder: VFolder) -> None:
        """Delete a trashed folder and everything in it (no way back)."""
        if folder.status != "trashed":
            raise invalid(f"folder {folder.name!r} is not in the trash: remove it first")
        # the files first: on a full disk, that is what frees space (for the row's deletion too)
        await asyncio.to_thread(shutil.rmtree, self.path_of(folder), True)  # rmtree does not follow links
        try:
            await self.folders.delete_vfolder(folder.id)
        except Exception as e:
            if not is_disk_full(e):
                raise
            changed = f"the files of folder {folder.name!r} were deleted, but it stays in the trash: purge it again"
            raise StorageFull(DATABASE, e, changed) from e

    async def keypairs_named(self, who: Any, but: str | None = None) -> list[str]:
        """The one rule for naming users (Backend.AI names them by email): each name is an access key, a
        user id, the user's UUID (what `admin user list` prints) or the user's email (`email_of`: the user id
        itself, or `<user id>@bai.local`); a user id or email means every keypair of that user. Every name must
        match; `but` (the owner) is left out."""
        if isinstance(who, str):
            who = [who]
        if not isinstance(who, list) or not who or not all(isinstance(w, str) and w for w in who):
            raise invalid("say with whom: a list of access keys or user ids (emails)")
        keypairs = await self.accounts.keypairs(active_only=False)
        users = self.store.teams().users
        targets: list[str] = []
        for w in who:
            found = [
                ak
                for ak, kp in keypairs.items()
                if w in (ak, kp.user_id, email_of(kp.user_id))
                or (kp.user_uuid and _uuid_text(w) == _uuid_text(kp.user_uuid))
                or (kp.user_uuid in users and w in (users[kp.user_uuid].email, users[kp.user_uuid].username))
            ]
            if not found:
                raise invalid(f"no keypair or user {w!r}")
            targets += [ak for ak in found if ak != but and ak not in targets]
        return targets

    async def email_of_keypair(self, access_key: str) -> str:
        user = self.store.teams().user_of(access_key)
        if user is not None:
            return user.email
        kp = await self.accounts.keypair(access_key)
        return email_of(kp.user_id) if kp else access_key

    async def keypair_exists(self, access_key: str) -> bool:
        """Whether there is such a keypair (active or not)."""
        return await self.accounts.keypair(access_key) is not None

    async def share(self, folder: VFolder, who: Any, permission: str | None) -> list[str]:
        """Share with keypairs (access keys or user ids) as ro / rw, or stop sharing (permission None)."""
        if permission is not None and permission not in SHARE_PERMISSIONS:
            raise invalid(f"permission must be ro or rw (bai shares read-only or read-write), not {permission!r}")
        targets = await self.keypairs_named(who, but=folder.owner)
        for ak in targets:
            await self.folders.share_vfolder(folder.id, ak, permission)
        return targets

    async def invite(self, folder: VFolder, inviter: str, who: Any, permission: Any) -> list[str]:
        """Invitations (Backend.AI's way to share a user's folder): the share appears when the invitee
        accepts. Returns the emails (`email_of`) of those invited now."""
        if permission not in SHARE_PERMISSIONS:
            raise invalid(f"permission must be ro or rw (bai shares read-only or read-write), not {permission!r}")
        targets = await self.keypairs_named(who, but=folder.owner)
        shared = await self.folders.shares_of(folder.id)
        if already := [ak for ak in targets if ak in shared]:
            msg = f"folder {folder.name!r} is shared with {', '.join(already)}"
            raise Problem("generic-bad-request", "Already shared.", msg)
        invited = await self.folders.invite(folder.id, inviter, targets, permission, self.clock.now())
        return list(dict.fromkeys([await self.email_of_keypair(ak) for ak in invited]))

    async def invitations(self, access_key: str, sent: bool = False) -> list[dict[str, Any]]:
        """Pending invitations to a keypair (or sent by it), as Backend.AI lists them."""
        if sent:
            rows = await self.folders.invitations(inviter=access_key)
        else:
            rows = await self.folders.invitations(invitee=access_key)
        return [
            {
                "id": r.id,
                "inviter": await self.email_of_keypair(r.inviter),
                "invitee": await self.email_of_keypair(r.invitee),
                "perm": r.permission,
                "state": r.state,
                "created_at": r.created_at,
                "modified_at": r.modified_at,
                "vfolder_id": r.vfolder_id,
                "vfolder_name": r.vfolder_name,
            }
            for r in rows
        ]

    async def answer_invitation(self, access_key: str, invitation_id: Any, accept: bool) -> None:
        """The invitee accepts or rejects; the inviter (or the folder's owner) cancels."""
        if not isinstance(invitation_id, str) or not invitation_id:
            raise invalid("inv_id must be an invitation's id")
        rows = await self.folders.invitations(invitation_id=invitation_id)
        missing = Problem("object-not-found", "No such invitation.", f"no pending invitation {invitation_id!r}")
        if not rows:
            raise missing
        inv = rows[0]
        if access_key == inv.invitee:
            state = "accepted" if accept else "rejected"
            if accept:
                names = {r.name for r in await self.folders.vfolders_of(access_key)}
                if inv.vfolder_name in names:
                    raise Problem(
                        "generic-bad-request",
                        "Folder exists.",
                        f"you already have a folder called {inv.vfolder_name!r}: rename it first",
                    )
        elif not accept and access_key == inv.inviter:
            state = "canceled"
        else:
            raise missing  # (someone else's invitation: as if there were none)
        if await self.folders.close_invitation(invitation_id, state, self.clock.now()) is None:
            raise missing

    async def change_owner(self, folder: VFolder, who: Any) -> None:
        """Give a folder to another keypair (named by the same rule as shares: one keypair only)."""
        targets = await self.keypairs_named(who)
        if len(targets) != 1:
            raise invalid(f"{who!r} has {len(targets)} keypairs: name the new owner by access key")
        new_owner = targets[0]
        if new_owner == folder.owner:
            return
        if not await self.folders.update_vfolder(folder.id, FolderChanges(owner=new_owner)):
            msg = f"{new_owner} has a folder called {folder.name!r}"
            raise Problem("generic-bad-request", "Folder exists.", msg)
        await self.folders.share_vfolder(folder.id, new_owner, None)

    async def leave(self, folder: VFolder, access_key: str) -> None:
        if folder.owner == access_key:
            raise invalid(f"you own folder {folder.name!r}: you cannot leave it (remove it instead)")
        if access_key not in await self.folders.shares_of(folder.id):
            raise invalid(f"folder {folder.name!r} is not shared with {access_key}")
        await self.folders.share_vfolder(folder.id, access_key, None)

    # -- files ----------------------------------------------------------------------------------------

    async def fs(self, fn: Any, folder: VFolder, *args: Any, **kw: Any) -> Any:
        """Run an fsops function on the folder in a thread, turning its refusals into API problems."""
        try:
            with storage_of(vfolder_host(folder.host)):
                return await asyncio.to_thread(fn, self.path_of(folder), *args, **kw)
        except fsops.PathRefused as e:
            raise invalid(str(e)) from None
        except fsops.NotFound as e:
            raise Problem("object-not-found", "No such file.", str(e)) from None
        except fsops.AlreadyExists as e:
            raise Problem("generic-bad-request", "File exists.", str(e) or "it exists already") from None

    async def request_upload(self, folder: VFolder, path: Any, size: Any) -> str:
        if not isinstance(path, str):
            raise invalid("path must be the file's path in the folder")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise invalid("size must be the file's size in bytes")
        try:
            fsops.clean_relpath(path)
        except fsops.PathRefused as e:
            raise invalid(str(e)) from None
        await self.check_quota(folder, size)
        token = secrets.token_urlsafe(24)
        staging = self.staging[folder.host]
        with storage_of(vfolder_host(folder.host)):
            await asyncio.to_thread(staging.create, token)
        self.grants[token] = Grant("upload", folder.id, path, size, time.monotonic() + TOKEN_TTL)
        if size == 0:  # nothing will be sent: the file appears now
            await self._commit(token)
        return token

    async def check_quota(self, folder: VFolder, incoming: int) -> None:
        limit = (await self._policy(folder.owner)).max_vfolder_size
        if not limit:
            return
        used, _ = await asyncio.to_thread(fsops.usage, self.path_of(folder))
        if used + incoming > limit:
            raise Problem(
                "quota-exceeded",
                "Folder quota exceeded.",
                f"folder {folder.name!r} holds {used} bytes of its {limit}; {incoming} more do not fit",
            )

    def grant(self, token: str, op: str) -> Grant:
        g = self.grants.get(token)
        if g is None or g.op != op or g.expires < time.monotonic():
            raise Problem("auth-failed", "Invalid or expired token.", f"no valid {op} token", status=401)
        return g

    async def append(self, token: str, data: bytes, offset: int) -> int:
        """Add a chunk to an upload; when the upload is complete the file appears in the folder."""
        g = self.grant(token, "upload")
        folder = await self.folders.get_vfolder(g.folder_id)
        if folder is None:
            raise not_found(g.folder_id)
        if offset + len(data) > g.size:
            raise invalid(f"the upload is {g.size} bytes; this chunk goes past its end")
        staging = self.staging[folder.host]
        try:  # (on a full disk the upload stays at `offset`, to be resumed once there is space)
            with storage_of(vfolder_host(folder.host)):
                size = await asyncio.to_thread(staging.append, token, data, offset)
        except ValueError as e:
            raise invalid(str(e)) from None
        if size >= g.size:
            await self._commit(token)
        return size

    async def upload_offset(self, token: str) -> tuple[int, int]:
        g = self.grant(token, "upload")
        folder = await self.folders.get_vfolder(g.folder_id)
        if folder is None:
            raise not_found(g.folder_id)
        try:
            return await asyncio.to_thread(self.staging[folder.host].size, token), g.size
        except fsops.NotFound:
            return g.size, g.size  # committed already

    async def _commit(self, token: str) -> None:
        g = self.grants.pop(token)
        folder = await self.folders.get_vfolder(g.folder_id)
        staging = self.staging[folder.host] if folder else None
        try:
            if folder is None or staging is None:
                raise not_found(g.folder_id)
            await self.check_quota(folder, 0)
            with storage_of(vfolder_host(folder.host)):
                await asyncio.to_thread(staging.commit, token, self.path_of(folder), g.path, uid=self.uid, gid=self.gid)
        except fsops.PathRefused as e:
            raise invalid(str(e)) from None
        finally:
            if staging is not None:
                await asyncio.to_thread(staging.discard, token)

    async def request_download(self, folder: VFolder, path: Any) -> str:
        """A download token: a file as it is, a directory (or "" / ".", the whole folder) as a zip, as
        Backend.AI's storage proxy serves a directory (there only when asked with `archive`)."""
        if not isinstance(path, str):
            raise invalid("path must be the file's path in the folder")
        entry = await self.fs(fsops.stat, folder, path)
        archive = entry["type"] == "dir"
        if not archive:
            fd, size = await self.fs(fsops.open_read, folder, path)  # refuses now what cannot be read
            os.close(fd)
        else:
            size = -1
        token = secrets.token_urlsafe(24)
        self.grants[token] = Grant("download", folder.id, path, size, time.monotonic() + TOKEN_TTL, archive)
        return token

    async def open_download(self, token: str) -> tuple[int, int, str, str]:
        """(fd, size, file name, content type) of what a download token gives."""
        g = self.grant(token, "download")
        folder = await self.folders.get_vfolder(g.folder_id)
        if folder is None:
            raise not_found(g.folder_id)
        if g.archive:
            name = (g.path.strip("/").rsplit("/", 1)[-1] if g.path.strip("/.") else folder.name) + ".zip"
            fd = await self.fs(self._zip, folder, g.path, self.staging[folder.host].dir)
            return fd, os.fstat(fd).st_size, name, "application/zip"
        fd, size = await self.fs(fsops.open_read, folder, g.path)
        return fd, size, g.path.rsplit("/", 1)[-1], "application/octet-stream"

    @staticmethod
    def _zip(root: Path, path: str, scratch: Path) -> int:
        """A zip of a directory in a file with no name (in the host's staging folder: gone once closed),
        so that its size is known before it is sent (the official client needs Content-Length)."""
        with tempfile.TemporaryFile(dir=scratch) as f:
            fsops.zip_dir(root, path, f)
            f.flush()
            return os.dup(f.fileno())

    async def sweep(self) -> None:
        """Forget expired tokens and remove staging files of abandoned uploads."""
        now = time.monotonic()
        for token in [t for t, g in self.grants.items() if g.expires < now]:
            del self.grants[token]
        for staging in self.staging.values():
            await asyncio.to_thread(staging.sweep, TOKEN_TTL)

    # -- mounts ---------------------------------------------------------------------------------------

    async def mounts_for(self, access_key: str, is_admin: bool, requests: list[MountRequest]) -> list[dict[str, Any]]:
        """What a new session mounts: each requested folder, read-only when asked or when only shared `ro`."""
        out = []
        for req in requests:
            folder = await self.resolve(req.name, access_key, is_admin)
            out.append(
                {
                    "id": folder.id,
                    "name": folder.name,
                    "host": folder.host,
                    "target": req.target,
                    "read_only": req.read_only or "ro" in (folder.permission, folder.mount_permission),
                }
            )
        return out


def _uuid_text(text: str) -> str:
    """A UUID as one spelling (no dashes, lower case): Backend.AI's clients send either."""
    return text.replace("-", "").lower()
