"""Keeping a DataTable equal to a list of rows without rebuilding it on every change; fitting columns to
the terminal's width; k9s keys in a table (j/k, g/G, Home/End).

Columns have a priority: 0 is always shown, higher numbers give way first when the terminal is narrow,
and one `flex` column (a reason) takes the width that is left. A column with a `sort` letter sorts the
table by shift + that letter; its header shows the letter underlined and, while sorted, ▲ or ▼."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from rich.text import Text
from textual.binding import Binding
from textual.coordinate import Coordinate
from textual.widgets import DataTable

Cell = str | Text
PADDING = 2  # a DataTable cell's padding, both sides together
SCROLLBAR = 2
UP, DOWN = "▲", "▼"


@dataclass(frozen=True)
class Column:
    """A table column: its key, title and width, how readily it hides, whether it takes the rest of the
    width (then `width` is its least), and the letter that sorts by it (shift + letter)."""

    key: str
    label: str
    width: int | None  # None: as wide as its content
    priority: int = 0  # 0: always shown; the highest hide first when the width is short
    flex: bool = False
    sort: str = ""


def fit_columns(columns: Sequence[Column], width: int) -> list[Column]:
    """The columns that fit `width` cells, in their order: the highest priorities are dropped (the later
    one first among equals) until the rest fit, flex columns at their least width; the flex columns then
    share what is left."""
    kept = list(columns)

    def need(cols: list[Column]) -> int:
        return sum((c.width or 0) + PADDING for c in cols) + SCROLLBAR

    while need(kept) > width:
        droppable = [(c.priority, i) for i, c in enumerate(kept) if c.priority > 0]
        if not droppable:
            break
        _, index = max(droppable)
        del kept[index]
    spare = max(0, width - need(kept))
    flex = [i for i, c in enumerate(kept) if c.flex]
    for n, i in enumerate(flex):  # the spare cells shared out, the first ones one more while some are left
        extra = spare // len(flex) + (1 if n < spare % len(flex) else 0)
        kept[i] = replace(kept[i], width=(kept[i].width or 0) + extra)
    return kept


def header(column: Column, sort: tuple[str, bool] | None = None) -> Text:
    """The column's title with its sort letter underlined, and ▲ / ▼ while the table is sorted by it."""
    label = Text(column.label)
    if column.sort:
        at = column.label.upper().find(column.sort.upper())
        if at >= 0:
            label.stylize("underline", at, at + 1)
    if sort is not None and sort[0] == column.key:
        label.append(DOWN if sort[1] else UP, style="bold cyan")
    return label


class KeyTable(DataTable):
    """A DataTable with k9s's (and vi's) keys: j / k move, g / Home the first row, G / End the last."""

    BINDINGS = [
        Binding("j", "cursor_down", "Down", show=False),
        Binding("k", "cursor_up", "Up", show=False),
        Binding("g,home", "scroll_top", "Top", show=False),
        Binding("G,end", "scroll_bottom", "Bottom", show=False),
    ]


class TableSync:
    """Owns one DataTable: `set_columns` when the layout changes, `sync` with the rows to show.

    When the row keys and their order are unchanged only the cells that differ are updated; otherwise
    the rows are replaced and the cursor stays on the row (key) it was on."""

    def __init__(self, table: DataTable) -> None:
        self.table = table
        self.columns: list[Column] = []
        self.sort: tuple[str, bool] | None = None
        self.keys: list[str] = []
        self.cells: dict[str, tuple[Cell, ...]] = {}
        self._restore: str | None = None  # the row to select once rows are back after new columns

    def set_columns(self, columns: Sequence[Column], sort: tuple[str, bool] | None = None) -> bool:
        if list(columns) == self.columns and sort == self.sort:
            return False
        selected = self.selected_key()
        self.table.clear(columns=True)
        for c in columns:
            self.table.add_column(header(c, sort), width=c.width, key=c.key)
        self.columns = list(columns)
        self.sort = sort
        self.keys, self.cells = [], {}
        self._restore = selected
        return True

    def selected_key(self) -> str | None:
        table = self.table
        if not self.keys or table.row_count == 0:
            return self._restore
        row = min(max(table.cursor_row, 0), table.row_count - 1)
        return table.coordinate_to_cell_key(Coordinate(row, 0)).row_key.value

    def sync(self, rows: Sequence[tuple[str, tuple[Cell, ...]]]) -> None:
        table = self.table
        keys = [k for k, _ in rows]
        if keys == self.keys:
            for key, cells in rows:
                old = self.cells.get(key)
                if old == cells:
                    continue
                for i, (column, value) in enumerate(zip(self.columns, cells, strict=True)):
                    if old is None or old[i] != value:
                        table.update_cell(key, column.key, value)
                self.cells[key] = cells
            return
        selected = self.selected_key()
        cursor = table.cursor_row
        table.clear()
        for key, cells in rows:
            table.add_row(*cells, key=key)
        self.keys = keys
        self.cells = dict(rows)
        self._restore = None
        if not keys:
            return
        if selected in self.cells:
            table.move_cursor(row=keys.index(selected), animate=False)
        else:
            table.move_cursor(row=min(max(cursor, 0), len(keys) - 1), animate=False)
