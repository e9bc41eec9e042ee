"""The bounds of a GraphQL request, checked before anything runs (`QueryRefused`: a 400 problem).

1. Before parsing (`scan`): the text's size, lone surrogates, number literals' length, and nesting (of
   selections, and of argument values and list types), with graphql-core's lexer: no input makes the
   parser recurse deeper than MAX_DEPTH.
2. After parsing (`count`): root fields (aliases count) and fields in all, fragments expanded.
3. With the variables (`check_arguments`): every argument of a known type is of that type, strings are
   bounded, `limit` is 1..MAX_PAGE_SIZE and `offset` >= 0 (graphql-core's own coercion would answer
   less precisely, or accept `20.0`).
"""

from __future__ import annotations

import re
from typing import Any

from graphql import (
    GraphQLError,
    GraphQLList,
    GraphQLNonNull,
    GraphQLSchema,
    GraphQLSyntaxError,
    Source,
    TypeInfo,
    TypeInfoVisitor,
    Visitor,
    get_named_type,
    parse,
    visit,
)
from graphql.language import (
    ArgumentNode,
    BooleanValueNode,
    DocumentNode,
    EnumValueNode,
    FieldNode,
    FloatValueNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    InlineFragmentNode,
    IntValueNode,
    Lexer,
    ListValueNode,
    NullValueNode,
    ObjectValueNode,
    OperationDefinitionNode,
    SelectionSetNode,
    StringValueNode,
    TokenKind,
    ValueNode,
    VariableNode,
)

MAX_QUERY_BYTES = 64 * 1024  # of query text (UTF-8)
MAX_DEPTH = 10  # levels of nested selections; also of nested argument values and list types
MAX_ROOT_FIELDS = 10  # each root field is a resolver run: aliases must not multiply them
MAX_FIELDS = 500  # selected fields in all, at every level
MAX_PAGE_SIZE = 100  # the largest `limit` of a paged list (the official client's MAX_PAGE_SIZE)
MAX_INT = 2**31 - 1  # GraphQL's Int is a signed 32-bit integer
MAX_STRING_ARG = 1024  # characters of a string argument (an id, a name, a status list, a filter)
_MAX_NUMBER_CHARS = 64  # longer number literals are refused before they are converted

_OPEN = {TokenKind.BRACE_L: "{", TokenKind.BRACKET_L: "[", TokenKind.PAREN_L: "("}
_CLOSE = {TokenKind.BRACE_R: "{", TokenKind.BRACKET_R: "[", TokenKind.PAREN_R: "("}
_SURROGATE_ESCAPE = re.compile(r"Invalid Unicode escape sequence: '\\u\{?0*[dD][89a-fA-F][0-9a-fA-F]{2}\}?'")
_LONE_SURROGATE = "a string in the query holds a lone surrogate (\\ud800-\\udfff), which is not text"


class QueryRefused(GraphQLError):
    """A request refused before it runs (too big, too deep, an invalid argument): a 400 problem."""


def _too_deep() -> QueryRefused:
    return QueryRefused(f"the query is nested too deeply: at most {MAX_DEPTH} levels are allowed")


def scan(query: str) -> None:
    """Refuse what must not reach the parser: too long, not text, nested too deeply, huge numbers."""
    if len(query) > MAX_QUERY_BYTES or len(query.encode("utf-8", "surrogatepass")) > MAX_QUERY_BYTES:
        raise QueryRefused(f"the query is too long: at most {MAX_QUERY_BYTES} bytes are allowed")
    try:
        query.encode()
    except UnicodeEncodeError:
        raise QueryRefused(_LONE_SURROGATE) from None
    lexer = Lexer(Source(query))
    stack: list[str] = []
    paren = -1  # where the open parenthesis is on the stack (arguments, variable definitions), or -1
    try:
        while (token := lexer.advance()).kind != TokenKind.EOF:
            kind = token.kind
            if kind in (TokenKind.INT, TokenKind.FLOAT) and len(token.value or "") > _MAX_NUMBER_CHARS:
                raise QueryRefused(f"a number in the query is too long: at most {_MAX_NUMBER_CHARS} characters")
            if kind in _OPEN:
                if kind == TokenKind.PAREN_L:
                    if paren >= 0:
                        raise GraphQLSyntaxError(lexer.source, token.start, "Unexpected '('.")
                    paren = len(stack)
                stack.append(_OPEN[kind])
                depth = len(stack) - paren - 1 if paren >= 0 else len(stack)
                if depth > MAX_DEPTH:
                    raise _too_deep()
            elif kind in _CLOSE:
                if not stack or stack[-1] != _CLOSE[kind]:
                    raise GraphQLSyntaxError(lexer.source, token.start, f"Unexpected '{token.kind.value}'.")
                stack.pop()
                if kind == TokenKind.PAREN_R:
                    paren = -1
    except GraphQLSyntaxError as e:
        raise syntax_error(e) from None


def syntax_error(e: GraphQLSyntaxError) -> GraphQLError:
    """A syntax error as the answer says it (an escaped lone surrogate in its own words)."""
    if _SURROGATE_ESCAPE.search(e.message) or "U+D" in e.message and "Invalid character within String" in e.message:
        return QueryRefused(_LONE_SURROGATE)
    return QueryRefused(e.message)


def parse_bounded(query: str) -> DocumentNode:
    """Scan, parse and count: a document within every bound, or QueryRefused."""
    scan(query)
    try:
        document = parse(query, no_location=False)
    except GraphQLSyntaxError as e:
        raise syntax_error(e) from None
    count(document)
    return document


def count(document: DocumentNode) -> None:
    """Root fields and fields in all, with fragments expanded (a spread is a level of its own)."""
    fragments = {d.name.value: d for d in document.definitions if isinstance(d, FragmentDefinitionNode)}
    total = 0

    def walk(selection_set: SelectionSetNode | None, depth: int, root: bool, seen: frozenset[str]) -> int:
        nonlocal total
        if selection_set is None:
            return 0
        if depth > MAX_DEPTH:
            raise _too_deep()
        here = 0
        for sel in selection_set.selections:
            total += 1
            if total > MAX_FIELDS:
                raise QueryRefused(f"too many fields selected: at most {MAX_FIELDS} are allowed in one query")
            if isinstance(sel, FieldNode):
                here += 1
                walk(sel.selection_set, depth + 1, False, seen)
            elif isinstance(sel, InlineFragmentNode):
                here += walk(sel.selection_set, depth + 1, root, seen)
            elif isinstance(sel, FragmentSpreadNode):
                name = sel.name.value
                if name in seen or name not in fragments:  # validation says what is wrong
                    continue
                here += walk(fragments[name].selection_set, depth + 1, root, seen | {name})
            if root and here > MAX_ROOT_FIELDS:
                raise QueryRefused(f"too many root fields (aliases included): at most {MAX_ROOT_FIELDS} are allowed")
        return here

    for definition in document.definitions:
        if isinstance(definition, OperationDefinitionNode):
            walk(definition.selection_set, 1, True, frozenset())


# -- arguments -----------------------------------------------------------------------------------------


def kind_of(value: Any) -> str:
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


class _Enum(str):
    """An enum literal where a scalar was expected."""


def _value(node: ValueNode, variables: dict[str, Any]) -> Any:
    if isinstance(node, VariableNode):
        return variables.get(node.name.value)
    if isinstance(node, IntValueNode):
        return int(node.value)
    if isinstance(node, FloatValueNode):
        return float(node.value)
    if isinstance(node, StringValueNode):
        return node.value
    if isinstance(node, BooleanValueNode):
        return node.value
    if isinstance(node, NullValueNode):
        return None
    if isinstance(node, ListValueNode):
        return [_value(v, variables) for v in node.values]
    if isinstance(node, ObjectValueNode):
        return {f.name.value: _value(f.value, variables) for f in node.fields}
    if isinstance(node, EnumValueNode):
        return _Enum(node.value)
    return None


STRING_TYPES = {"String", "ID", "UUID"}


def check_value(name: str, type_name: str, value: Any) -> None:
    """One argument's value against its declared (named) type; `limit`/`offset` against their range."""
    if value is None:
        return
    if type_name == "Int":
        low, high = (1, MAX_PAGE_SIZE) if name == "limit" else (0, MAX_INT) if name == "offset" else (-MAX_INT, MAX_INT)
        if isinstance(value, bool) or not isinstance(value, int) or isinstance(value, _Enum):
            raise QueryRefused(f"{name} must be an integer between {low} and {high}, not {kind_of(value)}")
        if not low <= value <= high:
            shown = str(value) if abs(value) < 10**20 else "a larger number"
            raise QueryRefused(f"{name} must be between {low} and {high}, not {shown}")
    elif type_name in STRING_TYPES:
        if not isinstance(value, str) or isinstance(value, _Enum):
            raise QueryRefused(
                f"{name} must be a string, not {'an enum value' if isinstance(value, _Enum) else kind_of(value)}"
            )
        if len(value) > MAX_STRING_ARG:
            raise QueryRefused(f"{name} is too long: at most {MAX_STRING_ARG} characters")
    elif type_name == "Boolean":
        if not isinstance(value, bool):
            raise QueryRefused(f"{name} must be true or false, not {kind_of(value)}")


def check_arguments(schema: GraphQLSchema, document: DocumentNode, variables: dict[str, Any]) -> None:
    """Every argument of a scalar type the schema knows, with the variables' values (QueryRefused)."""
    type_info = TypeInfo(schema)
    variables = dict(variables)
    for definition in document.definitions:  # a variable left out takes its default: checked the same
        if isinstance(definition, OperationDefinitionNode):
            for var in definition.variable_definitions or ():
                if var.default_value is not None and var.variable.name.value not in variables:
                    variables[var.variable.name.value] = _value(var.default_value, {})

    class Check(Visitor):
        def enter_argument(self, node: ArgumentNode, *_: Any) -> None:
            arg = type_info.get_argument()
            if arg is None:
                return  # an unknown argument: validation names it
            named = get_named_type(arg.type)
            value = _value(node.value, variables)
            if isinstance(value, list) and named.name in STRING_TYPES | {"Int", "Boolean"} and _is_list(arg.type):
                for item in value:
                    check_value(node.name.value, named.name, item)
                return
            check_value(node.name.value, named.name, value)

    visit(document, TypeInfoVisitor(type_info, Check()))


def _is_list(type_: Any) -> bool:
    while isinstance(type_, GraphQLNonNull):
        type_ = type_.of_type
    return isinstance(type_, GraphQLList)
