"""The `bai` command line. Heavy modules are imported inside commands, so `bai --help` stays fast."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import typer

from bai.cli import jsonout, typer_fast
from bai.cli.common import call, fail, show
from bai.cli.layout import OUTPUT_HELP
from bai.cli.lazy import LazyGroup, lean_command


class BaiGroup(LazyGroup):
    """bai's command groups, listed after its own commands; each module is imported when its group is used."""

    lazy_groups = {
        "session": "bai.cli.session:app",
        "agent": "bai.cli.main:agent_app",
        "manager": "bai.cli.managers:app",
        "image": "bai.cli.main:image_app",
        "config": "bai.cli.main:config_app",
        "keypair": "bai.cli.admin:keypair_app",
        "cluster": "bai.cli.main:cluster_app",
        "policy": "bai.cli.admin:policy_app",
        "vfolder": "bai.cli.vfolder:app",
        "dotfile": "bai.cli.vfolder:dotfile_app",
        "db": "bai.cli.db:app",
        "user": "bai.cli.teams:user_app",
        "project": "bai.cli.teams:project_app",
        "domain": "bai.cli.teams:domain_app",
        "scaling-group": "bai.cli.teams:scaling_group_app",
        "preset": "bai.cli.presets:app",
        "scheduler": "bai.cli.scheduler:app",
    }

    def list_commands(self, ctx: Any) -> list[str]:
        """`node` first (it starts everything else; a group of its own, added below), then bai's own commands,
        then the other groups."""
        names = super().list_commands(ctx)
        return ["node", *(n for n in names if n != "node")] if "node" in names else names


app = typer.Typer(
    name="bai",
    cls=BaiGroup,
    help="Compute sessions in containers: a node, a CLI and a dashboard in one program.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:
        from bai import __version__

        print(f"bai {__version__} (Python {sys.version.split()[0]})")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", help="Print bai's version and exit.", is_eager=True, callback=_print_version
    ),
    ca: str = typer.Option(None, "--ca", help="Trust this PEM CA file for an https:// manager (private CA)."),
    state_dir: str = typer.Option(
        None,
        "--state-dir",
        metavar="DIR",
        help="Use the keypair of the node of this state folder (as BAI_STATE_DIR=DIR does).",
    ),
) -> None:
    """Compute sessions in containers: a node, a CLI and a dashboard in one program."""
    if state_dir:
        if not os.path.isdir(state_dir):
            raise typer.BadParameter(f"{state_dir}: no such folder", param_hint="--state-dir")
        os.environ["BAI_STATE_DIR"] = state_dir  # read by bai.common.credentials
    if ca:
        if not os.path.isfile(ca):
            raise typer.BadParameter(f"{ca}: no such file", param_hint="--ca")
        os.environ["BACKEND_CA_FILE"] = ca  # read by bai.client, as BACKEND_* settings are


def _node_examples() -> str | None:
    from bai.cli.examples import epilog_of

    return epilog_of("bai node")


# added to `app` by name in BaiGroup.lazy_groups, as the groups of the other modules are
agent_app = typer.Typer(help="Agents: the hosts that run kernels.", no_args_is_help=True)
image_app = typer.Typer(help="Kernel images known to the agents.", no_args_is_help=True)
config_app = typer.Typer(help="Configuration.", no_args_is_help=True)
cluster_app = typer.Typer(
    help="The cluster: how agents join; maintenance (freeze, unfreeze, announce).", no_args_is_help=True
)


def _overrides(**flags: tuple[str, str, Any]) -> dict[str, Any]:
    """{flag: (section, key, value)} → a config mapping of the flags that were given."""
    out: dict[str, Any] = {}
    for section, key, value in flags.values():
        if value is not None:
            out.setdefault(section, {})[key] = value
    return out


node_app = typer.Typer()  # its help: the callback's doc


@node_app.callback(invoke_without_command=True, epilog=_node_examples())
def node(
    ctx: typer.Context,
    role: str = typer.Option(None, "--role", help="all (manager and agent in one process), manager or agent."),
    listen: str = typer.Option(None, "--listen", help="HOST:PORT of the HTTP API [default: 127.0.0.1:8091]."),
    state_dir: str = typer.Option(None, "--state-dir", help="Where the node keeps its state [~/.local/share/bai]."),
    backend: str = typer.Option(None, "--backend", help="Kernel backend: auto, docker or local."),
    link_listen: str = typer.Option(None, "--link-listen", help="Manager: HOST:PORT for agents [127.0.0.1:5002]."),
    manager: list[str] = typer.Option(
        None, "--manager", help="Agent: the manager's link, tcp://HOST:PORT (repeat it for several managers)."
    ),
    manager_key: list[str] = typer.Option(
        None, "--manager-key", help="Agent: the manager's public key (once for all managers, or once per --manager)."
    ),
    join_token: str = typer.Option(None, "--join-token", help="Agent: the cluster's join token."),
    agent_id: str = typer.Option(None, "--agent-id", help="Agent: its id [host name + state folder]."),
    tls_cert: str = typer.Option(None, "--tls-cert", help="Serve the API over HTTPS with this PEM certificate."),
    tls_key: str = typer.Option(None, "--tls-key", help="The certificate's PEM private key."),
    database: str = typer.Option(
        None,
        "--database",
        help="Manager: its database, a SQLite file or postgresql://USER@HOST:PORT/DB (password: ?password_file="
        "PATH or ?password_env=NAME) [<state dir>/bai.db].",
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log what the node does."),
    debug: bool = typer.Option(False, "--debug", help="Log everything, libraries included."),
    log_format: str = typer.Option("human", "--log-format", help="human (lines) or json (one object per line)."),
) -> None:
    """Start a node: by default a whole cluster (manager and agent) in one process.

    A cluster: `bai node --role manager` on one host, then on each other host the command that
    `bai cluster join-info` prints (`bai node --role agent --manager tcp://… --manager-key … --join-token …`).
    `bai node status` says whether a node runs for a state folder; `bai node stop` stops it.
    """
    if ctx.invoked_subcommand is not None:
        return
    from bai.common.config import ConfigError, load

    try:
        cfg, _ = load(
            _overrides(
                role=("node", "role", role),
                listen=("node", "listen", listen),
                state_dir=("node", "state_dir", state_dir),
                backend=("node", "backend", backend),
                link_listen=("node", "link_listen", link_listen),
                # once: a string, as in bai.toml; repeated: a list (several managers of one database)
                manager=("node", "manager", (manager[0] if len(manager) == 1 else manager) if manager else None),
                manager_key=(
                    "agent",
                    "manager_key",
                    (manager_key[0] if len(manager_key) == 1 else manager_key) if manager_key else None,
                ),
                join_token=("agent", "join_token", join_token),
                agent_id=("agent", "id", agent_id),
                tls_cert=("node", "tls_cert", tls_cert),
                tls_key=("node", "tls_key", tls_key),
                database=("manager", "database", database),
            )
        )
    except ConfigError as e:
        fail(str(e), code=2)
    from bai.node.main import main as node_main

    if log_format not in ("human", "json"):
        raise typer.BadParameter("--log-format wants human or json", param_hint="--log-format")
    raise typer.Exit(node_main(cfg, verbose, log_format, debug))


@node_app.command("status")
def node_status(
    state_dir: str = typer.Option(None, "--state-dir", help="The node's state folder [BAI_STATE_DIR / config]."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Whether a node runs for a state folder: its pid, role, endpoint and uptime (exit 1: none runs)."""
    from bai.cli.nodectl import status

    raise typer.Exit(status(state_dir, as_json))


@node_app.command("stop")
def node_stop(
    state_dir: str = typer.Option(None, "--state-dir", help="The node's state folder [BAI_STATE_DIR / config]."),
    timeout: float = typer.Option(60.0, "--timeout", help="Seconds to wait for it to exit."),
) -> None:
    """Stop the node of a state folder (SIGTERM, as Ctrl-C does) and wait until it has exited (exit 1: none runs)."""
    from bai.cli.nodectl import stop

    raise typer.Exit(stop(state_dir, timeout))


app.add_typer(node_app, name="node")


@app.command()
def watcher(
    listen: str = typer.Option(None, "--listen", help="HOST:PORT [127.0.0.1:6009]."),
    state_dir: str = typer.Option(None, "--state-dir", help="The agent's state folder [~/.local/share/bai]."),
) -> None:
    """Run the watcher beside an agent: status, drain / undrain, restart, metrics (see bai/node/watcher.py)."""
    from bai.common.config import ConfigError, load

    try:
        cfg, _ = load(_overrides(listen=("watcher", "listen", listen), state_dir=("node", "state_dir", state_dir)))
    except ConfigError as e:
        fail(str(e), code=2)
    from bai.node.main import state_dir_of
    from bai.node.watcher import main as watcher_main

    raise typer.Exit(watcher_main(cfg, state_dir_of(cfg)))


@cluster_app.command("join-info")
def cluster_join_info(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """What an agent needs to join this cluster (admins): the command to run on the agent's host."""
    import shlex

    info = call(lambda c: c.cluster())
    if as_json:  # keys as in bai.toml ([agent] manager_key, join_token), which this fills in
        print(json.dumps(info, indent=2))
        return
    print("Run on each agent host (the token is a secret: anyone with it can join):")
    print(
        f"  bai node --role agent --manager {info['endpoint']} --manager-key {shlex.quote(info['manager_key'])} "
        f"--join-token {shlex.quote(info['join_token'])}"
    )


@cluster_app.command("freeze")
def cluster_freeze(
    force_kill: bool = typer.Option(False, "--force-kill", help="Also end every running session at once."),
) -> None:
    """Freeze the manager for maintenance (admins): nothing new starts (sessions, folders, keypairs); running
    sessions still answer. `bai cluster unfreeze` ends it."""
    call(lambda c: c.request("PUT", "/manager/status", json_body={"status": "frozen", "force_kill": force_kill}))
    print("the manager is frozen: nothing new starts until `bai cluster unfreeze`")


@cluster_app.command("unfreeze")
def cluster_unfreeze() -> None:
    """End a freeze (admins): sessions and folders can be created again."""
    call(lambda c: c.request("PUT", "/manager/status", json_body={"status": "running"}))
    print("the manager runs: sessions and folders can be created again")


@cluster_app.command("announce")
def cluster_announce(
    message: str = typer.Argument(None, help="What every user's dashboard and client shows (none: keep it)."),
    off: bool = typer.Option(False, "--off", help="Hide the announcement (it is kept)."),
) -> None:
    """Set the announcement every client shows (admins): `bai cluster announce "down at 9"`, `--off` hides it."""
    if off and message:
        fail("give a message or --off, not both", code=2)
    if not off and not message:
        shown = call(lambda c: c.request("GET", "/manager/announcement"))
        print(shown.get("message") if shown.get("enabled") else "(no announcement)")
        return
    body = {"enabled": False} if off else {"enabled": True, "message": message}
    call(lambda c: c.request("POST", "/manager/announcement", json_body=body))
    print("announcement hidden" if off else f"announced: {message}")


@app.command("client-env")
def client_env() -> None:
    """Print `export` lines with the saved endpoint and keypair (for scripts and the official client)."""
    import shlex

    from bai.common import credentials

    try:
        creds = credentials.load()
    except credentials.BadEndpoint as e:
        fail(str(e), code=2)
    if creds is None:
        fail(f"no saved credentials at {credentials.credentials_path()}: start `bai node` once first")
    print(f"export BACKEND_ENDPOINT={shlex.quote(','.join(creds.endpoints))}")
    print(f"export BACKEND_ACCESS_KEY={shlex.quote(creds.access_key)}")
    print(f"export BACKEND_SECRET_KEY={shlex.quote(creds.secret_key)}")


@app.command()
def whoami(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Who you are to the manager: access key, role (admin or user), endpoint and resource policy."""
    from bai.cli.me import whoami_lines, whoami_of

    me = call(whoami_of)
    if as_json:
        print(jsonout.dumps(me))
        return
    print("\n".join(whoami_lines(me)))


@app.command()
def quota(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Your resource policy's limits beside what your sessions hold now (sessions, queued ones, slots)."""
    from bai.cli.me import quota_lines

    found = call(lambda c: c.request("GET", "/bai/quota"))
    if as_json:
        print(jsonout.dumps(found))
        return
    print("\n".join(quota_lines(found)))


@app.command()
def usage(
    month: str = typer.Option(None, "--month", metavar="YYYYMM", help="A month [the current one]."),
    since: str = typer.Option(None, "--since", metavar="DATE", help="From this day (YYYYMMDD), with --until."),
    until: str = typer.Option(None, "--until", metavar="DATE", help="To this day, included (at most 100 days)."),
    by: str = typer.Option("keypair", "--by", help="Rows per keypair, user or project."),
    everyone: bool = typer.Option(False, "--all", help="Admins: everyone's (a domain admin: its domain's)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """What your sessions held and used in a month or between two days: hours, CPU·h, memory GiB·h, GPU·h."""
    from bai.cli.usage import period_param, usage_heading, usage_table

    if by not in ("keypair", "user", "project"):
        raise typer.BadParameter(f"wants keypair, user or project, got {by!r}", param_hint="--by")
    try:
        period = period_param(month, since, until)
    except ValueError as e:
        fail(str(e), code=2)
    params = {"by": by, **({"period": period} if period else {}), **({"all": "true"} if everyone else {})}
    found = call(lambda c: c.request("GET", "/bai/usage", params=params))
    if as_json:
        print(jsonout.dumps(found))
        return
    from bai.cli.output import emit

    print(usage_heading(found))
    emit(usage_table(found))


@app.command()
def tui(
    endpoint: str = typer.Option(
        None,
        "--endpoint",
        help="The manager's URL, or several separated by commas (the next is used when one does not answer) "
        "[saved credentials / BACKEND_ENDPOINT].",
    ),
    read_only: bool = typer.Option(False, "--read-only", help="Watch only: hide actions such as terminate."),
) -> None:
    """A live dashboard: agents and their slots, sessions and why they wait, kernel logs (? lists the keys)."""
    from bai.cli.common import client, say_moved
    from bai.client import APIError, Client
    from bai.common.credentials import BadEndpoint, with_endpoints

    c = client()
    if endpoint:
        try:
            c = Client(with_endpoints(c.creds, endpoint))
        except (APIError, BadEndpoint) as e:
            fail(str(e), code=2)
        c.on_move = say_moved
    from bai.tui.app import run

    run(c, read_only=read_only)


@agent_app.command("ls")
def agent_ls(
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    output: str = typer.Option(None, "--output", "-o", metavar="wide|json", help=OUTPUT_HELP),
) -> None:
    """List agents: what kernels hold of each beside what its host uses now (-o wide: every column)."""
    from bai.cli.layout import wants
    from bai.cli.output import agents_table

    wide, as_json = wants(output, as_json)
    show(call(lambda c: c.agents()), as_json, lambda rows: agents_table(rows, wide))


@agent_app.command("info")
def agent_info(agent_id: str, as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """One agent: its slots, what is used, and each GPU with its use and allocation."""
    from bai.cli.output import gpu_lines, host_cpu, host_mem
    from bai.common.present import slots_text

    found = [a for a in call(lambda c: c.agents()) if a["id"] == agent_id]
    if not found:
        fail(f"no agent {agent_id!r}")
    a = found[0]
    if as_json:
        print(jsonout.dumps(a))
        return
    print(f"Agent     {a['id']} on {a['hostname']} ({a['backend']}, group {a['scalingGroup']})")
    print(f"Status    {a['status']}" + ("" if a.get("schedulable", True) else " (drained)"))
    print(f"Slots     {slots_text(a['availableSlots'])}")
    print(f"Held      {slots_text(a['occupiedSlots']) or 'nothing'}  (by kernels)")
    print(f"CPU use   {host_cpu(a.get('usage'))}  (the host, now)")
    print(f"Mem use   {host_mem(a.get('usage'))}")
    for line in gpu_lines(a.get("gpus") or []) or ["GPUs      none"]:
        print(line)
    warm = a.get("warm") or {}
    print("Warm      " + (", ".join(f"{n} {image}" for image, n in sorted(warm.items())) or "none"))


def _complete_images(incomplete: str) -> list[str]:
    from bai.cli.complete import complete_images

    return complete_images(incomplete)


@image_app.command("ls")
def image_ls(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List the images the agents can run."""
    from bai.cli.output import images_table

    show(call(lambda c: c.images()), as_json, images_table)


@image_app.command("pull")
def image_pull(
    image: str,
    agent: str = typer.Option(None, "--agent", help="Pull on this agent only [every Docker agent]."),
) -> None:
    """Pull an image from its registry onto the agents (admins)."""
    from bai.common.present import size

    for done in call(lambda c: c.pull_image(image, agent)):
        print(f"{done['agent']}: {done['name']} ({size(done['size'])})")


@image_app.command("rm")
def image_rm(
    image: str = typer.Argument(..., help="The image (name or alias).", autocompletion=_complete_images),
    agent: str = typer.Option(None, "--agent", help="Remove from this agent only [every agent that has it]."),
) -> None:
    """Remove an image from the agents (admins)."""
    removed = call(lambda c: c.remove_image(image, agent))
    print(f"{image} removed from {', '.join(removed)}")


@image_app.command("alias")
def image_alias(
    alias: str = typer.Argument(None, help="The name users give, e.g. python or pytorch."),
    image: str = typer.Argument(None, help="The image it stands for.", autocompletion=_complete_images),
    remove: bool = typer.Option(False, "--remove", help="Remove the alias."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List aliases, set ALIAS → IMAGE, or --remove ALIAS (admins; kept by the manager)."""
    if alias is None:
        aliases = call(lambda c: c.image_aliases())
        if as_json:
            print(json.dumps(aliases, indent=2))
        for name, target in sorted(aliases.items()):
            print(f"{name} → {target}")
        return
    if remove == (image is not None):
        raise typer.BadParameter("give ALIAS IMAGE to set, or ALIAS --remove")
    call(lambda c: c.set_image_alias(alias, None if remove else image))
    print(f"alias {alias} removed" if remove else f"alias {alias} → {image}")


@config_app.command("show")
def config_show(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Print the configuration in effect and where each value came from (default, file or flag)."""
    from bai.common.config import ConfigError, config_files, load_with_sources

    try:
        cfg, used, sources = load_with_sources()
    except ConfigError as e:
        fail(str(e), code=2)
    for reg in cfg["images"]["registries"].values():  # a registry's password is not for the screen
        if reg.get("password"):
            reg["password"] = "********"
    database = _database_settings(cfg)
    if cfg["manager"]["database"]:  # the URL as bai reads it: never a password
        cfg["manager"]["database"] = database["shown"]
    client_side = _client_settings()
    if as_json:
        out = {
            "files": [str(p) for p in used],
            "config": cfg,
            "sources": sources,
            "client": client_side,
            "database": database,
        }
        print(json.dumps(out, indent=2))
        return
    import tomli_w

    looked = ", ".join(str(p) for p in config_files())
    print("# node settings (read by `bai node` and `bai watcher` on this machine, not by the other commands)")
    print(f"#   file: {used[0] if used else '(none: defaults only)'}   (first found of: {looked})")
    print("# client settings (what this CLI connects with):")
    if client_side["endpoint"] is None:
        print(f"#   none: no keypair in the environment (BACKEND_*) nor at {client_side['file']}")
    else:
        ends = client_side["endpoints"]
        print(f"#   endpoint{'s' if len(ends) > 1 else ''} {', '.join(ends)}, keypair {client_side['accessKey']}")
        print(f"#   from: {', '.join(client_side['from'])}")
    where = f"#   manager database: {database['shown']}"
    if database["password_from"]:
        where += f", password from {database['password_from']}"
    print(where + (f" (not usable here: {database['error']})" if database["error"] else ""))
    for line in tomli_w.dumps(cfg).splitlines():
        print(_with_source(line, sources))


def _database_settings(cfg: dict[str, Any]) -> dict[str, Any]:
    """The manager's database as `bai config show` tells it: engine, `shown` (no password), where the
    password comes from, and why it cannot be used from here ("" when it can)."""
    from pathlib import Path

    from bai.common.config import data_dir
    from bai.common.dburl import DatabaseURLError, locate, redact

    value = str(cfg["manager"]["database"])
    state_dir = Path(cfg["node"]["state_dir"] or data_dir()).expanduser().absolute()
    try:
        where = locate(value, state_dir)
    except DatabaseURLError as e:
        return {"engine": None, "shown": redact(value), "password_from": "", "error": redact(str(e))}
    return {"engine": where.engine, "shown": where.shown, "password_from": where.password_from, "error": ""}


def _client_settings() -> dict[str, Any]:
    """Where this CLI's endpoint and keypair come from: BACKEND_* variables and/or the credentials file."""
    from bai.common import credentials

    path = credentials.credentials_path()
    try:
        creds = credentials.load()
    except credentials.BadEndpoint as e:
        fail(str(e), code=2)
    origins = []
    if os.environ.get("BACKEND_ACCESS_KEY") or os.environ.get("SORNA_ACCESS_KEY"):
        origins.append("environment (BACKEND_ACCESS_KEY / BACKEND_SECRET_KEY)")
    if os.environ.get("BACKEND_ENDPOINT") or os.environ.get("SORNA_ENDPOINT"):
        origins.append("environment (BACKEND_ENDPOINT)")
    if path.is_file() and len(origins) < 2:
        origins.append(f"{path}" + (" (BAI_STATE_DIR)" if os.environ.get("BAI_STATE_DIR") else ""))
    return {
        "endpoint": creds.endpoint if creds else None,
        "endpoints": list(creds.endpoints) if creds else [],
        "accessKey": creds.access_key if creds else None,
        "from": origins if creds else [],
        "file": str(path),
    }


_section = ""


def _with_source(line: str, sources: dict[str, str]) -> str:
    """A line of TOML with `# from …` after each value (the table's, for inline tables; an array's on its
    first line: tomli_w writes one item a line, indented, and the closing bracket alone)."""
    global _section
    if line.startswith((" ", "]")):  # inside a multi-line array
        return line
    if line.startswith("["):
        _section = _unquoted(line.strip("[]"))
        return line
    key, sep, _ = line.partition(" = ")
    if not sep:
        return line
    dotted = f"{_section}.{_unquoted(key)}" if _section else _unquoted(key)
    found = {src for k, src in sources.items() if k == dotted or k.startswith(dotted + ".")}
    where = found.pop() if len(found) == 1 else ("several" if found else "default")
    return f"{line:<48} # {where}"


def _unquoted(key: str) -> str:
    """A TOML dotted key as `load_with_sources` spells it: `labels."com.example.team"` → labels.com.example.team."""
    import tomllib

    try:
        table = tomllib.loads(f"{key} = 0")
    except tomllib.TOMLDecodeError:
        return key
    parts = []
    while isinstance(table, dict) and len(table) == 1:
        part, table = next(iter(table.items()))
        parts.append(part)
    return ".".join(parts)


def main() -> None:
    code: int | str | None
    typer_fast.install()
    try:
        from bai.common.zipapp import clean_old_extractions

        clean_old_extractions()  # from bai.pyz: older builds' unpacked copies go (a no-op otherwise)
    except OSError:
        pass
    try:
        lean_command(app)()  # what app() runs, each command built when it is used
        code = 0
    except SystemExit as e:
        code = e.code
    except KeyboardInterrupt:
        code = 130
    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:  # `bai … | head`
        pass
    # Everything is flushed and closed: skip the interpreter's module teardown (about 35 ms).
    os._exit(code or 0)
