"""Validation of a session-create request body (reference spec §2.2): pure, no I/O."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, Literal, overload

from bai.common import slots as slotlib
from bai.common.cluster import MAX_CLUSTER_SIZE, MODES, SINGLE_NODE
from bai.common.durations import parse_duration
from bai.common.gpus import DEVICE
from bai.common.images import registry_of
from bai.common.mounts import MountError, MountRequest, plan_mounts
from bai.common.names import name_problem
from bai.common.problems import invalid
from bai.node.manager.rules.admission import NETWORK_NAME
from bai.node.manager.state.team_records import DEFAULT_DOMAIN, DEFAULT_PROJECT_ID
from bai.node.scheduler.snapshot import PRIORITY_DEFAULT, PRIORITY_MAX, PRIORITY_MIN

SESSION_TYPES = ("interactive", "batch")


@dataclass
class CreateRequest:
    """A validated session-creation request."""

    name: str
    image: str
    type: str
    resources: dict[str, Decimal]
    environ: dict[str, str]
    scaling_group: str
    cluster_size: int
    enqueue_only: bool
    max_wait: float
    reuse: bool
    startup_command: str | None
    tag: str | None
    network: str | None
    starts_at: datetime | None = None
    depends: list[str] = field(default_factory=list)  # session names or ids, resolved by the registry
    mounts: list[MountRequest] = field(default_factory=list)  # folders, resolved by the registry
    config: dict[str, Any] = field(default_factory=dict)
    cluster_mode: str = SINGLE_NODE  # single-node | multi-node (bai/common/cluster.py)
    domain: str | None = None  # the domain and project (a name, or an id) asked for; None: the owner's default
    group: str | None = None
    domain_name: str = DEFAULT_DOMAIN  # the project it is created in, once the rules found it (lifecycle.create)
    project_id: str = DEFAULT_PROJECT_ID
    priority: int = PRIORITY_DEFAULT  # (lowered to the owner's policy's max_priority by lifecycle.create)
    time_limit: float | None = None  # seconds it may run once started (bai's `timeLimit`); None: none of its own
    preemptible: bool = True  # whether preemption may stop it (Backend.AI's is_preemptible)


def _first(body: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        if body.get(key) is not None:
            return body[key]
    return default


def _text(value: Any, what: str, *, nul: bool = False) -> str | None:
    """An optional string field: None, or a string (without NUL bytes unless `nul`); else a 400."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise invalid(f"{what} must be a string")
    if not nul and "\0" in value:
        raise invalid(f"{what} contains a NUL byte")
    return value


def _name_text(value: Any, what: str) -> str | None:
    """A domain's or project's name (or id) as a create names it: None, or a string of 1 to 256 characters."""
    text = _text(value, what)
    if text is not None and not 0 < len(text.strip()) <= 256:
        raise invalid(f"{what} must be a name of 1 to 256 characters")
    return text.strip() if text is not None else None


def generate_name() -> str:
    return "sess-" + secrets.token_hex(5)


def parse_starts_at(value: Any, now: datetime) -> datetime | None:
    """ISO-8601 (naive = UTC) or relative to now (`10s`, `30min`, `1d2h`), as Backend.AI accepts."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise invalid("starts_at must be a string")
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        try:
            return now + timedelta(seconds=parse_duration(value))
        except OverflowError:
            raise invalid(f"starts_at {value[:40]!r} is too far in the future") from None
        except ValueError:
            raise invalid(
                f"cannot read starts_at {value!r}: use ISO-8601 or a delay such as 10s, 30min, 1d2h"
            ) from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def resolve_image(ref: str, aliases: dict[str, str]) -> str:
    """A Backend.AI-style image reference → a local image, through the configured aliases.

    `python`, `python:3.9-ubuntu20.04` and `cr.backend.ai/stable/python:3.9-ubuntu20.04` are tried in
    turn without their registry (`cr.backend.ai/stable/`: a first component with a dot, a colon or
    `localhost`, then the namespace), then without their tag; the first alias found wins. A reference
    no alias covers is used as it is (a local image name such as `bai-busybox:latest`)."""
    if ref in aliases:
        return aliases[ref]
    parts = ref.split("/")
    if registry_of(ref):
        parts = parts[1:]  # the registry
    candidates = ["/".join(parts[i:]) for i in range(len(parts))]  # with and without the namespace
    for name in candidates:
        if name in aliases:
            return aliases[name]
    for name in candidates:
        repo = name.rsplit(":", 1)[0] if ":" in name.rsplit("/", 1)[-1] else name
        if repo in aliases:
            return aliases[repo]
    return ref


# The largest amount of a slot a request may name: what a 64-bit integer of the slot's smallest unit holds
# (8 EiB of memory, 9.2e15 cores). Finite, exact, and far beyond any agent.
MAX_UNITS = 2**63 - 1


def smallest_unit(slot: str) -> Decimal:
    """The smallest amount of a slot a kernel can be given: a byte, a whole GPU for cuda.device, else
    a thousandth (slots.parse_count keeps three decimal places: milli-cores)."""
    if slotlib.is_bytes_slot(slot):
        return Decimal(1)
    if slot == DEVICE:
        return Decimal(1)
    return Decimal("0.001")


def parse_amount(slot: str, value: Any) -> Decimal:
    """One requested amount (config.resources.SLOT): finite, not negative, at least the slot's smallest
    unit unless 0 (0 means "the default"), at most MAX_UNITS of it; else a 400 naming the field."""
    where = f"config.resources.{slot}"
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise invalid(f"{where} must be a number or a string such as 2, 0.5 or 512m, not {value!r:.40}")
    try:
        amount = slotlib.parse_amount(slot, value)
    except (slotlib.SlotError, ValueError, ArithmeticError) as e:
        raise invalid(f"{where}: {e}") from None
    unit = smallest_unit(slot)
    shown = f"{value!r:.40}"
    if not amount.is_finite():
        raise invalid(f"{where}: {shown} is not a finite amount")
    if amount < 0:
        raise invalid(f"{where}: an amount cannot be negative: {shown}")
    if amount > unit * MAX_UNITS:
        raise invalid(f"{where}: {shown} is too large (at most {slotlib.format_amount(slot, unit * MAX_UNITS)})")
    if amount == 0:  # rounded down to nothing?
        try:
            given = Decimal(str(value).strip())
        except (ArithmeticError, ValueError):
            given = Decimal(0)
        if given.is_finite() and given > 0:
            raise invalid(f"{where}: {shown} is below the smallest unit, {unit:f}")
    elif amount % unit:
        what = "a whole number of devices" if slot == DEVICE else f"a multiple of {unit:f}"
        raise invalid(f"{where}: {shown} is not {what}")
    return amount


def parse_resources(raw: dict[str, Any], known_slots: set[str]) -> dict[str, Decimal]:
    """config.resources → {slot: amount}; an unknown slot or an amount no kernel could be given is a 400."""
    out: dict[str, Decimal] = {}
    for slot, value in raw.items():
        if slot not in known_slots:
            raise invalid(f"unknown resource slot {slot!r} (known: {', '.join(sorted(known_slots))})")
        if value is None or value == "":
            continue
        out[slot] = parse_amount(slot, value)
    return out


def parse_cluster_size(value: Any) -> int:
    """clusterSize: the number of kernels, a whole number 1..MAX_CLUSTER_SIZE (1 when absent); else a 400."""
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"clusterSize must be a whole number of kernels from 1 to {MAX_CLUSTER_SIZE}, not {value!r:.40}")
    if not 1 <= value <= MAX_CLUSTER_SIZE:
        raise invalid(f"clusterSize must be between 1 and {MAX_CLUSTER_SIZE} kernels, not {value}")
    return value


def parse_cluster_mode(value: Any) -> str:
    """clusterMode: single-node or multi-node (single-node when absent). Backend.AI's enum names
    (SINGLE_NODE, MULTI_NODE) and any case are accepted; else a 400."""
    if value is None or value == "":
        return SINGLE_NODE
    if isinstance(value, str):
        mode = value.strip().lower().replace("_", "-")
        if mode in MODES:
            return mode
    raise invalid(f"clusterMode must be single-node or multi-node, not {value!r:.40}")


MAX_TIME_LIMIT = 10 * 365 * 86400.0  # seconds: ten years is "no limit" by another name


def parse_priority(value: Any) -> int:
    """A session's priority: a whole number from PRIORITY_MIN to PRIORITY_MAX (Backend.AI's 0-100); absent: the
    default (10)."""
    if value is None:
        return PRIORITY_DEFAULT
    if isinstance(value, bool) or not isinstance(value, int) or not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise invalid(f"priority must be a whole number from {PRIORITY_MIN} to {PRIORITY_MAX}")
    return value


def parse_preemptible(value: Any) -> bool:
    """Whether preemption may stop the session (`preemptible` / Backend.AI's `isPreemptible`): true or false; absent:
    true (Backend.AI's default)."""
    if value is None:
        return True
    if not isinstance(value, bool):
        raise invalid("preemptible must be true or false")
    return value


def parse_time_limit(value: Any) -> float | None:
    """How long a session may run once started, in seconds (above 0); absent: none of its own."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= MAX_TIME_LIMIT:
        raise invalid("timeLimit must be a number of seconds above 0 (at most ten years)")
    return float(value)


def parse_create(
    body: Any,
    known_slots: set[str],
    defaults: dict[str, str],
    aliases: dict[str, str],
    now: datetime,
) -> CreateRequest:
    """The create request in `body`; `now` (the manager's clock): what a relative `starts_at` counts from."""
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    config = body.get("config") or {}
    if not isinstance(config, dict):
        raise invalid("config must be an object")
    name = _first(body, "name", "session_name", "clientSessionToken") or generate_name()
    if not isinstance(name, str):
        raise invalid("the session name must be a string")
    if problem := name_problem(name):
        raise invalid(problem)
    image = _first(body, "image", "lang")
    if not isinstance(image, str) or not image.strip():
        raise invalid("image is required")
    image = resolve_image(image.strip(), aliases)
    stype = str(_first(body, "type", "sessionType", default="interactive")).lower()
    if stype not in SESSION_TYPES:
        raise invalid(f"unknown session type {stype!r} (use interactive or batch)")
    startup = _text(_first(body, "startupCommand", "startup_command"), "startupCommand")
    if stype == "batch" and not startup:
        raise invalid("a batch session needs a startup command")
    starts_at = parse_starts_at(_first(body, "starts_at", "startsAt"), now)
    if starts_at is not None and stype != "batch":
        raise invalid("starts_at is only for batch sessions")
    depends = body.get("dependencies") or []
    if not isinstance(depends, list) or not all(isinstance(d, str) and d for d in depends):
        raise invalid("dependencies must be a list of session names or ids")
    cluster_size = parse_cluster_size(_first(body, "clusterSize", "cluster_size"))
    cluster_mode = parse_cluster_mode(_first(body, "clusterMode", "cluster_mode"))
    raw_resources = config.get("resources") or {}
    if not isinstance(raw_resources, dict):
        raise invalid("config.resources must be an object")
    if "shmem" in raw_resources:
        raise invalid("shmem belongs in config.resource_opts, not in config.resources")
    resources = parse_resources(raw_resources, known_slots)
    try:
        for slot, value in defaults.items():
            if not resources.get(slot):
                resources[slot] = slotlib.parse_amount(slot, value)
    except slotlib.SlotError as e:
        raise invalid(str(e)) from None
    environ = config.get("environ") or {}
    if not isinstance(environ, dict) or not all(
        isinstance(k, str) and k and "=" not in k and "\0" not in k for k in environ
    ):
        raise invalid("config.environ must be an object of NAME = value (names without '=' or NUL)")
    for key, value in environ.items():
        if isinstance(value, dict | list) or value is None:
            raise invalid(f"config.environ.{key} must be a string, a number or true/false")
        if "\0" in str(value):
            raise invalid(f"config.environ.{key} contains a NUL byte")
    scaling_group = _text(_first(config, "scalingGroup", "scaling_group"), "config.scalingGroup") or "default"
    domain = _name_text(_first(body, "domain", "domainName", "domain_name"), "domain")
    group = _name_text(_first(body, "group", "groupName", "group_name"), "group")
    tag = _text(body.get("tag"), "tag")
    max_wait = _first(body, "maxWaitSeconds", "max_wait_seconds", default=0)
    if isinstance(max_wait, bool) or not isinstance(max_wait, int | float) or not 0 <= max_wait < float("inf"):
        raise invalid("maxWaitSeconds must be a non-negative number")
    try:
        mounts = plan_mounts(
            _first(config, "mounts"),
            _first(config, "mount_map", "mountMap"),
            _first(config, "mount_options", "mountOptions"),
        )
    except MountError as e:
        raise invalid(str(e)) from None
    network = config.get("network")
    if network is not None and (not isinstance(network, str) or not NETWORK_NAME.match(network)):
        # whether the caller may have it is the scaling group's to say (admission.check_network)
        raise invalid("config.network must be a Docker network name (none, bridge, host or a user-defined one)")
    if network == "host" and cluster_size > 1:
        raise invalid(
            "a session of several kernels cannot use the host network: its kernels reach each other by name "
            "on a network of the session (use another network, or one kernel)"
        )
    return CreateRequest(
        priority=parse_priority(body.get("priority")),
        time_limit=parse_time_limit(_first(body, "timeLimit", "time_limit")),
        preemptible=parse_preemptible(_first(body, "preemptible", "isPreemptible", "is_preemptible")),
        name=name,
        image=image.strip(),
        type=stype,
        resources=resources,
        environ={k: str(v) for k, v in environ.items()},
        scaling_group=scaling_group,
        cluster_size=cluster_size,
        enqueue_only=bool(_first(body, "enqueueOnly", "enqueue_only", default=False)),
        max_wait=float(max_wait),
        reuse=bool(_first(body, "reuseIfExists", "reuse_if_exists", default=True)),
        startup_command=startup,
        tag=tag,
        network=network,
        starts_at=starts_at,
        domain=domain,
        group=group,
        depends=list(dict.fromkeys(depends)),
        mounts=mounts,
        config={
            "startup_command": startup,
            "network": network,
            "starts_at": starts_at.isoformat() if starts_at else None,
            "cluster_mode": cluster_mode,
        },
        cluster_mode=cluster_mode,
    )


EXECUTE_MODES = ("query", "batch", "continue", "input", "input-eof")  # input-eof: a bai extension


def parse_execute(body: Any, default_mode: str | None = None) -> tuple[str, str, dict[str, Any]]:
    """An execute request (reference spec §2.3, §2.4) → (mode, code, options), or a 400 problem.

    A batch command (options.exec, else code) cannot carry a NUL byte to `sh -c`; query code can (Python
    itself reports it, as an error of the run)."""
    if not isinstance(body, dict):
        raise invalid("the execute request must be a JSON object")
    mode = body.get("mode", default_mode)
    if mode is None:
        raise invalid("mode is required (query, batch, continue or input)")
    if not isinstance(mode, str) or mode not in EXECUTE_MODES:
        raise invalid("mode must be query, batch, continue or input")
    code = body.get("code")
    if code is None:
        code = ""
    if not isinstance(code, str):
        raise invalid("code must be a string")
    options = body.get("options")
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise invalid("options must be an object")
    for step in ("clean", "build", "exec"):  # batch steps: a command, "*" (the kernel's choice) or null / ""
        command = options.get(step)
        if command is not None and not isinstance(command, str):
            raise invalid(f"options.{step} must be a string (the command to run)")
        if mode == "batch" and command and "\0" in command:
            raise invalid(f"the batch {step} command contains a NUL byte")
    if mode == "batch" and not options.get("exec") and "\0" in code:
        raise invalid("the batch command contains a NUL byte")
    try:  # a lone surrogate (a JSON "\ud800") has no UTF-8: no kernel could be given it
        json.dumps([code, options], ensure_ascii=False).encode()
    except UnicodeEncodeError:
        raise invalid("code and options must be valid Unicode (no lone surrogates)") from None
    return mode, code, options


@overload
def parse_run_id(value: Any, *, new: Literal[True] = True) -> str: ...
@overload
def parse_run_id(value: Any, *, new: bool) -> str | None: ...
def parse_run_id(value: Any, *, new: bool = True) -> str | None:
    """A run id from a client (Backend.AI's runId): a short printable string. Missing: a fresh one when
    `new`, else None."""
    if value is None or value == "":
        return secrets.token_hex(8) if new else None
    if not isinstance(value, str) or len(value) > 64 or not value.isprintable() or not value.isascii():
        raise invalid("runId must be a string of at most 64 printable ASCII characters")
    return value


def parse_kernel_ref(value: Any, what: str = "kernel") -> str | None:
    """Which kernel of a session a request is for (bai's `kernel`, Backend.AI's `kernel_id` for logs): a
    kernel name (main1, sub2), a kernel id or a prefix of one; None (the main kernel) when absent or empty.
    Whether the session has such a kernel is for Sessions.kernel_for to say (a 404 listing its kernels)."""
    if value is None or value == "":
        return None
    if not isinstance(value, str) or len(value) > 64 or not value.isascii() or not value.isprintable():
        raise invalid(f"{what} must be a kernel name (main1, sub1 …) or a kernel id, not {value!r:.40}")
    return value.strip() or None
