"""The GraphQL subset the official Backend.AI client sends (reference spec §2.10).

No GraphQL engine: a small parser for queries with variables, arguments, aliases and nested
selections, and resolvers for `keypair`, `compute_session_list` and `compute_session`. Every object
is projected onto exactly the requested fields, in the requested order (the client zips column
names with `item.values()`).

A query is bounded before it runs (`QueryRefused`, a 400): its text, its depth (selections and
argument values alike, so that no input makes the parser recurse without end), its number of root
fields and of fields in all; and every argument a resolver reads is checked for type and range.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

MAX_QUERY_BYTES = 64 * 1024  # of query text (UTF-8)
MAX_DEPTH = 10  # levels of nested selections; also of nested argument values and list types
MAX_ROOT_FIELDS = 10  # each root field is a resolver run: aliases must not multiply them
MAX_FIELDS = 500  # selected fields in all, at every level
MAX_PAGE_SIZE = 100  # the largest `limit` of a paged list (the official client's MAX_PAGE_SIZE)
MAX_INT = 2**31 - 1  # GraphQL's Int is a signed 32-bit integer
MAX_STRING_ARG = 1024  # characters of a string argument (an id, a name, a status list)
_MAX_NUMBER_CHARS = 64  # longer number literals are refused before they are converted

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<punct>\.\.\.|[{}()\[\]:!$=@])
      | (?P<string>"(?:[^"\\]|\\.)*")
      | (?P<number>-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)
      | (?P<name>[_A-Za-z][_0-9A-Za-z]*)
      | (?P<comma>,)
      | (?P<comment>\#[^\n]*)
    )""",
    re.VERBOSE,
)


class GraphQLError(Exception):
    """An error of a query, answered as GraphQL answers: `{"data": null, "errors": [...]}`."""


class QueryRefused(GraphQLError):
    """A query refused before it runs (too big, too deep, an invalid argument): a 400 problem."""


@dataclass
class Field:
    """A selected field of a GraphQL query, with its alias, arguments and sub-selections."""

    name: str
    alias: str
    args: dict[str, Any] = field(default_factory=dict)
    selections: list[Field] | None = None


@dataclass
class Variable:
    """A reference to a query variable (`$name`) in an argument."""

    name: str


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise GraphQLError(f"Syntax error at position {pos}: {text[pos : pos + 20]!r}")
        pos = m.end()
        kind = m.lastgroup
        if kind in ("comma", "comment"):
            continue
        out.append((kind, m.group(kind)))
    return out


def _too_deep() -> QueryRefused:
    return QueryRefused(f"the query is nested too deeply: at most {MAX_DEPTH} levels are allowed")


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = _tokens(text)
        self.i = 0
        self.fields = 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def at(self, value: str) -> bool:
        tok = self.peek()
        return tok is not None and tok[0] == "punct" and tok[1] == value

    def take(self, value: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (value is not None and tok[1] != value):
            raise GraphQLError(f"Syntax error: expected {value or 'more'}, got {tok[1] if tok else 'end of query'}")
        self.i += 1
        return tok[1]

    def take_name(self) -> str:
        tok = self.peek()
        if tok is None or tok[0] != "name":
            raise GraphQLError(f"Syntax error: expected a name, got {tok[1] if tok else 'end of query'}")
        self.i += 1
        return tok[1]

    def document(self) -> list[Field]:
        tok = self.peek()
        if tok and tok[0] == "name" and tok[1] in ("query", "mutation", "subscription"):
            if self.take() != "query":
                raise GraphQLError("Only queries are supported")
            if (nxt := self.peek()) and nxt[0] == "name":
                self.take()
            if self.at("("):
                self.variable_definitions()
        fields = self.selection_set(1)
        if self.peek() is not None:
            raise GraphQLError("Only one operation per request is supported")
        return fields

    def variable_definitions(self) -> None:
        self.take("(")
        while self.peek() and not self.at(")"):
            self.take("$")
            self.take_name()
            self.take(":")
            self.type_ref(1)
            if self.at("="):
                self.take("=")
                self.value(1)
        self.take(")")

    def type_ref(self, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise _too_deep()
        if self.at("["):
            self.take("[")
            self.type_ref(depth + 1)
            self.take("]")
        else:
            self.take_name()
        if self.at("!"):
            self.take("!")

    def selection_set(self, depth: int) -> list[Field]:
        if depth > MAX_DEPTH:
            raise _too_deep()
        self.take("{")
        fields = []
        while self.peek() and not self.at("}"):
            fields.append(self.field(depth))
            if depth == 1 and len(fields) > MAX_ROOT_FIELDS:
                raise QueryRefused(f"too many root fields (aliases included): at most {MAX_ROOT_FIELDS} are allowed")
        self.take("}")
        return fields

    def field(self, depth: int) -> Field:
        self.fields += 1
        if self.fields > MAX_FIELDS:
            raise QueryRefused(f"too many fields selected: at most {MAX_FIELDS} are allowed in one query")
        name = self.take_name()
        alias = name
        if self.at(":"):
            self.take(":")
            name = self.take_name()
        args = {}
        if self.at("("):
            self.take("(")
            while self.peek() and not self.at(")"):
                key = self.take_name()
                self.take(":")
                args[key] = self.value(1)
            self.take(")")
        selections = self.selection_set(depth + 1) if self.at("{") else None
        return Field(name, alias, args, selections)

    def value(self, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise _too_deep()
        kind, text = self.peek() or ("", "")
        if kind == "punct":
            if text == "$":
                self.take("$")
                return Variable(self.take_name())
            if text == "[":
                self.take("[")
                items = []
                while self.peek() and not self.at("]"):
                    items.append(self.value(depth + 1))
                self.take("]")
                return items
            if text == "{":
                self.take("{")
                obj = {}
                while self.peek() and not self.at("}"):
                    key = self.take_name()
                    self.take(":")
                    obj[key] = self.value(depth + 1)
                self.take("}")
                return obj
            raise GraphQLError(f"Syntax error: expected a value, got {text}")
        self.take()
        if kind == "string":
            return _string(text)
        if kind == "number":
            if len(text) > _MAX_NUMBER_CHARS:
                raise QueryRefused(f"a number in the query is too long: at most {_MAX_NUMBER_CHARS} characters")
            return float(text) if any(c in text for c in ".eE") else int(text)
        return {"true": True, "false": False, "null": None}.get(text, text)


def _string(text: str) -> str:
    try:
        value = json.loads(text)
    except ValueError:
        raise GraphQLError(f"Syntax error: invalid string {text[:40]!r}") from None
    try:
        value.encode()
    except UnicodeEncodeError:  # an escaped lone surrogate ("\ud800"): no text can hold it
        raise QueryRefused(
            "a string in the query holds a lone surrogate (\\ud800-\\udfff), which is not text"
        ) from None
    return value


def parse(query: str) -> list[Field]:
    if len(query) > MAX_QUERY_BYTES or len(query.encode("utf-8", "surrogatepass")) > MAX_QUERY_BYTES:
        raise QueryRefused(f"the query is too long: at most {MAX_QUERY_BYTES} bytes are allowed")
    return _Parser(query).document()


def argument(f: Field, name: str, variables: dict[str, Any], default: Any = None) -> Any:
    value = f.args.get(name, default)
    if isinstance(value, Variable):
        return variables.get(value.name, default)
    return value


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number with a fraction or an exponent"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def int_argument(f: Field, name: str, variables: dict[str, Any], default: int, minimum: int, maximum: int) -> int:
    """An Int argument in [minimum, maximum]; absent or null: `default`. Anything else is refused."""
    value = argument(f, name, variables)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise QueryRefused(f"{name} must be an integer between {minimum} and {maximum}, not {_kind(value)}")
    if not minimum <= value <= maximum:
        shown = str(value) if abs(value) < 10**20 else "a larger number"
        raise QueryRefused(f"{name} must be between {minimum} and {maximum}, not {shown}")
    return value


def str_argument(f: Field, name: str, variables: dict[str, Any]) -> str | None:
    """A String (or ID) argument; absent or null: None. Anything else is refused."""
    value = argument(f, name, variables)
    if value is None:
        return None
    if not isinstance(value, str):
        raise QueryRefused(f"{name} must be a string, not {_kind(value)}")
    if len(value) > MAX_STRING_ARG:
        raise QueryRefused(f"{name} is too long: at most {MAX_STRING_ARG} characters")
    return value


def page_arguments(f: Field, variables: dict[str, Any], default_limit: int = 20) -> tuple[int, int]:
    """`limit` (1..MAX_PAGE_SIZE) and `offset` (0..MAX_INT) of a paged list."""
    limit = int_argument(f, "limit", variables, default_limit, 1, MAX_PAGE_SIZE)
    offset = int_argument(f, "offset", variables, 0, 0, MAX_INT)
    return limit, offset


def project(value: Any, selections: list[Field] | None) -> Any:
    """Keep exactly the selected fields, in order; values may be callables computed on demand."""
    if callable(value):
        value = value()
    if selections is None or value is None:
        return value
    if isinstance(value, list):
        return [project(v, selections) for v in value]
    if not isinstance(value, dict):
        names = ", ".join(f"'{f.name}'" for f in selections) or "no field"
        raise GraphQLError(f"Cannot select {names} on a scalar value")
    out = {}
    for f in selections:
        if f.name == "__typename":
            out[f.alias] = value.get("__typename", "Object")
            continue
        if f.name not in value:
            raise GraphQLError(f"Cannot query field '{f.name}'")
        out[f.alias] = project(value[f.name], f.selections)
    return out
