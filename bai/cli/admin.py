"""`bai keypair …` and `bai policy …`: who may use the cluster, and how much of it (admins only)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from bai.cli.common import call, show
from bai.cli.layout import OUTPUT_HELP

keypair_app = typer.Typer(help="Keypairs (admins): who may use the cluster.", no_args_is_help=True)
policy_app = typer.Typer(help="Resource policies (admins): how much a keypair may use.", no_args_is_help=True)

AsJson = Annotated[bool, typer.Option("--json", help="Print JSON.")]
Output = Annotated[str | None, typer.Option("--output", "-o", metavar="wide|json", help=OUTPUT_HELP)]


@keypair_app.command("create")
def keypair_create(
    user: Annotated[str, typer.Option("--user", help="Who the keypair is for.")] = "user",
    admin: Annotated[bool, typer.Option("--admin", help="Give it admin rights.")] = False,
    policy: Annotated[str, typer.Option("--policy", help="Resource policy name.")] = "default",
    as_json: AsJson = False,
) -> None:
    """Create a keypair and print its secret (shown only this once)."""
    created = call(lambda c: c.create_keypair(user, admin, policy))
    if as_json:
        show(created, True, lambda x: x)
        return
    print(f"access key  {created['accessKey']}")
    print(f"secret key  {created['secretKey']}")
    print(f"policy      {created['resourcePolicy']}" + ("  (admin)" if created["isAdmin"] else ""))
    import shlex

    from bai.common import credentials

    saved = credentials.load()
    endpoint = ",".join(saved.endpoints) if saved is not None else "http://127.0.0.1:8091"
    print("use it with:")
    print(f"  export BACKEND_ENDPOINT={shlex.quote(endpoint)}")
    print(f"  export BACKEND_ACCESS_KEY={shlex.quote(created['accessKey'])}")
    print(f"  export BACKEND_SECRET_KEY={shlex.quote(created['secretKey'])}")


@keypair_app.command("ls")
def keypair_ls(as_json: AsJson = False, output: Output = None) -> None:
    """List keypairs (without their secrets)."""
    from bai.cli.layout import wants
    from bai.cli.output import keypairs_table

    wide, as_json = wants(output, as_json)
    show(call(lambda c: c.keypairs()), as_json, lambda rows: keypairs_table(rows, wide))


@keypair_app.command("set-policy")
def keypair_set_policy(access_key: str, policy: str) -> None:
    """Put a keypair under another resource policy."""
    updated = call(lambda c: c.update_keypair(access_key, resource_policy=policy))
    print(f"keypair {updated['accessKey']} now uses policy {updated['resourcePolicy']}")


@keypair_app.command("deactivate")
def keypair_deactivate(
    access_key: str,
    terminate: Annotated[
        bool, typer.Option("--terminate", help="Also end the keypair's running and pending sessions.")
    ] = False,
) -> None:
    """Stop a keypair from signing requests and close its open streams; its sessions keep running
    unless --terminate."""
    fields: dict[str, Any] = {"is_active": False}
    if terminate:
        fields["terminate_sessions"] = True
    result = call(lambda c: c.update_keypair(access_key, **fields))
    print(f"keypair {access_key} is deactivated")
    if result.get("closedStreams"):
        print(f"closed {result['closedStreams']} open stream(s) of it")
    if terminate:
        ended = result.get("terminatedSessions") or []
        print(f"terminating {len(ended)} session(s)" + (f": {', '.join(ended)}" if ended else ""))


@keypair_app.command("activate")
def keypair_activate(access_key: str) -> None:
    """Let a deactivated keypair sign requests again."""
    call(lambda c: c.update_keypair(access_key, is_active=True))
    print(f"keypair {access_key} is active")


def _policy_fields(
    max_sessions: int | None,
    slots: list[str] | None,
    unspecified: str | None,
    idle_timeout: str | None,
    max_lifetime: str | None,
    max_vfolders: int | None = None,
    vfolder_size: str | None = None,
    idle_cpu: str | None = None,
    idle_gpu: str | None = None,
    idle_window: str | None = None,
    max_networks: int | None = None,
    max_pending: int | None = None,
    max_priority: int | None = None,
) -> dict[str, Any]:
    from bai.common.durations import parse_duration

    fields: dict[str, Any] = {}
    if max_networks is not None:
        if max_networks < 0:
            raise typer.BadParameter("--max-networks must be >= 0 (0 = unlimited)")
        fields["max_session_networks"] = max_networks
    if max_priority is not None:
        if not 0 <= max_priority <= 100:
            raise typer.BadParameter("--max-priority must be from 0 to 100")
        fields["max_priority"] = max_priority
    if max_pending is not None:
        if not 0 <= max_pending <= MAX_PENDING:
            raise typer.BadParameter(f"--max-pending must be from 0 (unlimited) to {MAX_PENDING:,}")
        fields["max_pending_session_count"] = max_pending
    if max_sessions is not None:
        if max_sessions < 0:
            raise typer.BadParameter("--max-sessions must be >= 0 (0 = unlimited)")
        fields["max_concurrent_sessions"] = max_sessions
    if slots:
        from bai.common.slots import SlotError, parse_slots

        total: dict[str, str] = {}
        for item in slots:
            for pair in item.split(","):
                key, sep, value = pair.partition("=")
                if not sep or not key.strip():
                    raise typer.BadParameter(f"--slots wants SLOT=AMOUNT, got {pair!r}")
                total[key.strip()] = value.strip()
        try:
            parse_slots(total)
        except SlotError as e:
            raise typer.BadParameter(str(e)) from None
        fields["total_resource_slots"] = total
    if unspecified is not None:
        if unspecified.upper() not in ("LIMITED", "UNLIMITED"):
            raise typer.BadParameter("--unspecified wants limited or unlimited")
        fields["default_for_unspecified"] = unspecified.upper()
    if max_vfolders is not None:
        if max_vfolders < 0:
            raise typer.BadParameter("--max-vfolders must be >= 0 (0 = unlimited)")
        fields["max_vfolder_count"] = max_vfolders
    if vfolder_size is not None:
        fields["max_vfolder_size"] = vfolder_size
    for key, value, flag in (
        ("idle_timeout", idle_timeout, "--idle-timeout"),
        ("max_session_lifetime", max_lifetime, "--max-lifetime"),
    ):
        if value is not None:
            try:
                fields[key] = parse_duration(value)
            except ValueError as e:
                raise typer.BadParameter(str(e), param_hint=flag) from None
    for key, value, flag in (("idle_cpu_pct", idle_cpu, "--idle-cpu"), ("idle_gpu_pct", idle_gpu, "--idle-gpu")):
        if value is not None:
            fields[key] = _idle_pct(value, flag)
    if idle_window is not None:
        try:
            fields["idle_window"] = parse_duration(idle_window)
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--idle-window") from None
        if not fields["idle_window"] >= 1:
            raise typer.BadParameter("the window must be at least a second", param_hint="--idle-window")
    return fields


def _idle_pct(value: str, flag: str) -> float | None:
    """A utilisation threshold: a percentage (0-100, a trailing % allowed), or off."""
    if value.strip().lower() in ("off", "none", "no"):
        return None
    try:
        pct = float(value.strip().removesuffix("%"))
    except ValueError:
        pct = -1.0
    if not 0 < pct <= 100:
        raise typer.BadParameter(f"wants a percentage above 0 and at most 100, or off; got {value!r}", param_hint=flag)
    return pct


MaxSessions = Annotated[
    int | None, typer.Option("--max-sessions", help="Concurrent sessions per keypair (0 = unlimited).")
]
SlotsOpt = Annotated[
    list[str] | None, typer.Option("--slots", help="Total slots per keypair, e.g. cpu=4,mem=8g (repeatable).")
]
Unspecified = Annotated[
    str | None, typer.Option("--unspecified", help="Slots not in --slots: unlimited (default) or limited (none).")
]
IdleTimeout = Annotated[
    str | None,
    typer.Option("--idle-timeout", help="End interactive sessions idle this long (e.g. 30m; 0 = unlimited)."),
]
MaxLifetime = Annotated[
    str | None, typer.Option("--max-lifetime", help="End sessions older than this (e.g. 8h; 0 = unlimited).")
]
MaxVfolders = Annotated[int | None, typer.Option("--max-vfolders", help="Virtual folders per keypair (0 = unlimited).")]
VfolderSize = Annotated[
    str | None, typer.Option("--vfolder-size", help="Size limit of each virtual folder, e.g. 10g (0 = unlimited).")
]
IdleCpu = Annotated[
    str | None,
    typer.Option(
        "--idle-cpu",
        help="End interactive sessions whose mean CPU over --idle-window stayed under this percent of what they "
        "were allocated (e.g. 5; off = not checked).",
    ),
]
IdleGpu = Annotated[
    str | None,
    typer.Option("--idle-gpu", help="The same for their GPUs' mean utilisation, percent (off = not checked)."),
]
MaxNetworks = Annotated[
    int | None,
    typer.Option(
        "--max-networks",
        help="Sessions of several kernels per keypair at once: each holds a Docker network (one of the daemon's "
        "address pools) on every agent it runs on (0 = unlimited; default 2).",
    ),
]
MAX_PENDING = (
    1_000_000  # as the manager's admin API bounds it (bai.node.manager.http.admin_routes.MAX_PENDING_SESSION_COUNT)
)
MaxPending = Annotated[
    int | None,
    typer.Option(
        "--max-pending",
        help="Sessions per keypair waiting (PENDING) at once: one more is refused at creation "
        "(0 = unlimited; default 1000).",
    ),
]
MaxPriority = Annotated[
    int | None,
    typer.Option(
        "--max-priority",
        help="The highest scheduling priority (0-100) its keypairs' sessions may have: a higher one asked for is "
        "lowered to it (default 100).",
    ),
]
IdleWindow = Annotated[
    str | None, typer.Option("--idle-window", help="The window of --idle-cpu / --idle-gpu (e.g. 10m; default 10m).")
]


@policy_app.command("create")
def policy_create(
    name: str,
    max_sessions: MaxSessions = None,
    slots: SlotsOpt = None,
    unspecified: Unspecified = None,
    idle_timeout: IdleTimeout = None,
    max_lifetime: MaxLifetime = None,
    max_vfolders: MaxVfolders = None,
    vfolder_size: VfolderSize = None,
    idle_cpu: IdleCpu = None,
    idle_gpu: IdleGpu = None,
    idle_window: IdleWindow = None,
    max_networks: MaxNetworks = None,
    max_pending: MaxPending = None,
    max_priority: MaxPriority = None,
    as_json: AsJson = False,
) -> None:
    """Create a resource policy."""
    fields = _policy_fields(
        max_sessions, slots, unspecified, idle_timeout, max_lifetime, max_vfolders, vfolder_size,
        idle_cpu, idle_gpu, idle_window, max_networks, max_pending, max_priority,
    )  # fmt: skip
    _show_policy(call(lambda c: c.create_policy(name, **fields)), as_json)


@policy_app.command("update")
def policy_update(
    name: str,
    max_sessions: MaxSessions = None,
    slots: SlotsOpt = None,
    unspecified: Unspecified = None,
    idle_timeout: IdleTimeout = None,
    max_lifetime: MaxLifetime = None,
    max_vfolders: MaxVfolders = None,
    vfolder_size: VfolderSize = None,
    idle_cpu: IdleCpu = None,
    idle_gpu: IdleGpu = None,
    idle_window: IdleWindow = None,
    max_networks: MaxNetworks = None,
    max_pending: MaxPending = None,
    max_priority: MaxPriority = None,
    as_json: AsJson = False,
) -> None:
    """Change a resource policy (only the options given)."""
    fields = _policy_fields(
        max_sessions, slots, unspecified, idle_timeout, max_lifetime, max_vfolders, vfolder_size,
        idle_cpu, idle_gpu, idle_window, max_networks, max_pending, max_priority,
    )  # fmt: skip
    if not fields:
        raise typer.BadParameter("give at least one option to change")
    _show_policy(call(lambda c: c.update_policy(name, **fields)), as_json)


def _show_policy(policy: dict[str, Any], as_json: bool) -> None:
    from bai.cli.output import policies_table

    show([policy], as_json, policies_table)


@policy_app.command("ls")
def policy_ls(as_json: AsJson = False, output: Output = None) -> None:
    """List resource policies (`unlimited` where a limit is 0)."""
    from bai.cli.layout import wants
    from bai.cli.output import policies_table

    wide, as_json = wants(output, as_json)
    show(call(lambda c: c.policies()), as_json, lambda rows: policies_table(rows, wide))
