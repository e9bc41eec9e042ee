"""`bai vfolder …` (virtual folders: data that outlives sessions) and `bai dotfile …`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from bai.cli import jsonout
from bai.cli.common import call, client, fail, no_color, run_async, show
from bai.cli.complete import complete_folders

app = typer.Typer(
    help="Virtual folders: files that outlive sessions, mounted at /home/work/NAME.", no_args_is_help=True
)
dotfile_app = typer.Typer(help="Dotfiles written into every new kernel's home (e.g. .bashrc).", no_args_is_help=True)

AsJson = Annotated[bool, typer.Option("--json", help="Print JSON.")]
FolderName = Annotated[str, typer.Argument(help="The vfolder.", autocompletion=complete_folders)]


def _table(items: list[dict[str, Any]]):
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    for col in ("NAME", "ID", "HOST", "PERMISSION", "OWNER", "STATUS"):
        table.add_column(col, no_wrap=True)
    for f in items:
        owner = "you" if f["is_owner"] else f["owner"]
        table.add_row(f["name"], f["id"][:12], f["host"], f["permission"], owner, f["status"])
    return table


@app.command("hosts")
def hosts(as_json: AsJson = False) -> None:
    """Where folders can live (the default host first)."""
    info = call(lambda c: c.vfolder_hosts())
    if as_json:
        print(jsonout.dumps(info))
        return
    for name in info["allowed"]:
        print(name + ("  (default)" if name == info["default"] else ""))


@app.command("create")
def create(
    name: str,
    host: Annotated[str | None, typer.Option("--host", help="vfolder host [the default host].")] = None,
    usage_mode: Annotated[str, typer.Option("--usage-mode", help="general, model or data.")] = "general",
    permission: Annotated[str, typer.Option("--permission", "-p", help="ro: every mount read-only; rw.")] = "rw",
    cloneable: Annotated[bool, typer.Option("--cloneable", help="Others it is shared with may clone it.")] = False,
    as_json: AsJson = False,
) -> None:
    """Create a folder."""
    folder = call(lambda c: c.create_vfolder(name, host, usage_mode, permission, cloneable))
    if as_json:
        print(jsonout.dumps(folder, indent=None))
    else:
        print(f"folder {folder['name']} ({folder['id']}) on host {folder['host']}")


@app.command("ls")
def ls(
    shared: Annotated[bool, typer.Option("--shared", help="Only folders others shared with you.")] = False,
    trash: Annotated[bool, typer.Option("--trash", help="The folders in your trash.")] = False,
    everyone: Annotated[bool, typer.Option("--all", help="Admins: every keypair's folders.")] = False,
    as_json: AsJson = False,
) -> None:
    """Your folders and those shared with you."""
    items = call(lambda c: c.vfolders(shared=shared, trash=trash, all=everyone))
    if not items and not as_json:
        print("no folders")
        return
    show(items, as_json, _table)


@app.command("info")
def info(name: FolderName, as_json: AsJson = False) -> None:
    """A folder: where it lives, who may use it, and how much it holds."""
    from bai.common.present import size

    f = call(lambda c: c.vfolder(name))
    if as_json:
        print(jsonout.dumps(f))
        return
    print(f"Folder      {f['name']} ({f['id']})")
    print(f"Host        {f['host']}")
    print(f"Permission  {f['permission']}" + ("  (owner)" if f["is_owner"] else f"  (shared by {f['owner']})"))
    print(f"Usage       {size(f['used_bytes'])} in {f['numFiles']} files")
    print(f"Status      {f['status']}   created {f['created_at']}")
    for who, perm in (f.get("shares") or {}).items():
        print(f"Shared      with {who} ({perm})")


@app.command("rename")
def rename(name: FolderName, new_name: str) -> None:
    """Give a folder another name (owner only)."""
    call(lambda c: c.vfolder_action(name, "rename", new_name=new_name))
    print(f"folder {name} is now {new_name}")


@app.command("set")
def set_options(
    name: FolderName,
    permission: Annotated[str | None, typer.Option("--permission", "-p", help="ro (mounts read-only) or rw.")] = None,
    cloneable: Annotated[bool | None, typer.Option("--cloneable/--not-cloneable", help="May it be cloned.")] = None,
) -> None:
    """Change a folder's own permission or whether it may be cloned (owner only)."""
    call(lambda c: c.vfolder_action(name, "update-options", permission=permission, cloneable=cloneable))
    print(f"folder {name} updated")


@app.command("clone")
def clone(
    name: FolderName,
    target: str,
    host: Annotated[str | None, typer.Option("--host", help="vfolder host [the default host].")] = None,
    permission: Annotated[str, typer.Option("--permission", "-p", help="The copy's own permission.")] = "rw",
) -> None:
    """Copy a cloneable folder (yours, or one shared with you) into a new folder of yours."""
    done = call(lambda c: c.vfolder_action(name, "clone", target_name=target, target_host=host, permission=permission))
    print(f"folder {done['name']} ({done['id']}) is a copy of {name}")


@app.command("invite")
def invite(
    name: FolderName,
    who: Annotated[list[str], typer.Argument(help="Access keys or user ids.")],
    permission: Annotated[str, typer.Option("--permission", "-p", help="ro (read-only) or rw.")] = "ro",
) -> None:
    """Invite keypairs to use a folder: it is shared with each once they accept (owner only)."""
    done = call(lambda c: c.vfolder_action(name, "invite", user_ids=who, perm=permission))
    print(f"invited to {name}: {', '.join(done['invited_ids']) or 'nobody new'}")


@app.command("invitations")
def invitations(
    sent: Annotated[bool, typer.Option("--sent", help="Those you sent, still pending.")] = False,
    as_json: AsJson = False,
) -> None:
    """Invitations to folders waiting for your answer (accept or reject them by id)."""
    items = call(lambda c: c.vfolder_invitations(sent))
    if as_json:
        print(jsonout.dumps(items))
        return
    if not items:
        print("no invitations")
    for i in items:
        print(f"{i['id']}  {i['vfolder_name']} ({i['perm']})  from {i['inviter']} to {i['invitee']}")


@app.command("accept")
def accept(invitation: str) -> None:
    """Accept an invitation: the folder is shared with you."""
    call(lambda c: c.answer_vfolder_invitation(invitation, True))
    print("accepted")


@app.command("reject")
def reject(invitation: str) -> None:
    """Reject an invitation to you (or cancel one you sent)."""
    call(lambda c: c.answer_vfolder_invitation(invitation, False))
    print("rejected")


@app.command("leave")
def leave(name: FolderName) -> None:
    """Stop using a folder shared with you."""
    call(lambda c: c.vfolder_action(name, "leave"))
    print(f"left folder {name}")


@app.command("rm")
def rm(name: FolderName) -> None:
    """Move a folder to the trash (`bai vfolder purge` deletes it for good, `restore` brings it back)."""
    call(lambda c: c.delete_vfolder(name))
    print(f"folder {name} is in the trash")


@app.command("restore")
def restore(name: str) -> None:
    """Bring a folder back from the trash."""
    call(lambda c: c.vfolder_action(name, "restore"))
    print(f"folder {name} is back")


@app.command("purge")
def purge(name: str) -> None:
    """Delete a folder in the trash and every file in it, for good."""
    call(lambda c: c.vfolder_action(name, "purge"))
    print(f"folder {name} is deleted")


@app.command("share")
def share(
    name: FolderName,
    who: Annotated[list[str], typer.Argument(help="Access keys or user ids.")],
    permission: Annotated[str, typer.Option("--permission", "-p", help="ro (read-only) or rw.")] = "ro",
) -> None:
    """Let other keypairs use a folder, read-only or read-write (owner only)."""
    done = call(lambda c: c.vfolder_action(name, "share", access_keys=who, permission=permission))
    print(f"folder {name} shared ({permission}) with {', '.join(done['shared_with']) or 'nobody new'}")


@app.command("unshare")
def unshare(name: FolderName, who: Annotated[list[str], typer.Argument(help="Access keys or user ids.")]) -> None:
    """Stop sharing a folder with keypairs."""
    done = call(lambda c: c.vfolder_action(name, "unshare", "DELETE", access_keys=who))
    print(f"folder {name} no longer shared with {', '.join(done['unshared_from'])}")


@app.command("ls-files")
def ls_files(
    name: FolderName, path: Annotated[str, typer.Argument(help="A folder inside it.")] = "", as_json: AsJson = False
):
    """The files in a folder (or in a folder inside it)."""
    items = call(lambda c: c.vfolder_files(name, path))

    def render(items: list[dict[str, Any]]):
        from rich.table import Table

        from bai.common.present import size

        table = Table(box=None, header_style="bold")
        for col in ("NAME", "TYPE", "SIZE", "MODIFIED"):
            table.add_column(col, no_wrap=True)
        for i in items:
            shown = size(i["size"]) if i["type"] == "file" else ""
            table.add_row(i["name"] + ("/" if i["type"] == "dir" else ""), i["type"], shown, i["modified"][:19])
        return table

    show(items, as_json, render)


@app.command("mkdir")
def mkdir(
    name: FolderName,
    path: str,
    parents: Annotated[bool, typer.Option("--parents", "-p", help="Make missing parent folders too.")] = False,
) -> None:
    """Make a folder inside a folder."""
    call(lambda c: c.vfolder_action(name, "mkdir", path=path, parents=parents, exist_ok=parents))


@app.command("mv")
def mv(name: FolderName, src: str, dst: str) -> None:
    """Rename or move a file or folder inside a folder."""
    call(lambda c: c.vfolder_action(name, "rename-file", target_path=src, new_path=dst))


@app.command("rm-files")
def rm_files(
    name: FolderName,
    paths: list[str],
    recursive: Annotated[bool, typer.Option("--recursive", "-r", help="Folders and what they hold.")] = False,
) -> None:
    """Delete files (and with -r folders) in a folder."""
    done = call(lambda c: c.vfolder_action(name, "delete-files", "DELETE", files=paths, recursive=recursive))
    print(f"removed {done['removed']}")


def _progress(total: int, what: str):
    """A rich progress bar on a terminal for transfers (None when not a terminal)."""
    if not sys.stderr.isatty() or no_color():
        return None
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    progress = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        transient=False,
    )
    progress.add_task(what, total=total)
    return progress


@app.command("upload")
def upload(
    name: FolderName,
    sources: Annotated[list[Path], typer.Argument(help="Files or folders to upload.")],
    dest: Annotated[str, typer.Option("--dest", "-d", help="Folder inside the vfolder to put them in.")] = "",
    dst: Annotated[str | None, typer.Option("--dst", hidden=True, help="Old name of --dest.")] = None,
) -> None:
    """Upload files and folders (whole trees); each file appears only once it is complete."""
    if dst is not None:
        dest = dst
    plan: list[tuple[Path, str]] = []
    folders: list[str] = []
    for src in sources:
        if not src.exists():
            fail(f"{src}: no such file or folder")
        base = f"{dest.strip('/')}/{src.name}" if dest.strip("/") else src.name
        if src.is_dir():
            folders.append(base)
            for path in sorted(src.rglob("*")):
                rel = f"{base}/{path.relative_to(src).as_posix()}"
                if path.is_dir() and not path.is_symlink():
                    folders.append(rel)
                elif path.is_file():
                    plan.append((path, rel))
        else:
            plan.append((src, base))
    total = sum(p.stat().st_size for p, _ in plan)
    progress = _progress(total, f"upload to {name}")

    async def go() -> None:
        async with client() as c:
            for folder in folders:
                await c.vfolder_action(name, "mkdir", path=folder, parents=True, exist_ok=True)
            for path, rel in plan:
                tick = (lambda n: progress.advance(0, n)) if progress else None
                await c.upload_file(name, path, rel, tick)

    if progress:
        with progress:
            run_async(go())
    else:
        run_async(go())
    from bai.common.present import size

    print(f"uploaded {len(plan)} files ({size(total)}) to {name}")


@app.command("download")
def download(
    name: FolderName,
    paths: Annotated[list[str], typer.Argument(help="Files or folders in the vfolder (a folder: its whole tree).")],
    dest: Annotated[Path, typer.Option("--dest", "-d", help="Local folder to write into.")] = Path("."),
    dst: Annotated[Path | None, typer.Option("--dst", hidden=True, help="Old name of --dest.")] = None,
    force: Annotated[bool, typer.Option("--force", "-f", help="Overwrite local files that exist.")] = False,
) -> None:
    """Download files, and folders as folder trees, into a local folder; an existing local file is an
    error unless --force."""
    from bai.cli.transfers import download_plan, local_targets

    if dst is not None:
        dest = dst
    if not dest.is_dir():
        fail(f"{dest}: no such folder")

    async def go() -> tuple[int, int, int]:
        async with client() as c:
            plan = await download_plan(c, name, paths)
            problem = local_targets(plan, dest, force)
            if problem:
                fail(problem)
            total = 0
            for folder in plan.folders:
                (dest / folder).mkdir(parents=True, exist_ok=True)
            for remote, local in plan.files:
                total += await c.download_file(name, remote, dest / local)
            return len(plan.files), total, plan.skipped

    count, received, skipped = run_async(go())
    from bai.common.present import size

    note = f"; {skipped} links skipped" if skipped else ""
    print(f"downloaded {count} files ({size(received)}) to {dest}{note}")


@dotfile_app.command("add")
def dotfile_add(
    path: Annotated[str, typer.Argument(help="Where in the kernel's home, e.g. .bashrc or .config/x.toml.")],
    source: Annotated[Path | None, typer.Option("--file", "-f", help="Local file to take the text from.")] = None,
    data: Annotated[str | None, typer.Option("--data", help="The text itself.")] = None,
    permission: Annotated[str, typer.Option("--permission", help="Octal mode, e.g. 644 or 755.")] = "644",
) -> None:
    """Add (or replace) a dotfile that every new kernel of yours gets in its home."""
    if (source is None) == (data is None):
        raise typer.BadParameter("give the text with --file or --data (one of them)")
    text = source.read_text() if source is not None else data
    call(lambda c: c.put_dotfile(path, text or "", permission))
    print(f"dotfile {path} saved")


@dotfile_app.command("ls")
def dotfile_ls(as_json: AsJson = False) -> None:
    """Your dotfiles."""
    from bai.common.present import size

    items = call(lambda c: c.dotfiles())
    if as_json:
        print(jsonout.dumps(items))
        return
    if not items:
        print("no dotfiles")
    for d in items:
        print(f"{d['path']}  ({d['permission']}, {size(len(d['data'].encode()))})")


@dotfile_app.command("rm")
def dotfile_rm(path: str) -> None:
    """Remove a dotfile (kernels that have it keep their copy)."""
    call(lambda c: c.delete_dotfile(path))
    print(f"dotfile {path} removed")
