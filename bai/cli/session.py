"""`bai session …`: create, run, inspect and destroy sessions."""

from __future__ import annotations

import contextlib
import json
import shlex
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from bai.cli.common import EXIT_NOT_STARTED, call, call_now, fail, no_color, run_async, show
from bai.cli.layout import OUTPUT_HELP
from bai.common.cluster import MAX_CLUSTER_SIZE, MODES, SINGLE_NODE

if TYPE_CHECKING:
    import asyncio

app = typer.Typer(help="Sessions: groups of kernels that run your code.", no_args_is_help=True)

# options shared by `run` and `create`
Cpu = Annotated[str | None, typer.Option("--cpu", help="CPU cores, e.g. 1 or 0.5.")]
Mem = Annotated[str | None, typer.Option("--mem", metavar="SIZE", help="Memory, e.g. 512m or 1g.")]
Gpu = Annotated[str | None, typer.Option("--gpu", help="Whole GPUs (slot cuda.device), e.g. 1.")]
GpuShare = Annotated[str | None, typer.Option("--gpu-share", help="A fraction of a GPU (slot cuda.shares), e.g. 0.5.")]
Env = Annotated[
    list[str] | None,
    typer.Option("--env", "-e", metavar="KEY=VALUE", help="Environment variable KEY=VALUE (repeatable)."),
]
Name = Annotated[str | None, typer.Option("--name", help="Session name (default: a generated one).")]
Project = Annotated[
    str | None,
    typer.Option("--project", help="The project (Backend.AI's group) to create it in: name or id [your default one]."),
]
Domain = Annotated[str | None, typer.Option("--domain", help="The domain of --project [yours].")]
Priority = Annotated[
    int | None,
    typer.Option(
        "--priority",
        min=0,
        max=100,
        help="Scheduling priority 0-100 (default 10; at most your policy's max_priority): under the multifactor "
        "policy the higher goes first.",
    ),
]
TimeLimit = Annotated[
    str | None,
    typer.Option(
        "--time-limit",
        metavar="DURATION",
        help="How long it may run once started (90m, 2h, 1d): it is ended then; backfill plans with it.",
    ),
]
Preemptible = Annotated[
    bool,
    typer.Option(
        "--preemptible/--not-preemptible",
        help="Whether a session of a higher priority may stop it where its scaling group has preemption on (a batch "
        "session is requeued, an interactive one told first).",
    ),
]
Preset = Annotated[
    str | None,
    typer.Option(
        "--preset", metavar="NAME", help="The resources of a resource preset (`bai preset ls`); --cpu, --mem … on top."
    ),
]


def _complete_sessions(incomplete: str) -> list[str]:
    from bai.cli.complete import complete_sessions

    return complete_sessions(incomplete)


def _complete_images(incomplete: str) -> list[str]:
    from bai.cli.complete import complete_images

    return complete_images(incomplete)


def _complete_statuses(incomplete: str) -> list[str]:
    from bai.cli.complete import complete_statuses

    return complete_statuses(incomplete)


Network = Annotated[
    str | None,
    typer.Option("--network", help="Docker network (none, bridge, host, ...): only what the scaling group allows."),
]

ClusterSize = Annotated[
    int,
    typer.Option(
        "--cluster-size",
        metavar="N",
        min=1,
        max=MAX_CLUSTER_SIZE,
        help="Kernels in the session: main1, sub1 … sub{N-1}, each with the resources asked for.",
    ),
]


def _cluster_mode(value: str | None) -> str:
    """single-node or multi-node, in any case (Backend.AI's enum names SINGLE_NODE / MULTI_NODE too)."""
    mode = (value or SINGLE_NODE).strip().lower().replace("_", "-")
    if mode not in MODES:
        raise typer.BadParameter(f"wants single-node or multi-node, got {value!r}")
    return mode


ClusterMode = Annotated[
    str,
    typer.Option(
        "--cluster-mode",
        metavar="MODE",
        callback=_cluster_mode,
        help="single-node: every kernel on one agent; multi-node: the kernels may be spread over agents.",
    ),
]
Kernel = Annotated[
    str | None,
    typer.Option(
        "--kernel", metavar="KERNEL", help="Which kernel of a cluster session: main1 (default), sub1 … or a kernel id."
    ),
]

STARTING = {"PENDING", "SCHEDULED", "PULLING", "PREPARING", "TIMEOUT"}
ENDED = {"TERMINATED", "CANCELLED", "ERROR"}
BATCH_DONE = {"task-done", "task-failed"}  # a batch session that started, ran and ended
FORCED_ONLY = {"SCHEDULED", "PREPARING", "PULLING"}  # live statuses only a forced destroy ends (of STARTING's)
EXIT_STILL_WAITING = 124  # `create --timeout` gave up waiting (the session stays): as timeout(1) exits
SAME_SIGNAL = 0.25  # seconds: the same signal again this soon is one signal delivered twice
OWNER_HELP = "Admins: the access key whose session a name refers to (owner_access_key)."


def parse_resources(
    cpu: str | None, mem: str | None, gpu: str | None = None, gpu_share: str | None = None
) -> dict[str, str]:
    from bai.common.slots import SlotError, parse_bytes, parse_count

    out = {}
    try:
        if gpu is not None:
            n = parse_count(gpu)
            if n <= 0 or n != int(n):
                raise SlotError(f"--gpu wants a whole number of GPUs, got {gpu!r} (--gpu-share for a fraction)")
            out["cuda.device"] = gpu
        if gpu_share is not None:
            if parse_count(gpu_share) <= 0:
                raise SlotError(f"--gpu-share must be more than 0, got {gpu_share!r}")
            out["cuda.shares"] = gpu_share
        if cpu is not None:
            if parse_count(cpu) <= 0:
                raise SlotError(f"--cpu must be more than 0, got {cpu!r}")
            out["cpu"] = cpu
        if mem is not None:
            if parse_bytes(mem) <= 0:
                raise SlotError(f"--mem must be more than 0, got {mem!r}")
            out["mem"] = mem
    except SlotError as e:
        raise typer.BadParameter(str(e)) from None
    return out


def parse_time_limit(value: str | None) -> float | None:
    """--time-limit: seconds, or None when not given; a usage error otherwise."""
    if value is None:
        return None
    from bai.common.durations import parse_duration

    try:
        seconds = parse_duration(value)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--time-limit") from None
    if seconds <= 0:
        raise typer.BadParameter("wants a duration above 0 (90m, 2h, 1d)", param_hint="--time-limit")
    return seconds


async def with_preset(c: Any, preset: str | None, resources: dict[str, str]) -> dict[str, str]:
    """The resources of a preset (a 404 when there is none), those given as options on top."""
    if not preset:
        return resources
    return {**(await c.preset(preset))["resource_slots"], **resources}


def parse_env(pairs: list[str] | None) -> dict[str, str]:
    env = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key or not key.replace("_", "a").isalnum() or key[0].isdigit():
            raise typer.BadParameter(f"--env wants KEY=VALUE with a valid variable name, got {pair!r}")
        env[key] = value
    return env


Mount = Annotated[
    list[str] | None,
    typer.Option(
        "--mount",
        "-v",
        metavar="NAME[:PATH][:ro]",
        help="Mount a virtual folder: NAME[:PATH][:ro] (default /home/work/NAME; repeatable).",
    ),
]


def parse_mounts(args: list[str] | None) -> dict[str, Any]:
    from bai.common.mounts import MountError, mount_config

    try:
        return mount_config(args or [])
    except MountError as e:
        raise typer.BadParameter(str(e), param_hint="--mount") from None


def check_name(name: str | None) -> None:
    from bai.common.names import name_problem

    if name is not None and (problem := name_problem(name)):
        raise typer.BadParameter(problem, param_hint="--name")


def _print_console(items: list[list[Any]]) -> None:
    for kind, data in items:
        if kind == "stderr":
            sys.stderr.write(data)
            sys.stderr.flush()
        elif kind == "stdout":
            sys.stdout.write(data)
            sys.stdout.flush()
        else:
            sys.stdout.write(f"----- output record (type: {kind}) -----\n{data}\n----- end of record -----\n")
            sys.stdout.flush()


class Owned:
    """The session a command works on, and whether that command created it (the first create reply's
    `created`: false when get-or-create by name found an existing session, which is not the command's
    to end)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.sid: str | None = None
        self.created = False
        self.status: str | None = None  # the last status seen
        self.ran = False  # the code was handed to the kernel
        self.run_id: str | None = None  # the run of that code

    def note(self, reply: dict[str, Any]) -> None:
        if self.sid is None:
            self.sid = reply["sessionId"]
            self.created = reply.get("created") is True
        if reply.get("status") not in (None, "TIMEOUT"):  # TIMEOUT: still starting when the reply left
            self.status = reply["status"]


class Signals:
    """SIGINT and SIGTERM while a command waits on the manager: the first signal cancels the main task
    (its clean-up runs, then it exits 128 + the signal's number, as shells expect), unless `on_sigint`
    takes a Ctrl-C (it returns True: e.g. the first one interrupts the running code)."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.on_sigint: Any = None
        self._task: asyncio.Task | None = None
        self._last: tuple[int, float] | None = None  # the last signal taken, and when (time.monotonic)

    def __enter__(self) -> Signals:
        import asyncio

        loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._handle, sig)
        return self

    def __exit__(self, *exc: object) -> None:
        import asyncio

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)

    def _handle(self, sig: int) -> None:
        import time

        now = time.monotonic()
        if self._last is not None and self._last[0] == sig and now - self._last[1] < SAME_SIGNAL:
            return  # one signal delivered twice (`timeout` signals its command, then its process group)
        self._last = (sig, now)
        if sig == signal.SIGINT and self.on_sigint is not None and self.on_sigint():
            return
        if self.received is None:
            self.received = sig
        if self._task is not None:
            self._task.cancel()  # again on a later signal: stop the clean-up too

    @property
    def exit_code(self) -> int:
        return 128 + (self.received or signal.SIGINT)

    @property
    def word(self) -> str:
        return "terminated" if self.received == signal.SIGTERM else "interrupted"


async def _create(c, image: str, name: str, owned: Owned | None, **kw: Any) -> dict[str, Any]:
    """One create (or get) request. Its reply is noted in `owned` even when a signal cancels the wait
    for it: a session the manager created meanwhile must not be left behind unknown."""
    import asyncio

    request = asyncio.ensure_future(c.create_session(image, name=name, max_wait=2, **kw))
    try:
        result = await asyncio.shield(request)
    except asyncio.CancelledError:
        if owned is not None and owned.sid is None:
            with contextlib.suppress(Exception):
                owned.note(await request)  # at most max_wait (2 s): the manager answers by then
        raise
    if owned is not None:
        owned.note(result)
    return result


async def wait_running(c, image: str, name: str, quiet: bool, owned: Owned | None = None, **kw: Any) -> dict[str, Any]:
    """Create (or get) the session and wait until it runs, showing why it waits; `owned` learns which
    session it is, and whether this call created it."""
    status = None
    if not quiet and sys.stderr.isatty() and not no_color():  # (a spinner redraws with escapes)
        from rich.console import Console

        status = Console(stderr=True, highlight=False).status(f"starting session {name} ({image})…", spinner="dots")
        status.start()
    said = ""
    try:
        while True:
            result = await _create(c, image, name, owned, **kw)
            if result["status"] not in STARTING or quiet:
                if result["status"] not in STARTING:
                    break
                continue
            from bai.cli.output import reason

            info = await c.get_session(result["sessionId"])
            why = reason(info)
            line = f"session {name}: {info['status']}" + (f" ({why})" if why else "")
            if status is not None:
                status.update(line + "…")
            elif line != said:  # not a terminal: say why it waits, once per reason
                print(f"[{line}]", file=sys.stderr)
                said = line
    finally:
        if status is not None:
            status.stop()
    if result["status"] not in ("RUNNING", "RUNNING_DEGRADED"):
        from bai.cli.output import reason

        info = await c.get_session(result["sessionId"])
        if owned is not None:
            owned.status = info["status"]
        if info["statusInfo"] in BATCH_DONE or info["status"] == "TERMINATING":
            return {**result, "status": info["status"]}  # a batch session that already ran
        print(f"bai: session {name} could not start: {info['status']} ({reason(info)})", file=sys.stderr)
        raise typer.Exit(EXIT_NOT_STARTED)
    return result


async def _status_now(c, session_id: str, limit: float = 3.0) -> dict[str, Any] | None:
    """The session as the manager shows it now, or None when that is unknown (no answer within `limit`
    seconds, an error)."""
    import asyncio

    from bai.client.api import APIError

    try:
        return await asyncio.wait_for(c.get_session(session_id), limit)
    except (APIError, TimeoutError):
        return None


def _where_it_is(info: dict[str, Any]) -> str:
    """`still queued (PENDING, 2nd in the queue: no agent has room …)`, `still starting (PULLING)` …"""
    from bai.cli.output import reason

    status = info["status"]
    why = reason(info)
    if status == "PENDING":
        place = f", number {info['queuePosition']} in the queue" if info.get("queuePosition") else ""
        return f"still queued (PENDING{place}" + (f": {why})" if why else ")")
    if status in STARTING:
        return f"still starting ({status}" + (f": {why})" if why else ")")
    return status + (f" ({why})" if why else "")


async def say_left_waiting(c, owned: Owned, why: str) -> None:
    """`create` stopped waiting (`why`: the timeout, a signal): the session is not its to end; say where it
    is (status, place in the queue, why it waits) and how to end it, on stderr."""
    import asyncio

    end = f"end it with `bai session destroy {owned.name}`"
    if owned.sid is None:
        print(
            f"bai: {why} before the manager answered: session {owned.name} may exist (see "
            f"`bai session info {owned.name}`); if it does, {end}",
            file=sys.stderr,
        )
        return
    label = f"session {owned.name} ({owned.sid})"
    info = None
    with contextlib.suppress(asyncio.CancelledError):  # another signal: say what is known
        info = await _status_now(c, owned.sid)
    if info is None:
        print(f"bai: {why}: {label} was left as it is (its status could not be read); {end}", file=sys.stderr)
    elif info["status"] in ENDED:
        print(f"bai: {why}: {label} is {_where_it_is(info)}", file=sys.stderr)
    else:
        stays = "stays queued" if info["status"] == "PENDING" else "goes on"
        print(f"bai: {why}: {label} is {_where_it_is(info)}; it {stays}: {_how_to_end(info, owned.name)}",
              file=sys.stderr)  # fmt: skip


def _how_to_end(info: dict[str, Any], name: str) -> str:
    """The command that ends a session in its status now (one starting takes --force, as the manager says)."""
    forced = "--force " if info["status"] in FORCED_ONLY else ""
    return f"end it with `bai session destroy {forced}{name}`"


async def say_reused(c, owned: Owned, asked: dict[str, Any]) -> None:
    """Get-or-create found the live session of the name (not created by this command): say so on stderr,
    and how it differs from what was asked (bai.cli.reuse)."""
    from bai.cli.reuse import differences, reused_line

    if owned.sid is None or owned.created:
        return
    info = await _status_now(c, owned.sid)
    if info is None:
        print(f"bai: session {owned.name} ({owned.sid}) already existed and was reused, not created", file=sys.stderr)
        return
    print(reused_line(owned.name, owned.sid, info["status"], differences(asked, info)), file=sys.stderr)


async def stream_execution(
    c,
    session_id: str,
    mode: str,
    code: str,
    options: dict[str, Any],
    signals: Signals | None = None,
    owned: Owned | None = None,
    kernel: str | None = None,
) -> int:
    """Run code in a session, print its output as it comes, return its exit code (128 + the signal's
    number when a signal stopped the wait: a second Ctrl-C, or SIGTERM; the first Ctrl-C interrupts the
    code). `signals`: the caller's (else this call handles SIGINT and SIGTERM while it runs). `kernel`: which
    kernel of a cluster session runs it (main1 when None)."""
    import asyncio
    import secrets

    loop = asyncio.get_running_loop()
    interrupts = 0
    run_id = secrets.token_hex(8)  # this run's own: an interrupt reaches it and no other run in the session

    def on_sigint() -> bool:
        nonlocal interrupts
        interrupts += 1
        if interrupts == 1:
            print("\n[interrupting; press Ctrl-C again to stop waiting]", file=sys.stderr)
            asyncio.ensure_future(_interrupt(c, session_id, run_id))
            return True
        return False

    with contextlib.ExitStack() as stack:
        if signals is None:
            signals = stack.enter_context(Signals())
        signals.on_sigint = on_sigint
        stack.callback(setattr, signals, "on_sigint", None)
        return await _stream(c, session_id, mode, code, options, signals, owned, loop, run_id, kernel)


async def _interrupt(c, session_id: str, run_id: str) -> None:
    from bai.client.api import APIError

    with contextlib.suppress(APIError):  # it may have just finished
        await c.interrupt(session_id, run_id)


def _say_queue(queue: dict[str, Any]) -> None:
    ahead = queue.get("ahead") or 1
    behind = queue.get("behind") or "another run"
    more = f" and {ahead - 1} more" if ahead > 1 else ""
    print(f"[waiting behind run {behind}{more}: one run at a time in a session]", file=sys.stderr)


REATTACH_WINDOW = 60.0  # seconds a run's client tries to re-attach to it after its stream broke (a node restart)


async def _stream(
    c, session_id, mode, code, options, signals: Signals, owned: Owned | None, loop, run_id, kernel=None
) -> int:
    """Start the run and print its output until it ends. When the stream breaks before the end (the node
    restarted, the connection dropped) the run goes on in the kernel: this re-attaches to it by its run id
    for up to REATTACH_WINDOW seconds, saying so, and prints the rest of its output and its exit code; a run
    the kernel no longer has (or a session that ended meanwhile) is said as such, exit 1."""
    import asyncio

    from bai.client.api import APIError

    seen = [0]  # the seq of the last frame printed
    try:
        outcome = await _follow(c, session_id, mode, code, options, owned, loop, run_id, kernel, seen=seen)
        if outcome is not None:
            return outcome
        print(
            f"bai: the connection to the node was lost while run {run_id} was going; re-attaching to it …",
            file=sys.stderr,
        )
        deadline = loop.time() + REATTACH_WINDOW
        while loop.time() < deadline:
            await asyncio.sleep(0.5)
            try:
                outcome = await _follow(
                    c, session_id, "continue", "", {}, None, loop, run_id, kernel, again=True, seen=seen
                )
            except APIError as e:
                if e.status and 400 <= e.status < 500:  # the session is gone or ended: nothing to re-attach to
                    print(f"bai: error: run {run_id} cannot be re-attached: {e}", file=sys.stderr)
                    return 1
                continue  # the node is not back yet
            if outcome is not None:
                return outcome
        print(
            f"bai: error: the node did not come back within {REATTACH_WINDOW:g} s; run {run_id} may still be "
            f"going in the session (see `bai session logs {session_id}`)",
            file=sys.stderr,
        )
        return 1
    except asyncio.CancelledError:
        if signals.received is None:
            raise
        return signals.exit_code


async def _follow(
    c,
    session_id,
    mode,
    code,
    options,
    owned: Owned | None,
    loop,
    run_id,
    kernel=None,
    again: bool = False,
    seen: list[int] | None = None,
) -> int | None:
    """One execution stream: the run's exit code (1 after an error frame), or None when the stream ended
    before the run did. `again`: re-attaching (say so once the manager answers). `seen`: [the `seq` of the last
    frame printed], kept up to date (re-attaching asks for what came after it)."""
    from bai.client.api import APIError

    sent = False
    seen = seen if seen is not None else [0]
    try:
        async with c.execute(session_id, kernel) as stream:
            if owned is not None:
                owned.ran, owned.run_id = True, run_id  # from here on the code may be running
            await stream.start(mode, code, options, run_id=run_id, after=seen[0] if again else None)
            sent = True
            queued = None
            async for frame in stream.frames():
                if isinstance(frame.get("seq"), int):
                    seen[0] = max(seen[0], frame["seq"])
                if again:
                    again = False
                    if frame.get("status") != "error":
                        print(f"bai: re-attached to run {run_id}", file=sys.stderr)
                if frame.get("queue") and frame["queue"] != queued:
                    _say_queue(frame["queue"])
                queued = frame.get("queue")
                _print_console(frame.get("console") or [])
                status = frame.get("status")
                if status == "finished":
                    return int(frame.get("exitCode") or 0)
                if status == "waiting-input":
                    line = await loop.run_in_executor(None, sys.stdin.readline)
                    if line:
                        await stream.send_input(line.rstrip("\n"))
                    else:  # end of input: input() raises EOFError, as Python does
                        await stream.send_eof()
                elif status == "error":
                    print(f"bai: error: {frame.get('msg')}", file=sys.stderr)
                    return 1
    except APIError as e:
        if not sent or mode == "continue" or (e.status and 400 <= e.status < 500):
            raise
        return None  # (the stream could not be read to its end)
    except (ConnectionError, OSError):
        if not sent:
            raise
        return None
    return None


def _job(code: str | None, args: list[str], exec_cmd: str | None) -> tuple[str, str, dict[str, Any], list[Path]]:
    """What to run: (mode, code, options, files to upload) from -c, FILE... or -- CMD."""
    command_mode = "--" in sys.argv
    if code is not None and args:
        raise typer.BadParameter("give either -c CODE, FILE... or -- CMD, not several")
    if code is not None:
        return "query", code, {}, []
    if args and command_mode:
        return "batch", "", {"exec": shlex.join(args)}, []
    if args:
        files = [Path(a) for a in args]
        for f in files:
            if not f.is_file():
                raise typer.BadParameter(f"no such file: {f}")
        # without --exec the kernel chooses by the files' kind (Backend.AI's "*"; bai/node/agent/batch.py)
        return "batch", "", {"exec": exec_cmd or "*"}, files
    if exec_cmd is not None:
        return "batch", "", {"exec": exec_cmd}, []
    if not sys.stdin.isatty():
        return "query", sys.stdin.read(), {}, []
    raise typer.BadParameter("nothing to run: give -c CODE, FILE... or -- CMD")


@app.command(context_settings={"allow_interspersed_args": True})
def run(
    image: str = typer.Argument(
        ..., help="Image or alias (`python` is the default Python image).", autocompletion=_complete_images
    ),
    args: list[str] = typer.Argument(None, help="FILE... to upload and run, or -- CMD ... to run a command."),
    code: str = typer.Option(None, "-c", "--code", help="Python code to run (query mode)."),
    exec_cmd: str = typer.Option(None, "--exec", metavar="CMD", help="Command to run after uploading FILEs."),
    cpu: Cpu = None,
    mem: Mem = None,
    gpu: Gpu = None,
    gpu_share: GpuShare = None,
    preset: Preset = None,
    priority: Priority = None,
    time_limit: TimeLimit = None,
    preemptible: Preemptible = True,
    env: Env = None,
    name: Name = None,
    mount: Mount = None,
    network: Network = None,
    cluster_size: ClusterSize = 1,
    cluster_mode: ClusterMode = SINGLE_NODE,
    project: Project = None,
    domain: Domain = None,
    keep: bool = typer.Option(False, "--keep", help="Keep the session running afterwards."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress messages."),
) -> None:
    """Run code in a new session, stream its output, and exit with its exit code."""
    import asyncio
    import secrets

    resources = parse_resources(cpu, mem, gpu, gpu_share)
    environ = parse_env(env)
    mounts = parse_mounts(mount)
    check_name(name)
    mode, text, options, files = _job(code, args or [], exec_cmd)
    limit_seconds = parse_time_limit(time_limit)
    name = name or f"run-{secrets.token_hex(4)}"
    from bai.cli.common import client
    from bai.client.api import overlap_import

    asked = {
        "type": "interactive",
        "resources": resources,
        "environ": environ,
        "mounts": mounts,
        "network": network,
        "cluster_size": cluster_size,
        "cluster_mode": cluster_mode,
    }

    async def go() -> int:
        nonlocal resources
        owned = Owned(name)
        async with client() as c:
            asked["resources"] = resources = await with_preset(c, preset, resources)
            with Signals() as signals:
                failed: BaseException | None = None
                try:
                    starting = wait_running(
                        c, image, name, quiet, owned,
                        resources=resources, environ=environ, mounts=mounts, network=network,
                        cluster_size=cluster_size, cluster_mode=cluster_mode, group=project, domain=domain,
                        priority=priority, time_limit=limit_seconds, preemptible=preemptible,
                    )  # fmt: skip
                    # files go up through aiohttp: it imports while the session starts (the output stream needs none)
                    started = await (overlap_import(starting) if files else starting)
                    sid = started["sessionId"]
                    if not quiet:
                        await say_reused(c, owned, asked)
                    if files:
                        await c.upload(sid, [(f.name, f.read_bytes()) for f in files])
                    return await stream_execution(c, sid, mode, text, options, signals, owned)
                except asyncio.CancelledError:
                    if signals.received is None:
                        raise
                    return signals.exit_code
                except Exception as e:
                    failed = None if isinstance(e, typer.Exit) else e  # (Exit: it said why already)
                    raise
                finally:
                    why = None
                    if signals.received is not None:
                        why = signals.word
                    elif failed is not None:
                        why = "the run failed"
                    try:
                        await _release(c, owned, keep, quiet, why)
                    except asyncio.CancelledError:  # another signal: the user stops the clean-up too
                        if signals.received is None:
                            raise
                        await _say_stopped_clean_up(c, owned)

    raise typer.Exit(run_async(go()))


async def _release(c, owned: Owned, keep: bool, quiet: bool, why: str | None) -> None:
    """After `run`: end the session it created (cancel it if it had not started yet), unless --keep;
    never one it found already there. `why`: the signal or error that cut the run short, if any; then
    what happens to the session is said on stderr."""
    from bai.client.api import APIError

    if owned.sid is None:
        return  # no session was created (or none is known: the manager never answered)
    label = f"session {owned.name} ({owned.sid})"
    started = owned.status in ("RUNNING", "RUNNING_DEGRADED", "TERMINATING") or owned.ran
    when = "" if owned.ran else (" before its code ran" if started else " before it started")
    if not owned.created:
        if why is not None:
            print(f"bai: {label} was there before this run: left as it is ({why}{when})", file=sys.stderr)
        return
    if owned.status in ENDED:
        return  # it ended by itself (could not start)
    if keep:
        if owned.ran and why is not None:  # stop the code the user stopped waiting for
            with contextlib.suppress(APIError):
                await c.interrupt(owned.sid, owned.run_id)
        if why is not None:
            with contextlib.suppress(APIError):
                owned.status = (await c.get_session(owned.sid))["status"]
            print(f"bai: {label} kept ({why}{when}; --keep): it is {owned.status or 'starting'}", file=sys.stderr)
        elif not quiet:
            print(f"[{label} keeps running]", file=sys.stderr)
        return
    try:  # the manager finishes the clean-up; no need to wait for it
        try:
            await c.destroy_session(owned.sid, wait=False)
        except APIError as e:
            if "forced" not in str(e):
                raise
            await c.destroy_session(owned.sid, forced=True, wait=False)  # it is starting: stop that
    except APIError as e:
        if why is not None:  # (without one: the kernel may have ended by itself)
            print(f"bai: {label} could not be ended ({why}{when}): {e}", file=sys.stderr)
        return
    if why is not None:  # what became of it, as the manager says now (not what the destroy was meant to do)
        print(
            f"bai: {label} {_after_destroy(await _status_now(c, owned.sid), owned.name)} ({why}{when})", file=sys.stderr
        )


def _after_destroy(info: dict[str, Any] | None, name: str) -> str:
    """What `run` says became of the session it destroyed, from its status read after the destroy."""
    if info is None:
        return f"was told to end, but its status could not be read (see `bai session info {name}`)"
    status = info["status"]
    if status == "CANCELLED":
        return "cancelled"
    if status in ("TERMINATING", "TERMINATED"):
        return "destroyed"
    if status in ENDED:
        return f"ended ({status})"
    return f"is still {status} after the destroy: {_how_to_end(info, name)}"


async def _say_stopped_clean_up(c, owned: Owned) -> None:
    """Another signal stopped `run`'s clean-up: say what the session is now (one short read), and only when
    that is unknown that it may still exist."""
    import asyncio

    if owned.sid is None:
        return
    label = f"session {owned.name} ({owned.sid})"
    end = f"end it with `bai session destroy {owned.name}`"
    info = None
    with contextlib.suppress(asyncio.CancelledError):  # yet another signal: then it is unknown
        info = await _status_now(c, owned.sid, limit=2.0)
    if info is None:
        print(f"bai: {label}: clean-up stopped, it may still exist: see `bai session info {owned.name}`; {end}",
              file=sys.stderr)  # fmt: skip
    elif info["status"] in ENDED or info["status"] == "TERMINATING":
        print(f"bai: {label}: clean-up stopped; it is {info['status']}", file=sys.stderr)
    else:
        print(f"bai: {label}: clean-up stopped; it is {_where_it_is(info)}: {_how_to_end(info, owned.name)}",
              file=sys.stderr)  # fmt: skip


@app.command()
def create(
    image: str = typer.Argument(..., help="Image or alias.", autocompletion=_complete_images),
    name: Name = None,
    cpu: Cpu = None,
    mem: Mem = None,
    gpu: Gpu = None,
    gpu_share: GpuShare = None,
    preset: Preset = None,
    priority: Priority = None,
    time_limit: TimeLimit = None,
    preemptible: Preemptible = True,
    env: Env = None,
    mount: Mount = None,
    session_type: Annotated[str, typer.Option("--type", help="interactive, or batch (runs --startup-command).")] = (
        "interactive"
    ),
    startup_command: Annotated[
        str | None,
        typer.Option("--startup-command", metavar="CMD", help="What a batch session runs (a shell command)."),
    ] = None,
    starts_at: Annotated[
        str | None,
        typer.Option(
            "--starts-at", metavar="WHEN", help="Batch: start no earlier than this (ISO time, or 10s, 30min, 1h)."
        ),
    ] = None,
    depends: Annotated[
        list[str] | None,
        typer.Option("--depends", metavar="SESSION", help="Start only after this session succeeded (repeatable)."),
    ] = None,
    group: Annotated[str | None, typer.Option("--group", help="Scaling group [default].")] = None,
    project: Project = None,
    domain: Domain = None,
    network: Network = None,
    cluster_size: ClusterSize = 1,
    cluster_mode: ClusterMode = SINGLE_NODE,
    detach: Annotated[
        bool,
        typer.Option(
            "--detach",
            "--no-wait",
            help="Return as soon as the session is accepted (queued), without waiting until it runs.",
        ),
    ] = False,
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout",
            metavar="SECONDS",
            help="Stop waiting after SECONDS: the session stays (queued or starting); exit 124.",
        ),
    ] = None,
    wait_end: Annotated[
        bool, typer.Option("--wait", help="Batch: wait until it ends and exit with its exit code.")
    ] = False,
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Create a session and return once it runs (or at once with --detach).

    Stopping the wait (--timeout, Ctrl-C) leaves the session as it is: it says where it is and how to end it."""
    import asyncio
    import secrets

    resources = parse_resources(cpu, mem, gpu, gpu_share)
    environ = parse_env(env)
    check_name(name)
    if timeout is not None and not timeout > 0:
        raise typer.BadParameter("wants a number of seconds above 0", param_hint="--timeout")
    if detach and (timeout is not None or wait_end):
        raise typer.BadParameter("--detach returns at once: it takes neither --timeout nor --wait")
    if session_type not in ("interactive", "batch"):
        raise typer.BadParameter("--type wants interactive or batch")
    if session_type == "batch" and not startup_command:
        raise typer.BadParameter("a batch session needs --startup-command")
    if session_type != "batch" and (startup_command or starts_at or wait_end):
        raise typer.BadParameter("--startup-command, --starts-at and --wait are for --type batch")
    name = name or f"sess-{secrets.token_hex(4)}"
    options = {
        "resources": resources,
        "environ": environ,
        "type": session_type,
        "startup_command": startup_command,
        "starts_at": starts_at,
        "depends": depends or [],
        "scaling_group": group,
        "mounts": parse_mounts(mount),
        "network": network,
        "cluster_size": cluster_size,
        "cluster_mode": cluster_mode,
        "group": project,
        "domain": domain,
        "priority": priority,
        "time_limit": parse_time_limit(time_limit),
        "preemptible": preemptible,
    }
    from bai.cli.common import client

    async def go() -> dict[str, Any]:
        owned = Owned(name)
        async with client() as c:
            options["resources"] = await with_preset(c, preset, resources)
            if (detach or starts_at or depends) and not wait_end:
                result = await c.create_session(image, name=name, enqueue_only=True, **options)
                owned.note(result)
                await say_reused(c, owned, options)
                return result
            with Signals() as signals:
                limit = asyncio.timeout(timeout)
                try:
                    async with limit:
                        return await _create_and_wait(
                            c, image, owned, options, as_json, wait_end, bool(starts_at or depends)
                        )
                except TimeoutError:
                    if not limit.expired():
                        raise
                    await say_left_waiting(c, owned, f"stopped waiting after {timeout:g} s (--timeout)")
                    raise typer.Exit(EXIT_STILL_WAITING) from None
                except asyncio.CancelledError:
                    if signals.received is None:
                        raise
                    await say_left_waiting(c, owned, f"{signals.word} while waiting")
                    raise typer.Exit(signals.exit_code) from None

    result = run_async(go())
    if as_json:
        print(json.dumps(result))
    else:
        print(f"session {result['sessionName']} ({result['sessionId']}) is {result['status']}")
    if wait_end:
        raise typer.Exit(result["exitCode"] if result["exitCode"] is not None else 1)


async def _create_and_wait(
    c, image: str, owned: Owned, options: dict[str, Any], quiet: bool, wait_end: bool, queued: bool
) -> dict[str, Any]:
    """`create`'s wait: until the session runs (`queued`: only until it is accepted, as --starts-at and
    --depends ask), then with `wait_end` until it has ended."""
    import asyncio

    if queued:
        result = await c.create_session(image, name=owned.name, enqueue_only=True, **options)
        owned.note(result)
    else:
        result = await wait_running(c, image, owned.name, quiet, owned, **options)
    await say_reused(c, owned, options)
    if wait_end:
        # polling the manager until the batch session has ended
        while (info := await c.get_session(result["sessionId"]))["status"] not in ENDED:  # noqa: ASYNC110
            await asyncio.sleep(0.3)
        result = {**result, "status": info["status"], "exitCode": info["exitCode"]}
    return result


@app.command()
def exec(  # noqa: A001 - the command is called exec
    ref: str = typer.Argument(..., help="Session name or id.", autocompletion=_complete_sessions),
    args: list[str] = typer.Argument(None, help="FILE... to upload and run, or -- CMD ... to run a command."),
    code: str = typer.Option(None, "-c", "--code", help="Python code to run (query mode)."),
    owner: str = typer.Option(None, "--owner", metavar="AK", help=OWNER_HELP),
    exec_cmd: str = typer.Option(None, "--exec", metavar="CMD", help="Command to run after uploading FILEs."),
    kernel: Kernel = None,
) -> None:
    """Run code in a running session and stream its output; exits with the code's exit status."""
    mode, text, options, files = _job(code, args or [], exec_cmd)
    if files and kernel:
        raise typer.BadParameter(
            "FILEs are uploaded to the main kernel only: with --kernel, run -c CODE or -- CMD", param_hint="--kernel"
        )
    from bai.cli.common import client
    from bai.client.api import overlap_import

    async def go() -> int:
        async with client(owner) as c:
            asking = c.get_session(ref)
            session = await (overlap_import(asking) if files else asking)  # (aiohttp: for the files only)
            if session["status"] != "RUNNING":
                fail(f"session {ref} is {session['status']}, not RUNNING")
            check_kernel(session, kernel)
            if files:
                await c.upload(session["id"], [(f.name, f.read_bytes()) for f in files])
            return await stream_execution(c, session["id"], mode, text, options, kernel=kernel)

    raise typer.Exit(run_async(go()))


def check_kernel(session: dict[str, Any], ref: str | None) -> None:
    """Stop (listing the session's kernels) when `ref` names none of them: a name (main1, sub1 …), a kernel
    id or a unique prefix of at least 4 characters, as the manager reads it. A manager that lists no kernel
    names is left to answer itself."""
    kernels = session.get("kernels") or []
    if not ref or not all(k.get("name") for k in kernels):
        return
    found = [k for k in kernels if ref in (k["name"], k["id"])]
    if not found and len(ref) >= 4:
        found = [k for k in kernels if k["id"].startswith(ref)]
    if len(found) != 1:
        fail(f"session {session['name']} has no kernel {ref!r}; its kernels: {', '.join(k['name'] for k in kernels)}")


def _shell_words(words: list[str], kernel: str | None) -> tuple[list[str], str | None]:
    """`shell`'s words after the session (options stop at it, so that a command's own options are its):
    a `--kernel K` (or `--kernel=K`) before the command or `--` is still this command's; the command."""
    while words[:1] and (words[0] == "--kernel" or words[0].startswith("--kernel=")):
        if "=" in words[0]:
            kernel, words = words[0].split("=", 1)[1], words[1:]
        elif len(words) < 2:
            raise typer.BadParameter("wants a kernel: main1, sub1 … or a kernel id", param_hint="--kernel")
        else:
            kernel, words = words[1], words[2:]
    if words[:1] == ["--"]:
        words = words[1:]
    return words, kernel


@app.command(context_settings={"allow_interspersed_args": False})
def shell(
    ref: str = typer.Argument(..., help="Session name or id.", autocompletion=_complete_sessions),
    command: list[str] = typer.Argument(None, help="-- CMD ...: run this instead of the kernel's shell."),
    owner: str = typer.Option(None, "--owner", metavar="AK", help=OWNER_HELP),
    kernel: Kernel = None,
) -> None:
    """A terminal in a running session (bash if the image has it, else sh); exits with its status."""
    from bai.cli.common import client
    from bai.cli.terminal import attach_terminal
    from bai.client.api import overlap_import

    words, picked = _shell_words(list(command or []), kernel)

    async def go() -> int:
        async with client(owner) as c:
            session = await overlap_import(c.get_session(ref))
            if session["status"] not in ("RUNNING", "RUNNING_DEGRADED"):
                fail(f"session {ref} is {session['status']}: a terminal needs a running session")
            check_kernel(session, picked)
            return await attach_terminal(c, session["id"], words or None, kernel=picked)

    raise typer.Exit(run_async(go()))


@app.command("app")
def app_(
    ref: str = typer.Argument(..., help="Session name or id.", autocompletion=_complete_sessions),
    name: str = typer.Argument(..., help="The app (see `bai session apps NAME`), e.g. jupyterlab."),
    bind: str = typer.Option(
        None, "--bind", "-b", metavar="[HOST:]PORT", help="Where to listen (default 127.0.0.1, the app's port if free)."
    ),
    owner: str = typer.Option(None, "--owner", metavar="AK", help=OWNER_HELP),
) -> None:
    """Open an app of a running session (Jupyter, a web server...) on a local port, through the manager.

    Example: bai session app my-notebook jupyterlab --bind 127.0.0.1:8090"""
    from bai.cli.apps import serve_app
    from bai.cli.common import client
    from bai.client.api import overlap_import

    async def go() -> int:
        async with client(owner) as c:
            session = await overlap_import(c.get_session(ref))
            if session["status"] not in ("RUNNING", "RUNNING_DEGRADED"):
                fail(f"session {ref} is {session['status']}: its apps need a running session")
            return await serve_app(c, session, name, bind)

    try:
        code = run_async(go())
    except KeyboardInterrupt:
        code = 0
    raise typer.Exit(code)


@app.command("apps")
def apps_(
    ref: str = typer.Argument(..., help="Session name or id.", autocompletion=_complete_sessions),
    owner: str = typer.Option(None, "--owner", metavar="AK", help=OWNER_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List the apps a session offers (from its image's ai.backend.service-ports label)."""
    from bai.cli.output import apps_table

    session = call(lambda c: c.get_session(ref), owner)
    items = call(lambda c: c.apps(session["id"]), owner)
    if not items and not as_json:
        print(f"session {session['name']} offers no apps (its image declares none)")
        return
    show(items, as_json, lambda rows: apps_table(rows, session["name"]))


STATUSES = (
    "PENDING",
    "SCHEDULED",
    "PULLING",
    "PREPARING",
    "RUNNING",
    "RESTARTING",
    "RUNNING_DEGRADED",
    "TERMINATING",
    "TERMINATED",
    "ERROR",
    "CANCELLED",
    "PREEMPTED",
)  # fmt: skip  (bai.common.status.SessionStatus, without importing it)


def parse_statuses(text: str) -> list[str]:
    """`running,Pending` → ["RUNNING", "PENDING"]; an unknown one is a usage error that lists the valid ones."""
    wanted = [part.strip().upper() for part in text.split(",") if part.strip()]
    unknown = [w for w in wanted if w not in STATUSES]
    if unknown or not wanted:
        what = f"unknown status {', '.join(unknown)}" if unknown else "no status given"
        raise typer.BadParameter(f"{what}; valid: {', '.join(s.lower() for s in STATUSES)}", param_hint="--status")
    return wanted


def failed(s: dict[str, Any]) -> bool:
    """A session that ended badly: status ERROR, a non-zero exit code, or a FAILURE result."""
    code = s.get("exitCode")
    return s["status"] == "ERROR" or (code is not None and code != 0) or s.get("result") == "FAILURE"


@app.command("ls")
def ls(
    all_: bool = typer.Option(False, "--all", "-a", help="Include terminated and cancelled sessions."),
    status: str = typer.Option(
        None,
        "--status",
        metavar="S[,S...]",
        help="Only these statuses, e.g. running,pending (any case).",
        autocompletion=_complete_statuses,
    ),
    failed_only: bool = typer.Option(
        False, "--failed", help="Only sessions that ended with an error or a non-zero exit (ended ones included)."
    ),
    owner: str = typer.Option(None, "--owner", metavar="AK", help=OWNER_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    output: str = typer.Option(None, "--output", "-o", metavar="wide|json", help=OUTPUT_HELP),
) -> None:
    """List sessions (active ones unless --all, --status or --failed say otherwise): name, status and why
    first; -o wide adds the id, agent, and the time each queued and ran."""
    from bai.cli.layout import wants
    from bai.cli.output import sessions_table

    wide, as_json = wants(output, as_json)
    wanted = parse_statuses(status) if status is not None else None
    everything = all_ or failed_only
    asked = None if everything or wanted is None else ",".join(wanted)
    items = call_now(lambda c: c.list_sessions(all=everything, status=asked), owner)
    if wanted is not None:
        items = [s for s in items if s["status"] in wanted]
    if failed_only:
        items = [s for s in items if failed(s)]
    if not items and not as_json:
        hint = "" if everything or wanted else " (use --all to include ended ones)"
        print("no sessions" + (" that failed" if failed_only else "") + hint)
        return
    show(items, as_json, lambda rows: sessions_table(rows, wide))


@app.command()
def info(
    ref: str = typer.Argument(..., help="Session name or id.", autocompletion=_complete_sessions),
    owner: str = typer.Option(None, "--owner", metavar="AK", help=OWNER_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show a session: status and why, resources, kernels and its history."""
    from bai.cli.output import details_text, session_details

    show(call_now(lambda c: c.get_session(ref), owner), as_json, lambda s: details_text(session_details(s)))


@app.command()
def explain(
    ref: str = typer.Argument(..., help="Session name or id.", autocompletion=_complete_sessions),
    owner: str = typer.Option(None, "--owner", metavar="AK", help=OWNER_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Why a session waited: every scheduling decision about it, and its state changes."""
    from bai.common.present import explain_lines

    show(call_now(lambda c: c.history(ref), owner), as_json, lambda h: "\n".join(explain_lines(h)))


@app.command()
def events(
    ref: str = typer.Argument(
        None, help="Session name or id (default: every session you can see).", autocompletion=_complete_sessions
    ),
    owner: str = typer.Option(None, "--owner", metavar="AK", help=OWNER_HELP),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep listening after the session ended."),
) -> None:
    """Print a session's lifecycle events as they happen, until it ends (or all sessions' with no name)."""
    from datetime import datetime

    from bai.cli.common import client

    async def go() -> None:
        async with client(owner) as c:
            async for name, data in c.events(ref, until_end=not follow):
                extra = f" ({data['reason']})" if data.get("reason") else ""
                if data.get("exitCode") is not None:
                    extra += f" exit code {data['exitCode']}"
                print(f"{datetime.now().strftime('%H:%M:%S')}  {data['sessionName']}  {name}{extra}", flush=True)

    run_async(go())


@app.command()
def logs(
    ref: str = typer.Argument(..., help="Session name or id.", autocompletion=_complete_sessions),
    owner: str = typer.Option(None, "--owner", metavar="AK", help=OWNER_HELP),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new output until the session ends."),
    tail: int = typer.Option(None, "--tail", "-n", help="Only the last N lines."),
    since: str = typer.Option(
        None, "--since", metavar="WHEN", help="Only output from then on: 30s, 10m, 1h (ago) or an ISO 8601 time."
    ),
    kernel: Kernel = None,
) -> None:
    """Print a session's kernel output (also after it has ended, until [manager] log_retention).

    At most [manager] log_max_bytes are kept; when older output was dropped, a first line says how much.
    --since goes by when the manager stored each piece of output, --tail by lines."""
    from bai.cli.common import client

    if tail is not None and tail < 0:
        raise typer.BadParameter(f"wants a number of lines >= 0, got {tail}", param_hint="--tail")
    if since is not None:
        from bai.common.durations import parse_since

        try:
            parse_since(since)  # the manager reads it again (a duration: before its own clock)
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--since") from None

    async def go() -> None:
        async with client(owner) as c:
            if not follow:
                page = await c.log_page(ref, tail=tail, since_time=since, kernel=kernel)
                (sys.stderr if page.get("purged") else sys.stdout).write(page["logs"])
                return
            async for text in c.follow_logs(ref, tail=tail, since_time=since, kernel=kernel):
                sys.stdout.write(text)
                sys.stdout.flush()

    run_async(go())


@app.command("files")
def ls_files(
    ref: str = typer.Argument(..., help="Session name or id.", autocompletion=_complete_sessions),
    path: str = typer.Argument("/home/work", help="A folder in the kernel (relative paths are under /home/work)."),
    owner: str = typer.Option(None, "--owner", metavar="AK", help=OWNER_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List the files in a running session's kernel."""
    from bai.cli.common import call, fail, show

    result = call(lambda c: c.list_files(ref, path), owner)
    if result.get("errors"):
        fail(result["errors"])
    items = json.loads(result["files"])

    def render(items: list[dict[str, Any]]):
        from datetime import UTC, datetime

        from rich.table import Table

        from bai.common.present import size

        table = Table(box=None, header_style="bold", title=result["abspath"], title_justify="left")
        for col in ("MODE", "SIZE", "MODIFIED", "NAME"):
            table.add_column(col, no_wrap=True)
        for f in items:
            when = datetime.fromtimestamp(f["mtime"], UTC).strftime("%Y-%m-%d %H:%M")
            table.add_row(f["mode"], size(f["size"]), when, f["filename"])
        return table

    show(items, as_json, render)


@app.command()
def destroy(
    refs: list[str] = typer.Argument(..., help="Session names or ids.", autocompletion=_complete_sessions),
    owner: str = typer.Option(None, "--owner", metavar="AK", help=OWNER_HELP),
    force: bool = typer.Option(False, "--force", "-f", help="Also destroy sessions that are starting or stuck."),
) -> None:
    """Destroy sessions (a pending one is cancelled)."""
    raise typer.Exit(_each(refs, owner, "destroyed", lambda c, ref: c.destroy_session(ref, forced=force)))


def _each(refs: list[str], owner: str | None, done: str, action) -> int:
    """`action(client, ref)` for each session; each failure is reported and the rest go on. Exit status 1
    if any failed."""
    from bai.cli.common import client

    async def go() -> int:
        failed = 0
        async with client(owner) as c:
            for ref in refs:
                try:
                    await action(c, ref)
                    print(f"{done} {ref}")
                except Exception as e:  # report each, go on with the rest
                    print(f"bai: error: {ref}: {e}", file=sys.stderr)
                    failed += 1
        return 1 if failed else 0

    return run_async(go())


@app.command()
def download(
    ref: str = typer.Argument(..., help="Session name or id.", autocompletion=_complete_sessions),
    paths: list[str] = typer.Argument(..., help="Files or folders in the kernel (relative ones are under /home/work)."),
    dest: Path = typer.Option(Path("."), "--dest", "-d", help="Where to put them."),
    owner: str = typer.Option(None, "--owner", metavar="AK", help=OWNER_HELP),
) -> None:
    """Copy files (or folders) out of a running session's kernel, as `backend.ai session download` does."""
    import io
    import tarfile

    archives = call(lambda c: c.download(ref, list(paths)), owner)
    dest.mkdir(parents=True, exist_ok=True)
    for archive in archives:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(dest, filter="data")  # nothing lands outside dest, no devices or set-uid bits
            for name in tar.getnames():
                print(dest / name)


@app.command()
def restart(
    refs: list[str] = typer.Argument(..., help="Session names or ids.", autocompletion=_complete_sessions),
    owner: str = typer.Option(None, "--owner", metavar="AK", help=OWNER_HELP),
) -> None:
    """Restart sessions' kernels: the code starts afresh (a new Python namespace), runs going on end; the
    session, its files and its apps' ports stay."""
    raise typer.Exit(_each(refs, owner, "restarted", lambda c, ref: c.restart_session(ref)))


@app.command()
def rename(
    ref: str = typer.Argument(..., help="Session name or id.", autocompletion=_complete_sessions),
    name: str = typer.Argument(..., help="Its new name."),
    owner: str = typer.Option(None, "--owner", metavar="AK", help=OWNER_HELP),
) -> None:
    """Give a live session another name."""
    check_name(name)
    call(lambda c: c.rename_session(ref, name), owner)
    print(f"renamed {ref} to {name}")


@app.command("set-priority")
def set_priority(
    ref: str = typer.Argument(..., help="Session name or id.", autocompletion=_complete_sessions),
    priority: int = typer.Argument(..., min=0, max=100, help="0-100 (default 10): the higher goes first."),
    owner: str = typer.Option(None, "--owner", metavar="AK", help=OWNER_HELP),
) -> None:
    """Change a live session's scheduling priority (lowered to your policy's max_priority; admins: up to 100).
    Under the multifactor policy a waiting session with a higher priority goes first."""
    row = call(lambda c: c.set_priority(ref, priority), owner)
    said = "" if row["priority"] == priority else f" (your policy allows at most {row['priority']})"
    print(f"session {row['name']} now has priority {row['priority']}{said}")


@app.command()
def commit(
    ref: str = typer.Argument(..., help="Session name or id.", autocompletion=_complete_sessions),
    image: str = typer.Option(None, "--image", help="The image's name:tag (default: bai-commit/SESSION:TIME)."),
    owner: str = typer.Option(None, "--owner", metavar="AK", help=OWNER_HELP),
) -> None:
    """Save a running session's kernel as an image on its agent (Docker): `bai image ls` lists it and new
    sessions can use it. What the kernel wrote in its scratch (/home/work, /tmp) and virtual folders is not
    part of the image."""
    made = call(lambda c: c.commit_session(ref, image), owner)
    print(f"{made['name']} (on agent {made['agent']})")


TOP_STATUSES = "RUNNING,RUNNING_DEGRADED,RESTARTING"


@app.command()
def top(
    once: bool = typer.Option(False, "--once", help="Print one table and exit (also when stdout is not a terminal)."),
    sort: str = typer.Option("cpu", "--sort", metavar="cpu|mem|name", help="Order: most CPU, most memory, or name."),
    interval: float = typer.Option(2.0, "--interval", metavar="SECONDS", help="Seconds between refreshes."),
    owner: str = typer.Option(None, "--owner", metavar="AK", help="Admins: that keypair's sessions only."),
    as_json: bool = typer.Option(False, "--json", help="Print the sessions shown, as JSON, once."),
    output: str = typer.Option(None, "--output", "-o", metavar="wide|json", help=OUTPUT_HELP),
) -> None:
    """Your running sessions and what each uses now, busiest first, refreshed every 2 seconds (q or Ctrl-C
    leaves). CPU % is of one core (200 = two busy cores); MEM is used / allocated; NET and IO count bytes
    since the kernel started; "–" until a first sample arrived. With NO_COLOR each refresh prints a new
    table below the last (no escapes to redraw in place)."""
    from bai.cli.layout import wants
    from bai.cli.output import TOP_SORTS, top_sorted, top_table

    wide, as_json = wants(output, as_json)
    by = sort.lower()
    if by not in TOP_SORTS:
        raise typer.BadParameter(f"wants one of {', '.join(TOP_SORTS)}, got {sort!r}", param_hint="--sort")
    if not interval > 0:
        raise typer.BadParameter("wants a number of seconds > 0", param_hint="--interval")

    if as_json:
        show(top_sorted(call_now(lambda c: c.list_sessions(status=TOP_STATUSES), owner), by), True, list)
        return

    def frame():
        items = call_now(lambda c: c.list_sessions(status=TOP_STATUSES), owner)
        if not items:
            return "no running sessions"
        return top_table(items, by, wide)

    from bai.cli.output import console, emit

    if once or not sys.stdout.isatty():
        emit(frame())
        return
    try:
        if no_color():  # redrawing in place takes escapes: one frame after another instead, as `top -b`
            with _keys() as pressed:
                emit(frame())
                while not pressed(interval):
                    print()
                    emit(frame())
            return
        from rich.live import Live

        with _keys() as pressed, Live(frame(), console=console(), auto_refresh=False, screen=False) as live:
            while not pressed(interval):
                live.update(frame(), refresh=True)
    except KeyboardInterrupt:
        pass


@contextlib.contextmanager
def _keys():
    """Yields `pressed(timeout)`: whether q was typed within `timeout` seconds (the terminal in cbreak mode
    meanwhile, so a key counts without Enter; Ctrl-C still interrupts)."""
    import os
    import select
    import termios
    import time
    import tty

    fd = sys.stdin.fileno() if sys.stdin.isatty() else None
    saved = termios.tcgetattr(fd) if fd is not None else None

    def pressed(timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if fd is None:
                time.sleep(left)
                return False
            ready, _, _ = select.select([fd], [], [], left)
            if ready and os.read(fd, 32).lower().startswith(b"q"):
                return True
        return False

    if fd is not None:
        tty.setcbreak(fd)
    try:
        yield pressed
    finally:
        if fd is not None and saved is not None:
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)


# `bai session template …` (bai/cli/templates.py)
from bai.cli.templates import app as _template_app  # noqa: E402

app.add_typer(_template_app, name="template")
