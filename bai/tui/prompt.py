"""The dashboard's one-line prompt (a filter after `/`, a command after `:`), part of the main screen.

It is mounted with the dashboard and only hidden, so that opening it focuses its input at once, in the
same turn as the key that opened it: every key typed right after `/` (as fast as `tmux send-keys` types
them) goes into it, none is lost or taken for a command. Enter answers with the text, Esc with None.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Input, Static

Answer = Callable[[str | None], None]


class PromptBar(Vertical):
    """A hint and an input over the footer, shown by `ask`; the answer goes to the `ask`'s callback."""

    DEFAULT_CSS = """
    PromptBar { height: auto; background: $surface; padding: 0 1; display: none; }
    PromptBar.shown { display: block; }
    PromptBar Input, PromptBar Input:focus { width: 100%; height: 1; border: none; padding: 0 1; background: $boost; }
    """
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.prompt = ""
        self._answer: Answer | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="prompt-hint")
        yield Input(id="prompt")

    @property
    def input(self) -> Input:
        return self.query_one("#prompt", Input)

    @property
    def shown(self) -> bool:
        return self.has_class("shown")

    def ask(self, prompt: str, value: str, hint: str, answer: Answer) -> None:
        """Show the prompt with `value` typed and focus it now (not after a repaint: see the module)."""
        self.prompt, self._answer = prompt, answer
        self.query_one("#prompt-hint", Static).update(Text(hint, style="dim"))
        field = self.input
        field.placeholder = prompt
        field.value = value
        field.cursor_position = len(value)
        self.add_class("shown")
        self.screen.set_focus(field)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._close(event.value)

    def action_cancel(self) -> None:
        self._close(None)

    def _close(self, value: str | None) -> None:
        answer, self._answer = self._answer, None
        self.remove_class("shown")
        if answer is not None:
            answer(value)
