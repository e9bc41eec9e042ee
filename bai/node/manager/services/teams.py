"""Domains, projects, users, scaling groups and their associations, users' and projects' resource policies, as the
API (REST, GraphQL, the official clients) reads and changes them: every input validated here, in one way, and every
act allowed by `rules/access.py` (a superadmin: everything; a domain admin: its domain's users and projects; a user:
itself and its projects, read only).

Problems are 4xx: a 403 for what the actor may not do, a 404 for what it cannot see (the same for what is not there,
so that nobody learns of another domain's names), a 400 for bad input, a 409 for a name taken.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Protocol

from bai.common import slots as slotlib
from bai.common.clock import Clock
from bai.common.passwords import MAX_PASSWORD, MIN_PASSWORD, hash_password, verify_password
from bai.common.problems import Problem, invalid
from bai.common.status import OCCUPYING_STATUSES
from bai.node.manager.rules.access import (
    Actor,
    actor_of,
    may_see_project,
    may_see_user,
    project_cap,
    usable_scaling_groups,
)
from bai.node.manager.state.protocols import AccountState, TeamState
from bai.node.manager.state.records import Keypair, stamp
from bai.node.manager.state.team_records import (
    PROJECT_POLICY_DEFAULTS,
    ROLES,
    USER_POLICY_DEFAULTS,
    USER_STATUSES,
    Domain,
    Project,
    ProjectPolicy,
    ScalingGroup,
    TeamDirectory,
    User,
    UserChanges,
    UserPolicy,
)

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # a domain's, project's, scaling group's or policy's name
EMAIL = re.compile(r"[^@\s\x00-\x1f]{1,64}@[^@\s\x00-\x1f]{1,190}")
MAX_TEXT = 1024  # characters of a description or a full name
HOST_PERMISSIONS = ("create-vfolder", "modify-vfolder", "delete-vfolder", "mount-in-session", "upload-file",
                    "download-file", "invite-others", "set-user-specific-permission")  # fmt: skip


CHECKS_AT_ONCE = 4  # password hashes computed at once (each takes about 16 MiB of memory and tens of milliseconds)
_CHECKS = asyncio.Semaphore(CHECKS_AT_ONCE)
_dummy: list[str] = []


def _dummy_hash() -> str:
    """A hash no password matches, checked for a user that does not exist (so that it takes the same time)."""
    if not _dummy:
        _dummy.append(hash_password(secrets.token_hex(16)))
    return _dummy[0]


async def _hashed(password: str) -> str:
    async with _CHECKS:
        return await asyncio.to_thread(hash_password, password)


class TeamsState(TeamState, AccountState, Protocol):
    """(what the service asks of the state: the teams, and the keypairs they own)"""


def forbidden(msg: str) -> Problem:
    return Problem("insufficient-privilege", "Insufficient privilege.", msg)


def not_found(msg: str) -> Problem:
    return Problem("object-not-found", "No such object.", msg)


def taken(msg: str) -> Problem:
    return Problem("generic-bad-request", "Already exists.", msg, status=409)


# -- one validation of every field ---------------------------------------------------------------------------


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not NAME.fullmatch(value):
        raise invalid(
            f"{what} must be a name of 1 to 64 letters, digits, '.', '_' or '-' (starting with one of the first two)"
        )
    return value


def _text(value: Any, what: str, *, empty: bool = True, limit: int = MAX_TEXT) -> str:
    if value is None and empty:
        return ""
    if not isinstance(value, str) or "\0" in value or len(value) > limit or (not empty and not value.strip()):
        raise invalid(f"{what} must be text of at most {limit} characters, without NUL")
    return value


def _bool(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise invalid(f"{what} must be true or false")
    return value


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**62:
        raise invalid(f"{what} must be a whole number >= 0 (0 = unlimited)")
    return value


def slot_amounts(value: Any, what: str) -> dict[str, str]:
    """A map of slot amounts as a client gives it (an object, or its JSON text), checked: its wire form; a 400 naming
    what is wrong."""
    if isinstance(value, str):  # (the official client sends a JSONString: decoded by GraphQL; REST may send text)
        from bai.common import safejson

        try:
            value = safejson.loads(value, what=what) if value.strip() else {}
        except ValueError:
            raise invalid(f"{what} must be an object of slot amounts") from None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid(f'{what} must be an object of slot amounts ({{"cuda.device": 8}})')
    if len(value) > 64:
        raise invalid(f"{what} names at most 64 slots")
    parsed = {}
    for slot, amount in value.items():
        try:
            parsed.update(slotlib.parse_slots({slot: amount}))
        except slotlib.SlotError as e:
            raise invalid(f"{what}.{str(slot)[:40]}: {e}") from None
    return slotlib.to_wire(parsed)


def _host_permissions(value: Any, what: str) -> dict[str, list[str]]:
    if isinstance(value, str):
        from bai.common import safejson

        try:
            value = safejson.loads(value, what=what) if value.strip() else {}
        except ValueError:
            raise invalid(f"{what} must be an object of host -> permissions") from None
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > 64:
        raise invalid(f"{what} must be an object of at most 64 hosts, each a list of permissions")
    out = {}
    for host, perms in value.items():
        if not isinstance(perms, list) or not all(isinstance(p, str) and p in HOST_PERMISSIONS for p in perms):
            raise invalid(f"{what}.{str(host)[:40]} must be a list of: {', '.join(HOST_PERMISSIONS)}")
        out[_name(host, f"{what} host")] = sorted(set(perms))
    return out


def _names(value: Any, what: str) -> list[str]:
    if (
        not isinstance(value, list)
        or len(value) > 256
        or not all(isinstance(v, str) and 0 < len(v) <= 256 for v in value)
    ):
        raise invalid(f"{what} must be a list of at most 256 names")
    return list(dict.fromkeys(value))


def _one_of(value: Any, what: str, allowed: Iterable[str]) -> str:
    choices = tuple(allowed)
    text = value.lower() if isinstance(value, str) else value
    if text not in choices:
        raise invalid(f"{what} must be one of {', '.join(choices)}")
    return str(text)


def _email(value: Any) -> str:
    if not isinstance(value, str) or len(value) > 254 or not EMAIL.fullmatch(value):
        raise invalid("email must be an address such as alice@example.com")
    return value


def _password(value: Any) -> str:
    if not isinstance(value, str) or not MIN_PASSWORD <= len(value) <= MAX_PASSWORD or "\0" in value:
        raise invalid(f"a password is {MIN_PASSWORD} to {MAX_PASSWORD} characters (without NUL)")
    return value


def _only(props: Any, allowed: Iterable[str], what: str, ignored: Iterable[str] = ()) -> dict[str, Any]:
    """The props of a write (an object), those Backend.AI has but bai keeps nothing of dropped, any other refused."""
    if not isinstance(props, dict):
        raise invalid(f"{what} must be an object")
    allowed, ignored = set(allowed), set(ignored)
    unknown = set(props) - allowed - ignored
    if unknown:
        raise invalid(f"unknown fields of {what}: {', '.join(sorted(map(str, unknown)))[:200]}")
    return {k: v for k, v in props.items() if k in allowed}


# the fields of each kind of record a write may set, and how each is read (Backend.AI's inputs; `ignored`: fields
# Backend.AI has that bai keeps nothing of, accepted so that its clients work)
_FIELD_READERS: dict[str, Callable[[Any, str], Any]] = {
    "description": _text,
    "full_name": _text,
    "is_active": _bool,
    "is_public": _bool,
    "need_password_change": _bool,
    "total_resource_slots": slot_amounts,
    "allowed_vfolder_hosts": _host_permissions,
    "allowed_docker_registries": _names,
    "max_vfolder_count": _count,
    "max_quota_scope_size": _count,
    "max_session_count_per_model_session": _count,
    "max_customized_image_count": _count,
    "max_network_count": _count,
    "resource_policy": _name,
    "name": _name,
}
_DOMAIN_FIELDS = (
    "description",
    "is_active",
    "total_resource_slots",
    "allowed_vfolder_hosts",
    "allowed_docker_registries",
)
_PROJECT_FIELDS = ("description", "is_active", "total_resource_slots", "allowed_vfolder_hosts", "resource_policy")
_SGROUP_FIELDS = ("description", "is_active", "is_public")
_SGROUP_IGNORED = ("driver", "driver_opts", "scheduler", "scheduler_opts", "wsproxy_addr", "wsproxy_api_token",
                   "use_host_network")  # fmt: skip
_IGNORED = ("integration_id", "type", "container_registry", "dotfiles")


def _read_fields(props: dict[str, Any], what: str) -> dict[str, Any]:
    return {k: _FIELD_READERS[k](v, f"{what}.{k}") for k, v in props.items()}


@dataclass(frozen=True)
class ProjectUsage:
    """What a project's sessions hold now, and its cap."""

    project: Project
    sessions: int
    occupied: dict[str, Decimal]
    cap: dict[str, Decimal]


class Teams:
    """Teams, as the API reads and changes them (`actor`: who asks; from `actor_for`)."""

    def __init__(self, state: TeamsState, clock: Clock) -> None:
        self.state = state
        self.clock = clock
        # what ends the open streams of a keypair that no longer signs (the HTTP layer's: set by the app)
        self.close_streams: Callable[[str], int] = lambda _key: 0

    @property
    def directory(self) -> TeamDirectory:
        return self.state.teams()

    def actor_for(self, keypair: Keypair) -> Actor:
        return actor_of(self.state.teams(), keypair)

    def actor(self, access_key: str) -> Actor:
        keypair = self.state.active_keypair(access_key)
        if keypair is None:
            raise Problem("auth-failed", "Authentication failed.", f"keypair {access_key} is inactive", status=401)
        return self.actor_for(keypair)

    async def _written(self, write: Any) -> Any:
        """Await a write; the keypairs that signed before it and no longer do have their open streams closed."""
        before = set(self._signing())
        answer = await write
        for key in before - set(self._signing()):
            self.close_streams(key)
        return answer

    def _signing(self) -> list[str]:
        return [k for k in self.state.teams().keypair_users if self.state.active_keypair(k) is not None]

    # -- domains ---------------------------------------------------------------------------------------------

    def domains(self, actor: Actor) -> list[Domain]:
        return sorted(
            (d for d in self.directory.domains.values() if self.may_see_domain(actor, d.name)), key=lambda d: d.name
        )

    def may_see_domain(self, actor: Actor, name: str) -> bool:
        return actor.is_superadmin or name == actor.domain

    def domain(self, actor: Actor, name: str) -> Domain:
        found = self.directory.domains.get(name)
        if found is None or not self.may_see_domain(actor, name):
            raise not_found(f"no domain {str(name)[:64]!r}")
        return found

    async def create_domain(self, actor: Actor, name: Any, props: Any) -> Domain:
        self._superadmin(actor, "create domains")
        name = _name(name, "a domain's name")
        fields = _read_fields(_only(props, _DOMAIN_FIELDS, "the domain", _IGNORED), "domain")
        now = stamp(self.clock.now())
        row = Domain(**{"description": "", "is_active": True, "total_resource_slots": {}, "allowed_vfolder_hosts": {},
                        "allowed_docker_registries": [], **fields, "name": name, "created_at": now,
                        "modified_at": now})  # fmt: skip
        if not await self.state.create_team_record(row, self.clock.now()):
            raise taken(f"domain {name} exists")
        return self.directory.domains[name]

    async def modify_domain(self, actor: Actor, name: Any, props: Any) -> Domain:
        self._superadmin(actor, "change domains")
        found = self.domain(actor, name)
        fields = _read_fields(_only(props, _DOMAIN_FIELDS, "the domain", _IGNORED), "domain")
        await self._written(self.state.update_team_record(Domain, found.name, fields, self.clock.now()))
        return self.directory.domains[found.name]

    async def delete_domain(self, actor: Actor, name: Any) -> Domain:
        """Deactivate a domain (Backend.AI's delete): its users' keypairs stop signing at once."""
        return await self.modify_domain(actor, name, {"is_active": False})

    async def purge_domain(self, actor: Actor, name: Any) -> None:
        self._superadmin(actor, "purge domains")
        found = self.domain(actor, name)
        why = await self.state.delete_team_record(Domain, found.name, self.clock.now())
        if why is not None:
            raise invalid(f"domain {found.name} cannot be purged: {why}")

    # -- projects --------------------------------------------------------------------------------------------

    def projects(self, actor: Actor, domain: str | None = None, active: bool | None = None) -> list[Project]:
        out = [
            p
            for p in self.directory.projects.values()
            if may_see_project(actor, p)
            and (domain is None or p.domain_name == domain)
            and (active is None or p.is_active == active)
        ]
        return sorted(out, key=lambda p: (p.domain_name, p.name))

    def project(self, actor: Actor, ref: Any, domain: str | None = None) -> Project:
        """A project by id, or by name in `domain` (the actor's by default), as the actor may see it (a 404)."""
        if not isinstance(ref, str) or not 0 < len(ref) <= 256:
            raise invalid("a project is named by its id or its name")
        if domain is None and "/" in ref:  # DOMAIN/NAME
            domain, ref = ref.split("/", 1)
        found = self.directory.project_named(domain or actor.domain, ref)
        if found is None and domain is None:  # (not in the actor's domain: one of that name it may see elsewhere)
            elsewhere = [p for p in self.directory.projects.values() if p.name == ref and may_see_project(actor, p)]
            if len(elsewhere) > 1:
                where = ", ".join(sorted(f"{p.domain_name}/{p.name}" for p in elsewhere))
                raise invalid(
                    f"several projects are called {ref[:64]!r} ({where}): give the domain (DOMAIN/NAME) or the id"
                )
            found = elsewhere[0] if elsewhere else None
        if found is None or not may_see_project(actor, found) or (domain is not None and found.domain_name != domain):
            raise not_found(f"no project {ref[:64]!r} of yours in domain {(domain or actor.domain)[:64]}")
        return found

    def _managed_domain(self, actor: Actor, name: Any, what: str) -> str:
        """The domain a new project or user goes in (the actor's by default): a 404 when the actor may not see it,
        a 403 when it does not manage it."""
        domain = name or actor.domain
        if (
            not isinstance(domain, str)
            or domain not in self.directory.domains
            or not self.may_see_domain(actor, domain)
        ):
            raise not_found(f"no domain {str(domain)[:64]!r}")
        if not actor.may_manage(domain):
            raise forbidden(f"only an admin of domain {domain} {what}")
        return domain

    def _manage_project(self, actor: Actor, project: Project) -> None:
        if not actor.may_manage(project.domain_name):
            raise forbidden(f"only an admin of domain {project.domain_name} changes its projects")

    async def create_project(self, actor: Actor, name: Any, props: Any) -> Project:
        props = _only(props, (*_PROJECT_FIELDS, "domain_name"), "the project", _IGNORED)
        name = _name(name, "a project's name")
        domain = self._managed_domain(actor, props.pop("domain_name", None), "creates its projects")
        fields = _read_fields(props, "project")
        self._check_policy(fields.get("resource_policy"), self.directory.project_policies, "project resource policy")
        now = stamp(self.clock.now())
        row = Project(**{"description": "", "is_active": True, "total_resource_slots": {}, "allowed_vfolder_hosts": {},
                         "resource_policy": "default", **fields, "id": str(uuid.uuid4()), "name": name,
                         "domain_name": domain, "created_at": now, "modified_at": now})  # fmt: skip
        if not await self.state.create_team_record(row, self.clock.now()):
            raise taken(f"domain {domain} has a project {name}")
        return self.directory.projects[row.id]

    async def modify_project(self, actor: Actor, ref: Any, props: Any) -> Project:
        """Change a project; `user_update_mode` add / remove with `user_uuids` (Backend.AI's) changes its members."""
        found = self.project(actor, ref)
        self._manage_project(actor, found)
        props = _only(props, (*_PROJECT_FIELDS, "name", "user_update_mode", "user_uuids"), "the project", _IGNORED)
        mode = props.pop("user_update_mode", None)
        users = props.pop("user_uuids", None)
        fields = _read_fields(props, "project")
        self._check_policy(fields.get("resource_policy"), self.directory.project_policies, "project resource policy")
        if fields:
            done = await self.state.update_team_record(Project, found.id, fields, self.clock.now())
            if done is None:
                raise taken(f"domain {found.domain_name} has a project {fields.get('name')}")
        if mode is not None or users is not None:
            mode = _one_of(mode, "user_update_mode", ("add", "remove"))
            await self.set_members(actor, found.id, _names(users or [], "user_uuids"), mode == "add")
        return self.directory.projects[found.id]

    async def set_members(self, actor: Actor, project_id: str, users: list[str], add: bool) -> Project:
        """Add users (uuids, emails or usernames) to a project of the actor's domain, or remove them."""
        found = self.project(actor, project_id)
        self._manage_project(actor, found)
        uuids = []
        for ref in users:
            user = self.directory.user_named(ref)
            if user is None or not may_see_user(actor, user):
                raise not_found(f"no user {ref[:64]!r}")
            if user.domain_name != found.domain_name:
                raise invalid(
                    f"user {user.email} is of domain {user.domain_name}, project {found.name} of {found.domain_name}"
                )
            uuids.append(user.uuid)
        await self.state.set_members(found.id, uuids if add else [], [] if add else uuids, self.clock.now())
        return self.directory.projects[found.id]

    async def delete_project(self, actor: Actor, ref: Any) -> Project:
        """Deactivate a project (Backend.AI's delete): no new session or folder in it."""
        found = self.project(actor, ref)
        self._manage_project(actor, found)
        await self.state.update_team_record(Project, found.id, {"is_active": False}, self.clock.now())
        return self.directory.projects[found.id]

    async def purge_project(self, actor: Actor, ref: Any) -> None:
        found = self.project(actor, ref)
        self._manage_project(actor, found)
        why = await self.state.delete_team_record(Project, found.id, self.clock.now())
        if why is not None:
            raise invalid(f"project {found.name} cannot be purged: {why}")

    def members(self, actor: Actor, project: Project) -> list[User]:
        if not actor.may_manage(project.domain_name):
            return [u for u in [actor.user] if u is not None and project.id in actor.projects]
        uuids = self.directory.members.get(project.id, frozenset())
        return sorted((self.directory.users[u] for u in uuids if u in self.directory.users), key=lambda u: u.email)

    async def usage(self, actor: Actor) -> list[ProjectUsage]:
        """The projects the actor may see, with what their sessions hold now and their caps."""
        seen = self.projects(actor)
        if not seen:
            return []
        held = await self.state.project_usage(OCCUPYING_STATUSES)  # (what holds slots: not PENDING)
        out = []
        for p in seen:
            count, kernels = held.get(p.id, (0, []))
            occupied: dict[str, Decimal] = {}
            for slots in kernels:
                occupied = slotlib.add(occupied, slotlib.from_wire(slots))
            out.append(ProjectUsage(p, count, occupied, project_cap(self.directory, p)))
        return out

    # -- users -----------------------------------------------------------------------------------------------

    def users(
        self, actor: Actor, domain: str | None = None, project: str | None = None, status: str | None = None
    ) -> list[User]:
        """The users the actor may see, of a domain, project (id) and status; a 400 for a status there is not, a 404
        for a domain it may not see."""
        if status is not None:
            status = _one_of(status, "status", USER_STATUSES)
        if domain is not None:
            self.domain(actor, domain)
        members = self.directory.members.get(project, frozenset()) if project is not None else None
        out = [
            u
            for u in self.directory.users.values()
            if may_see_user(actor, u)
            and (domain is None or u.domain_name == domain)
            and (members is None or u.uuid in members)
            and (status is None or u.status == status.lower())
        ]
        return sorted(out, key=lambda u: u.email)

    def user(self, actor: Actor, ref: Any) -> User:
        """A user by email, username or uuid, as the actor may see it (a 404 otherwise)."""
        if not isinstance(ref, str) or not 0 < len(ref) <= 256:
            raise invalid("a user is named by its email, username or id")
        found = self.directory.user_named(ref)
        if found is None or not may_see_user(actor, found):
            raise not_found(f"no user {ref[:64]!r}")
        return found

    def projects_of(self, user: User) -> list[Project]:
        return self.directory.projects_of(user.uuid)

    def _role_allowed(self, actor: Actor, role: str) -> None:
        if role == "superadmin" and not actor.is_superadmin:
            raise forbidden("only a superadmin makes superadmins")

    def _user_projects(self, actor: Actor, domain: str, refs: Any) -> list[str]:
        ids = []
        for ref in _names(refs, "group_ids"):
            project = self.directory.project_named(domain, ref)
            if project is None or project.domain_name != domain or not may_see_project(actor, project):
                raise not_found(f"no project {ref[:64]!r} in domain {domain}")
            ids.append(project.id)
        return ids

    _USER_FIELDS = ("username", "password", "need_password_change", "full_name", "description", "is_active", "status",
                    "domain_name", "role", "group_ids", "resource_policy")  # fmt: skip
    _USER_IGNORED = ("allowed_client_ip", "totp_activated", "sudo_session_enabled", "main_access_key", "type",
                     "container_uid", "container_main_gid", "container_gids")  # fmt: skip

    def _user_fields(self, actor: Actor, props: dict[str, Any], domain: str) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        for key, value in props.items():
            if key == "username":
                if value not in ("", None):  # (Backend.AI's clients send "" for none: the email is the username)
                    fields[key] = _text(value, "username", empty=False, limit=64)
            elif key == "password":
                fields[key] = _password(value)  # (hashed by the caller, in a thread: see _hashed)
            elif key in ("full_name", "description"):
                fields[key] = _text(value, key)
            elif key == "need_password_change":
                fields[key] = _bool(value, key)
            elif key == "is_active":
                fields["status"] = "active" if _bool(value, key) else "inactive"
            elif key == "status":
                fields[key] = _one_of(value, "status", USER_STATUSES)
            elif key == "role":
                fields[key] = _one_of(value, "role", ROLES)
                self._role_allowed(actor, fields[key])
            elif key == "resource_policy":
                fields[key] = _name(value, "resource_policy")
                self._check_policy(fields[key], self.directory.user_policies, "user resource policy")
            elif key == "group_ids":
                fields["projects"] = self._user_projects(actor, domain, value)
        return fields

    async def create_user(self, actor: Actor, email: Any, props: Any) -> User:
        email = _email(email)
        props = _only(props, self._USER_FIELDS, "the user", self._USER_IGNORED)
        domain = self._managed_domain(actor, props.pop("domain_name", None), "adds its users")
        if "password" not in props:
            raise invalid("a new user needs a password")
        fields = self._user_fields(actor, props, domain)
        projects = fields.pop("projects", None)
        if projects is None:  # (as Backend.AI: a new user joins its domain's default project, if it has one)
            default = self.directory.project_named(domain, "default")
            projects = [default.id] if default is not None and default.domain_name == domain else []
        password = await _hashed(fields.pop("password"))
        now = stamp(self.clock.now())
        row = User(**{"username": email, "full_name": "", "description": "", "role": "user", "status": "active",
                      "status_info": "", "resource_policy": "default", "need_password_change": False, **fields,
                      "uuid": str(uuid.uuid4()), "email": email, "domain_name": domain, "created_at": now,
                      "modified_at": now})  # fmt: skip
        if not await self.state.create_user(row, password, projects, self.clock.now()):
            raise taken(f"a user with email {email} or username {row.username} exists")
        return self.directory.users[row.uuid]

    async def modify_user(self, actor: Actor, ref: Any, props: Any) -> User:
        found = self.user(actor, ref)
        self._manage_user(actor, found)
        props = _only(props, self._USER_FIELDS, "the user", self._USER_IGNORED)
        if "domain_name" in props:
            domain = props.pop("domain_name")
            if domain != found.domain_name:
                raise invalid("a user stays in its domain (make a user in the other domain instead)")
        fields = self._user_fields(actor, props, found.domain_name)
        if actor.user is not None and found.uuid == actor.user.uuid:
            if fields.get("status", "active") != "active" or ("role" in fields and fields["role"] != found.role):
                raise invalid("you cannot deactivate yourself or change your own role")
        if "password" in fields:
            fields["password"] = await _hashed(fields["password"])
        done = await self._written(self.state.update_user(found.uuid, UserChanges(**fields), self.clock.now()))
        if done is None:
            raise taken(f"another user has username {fields.get('username')}")
        return self.directory.users[found.uuid]

    def _manage_user(self, actor: Actor, user: User) -> None:
        if not actor.may_manage(user.domain_name) or (user.role == "superadmin" and not actor.is_superadmin):
            raise forbidden(f"only an admin of domain {user.domain_name} changes its users")

    async def delete_user(self, actor: Actor, ref: Any) -> User:
        """Backend.AI's delete: the user's status becomes deleted and its keypairs stop signing at once (their
        streams closed); its sessions keep running, its folders stay."""
        found = self.user(actor, ref)
        self._manage_user(actor, found)
        if actor.user is not None and found.uuid == actor.user.uuid:
            raise invalid("you cannot delete yourself")
        await self._written(self.state.update_user(found.uuid, UserChanges(status="deleted"), self.clock.now()))
        return self.directory.users[found.uuid]

    async def purge_user(self, actor: Actor, ref: Any) -> None:
        found = self.user(actor, ref)
        self._manage_user(actor, found)
        if actor.user is not None and found.uuid == actor.user.uuid:
            raise invalid("you cannot purge yourself")
        why = await self._written(self.state.purge_user(found.uuid, self.clock.now()))
        if why is not None:
            raise invalid(f"user {found.email} cannot be purged: {why}")

    async def check_password(self, user: User, password: Any) -> bool:
        """Whether the password is the user's (checked in a thread, at most CHECKS_AT_ONCE at a time)."""
        if not isinstance(password, str) or not 0 < len(password) <= MAX_PASSWORD:
            return False
        stored = await self.state.password_hash(user.uuid)
        async with _CHECKS:
            return await asyncio.to_thread(verify_password, password, stored)

    async def authorize(self, domain: Any, username: Any, password: Any) -> tuple[User, Keypair]:
        """Backend.AI's `POST /auth/authorize`: the user of that email (or username) in that domain, and its first
        active keypair, when the password is its; one 401 for every way it is not (nobody learns which)."""
        refused = Problem("auth-failed", "Authentication failed.", "wrong username or password", status=401)
        user = self.directory.user_named(username) if isinstance(username, str) and len(username) <= 256 else None
        if user is None or (domain not in (None, "") and domain != user.domain_name):
            await asyncio.to_thread(verify_password, str(password)[:MAX_PASSWORD], await asyncio.to_thread(_dummy_hash))
            raise refused
        if not await self.check_password(user, password) or not user.is_active:
            raise refused
        keys = [k for k in self.directory.keys_of(user.uuid) if self.state.active_keypair(k) is not None]
        keypair = self.state.active_keypair(keys[0]) if keys else None
        if keypair is None:
            raise Problem(
                "auth-failed", "Authentication failed.", "you have no active keypair: ask an admin", status=401
            )
        return user, keypair

    async def change_password(self, actor: Actor, old: Any, new: Any, again: Any) -> None:
        """Backend.AI's `POST /auth/update-password`: a user changes its own password."""
        if actor.user is None:
            raise invalid("this keypair has no user")
        if new != again:
            raise invalid("the new password and its repetition differ")
        new = _password(new)
        stored = await self.state.password_hash(actor.user.uuid)
        if stored is not None and not await self.check_password(actor.user, old):
            raise Problem("auth-failed", "Authentication failed.", "the old password is wrong", status=401)
        await self.state.update_user(actor.user.uuid, UserChanges(password=await _hashed(new)), self.clock.now())

    # -- scaling groups ----------------------------------------------------------------------------------------

    def scaling_group_names(self, known: Iterable[str]) -> list[str]:
        """The scaling groups: stored ones and `known` (the configuration's and the agents')."""
        return sorted(set(known) | set(self.directory.scaling_groups))

    def scaling_group(self, name: str) -> ScalingGroup:
        found = self.directory.scaling_groups.get(name)
        return found or ScalingGroup(name, "", True, True, "")

    async def create_scaling_group(self, actor: Actor, name: Any, props: Any) -> ScalingGroup:
        self._superadmin(actor, "create scaling groups")
        name = _name(name, "a scaling group's name")
        fields = _read_fields(_only(props, _SGROUP_FIELDS, "the scaling group", _SGROUP_IGNORED), "scaling group")
        row = ScalingGroup(**{"description": "", "is_active": True, "is_public": True, **fields, "name": name,
                              "created_at": stamp(self.clock.now())})  # fmt: skip
        if not await self.state.create_team_record(row, self.clock.now()):
            raise taken(f"scaling group {name} exists")
        return self.directory.scaling_groups[name]

    async def modify_scaling_group(self, actor: Actor, name: Any, props: Any, known: Iterable[str]) -> ScalingGroup:
        self._superadmin(actor, "change scaling groups")
        name = _name(name, "a scaling group's name")
        fields = _read_fields(_only(props, _SGROUP_FIELDS, "the scaling group", _SGROUP_IGNORED), "scaling group")
        if name not in self.directory.scaling_groups:
            if name not in set(known):
                raise not_found(f"no scaling group {name}")
            await self.create_scaling_group(actor, name, {})  # (one of the configuration's or an agent's: stored now)
        await self.state.update_team_record(ScalingGroup, name, fields, self.clock.now())
        return self.directory.scaling_groups[name]

    async def delete_scaling_group(self, actor: Actor, name: Any) -> None:
        self._superadmin(actor, "delete scaling groups")
        why = await self.state.delete_team_record(ScalingGroup, _name(name, "a scaling group's name"), self.clock.now())
        if why is not None:
            raise not_found(f"no scaling group {name}") if why == "not found" else invalid(why)

    async def associate(
        self, actor: Actor, group: Any, kind: str, target: Any, linked: bool, known: Iterable[str]
    ) -> bool:
        """Open a scaling group to a domain, project (id or name) or keypair, or close it again."""
        self._superadmin(actor, "associate scaling groups")
        group = _name(group, "scaling_group")
        if group not in set(self.scaling_group_names(known)):
            raise not_found(f"no scaling group {group}")
        if not isinstance(target, str):
            raise invalid(f"the {kind} must be named")
        if kind == "domain" and target not in self.directory.domains:
            raise not_found(f"no domain {target[:64]!r}")
        if kind == "project":
            target = self.project(actor, target).id
        if kind == "keypair" and await self.state.keypair(target) is None:
            raise not_found(f"no keypair {target[:64]!r}")
        return await self.state.link_scaling_group(group, kind, target, linked, self.clock.now())

    def available_scaling_groups(self, actor: Actor, project_ref: Any, known: Iterable[str]) -> list[str]:
        """The scaling groups the actor's sessions in a project (its default one when None) may use."""
        from bai.node.manager.rules.access import project_for

        if project_ref is None:
            project = project_for(self.directory, actor, None, None)
        else:
            project = self.project(actor, project_ref)
            if not may_see_project(actor, project):
                raise not_found(f"no project {str(project_ref)[:64]!r}")
        names = self.scaling_group_names(known)
        return usable_scaling_groups(self.directory, names, project.domain_name, project.id, actor.access_key)

    # -- resource policies of users and projects ---------------------------------------------------------------

    def _check_policy(self, name: str | None, known: dict[str, Any], what: str) -> None:
        if name is not None and name not in known:
            raise invalid(f"no {what} {name!r}")

    async def save_policy(self, actor: Actor, cls: type[Any], name: Any, props: Any, *, create: bool) -> Any:
        self._superadmin(actor, "change resource policies")
        name = _name(name, "a policy's name")
        defaults = USER_POLICY_DEFAULTS if cls is UserPolicy else PROJECT_POLICY_DEFAULTS
        fields = _read_fields(
            _only(props, defaults, "the policy", ("max_network_count",) if cls is UserPolicy else ()), "policy"
        )
        if create:
            record = cls(**{**defaults, **fields, "name": name, "created_at": stamp(self.clock.now())})
            if not await self.state.create_team_record(record, self.clock.now()):
                raise taken(f"policy {name} exists")
        elif not await self.state.update_team_record(cls, name, fields, self.clock.now()):
            raise not_found(f"no policy {name}")
        policies = self.directory.user_policies if cls is UserPolicy else self.directory.project_policies
        return policies[name]

    async def delete_policy(self, actor: Actor, cls: type[Any], name: Any) -> None:
        self._superadmin(actor, "delete resource policies")
        why = await self.state.delete_team_record(cls, _name(name, "a policy's name"), self.clock.now())
        if why is not None:
            raise not_found(f"no policy {name}") if why == "not found" else invalid(f"policy {name}: {why}")

    def user_policies(self, actor: Actor) -> list[UserPolicy]:
        mine = actor.user.resource_policy if actor.user is not None else "default"
        return [p for n, p in sorted(self.directory.user_policies.items()) if actor.is_superadmin or n == mine]

    def project_policies(self, actor: Actor) -> list[ProjectPolicy]:
        mine = {p.resource_policy for p in self.projects(actor)}
        return [p for n, p in sorted(self.directory.project_policies.items()) if actor.is_superadmin or n in mine]

    # -- -----------------------------------------------------------------------------------------------------

    def _superadmin(self, actor: Actor, what: str) -> None:
        if not actor.is_superadmin:
            raise forbidden(f"only superadmins {what}")
