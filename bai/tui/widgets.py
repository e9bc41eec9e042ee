"""Small drawing pieces of the dashboard: slot bars, compact amounts, and the log viewer (Line API)."""

from __future__ import annotations

import re
from decimal import Decimal

from rich.cells import cell_len
from rich.segment import Segment
from rich.text import Text
from textual.geometry import Size
from textual.reactive import var
from textual.scroll_view import ScrollView
from textual.strip import Strip

from bai.common.slots import is_bytes_slot
from bai.tui.model import Filter, LogBuffer, LogLine, clock_of, wrap

FULL, EMPTY = "█", "░"


def compact(name: str, value: Decimal) -> str:
    """Amounts that fit a table cell: 2, 0.5, 512M, 23.5G."""
    if is_bytes_slot(name):
        value = Decimal(value)
        for unit, power in (("T", 4), ("G", 3), ("M", 2), ("K", 1)):
            scale = Decimal(1024) ** power
            if value >= scale:
                shown = value / scale
                text = f"{shown:.1f}" if shown < 100 else f"{shown:.0f}"
                return text.removesuffix(".0") + unit
        return f"{int(value)}"
    text = f"{Decimal(value).normalize():f}"
    return text


def usage_colour(fraction: float) -> str:
    if fraction >= 0.9:
        return "red"
    if fraction >= 0.7:
        return "yellow"
    return "green"


def bar(used: Decimal, cap: Decimal, width: int) -> Text:
    """A bar of `width` cells, filled in proportion to used / cap (empty when there is no capacity)."""
    fraction = float(used / cap) if cap > 0 else 0.0
    fraction = min(max(fraction, 0.0), 1.0)
    filled = round(fraction * width)
    if used > 0 and filled == 0:
        filled = 1  # something is used: show it
    text = Text(FULL * filled, style=usage_colour(fraction))
    text.append(EMPTY * (width - filled), style="grey37")
    return text


def slot_cell(name: str, used: Decimal, cap: Decimal, bar_width: int) -> Text:
    text = bar(used, cap, bar_width) if bar_width > 0 else Text()
    if bar_width > 0:
        text.append(" ")
    text.append(f"{compact(name, used)}/{compact(name, cap)}")
    return text


_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f]")


def _cells(text: str) -> int:
    """Terminal cells of a line: its length when it is ASCII (most logs), else rich's measure."""
    return len(text) if text.isascii() else cell_len(text)


class LogView(ScrollView, can_focus=True):
    """The last lines of a kernel's output: filter (`!` inverts), timestamps, wrap, follow.

    Lines live in a `LogBuffer`; this widget keeps the rows it shows (after filter and wrap) and draws
    only the visible ones. It follows the end while the view is at the bottom and pauses when the user
    scrolls up (`following` turns False; `new_while_paused` counts what arrived meanwhile)."""

    DEFAULT_CSS = """
    LogView { background: $surface; overflow: auto auto; }
    """

    timestamps: var[bool] = var(False)
    wrap_lines: var[bool] = var(False)
    following: var[bool] = var(True)

    def __init__(self, buffer: LogBuffer, **kw) -> None:
        super().__init__(**kw)
        self.buffer = buffer
        self.filter = Filter()
        self.rows: list[tuple[int, str]] = []  # (line index, text as shown)
        self.new_while_paused = 0
        self._width = 0
        self._wrap_width = 0
        self._programmatic = False

    # -- rows -------------------------------------------------------------------------------------

    def _rows_of(self, line: LogLine) -> list[tuple[int, str]]:
        if not self.filter.match_text(line.text):
            return []
        text = line.text
        if "\t" in text:
            text = text.expandtabs()
        if not text.isprintable():
            text = _CONTROL.sub("�", text)
        if self.timestamps:
            text = f"{clock_of(line.ts)} {text}"
        if self.wrap_lines:
            return [(line.index, piece) for piece in wrap(text, self._wrap_width)]
        return [(line.index, text)]

    def rebuild(self) -> None:
        """Recompute every row (after a filter, wrap, timestamp or width change)."""
        self._wrap_width = max(10, self.scrollable_content_region.width or self.size.width or 80)
        rows: list[tuple[int, str]] = []
        for line in self.buffer.all_lines():
            rows.extend(self._rows_of(line))
        self.rows = rows
        self._width = max((_cells(t) for _, t in rows), default=0)
        self._resize()
        if self.following:
            self._scroll_end()
        self.refresh()

    def lines_added(self, lines: list[LogLine]) -> None:
        """New complete lines are in the buffer (the partial line may have changed too)."""
        # the rows of the old partial line (its index is that of the first new line, or still its own) go
        redo_from = lines[0].index if lines else self.buffer.next_index
        while self.rows and self.rows[-1][0] >= redo_from:
            self.rows.pop()
        added: list[tuple[int, str]] = []
        for line in lines:
            added.extend(self._rows_of(line))
        if self.buffer.partial is not None:
            added.extend(self._rows_of(self.buffer.partial))
        first = self.buffer.first_index
        if self.rows and self.rows[0][0] < first:  # lines that fell out of the buffer
            cut = 0
            while cut < len(self.rows) and self.rows[cut][0] < first:
                cut += 1
            del self.rows[:cut]
        self.rows.extend(added)
        if added:
            self._width = max(self._width, max(_cells(t) for _, t in added))
        if not self.following:
            self.new_while_paused += len(lines)
        self._resize()
        if self.following:
            self._scroll_end()
        self.refresh()

    def set_filter(self, flt: Filter) -> None:
        self.filter = flt
        self.rebuild()

    def watch_timestamps(self) -> None:
        if self.is_mounted:
            self.rebuild()

    def watch_wrap_lines(self) -> None:
        if self.is_mounted:
            self.rebuild()

    def on_resize(self) -> None:
        if self.wrap_lines:
            self.rebuild()
        elif self.following:
            self.call_after_refresh(self._scroll_end)

    def _resize(self) -> None:
        width = 0 if self.wrap_lines else self._width
        self.virtual_size = Size(width, len(self.rows))

    # -- following --------------------------------------------------------------------------------

    def _scroll_end(self) -> None:
        self._programmatic = True
        try:
            self.scroll_end(animate=False, immediate=True, x_axis=False, force=True)
        finally:
            self._programmatic = False
        # a scroll bar that appears with this content shortens the view after the next layout
        self.call_after_refresh(self._settle_at_end)

    def _settle_at_end(self) -> None:
        if self.following and self.scroll_y < self.max_scroll_y:
            self._programmatic = True
            try:
                self.scroll_end(animate=False, immediate=True, x_axis=False, force=True)
            finally:
                self._programmatic = False
        if self.show_vertical_scrollbar:
            self.vertical_scrollbar.refresh()  # its thumb may have been drawn before the last scroll

    def watch_scroll_y(self, old: float, new: float) -> None:
        super().watch_scroll_y(old, new)
        if self._programmatic:
            return
        at_end = new >= self.max_scroll_y
        if at_end and not self.following:
            self.following = True
            self.new_while_paused = 0
        elif not at_end and new < old:
            self.following = False

    # scrolling up is the user's intent to read back: pause following at once, whatever the animation
    def action_scroll_up(self) -> None:
        self.following = False
        super().action_scroll_up()

    def action_page_up(self) -> None:
        self.following = False
        super().action_page_up()

    def action_scroll_home(self) -> None:
        self.following = False
        super().action_scroll_home()

    def on_mouse_scroll_up(self) -> None:
        self.following = False

    def jump_end(self) -> None:
        self.following = True
        self.new_while_paused = 0
        self._scroll_end()
        self.refresh()

    def jump_start(self) -> None:
        self.following = False
        self._programmatic = True
        try:
            self.scroll_to(y=0, animate=False, force=True)
        finally:
            self._programmatic = False
        self.refresh()

    # -- drawing ----------------------------------------------------------------------------------

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        index = scroll_y + y
        width = self.scrollable_content_region.width
        style = self.rich_style
        if index >= len(self.rows):
            return Strip.blank(width, style)
        _, text = self.rows[index]
        strip = Strip([Segment(text, style)], _cells(text))
        return strip.crop_extend(scroll_x, scroll_x + width, style)
