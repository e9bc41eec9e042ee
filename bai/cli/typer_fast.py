"""Two measured costs of typer (0.29) that bai's commands need not pay; the output stays the same.

- Values: typer coerces every parameter's value through a pydantic `TypeAdapter`, built when a
  command's parameters are parsed, given or not, so every command imports pydantic (about 110 ms of
  CPU). `plain_string_values` answers without pydantic the values whose coercion is plain: a `str` or
  `list[str]` parameter given strings, a `bool` one given a bool (the identity: typer's adapter is
  `str(value)` then pydantic's str check); an `int` or `float` one (ranged or not, not clamped) given a
  number or a plainly written one ("42", " -7 ", "0.5", "1e3"; pydantic reads those so too) within its
  range; a `Path` one (and `list[...]` of all these), through typer's own path checks. Every other
  value (an error to report, "1_000", "inf", a choice, a date) goes to typer's own adapter, built then,
  so what is accepted and what an error says stay typer's.
- Help and usage errors: `typer.rich_utils` imports `rich.markdown` (markdown-it, pygments) and
  `rich.traceback` (pygments, rich.pretty) at its top, about 130 ms, for help in "markdown" markup
  mode and for pretty tracebacks, which bai uses neither of. `light_rich_help` lets that module
  import with stand-ins for the two names it takes from them (`Markdown`, `Traceback`), each loading
  the real class when first used; the real modules stay importable as ever.

Both check that typer is the shape they expect and otherwise leave it alone (slower, same output).

One change of what help prints, `plain_placeholders`: typer 0.29 shows a type for every parameter
(`--json <bool>`, `--cpu <str>`, `IMAGE <str>`) and braces for required arguments in the usage line
(`{image} [args]...`). bai's help shows no type for flags and arguments, a value's placeholder in
capitals (`--cpu CPU`, `--tail N`, or the option's own metavar), and arguments as `IMAGE [ARGS]...`.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_DEFERRED = {"rich.markdown": "Markdown", "rich.traceback": "Traceback"}


def install() -> None:
    plain_string_values()
    light_rich_help()
    plain_placeholders()


def plain_placeholders() -> bool:
    """Help without type noise (see the module's doc); True if installed (or already)."""
    try:
        from typer.core import TyperArgument, TyperOption
    except ImportError:
        return False
    if getattr(TyperOption.display_type_rich, "bai_plain", False):
        return True
    if not all(hasattr(TyperArgument, a) for a in ("display_name_raw", "_usage_display_name", "display_type_rich")):
        return False

    def option_type(self: Any, ctx: Any) -> str | None:
        if self.is_flag or self.count:
            return None
        if self.metavar is not None:
            return self.metavar
        return _placeholder(self)

    def argument_type(self: Any, ctx: Any) -> str | None:
        return None  # the argument's name (in capitals) says it

    def argument_name(self: Any) -> str:
        return self.metavar if self.metavar is not None else (self.name or "").upper()

    def argument_usage(self: Any) -> str:
        name = self.display_name_raw if self.required else f"[{self.display_name_raw}]"
        return name + ("..." if self.nargs != 1 else "")

    option_type.bai_plain = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = option_type
    TyperArgument.display_type_rich = argument_type
    TyperArgument.display_name_raw = property(argument_name)
    TyperArgument._usage_display_name = argument_usage
    return True


def _placeholder(option: Any) -> str:
    """`N` for a number, `PATH` for a path, else the option's long name in capitals (`--cpu CPU`)."""
    descriptor = getattr(option, "type_descriptor", None)
    annotation = getattr(descriptor, "annotation", None)
    if annotation in (int, float) or getattr(descriptor, "is_ranged", False):
        return "N"
    if getattr(descriptor, "is_path", False):
        return "PATH"
    longs = [o for o in option.opts if o.startswith("--")]
    return (longs[0][2:] if longs else option.name or "value").upper()


def plain_string_values() -> bool:
    """Coerce plain values (see the module's doc) without pydantic; True if installed (or already)."""
    try:
        from typer import _coercion, core
    except ImportError:
        return False
    original = getattr(core, "build_runtime_param", None)
    base = getattr(_coercion, "RuntimeParam", None)
    if original is None or base is None or getattr(original, "bai_plain_strings", False):
        return original is not None and getattr(original, "bai_plain_strings", False)

    @dataclass(frozen=True)
    class PlainValues(base):  # type: ignore[misc, valid-type]
        """Plain values as `plain_value` reads them; anything else, typer's way.

        typer builds a parameter's coercion before it looks at the value, even a missing one (None,
        which never reaches `_coerce_value`): here typer's adapter is built only for a value that needs it."""

        descriptor: Any = field(default=None, compare=False)
        typers: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            plain = plain_value(self.annotation, self.parameter_info, value, param, ctx)
            if plain is not TYPERS:
                return plain
            if "own" not in self.typers:
                self.typers["own"] = original(self.descriptor)
            return self.typers["own"]._coerce_value(value, param=param, ctx=ctx)

    def build_runtime_param(descriptor: Any) -> Any:
        if descriptor.file_annotation is None and getattr(descriptor.parameter_info, "parser", None) is None:
            return PlainValues(
                parameter_info=descriptor.parameter_info, annotation=descriptor.annotation, descriptor=descriptor
            )
        return original(descriptor)

    build_runtime_param.bai_plain_strings = True  # type: ignore[attr-defined]
    core.build_runtime_param = build_runtime_param
    return True


TYPERS: Any = object()  # plain_value's answer for a value it leaves to typer's own adapter
_BLANKS = " \t\n\r"  # what pydantic strips around a number written as text (and more, left to it)


def plain_value(annotation: Any, info: Any, value: Any, param: Any, ctx: Any) -> Any:
    """What typer's adapter makes of `value` for a parameter of `annotation` (its ParameterInfo `info`), where
    that is plain; else TYPERS."""
    kind = type(value)
    if annotation is str or annotation is bool:
        return value if kind is annotation else TYPERS
    if annotation is int or annotation is float:
        return _number(annotation, info, value)
    if isinstance(annotation, type) and issubclass(annotation, Path):
        return _path(annotation, info, value, param, ctx)
    if getattr(annotation, "__origin__", None) is list and kind in (list, tuple):
        (item,) = annotation.__args__
        items = [plain_value(item, info, v, param, ctx) for v in value]
        return TYPERS if any(i is TYPERS for i in items) else items
    return TYPERS


def _number(annotation: type, info: Any, value: Any) -> Any:
    """An int or float within the parameter's range, from a number or a plainly written one; else TYPERS."""
    if getattr(info, "clamp", False):
        return TYPERS
    kind = type(value)
    number: Any
    if kind is annotation:
        number = value
    elif kind is int and annotation is float:
        number = float(value)
    elif kind is str:
        number = _written_number(annotation, value.strip(_BLANKS))
        if number is None:
            return TYPERS
    else:
        return TYPERS
    low, high = getattr(info, "min", None), getattr(info, "max", None)
    if number != number or (low is not None and number < low) or (high is not None and number > high):
        return TYPERS  # (NaN, or out of range: typer's message says so)
    return number


def _written_number(annotation: type, text: str) -> int | float | None:
    """`text` as an int (ASCII digits with a sign) or a float (digits, a point, an exponent), else None."""
    digits = text[1:] if text[:1] in ("+", "-") else text
    if len(text) > 100:
        return None  # (left to pydantic: int() refuses over 4300 digits, pydantic may not)
    if digits.isascii() and digits.isdigit():
        return annotation(text)  # type: ignore[no-any-return]
    if annotation is not float or not digits.isascii():
        return None
    mantissa, _, exponent = digits.lower().partition("e")
    whole, point, fraction = mantissa.partition(".")
    if not (whole or fraction) or not all(p.isdigit() for p in (whole, fraction) if p):
        return None
    if "e" in digits.lower():
        power = exponent[1:] if exponent[:1] in ("+", "-") else exponent
        if not power.isdigit():
            return None
    return float(text)


def _path(annotation: type, info: Any, value: Any, param: Any, ctx: Any) -> Any:
    """A Path parameter's value (text or a Path: a default) through typer's own checks (exists, file_okay …),
    made a Path as pydantic does (Path(text)) first; else TYPERS (an error, said by typer's adapter as ever)."""
    path_type = getattr(info, "path_type", None) or annotation
    if path_type is not Path or not isinstance(value, str | Path):
        return TYPERS
    try:
        from typer._param_types import coerce_cli_path

        return coerce_cli_path(Path(value), info, path_type=path_type, param=param, ctx=ctx)
    except Exception:
        return TYPERS


def light_rich_help() -> None:
    """Import `typer.rich_utils`, when typer first needs it, without rich.markdown and rich.traceback."""
    if "typer.rich_utils" in sys.modules:  # (imported already: only the text fix)
        _text_as_written(sys.modules["typer.rich_utils"])
        return
    if any(isinstance(f, _RichUtilsFinder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _RichUtilsFinder())


class _RichUtilsFinder:
    """Finds `typer.rich_utils` as the path finder does, and has it executed with the stand-ins."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "typer.rich_utils":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _WithStandIns(spec.loader)
        return spec


class _WithStandIns:
    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename … for tracebacks and inspect
        return getattr(self._loader, name)

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        placed = []
        for name, attribute in _DEFERRED.items():
            if name not in sys.modules:
                stand_in = type(sys)(name, f"Stands in for {name} while typer.rich_utils imports.")
                setattr(stand_in, attribute, _deferred_class(name, attribute))
                stand_in.__getattr__ = _real_module_attribute(name, stand_in)  # any other name: the real one
                sys.modules[name] = stand_in
                placed.append((name, stand_in))
        try:
            self._loader.exec_module(module)
        finally:
            for name, stand_in in placed:
                if sys.modules.get(name) is stand_in:
                    del sys.modules[name]
        _text_as_written(module)


def _text_as_written(rich_utils: Any) -> None:
    """bai's help is plain text: "[manager] log_retention" is not rich markup (typer would drop it); and
    with NO_COLOR it has no ANSI escapes at all."""
    make = getattr(rich_utils, "_make_rich_text", None)
    if make is None or getattr(make, "bai_as_written", False):
        return
    from rich.markup import escape

    def as_written(*, text: str, style: str = "", markup_mode: Any) -> Any:
        if markup_mode == "rich":
            text = escape(text)
        return make(text=text, style=style, markup_mode=markup_mode)

    as_written.bai_as_written = True  # type: ignore[attr-defined]
    rich_utils._make_rich_text = as_written
    if os.environ.get("NO_COLOR") and hasattr(rich_utils, "COLOR_SYSTEM"):
        rich_utils.COLOR_SYSTEM = None  # help and usage errors without any escape (rich's NO_COLOR keeps bold)


def _real_module_attribute(module: str, stand_in: Any) -> Any:
    def attribute(name: str) -> Any:
        if name.startswith("__"):  # the import system asks for __path__ and the like: not the real module's
            raise AttributeError(name)
        if sys.modules.get(module) is stand_in:
            del sys.modules[module]
        return getattr(importlib.import_module(module), name)

    return attribute


def _deferred_class(module: str, name: str) -> type:
    """A class that stands for `module.name`: calling it, or reading an attribute, loads the real one."""

    def real() -> Any:
        return getattr(importlib.import_module(module), name)

    class Deferred(type):
        def __call__(cls, *args: Any, **kwargs: Any) -> Any:
            return real()(*args, **kwargs)

        def __getattr__(cls, attribute: str) -> Any:
            return getattr(real(), attribute)

        def __instancecheck__(cls, instance: Any) -> bool:
            return isinstance(instance, real())

        def __subclasscheck__(cls, subclass: Any) -> bool:
            return issubclass(subclass, real())

    return Deferred(name, (), {"__module__": module, "__qualname__": name})
