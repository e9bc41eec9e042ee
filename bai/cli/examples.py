"""An example for every command's help, shown after its options (`bai.cli.lazy` adds it as the epilog when
it builds the command). Keyed by the command's path; a command whose own help already has "Example" keeps it.
`tests/test_cli_polish.py` checks that every command has one."""

from __future__ import annotations

EXAMPLES: dict[str, str | tuple[str, ...]] = {
    "bai node": ("bai node", "bai node --role manager --listen 0.0.0.0:8091"),
    "bai node status": ("bai node status", "bai node status --state-dir /srv/bai-test --json"),
    "bai node stop": ("bai node stop", "bai node stop --state-dir /srv/bai-test"),
    "bai whoami": ("bai whoami", "bai whoami --json"),
    "bai quota": ("bai quota", "bai quota --json"),
    "bai usage": (
        "bai usage",
        "bai usage --month 202612 --by project --all",
        "bai usage --since 20261201 --until 20261215 --json",
    ),
    "bai watcher": "bai watcher --listen 127.0.0.1:6009",
    "bai client-env": "eval $(bai client-env)",
    "bai tui": "bai tui --read-only",
    "bai session run": (
        "bai session run python -c 'print(1 + 1)'",
        "bai session run python train.py --cpu 2 --mem 4g -v data",
        "bai session run python -- nproc",
    ),
    "bai session create": (
        "bai session create python --name nb --cpu 1 --mem 1g",
        "bai session create python --type batch --startup-command 'python job.py' --wait",
        "bai session create python --name dist --cluster-size 3 --cluster-mode multi-node",
    ),
    "bai session set-priority": ("bai session set-priority train 50", "bai session set-priority ID 90 --owner AK"),
    "bai preset ls": ("bai preset ls", "bai preset ls -o json"),
    "bai preset check": ("bai preset check", "bai preset check --project ml --scaling-group gpu"),
    "bai preset add": ("bai preset add small --cpu 1 --mem 2g", "bai preset add gpu1 -r cpu=4,mem=16g --gpu 1"),
    "bai preset update": ("bai preset update small --mem 4g", "bai preset update small --name tiny"),
    "bai preset rm": "bai preset rm small",
    "bai session template create": (
        "bai session template create job.yaml",
        "cat job.json | bai session template create -",
    ),
    "bai session template list": ("bai session template list", "bai session template list --all --json"),
    "bai session template get": ("bai session template get ID", "bai session template get ID --format json"),
    "bai session template update": "bai session template update ID job.yaml",
    "bai session template delete": "bai session template delete ID",
    "bai session template run": (
        "bai session template run ID --name job1",
        "bai session template run ID --env N=2 --cpu 2 --image python",
    ),
    "bai session exec": (
        "bai session exec nb -c 'import sys; print(sys.version)'",
        "bai session exec nb -- ls -l",
        "bai session exec dist --kernel sub1 -- hostname",
    ),
    "bai session shell": (
        "bai session shell nb",
        "bai session shell nb -- top",
        "bai session shell dist --kernel sub2",
    ),
    "bai session app": "bai session app nb jupyterlab --bind 127.0.0.1:8090",
    "bai session apps": "bai session apps nb",
    "bai session ls": ("bai session ls --status running,pending", "bai session ls --failed --json"),
    "bai session info": "bai session info nb",
    "bai session top": ("bai session top", "bai session top --sort mem --once"),
    "bai session explain": "bai session explain nb",
    "bai session events": ("bai session events nb", "bai session events --follow"),
    "bai session logs": (
        "bai session logs nb --tail 50",
        "bai session logs nb --since 10m --follow",
        "bai session logs dist --kernel sub1",
    ),
    "bai session files": "bai session files nb /home/work/results",
    "bai session destroy": ("bai session destroy nb", "bai session destroy stuck-one --force"),
    "bai session download": "bai session download nb results/model.pt --dest ./out",
    "bai session restart": "bai session restart nb",
    "bai session rename": "bai session rename nb notebook",
    "bai session commit": "bai session commit nb --image my-env:v1",
    "bai agent ls": "bai agent ls",
    "bai manager ls": "bai manager ls",
    "bai db copy": "bai db copy ~/.local/share/bai/bai.db 'postgresql://bai@db1/bai?password_file=/etc/bai/db-password'",
    "bai agent info": "bai agent info host1",
    "bai image ls": "bai image ls --json",
    "bai image pull": "bai image pull python:3.11-slim --agent host1",
    "bai image rm": "bai image rm python:3.11-slim",
    "bai image alias": ("bai image alias", "bai image alias py python:3.11-slim", "bai image alias py --remove"),
    "bai config show": "bai config show",
    "bai keypair create": "bai keypair create --user alice --policy small",
    "bai keypair ls": "bai keypair ls",
    "bai keypair set-policy": "bai keypair set-policy AKIA0123456789ABCDEF small",
    "bai keypair deactivate": "bai keypair deactivate AKIA0123456789ABCDEF --terminate",
    "bai keypair activate": "bai keypair activate AKIA0123456789ABCDEF",
    "bai cluster join-info": "bai cluster join-info",
    "bai cluster freeze": ("bai cluster freeze", "bai cluster freeze --force-kill"),
    "bai cluster unfreeze": "bai cluster unfreeze",
    "bai cluster announce": ("bai cluster announce 'down at 9 for maintenance'", "bai cluster announce --off"),
    "bai policy create": "bai policy create small --max-sessions 2 --slots cpu=4,mem=8g --idle-timeout 30m",
    "bai policy update": "bai policy update small --max-lifetime 8h",
    "bai policy ls": "bai policy ls",
    "bai vfolder hosts": "bai vfolder hosts",
    "bai vfolder create": "bai vfolder create data --permission rw",
    "bai vfolder ls": ("bai vfolder ls", "bai vfolder ls --trash"),
    "bai vfolder info": "bai vfolder info data",
    "bai vfolder rename": "bai vfolder rename data datasets",
    "bai vfolder set": "bai vfolder set data --permission ro --cloneable",
    "bai vfolder clone": "bai vfolder clone data data-copy",
    "bai vfolder invite": "bai vfolder invite data bob@example.com --permission rw",
    "bai vfolder invitations": ("bai vfolder invitations", "bai vfolder invitations --sent"),
    "bai vfolder accept": "bai vfolder accept 3f2a9c1e",
    "bai vfolder reject": "bai vfolder reject 3f2a9c1e",
    "bai vfolder leave": "bai vfolder leave shared-data",
    "bai vfolder rm": "bai vfolder rm data",
    "bai vfolder restore": "bai vfolder restore data",
    "bai vfolder purge": "bai vfolder purge data",
    "bai vfolder share": "bai vfolder share data AKIA0123456789ABCDEF --permission ro",
    "bai vfolder unshare": "bai vfolder unshare data AKIA0123456789ABCDEF",
    "bai vfolder ls-files": "bai vfolder ls-files data results",
    "bai vfolder mkdir": "bai vfolder mkdir data results/run1 --parents",
    "bai vfolder mv": "bai vfolder mv data results/run1 results/best",
    "bai vfolder rm-files": "bai vfolder rm-files data results/run1 --recursive",
    "bai vfolder upload": "bai vfolder upload data ./train.csv ./images --dest inputs",
    "bai vfolder download": (
        "bai vfolder download data results/model.pt --dest ./out",
        "bai vfolder download data results --dest ./out",
        "bai vfolder download data results/model.pt --force",
    ),
    "bai dotfile add": ("bai dotfile add .bashrc --file ~/.bashrc", "bai dotfile add .vimrc --data 'set nu'"),
    "bai dotfile ls": "bai dotfile ls",
    "bai dotfile rm": "bai dotfile rm .vimrc",
}


def epilog_of(path: str) -> str | None:
    """`Example: …` (or `Examples:` and one a line) for the command `path`, e.g. "bai session ls"."""
    found = EXAMPLES.get(path)
    if found is None:
        return None
    if isinstance(found, str):
        return f"Example: {found}"
    return "Examples:\n" + "\n".join(f"  {line}" for line in found)
