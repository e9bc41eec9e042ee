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
sorted by the preference key (remaining amounts, then id). A dispersed pick reads the list from
the front and stops as soon as the first slot no longer fits; a concentrated pick bisects to the
first agent with enough of the first slot. Reserving moves one agent in each list it is in
(bisect + insert). Agents with less than the smallest request of the shape seen so far in some
slot (the "floor"; full agents, say) are left out of the lists until a smaller request or a
release brings them back, so scans do not step over them again and again. Requests that found
no agent are remembered per shape (by amounts, up to 1024) and fail at once, until something
is released.

`explain` names the "best" agent: the one ranked first by remaining room in priority order
(what dispersed would pick if it fitted) among the agents in the lists, or among all agents
offering the requested slots when none is left in the lists, and each slot it is short of.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from operator import itemgetter

from bai.common.slots import format_amount, is_bytes_slot

from .snapshot import CONCENTRATED, DEFAULT_RESOURCE_PRIORITY, DISPERSED, AgentState

# ({slot: amount > 0}, shape = requested slots in priority order, amounts aligned with shape)
Prepared = tuple[dict[int, int], tuple[int, ...], tuple[int, ...]]

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

    __slots__ = ("index", "names", "digits", "_scales", "_seen", "_shown", "_overrides")

    def __init__(self, digits: Mapping[str, int] | None = None) -> None:
        self.index: dict[str, int] = {}
        self.names: list[str] = []
        self.digits: list[int] = []
        self._scales: list[Decimal] = []
        self._seen: list[dict[Decimal, int]] = []  # per slot: amounts already converted
        self._shown: dict[tuple[int, int], str] = {}  # formatted amounts, for messages
        self._overrides = dict(digits or {})

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


def priority_key(priority: Sequence[str]):
    """Sort key for slot names: by device (the part before the first dot) in priority order."""
    rank = {device: n for n, device in enumerate(priority)}
    last = len(priority)

    def key(name: str) -> tuple[int, str]:
        return rank.get(name.split(".", 1)[0], last), name

    return key


def _key_maker(shape: tuple[int, ...]):
    """(room, agent) -> the agent's sort key for this shape: its room in the shape's slots, agent."""
    if not shape:
        return lambda room, agent: (agent,)
    if len(shape) == 1:
        (slot,) = shape
        return lambda room, agent: (room[slot], agent)
    get = itemgetter(*shape)
    return lambda room, agent: (*get(room), agent)


def _alive_maker(limits: tuple[int, ...], dispersed: bool):
    """entry -> whether the agent still has at least `limits` (signed like the entries) of every slot."""
    n = len(limits)
    if n == 0:
        return lambda entry: True
    if dispersed:  # entries hold -room: alive when -room_j <= -floor_j
        if n == 1:
            (a,) = limits
            return lambda entry: entry[0] <= a
        if n == 2:
            a, b = limits
            return lambda entry: entry[0] <= a and entry[1] <= b
        return lambda entry: all(x <= y for x, y in zip(entry, limits, strict=False))  # entry is longer
    if n == 1:
        (a,) = limits
        return lambda entry: entry[0] >= a
    if n == 2:
        a, b = limits
        return lambda entry: entry[0] >= a and entry[1] >= b
    return lambda entry: all(x >= y for x, y in zip(entry, limits, strict=False))


class _ShapeIndex:
    """The candidate agents for one request shape: one sorted list per extras count.

    Only *alive* agents are in the lists: those with at least the shape's floor (per slot, the
    smallest amount of the requests prepared so far; 1 unit before any) of every slot. The
    others cannot take any of those requests: they wait, in the same order, in `dead` (read to
    explain a failure), until a release or a smaller request brings them back.
    """

    __slots__ = (
        "shape",
        "key",
        "alive",
        "levels",
        "level_of",
        "dead",
        "dead_agents",
        "keys",
        "failed",
        "version",
        "messages",
    )

    def __init__(self, shape: tuple[int, ...], floor: tuple[int, ...], dispersed: bool) -> None:
        self.shape = shape
        self.key = _key_maker(shape)
        self.alive = _alive_maker(tuple(-f for f in floor) if dispersed else floor, dispersed)
        self.levels: list[list[tuple[int, ...]]] = []  # ascending extras
        self.level_of: dict[int, list[tuple[int, ...]]] = {}  # member agent -> its level
        self.dead: list[tuple[int, ...]] = []
        self.dead_agents: set[int] = set()
        self.keys: dict[int, tuple[int, ...]] = {}  # member agent -> its entry (alive or dead)
        self.failed: set[tuple[int, ...]] = set()  # requests known not to fit anywhere
        self.version = 0  # bumped on every change of an entry
        self.messages: dict[tuple[int, ...], tuple[int, str]] = {}

    def set_floor(self, floor: tuple[int, ...], dispersed: bool) -> None:
        """A lower floor: agents that now reach it come back into their lists."""
        self.alive = alive = _alive_maker(tuple(-f for f in floor) if dispersed else floor, dispersed)
        still = []
        for entry in self.dead:
            if alive(entry):
                agent = entry[-1]
                insort(self.level_of[agent], entry)
                self.dead_agents.discard(agent)
            else:
                still.append(entry)
        self.dead = still
        self.version += 1


class AgentPool:
    """The schedulable agents of one scaling group, with their remaining room, as ints.

    `select` picks an agent for a request, `reserve` / `release` move room, `explain` says why a
    request found no agent. Agents are numbered 0..n-1 in id order, so the number doubles as
    the final tie-break. The caller's `AgentState` objects are only read.

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
        converted = [(table.convert(a.capacity), table.convert(a.occupied)) for a in ordered]
        width = len(table.names)  # every slot an agent has; requests only use slots of their agent
        sign = -1 if self.dispersed else 1
        self.room: list[list[int]] = []
        self.types: list[frozenset[int]] = []
        self.capacity: dict[int, int] = {}  # group total, for DRF
        for capacity, occupied in converted:
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
        self._indexes: dict[tuple[int, ...], _ShapeIndex] = {}
        # per agent: the shape indexes it is in, with its level list there
        self._member_of: list[list[tuple[_ShapeIndex, list[tuple[int, ...]]]]] = [[] for _ in ordered]
        self.shapes: dict[tuple[int, ...], tuple[int, ...]] = {}
        self._prepared: dict[tuple, Prepared] = {}
        self.floors: dict[tuple[int, ...], tuple[int, ...]] = {}  # per shape, see `expect`

    def __len__(self) -> int:
        return len(self.ids)

    def free(self, agent: int) -> dict[str, Decimal]:
        """An agent's remaining room, as Decimals (for tests and messages)."""
        sign = -1 if self.dispersed else 1
        table = self.table
        return {table.names[i]: table.to_decimal(i, sign * n) for i, n in enumerate(self.room[agent])}

    # -- shapes and keys ---------------------------------------------------------------------

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
        """A request as `select` wants it: ({slot: amount > 0}, shape, amounts). Cached: never mutate."""
        try:
            key = tuple(slots.items())
            hit = self._prepared.get(key)
        except TypeError:  # an unhashable amount: convert() will say what is wrong with it
            key, hit = None, None
        if hit is None:
            hit = self.prepare_ints(self.table.convert(slots, True))
            if key is not None:
                if len(self._prepared) >= 65536:
                    self._prepared.clear()
                self._prepared[key] = hit
        return hit

    def prepare_ints(self, request: dict[int, int]) -> Prepared:
        """Like `prepare`, from {slot index: amount > 0}; not cached."""
        shape = self.shapes.get(tuple(request)) or self.shape_of(request)
        prepared = request, shape, tuple(map(request.__getitem__, shape))
        self._expect(shape, prepared[2])
        return prepared

    def _expect(self, shape: tuple[int, ...], amounts: tuple[int, ...]) -> None:
        """Lower the shape's floor to cover this request (see `_ShapeIndex`)."""
        floor = self.floors.get(shape)
        lower = amounts if floor is None else tuple(map(min, floor, amounts))
        if lower != floor:
            self.floors[shape] = lower
            index = self._indexes.get(shape)
            if index is not None:
                index.set_floor(lower, self.dispersed)

    def _index(self, shape: tuple[int, ...]) -> _ShapeIndex:
        index = self._indexes.get(shape)
        if index is not None:
            return index
        index = _ShapeIndex(shape, self.floors.get(shape) or (1,) * len(shape), self.dispersed)
        key = index.key
        alive = index.alive
        wanted = frozenset(shape)
        by_extras: dict[int, list[tuple[int, ...]]] = {}
        for agent, types in enumerate(self.types):
            if wanted <= types:
                level = by_extras.setdefault(len(types - wanted), [])
                entry = key(self.room[agent], agent)
                if alive(entry):
                    level.append(entry)
                else:
                    index.dead.append(entry)
                    index.dead_agents.add(agent)
                index.keys[agent] = entry
                index.level_of[agent] = level
                self._member_of[agent].append((index, level))
        for extras in sorted(by_extras):
            level = by_extras[extras]
            level.sort()
            index.levels.append(level)
        index.dead.sort()
        self._indexes[shape] = index
        return index

    # -- the operations ----------------------------------------------------------------------

    def select(self, shape: tuple[int, ...], amounts: tuple[int, ...]) -> int | None:
        """The best agent (its number) for `amounts` (aligned with `shape`), or None.

        Only for requests that went through `prepare` / `prepare_ints`: the pool leaves out of
        its scans the agents with less than every request prepared so far.
        """
        index = self._indexes.get(shape) or self._index(shape)
        if amounts in index.failed:
            return None
        n = len(shape)
        if n == 0:
            for level in index.levels:
                if level:
                    return level[0][0]
            return None
        if self.dispersed:
            # entries are (-room_1, ..., -room_n, agent): fits when -room_j <= -amount_j
            first = -amounts[0]
            if n == 1:
                for level in index.levels:
                    if level and level[0][0] <= first:
                        return level[0][1]
            else:
                second = -amounts[1]
                for level in index.levels:
                    for entry in level:
                        if entry[0] > first:
                            break  # sorted: nobody further on has enough of the first slot
                        if entry[1] <= second:
                            if n == 2:
                                return entry[2]
                            for j in range(2, n):
                                if entry[j] > -amounts[j]:
                                    break
                            else:
                                return entry[n]
        else:
            probe = (amounts[0],)
            for level in index.levels:
                size = len(level)
                pos = bisect_left(level, probe)
                while pos < size:
                    entry = level[pos]
                    if n == 1:
                        return entry[1]
                    if entry[1] >= amounts[1]:
                        if n == 2:
                            return entry[2]
                        for j in range(2, n):
                            if entry[j] < amounts[j]:
                                break
                        else:
                            return entry[n]
                    pos += 1
        if len(index.failed) >= _FAILED_MEMO:
            index.failed.clear()
        index.failed.add(amounts)
        return None

    def _move(self, agent: int, request: Mapping[int, int], delta: int) -> None:
        room = self.room[agent]
        for i, n in request.items():
            room[i] += delta * n
        for index, level in self._member_of[agent]:
            keys = index.keys
            was = index.dead if agent in index.dead_agents else level
            del was[bisect_left(was, keys[agent])]
            keys[agent] = entry = index.key(room, agent)
            if index.alive(entry):
                insort(level, entry)
                index.dead_agents.discard(agent)
            else:
                insort(index.dead, entry)
                index.dead_agents.add(agent)
            index.version += 1

    def reserve(self, agent: int, request: Mapping[int, int]) -> None:
        """Take `request` ({slot index: amount}) from the agent's remaining room."""
        self._move(agent, request, 1 if self.dispersed else -1)

    def release(self, agent: int, request: Mapping[int, int]) -> None:
        """Give back what `reserve` took (a rolled-back tentative reservation)."""
        self._move(agent, request, -1 if self.dispersed else 1)
        for index in self._indexes.values():  # room grew: old failures may fit now
            index.failed.clear()

    def explain(self, shape: tuple[int, ...], amounts: tuple[int, ...]) -> str:
        """Why `select` found nothing: no agents, a slot nobody offers, or the best one's shortfall."""
        if not self.ids:
            return f"no schedulable agent in scaling group {self.group}"
        names = self.table.names
        missing = [names[i] for i in shape if i not in self.all_types]
        if missing:
            return f"no agent in scaling group {self.group} has {', '.join(missing)}"
        index = self._indexes.get(shape) or self._index(shape)
        cached = index.messages.get(amounts)
        if cached is not None and cached[0] == index.version:
            return cached[1]
        best: tuple[int, ...] | None = None
        best_agent = -1
        for level in index.levels if any(index.levels) else [index.dead]:  # nobody alive: the rest
            if not level:
                continue
            if self.dispersed:
                entry = level[0]
                room = tuple(-x for x in entry[:-1])
            else:  # the most room is at the end; among equals, the lowest agent number
                room = level[-1][:-1]
                entry = level[bisect_left(level, room)]
            if best is None or room > best:
                best, best_agent = room, entry[-1]
        if best is None:
            msg = f"no agent in scaling group {self.group} has all of {', '.join(names[i] for i in shape)}"
        else:
            fmt = self.table.fmt
            short = [
                f"{names[i]} {fmt(i, have)} free of {fmt(i, want)} requested"
                for i, have, want in zip(shape, best, amounts, strict=True)
                if have < want
            ]
            msg = f"no agent has room: best is {self.ids[best_agent]} with {', '.join(short)}"
        if len(index.messages) > 256:
            index.messages.clear()
        index.messages[amounts] = (index.version, msg)
        return msg
