"""`bai user …`, `bai project …`, `bai domain …` and `bai scaling-group …`: who belongs where, how much a project may
hold, and where each scaling group may be used (Backend.AI's users, groups, domains and scaling groups; changes are
for admins: superadmins everywhere, a domain's admins in their domain)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Annotated, Any

import typer

from bai.cli.common import call, fail, show
from bai.cli.layout import OUTPUT_HELP


def examples(*lines: str) -> str:
    """A command's `Examples:` (as bai.cli.examples writes them), shown after its options."""
    return ("Example: " + lines[0]) if len(lines) == 1 else "Examples:\n" + "\n".join(f"  {line}" for line in lines)


user_app = typer.Typer(help="Users (admins): who they are, their domain, projects and role.", no_args_is_help=True)
project_app = typer.Typer(
    help="Projects (Backend.AI's groups): who may create sessions in them, and how much they may hold.",
    no_args_is_help=True,
)
members_app = typer.Typer(
    help="A project's members: the users who may create sessions in it.",
    no_args_is_help=True,
    epilog=examples("bai project members add ml alice@lab.example --domain lab", "bai project members ls ml"),
)
project_app.add_typer(members_app, name="members")
domain_app = typer.Typer(help="Domains (superadmins): they hold projects and users.", no_args_is_help=True)
scaling_group_app = typer.Typer(
    help="Scaling groups: where each may be used (one open to no domain, project nor keypair is open to everyone).",
    no_args_is_help=True,
)

AsJson = Annotated[bool, typer.Option("--json", help="Print JSON.")]
Output = Annotated[str | None, typer.Option("--output", "-o", metavar="wide|json", help=OUTPUT_HELP)]
Limits = Annotated[
    list[str] | None,
    typer.Option(
        "--limit",
        metavar="SLOT=AMOUNT",
        help="A cap on what all sessions together hold, e.g. cuda.device=8, cpu=16 or mem=64g "
        "(repeatable, or comma-separated).",
    ),
]
ClearLimits = Annotated[bool, typer.Option("--no-limits", help="Remove every --limit (unlimited).")]
Description = Annotated[str | None, typer.Option("--description", help="A line about it.")]
InDomain = Annotated[str | None, typer.Option("--domain", help="The domain a project name is looked up in [yours].")]


def _emit_one(item: dict[str, Any], as_json: bool, lines: Callable[[dict[str, Any]], list[str]]) -> None:
    if as_json:
        from bai.cli.jsonout import dumps

        print(dumps(item))
        return
    print("\n".join(lines(item)))


def _table(
    fetch: Callable[[Any], Any], as_json: bool, output: str | None, table: Callable[[list[Any], bool], Any]
) -> None:
    from bai.cli.layout import wants

    wide, as_json = wants(output, as_json)
    show(call(fetch), as_json, lambda rows: table(rows, wide))


def parse_limits(values: list[str] | None, flag: str = "--limit") -> dict[str, str] | None:
    """`--limit cuda.device=8 --limit cpu=16,mem=64g` → {"cuda.device": "8", "cpu": "16", "mem": "64g"}; None
    when none was given. A bad pair or amount is a usage error."""
    if not values:
        return None
    from bai.common.slots import SlotError, parse_slots

    out: dict[str, str] = {}
    for item in values:
        for pair in item.split(","):
            key, sep, value = pair.partition("=")
            if not sep or not key.strip() or not value.strip():
                raise typer.BadParameter(f"wants SLOT=AMOUNT (e.g. cuda.device=8), got {pair!r}", param_hint=flag)
            out[key.strip()] = value.strip()
    try:
        parse_slots(out)
    except SlotError as e:
        raise typer.BadParameter(str(e), param_hint=flag) from None
    return out


def _slots_field(limits: list[str] | None, clear: bool) -> dict[str, Any]:
    if clear and limits:
        raise typer.BadParameter("give --limit or --no-limits, not both")
    if clear:
        return {"total_resource_slots": {}}
    parsed = parse_limits(limits)
    return {} if parsed is None else {"total_resource_slots": parsed}


def _changes(fields: dict[str, Any]) -> dict[str, Any]:
    """The options given (not None); a usage error when there are none."""
    given = {k: v for k, v in fields.items() if v is not None}
    if not given:
        raise typer.BadParameter("give at least one option to change")
    return given


def _with_domain_hint(fn: Callable[[Any], Any], ref: str, domain: str | None) -> Callable[[Any], Any]:
    """`fn`, whose 404 for a project named without --domain says where the name was looked up."""

    async def go(c: Any) -> Any:
        from bai.client import APIError

        try:
            return await fn(c)
        except APIError as e:
            if e.status == 404 and domain is None and "project" in str(e):
                e.msg = f"{e.msg or ''} (a project name is looked up in your domain: give --domain, or its id)"
            raise

    return go


# -- users -------------------------------------------------------------------------------------------------


def read_password(password: str | None, from_stdin: bool, required: bool = True) -> str | None:
    """The password of --password, of one line of stdin (--password-stdin), or asked twice, hidden, on a
    terminal; never echoed nor printed."""
    from bai.common.passwords import MAX_PASSWORD, MIN_PASSWORD

    if password is not None and from_stdin:
        raise typer.BadParameter("give --password or --password-stdin, not both")
    if from_stdin:
        value = sys.stdin.readline().rstrip("\r\n")
        if not value:
            fail("--password-stdin: no password on stdin (one line)", code=2)
    elif password is not None:
        value = password
    elif not required:
        return None
    elif sys.stdin.isatty():
        value = typer.prompt("Password", hide_input=True, confirmation_prompt=True, err=True)
    else:
        fail("no password: give --password-stdin (one line on stdin) or --password, or run on a terminal", code=2)
    if not MIN_PASSWORD <= len(value) <= MAX_PASSWORD:
        fail(f"a password is {MIN_PASSWORD} to {MAX_PASSWORD} characters (this one has {len(value)})", code=2)
    return value


def user_lines(u: dict[str, Any]) -> list[str]:
    keys = u.get("accessKeys") or []
    return [
        f"User      {u['email']}" + (f" (username {u['username']})" if u["username"] != u["email"] else ""),
        f"UUID      {u['uuid']}",
        f"Name      {u.get('fullName') or '-'}",
        f"Role      {u['role']}",
        f"Status    {u['status']}",
        f"Domain    {u['domain']}",
        f"Projects  {', '.join(u.get('projects') or []) or 'none'}",
        f"Policy    {u.get('resourcePolicy') or '-'}",
        f"Keys      {', '.join(keys) if keys else 'none (bai keypair create --user ' + u['email'] + ')'}",
    ] + ([f"About     {u['description']}"] if u.get("description") else [])


Role = Annotated[str | None, typer.Option("--role", help="superadmin, admin (of its domain), user or monitor.")]
Username = Annotated[str | None, typer.Option("--username", help="A login name [the email].")]
FullName = Annotated[str | None, typer.Option("--name", help="The user's full name.")]
UserPolicy = Annotated[str | None, typer.Option("--policy", help="The user's resource policy.")]
Password = Annotated[
    str | None,
    typer.Option("--password", help="The password (seen by other users of this host: prefer the prompt or stdin)."),
]
PasswordStdin = Annotated[bool, typer.Option("--password-stdin", help="Read the password from stdin (one line).")]


@user_app.command("ls", epilog=examples("bai user ls --domain lab", "bai user ls --project ml --domain lab --json"))
def user_ls(
    domain: Annotated[str | None, typer.Option("--domain", help="Only this domain's users.")] = None,
    project: Annotated[str | None, typer.Option("--project", help="Only this project's members.")] = None,
    status: Annotated[
        str | None, typer.Option("--status", help="Only users of this status: active, inactive, deleted…")
    ] = (None),
    as_json: AsJson = False,
    output: Output = None,
) -> None:
    """List users: email, role, status, domain, projects and how many keypairs each has."""
    from bai.cli.output import users_table

    statuses = ("active", "inactive", "deleted", "before-verification")
    if status is not None and status.lower() not in statuses:
        raise typer.BadParameter(f"wants one of {', '.join(statuses)}, got {status!r}", param_hint="--status")
    fetch = lambda c: c.users(domain, project, status.lower() if status else None)  # noqa: E731
    _table(_with_domain_hint(fetch, project, domain) if project else fetch, as_json, output, users_table)


@user_app.command("show", epilog=examples("bai user show alice@lab.example"))
def user_show(ref: Annotated[str, typer.Argument(help="Email, username or uuid.")], as_json: AsJson = False) -> None:
    """One user: role, status, domain, projects, access keys."""
    _emit_one(call(lambda c: c.user(ref)), as_json, user_lines)


@user_app.command(
    "add",
    epilog=examples(
        "bai user add alice@lab.example --domain lab --project ml --name 'Alice Liddell'",
        "printf '%s\\n' \"$PW\" | bai user add bob@lab.example --password-stdin --role admin",
    ),
)
def user_add(
    email: Annotated[str, typer.Argument(help="The user's email address.")],
    password: Password = None,
    password_stdin: PasswordStdin = False,
    username: Username = None,
    full_name: FullName = None,
    role: Role = None,
    domain: Annotated[str | None, typer.Option("--domain", help="The user's domain [yours].")] = None,
    projects: Annotated[
        list[str] | None,
        typer.Option("--project", help="A project it joins (repeatable) [its domain's default project]."),
    ] = None,
    policy: UserPolicy = None,
    description: Description = None,
    must_change: Annotated[
        bool, typer.Option("--must-change-password", help="Ask the user to change the password at first login.")
    ] = False,
    as_json: AsJson = False,
) -> None:
    """Add a user; the password is asked twice (hidden) unless --password-stdin or --password gives it.

    A user signs requests with a keypair of its own: `bai keypair create --user EMAIL`."""
    secret = read_password(password, password_stdin)
    fields = {
        "username": username,
        "full_name": full_name,
        "role": role.lower() if role else None,
        "domain": domain,
        "projects": list(projects) if projects else None,
        "resource_policy": policy,
        "description": description,
        "need_password_change": True if must_change else None,
    }
    user = call(lambda c: c.create_user(email, secret, **fields))
    if as_json:
        _emit_one(user, True, user_lines)
        return
    where = ", ".join(user.get("projects") or []) or "no project"
    print(f"user {user['email']} added in domain {user['domain']} ({where}), role {user['role']}")
    print(f"give it a keypair: bai keypair create --user {user['email']}")


@user_app.command(
    "update",
    epilog=examples(
        "bai user update alice@lab.example --role admin", "bai user update alice@lab.example --ask-password"
    ),
)
def user_update(
    ref: Annotated[str, typer.Argument(help="Email, username or uuid.")],
    password: Password = None,
    password_stdin: PasswordStdin = False,
    ask_password: Annotated[
        bool, typer.Option("--ask-password", help="Ask for a new password (hidden, twice).")
    ] = False,
    username: Username = None,
    full_name: FullName = None,
    role: Role = None,
    status: Annotated[str | None, typer.Option("--status", help="active, inactive, deleted…")] = None,
    projects: Annotated[
        list[str] | None,
        typer.Option("--project", help="Its projects, all of them (repeatable): replaces its memberships."),
    ] = None,
    policy: UserPolicy = None,
    description: Description = None,
    must_change: Annotated[
        bool | None,
        typer.Option("--must-change-password/--no-must-change-password", help="Ask for a new password at next login."),
    ] = None,
    as_json: AsJson = False,
) -> None:
    """Change a user (only the options given). `bai project members add/rm` changes one membership."""
    secret = None
    if ask_password:
        if password is not None or password_stdin:
            raise typer.BadParameter("--ask-password asks: give neither --password nor --password-stdin with it")
        if not sys.stdin.isatty():
            fail("--ask-password needs a terminal: use --password-stdin", code=2)
        secret = read_password(None, False)
    else:
        secret = read_password(password, password_stdin, required=False)
    fields = _changes(
        {
            "password": secret,
            "username": username,
            "full_name": full_name,
            "role": role.lower() if role else None,
            "status": status.lower() if status else None,
            "projects": list(projects) if projects else None,
            "resource_policy": policy,
            "description": description,
            "need_password_change": must_change,
        }
    )
    user = call(lambda c: c.update_user(ref, **fields))
    if as_json:
        _emit_one(user, True, user_lines)
        return
    changed = ", ".join(sorted("password" if k == "password" else k.replace("_", " ") for k in fields))
    print(f"user {user['email']} updated ({changed})")


@user_app.command("deactivate", epilog=examples("bai user deactivate alice@lab.example"))
def user_deactivate(ref: Annotated[str, typer.Argument(help="Email, username or uuid.")]) -> None:
    """Stop a user: its keypairs stop signing requests at once (its sessions keep running)."""
    user = call(lambda c: c.update_user(ref, is_active=False))
    print(f"user {user['email']} is {user['status']}: its keypairs no longer sign requests")


@user_app.command("activate", epilog=examples("bai user activate alice@lab.example"))
def user_activate(ref: Annotated[str, typer.Argument(help="Email, username or uuid.")]) -> None:
    """Let a deactivated user's keypairs sign requests again."""
    user = call(lambda c: c.update_user(ref, is_active=True))
    print(f"user {user['email']} is {user['status']}")


@user_app.command("rm", epilog=examples("bai user rm alice@lab.example", "bai user rm alice@lab.example --purge"))
def user_rm(
    ref: Annotated[str, typer.Argument(help="Email, username or uuid.")],
    purge: Annotated[bool, typer.Option("--purge", help="Remove it for good, not only mark it deleted.")] = False,
) -> None:
    """Delete a user (Backend.AI's delete: marked deleted, its keypairs stop at once); --purge removes it."""
    done = call(lambda c: c.delete_user(ref, purge=purge))
    if purge:
        print(f"user {ref} purged")
    else:
        print(f"user {done['email']} is {done['status']}: its keypairs no longer sign requests (--purge removes it)")


# -- projects ----------------------------------------------------------------------------------------------


def project_lines(p: dict[str, Any]) -> list[str]:
    from bai.cli.output import limits_text, usage_text

    lines = [
        f"Project   {p['name']} (domain {p['domain']})",
        f"ID        {p['id']}",
        f"Status    {'active' if p.get('isActive', True) else 'inactive'}",
        f"Limits    {limits_text(p.get('totalResourceSlots'))}",
        f"Policy    {p.get('resourcePolicy') or '-'}",
    ]
    if "sessions" in p:
        lines.append(f"Sessions  {p['sessions']}")
        lines.append(f"Used/cap  {usage_text(p)}")
    if "members" in p:
        lines.append(f"Members   {', '.join(p['members']) or 'none'}")
    if p.get("description"):
        lines.append(f"About     {p['description']}")
    return lines


ProjectRef = Annotated[str, typer.Argument(help="Project name (in --domain) or id.")]
ProjectPolicy = Annotated[str | None, typer.Option("--policy", help="The project's resource policy.")]


@project_app.command("ls", epilog=examples("bai project ls", "bai project ls --domain lab -o wide"))
def project_ls(
    domain: Annotated[str | None, typer.Option("--domain", help="Only this domain's projects.")] = None,
    as_json: AsJson = False,
    output: Output = None,
) -> None:
    """List projects: their domain, sessions and what those hold of each capped slot (used/cap)."""
    from bai.cli.output import projects_table

    _table(lambda c: c.projects(domain), as_json, output, projects_table)


@project_app.command("show", epilog=examples("bai project show ml --domain lab"))
def project_show(ref: ProjectRef, domain: InDomain = None, as_json: AsJson = False) -> None:
    """One project: its limits, what its sessions hold, its members."""
    _emit_one(call(_with_domain_hint(lambda c: c.project(ref, domain), ref, domain)), as_json, project_lines)


@project_app.command(
    "add", epilog=examples("bai project add ml --domain lab --limit cuda.device=8 --limit cpu=16,mem=64g")
)
def project_add(
    name: Annotated[str, typer.Argument(help="The project's name (unique in its domain).")],
    domain: Annotated[str | None, typer.Option("--domain", help="Its domain [yours].")] = None,
    description: Description = None,
    limits: Limits = None,
    policy: ProjectPolicy = None,
    as_json: AsJson = False,
) -> None:
    """Add a project; --limit caps what all its sessions hold together (e.g. --limit cuda.device=8)."""
    fields = {"domain": domain, "description": description, "resource_policy": policy, **_slots_field(limits, False)}
    project = call(lambda c: c.create_project(name, **fields))
    if as_json:
        _emit_one(project, True, project_lines)
        return
    from bai.cli.output import limits_text

    print(f"project {project['name']} added in domain {project['domain']} (id {project['id']})")
    print(f"limits: {limits_text(project.get('totalResourceSlots'))}")
    print(f"add members: bai project members add {project['name']} USER...")


@project_app.command(
    "update",
    epilog=examples(
        "bai project update ml --domain lab --limit cuda.device=4", "bai project update ml --domain lab --no-limits"
    ),
)
def project_update(
    ref: ProjectRef,
    domain: InDomain = None,
    new_name: Annotated[str | None, typer.Option("--name", help="A new name.")] = None,
    description: Description = None,
    limits: Limits = None,
    no_limits: ClearLimits = False,
    policy: ProjectPolicy = None,
    as_json: AsJson = False,
) -> None:
    """Change a project (only the options given); --limit replaces every limit it had."""
    fields = _changes(
        {"name": new_name, "description": description, "resource_policy": policy, **_slots_field(limits, no_limits)}
    )
    project = call(_with_domain_hint(lambda c: c.update_project(ref, domain, **fields), ref, domain))
    if as_json:
        _emit_one(project, True, project_lines)
        return
    from bai.cli.output import limits_text

    print(f"project {project['name']} updated; limits: {limits_text(project.get('totalResourceSlots'))}")


def _members(ref: str, users: list[str], domain: str | None, add: bool, as_json: bool) -> None:
    change = {"add": users} if add else {"remove": users}
    project = call(_with_domain_hint(lambda c: c.change_members(ref, domain=domain, **change), ref, domain))
    if as_json:
        _emit_one(project, True, project_lines)
        return
    members = project.get("members") or []
    print(f"project {project['name']}: {len(members)} member(s): {', '.join(members) or 'none'}")


Users = Annotated[list[str], typer.Argument(help="Users: emails, usernames or uuids.")]


@members_app.command(
    "add", epilog=examples("bai project members add ml alice@lab.example bob@lab.example --domain lab")
)
def members_add(ref: ProjectRef, users: Users, domain: InDomain = None, as_json: AsJson = False) -> None:
    """Let users create sessions in a project (they must be of its domain)."""
    _members(ref, users, domain, True, as_json)


@members_app.command("rm", epilog=examples("bai project members rm ml bob@lab.example --domain lab"))
def members_rm(ref: ProjectRef, users: Users, domain: InDomain = None, as_json: AsJson = False) -> None:
    """Take users out of a project (their running sessions keep running)."""
    _members(ref, users, domain, False, as_json)


@members_app.command("ls", epilog=examples("bai project members ls ml --domain lab"))
def members_ls(ref: ProjectRef, domain: InDomain = None, as_json: AsJson = False) -> None:
    """A project's members (their emails)."""
    project = call(_with_domain_hint(lambda c: c.project(ref, domain), ref, domain))
    if as_json:
        from bai.cli.jsonout import dumps

        print(dumps(project.get("members") or []))
        return
    for email in project.get("members") or []:
        print(email)


@project_app.command("deactivate", epilog=examples("bai project deactivate ml --domain lab"))
def project_deactivate(ref: ProjectRef, domain: InDomain = None) -> None:
    """Stop new sessions in a project (its running ones keep running)."""
    project = call(_with_domain_hint(lambda c: c.delete_project(ref, domain), ref, domain))
    print(f"project {project['name']} is deactivated: no new sessions in it")


@project_app.command("activate", epilog=examples("bai project activate ml --domain lab"))
def project_activate(ref: ProjectRef, domain: InDomain = None) -> None:
    """Let a deactivated project take new sessions again."""
    project = call(_with_domain_hint(lambda c: c.update_project(ref, domain, is_active=True), ref, domain))
    print(f"project {project['name']} is active")


@project_app.command("rm", epilog=examples("bai project rm ml --domain lab", "bai project rm ml --domain lab --purge"))
def project_rm(
    ref: ProjectRef,
    domain: InDomain = None,
    purge: Annotated[bool, typer.Option("--purge", help="Remove it for good, not only deactivate it.")] = False,
) -> None:
    """Delete a project (Backend.AI's delete: deactivated); --purge removes it for good."""
    done = call(_with_domain_hint(lambda c: c.delete_project(ref, domain, purge=purge), ref, domain))
    if purge:
        print(f"project {ref} purged")
    else:
        print(f"project {done['name']} is deactivated (--purge removes it)")


# -- domains -----------------------------------------------------------------------------------------------

DomainName = Annotated[str, typer.Argument(help="The domain's name.")]


@domain_app.command("ls", epilog=examples("bai domain ls"))
def domain_ls(as_json: AsJson = False, output: Output = None) -> None:
    """List domains and their limits."""
    from bai.cli.output import domains_table

    _table(lambda c: c.domains(), as_json, output, domains_table)


@domain_app.command("add", epilog=examples("bai domain add lab --description 'the lab' --limit cpu=64"))
def domain_add(
    name: DomainName, description: Description = None, limits: Limits = None, as_json: AsJson = False
) -> None:
    """Add a domain; --limit caps what all its sessions hold together."""
    fields = {"description": description, **_slots_field(limits, False)}
    domain = call(lambda c: c.create_domain(name, **fields))
    if as_json:
        _emit_one(domain, True, lambda d: [])
        return
    from bai.cli.output import limits_text

    print(f"domain {domain['name']} added; limits: {limits_text(domain.get('totalResourceSlots'))}")


@domain_app.command(
    "update", epilog=examples("bai domain update lab --limit cpu=128", "bai domain update lab --inactive")
)
def domain_update(
    name: DomainName,
    description: Description = None,
    limits: Limits = None,
    no_limits: ClearLimits = False,
    active: Annotated[bool | None, typer.Option("--active/--inactive", help="Activate or deactivate it.")] = None,
    as_json: AsJson = False,
) -> None:
    """Change a domain (only the options given); --limit replaces every limit it had."""
    fields = _changes({"description": description, "is_active": active, **_slots_field(limits, no_limits)})
    domain = call(lambda c: c.update_domain(name, **fields))
    if as_json:
        _emit_one(domain, True, lambda d: [])
        return
    from bai.cli.output import limits_text

    state = "active" if domain.get("isActive", True) else "inactive"
    print(f"domain {domain['name']} updated ({state}); limits: {limits_text(domain.get('totalResourceSlots'))}")


@domain_app.command("deactivate", epilog=examples("bai domain deactivate lab"))
def domain_deactivate(name: DomainName) -> None:
    """Deactivate a domain: its users' keypairs stop signing requests at once."""
    call(lambda c: c.delete_domain(name))
    print(f"domain {name} is deactivated: its users' keypairs no longer sign requests")


@domain_app.command("rm", epilog=examples("bai domain rm lab --purge"))
def domain_rm(
    name: DomainName,
    purge: Annotated[
        bool, typer.Option("--purge", help="Remove it for good (only an empty one), not only deactivate it.")
    ] = False,
) -> None:
    """Delete a domain (deactivated); --purge removes an empty one for good."""
    call(lambda c: c.delete_domain(name, purge=purge))
    print(f"domain {name} purged" if purge else f"domain {name} is deactivated (--purge removes an empty one)")


# -- scaling groups ----------------------------------------------------------------------------------------


@scaling_group_app.command("ls", epilog=examples("bai scaling-group ls", "bai scaling-group ls --project ml --json"))
def scaling_group_ls(
    project: Annotated[
        str | None, typer.Option("--project", help="Those your sessions in this project may use (non-superadmins).")
    ] = None,
    as_json: AsJson = False,
    output: Output = None,
) -> None:
    """List scaling groups and where each may be used (superadmins: all; others: those open to them)."""
    from bai.cli.output import scaling_groups_table

    _table(lambda c: c.scaling_groups(project), as_json, output, scaling_groups_table)


def _target(domain: str | None, project: str | None, keypair: str | None) -> tuple[str, str]:
    given = [(k, v) for k, v in (("domain", domain), ("project", project), ("keypair", keypair)) if v]
    if len(given) != 1:
        raise typer.BadParameter("give one of --domain, --project or --keypair")
    return given[0]


async def _associate(c: Any, name: str, kind: str, target: str, remove: bool) -> dict[str, Any]:
    if kind == "project" and "/" in target:  # DOMAIN/NAME: a project of another domain than yours
        in_domain, _, project = target.partition("/")
        target = (await c.project(project, in_domain))["id"]
    return await c.associate_scaling_group(name, kind, target, remove)


SgDomain = Annotated[str | None, typer.Option("--domain", help="A domain: its users' sessions.")]
SgProject = Annotated[
    str | None, typer.Option("--project", help="A project: name (of your domain), DOMAIN/NAME or id.")
]
SgKeypair = Annotated[str | None, typer.Option("--keypair", metavar="ACCESS_KEY", help="A keypair's sessions.")]


def _say_association(g: dict[str, Any], kind: str, target: str, opened: bool) -> None:
    from bai.cli.output import open_to

    verb = "opened to" if opened else "closed to"
    head = (
        f"scaling group {g['name']} {verb} {kind} {target}"
        if g.get("changed")
        else (f"scaling group {g['name']}: no change ({kind} {target} was {'already' if opened else 'not'} listed)")
    )
    print(f"{head}; open to: {open_to(g)}")


@scaling_group_app.command(
    "allow",
    epilog=examples(
        "bai scaling-group allow gpu --project ml",
        "bai scaling-group allow gpu --project lab/ml",
        "bai scaling-group allow gpu --domain lab",
    ),
)
def scaling_group_allow(
    name: Annotated[str, typer.Argument(help="The scaling group.")],
    domain: SgDomain = None,
    project: SgProject = None,
    keypair: SgKeypair = None,
    as_json: AsJson = False,
) -> None:
    """Open a scaling group to a domain, project or keypair (superadmins). One open to none is open to everyone:
    the first allow closes it to all the others."""
    kind, target = _target(domain, project, keypair)
    g = call(lambda c: _associate(c, name, kind, target, False))
    if as_json:
        _emit_one(g, True, lambda x: [])
        return
    _say_association(g, kind, target, True)


@scaling_group_app.command("disallow", epilog=examples("bai scaling-group disallow gpu --project lab/ml"))
def scaling_group_disallow(
    name: Annotated[str, typer.Argument(help="The scaling group.")],
    domain: SgDomain = None,
    project: SgProject = None,
    keypair: SgKeypair = None,
    as_json: AsJson = False,
) -> None:
    """Close a scaling group to a domain, project or keypair (superadmins); closed to its last one, it is open to
    everyone again."""
    kind, target = _target(domain, project, keypair)
    g = call(lambda c: _associate(c, name, kind, target, True))
    if as_json:
        _emit_one(g, True, lambda x: [])
        return
    _say_association(g, kind, target, False)
