"""Tables laid out by importance, as wide as the terminal: the columns a reader needs first always stay,
whole; secondary ones are dropped, least important first, when the terminal is too narrow for them (never
squeezed to `A…`); one column (a reason) takes the width left, on one line, cut with `…` at its end.

`-o wide` shows every column (kubectl's `-o wide`): nothing dropped nor cut, the lines as long as they need
(the terminal wraps them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.table import Table

GAP = 2  # blanks between two columns
REST_MIN = 24  # the width-taking column keeps at least this much (or all of it, when shorter) before others go
ELLIPSIS = "…"

OUTPUTS = ("wide", "json")
OUTPUT_HELP = "wide: every column (the default drops secondary ones on a narrow terminal); json: as --json."


@dataclass(frozen=True)
class Column:
    """A column of a table: its header, its cell for an item, and how much it matters.

    rank 0: always shown; among the others the highest rank is dropped first on a narrow terminal.
    wide: only with `-o wide`. rest: takes the width left, cut with … (at most one per table)."""

    header: str
    cell: Callable[[dict[str, Any]], str]
    rank: int = 0
    wide: bool = False
    rest: bool = False
    right: bool = False


def wants(output: str | None, as_json: bool) -> tuple[bool, bool]:
    """(wide, json) from `-o` and `--json`; an unknown `-o` is a usage error naming the valid ones."""
    if output is None:
        return False, as_json
    value = output.strip().lower()
    if value not in OUTPUTS:
        import typer

        raise typer.BadParameter(f"wants {' or '.join(OUTPUTS)}, got {output!r}", param_hint="-o / --output")
    return value == "wide", as_json or value == "json"


def one_line(text: str) -> str:
    return " ".join(str(text).split()) if "\n" in str(text) or "\t" in str(text) else str(text)


def cut(text: str, width: int) -> str:
    """`text` in at most `width` cells, with … at the end when it was longer."""
    from rich.cells import cell_len, set_cell_size

    if cell_len(text) <= width:
        return text
    return set_cell_size(text, max(0, width - 1)) + ELLIPSIS if width > 0 else ""


def chosen(columns: Sequence[Column], cells: list[list[str]], width: int, wide: bool) -> tuple[list[int], int]:
    """Which columns (their indexes) fit in `width`, and the width of the rest column among them."""
    from rich.cells import cell_len

    keep = [i for i, c in enumerate(columns) if wide or not c.wide]
    natural = [max([cell_len(c.header), *(cell_len(row[i]) for row in cells)]) for i, c in enumerate(columns)]
    rest_at = next((i for i in keep if columns[i].rest), None)

    def fixed(shown: list[int]) -> int:
        return sum(natural[i] for i in shown if i != rest_at) + GAP * (len(shown) - 1)

    def floor() -> int:
        return 0 if rest_at is None else min(natural[rest_at], max(REST_MIN, cell_len(columns[rest_at].header)))

    while not wide and fixed(keep) + floor() > width:
        droppable = [i for i in keep if columns[i].rank > 0]
        if not droppable:
            break
        keep.remove(max(droppable, key=lambda i: (columns[i].rank, i)))
    if rest_at is None:
        return keep, 0
    if wide:  # every column whole: the lines as long as they need
        return keep, natural[rest_at]
    return keep, max(floor(), min(natural[rest_at], width - fixed(keep)))


def fit(columns: Sequence[Column], items: list[dict[str, Any]], width: int, wide: bool = False) -> Table:
    """A rich table of `items` laid out for `width` cells (see the module's doc)."""
    from rich.cells import cell_len
    from rich.table import Table as RichTable

    cells = [[one_line(c.cell(item)) for c in columns] for item in items]
    keep, rest = chosen(columns, cells, width, wide)
    table = RichTable(box=None, header_style="bold", pad_edge=False, padding=(0, GAP // 2), expand=False)
    widths = []
    for i in keep:
        c = columns[i]
        w = rest if c.rest else max([cell_len(c.header), *(cell_len(row[i]) for row in cells)])
        widths.append(w)
        table.add_column(c.header, width=w, no_wrap=True, overflow="ellipsis", justify="right" if c.right else "left")
    for row in cells:
        table.add_row(*(cut(row[i], rest) if columns[i].rest else row[i] for i in keep))
    table.width = sum(widths) + GAP * (len(widths) - 1)  # exactly: wider than the terminal only with -o wide
    return table
