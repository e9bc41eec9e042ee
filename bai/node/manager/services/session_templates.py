"""Session templates (Backend.AI's `/template/session`): stored, listed, read, replaced and deleted, and the create
request a template makes (`POST /session/_/create-from-template`, which then takes the normal create path).

Who may: a template's owner (the user of the keypair that stored it, or the keypair named by an admin's
`owner_access_key`) reads, replaces and deletes it; admins any template; anyone else is told there is no such
template (404), as for sessions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from bai.common.clock import Clock
from bai.common.problems import Problem, invalid
from bai.node.manager.rules import session_templates as rules
from bai.node.manager.services.teams import Teams
from bai.node.manager.state.protocols import TemplateState
from bai.node.manager.state.team_records import DEFAULT_DOMAIN, DEFAULT_PROJECT_ID
from bai.node.manager.state.template_records import NewTemplate, StoredTemplate

_TEMPLATE_ID = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True)
class TemplateCaller:
    """Who acts on templates: the keypair that signed, whether an admin, and the keypair it acts for."""

    access_key: str
    is_admin: bool
    owner: str | None = None  # owner_access_key (checked by the HTTP layer: admins only)

    @property
    def acts_for(self) -> str:
        return self.owner or self.access_key


def not_found(template_id: str) -> Problem:
    return Problem(
        "task-template-not-found",
        "No such session template.",
        f"there is no session template {template_id!r} of yours (`session template list` lists them)",
        {"template_id": template_id},
        404,
    )


class SessionTemplates:
    """Session templates over the state, their owners and projects from the teams' directory."""

    def __init__(self, state: TemplateState, teams: Teams, clock: Clock, per_user: int = rules.MAX_PER_USER) -> None:
        self.state = state
        self.teams = teams
        self.clock = clock
        self.per_user = per_user

    # -- who --------------------------------------------------------------------------------------------

    def user_of(self, access_key: str) -> str:
        """The user (uuid) a keypair's templates belong to (`keypair:<key>` for a keypair of no user)."""
        user = self.teams.directory.user_of(access_key)
        return user.uuid if user is not None else f"keypair:{access_key}"

    def _domain_of(self, access_key: str) -> str:
        user = self.teams.directory.user_of(access_key)
        return user.domain_name if user is not None else DEFAULT_DOMAIN

    def _group(self, caller: TemplateCaller, domain: str | None, group: Any) -> tuple[str, str | None]:
        """The domain and project (id) a template is stored in: `group` by name or id (the default project when
        none is named)."""
        if domain is not None and not isinstance(domain, str):
            raise invalid("domain must be a domain's name")
        if group is not None and not isinstance(group, str):
            raise invalid("group must be a project's name or id")
        domain = domain or self._domain_of(caller.acts_for)
        directory = self.teams.directory
        if domain not in directory.domains:
            raise invalid(f"domain {domain!r} does not exist")
        if not group:
            return domain, DEFAULT_PROJECT_ID if domain == DEFAULT_DOMAIN else None
        project = directory.project_named(domain, group)
        if project is None or project.domain_name != domain:
            raise invalid(f"group {group!r} is no project of domain {domain!r}")
        user = directory.user_of(caller.acts_for)
        if not caller.is_admin and user is not None and user.uuid not in directory.members.get(project.id, ()):
            raise invalid(f"you are no member of project {project.name!r}")
        return domain, project.id

    def _readable(self, caller: TemplateCaller, row: StoredTemplate | None, template_id: str) -> StoredTemplate:
        if row is None or not (caller.is_admin or row.user_uuid == self.user_of(caller.access_key)):
            raise not_found(template_id)
        return row

    # -- the API ----------------------------------------------------------------------------------------

    async def create(
        self, caller: TemplateCaller, payload: Any, domain: str | None = None, group: Any = None
    ) -> list[dict[str, str]]:
        """Store every template of a payload: `[{"id", "user"}]`, in order."""
        try:
            entries = rules.parse_payload(payload)
        except rules.TemplateError as e:
            raise invalid(str(e)) from None
        domain, group_id = self._group(caller, domain, group)
        owner = self.user_of(caller.acts_for)
        news = [
            NewTemplate(
                name=entry.name,
                template=entry.template,
                user_uuid=owner,
                access_key=caller.acts_for,
                domain_name=domain,
                group_id=self._entry_group(domain, entry.group_id) or group_id,
            )
            for entry in entries
        ]
        ids = await self.state.create_templates(news, self.clock.now(), self.per_user)
        if ids is None:
            raise Problem(
                "generic-bad-request",
                "Too many session templates.",
                f"a user keeps at most {self.per_user} session templates: delete some first",
                status=409,
            )
        return [{"id": tid, "user": owner} for tid in ids]

    def _entry_group(self, domain: str, group_id: str | None) -> str | None:
        if group_id is None:
            return None
        project = self.teams.directory.project_named(domain, group_id)
        if project is None:
            raise invalid(f"group_id {group_id!r} is no project of domain {domain!r}")
        return project.id

    async def list(self, caller: TemplateCaller, everyone: bool = False) -> list[dict[str, Any]]:
        """The caller's templates (an admin's `everyone`: all of them), as Backend.AI lists them."""
        mine = self.user_of(caller.access_key)
        rows = await self.state.session_templates(None if caller.is_admin and everyone else mine)
        return [self.listed(row, mine) for row in rows]

    def listed(self, row: StoredTemplate, mine: str) -> dict[str, Any]:
        directory = self.teams.directory
        user = directory.users.get(row.user_uuid)
        project = directory.projects.get(row.group_id) if row.group_id else None
        return {
            "name": row.name,
            "id": row.id,
            "created_at": row.created_at,
            "is_owner": row.user_uuid == mine,
            "user": row.user_uuid,
            "group": row.group_id,
            "user_email": user.email if user is not None else None,
            "group_name": project.name if project is not None else None,
            "domain_name": row.domain_name,
            "type": row.type,
            "template": rules.template_json(row.template),
        }

    async def get(self, caller: TemplateCaller, template_id: str) -> StoredTemplate:
        """The template of that id (32 hex digits, a UUID's hyphens allowed) the caller may read; else a 404."""
        key = template_id.replace("-", "").lower()
        if not _TEMPLATE_ID.fullmatch(key):  # (never asked of the store: PostgreSQL refuses NUL in text)
            raise not_found(template_id[:64])
        return self._readable(caller, await self.state.session_template(key), template_id)

    async def shown(self, caller: TemplateCaller, template_id: str) -> dict[str, Any]:
        """`GET /template/session/{id}`: the template and where it lives."""
        row = await self.get(caller, template_id)
        return {
            "id": row.id,
            "template": rules.template_json(row.template),
            "name": row.name,
            "user_uuid": row.user_uuid,
            "group_id": row.group_id,
            "domain_name": row.domain_name,
        }

    async def replace(self, caller: TemplateCaller, template_id: str, payload: Any, group: Any = None) -> None:
        """The template replaced by the payload's one (Backend.AI's PUT: the payload holds exactly one)."""
        row = await self.get(caller, template_id)
        try:
            entries = rules.parse_payload(payload)
        except rules.TemplateError as e:
            raise invalid(str(e)) from None
        if len(entries) != 1:
            raise invalid(f"payload holds {len(entries)} templates: a template is replaced by one")
        entry = entries[0]
        group_id = row.group_id
        if entry.group_id is not None:
            group_id = self._entry_group(row.domain_name, entry.group_id)
        elif group:
            _, group_id = self._group(caller, row.domain_name, group)
        if not await self.state.replace_session_template(row.id, entry.name, entry.template, group_id):
            raise not_found(template_id)

    async def delete(self, caller: TemplateCaller, template_id: str) -> None:
        row = await self.get(caller, template_id)
        if not await self.state.delete_session_template(row.id):
            raise not_found(template_id)

    async def create_body(self, caller: TemplateCaller, body: Any) -> dict[str, Any]:
        """The create request a template makes with the request's fields on top (`body` holds `template_id`)."""
        if not isinstance(body, dict):
            raise invalid("the request body must be a JSON object")
        template_id = body.get("template_id", body.get("templateId"))
        if not isinstance(template_id, str) or not template_id:
            raise invalid("template_id is required: the id of a session template (`session template list`)")
        row = await self.get(caller, template_id)
        project = self.teams.directory.projects.get(row.group_id) if row.group_id else None
        base = rules.template_body(row.template, row.domain_name, project.name if project is not None else None)
        try:
            return rules.with_overrides(base, body)
        except rules.TemplateError as e:
            raise invalid(str(e)) from None
