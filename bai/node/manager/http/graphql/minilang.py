"""The `filter` and `order` of Backend.AI's paginated lists ("minilang"), over projected items.

Filter: `FIELD OP VALUE` with OP one of `==`, `!=`, `<`, `>`, `<=`, `>=`, `like`, `ilike`, `in`,
`is`, `isnot`, `contains`; VALUE a string ("…" or '…'), a number, `true`, `false`, `null` or a list
`[v, …]`; combined with `&` (and), `|` (or) and parentheses. `like` patterns use `%` and `_`.
Order: `FIELD`, `+FIELD` or `-FIELD` (descending), comma-separated.

A small recursive-descent parser over a bounded text (the argument is at most 1024 characters; nesting
is bounded too); anything it does not understand is a MinilangError, which the schema answers as a
GraphQL error. Only the type's own fields may be named.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

MAX_NESTING = 16

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
      | (?P<number>-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)
      | (?P<op>==|!=|<=|>=|<|>|&|\||\(|\)|\[|\]|,)
      | (?P<name>[A-Za-z_][A-Za-z0-9_.]*)
    )""",
    re.VERBOSE,
)
_WORD_OPS = {"like", "ilike", "in", "is", "isnot", "contains", "notin"}


class MinilangError(ValueError):
    """A filter or order expression that does not parse, or names an unknown field."""


Predicate = Callable[[dict[str, Any]], bool]


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise MinilangError(f"cannot parse the filter at position {pos}: {text[pos : pos + 20]!r}")
        pos = m.end()
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
    return out


def _unquote(text: str) -> str:
    body = text[1:-1]
    return re.sub(r"\\(.)", r"\1", body)


class _Parser:
    def __init__(self, text: str, fields: set[str]) -> None:
        self.tokens = _tokens(text)
        self.i = 0
        self.fields = fields

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self) -> tuple[str, str]:
        tok = self.peek()
        if tok is None:
            raise MinilangError("the filter ends too early")
        self.i += 1
        return tok

    def expect(self, value: str) -> None:
        tok = self.take()
        if tok[1] != value:
            raise MinilangError(f"expected {value!r} in the filter, got {tok[1]!r}")

    def expr(self, depth: int) -> Predicate:
        if depth > MAX_NESTING:
            raise MinilangError(f"the filter is nested too deeply (at most {MAX_NESTING} levels)")
        left = self.term(depth)
        while (tok := self.peek()) and tok[1] in ("&", "|"):
            self.take()
            right = self.term(depth)
            left = _and(left, right) if tok[1] == "&" else _or(left, right)
        return left

    def term(self, depth: int) -> Predicate:
        tok = self.peek()
        if tok and tok[1] == "(":
            self.take()
            inner = self.expr(depth + 1)
            self.expect(")")
            return inner
        return self.comparison()

    def comparison(self) -> Predicate:
        kind, name = self.take()
        if kind != "name":
            raise MinilangError(f"expected a field name in the filter, got {name!r}")
        if name not in self.fields:
            raise MinilangError(f"unknown field in the filter: {name!r}")
        kind, op = self.take()
        op = op.lower() if kind == "name" else op
        if kind == "name" and op not in _WORD_OPS or kind == "op" and op not in ("==", "!=", "<", ">", "<=", ">="):
            raise MinilangError(f"unknown operator in the filter: {op!r}")
        value = self.value()
        return _compare(name, op, value)

    def value(self) -> Any:
        kind, text = self.take()
        if kind == "string":
            return _unquote(text)
        if kind == "number":
            return float(text) if any(c in text for c in ".eE") else int(text)
        if kind == "name" and text.lower() in ("true", "false", "null", "none"):
            return {"true": True, "false": False}.get(text.lower())
        if text == "[":
            items = []
            while (tok := self.peek()) and tok[1] != "]":
                items.append(self.value())
                if (tok := self.peek()) and tok[1] == ",":
                    self.take()
            self.expect("]")
            return items
        raise MinilangError(f"expected a value in the filter, got {text!r}")


def _and(a: Predicate, b: Predicate) -> Predicate:
    return lambda item: a(item) and b(item)


def _or(a: Predicate, b: Predicate) -> Predicate:
    return lambda item: a(item) or b(item)


def _like(pattern: str, flags: int = 0) -> re.Pattern[str]:
    out = []
    for ch in pattern:
        out.append(".*" if ch == "%" else "." if ch == "_" else re.escape(ch))
    return re.compile("".join(out), flags | re.DOTALL)


def _comparable(a: Any, b: Any) -> tuple[Any, Any] | None:
    """Both sides as numbers when both are, else as text; None when either is missing."""
    if a is None or b is None:
        return None
    if isinstance(a, bool) or isinstance(b, bool):
        return (str(a).lower(), str(b).lower())
    if isinstance(b, int | float) and not isinstance(a, int | float):
        try:
            return (float(a), float(b))
        except (TypeError, ValueError):
            return (str(a), str(b))
    if isinstance(a, int | float) and isinstance(b, int | float):
        return (a, b)
    return (str(a), str(b))


def _compare(name: str, op: str, value: Any) -> Predicate:
    if op in ("like", "ilike"):
        if not isinstance(value, str):
            raise MinilangError(f"{op} takes a string pattern")
        pattern = _like(value, re.IGNORECASE if op == "ilike" else 0)
        return lambda item: item.get(name) is not None and pattern.fullmatch(str(item.get(name))) is not None
    if op in ("in", "notin"):
        if not isinstance(value, list):
            raise MinilangError(f"{op} takes a list: [a, b]")
        wanted = [v for v in value]

        def inside(item: dict[str, Any]) -> bool:
            found = any((pair := _comparable(item.get(name), v)) is not None and pair[0] == pair[1] for v in wanted)
            return found if op == "in" else not found

        return inside
    if op == "contains":
        return lambda item: value is not None and _contains(item.get(name), value)
    if op in ("is", "isnot") or value is None:
        if op in ("is", "==") or op == "is":
            return lambda item: item.get(name) == value if value is not None else item.get(name) is None
        if op in ("isnot", "!="):
            return lambda item: item.get(name) != value if value is not None else item.get(name) is not None
        return lambda item: False

    def cmp(item: dict[str, Any]) -> bool:
        pair = _comparable(item.get(name), value)
        if pair is None:
            return op == "!="
        a, b = pair
        try:
            holds: bool = {
                "==": a == b,
                "!=": a != b,
                "<": a < b,
                ">": a > b,
                "<=": a <= b,
                ">=": a >= b,
            }[op]
            return holds
        except TypeError:
            return False

    return cmp


def _contains(have: Any, value: Any) -> bool:
    if isinstance(have, list):
        return any(str(h) == str(value) for h in have)
    return have is not None and str(value) in str(have)


def parse_filter(text: str, fields: Iterable[str]) -> Predicate:
    parser = _Parser(text, set(fields))
    if not parser.tokens:
        return lambda item: True
    predicate = parser.expr(1)
    if parser.peek() is not None:
        raise MinilangError(f"unexpected {parser.peek()[1]!r} in the filter")  # type: ignore[index]
    return predicate


def parse_order(text: str, fields: Iterable[str]) -> list[tuple[str, bool]]:
    """[(field, descending)] of an order expression such as `-created_at,name`."""
    known = set(fields)
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        descending = part.startswith("-")
        name = part.lstrip("+-").strip()
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise MinilangError(f"cannot parse the order: {part!r}")
        if name not in known:
            raise MinilangError(f"unknown field in the order: {name!r}")
        out.append((name, descending))
    if not out:
        raise MinilangError("the order names no field")
    return out


def _sort_key(value: Any) -> tuple[int, Any]:
    if value is None:
        return (0, "")
    if isinstance(value, bool):
        return (1, int(value))
    if isinstance(value, int | float):
        return (1, value)
    return (2, str(value))


def sort(items: list[dict[str, Any]], order: list[tuple[str, bool]]) -> list[dict[str, Any]]:
    """Stable sorts, last key first, so the first key decides."""
    out = list(items)
    for name, descending in reversed(order):
        out.sort(key=lambda item: _sort_key(item.get(name)), reverse=descending)
    return out
