"""Session templates, the pure part: a client's payload (YAML or JSON text) read into checked `TaskTemplate`s, and a
template with a create request's fields on top (what `POST /session/_/create-from-template` creates). No I/O.

A payload is one template, a list of them, or several YAML documents; each item is a template itself or
Backend.AI's entry `{"template": {...}, "name": ..., "group_id": ...}`. Every field is checked as Backend.AI's
`check_task_template` does (`api_version`, `kind`, `metadata.name`, `spec.kernel.image` required; the aliases
it knows), and bounded: the text, the number of templates, environment variables, mounts, resources, strings.
Everything wrong is a `TemplateError` that says where.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import msgspec
import yaml

from bai.common import safejson
from bai.node.manager.state.template_records import (
    GitCredential,
    TaskTemplate,
    TemplateGit,
    TemplateKernel,
    TemplateMetadata,
    TemplateRun,
    TemplateSpec,
)

MAX_PAYLOAD = 256 * 1024  # the text of a payload, in characters
MAX_TEMPLATES = 64  # templates in one payload
MAX_PER_USER = 1000  # templates one user may keep
MAX_ENVIRON = 256  # variables of a template
MAX_MOUNTS = 64
MAX_RESOURCES = 32
MAX_AGENTS = 64
MAX_NAME = 128  # a template's name (Backend.AI's column)
MAX_TEXT = 4096  # a short string: an image, a tag, a variable's name, a path
MAX_SCRIPT = 64 * 1024  # a startup command, a bootstrap script, a variable's value
KINDS = ("taskTemplate", "task_template")
SESSION_TYPES = ("interactive", "batch", "inference")
FOLDER_NAME = re.compile(r"^[\w.-]{1,64}$", re.ASCII)


class TemplateError(ValueError):
    """What is wrong with a payload or a template (a 400)."""


@dataclass(frozen=True)
class Entry:
    """One template of a payload, with what Backend.AI's entry may say besides."""

    template: TaskTemplate
    name: str  # the entry's name, else the template's metadata name
    group_id: str | None  # the entry's group_id, when it gives one


class _NoAliases(yaml.SafeLoader):  # type: ignore[misc]
    """YAML without anchors' aliases (`*a`): one alias may stand for a huge tree (a billion laughs)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise TemplateError(f"YAML aliases (*{event.anchor}) are not accepted in a template")
        return super().compose_node(parent, index)


def load_payload(payload: Any) -> list[Any]:
    """The documents of a payload's text: JSON when it is JSON, else YAML (every document)."""
    if not isinstance(payload, str):
        raise TemplateError("payload must be the text of a template (YAML or JSON), or of a list of them")
    if len(payload) > MAX_PAYLOAD:
        raise TemplateError(f"payload is {len(payload)} characters long: at most {MAX_PAYLOAD}")
    if "\0" in payload:
        raise TemplateError("payload contains a NUL character")
    if not payload.strip():
        raise TemplateError("payload is empty")
    try:
        return [safejson.loads(payload, max_bytes=MAX_PAYLOAD * 4, what="payload")]
    except safejson.UnsafeJson as e:
        if "not valid JSON" not in str(e):
            raise TemplateError(str(e)) from None
    try:
        docs = list(yaml.load_all(payload, Loader=_NoAliases))  # noqa: S506 (a safe loader)
    except TemplateError:
        raise
    except RecursionError:
        raise TemplateError("payload nests too deeply") from None
    except yaml.YAMLError as e:
        raise TemplateError(f"payload is neither JSON nor YAML: {_short(str(e))}") from None
    docs = [d for d in docs if d is not None]
    if safejson.depth_over(docs, safejson.MAX_DEPTH):
        raise TemplateError("payload nests too deeply")
    return docs


def parse_payload(payload: Any) -> list[Entry]:
    """Every template of a payload, checked (at least one, at most MAX_TEMPLATES)."""
    items: list[Any] = []
    for doc in load_payload(payload):
        if isinstance(doc, dict) and isinstance(doc.get("session_templates"), list):
            doc = doc["session_templates"]  # (the form of Backend.AI's early documentation)
        items.extend(doc if isinstance(doc, list) else [doc])
    if not items:
        raise TemplateError("payload holds no template")
    if len(items) > MAX_TEMPLATES:
        raise TemplateError(f"payload holds {len(items)} templates: at most {MAX_TEMPLATES} at once")
    return [parse_entry(item, f"template {i + 1}" if len(items) > 1 else "template") for i, item in enumerate(items)]


def parse_entry(item: Any, where: str = "template") -> Entry:
    if not isinstance(item, dict):
        raise TemplateError(f"{where} must be a mapping (api_version, kind, metadata, spec)")
    if "template" in item and "spec" not in item:  # Backend.AI's entry
        template = check_template(item["template"], where)
        name = _opt_text(item.get("name"), f"{where}: name", MAX_NAME) or template.metadata.name
        group_id = _opt_text(item.get("group_id"), f"{where}: group_id", MAX_TEXT)
        return Entry(template, name, group_id)
    template = check_template(item, where)
    return Entry(template, template.metadata.name, None)


def check_template(raw: Any, where: str = "template") -> TaskTemplate:
    """A template, every field checked (TemplateError names the first one wrong)."""
    t = _mapping(raw, where)
    api_version = _first(t, "api_version", "apiVersion")
    if isinstance(api_version, int | float) and not isinstance(api_version, bool):
        api_version = str(api_version)
    api_version = _text(api_version, f"{where}: api_version", MAX_TEXT)
    kind = t.get("kind")
    if kind not in KINDS:
        raise TemplateError(f"{where}: kind must be taskTemplate or task_template, not {_shown(kind)}")
    md = _mapping(t.get("metadata"), f"{where}: metadata")
    metadata = TemplateMetadata(
        name=_name(md.get("name"), f"{where}: metadata.name"),
        tag=_opt_text(md.get("tag"), f"{where}: metadata.tag", MAX_TEXT),
    )
    spec = _mapping(t.get("spec"), f"{where}: spec")
    stype = _first(spec, "type", "session_type", "sessionType", default="interactive")
    if stype not in SESSION_TYPES:
        raise TemplateError(f"{where}: spec.session_type must be interactive or batch, not {_shown(stype)}")
    return TaskTemplate(
        api_version=api_version,
        kind=str(kind),
        metadata=metadata,
        spec=TemplateSpec(
            kernel=_kernel(spec.get("kernel"), f"{where}: spec.kernel"),
            session_type=str(stype),
            scaling_group=_opt_text(spec.get("scaling_group"), f"{where}: spec.scaling_group", MAX_TEXT),
            mounts=_mounts(spec.get("mounts"), f"{where}: spec.mounts"),
            resources=_resources(spec.get("resources"), f"{where}: spec.resources"),
            agent_list=_agents(_first(spec, "agent_list", "agentList"), f"{where}: spec.agent_list"),
        ),
    )


def _kernel(raw: Any, where: str) -> TemplateKernel:
    k = _mapping(raw, where)
    image = _text(k.get("image"), f"{where}.image", MAX_TEXT)
    if not image.strip():
        raise TemplateError(f"{where}.image must name an image")
    run = k.get("run")
    if run is not None:
        r = _mapping(run, f"{where}.run")
        run = TemplateRun(
            bootstrap=_opt_text(r.get("bootstrap"), f"{where}.run.bootstrap", MAX_SCRIPT),
            startup_command=_opt_text(
                _first(r, "startup", "startup_command", "startupCommand"), f"{where}.run.startup_command", MAX_SCRIPT
            ),
        )
    git = k.get("git")
    if git is not None:
        g = _mapping(git, f"{where}.git")
        credential = g.get("credential")
        if credential is not None:
            c = _mapping(credential, f"{where}.git.credential")
            credential = GitCredential(
                username=_text(c.get("username"), f"{where}.git.credential.username", MAX_TEXT),
                password=_text(c.get("password"), f"{where}.git.credential.password", MAX_TEXT),
            )
        git = TemplateGit(
            repository=_text(g.get("repository"), f"{where}.git.repository", MAX_TEXT),
            commit=_opt_text(g.get("commit"), f"{where}.git.commit", MAX_TEXT),
            branch=_opt_text(g.get("branch"), f"{where}.git.branch", MAX_TEXT),
            credential=credential,
            dest_dir=_opt_text(_first(g, "destination_dir", "destinationDir", "dest_dir"), f"{where}.git.dest_dir"),
        )
    return TemplateKernel(
        image=image.strip(),
        architecture=_opt_text(k.get("architecture"), f"{where}.architecture", MAX_TEXT) or "x86_64",
        environ=_environ(k.get("environ"), f"{where}.environ"),
        run=run,
        git=git,
    )


def _environ(raw: Any, where: str) -> dict[str, str]:
    if raw is None:
        return {}
    env = _mapping(raw, where)
    if len(env) > MAX_ENVIRON:
        raise TemplateError(f"{where} has {len(env)} variables: at most {MAX_ENVIRON}")
    out: dict[str, str] = {}
    for key, value in env.items():
        name = _text(key, f"{where}: a variable's name", MAX_TEXT)
        if not name or "=" in name:
            raise TemplateError(f"{where}: {_shown(name)} is not a variable name (not empty, no '=')")
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, int | float):
            value = str(value)
        out[name] = _text(value, f"{where}.{name}", MAX_SCRIPT)
    return out


def _mounts(raw: Any, where: str) -> dict[str, str | None]:
    if raw is None:
        return {}
    mounts = _mapping(raw, where)
    if len(mounts) > MAX_MOUNTS:
        raise TemplateError(f"{where} has {len(mounts)} folders: at most {MAX_MOUNTS}")
    out: dict[str, str | None] = {}
    for key, value in mounts.items():
        folder = _text(key, f"{where}: a folder's name", MAX_TEXT)
        if not FOLDER_NAME.match(folder):
            raise TemplateError(f"{where}: {_shown(folder)} is not a folder name")
        path = _opt_text(value, f"{where}.{folder}", MAX_TEXT)
        if path and not FOLDER_NAME.match(path.removeprefix("/home/work/")) and not path.startswith("/"):
            raise TemplateError(f"{where}.{folder}: {_shown(path)} is not a place to mount a folder")
        out[folder] = path or None
    return out


def _resources(raw: Any, where: str) -> dict[str, str | int | float] | None:
    if raw is None:
        return None
    res = _mapping(raw, where)
    if len(res) > MAX_RESOURCES:
        raise TemplateError(f"{where} has {len(res)} slots: at most {MAX_RESOURCES}")
    out: dict[str, str | int | float] = {}
    for key, value in res.items():
        slot = _text(key, f"{where}: a slot's name", MAX_TEXT)
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise TemplateError(f"{where}.{slot} must be an amount (a number or a string such as 1g)")
        if isinstance(value, str):
            value = _text(value, f"{where}.{slot}", MAX_TEXT)
        elif value != value or value in (float("inf"), float("-inf")):
            raise TemplateError(f"{where}.{slot} must be a finite number")
        out[slot] = value
    return out


def _agents(raw: Any, where: str) -> list[str] | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or len(raw) > MAX_AGENTS:
        raise TemplateError(f"{where} must be a list of at most {MAX_AGENTS} agent ids")
    return [_text(a, f"{where}[{i}]", MAX_TEXT) for i, a in enumerate(raw)]


def template_json(template: TaskTemplate) -> dict[str, Any]:
    """A template as the API shows it (and stores it): its fields by Backend.AI's names, nothing left out."""
    return msgspec.to_builtins(template)  # type: ignore[no-any-return]


# -- a template with a create request on top --------------------------------------------------------------

# a create request's fields, each with the names parse_create reads it by: a field the request gives (not None)
# replaces the template's, whatever name either uses
FIELDS: tuple[tuple[str, ...], ...] = (
    ("image", "lang"),
    ("architecture", "arch"),
    ("type", "sessionType", "session_type", "sess_type"),
    ("startupCommand", "startup_command"),
    ("bootstrap_script", "bootstrapScript"),
    ("tag",),
    ("domain", "domainName", "domain_name"),
    ("group", "groupName", "group_name"),
)
CONFIG_FIELDS: tuple[tuple[str, ...], ...] = (
    ("scalingGroup", "scaling_group"),
    ("environ",),
    ("resources",),
    ("resource_opts", "resourceOpts"),
)
MOUNT_FIELDS = ("mounts", "mount_map", "mountMap", "mount_options", "mountOptions")


def template_body(template: TaskTemplate, domain: str, group: str | None) -> dict[str, Any]:
    """A create request's body as the template alone says it (`domain`, `group`: where the template lives)."""
    spec, kernel = template.spec, template.spec.kernel
    body: dict[str, Any] = {"image": kernel.image, "architecture": kernel.architecture, "type": spec.session_type}
    if template.metadata.tag:
        body["tag"] = template.metadata.tag
    if kernel.run is not None:
        if kernel.run.startup_command:
            body["startupCommand"] = kernel.run.startup_command
        if kernel.run.bootstrap:
            body["bootstrap_script"] = kernel.run.bootstrap
    body["domain"] = domain
    if group is not None:
        body["group"] = group
    config: dict[str, Any] = {}
    if spec.scaling_group:
        config["scalingGroup"] = spec.scaling_group
    if spec.mounts:
        config["mounts"] = list(spec.mounts)
        config["mount_map"] = {folder: path for folder, path in spec.mounts.items() if path}
    if kernel.environ:
        config["environ"] = dict(kernel.environ)
    if spec.resources:
        config["resources"] = dict(spec.resources)
    body["config"] = config
    return body


def with_overrides(base: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """The template's body with every field the request gives on top (`template_id` itself left out).

    A field given as None (as the official client sends what its user left out) keeps the template's; a whole
    mapping given (`config.environ`, `config.resources`) replaces the template's, as Backend.AI's does; an empty
    list of mounts keeps the template's folders (the official client sends `[]` when none is named)."""
    body = {k: v for k, v in base.items() if k != "config"}
    config = dict(base.get("config") or {})
    for key, value in request.items():
        if key in ("template_id", "templateId", "config") or value is None:
            continue
        for names in FIELDS:
            if key in names:
                for name in names:
                    body.pop(name, None)
        body[key] = value
    overrides = request.get("config")
    if overrides is not None:
        if not isinstance(overrides, dict):
            raise TemplateError("config must be an object")
        mounts_given = bool(overrides.get("mounts")) or bool(overrides.get("mount_map") or overrides.get("mountMap"))
        if mounts_given:
            for name in MOUNT_FIELDS:
                config.pop(name, None)
        for key, value in overrides.items():
            if value is None or (key in MOUNT_FIELDS and not mounts_given):
                continue
            for names in CONFIG_FIELDS:
                if key in names:
                    for name in names:
                        config.pop(name, None)
            config[key] = value
    body["config"] = config
    return body


# -- checks ----------------------------------------------------------------------------------------------


def _first(d: dict[str, Any], *names: str, default: Any = None) -> Any:
    for name in names:
        if d.get(name) is not None:
            return d[name]
    return default


def _mapping(raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise TemplateError(f"{where} must be a mapping, not {_kind(raw)}")
    return raw


def _text(raw: Any, where: str, limit: int = MAX_TEXT) -> str:
    if not isinstance(raw, str):
        raise TemplateError(f"{where} must be a string, not {_kind(raw)}")
    if len(raw) > limit:
        raise TemplateError(f"{where} is {len(raw)} characters long: at most {limit}")
    if "\0" in raw:
        raise TemplateError(f"{where} contains a NUL character")
    try:
        raw.encode()
    except UnicodeEncodeError:
        raise TemplateError(f"{where} holds a lone surrogate, which is not text") from None
    return raw


def _opt_text(raw: Any, where: str, limit: int = MAX_TEXT) -> str | None:
    return None if raw is None else _text(raw, where, limit)


def _name(raw: Any, where: str) -> str:
    name = _text(raw, where, MAX_NAME).strip()
    if not name:
        raise TemplateError(f"{where} must not be empty")
    return name


def _kind(value: Any) -> str:
    if value is None:
        return "nothing"
    kinds = {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return kinds.get(type(value), f"a {type(value).__name__}")


def _shown(value: Any) -> str:
    return _short(repr(value), 60)


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
