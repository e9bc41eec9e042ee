"""The GraphQL subset the official Backend.AI client sends (reference spec §2.10).

No GraphQL engine: a small parser for queries with variables, arguments, aliases and nested
selections, and resolvers for `keypair`, `compute_session_list` and `compute_session`. Every object
is projected onto exactly the requested fields, in the requested order (the client zips column
names with `item.values()`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

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
    pass


@dataclass
class Field:
    name: str
    alias: str
    args: dict[str, Any] = field(default_factory=dict)
    selections: list[Field] | None = None


@dataclass
class Variable:
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


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = _tokens(text)
        self.i = 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, value: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (value is not None and tok[1] != value):
            raise GraphQLError(f"Syntax error: expected {value or 'more'}, got {tok[1] if tok else 'end of query'}")
        self.i += 1
        return tok[1]

    def document(self) -> list[Field]:
        tok = self.peek()
        if tok and tok[0] == "name" and tok[1] in ("query", "mutation", "subscription"):
            if self.take() != "query":
                raise GraphQLError("Only queries are supported")
            if (nxt := self.peek()) and nxt[0] == "name":
                self.take()
            if (nxt := self.peek()) and nxt[1] == "(":
                self.variable_definitions()
        fields = self.selection_set()
        if self.peek() is not None:
            raise GraphQLError("Only one operation per request is supported")
        return fields

    def variable_definitions(self) -> None:
        self.take("(")
        while self.peek() and self.peek()[1] != ")":
            self.take("$")
            self.take()
            self.take(":")
            self.type_ref()
            if self.peek() and self.peek()[1] == "=":
                self.take("=")
                self.value()
        self.take(")")

    def type_ref(self) -> None:
        if self.peek() and self.peek()[1] == "[":
            self.take("[")
            self.type_ref()
            self.take("]")
        else:
            self.take()
        if self.peek() and self.peek()[1] == "!":
            self.take("!")

    def selection_set(self) -> list[Field]:
        self.take("{")
        fields = []
        while self.peek() and self.peek()[1] != "}":
            fields.append(self.field())
        self.take("}")
        return fields

    def field(self) -> Field:
        name = self.take()
        alias = name
        if self.peek() and self.peek()[1] == ":":
            self.take(":")
            name = self.take()
        args = {}
        if self.peek() and self.peek()[1] == "(":
            self.take("(")
            while self.peek() and self.peek()[1] != ")":
                key = self.take()
                self.take(":")
                args[key] = self.value()
            self.take(")")
        selections = self.selection_set() if self.peek() and self.peek()[1] == "{" else None
        return Field(name, alias, args, selections)

    def value(self) -> Any:
        kind, text = self.peek() or ("", "")
        if text == "$":
            self.take("$")
            return Variable(self.take())
        if text == "[":
            self.take("[")
            items = []
            while self.peek() and self.peek()[1] != "]":
                items.append(self.value())
            self.take("]")
            return items
        self.take()
        if kind == "string":
            return json.loads(text)
        if kind == "number":
            return float(text) if any(c in text for c in ".eE") else int(text)
        return {"true": True, "false": False, "null": None}.get(text, text)


def parse(query: str) -> list[Field]:
    return _Parser(query).document()


def argument(f: Field, name: str, variables: dict[str, Any], default: Any = None) -> Any:
    value = f.args.get(name, default)
    if isinstance(value, Variable):
        return variables.get(value.name, default)
    return value


def project(value: Any, selections: list[Field] | None) -> Any:
    """Keep exactly the selected fields, in order; values may be callables computed on demand."""
    if callable(value):
        value = value()
    if selections is None or value is None:
        return value
    if isinstance(value, list):
        return [project(v, selections) for v in value]
    out = {}
    for f in selections:
        if f.name == "__typename":
            out[f.alias] = value.get("__typename", "Object")
            continue
        if f.name not in value:
            raise GraphQLError(f"Cannot query field '{f.name}'")
        out[f.alias] = project(value[f.name], f.selections)
    return out
