"""Who may act on what among teams: the one place that says it (pure: a directory, an actor, a target → yes / no or
a Problem).

- A request's **actor** is its keypair's user: a superadmin (whose keypair is an admin one) acts on everything; a
  domain admin (role `admin`) on its domain's users, projects, folders and sessions; a user on its own, and in the
  projects it belongs to. A keypair of no user (none since schema 16) acts as its admin flag says.
- A session or a folder is created **in a project** the owner belongs to (superadmins: any active project; domain
  admins: any of their domain's), of an active domain.
- A **scaling group** is usable where it is associated (its domains, projects, keypairs); one associated with
  nothing is open to everyone, as every scaling group was before teams.
- A project's **cap** on what its running sessions hold together is the smaller, slot by slot, of its own
  `total_resource_slots` and its resource policy's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal

from bai.common import slots as slotlib
from bai.common.problems import Problem
from bai.node.manager.state.records import Keypair
from bai.node.manager.state.team_records import DEFAULT_DOMAIN, DEFAULT_PROJECT, Project, TeamDirectory, User


@dataclass(frozen=True)
class Actor:
    """Who makes a request, as the rules see it."""

    access_key: str
    user: User | None
    is_superadmin: bool
    domain: str  # its user's domain
    projects: frozenset[str]  # the ids of the projects its user belongs to

    @property
    def is_domain_admin(self) -> bool:
        return not self.is_superadmin and self.user is not None and self.user.role == "admin"

    @property
    def role(self) -> str:
        if self.is_superadmin:
            return "superadmin"
        return self.user.role if self.user is not None and self.user.role != "superadmin" else "user"

    def may_manage(self, domain: str) -> bool:
        """Whether it manages a domain's users, projects, folders and sessions."""
        return self.is_superadmin or (self.is_domain_admin and domain == self.domain)


def actor_of(directory: TeamDirectory, keypair: Keypair) -> Actor:
    """The actor of a keypair: superadmin when the keypair is an admin one of a superadmin (or of no user)."""
    user = directory.user_of(keypair.access_key)
    if user is None:
        return Actor(keypair.access_key, None, keypair.is_admin, DEFAULT_DOMAIN, frozenset())
    projects = frozenset(pid for pid, members in directory.members.items() if user.uuid in members)
    superadmin = keypair.is_admin and user.role == "superadmin"
    return Actor(keypair.access_key, user, superadmin, user.domain_name, projects)


def _forbidden(msg: str) -> Problem:
    return Problem("insufficient-privilege", "Insufficient privilege.", msg)


def _not_found(what: str) -> Problem:
    return Problem("object-not-found", "No such object.", what)


def may_see_user(actor: Actor, user: User) -> bool:
    return actor.may_manage(user.domain_name) or (actor.user is not None and actor.user.uuid == user.uuid)


def may_see_project(actor: Actor, project: Project) -> bool:
    return actor.may_manage(project.domain_name) or project.id in actor.projects


def may_act_on_keypair(directory: TeamDirectory, actor: Actor, access_key: str) -> bool:
    """Whether the actor may act on a keypair's sessions and folders (its own; a domain admin's domain's; any)."""
    if access_key == actor.access_key or actor.is_superadmin:
        return True
    owner = directory.user_of(access_key)
    if owner is None or owner.role == "superadmin":
        return False  # (a domain admin never acts for a superadmin, nor for a keypair of no user)
    return actor.is_domain_admin and owner.domain_name == actor.domain


def project_for(directory: TeamDirectory, actor: Actor, domain: str | None, project: str | None) -> Project:
    """The project a session or folder of the actor is created in: `project` (a name in `domain`, or an id), by
    default the default project when it belongs to it, else its only project. A 403 when it may not (not a member,
    another domain, an inactive project or domain), a 404 when there is no such project."""
    domain_name = domain or (actor.domain if actor.user is not None else DEFAULT_DOMAIN)
    if actor.user is not None and domain_name != actor.domain and not actor.is_superadmin:
        raise _forbidden(f"you belong to domain {actor.domain}, not {domain_name}")
    found_domain = directory.domains.get(domain_name)
    if found_domain is None:
        raise _not_found(f"no domain {domain_name!r}")
    if not found_domain.is_active:
        raise _forbidden(f"domain {domain_name} is inactive")
    if project is None:
        mine = [p for p in directory.projects.values() if p.domain_name == domain_name and may_use_project(actor, p)]
        named = [p for p in mine if p.name == DEFAULT_PROJECT]
        if named or len(mine) == 1:
            return (named or mine)[0]
        if not mine:
            raise _forbidden(f"you belong to no project of domain {domain_name}: an admin adds you to one")
        raise Problem(
            "invalid-api-params",
            "Invalid API parameters.",
            f"you belong to several projects ({', '.join(sorted(p.name for p in mine))}): say which (the request's "
            "group, the CLI's --project)",
            status=400,
        )
    found = directory.project_named(domain_name, project)
    elsewhere = found is not None and found.domain_name != domain_name and not actor.is_superadmin
    if found is None or elsewhere or not may_see_project(actor, found):
        # (the same answer whether it exists elsewhere or not at all: nobody learns of another's projects)
        raise _not_found(f"no project {project!r} of yours in domain {domain_name}")
    if not may_use_project(actor, found):
        raise _forbidden(f"project {found.name} is inactive")
    return found


def may_use_project(actor: Actor, project: Project) -> bool:
    """Whether the actor may create sessions and folders in a project: an active one it belongs to (or manages)."""
    return project.is_active and (project.id in actor.projects or actor.may_manage(project.domain_name))


def scaling_group_open_to(directory: TeamDirectory, group: str, domain: str, project_id: str, access_key: str) -> bool:
    """Whether sessions of this keypair in this project and domain may use the scaling group."""
    row = directory.scaling_groups.get(group)
    if row is not None and not row.is_active:
        return False
    links = directory.associations.get(group)
    if links is None or links.empty:
        return True
    return domain in links.domains or project_id in links.projects or access_key in links.keypairs


def usable_scaling_groups(
    directory: TeamDirectory, names: Iterable[str], domain: str, project_id: str, access_key: str
) -> list[str]:
    """Of these scaling groups, those sessions of this keypair in this project may use, by name."""
    return sorted(g for g in set(names) if scaling_group_open_to(directory, g, domain, project_id, access_key))


def check_scaling_group(directory: TeamDirectory, group: str, project: Project, access_key: str) -> None:
    """A 403 naming the project when a session there may not use the scaling group."""
    if not scaling_group_open_to(directory, group, project.domain_name, project.id, access_key):
        raise _forbidden(
            f"scaling group {group} is not open to project {project.name} of domain {project.domain_name} "
            "(an admin associates it with the domain, the project or your keypair)"
        )


def project_cap(directory: TeamDirectory, project: Project) -> dict[str, Decimal]:
    """What a project's running sessions may hold together, slot by slot (a slot not here: unlimited)."""
    cap = slotlib.parse_slots(project.total_resource_slots) if project.total_resource_slots else {}
    policy = directory.project_policies.get(project.resource_policy)
    if policy is not None and policy.total_resource_slots:
        for slot, amount in slotlib.parse_slots(policy.total_resource_slots).items():
            cap[slot] = min(cap[slot], amount) if slot in cap else amount
    return cap
