"""The records of teams: domains, their projects (Backend.AI's groups) and users, scaling groups and where they
may be used, and the resource policies of users and projects. Frozen and typed, as `records`.

A record's fields are its table's columns, by name (`team_queries` writes and reads them as they are); the JSON
columns are the fields that are mappings or lists. `TeamDirectory` is all of them at once, as each manager keeps
them in memory: every request's rules (`rules/access.py`) ask it, with no read of the database.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

DEFAULT_DOMAIN = "default"
DEFAULT_PROJECT = "default"
# the default project's id: Backend.AI's groups are UUIDs (this one the same in every bai database)
DEFAULT_PROJECT_ID = str(uuid.uuid5(uuid.NAMESPACE_URL, "bai:group:default"))

ROLES = ("superadmin", "admin", "user", "monitor")  # admin: a domain's admin
USER_STATUSES = ("active", "inactive", "deleted", "before-verification")


def user_uuid(user_id: str) -> str:
    """The UUID of a user made from a keypair's user id (when bai had keypairs only, and whenever a keypair is made
    for a user id that no user has): stable, so that the ids shown before users existed stay."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"bai:user:{user_id}"))


def email_of(user_id: str) -> str:
    """The email of a user made from a keypair's user id: the user id when it is an email, else
    `<user id>@bai.local`."""
    return user_id if "@" in user_id else f"{user_id}@bai.local"


def free_email(user_id: str, taken: Callable[[str], bool]) -> str:
    """`email_of(user_id)`, numbered (`alice+2@bai.local`) while another user has it (`taken`)."""
    email, n = email_of(user_id), 1
    local, _, host = email.partition("@")
    while taken(email):
        n += 1
        email = f"{local}+{n}@{host}"
    return email


class Domain(msgspec.Struct, frozen=True):
    """An organisation: it holds projects and users."""

    name: str
    description: str
    is_active: bool
    total_resource_slots: dict[str, str]  # wire form; {}: unlimited
    allowed_vfolder_hosts: dict[str, list[str]]  # host -> permissions; {}: every host
    allowed_docker_registries: list[str]
    created_at: str
    modified_at: str


class Project(msgspec.Struct, frozen=True):
    """A project (Backend.AI's group) of a domain: sessions and folders are created in one; its members are users."""

    id: str
    name: str
    domain_name: str
    description: str
    is_active: bool
    total_resource_slots: dict[str, str]  # what its running sessions may hold together; {}: unlimited
    allowed_vfolder_hosts: dict[str, list[str]]
    resource_policy: str  # a project resource policy
    created_at: str
    modified_at: str


class User(msgspec.Struct, frozen=True):
    """A person (or a robot) of a domain: owns keypairs, belongs to projects. Its password hash is not here: it is
    read only to check a password (`team_queries.password_hash`)."""

    uuid: str
    email: str
    username: str
    full_name: str
    description: str
    role: str  # one of ROLES
    status: str  # one of USER_STATUSES
    status_info: str
    domain_name: str
    resource_policy: str  # a user resource policy
    need_password_change: bool
    created_at: str
    modified_at: str

    @property
    def is_active(self) -> bool:
        return self.status == "active"


class ScalingGroup(msgspec.Struct, frozen=True):
    """A scaling group as stored (the configuration's and the agents' need no row: see `TeamDirectory`)."""

    name: str
    description: str
    is_active: bool
    is_public: bool
    created_at: str


class UserPolicy(msgspec.Struct, frozen=True):
    """A user resource policy (Backend.AI 23.09's fields; 0: unlimited)."""

    name: str
    max_vfolder_count: int
    max_quota_scope_size: int  # bytes
    max_session_count_per_model_session: int
    max_customized_image_count: int
    created_at: str


class ProjectPolicy(msgspec.Struct, frozen=True):
    """A project resource policy: Backend.AI 23.09's fields and bai's cap on what the project's running sessions hold
    together (with the project's own total_resource_slots: the smaller of the two)."""

    name: str
    max_vfolder_count: int
    max_quota_scope_size: int
    max_network_count: int
    total_resource_slots: dict[str, str]
    created_at: str


USER_POLICY_DEFAULTS: dict[str, Any] = {
    "max_vfolder_count": 0,
    "max_quota_scope_size": 0,
    "max_session_count_per_model_session": 0,
    "max_customized_image_count": 0,
}
PROJECT_POLICY_DEFAULTS: dict[str, Any] = {
    "max_vfolder_count": 0,
    "max_quota_scope_size": 0,
    "max_network_count": 0,
    "total_resource_slots": {},
}


class UserChanges(msgspec.Struct, frozen=True):
    """What a user update changes (UNSET: as it is); `projects` replaces its memberships."""

    email: str | UnsetType = UNSET
    username: str | UnsetType = UNSET
    full_name: str | UnsetType = UNSET
    description: str | UnsetType = UNSET
    role: str | UnsetType = UNSET
    status: str | UnsetType = UNSET
    status_info: str | UnsetType = UNSET
    domain_name: str | UnsetType = UNSET
    resource_policy: str | UnsetType = UNSET
    need_password_change: bool | UnsetType = UNSET
    password: str | UnsetType = UNSET  # its hash (never the password)
    projects: list[str] | UnsetType = UNSET


@dataclass(frozen=True)
class Association:
    """Where a scaling group may be used: its domains, projects (ids) and keypairs (access keys)."""

    domains: frozenset[str] = frozenset()
    projects: frozenset[str] = frozenset()
    keypairs: frozenset[str] = frozenset()

    @property
    def empty(self) -> bool:
        return not (self.domains or self.projects or self.keypairs)


@dataclass(frozen=True)
class TeamDirectory:
    """Every domain, project, user, membership, scaling group and association, as one manager keeps them in memory
    (replaced whole after each write of them, never changed)."""

    domains: dict[str, Domain] = field(default_factory=dict)
    projects: dict[str, Project] = field(default_factory=dict)  # by id
    users: dict[str, User] = field(default_factory=dict)  # by uuid
    members: dict[str, frozenset[str]] = field(default_factory=dict)  # project id -> user uuids
    keypair_users: dict[str, str] = field(default_factory=dict)  # access key -> user uuid
    scaling_groups: dict[str, ScalingGroup] = field(default_factory=dict)
    associations: dict[str, Association] = field(default_factory=dict)  # scaling group -> where
    user_policies: dict[str, UserPolicy] = field(default_factory=dict)
    project_policies: dict[str, ProjectPolicy] = field(default_factory=dict)

    def user_of(self, access_key: str) -> User | None:
        uid = self.keypair_users.get(access_key)
        return self.users.get(uid) if uid is not None else None

    def projects_of(self, user: str) -> list[Project]:
        """The projects a user (uuid) belongs to, by name."""
        return sorted(
            (p for pid, p in self.projects.items() if user in self.members.get(pid, ())), key=lambda p: p.name
        )

    def project_named(self, domain: str, name_or_id: str) -> Project | None:
        """A project of a domain by its name, or any project by its id."""
        found = self.projects.get(name_or_id)
        if found is not None:
            return found
        return next((p for p in self.projects.values() if p.domain_name == domain and p.name == name_or_id), None)

    def user_named(self, ref: str) -> User | None:
        """A user by uuid, email or username."""
        found = self.users.get(ref)
        if found is not None:
            return found
        return next((u for u in self.users.values() if ref in (u.email, u.username)), None)

    def keys_of(self, user: str) -> list[str]:
        """A user's access keys."""
        return sorted(ak for ak, uid in self.keypair_users.items() if uid == user)
