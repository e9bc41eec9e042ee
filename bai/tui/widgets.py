"""Small drawing pieces of the dashboard: slot bars, compact amounts, and the log viewer (Line API)."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

from rich.ansi import AnsiDecoder, re_ansi
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


NO_FIGURE = "–"  # a figure not measured (yet)


def gauge(value: float | None, cap: float | None, width: int, label: str) -> Text:
    """A live figure as a bar of `width` cells against `cap` (empty without one), then `label`; a dim
    "–" when there is no figure."""
    if value is None:
        return Text(NO_FIGURE, style="dim")
    fraction = value / cap if cap else 0.0
    colour = usage_colour(fraction)
    text = Text()
    if width > 0:  # as `bar`, in floats
        filled = round(min(max(fraction, 0.0), 1.0) * width)
        if value > 0 and filled == 0:
            filled = 1
        text.append(FULL * filled, style=colour)
        text.append(EMPTY * (width - filled), style="grey37")
        text.append(" ")
    text.append(label, style=colour if cap else "")
    return text


def cpu_label(pct: float) -> str:
    """CPU use in percent of one core: 37%, 150%, 1.2k%."""
    return f"{pct / 1000:.1f}k%" if pct >= 9999.5 else f"{pct:.0f}%"


def bytes_label(value: float) -> str:
    return compact("mem", Decimal(int(value)))


_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f]")
_CONTROL_BUT_ESC = re.compile("[\x00-\x08\x0b-\x1a\x1c-\x1f\x7f]")
ANSI_MAX = 8192  # characters: a longer line with escape codes is shown without its colours (bounded cost)
STYLED_CACHE = 4096  # decoded lines kept for drawing


def _cells(text: str) -> int:
    """Terminal cells of a line: its length when it is ASCII (most logs), else rich's measure."""
    return len(text) if text.isascii() else cell_len(text)


def _decode(raw: str) -> Text:
    """A line with ANSI escape codes as styled text (SGR colours and attributes, OSC 8 links; other
    sequences dropped); each line on its own (no style carried over from the line before)."""
    text = AnsiDecoder().decode_line(raw)
    if "\t" in text.plain:
        text.expand_tabs()
    if "\x1b" in text.plain:  # a stray escape: never let it reach the terminal
        return Text(text.plain.replace("\x1b", "\ufffd"))
    return text


def separator(run: dict, width: int) -> Text:
    """`── run 3 · 14:02:11 ──────── exit 0`: the line before a run's output, `width` cells wide."""
    code = run.get("exitCode")
    if code is not None:
        end = Text(f" exit {code}", style="bold green" if code == 0 else "bold red")
    elif run.get("endedAt"):
        end = Text(" ended", style="yellow")
    else:
        end = Text(" running", style="cyan")
    text = Text("── ", style="cyan")
    text.append(f"run {run.get('run')}", style="bold cyan")
    text.append(f" · {clock_of(run.get('startedAt'))} ", style="cyan")
    text.append("─" * max(2, width - text.cell_len - end.cell_len), style="cyan")
    text.append_text(end)
    return text


class _Row(str):
    """A row's text as shown, drawn another way (`how`: see LogView)."""

    how: Any


def _row(text: str, how: Any) -> str:
    if how is None:
        return text
    row = _Row(text)
    row.how = how
    return row


class LogView(ScrollView, can_focus=True):
    """The last lines of a kernel's output: filter (`!` inverts), timestamps, wrap, follow.

    Lines live in a `LogBuffer`; this widget keeps the rows it shows (after filter and wrap) and draws
    only the visible ones. It follows the end while the view is at the bottom and pauses when the user
    scrolls up (`following` turns False; `new_while_paused` counts what arrived meanwhile).

    ANSI colours show as colours: a row is (line index, its text as shown, without escape codes); a row
    drawn otherwise than as that text is a `_Row` (a str) whose `how` says how: the raw text of a line
    with escape codes, decoded only when drawn (a bounded cache), (that raw text, start, end) for a piece
    of a wrapped line, or the `LogLine` of a run separator (drawn as wide as the view; its text, for the
    filter, is its label). Filters and widths use the text without codes; lines over ANSI_MAX characters
    show without colours."""

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
        self.rows: list[tuple[int, str]] = []  # (line index, text as shown: see above)
        self._styled: dict[str, Text] = {}
        self.new_while_paused = 0
        self._width = 0
        self._wrap_width = 0
        self._programmatic = False

    # -- rows -------------------------------------------------------------------------------------

    def _rows_of(self, line: LogLine) -> list[tuple[int, str]]:
        if line.run is not None:
            label = separator(line.run, 0).plain.replace("──", "").strip()
            if not self.filter.match_text(label):
                return []
            return [(line.index, _row(f"{clock_of(line.ts)} {label}" if self.timestamps else label, line))]
        text = raw = line.text
        styled = None
        if "\x1b" in raw:
            text = line.plain
            if text is None:
                text = line.plain = re_ansi.sub("", raw)
            if len(raw) <= ANSI_MAX:
                styled = raw if "\x1b" not in text else None  # a stray escape: no colours
        if not self.filter.match_text(text):
            return []
        if "\t" in text:
            text = text.expandtabs()
        if not text.isprintable():
            text = _CONTROL.sub("�", text)
            if styled is not None:
                styled = _CONTROL_BUT_ESC.sub("�", styled)
        if line.cut:
            text += f" … (+{line.cut} characters)"
            styled = styled and styled + f"\x1b[0;2m … (+{line.cut} characters)"
        if self.timestamps:
            text = f"{clock_of(line.ts)} {text}"
            styled = styled and f"{clock_of(line.ts)} {styled}"
        if self.wrap_lines:
            pieces = wrap(text, self._wrap_width)
            if styled is not None and len(pieces) > 1:  # each piece decoded when drawn, from its line's codes
                width = self._wrap_width
                return [
                    (line.index, _row(piece, (styled, i * width, i * width + width))) for i, piece in enumerate(pieces)
                ]
            return [(line.index, _row(piece, styled)) for piece in pieces]
        return [(line.index, _row(text, styled))]

    def _decode(self, raw: str) -> Text:
        text = self._styled.get(raw)
        if text is None:
            if len(self._styled) >= STYLED_CACHE:
                self._styled.clear()
            text = self._styled[raw] = _decode(raw)
        return text

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
            self.new_while_paused += sum(1 for line in lines if line.run is None)
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
        how = getattr(text, "how", None)
        if how is None:
            strip = Strip([Segment(text, style)], _cells(text))
        else:
            if isinstance(how, LogLine):  # a run's separator: as wide as the view, wherever it is scrolled
                styled = separator(how.run or {}, width)
                scroll_x = 0
            elif isinstance(how, tuple):  # a piece of a wrapped line: (its line's text, start, end)
                styled = self._decode(how[0])[how[1] : how[2]]
            else:
                styled = self._decode(how)
            strip = Strip(styled.render(self.app.console), styled.cell_len).apply_style(style)
        return strip.crop_extend(scroll_x, scroll_x + width, style)
