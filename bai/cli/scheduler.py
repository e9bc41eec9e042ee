"""`bai scheduler …`: the scheduling rounds the manager keeps (superadmins), and the replay of one: the same
snapshot through today's scheduler (does it decide the same?), what changed in the cluster since, and what would
be decided now; and fair share's standings (`fair-share`, as Slurm's sshare): who used how much of the cluster
lately, and the factor it gives their waiting sessions."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from bai.cli.common import call, show

app = typer.Typer(help="Scheduling rounds (list the latest, replay one) and fair share.", no_args_is_help=True)

AsJson = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def rounds_table(rows: list[dict[str, Any]]) -> Any:
    from rich.table import Table

    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("ROUND", "AT", "SNAPSHOT", "PENDING", "PLACED", "WAITING", "CANCELLED", "PREEMPTED"):
        table.add_column(column, justify="right" if column not in ("AT", "SNAPSHOT") else "left", no_wrap=True)
    for r in rows:
        table.add_row(
            str(r["round"]),
            r["at"][:19].replace("T", " "),
            r["digest"][:12],
            *(str(r.get(k, 0)) for k in ("pending", "placed", "waiting", "cancelled", "preempted")),
        )
    return table


@app.command("rounds")
def rounds(
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, max=500, help="How many (newest first).")] = 20,
    before: Annotated[int | None, typer.Option("--before", min=1, help="Only rounds before this one.")] = None,
    as_json: AsJson = False,
) -> None:
    """The latest scheduling rounds the manager kept: when, the digest of what it saw, what it decided."""
    answer = call(lambda c: c.scheduler_rounds(limit, before))
    show(answer["rounds"], as_json, rounds_table)


@app.command("replay")
def replay(
    number: Annotated[int, typer.Argument(min=1, help="The round (`bai scheduler rounds`; a waiting session's "
                                                     "`bai session explain` names the last one about it).")],
    as_json: AsJson = False,
) -> None:  # fmt: skip
    """Run a past round's snapshot through today's scheduler: whether it decides the same again, what changed in
    the cluster since, and what it would decide now (nothing is applied)."""
    answer = call(lambda c: c.replay_round(number))
    if as_json:
        show(answer, True, lambda x: x)
        return
    print(f"Round {answer['round']} at {answer['at'][:19].replace('T', ' ')} UTC, snapshot {answer['digest'][:16]}")
    print(f"  {answer['pending']} pending: {answer['placed']} placed, {answer['waiting']} waiting, "
          f"{answer['cancelled']} cancelled, {answer['preempted']} preempted")  # fmt: skip
    print("Decided then:")
    for line in answer["decisions"] or ["(nothing)"]:
        print(f"  {line}")
    if answer["reproduced"]:
        print("Replayed: the same decisions again (the scheduler decides this snapshot as it did then).")
    else:
        print("Replayed: today's scheduler decides this snapshot differently:")
        for line in answer["differences"]:
            print(f"  {line}")
    print("Changed in the cluster since:")
    for line in answer["changes"] or ["nothing"]:
        print(f"  {line}")
    print("Decided now instead (not applied):")
    for line in answer["now"] or ["the same"]:
        print(f"  {line}")


def fair_share_tables(answer: dict[str, Any]) -> Any:
    from rich.console import Group
    from rich.text import Text

    from bai.common.present import fair_share_header
    from bai.common.present import fair_share_table as table

    parts: list[Any] = [
        Text(fair_share_header(answer)),
        table(answer["keypairs"], "ACCESS KEY", "USER", "accessKey", "user")
        if answer["keypairs"]
        else Text("No keypair has usage or waiting sessions"),
    ]
    if answer["projects"]:
        parts += [Text(""), Text("Projects (their factor counts where two or more have usage)", style="bold"),
                  table(answer["projects"], "PROJECT", "ID", "name", "projectId")]  # fmt: skip
    return Group(*parts)


@app.command("fair-share")
def fair_share(as_json: AsJson = False) -> None:
    """Fair share, as the next scheduling round ranks it: each keypair's (and project's) recent usage, its part of
    all the usage compared and its fair-share factor (users see their own, admins their domain's, superadmins all)."""
    answer = call(lambda c: c.fair_share())
    show(answer, as_json, fair_share_tables)
