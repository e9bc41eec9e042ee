"""`bai/cli/typer_fast.py` reaches into typer's private internals (written against typer 0.29); pyproject.toml pins
typer to that series. These tests fail as soon as an internal it relies on changes shape, instead of typer_fast
quietly standing aside (it falls back to typer's own, slower, path when it finds typer different) and the CLI
getting slower or printing types again without anyone noticing."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import subprocess
import sys
import tomllib
from pathlib import Path

import typer

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_pins_typer_to_the_series_typer_fast_was_written_against() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (typer_dep,) = [d for d in deps if d.split(">")[0].split("<")[0].split("=")[0].strip() == "typer"]
    assert ">=0.29" in typer_dep and "<0.30" in typer_dep, typer_dep
    major, minor = (int(p) for p in typer.__version__.split(".")[:2])
    assert (major, minor) == (0, 29), typer.__version__


def test_the_coercion_internals_have_the_shape_typer_fast_subclasses() -> None:
    from typer import _coercion, core

    assert callable(core.build_runtime_param)
    assert list(inspect.signature(core.build_runtime_param).parameters) == ["descriptor"]
    base = _coercion.RuntimeParam
    assert dataclasses.is_dataclass(base)
    assert [f.name for f in dataclasses.fields(base)] == ["parameter_info", "annotation"]
    assert list(inspect.signature(base._coerce_value).parameters) == ["self", "value", "param", "ctx"]
    descriptor_fields = {f.name for f in dataclasses.fields(_coercion.TypeDescriptor)}
    assert {"annotation", "parameter_info", "file_annotation"} <= descriptor_fields, descriptor_fields
    assert {"is_path", "is_ranged"} <= descriptor_fields | set(dir(_coercion.TypeDescriptor)), descriptor_fields


def test_the_help_internals_have_the_shape_typer_fast_replaces() -> None:
    from typer.core import TyperArgument, TyperOption

    for name in ("display_name_raw", "_usage_display_name", "display_type_rich"):
        assert hasattr(TyperArgument, name), name
    assert hasattr(TyperOption, "display_type_rich")
    spec = importlib.util.find_spec("typer.rich_utils")  # read, not imported: importing it is what is deferred
    assert spec is not None and spec.origin is not None
    rich_utils = Path(spec.origin).read_text()
    assert "from rich.markdown import Markdown" in rich_utils and "from rich.traceback import Traceback" in rich_utils
    assert "def _make_rich_text(" in rich_utils and "COLOR_SYSTEM" in rich_utils


def test_every_patch_installs_in_a_fresh_interpreter() -> None:
    """Each of typer_fast's three patches finds typer as it expects (each answers False, or leaves the function
    unmarked, when it stood aside), and typer.rich_utils then imports without rich.markdown / rich.traceback."""
    code = (
        "import sys\n"
        "from bai.cli import typer_fast\n"
        "assert typer_fast.plain_string_values(), 'plain_string_values stood aside'\n"
        "assert typer_fast.plain_placeholders(), 'plain_placeholders stood aside'\n"
        "typer_fast.light_rich_help()\n"
        "import typer.rich_utils as r, inspect\n"
        "assert getattr(r._make_rich_text, 'bai_as_written', False), 'light_rich_help stood aside'\n"
        "assert list(inspect.signature(r._make_rich_text.__wrapped__ if hasattr(r._make_rich_text, '__wrapped__')"
        " else r._make_rich_text).parameters) == ['text', 'style', 'markup_mode']\n"
        "assert hasattr(r, 'COLOR_SYSTEM')\n"
        "assert 'rich.markdown' not in sys.modules and 'rich.traceback' not in sys.modules, 'imported eagerly'\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
