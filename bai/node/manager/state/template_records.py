"""The records of session templates (Backend.AI's task templates): what a template says, checked field by field
(`rules/session_templates.py` makes them from a client's YAML or JSON), and the stored row around it.

A template is stored as its JSON (`TaskTemplate` as `msgspec.to_builtins` writes it) in `session_templates`;
its owner is a user (`user_uuid`, Backend.AI's), in a domain and a project (`group_id`).
"""

from __future__ import annotations

import msgspec

TEMPLATE_TYPE = "task"  # (Backend.AI's cluster templates are not offered)


class TemplateMetadata(msgspec.Struct, frozen=True):
    name: str
    tag: str | None = None


class TemplateRun(msgspec.Struct, frozen=True):
    bootstrap: str | None = None
    startup_command: str | None = None


class GitCredential(msgspec.Struct, frozen=True):
    username: str
    password: str


class TemplateGit(msgspec.Struct, frozen=True):
    repository: str
    commit: str | None = None
    branch: str | None = None
    credential: GitCredential | None = None
    dest_dir: str | None = None


class TemplateKernel(msgspec.Struct, frozen=True):
    image: str
    architecture: str = "x86_64"
    environ: dict[str, str] = {}
    run: TemplateRun | None = None
    git: TemplateGit | None = None


class TemplateSpec(msgspec.Struct, frozen=True):
    kernel: TemplateKernel
    session_type: str = "interactive"
    scaling_group: str | None = None
    mounts: dict[str, str | None] = {}  # folder name -> where it is mounted (None / "": its default place)
    resources: dict[str, str | int | float] | None = None
    agent_list: list[str] | None = None


class TaskTemplate(msgspec.Struct, frozen=True):
    """A task template, every field checked (names as Backend.AI's `check_task_template` gives them back)."""

    api_version: str
    kind: str
    metadata: TemplateMetadata
    spec: TemplateSpec


class NewTemplate(msgspec.Struct, frozen=True):
    """A template to store, its name (the template's metadata name unless the entry gave one) and owner."""

    name: str
    template: TaskTemplate
    user_uuid: str
    access_key: str  # the keypair that stored it
    domain_name: str
    group_id: str | None


class StoredTemplate(msgspec.Struct, frozen=True):
    """A session template's row."""

    id: str  # 32 hex digits, as Backend.AI's
    name: str
    created_at: str
    user_uuid: str
    access_key: str
    domain_name: str
    group_id: str | None
    type: str
    template: TaskTemplate
