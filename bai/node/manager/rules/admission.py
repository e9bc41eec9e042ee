"""Who may ask for what when a session is created: networks, image registries, kernel sizes, policy limits.

Pure decisions (request + caller + configuration → None or a Problem), made before a session is
stored and before any connection is made:

- Networks. `config.network` must be allowed by the session's scaling group:
  `[scaling_groups.NAME] allowed_networks` (for everyone) and `admin_allowed_networks` (admins too).
  Leaving the network unset (the agent's `[agent.docker] network`) or asking for `none` is always
  allowed; anything else (`bridge`, `host`, a user-defined Docker network) only when listed.
- Registries. An image naming a registry (`HOST[:PORT]/repo:tag`) is pulled only from a registry of
  `[images.registries.NAME]`; the manager holds its credentials and hands the agent what one pull needs.
- Kernel size. Each kernel asks for at least MIN_KERNEL_CPU cores and MIN_KERNEL_MEM of memory
  (`[session] min_kernel_cpu` / `min_kernel_mem`): below that Docker refuses the container (memory under
  6 MiB) or the kernel's runner cannot even start, and a flood of tiny kernels would hold the node's
  processes, networks and containers for almost no quota. A request below the floor is a 400 naming it.
- The owner's resource policy. A session asking for more of a slot than its keypair's policy allows in all
  (`total_resource_slots`, or 0 for a slot it does not list under `default_for_unspecified = LIMITED`) could
  never start, whatever ends: it is a 412 (quota-exceeded) naming the limit and the request, not queued
  forever. The policy's other limits count sessions (max_concurrent_sessions, max_session_networks,
  max_pending_session_count): any one session fits those once the keypair's others end, and bai has no
  per-session container limit (a session's size is bounded by MAX_CLUSTER_SIZE when the request is read).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bai.common import slots as slotlib
from bai.common.images import registry_of
from bai.common.problems import Problem, invalid

if TYPE_CHECKING:
    from bai.node.manager.state.records import Policy

ALWAYS_ALLOWED_NETWORKS = ("none",)  # no network at all is never a risk
# a Docker network name; `container:ID` (sharing another container's namespace) is not one
NETWORK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
# the smallest kernel: a tenth of a core (the runner and an interpreter answer in well under a second at
# that share) and 32 MiB (Docker's floor is 6 MiB; the runner with Python 3.11 takes about 15 MiB resident)
MIN_KERNEL_CPU = Decimal("0.1")
MIN_KERNEL_MEM = Decimal(32 * 2**20)


@dataclass(frozen=True)
class GroupPolicy:
    """What a scaling group allows: networks for users and for admins."""

    allowed_networks: tuple[str, ...] = ()
    admin_allowed_networks: tuple[str, ...] = ()

    def networks_for(self, is_admin: bool, default: str = "none") -> tuple[str, ...]:
        """What a session may ask for: none, the agents' default network (what an unset one gets
        anyway), and what the group lists."""
        extra = self.admin_allowed_networks if is_admin else ()
        return tuple(dict.fromkeys((*ALWAYS_ALLOWED_NETWORKS, default, *self.allowed_networks, *extra)))


@dataclass(frozen=True)
class ImageRegistry:
    """A configured image registry: where it is and how to log in to it."""

    name: str
    host: str  # as Docker names it in an image reference: `127.0.0.1:5000`, `reg.example.com`
    username: str = ""
    password: str = field(default="", repr=False)
    password_file: str = ""
    insecure: bool = False

    def auth(self) -> dict[str, str] | None:
        """What Docker's X-Registry-Auth needs for one pull (None: anonymous). Reads password_file now."""
        if not self.username:
            return None
        password = self.password
        if self.password_file:
            try:
                password = Path(self.password_file).read_text().strip()
            except OSError as e:
                raise Problem(
                    "internal-server-error",
                    "Registry credentials unavailable.",
                    f"[images.registries.{self.name}] password_file: {e.strerror}",
                ) from None
        return {"username": self.username, "password": password, "serveraddress": self.host}


@dataclass(frozen=True)
class Admission:
    """The rules a request must pass before it is queued: scaling groups, networks, registries."""

    groups: dict[str, GroupPolicy] = field(default_factory=lambda: {"default": GroupPolicy()})
    registries: dict[str, ImageRegistry] = field(default_factory=dict)  # by host
    default_network: str = "none"  # [agent.docker] network: what a session that names none gets
    min_kernel: dict[str, Decimal] = field(default_factory=lambda: {"cpu": MIN_KERNEL_CPU, "mem": MIN_KERNEL_MEM})

    def registry_for(self, image: str) -> ImageRegistry | None:
        host = registry_of(image)
        return self.registries.get(host.lower()) if host else None

    def configured(self) -> str:
        return ", ".join(f"{r.name} ({r.host})" for r in sorted(self.registries.values(), key=lambda r: r.name))


def registry_host(url: str, name: str) -> tuple[str, bool | None]:
    """`127.0.0.1:5000`, `https://reg.example:5000` or `http://…` → (host as in image references,
    whether the scheme says plain HTTP; None without a scheme)."""
    scheme, sep, rest = url.strip().partition("://")
    if not sep:
        scheme, rest = "", url.strip()
    if scheme not in ("", "http", "https"):
        raise ValueError(f"[images.registries.{name}] url: use HOST[:PORT] or https://HOST[:PORT], not {url!r}")
    host = rest.rstrip("/")
    if not host or any(c in host for c in "/@ ") or registry_of(f"{host}/x") != host:
        raise ValueError(
            f"[images.registries.{name}] url: a registry address is HOST[:PORT] with a '.' or a port "
            f"(or localhost), as Docker reads image references; got {url!r}"
        )
    return host.lower(), (scheme == "http") if scheme else None


def from_config(cfg: dict[str, Any]) -> Admission:
    """The admission rules of a configuration (raises ValueError on a bad registry or network name)."""
    groups = {}
    for name, opts in (cfg.get("scaling_groups") or {}).items():
        nets = [*opts.get("allowed_networks", []), *opts.get("admin_allowed_networks", [])]
        for net in nets:
            if not NETWORK_NAME.match(net):
                raise ValueError(f"[scaling_groups.{name}]: {net!r} is not a Docker network name")
        groups[name] = GroupPolicy(
            tuple(opts.get("allowed_networks", [])), tuple(opts.get("admin_allowed_networks", []))
        )
    registries: dict[str, ImageRegistry] = {}
    for name, opts in ((cfg.get("images") or {}).get("registries") or {}).items():
        if not opts.get("url"):
            raise ValueError(f"[images.registries.{name}] needs url (HOST[:PORT] or https://HOST[:PORT])")
        host, plain = registry_host(opts["url"], name)
        insecure = bool(opts.get("insecure", False))
        if plain is False and insecure:
            raise ValueError(f"[images.registries.{name}]: an https:// url and insecure = true contradict")
        if opts.get("password") and opts.get("password_file"):
            raise ValueError(f"[images.registries.{name}]: give password or password_file, not both")
        if (opts.get("password") or opts.get("password_file")) and not opts.get("username"):
            raise ValueError(f"[images.registries.{name}]: a password needs a username")
        if host in registries:
            raise ValueError(f"[images.registries.{name}]: {host} is also [images.registries.{registries[host].name}]")
        registries[host] = ImageRegistry(
            name,
            host,
            str(opts.get("username", "")),
            str(opts.get("password", "")),
            str(opts.get("password_file", "")),
            insecure or bool(plain),
        )
    default_network = str(((cfg.get("agent") or {}).get("docker") or {}).get("network") or "none")
    return Admission(groups, registries, default_network, min_kernel_of(cfg.get("session") or {}))


def min_kernel_of(session: dict[str, Any]) -> dict[str, Decimal]:
    """`[session] min_kernel_cpu` / `min_kernel_mem` (the constants when unset); ValueError when unreadable.
    The memory floor never goes below Docker's own (6 MiB)."""
    out = {}
    for slot, key, default in (("cpu", "min_kernel_cpu", MIN_KERNEL_CPU), ("mem", "min_kernel_mem", MIN_KERNEL_MEM)):
        value = session.get(key)
        if value is None or value == "":
            out[slot] = default
            continue
        try:
            amount = slotlib.parse_amount(slot, value)
        except (slotlib.SlotError, ValueError, ArithmeticError) as e:
            raise ValueError(f"[session] {key}: {e}") from None
        if not amount.is_finite() or amount < 0:
            raise ValueError(f"[session] {key}: {value!r} is not an amount")
        out[slot] = max(amount, DOCKER_MIN_MEM) if slot == "mem" else amount
    return out


DOCKER_MIN_MEM = Decimal(6 * 2**20)  # Docker refuses a memory limit below this


def check_kernel_size(admission: Admission, resources: dict[str, Decimal]) -> Problem | None:
    """Each kernel asks for at least the floor of cpu and mem (a slot it does not name is not checked)."""
    for slot, least in admission.min_kernel.items():
        asked = resources.get(slot)
        if asked is not None and asked < least:
            floor = ", ".join(f"{n} {slotlib.format_amount(n, v)}" for n, v in admission.min_kernel.items())
            return Problem(
                "invalid-api-params",
                "Kernel too small.",
                f"config.resources.{slot}: {slotlib.format_amount(slot, asked)} is below the smallest kernel, "
                f"{slot} {slotlib.format_amount(slot, least)} (each kernel needs at least {floor}; "
                f"[session] min_kernel_{slot})",
                {"slot": slot, "requested": str(asked), "minimum": str(least)},
            )
    return None


def check_image(admission: Admission, image: str) -> Problem | None:
    """An image from a registry that is not configured: refused before anything connects to it."""
    host = registry_of(image)
    if host is None or admission.registry_for(image) is not None:
        return None
    allowed = admission.configured() or "none are configured"
    return Problem(
        "generic-forbidden",
        "Image registry not allowed.",
        f"the image {image!r} comes from the registry {host}, which is not configured; "
        f"images may be pulled only from [images.registries] ({allowed})",
        {"registry": host, "allowed_registries": sorted(r.host for r in admission.registries.values())},
    )


def check_network(admission: Admission, network: str | None, group: str, is_admin: bool) -> Problem | None:
    if network is None:
        return None
    allowed = admission.groups.get(group, GroupPolicy()).networks_for(is_admin, admission.default_network)
    if network in allowed:
        return None
    who = "admins" if is_admin else "this keypair"
    return Problem(
        "generic-forbidden",
        "Network not allowed.",
        f"scaling group {group!r} does not allow {who} the network {network!r}; allowed: "
        f"{', '.join(allowed)} (or leave it unset for the agents' default; "
        f"[scaling_groups.{group}] allowed_networks / admin_allowed_networks)",
        {"network": network, "allowed_networks": list(allowed)},
    )


def check_group(admission: Admission, group: str, agent_groups: set[str]) -> Problem | None:
    if group in admission.groups or group in agent_groups:
        return None
    known = ", ".join(sorted(set(admission.groups) | agent_groups))
    return invalid(f"unknown scaling group {group!r} (known: {known})")


def admit(admission: Admission, req: Any, is_admin: bool, agent_groups: Iterable[str] = ()) -> Problem | None:
    """None when the request (a CreateRequest) may be created, else the Problem that says why not."""
    return (
        check_kernel_size(admission, req.resources)
        or check_group(admission, req.scaling_group, set(agent_groups))
        or check_network(admission, req.network, req.scaling_group, is_admin)
        or check_image(admission, req.image)
    )


POLICY_SLUG = "quota-exceeded"
POLICY_TITLE = "The request exceeds its keypair's resource policy."


def policy_limits(policy: Policy) -> tuple[dict[str, Decimal], Decimal | None]:
    """A policy's total_resource_slots (slot -> the most a keypair may hold) and what a slot it does not list
    gets: 0 under default_for_unspecified LIMITED, else None (unlimited)."""
    limits = slotlib.from_wire(policy.total_resource_slots)
    default = Decimal(0) if policy.default_for_unspecified.upper() == "LIMITED" else None
    return limits, default


def check_policy(policy: Policy | None, access_key: str, req: Any) -> Problem | None:
    """A request (a CreateRequest) for more of some slot, its kernels together, than the owner's policy lets
    the keypair hold in all: it could never be scheduled (the scheduler's keypair_resource_limit would keep
    it PENDING for ever), so it is refused now, naming every such slot, the policy's limit and the request.
    None: no policy (unlimited), or every slot fits."""
    if policy is None:
        return None
    limits, default = policy_limits(policy)
    if not limits and default is None:
        return None
    kernels = req.cluster_size
    over = []
    for slot, amount in sorted(req.resources.items()):
        if amount <= 0:
            continue
        limit = limits.get(slot, default)
        total = amount * kernels
        if limit is not None and total > limit:
            over.append((slot, total, limit))
    if not over:
        return None
    each = f" ({kernels} kernels of {slotlib.format_slots(req.resources)} each)" if kernels > 1 else ""
    asks = ", ".join(f"{slot} {slotlib.format_amount(slot, total)}" for slot, total, _ in over)
    allows = ", ".join(
        f"{slot} {slotlib.format_amount(slot, limit)}"
        + ("" if slot in limits else " (not listed; default_for_unspecified = LIMITED)")
        for slot, _, limit in over
    )
    return Problem(
        POLICY_SLUG,
        POLICY_TITLE,
        f"the session asks for {asks}{each}, more than keypair {access_key}'s resource policy {policy.name} "
        f"allows it in all (total_resource_slots): {allows}; it could never start: ask for less, or have an "
        "admin raise the policy's limit",
        {
            "policy": policy.name,
            "requested": {slot: slotlib.to_wire({slot: total})[slot] for slot, total, _ in over},
            "limits": {slot: slotlib.to_wire({slot: limit})[slot] for slot, _, limit in over},
            "default_for_unspecified": policy.default_for_unspecified,
        },
    )
