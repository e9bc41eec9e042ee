"""`bai db copy SRC DST`: a node's SQLite state copied into an empty PostgreSQL database."""

from __future__ import annotations

import typer

from bai.cli.common import fail

app = typer.Typer(help="The manager's database: move it from SQLite to PostgreSQL.", no_args_is_help=True)


@app.command("copy")
def db_copy(
    src: str = typer.Argument(..., help="The SQLite database: a path or sqlite:///ABS/PATH.db."),
    dst: str = typer.Argument(
        ...,
        help="The PostgreSQL database, empty: postgresql://USER@HOST:PORT/DB[?password_file=PATH|password_env=NAME].",
    ),
) -> None:
    """Copy a node's whole state (sessions, kernels, keypairs, policies, folders, logs, …) from its SQLite file
    into an empty PostgreSQL database, in one transaction: all of it or nothing. The source may be in use (it is
    read in one consistent snapshot); what a node writes after that is not copied."""
    import asyncio
    import sqlite3
    from pathlib import Path

    from bai.common.config import data_dir
    from bai.common.dburl import DatabaseURLError, locate, redact
    from bai.node.manager.state.copy import CopyError, copy_state

    state_dir = Path(data_dir()).expanduser().absolute()
    try:
        source = locate(src, state_dir)
        target = locate(dst, state_dir)
    except DatabaseURLError as e:
        fail(redact(str(e)))

    def say(line: str) -> None:
        print(f"  {line}", flush=True)

    print(f"copying {source.shown} into {target.shown}", flush=True)
    try:
        report = asyncio.run(copy_state(source, target, progress=say))
    except CopyError as e:
        fail(redact(str(e)))
    except (OSError, sqlite3.Error) as e:
        fail(redact(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__))
    # (the value as given: locate() refused any password in it, and it keeps password_file= / password_env=,
    # which `shown` leaves out)
    setting = redact(dst.strip())
    width = max(len("TABLE"), *(len(t.name) for t in report.tables))
    print()
    print(f"{'TABLE':<{width}}  {'SOURCE':>8}  {'DESTINATION':>11}")
    for t in report.tables:
        print(f"{t.name:<{width}}  {t.source:>8}  {t.destination:>11}")
    if report.nul_replaced:
        print(
            f"{report.nul_replaced} NUL character(s) in text replaced with U+FFFD (PostgreSQL's text cannot hold NUL)"
        )
    if report.source_in_use:
        print(f"note: {source.shown} was in use; what its node wrote after the snapshot was not copied")
    print(
        f"copied {report.rows} rows in {report.seconds:.2f} s; point the manager at it with "
        f'`[manager] database = "{setting}"`'
    )
