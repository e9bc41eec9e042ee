"""Agent selection for one scaling group: which agent takes a request (spec §8.3).

Preference, best first:
  1. fewer "extra" slot types: slot types the agent has (capacity > 0) that the request does not
     ask for, so GPU hosts are kept for GPU work;
  2. per requested slot, in resource-priority order (device sub-slots such as `cuda.shares` sort
     with their device name `cuda`, unknown devices last, then by name): `dispersed` prefers the
     most remaining (spread), `concentrated` the least remaining that still fits (bin-pack);
  3. the agent id, lowest first.
Only agents with remaining >= requested for every requested slot (> 0) are candidates.

Speed. Amounts are plain ints here (see `SlotTable`). For each request *shape* (the tuple of
requested slots in priority order) a pool keeps, per extras count, the candidate agents in a list
sorted by the preference key (remaining amounts, then id), each packed into one int (see
`_ShapeIndex`: ints compare much faster than tuples). A dispersed pick reads the list from the
front and stops as soon as the first slot no longer fits; a concentrated pick bisects to the
first agent with enough of the first slot. Reserving moves one agent in each list it is in
(bisect + insert). Agents with less than the smallest request of the shape seen so far in some
slot (the "floor"; full agents, say) are left out of the lists until a smaller request or a
release brings them back, so scans do not step over them again and again. A request that found
no agent fails at once until something is released. What a request needs for all this (its
ints, its thresholds in the keys, how it moves a key) is worked out once per distinct request
(`Prepared`) and kept.

`explain` names the "best" agent: the one ranked first by remaining room in priority order
(what dispersed would pick if it fitted) among the agents in the lists, or among all agents
offering the requested slots when none is left in the lists, and each slot it is short of.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Iterable, Mapping, Sequence
from decimal import Decimal
from operator import le, neg

from bai.common.slots import format_amount, is_bytes_slot

from .snapshot import CONCENTRATED, DEFAULT_RESOURCE_PRIORITY, DISPERSED, AgentState

# (room, agent) -> the agent's key in a `_ShapeIndex`; room -> whether the agent is alive there
_Encode = Callable[[list[int], int], int]
_Alive = Callable[[list[int]], bool]
# what `_ShapeIndex.plan` works out for a request: (index, bound, rest)
_Plan = tuple["_ShapeIndex", int, tuple[tuple[int, int, int], ...]]


class Prepared:
    """A request as `AgentPool` wants it, made once per distinct request and shared: never mutate
    `slots`, `shape` or `amounts`.

    `slots` is {slot index: amount > 0}, `shape` the requested slots in priority order, `amounts`
    aligned with `shape`. The rest are memos: `plan` (the pool's, see `AgentPool.select`),
    `failed_at` (the pool's release count when it last found no agent), `explained` (the pool's
    change count and `explain`'s answer then), `deltas` (per shape index, how reserving it changes
    an agent's key), `meets` and `within_largest` (the caller's: the core keeps there whether the
    request meets an image's minimum, and that it fits the group's largest agent).
    """

    __slots__ = ("slots", "shape", "amounts", "plan", "failed_at", "explained", "deltas", "meets", "within_largest")

    def __init__(self, slots: dict[int, int], shape: tuple[int, ...], amounts: tuple[int, ...]) -> None:
        self.slots = slots
        self.shape = shape
        self.amounts = amounts
        self.plan: _Plan | None = None
        self.failed_at = -1
        self.explained: tuple[int, str] | None = None
        self.deltas: dict[_ShapeIndex, int] = {}
        self.meets: dict[int, bool] = {}
        self.within_largest = False


# Stand-in for an infinite amount (Decimal("Infinity") capacity or request).
INF = 10**40
_MAX_DIGITS = 40
_FAILED_MEMO = 1024


class Rescale(Exception):
    """A value needs more decimal places than the slot's current scale: start over with these."""

    def __init__(self, name: str, digits: int) -> None:
        super().__init__(name, digits)
        self.name = name
        self.digits = digits


def _digits_needed(value: Decimal) -> int:
    exponent = value.as_tuple().exponent
    return max(0, -exponent) if isinstance(exponent, int) else 0


class SlotTable:
    """Slot names as dense indices, amounts as exact ints (value × 10**digits of the slot).

    Count slots start at 3 decimal places (milli-cores), byte slots at 0. A value that does not
    fit the scale raises `Rescale`; the caller starts again with a table that knows better.
    """

    __slots__ = ("index", "names", "digits", "saw_infinity", "_scales", "_seen", "_shown", "_overrides")

    def __init__(self, digits: Mapping[str, int] | None = None) -> None:
        self.index: dict[str, int] = {}
        self.names: list[str] = []
        self.digits: list[int] = []
        self._scales: list[Decimal] = []
        self._seen: list[dict[Decimal, int]] = []  # per slot: amounts already converted
        self._shown: dict[tuple[int, int], str] = {}  # formatted amounts, for messages
        self._overrides = dict(digits or {})
        self.saw_infinity = False  # an infinite amount was converted (to ±INF)

    def slot(self, name: str) -> int:
        i = self.index.get(name)
        if i is None:
            i = len(self.names)
            digits = self._overrides.get(name, 0 if is_bytes_slot(name) else 3)
            self.index[name] = i
            self.names.append(name)
            self.digits.append(digits)
            self._scales.append(Decimal(10) ** digits)
            self._seen.append({})
        return i

    def _odd(self, name: str, value: Decimal) -> int:
        """The slow path of a conversion: infinities, NaN, too many decimal places."""
        if isinstance(value, int | float) and not isinstance(value, bool):
            value = Decimal(str(value))
        if not isinstance(value, Decimal):
            raise TypeError(f"slot {name}: amount {value!r} is not a Decimal")
        if value.is_nan():
            raise ValueError(f"slot {name}: amount is NaN")
        if value.is_infinite():
            self.saw_infinity = True
            return INF if value > 0 else -INF
        digits = _digits_needed(value.normalize())
        if digits > _MAX_DIGITS:
            raise ValueError(f"slot {name}: {value} has too many decimal places")
        raise Rescale(name, max(digits, self.digits[self.slot(name)]))

    def convert(self, amounts: Mapping[str, Decimal], positive_only: bool = False) -> dict[int, int]:
        """{name: Decimal} -> {slot index: int}; with positive_only, amounts <= 0 are dropped."""
        out: dict[int, int] = {}
        index = self.index
        seen = self._seen
        for name, value in amounts.items():
            i = index.get(name)
            if i is None:
                i = self.slot(name)
            n = seen[i].get(value)  # Decimal arithmetic is slow (context look-ups); amounts repeat
            if n is None:
                n = self._to_int(i, value)
            if n > 0 or not positive_only:
                out[i] = n
        return out

    def _to_int(self, i: int, value: Decimal) -> int:
        try:
            q = value * self._scales[i]
            n = int(q)
        except (OverflowError, ValueError, TypeError):
            return self._odd(self.names[i], value)
        if n != q:
            return self._odd(self.names[i], value)
        seen = self._seen[i]
        if len(seen) >= 4096:
            seen.clear()
        seen[value] = n
        return n

    def to_decimal(self, i: int, n: int) -> Decimal:
        if n >= INF:
            return Decimal("Infinity")
        if n <= -INF:
            return Decimal("-Infinity")
        return Decimal(n).scaleb(-self.digits[i])

    def fmt(self, i: int, n: int) -> str:
        """Human form of an int amount of slot i, as `bai.common.slots.format_amount` writes it."""
        text = self._shown.get((i, n))
        if text is None:
            text = format_amount(self.names[i], self.to_decimal(i, n))
            if len(self._shown) >= 4096:
                self._shown.clear()
            self._shown[i, n] = text
        return text


def priority_key(priority: Sequence[str]) -> Callable[[str], tuple[int, str]]:
    """Sort key for slot names: by device (the part before the first dot) in priority order."""
    rank = {device: n for n, device in enumerate(priority)}
    last = len(priority)

    def key(name: str) -> tuple[int, str]:
        return rank.get(name.split(".", 1)[0], last), name

    return key


def _encoder(fields: tuple[tuple[int, int, int], ...]) -> _Encode:
    """(room, agent) -> the agent's key: its room in each (slot, lo, shift) field, then the agent.

    `lo` is the lowest value the slot's room can take, so every field is >= 0; the agent number
    fills the low bits. Comparing two keys compares (room in slot 1, room in slot 2, ..., agent)."""
    if not fields:
        return lambda room, agent: agent
    if len(fields) == 1:
        ((a, la, sa),) = fields
        return lambda room, agent: (room[a] - la) << sa | agent
    if len(fields) == 2:
        (a, la, sa), (b, lb, sb) = fields
        return lambda room, agent: (room[a] - la) << sa | (room[b] - lb) << sb | agent
    if len(fields) == 3:
        (a, la, sa), (b, lb, sb), (c, lc, sc) = fields
        return lambda room, agent: (room[a] - la) << sa | (room[b] - lb) << sb | (room[c] - lc) << sc | agent

    def encode(room: list[int], agent: int) -> int:
        key = agent
        for slot, lo, shift in fields:
            key |= (room[slot] - lo) << shift
        return key

    return encode


def _alive_maker(shape: tuple[int, ...], floor: tuple[int, ...], dispersed: bool) -> _Alive:
    """room -> whether the agent still has at least `floor` of every slot of `shape`."""
    if dispersed:  # room holds -remaining: alive when -remaining_j <= -floor_j
        limits = tuple(zip(shape, (-f for f in floor), strict=True))
        if len(limits) == 1:
            ((a, fa),) = limits
            return lambda room: room[a] <= fa
        if len(limits) == 2:
            (a, fa), (b, fb) = limits
            return lambda room: room[a] <= fa and room[b] <= fb
        if len(limits) == 3:
            (a, fa), (b, fb), (c, fc) = limits
            return lambda room: room[a] <= fa and room[b] <= fb and room[c] <= fc
        return lambda room: all(room[slot] <= limit for slot, limit in limits)
    limits = tuple(zip(shape, floor, strict=True))
    if len(limits) == 1:
        ((a, fa),) = limits
        return lambda room: room[a] >= fa
    if len(limits) == 2:
        (a, fa), (b, fb) = limits
        return lambda room: room[a] >= fa and room[b] >= fb
    if len(limits) == 3:
        (a, fa), (b, fb), (c, fc) = limits
        return lambda room: room[a] >= fa and room[b] >= fb and room[c] >= fc
    return lambda room: all(room[slot] >= limit for slot, limit in limits)


class _ShapeIndex:
    """The candidate agents for one request shape: one sorted list of keys per extras count.

    An entry is one int, the agent's *key* (see `_encoder`): keys sort like the preference (room
    in the shape's slots in priority order, signed as in `AgentPool.room`, then the agent number).
    Field j (slot j of the shape) of a key is `key >> shifts[j] & masks[j]`, the room minus
    `los[j]`; `key & agent_mask` is the agent. The fields are wide enough for every value the
    room can take in the round (`AgentPool.bounds`).

    Only *alive* agents are in the lists: those with at least the shape's floor (per slot, the
    smallest amount of the requests prepared so far; 1 unit before any) of every slot. The
    others cannot take any of those requests: they wait, in the same order, in `dead` (read to
    explain a failure), until a release or a smaller request brings them back.
    """

    __slots__ = (
        "shape",
        "los",
        "shifts",
        "masks",
        "agent_mask",
        "encode",
        "alive",
        "levels",
        "level_of",
        "dead",
        "keys",
        "where",
        "messages",
    )

    def __init__(self, shape: tuple[int, ...], bounds: list[tuple[int, int]], n_agents: int) -> None:
        self.shape = shape
        self.agent_mask = (1 << max(1, (n_agents - 1).bit_length())) - 1
        shift = self.agent_mask.bit_length()
        los, shifts, masks = [], [], []
        for slot in reversed(shape):  # the last slot in the lowest bits above the agent's
            lo, hi = bounds[slot] if slot < len(bounds) else (0, 0)
            width = max(1, (hi - lo).bit_length())
            los.append(lo)
            shifts.append(shift)
            masks.append((1 << width) - 1)
            shift += width
        self.los: tuple[int, ...] = tuple(reversed(los))
        self.shifts: tuple[int, ...] = tuple(reversed(shifts))
        self.masks: tuple[int, ...] = tuple(reversed(masks))
        self.encode = _encoder(tuple(zip(shape, self.los, self.shifts, strict=True)))
        self.alive = _alive_maker(shape, (1,) * len(shape), True)  # set by `fill`
        self.levels: list[list[int]] = []  # ascending extras
        self.dead: list[int] = []
        # per agent number (None: not a member): its level, its key, the list holding the key
        self.level_of: list[list[int] | None] = [None] * n_agents
        self.keys: list[int] = [0] * n_agents
        self.where: list[list[int] | None] = [None] * n_agents
        self.messages: dict[tuple[int, ...], str] = {}  # explain's, by (best agent, its room, amounts)

    def fill(
        self, types: list[frozenset[int]], rooms: list[list[int]], floor: tuple[int, ...], dispersed: bool
    ) -> None:
        """Put every agent that offers all the shape's slots in its level (or in `dead`)."""
        self.alive = alive = _alive_maker(self.shape, floor, dispersed)
        encode = self.encode
        wanted = frozenset(self.shape)
        by_extras: dict[int, list[int]] = {}
        for agent, offered in enumerate(types):
            if wanted <= offered:
                level = by_extras.setdefault(len(offered - wanted), [])
                room = rooms[agent]
                key = encode(room, agent)
                held = level if alive(room) else self.dead
                held.append(key)
                self.level_of[agent] = level
                self.keys[agent] = key
                self.where[agent] = held
        for level in by_extras.values():
            level.sort()
        self.levels = [by_extras[extras] for extras in sorted(by_extras)]
        self.dead.sort()

    def set_floor(self, floor: tuple[int, ...], dispersed: bool, rooms: list[list[int]]) -> None:
        """A lower floor: agents that now reach it come back into their lists."""
        self.alive = alive = _alive_maker(self.shape, floor, dispersed)
        still = []
        mask = self.agent_mask
        for key in self.dead:
            agent = key & mask
            if alive(rooms[agent]):
                level = self.level_of[agent]
                assert level is not None  # every agent in `dead` is a member
                insort(level, key)
                self.where[agent] = level
            else:
                still.append(key)
        self.dead[:] = still

    def move(self, agent: int, key: int, room: list[int]) -> None:
        """The agent's key is now `key` (its room is `room`): move it, to its level or to `dead`."""
        held = self.where[agent]
        assert held is not None  # only members move
        del held[bisect_left(held, self.keys[agent])]
        self.keys[agent] = key
        held = self.level_of[agent] if self.alive(room) else self.dead
        assert held is not None
        insort(held, key)
        self.where[agent] = held

    def plan(
        self, amounts: tuple[int, ...], dispersed: bool
    ) -> tuple[_ShapeIndex, int, tuple[tuple[int, int, int], ...]]:
        """(self, bound, rest) for a request: a key fits when key < bound (dispersed) or key >=
        bound (concentrated), and, for each (shift, mask, limit) of rest, its field is <= limit
        (dispersed) or >= limit (concentrated)."""
        if not amounts:  # every member fits
            return self, (self.agent_mask + 1 if dispersed else 0), ()
        # (zip's strict=True parses keywords on every call: too slow for once per request)
        limits = [(-a if dispersed else a) - lo for a, lo in zip(amounts, self.los)]  # noqa: B905
        bound = (limits[0] + 1 if dispersed else limits[0]) << self.shifts[0]
        return self, bound, tuple(zip(self.shifts[1:], self.masks[1:], limits[1:]))  # noqa: B905

    def delta(self, slots: Mapping[int, int], dispersed: bool) -> int:
        """How reserving `slots` changes a member's key (room is -remaining when dispersed)."""
        delta = 0
        for slot, shift in zip(self.shape, self.shifts):  # noqa: B905 (same lengths)
            delta += slots.get(slot, 0) << shift
        return delta if dispersed else -delta


class AgentPool:
    """The schedulable agents of one scaling group, with their remaining room, as ints.

    `prepare` turns a request into a `Prepared`; `take` picks an agent for it and reserves it
    there; `select` only picks, `reserve` / `release` move room, `explain` says why a request
    found no agent. Agents are numbered 0..n-1 in id order, so the number doubles as the final
    tie-break. The caller's `AgentState` objects are only read.

    Internally `room[agent][slot]` is the remaining amount, negated for `dispersed`, so that in
    both strategies an ascending sort puts the preferred agent first.
    """

    def __init__(
        self,
        group: str,
        agents: Iterable[AgentState],
        table: SlotTable,
        strategy: str = DISPERSED,
        priority: Sequence[str] = DEFAULT_RESOURCE_PRIORITY,
    ) -> None:
        if strategy not in (DISPERSED, CONCENTRATED):
            raise ValueError(f"unknown agent selection strategy {strategy!r} (use dispersed or concentrated)")
        self.group = group
        self.table = table
        self.dispersed = strategy == DISPERSED
        self.priority_key = priority_key(priority)
        ordered = sorted(agents, key=lambda a: a.id)
        self.ids: list[str] = [a.id for a in ordered]
        self.numbers: dict[str, int] = {agent_id: n for n, agent_id in enumerate(self.ids)}
        converted = [(table.convert(a.capacity), table.convert(a.occupied)) for a in ordered]
        width = len(table.names)  # every slot an agent has; requests only use slots of their agent
        sign = -1 if self.dispersed else 1
        self.room: list[list[int]] = []
        self.types: list[frozenset[int]] = []
        self.capacity: dict[int, int] = {}  # group total, for DRF
        self._capacities: list[list[int]] = []
        self._occupied: list[dict[int, int]] = [occupied for _, occupied in converted]
        for capacity, occupied in converted:
            self._capacities.append([max(0, capacity.get(i, 0)) for i in range(width)])
            room = [0] * width
            for i, n in capacity.items():
                room[i] = sign * (n - occupied.get(i, 0))
                self.capacity[i] = self.capacity.get(i, 0) + n
            for i, n in occupied.items():
                if i not in capacity:
                    room[i] = -sign * n
            self.room.append(room)
            self.types.append(frozenset(i for i, n in capacity.items() if n > 0))
        self.all_types: frozenset[int] = frozenset().union(*self.types) if self.types else frozenset()
        # per slot, the range (lo, hi) its room stays in: a reservation leaves the remaining
        # amount >= 0 (it fits: `reserve` checks), a release gives back what was reserved.
        columns = list(zip(*self.room)) if self.room else [()] * width  # noqa: B905 (each room: `width` slots)
        self.bounds: list[tuple[int, int]] = [
            (min(0, min(column, default=0)), max(0, max(column, default=0))) for column in columns
        ]
        self._indexes: dict[tuple[int, ...], _ShapeIndex] = {}
        self._member_of: list[list[_ShapeIndex]] = [[] for _ in ordered]  # per agent: its indexes
        self.releases = 0  # bumped on every release: requests that found no agent may fit again
        self.changes = 0  # bumped on every change of a room or of the lists: what `explain` said may be stale
        self.shapes: dict[tuple[int, ...], tuple[int, ...]] = {}
        self.prepared: dict[
            tuple[tuple[str, Decimal], ...], Prepared
        ] = {}  # by the request's (name, Decimal) items: see `prepare`
        self._summed: dict[tuple[tuple[int, int], ...], Prepared] = {}  # by (slot, int) items
        self.floors: dict[tuple[int, ...], tuple[int, ...]] = {}  # per shape, see `_expect`

    def __len__(self) -> int:
        return len(self.ids)

    def free(self, agent: int) -> dict[str, Decimal]:
        """An agent's remaining room, as Decimals (for tests and messages)."""
        sign = -1 if self.dispersed else 1
        table = self.table
        return {table.names[i]: table.to_decimal(i, sign * n) for i, n in enumerate(self.room[agent])}

    # -- requests ------------------------------------------------------------------------------

    def shape_of(self, request: Mapping[int, int]) -> tuple[int, ...]:
        """The requested slots (amount > 0) in priority order."""
        raw = tuple(request)
        shape = self.shapes.get(raw)
        if shape is None:
            names = self.table.names
            shape = tuple(sorted(raw, key=lambda i: self.priority_key(names[i])))
            self.shapes[raw] = shape
        return shape

    def prepare(self, slots: Mapping[str, Decimal]) -> Prepared:
        """A request ({name: Decimal}) as `select` wants it, one per distinct request."""
        try:
            key = tuple(slots.items())
            hit = self.prepared.get(key)
        except TypeError:  # an unhashable amount: convert() will say what is wrong with it
            key, hit = None, None
        if hit is None:
            hit = self._new(self.table.convert(slots, True))
            if key is not None:
                if len(self.prepared) >= 65536:
                    self.prepared.clear()
                self.prepared[key] = hit
        return hit

    def prepare_ints(self, request: dict[int, int]) -> Prepared:
        """Like `prepare`, from {slot index: amount > 0} (a sum over kernels, say)."""
        key = tuple(request.items())
        hit = self._summed.get(key)
        if hit is None:
            if len(self._summed) >= 65536:
                self._summed.clear()
            hit = self._summed[key] = self._new(request)
        return hit

    def _new(self, request: dict[int, int]) -> Prepared:
        shape = self.shapes.get(tuple(request)) or self.shape_of(request)
        prepared = Prepared(request, shape, tuple(map(request.__getitem__, shape)))
        self._expect(shape, prepared.amounts)
        return prepared

    def _expect(self, shape: tuple[int, ...], amounts: tuple[int, ...]) -> None:
        """Lower the shape's floor to cover this request (see `_ShapeIndex`)."""
        floor = self.floors.get(shape)
        if floor is not None and all(map(le, floor, amounts)):  # noqa: B905 (same lengths)
            return  # the usual case: it is no smaller than the floor
        lower = amounts if floor is None else tuple(map(min, floor, amounts))
        if lower != floor:
            self.floors[shape] = lower
            index = self._indexes.get(shape)
            if index is not None:
                index.set_floor(lower, self.dispersed, self.room)
                self.changes += 1

    def _index(self, shape: tuple[int, ...]) -> _ShapeIndex:
        index = self._indexes.get(shape)
        if index is None:
            index = _ShapeIndex(shape, self.bounds, len(self.ids))
            index.fill(self.types, self.room, self.floors.get(shape) or (1,) * len(shape), self.dispersed)
            for agent, level in enumerate(index.level_of):
                if level is not None:
                    self._member_of[agent].append(index)
            self._indexes[shape] = index
        return index

    def _plan(self, prepared: Prepared) -> _Plan:
        prepared.plan = plan = self._index(prepared.shape).plan(prepared.amounts, self.dispersed)
        return plan

    # -- the operations ----------------------------------------------------------------------

    def select(self, prepared: Prepared) -> int | None:
        """The best agent (its number) for a prepared request, or None.

        Only for requests that went through `prepare` / `prepare_ints`: the pool leaves out of
        its scans the agents with less than every request prepared so far.
        """
        if prepared.failed_at == self.releases:  # rooms only shrank since it found nothing
            return None
        index, bound, rest = prepared.plan or self._plan(prepared)
        mask = index.agent_mask
        if len(rest) == 1:  # two slots, the usual shape (cpu, mem)
            ((shift, field_mask, limit),) = rest
            if self.dispersed:  # keys ascend with -room of slot 1: stop at the first with too little
                for level in index.levels:
                    for key in level:
                        if key >= bound:
                            break
                        if key >> shift & field_mask <= limit:
                            return key & mask
            else:  # keys ascend with the room of slot 1: start at the first with enough
                for level in index.levels:
                    for pos in range(bisect_left(level, bound), len(level)):
                        key = level[pos]
                        if key >> shift & field_mask >= limit:
                            return key & mask
        elif self.dispersed:
            for level in index.levels:
                for key in level:
                    if key >= bound:
                        break
                    for shift, field_mask, limit in rest:
                        if key >> shift & field_mask > limit:
                            break
                    else:
                        return key & mask
        else:
            for level in index.levels:
                for pos in range(bisect_left(level, bound), len(level)):
                    key = level[pos]
                    for shift, field_mask, limit in rest:
                        if key >> shift & field_mask < limit:
                            break
                    else:
                        return key & mask
        prepared.failed_at = self.releases
        return None

    def take(self, prepared: Prepared) -> int | None:
        """`select`, then reserve the request on the agent found; its number, or None."""
        agent = self.select(prepared)
        if agent is None:
            return None
        room = self.room[agent]
        slots = prepared.slots
        self.changes += 1
        if self.dispersed:  # room holds -remaining; the agent has room (it was selected)
            for i, n in slots.items():
                room[i] += n
        else:
            for i, n in slots.items():
                room[i] -= n
        deltas = prepared.deltas
        for index in self._member_of[agent]:  # each key moves by what the request takes of its fields
            delta = deltas.get(index)
            if delta is None:
                delta = deltas[index] = index.delta(slots, self.dispersed)
            if delta:
                old = index.keys[agent]
                index.keys[agent] = key = old + delta
                held = index.where[agent]
                assert held is not None  # the agent is a member of each of its indexes
                del held[bisect_left(held, old)]
                held = index.level_of[agent] if index.alive(room) else index.dead
                assert held is not None
                insort(held, key)
                index.where[agent] = held
        return agent

    def reserve(self, agent: int, request: Mapping[int, int]) -> None:
        """Take `request` ({slot index: amount > 0}) from the agent's remaining room.

        The agent must have that room: keys are built on the remaining amounts staying between
        their bounds, so an agent that would be left with less than nothing is refused with
        ValueError rather than trusted."""
        room = self.room[agent]
        if self.dispersed:  # room holds -remaining
            for i, n in request.items():
                room[i] = value = room[i] + n
                if value > 0:
                    raise self._overcommitted(agent, i, -value)
        else:
            for i, n in request.items():
                room[i] = value = room[i] - n
                if value < 0:
                    raise self._overcommitted(agent, i, value)
        self._rekey(agent, room)

    def release(self, agent: int, request: Mapping[int, int]) -> None:
        """Give back what `reserve` took (a rolled-back tentative reservation)."""
        room = self.room[agent]
        step = -1 if self.dispersed else 1
        for i, n in request.items():
            room[i] += step * n
        self._rekey(agent, room)
        self.releases += 1  # room grew: requests that found no agent may fit now

    def capacity_of(self, agent: int) -> list[int]:
        """The agent's whole capacity per slot index (ints)."""
        return list(self._capacities[agent])

    def occupied_of(self, agent: int) -> dict[int, int]:
        """What the agent held when the round began, per slot index (ints, as converted: amounts <= 0 too); not to be
        changed."""
        return self._occupied[agent]

    def remaining(self, agent: int) -> list[int]:
        """The agent's remaining room per slot index (ints, as the table scales them)."""
        if self.dispersed:
            return [-n for n in self.room[agent]]
        return list(self.room[agent])

    def remaining_all(self) -> list[list[int]]:
        """Every agent's remaining room (as `remaining`, by agent number): new lists."""
        if self.dispersed:
            return [list(map(neg, room)) for room in self.room]
        return [room[:] for room in self.room]

    def set_remaining(self, agent: int, target: Sequence[int]) -> None:
        """Make the agent's remaining room `target` (per slot index, each >= 0): backfill keeps the room of a
        reservation out of the pool this way, and gives it back."""
        room = self.room[agent]
        sign = -1 if self.dispersed else 1
        grew = False
        for i, n in enumerate(target):
            if sign * room[i] != n:
                grew = grew or n > sign * room[i]
                room[i] = sign * n
        self._rekey(agent, room)
        if grew:
            self.releases += 1  # room grew: requests that found no agent may fit now

    def _overcommitted(self, agent: int, slot: int, remaining: int) -> ValueError:
        name = self.table.names[slot]
        return ValueError(f"agent {self.ids[agent]} would be left with {name} {self.table.fmt(slot, remaining)}")

    def _rekey(self, agent: int, room: list[int]) -> None:
        """The agent's room changed: move its key in every index it is in."""
        self.changes += 1
        for index in self._member_of[agent]:
            key = index.encode(room, agent)
            if key != index.keys[agent]:
                index.move(agent, key, room)

    def explain(self, prepared: Prepared) -> str:
        """Why `select` found nothing: no agents, a slot nobody offers, or the best one's shortfall (the same as
        the last time it was asked for this request, when nothing changed since)."""
        said = prepared.explained
        if said is not None and said[0] == self.changes:
            return said[1]
        msg = self._explain(prepared)
        prepared.explained = (self.changes, msg)
        return msg

    def _explain(self, prepared: Prepared) -> str:
        shape, amounts = prepared.shape, prepared.amounts
        if not self.ids:
            return f"no schedulable agent in scaling group {self.group}"
        names = self.table.names
        all_types = self.all_types
        for i in shape:
            if i not in all_types:
                missing = [names[i] for i in shape if i not in all_types]
                return f"no agent in scaling group {self.group} has {', '.join(missing)}"
        index = self._index(shape)
        mask = index.agent_mask
        # the key's fields above the agent's bits compare as the remaining amounts in priority order do (reversed
        # when dispersed): the best is the first level's with the most, slot by slot
        above = mask.bit_length()
        levels = index.levels if any(index.levels) else [index.dead]  # nobody alive: the rest
        found = -1
        if self.dispersed:
            for level in levels:
                if level:
                    head = level[0]
                    if found < 0 or head >> above < found >> above:
                        found = head
        else:
            for level in levels:
                if level:  # the most room is at the end; among equals, the lowest agent number
                    head = level[bisect_left(level, level[-1] & ~mask)]
                    if found < 0 or head >> above > found >> above:
                        found = head
        if found < 0:
            return f"no agent in scaling group {self.group} has all of {', '.join(names[i] for i in shape)}"
        best_agent = found & mask
        room = self.room[best_agent]
        best = [-room[i] for i in shape] if self.dispersed else [room[i] for i in shape]
        key = (best_agent, *best, *amounts)  # all the message says
        msg = index.messages.get(key)
        if msg is None:
            fmt = self.table.fmt
            short = [
                f"{names[i]} {fmt(i, have)} free of {fmt(i, want)} requested"
                for i, have, want in zip(shape, best, amounts)  # noqa: B905 (same lengths)
                if have < want
            ]
            msg = f"no agent has room: best is {self.ids[best_agent]} with {', '.join(short)}"
            if len(index.messages) >= 4096:
                index.messages.clear()
            index.messages[key] = msg
        return msg
