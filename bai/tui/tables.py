"""Keeping a DataTable equal to a list of rows without rebuilding it on every change."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.text import Text
from textual.coordinate import Coordinate
from textual.widgets import DataTable

Cell = str | Text


@dataclass(frozen=True)
class Column:
    """A table column: its title, width and how it renders a row."""

    key: str
    label: str
    width: int | None  # None: as wide as its content


class TableSync:
    """Owns one DataTable: `set_columns` when the layout changes, `sync` with the rows to show.

    When the row keys and their order are unchanged only the cells that differ are updated; otherwise
    the rows are replaced and the cursor stays on the row (key) it was on."""

    def __init__(self, table: DataTable) -> None:
        self.table = table
        self.columns: list[Column] = []
        self.keys: list[str] = []
        self.cells: dict[str, tuple[Cell, ...]] = {}
        self._restore: str | None = None  # the row to select once rows are back after new columns

    def set_columns(self, columns: Sequence[Column]) -> bool:
        if list(columns) == self.columns:
            return False
        selected = self.selected_key()
        self.table.clear(columns=True)
        for c in columns:
            self.table.add_column(c.label, width=c.width, key=c.key)
        self.columns = list(columns)
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
