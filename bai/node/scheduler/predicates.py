"""The scheduler's predicates, one pure function each (spec §8.2).

Each returns None when the session passes, else the sentence users see. They are checked in the
order of `snapshot.PREDICATES` and all of them are evaluated, so every reason is reported.
`dependencies` is the odd one: it can also say that the session must be cancelled.

The quota predicates work on a `KeypairQuota`: the keypair's state from the snapshot plus
what was placed for it earlier in the same round, in the ints of a `SlotTable`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal

from bai.common.slots import format_amount

from .selection import INF, SlotTable
from .snapshot import (
    DEAD_DEPENDENCY_STATUSES,
    DependencyState,
    KeypairState,
    PendingSession,
    ProjectState,
    ScalingGroup,
)

_ZERO = Decimal(0)


def format_duration(seconds: float) -> str:
    """5m 3s, 1h 0m 5s, 2d 3h 0m 0s: whole seconds, rounded up, from the largest unit used."""
    left = max(0, math.ceil(seconds))
    days, left = divmod(left, 86400)
    hours, left = divmod(left, 3600)
    minutes, secs = divmod(left, 60)
    parts: list[str] = []
    for amount, unit in ((days, "d"), (hours, "h"), (minutes, "m")):
        if amount or parts:
            parts.append(f"{amount}{unit}")
    parts.append(f"{secs}s")
    return " ".join(parts)


def reserved_time(session: PendingSession, now: datetime) -> str | None:
    """A session with a reserved start time in the future waits for it."""
    starts_at = session.starts_at
    if starts_at is None or starts_at <= now:
        return None
    return f"starts at {starts_at.isoformat()} (in {format_duration((starts_at - now).total_seconds())})"


def dependencies(session: PendingSession, states: Mapping[str, DependencyState]) -> tuple[str | None, str | None]:
    """(cancel, wait): `cancel` when a dependency can never succeed, else `wait` while one runs.

    A dependency passes once it has TERMINATED with result SUCCESS (a batch session that succeeded
    but is still TERMINATING is waited for). One that is dead (TERMINATED, CANCELLED, ERROR) without
    success, or that the snapshot does not know, cancels the session.
    """
    dead: list[str] = []
    waiting: list[str] = []
    for dep_id in session.depends_on:
        state = states.get(dep_id)
        if state is None:
            dead.append(f"depends on session {dep_id}, which does not exist")
        elif state.result == "SUCCESS" and state.status == "TERMINATED":
            continue
        elif state.status in DEAD_DEPENDENCY_STATUSES:
            dead.append(
                f"session {state.name} ({state.session_id}) ended without success: {state.status}/{state.result}"
            )
        else:
            waiting.append(f"session {state.name} ({state.status})")
    if dead:
        return "; ".join(dead), None
    if waiting:
        return None, "waiting for " + ", ".join(waiting)
    return None, None


def allowed_session_types(session: PendingSession, group: ScalingGroup) -> str | None:
    if session.session_type in group.allowed_session_types:
        return None
    return f"scaling group {group.name} does not allow {session.session_type} sessions"


def image_min_resources(session: PendingSession) -> str | None:
    """Every kernel must request at least the image's minimum of each slot."""
    minimum = session.image_min
    if not minimum:
        return None
    for kernel in session.kernels:  # the common case, without allocations
        slots = kernel.slots
        for name, least in minimum.items():
            if slots.get(name, _ZERO) < least:
                return _image_min_message(session)
    return None


def _image_min_message(session: PendingSession) -> str | None:
    minimum = session.image_min
    short: dict[str, tuple[Decimal, Decimal]] = {}  # slot -> (minimum, smallest request)
    for kernel in session.kernels:
        slots = kernel.slots
        for name, least in minimum.items():
            asked = slots.get(name, _ZERO)
            if asked < least and (name not in short or asked < short[name][1]):
                short[name] = (least, asked)
    if not short:
        return None
    names = sorted(short)
    image = session.image or "(unnamed image)"
    if len(names) == 1:
        name = names[0]
        least, asked = short[name]
        return (
            f"image {image} needs at least {name} {format_amount(name, least)} per kernel, "
            f"requested {format_amount(name, asked)}"
        )
    needs = ", ".join(f"{n} {format_amount(n, short[n][0])}" for n in names)
    requested = ", ".join(f"{n} {format_amount(n, short[n][1])}" for n in names)
    return f"image {image} needs at least {needs} per kernel, requested {requested}"


class KeypairQuota:
    """A keypair's concurrency and resource use during one round, as ints of a `SlotTable`.

    Starts from the snapshot's `KeypairState` (or no limits at all when the snapshot has none)
    and grows with every session placed for the keypair in this round.
    """

    __slots__ = (
        "access_key",
        "policy_name",
        "concurrent",
        "max_concurrent",
        "networks",
        "max_networks",
        "_occupied",
        "placed",
        "limits",
        "default_limit",
        "limited",
        "checked",
    )

    def __init__(self, access_key: str, state: KeypairState | None, table: SlotTable) -> None:
        self.access_key = access_key
        if state is None:
            self.policy_name = "(none)"
            self.concurrent = 0
            self.max_concurrent = 0
            self.networks = self.max_networks = 0
            self._occupied: dict[int, int] = {}
            self.placed: list[Mapping[int, int]] = []  # requests placed this round, not summed yet
            self.limits: dict[int, int | None] = {}
            self.default_limit: int | None = None
            self.limited: bool = False
            self.checked: bool = False
            return
        policy = state.policy
        self.policy_name = policy.name
        self.concurrent = state.concurrent_sessions
        self.max_concurrent = policy.max_concurrent_sessions
        self.networks = state.session_networks
        self.max_networks = policy.max_session_networks
        self._occupied = table.convert(state.occupied)
        self.placed = []
        limits = table.convert(policy.total_resource_slots)
        self.limits = {i: (None if n >= INF else n) for i, n in limits.items()}
        self.default_limit = 0 if policy.default_for_unspecified.upper() == "LIMITED" else None
        # fixed for the round: whether a resource limit applies, whether either quota predicate does
        self.limited = bool(self.limits) or self.default_limit is not None
        self.checked = self.limited or self.max_concurrent > 0

    def add(self, request: Mapping[int, int]) -> None:
        """Count a session placed in this round (its slots are summed when `occupied` is read)."""
        self.concurrent += 1
        self.placed.append(request)

    @property
    def occupied(self) -> dict[int, int]:
        """What the keypair occupies: the snapshot's amounts plus every request placed this round."""
        if self.placed:
            occupied = self._occupied
            for request in self.placed:
                for i, n in request.items():
                    occupied[i] = occupied.get(i, 0) + n
            self.placed.clear()
        return self._occupied


def concurrency(quota: KeypairQuota) -> str | None:
    """Sessions of the keypair (running plus placed this round) < max_concurrent_sessions."""
    if quota.max_concurrent <= 0 or quota.concurrent < quota.max_concurrent:
        return None
    return f"keypair {quota.access_key} has {quota.concurrent}/{quota.max_concurrent} concurrent sessions"


def session_networks(quota: KeypairQuota, session: PendingSession) -> str | None:
    """A session of several kernels holds a Docker network (on each agent it runs on): the keypair's such
    sessions (held plus placed this round) < max_session_networks. A one-kernel session holds none."""
    if len(session.kernels) < 2 or quota.max_networks <= 0 or quota.networks < quota.max_networks:
        return None
    return (
        f"keypair {quota.access_key} holds {quota.networks}/{quota.max_networks} session networks "
        f"(sessions of several kernels; policy {quota.policy_name} max_session_networks)"
    )


def keypair_resource_limit(quota: KeypairQuota, request: Mapping[int, int], table: SlotTable) -> str | None:
    """occupied + placed this round + request <= total_resource_slots, for every requested slot.

    Slots missing from the policy are unlimited (UNLIMITED) or 0 (LIMITED). Slots the session
    does not request are not checked: a session that adds nothing to a slot cannot push it over.
    """
    if not quota.limited:
        return None
    over = None
    limits = quota.limits
    default = quota.default_limit
    occupied = quota.occupied
    for i, n in request.items():
        limit = limits.get(i, default)
        if limit is None:
            continue
        total = occupied.get(i, 0) + n
        if total > limit:
            if over is None:
                over = []
            over.append((table.names[i], i, total, limit))
    if not over:
        return None
    over.sort()
    uses = ", ".join(f"{name} {table.fmt(i, total)} of its {table.fmt(i, limit)}" for name, i, total, limit in over)
    return f"keypair {quota.access_key} would use {uses} (policy {quota.policy_name})"


class ProjectQuota:
    """A project's cap and what its sessions hold during one round (as ints of a `SlotTable`); grows with every
    session of the project placed in the round."""

    __slots__ = ("name", "limits", "occupied", "limited", "kind")

    def __init__(self, state: ProjectState | None, table: SlotTable, kind: str = "project") -> None:
        self.kind = kind
        if state is None:
            self.name, self.limits, self.occupied, self.limited = "", {}, {}, False
            return
        self.name = state.name
        self.limits = {i: n for i, n in table.convert(state.cap).items() if n < INF}
        self.occupied = table.convert(state.occupied)
        self.limited = bool(self.limits)

    def add(self, request: Mapping[int, int]) -> None:
        for i, n in request.items():
            self.occupied[i] = self.occupied.get(i, 0) + n


_SLOT_WORDS = {"cuda.device": "GPUs", "cuda.shares": "GPU shares", "cpu": "CPU cores", "mem": "of memory"}


def project_resource_limit(quota: ProjectQuota, request: Mapping[int, int], table: SlotTable) -> str | None:
    """What the project's (or domain's) sessions hold (with those placed this round) + request <= its cap, for every
    slot the session asks for: "project ml-team has 8/8 GPUs"."""
    over = []
    for i, n in request.items():
        limit = quota.limits.get(i)
        if limit is None or n == 0:
            continue
        held = quota.occupied.get(i, 0)
        if held + n > limit:
            over.append(
                f"{table.fmt(i, held)}/{table.fmt(i, limit)} {_SLOT_WORDS.get(table.names[i], table.names[i])} "
                f"(asks {table.fmt(i, n)} more)"
            )
    if not over:
        return None
    return f"{quota.kind} {quota.name} has {', '.join(sorted(over))}"
