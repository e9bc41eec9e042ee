"""`bai preset …`: resource presets (Backend.AI's): named resources to create sessions with (`bai session run
--preset NAME`), which everyone lists and checks against what is free now, and superadmins make and change."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from bai.cli.common import call, show
from bai.cli.layout import OUTPUT_HELP

app = typer.Typer(
    help="Resource presets: named resources to create sessions with, and whether each fits now.",
    no_args_is_help=True,
)

AsJson = Annotated[bool, typer.Option("--json", help="Print JSON.")]
Output = Annotated[str | None, typer.Option("--output", "-o", metavar="wide|json", help=OUTPUT_HELP)]
Name = Annotated[str, typer.Argument(help="The preset's name.")]
Resource = Annotated[
    list[str] | None,
    typer.Option("--resource", "-r", metavar="SLOT=AMOUNT", help="A slot's amount: cpu=2, mem=4g, cuda.device=1 …"),
]
Cpu = Annotated[str | None, typer.Option("--cpu", help="CPU cores, e.g. 2 or 0.5.")]
Mem = Annotated[str | None, typer.Option("--mem", metavar="SIZE", help="Memory, e.g. 4g.")]
Gpu = Annotated[str | None, typer.Option("--gpu", help="Whole GPUs (slot cuda.device).")]
SharedMemory = Annotated[
    str | None, typer.Option("--shared-memory", metavar="SIZE", help="The kernels' shared memory (/dev/shm), e.g. 1g.")
]
ScalingGroup = Annotated[
    str | None, typer.Option("--scaling-group", metavar="NAME", help="The scaling group it is for [every one].")
]


def _slots(cpu: str | None, mem: str | None, gpu: str | None, resource: list[str] | None) -> dict[str, str]:
    from bai.cli.teams import parse_limits

    slots = parse_limits(resource, "--resource") or {}
    for slot, value in (("cpu", cpu), ("mem", mem), ("cuda.device", gpu)):
        if value is not None:
            slots.update(parse_limits([f"{slot}={value}"], f"--{slot.split('.')[0]}") or {})
    return slots


def _say(p: dict[str, Any], verb: str) -> None:
    from bai.common.present import size, slots_text

    where = f" (scaling group {p['scaling_group_name']})" if p.get("scaling_group_name") else ""
    shm = f", shared memory {size(p['shared_memory'])}" if p.get("shared_memory") else ""
    print(f"preset {p['name']} {verb}: {slots_text(p['resource_slots']) or '-'}{shm}{where}")


@app.command("ls")
def ls(as_json: AsJson = False, output: Output = None) -> None:
    """List the resource presets."""
    from bai.cli.layout import wants
    from bai.cli.output import presets_table

    wide, as_json = wants(output, as_json)
    show(call(lambda c: c.presets()), as_json, lambda rows: presets_table(rows, wide))


@app.command("check")
def check(
    project: Annotated[str | None, typer.Option("--project", help="The project: name or id [your default].")] = None,
    scaling_group: ScalingGroup = None,
    as_json: AsJson = False,
) -> None:
    """Which presets you could start now, and what you may still take (your policy's, your project's and domain's
    limits, and what the agents have free)."""
    from bai.cli.output import emit, presets_table
    from bai.common.present import preset_check_lines

    answer = call(lambda c: c.check_presets(project, scaling_group))
    if as_json:
        show(answer, True, lambda x: x)
        return
    emit(presets_table(answer["presets"], fits=True))
    print("\n".join(preset_check_lines(answer)))


@app.command("add")
def add(
    name: Name,
    cpu: Cpu = None,
    mem: Mem = None,
    gpu: Gpu = None,
    resource: Resource = None,
    shared_memory: SharedMemory = None,
    scaling_group: ScalingGroup = None,
    as_json: AsJson = False,
) -> None:
    """Make a resource preset (superadmins)."""
    slots = _slots(cpu, mem, gpu, resource)
    if not slots:
        raise typer.BadParameter("give its resources: --cpu, --mem, --gpu or -r SLOT=AMOUNT")
    made = call(
        lambda c: c.create_preset(
            name, resource_slots=slots, shared_memory=shared_memory, scaling_group_name=scaling_group
        )
    )
    if as_json:
        show(made, True, lambda x: x)
        return
    _say(made, "made")


@app.command("update")
def update(
    name: Name,
    new_name: Annotated[str | None, typer.Option("--name", help="A new name.")] = None,
    cpu: Cpu = None,
    mem: Mem = None,
    gpu: Gpu = None,
    resource: Resource = None,
    shared_memory: SharedMemory = None,
    scaling_group: Annotated[
        str | None,
        typer.Option("--scaling-group", metavar="NAME", help='The scaling group it is for ("": every one).'),
    ] = None,
    as_json: AsJson = False,
) -> None:
    """Change a resource preset (superadmins): the resources given replace its resources."""
    slots = _slots(cpu, mem, gpu, resource)
    fields: dict[str, Any] = {"name": new_name, "resource_slots": slots or None}
    fields |= {"shared_memory": shared_memory, "scaling_group_name": scaling_group}
    if all(v is None for v in fields.values()):
        raise typer.BadParameter("nothing to change: give --name, resources, --shared-memory or --scaling-group")
    changed = call(lambda c: c.update_preset(name, **fields))
    if as_json:
        show(changed, True, lambda x: x)
        return
    _say(changed, "changed")


@app.command("rm")
def rm(name: Name) -> None:
    """Remove a resource preset (superadmins); sessions made with it keep their resources."""
    call(lambda c: c.delete_preset(name))
    print(f"preset {name} removed")
