"""Typer groups that build a command only when it is used, and import a sub-app's module only then.

Typer turns every registered command into a click command up front: it reads each function's
signature and type hints (about 0.7 ms a command, 63 commands), and `bai.cli.main` used to import
every sub-app's module to register it. A `LazyGroup` keeps, for each name, either a built command or
how to build it (a typer `CommandInfo`, a typer `TyperInfo`, or "module:attribute" of a `typer.Typer`),
and builds on first access. Names and their order are known without building anything, so dispatch,
"Did you mean …?" suggestions and shell completion work as before; `--help` of a group builds what
it lists (each entry's short help), which is the same output as an eager build.
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any, ClassVar

import typer
from typer.core import TyperGroup
from typer.main import get_command_from_info, get_command_name, get_group_from_info
from typer.models import CommandInfo, TyperInfo

Maker = Callable[[], Any]  # () -> a click command


class LazyCommands(MutableMapping[str, Any]):
    """name → click command, in a fixed order; an entry that is still a maker is built when read."""

    def __init__(self, entries: dict[str, Any]) -> None:
        self._entries = dict(entries)  # a built command, or a `_Pending`

    def __getitem__(self, name: str) -> Any:
        entry = self._entries[name]
        if isinstance(entry, _Pending):
            entry = self._entries[name] = entry.make()
        return entry

    def __setitem__(self, name: str, command: Any) -> None:
        self._entries[name] = command

    def __delitem__(self, name: str) -> None:
        del self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def built(self, name: str) -> bool:
        return name in self._entries and not isinstance(self._entries[name], _Pending)


class _Pending:
    __slots__ = ("make",)

    def __init__(self, make: Maker) -> None:
        self.make = make


class LazyGroup(TyperGroup):
    """A `TyperGroup` whose sub-commands are built (and sub-apps imported) on first use.

    `lazy_groups` (a subclass sets it): name → "module:attribute" of a `typer.Typer`, after the group's
    own commands, in this order, as `app.add_typer(module.attribute, name=name)` would list them.
    """

    lazy_groups: ClassVar[dict[str, str]] = {}
    pretty_exceptions_short: bool = True
    path: str = ""  # the command line that names it, e.g. "bai session" (examples are found by it)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        entries: dict[str, Any] = dict(self.commands)
        for name, target in self.lazy_groups.items():
            entries.setdefault(name, _Pending(lambda name=name, target=target: self._import_group(name, target)))
        self.commands = LazyCommands(entries)

    def _import_group(self, name: str, target: str) -> Any:
        module, _, attribute = target.partition(":")
        sub_app = getattr(importlib.import_module(module), attribute)
        holder = typer.Typer()
        holder.add_typer(sub_app, name=name)  # exactly the TyperInfo that add_typer would register
        return lean_group(holder.registered_groups[0], self)

    def _settings(self) -> dict[str, Any]:
        return {"pretty_exceptions_short": self.pretty_exceptions_short, "rich_markup_mode": self.rich_markup_mode}


def lean_group(info: TyperInfo, parent: LazyGroup | None = None, **settings: Any) -> LazyGroup:
    """The click group of `info` (as typer's `get_group_from_info` makes it), its commands and
    sub-groups left to build when first used. `settings`: pretty_exceptions_short, rich_markup_mode,
    suggest_commands (a parent's, by default)."""
    app = info.typer_instance
    assert app is not None
    if parent is not None:
        settings = {**parent._settings(), "suggest_commands": parent.suggest_commands, **settings}
    shell = copy.copy(app)  # the same callback and settings, nothing registered
    shell.registered_commands = []
    shell.registered_groups = []
    shell_info = copy.copy(info)
    shell_info.typer_instance = shell
    if isinstance(shell_info.cls, typer.models.DefaultPlaceholder) or shell_info.cls is None:
        if isinstance(app.info.cls, typer.models.DefaultPlaceholder) or app.info.cls is None:
            shell_info.cls = LazyGroup
    group = get_group_from_info(shell_info, **settings)
    assert isinstance(group, LazyGroup), f"{type(group)} is not a LazyGroup"
    group.pretty_exceptions_short = settings["pretty_exceptions_short"]
    group.path = f"{parent.path or parent.name} {group.name}" if parent is not None else (group.name or "")
    own: dict[str, Any] = {}
    for command_info in app.registered_commands:
        own[_command_name(command_info)] = _Pending(lambda ci=command_info: _build_command(ci, group))
    for sub_info in app.registered_groups:
        assert sub_info.name, "bai's sub-apps are added with a name"
        own[sub_info.name] = _Pending(lambda si=sub_info: lean_group(si, group))
    group.commands = LazyCommands({**own, **group.commands._entries})  # type: ignore[attr-defined]
    return group


def lean_command(app: typer.Typer) -> LazyGroup:
    """What `app()` runs (typer's `get_command(app)`), built lazily: for a Typer with a callback; with
    `--install-completion` and `--show-completion` unless the app says `add_completion=False`."""
    group = lean_group(
        TyperInfo(app),
        pretty_exceptions_short=app.pretty_exceptions_short,
        rich_markup_mode=app.rich_markup_mode,
        suggest_commands=app.suggest_commands,
    )
    if app._add_completion:  # as get_command adds them (typer.completion is imported with typer.main)
        from typer.main import get_install_completion_arguments

        group.params.extend(get_install_completion_arguments())
    return group


def _command_name(info: CommandInfo) -> str:
    return info.name or get_command_name(info.callback.__name__)  # type: ignore[union-attr]


def _build_command(info: CommandInfo, group: LazyGroup) -> Any:
    command = get_command_from_info(info, **group._settings())
    if not command.epilog and "Example" not in (command.help or ""):
        from bai.cli.examples import epilog_of  # (a dict: imported when a command is built)

        command.epilog = epilog_of(f"{group.path} {command.name}")
    return command
