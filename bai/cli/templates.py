"""`bai session template …`: session templates (Backend.AI's task templates): a session's image, environment,
resources, folders and startup command kept under an id, and sessions created from them with overrides."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from bai.cli.common import call, call_now, fail, show

app = typer.Typer(
    help="Session templates: a session's image, environment, resources and folders, kept to start sessions from.",
    no_args_is_help=True,
    epilog="Examples:\n  bai session template create job.yaml\n  bai session template run ID --name job1 --env N=2",
)

AsJson = Annotated[bool, typer.Option("--json", help="Print JSON.")]
Project = Annotated[
    str | None,
    typer.Option("--project", help="The project (Backend.AI's group) it belongs to: name or id [the default one]."),
]
TemplateId = Annotated[str, typer.Argument(help="The template's id (`bai session template list`).")]


def _read(source: str) -> str:
    """The text of FILE, or of stdin for `-`."""
    if source == "-":
        return sys.stdin.read()
    try:
        return Path(source).read_text()
    except (OSError, UnicodeDecodeError) as e:
        fail(f"cannot read {source}: {e}", code=2)


@app.command()
def create(
    source: Annotated[str, typer.Argument(metavar="FILE|-", help="A YAML or JSON template (or a list); - for stdin.")],
    project: Project = None,
    as_json: AsJson = False,
) -> None:
    """Store the template(s) of FILE and print their ids."""
    payload = _read(source)
    created = call(lambda c: c.create_templates(payload, group=project))
    if as_json:
        from bai.cli.jsonout import dumps

        print(dumps(created))
        return
    for item in created:
        print(f"template {item['id']} created")


def _table(rows: list[dict[str, Any]]) -> Any:
    from bai.cli.output import Table

    table = Table(box=None, header_style="bold")
    for col in ("ID", "NAME", "IMAGE", "TYPE", "OWNER", "PROJECT", "CREATED"):
        table.add_column(col, overflow="fold")
    for r in rows:
        spec = (r.get("template") or {}).get("spec") or {}
        table.add_row(
            str(r.get("id")),
            str(r.get("name")),
            str((spec.get("kernel") or {}).get("image", "")),
            str(spec.get("session_type", "")),
            str(r.get("user_email") or r.get("user")) + (" (you)" if r.get("is_owner") else ""),
            str(r.get("group_name") or r.get("group") or "-"),
            str(r.get("created_at", ""))[:19],
        )
    return table


@app.command("list")
def list_(
    all_: Annotated[bool, typer.Option("--all", help="Admins: everyone's templates, not only yours.")] = False,
    as_json: AsJson = False,
) -> None:
    """Your session templates (an admin's --all: everyone's)."""
    rows = call_now(lambda c: c.list_templates(all=all_))
    if not rows and not as_json:
        print("no session templates (`bai session template create FILE` stores one)")
        return
    show(rows, as_json, _table)


@app.command()
def get(
    template_id: TemplateId,
    fmt: Annotated[str, typer.Option("--format", metavar="yaml|json", help="How to print it.")] = "yaml",
    as_json: AsJson = False,
) -> None:
    """Print a template (YAML by default; --format json or --json: the whole answer as JSON)."""
    if fmt not in ("yaml", "json"):
        raise typer.BadParameter("wants yaml or json", param_hint="--format")
    shown = call_now(lambda c: c.get_template(template_id))
    if as_json or fmt == "json":
        from bai.cli.jsonout import dumps

        print(dumps(shown if as_json else shown.get("template")))
        return
    import yaml

    print(yaml.safe_dump(shown.get("template"), sort_keys=False, allow_unicode=True), end="")


@app.command()
def update(
    template_id: TemplateId,
    source: Annotated[str, typer.Argument(metavar="FILE|-", help="The new template (YAML or JSON); - for stdin.")],
    as_json: AsJson = False,
) -> None:
    """Replace a template by the one in FILE (its id stays)."""
    payload = _read(source)
    call(lambda c: c.update_template(template_id, payload))
    _done(template_id, "updated", as_json)


@app.command()
def delete(template_id: TemplateId, as_json: AsJson = False) -> None:
    """Delete a template (sessions made from it stay)."""
    call(lambda c: c.delete_template(template_id))
    _done(template_id, "deleted", as_json)


def _done(template_id: str, what: str, as_json: bool) -> None:
    if as_json:
        from bai.cli.jsonout import dumps

        print(dumps({"id": template_id, what: True}))
    else:
        print(f"template {template_id} {what}")


@app.command()
def run(
    template_id: TemplateId,
    name: Annotated[str | None, typer.Option("--name", help="Session name (default: a generated one).")] = None,
    image: Annotated[str | None, typer.Option("--image", help="Another image than the template's.")] = None,
    cpu: Annotated[str | None, typer.Option("--cpu", help="CPU cores (the template's resources replaced).")] = None,
    mem: Annotated[str | None, typer.Option("--mem", metavar="SIZE", help="Memory, e.g. 512m.")] = None,
    gpu: Annotated[str | None, typer.Option("--gpu", help="Whole GPUs (slot cuda.device).")] = None,
    env: Annotated[
        list[str] | None,
        typer.Option("--env", "-e", metavar="KEY=VALUE", help="Variables (the template's replaced; repeatable)."),
    ] = None,
    mount: Annotated[
        list[str] | None,
        typer.Option("--mount", "-v", metavar="NAME[:PATH][:ro]", help="Folders (the template's replaced)."),
    ] = None,
    session_type: Annotated[str | None, typer.Option("--type", help="interactive or batch [the template's].")] = None,
    startup_command: Annotated[
        str | None, typer.Option("--startup-command", metavar="CMD", help="What a batch session runs.")
    ] = None,
    cluster_size: Annotated[int | None, typer.Option("--cluster-size", metavar="N", min=1)] = None,
    group: Annotated[str | None, typer.Option("--group", help="Scaling group [the template's].")] = None,
    project: Annotated[str | None, typer.Option("--project", help="The project to create it in.")] = None,
    detach: Annotated[bool, typer.Option("--detach", help="Return once it is queued.")] = False,
    as_json: AsJson = False,
) -> None:
    """Create a session from a template: the template's fields, with the options given on top."""
    from bai.cli.session import check_name, parse_env, parse_mounts, parse_resources

    check_name(name)
    if session_type is not None and session_type not in ("interactive", "batch"):
        raise typer.BadParameter("wants interactive or batch", param_hint="--type")
    overrides: dict[str, Any] = {
        "name": name,
        "image": image,
        "type": session_type,
        "startupCommand": startup_command,
        "clusterSize": cluster_size,
        "group": project,
        "enqueueOnly": detach,
    }
    config: dict[str, Any] = {"scalingGroup": group}
    resources = parse_resources(cpu, mem, gpu)
    if resources:
        config["resources"] = resources
    if env:
        config["environ"] = parse_env(env)
    if mount:
        config.update(parse_mounts(mount))
    overrides["config"] = {k: v for k, v in config.items() if v is not None}
    body = {k: v for k, v in overrides.items() if v is not None}
    result = call(lambda c: c.create_from_template(template_id, body))
    if as_json:
        from bai.cli.jsonout import dumps

        print(dumps(result))
        return
    print(f"session {result['sessionName']} ({result['sessionId']}) is {result['status']}")
    if result.get("status") in ("CANCELLED", "ERROR", "TERMINATED"):
        raise typer.Exit(1)
