"""Two measured costs of typer (0.29) that bai's commands need not pay; the output stays the same.

- Values: typer coerces every parameter's value through a pydantic `TypeAdapter`, built when a
  command's parameters are parsed, given or not, so every command imports pydantic (about 110 ms of
  CPU). For a `str` or `list[str]` parameter given plain strings, or a `bool` one given a bool, that
  coercion is the identity (typer's adapter is `str(value)` then pydantic's str check);
  `plain_string_values` answers those without pydantic and hands every other value (an int, a path)
  to typer's own adapter, built then.
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
    """Coerce plain str, list[str] and bool values without pydantic; True if installed (or already)."""
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
        """Plain strings for str / list[str], bools for bool, as they are; anything else, typer's way.

        typer builds a parameter's coercion before it looks at the value, even a missing one (None,
        which never reaches `_coerce_value`): here typer's adapter is built only for a value that needs it."""

        descriptor: Any = field(default=None, compare=False)
        typers: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            kind = type(value)
            if (kind is str and self.annotation is str) or (kind is bool and self.annotation is bool):
                return value
            if kind in (list, tuple) and self.annotation == list[str] and all(type(v) is str for v in value):
                return list(value)
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
