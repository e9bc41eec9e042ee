"""Dialogs over the dashboard: confirm an action, choose an app or a kernel, the key list (the `/` and
`:` prompt is bai/tui/prompt.py)."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, OptionList, Static
from textual.widgets.option_list import Option

from bai.common.present import fair_share_header, fair_share_table
from bai.tui.views import app_line

DIALOG_CSS = """
{name} {{ align: center middle; background: $background 60%; }}
{name} > Vertical {{
    width: auto; max-width: 90%; min-width: 40; height: auto; max-height: 90%;
    border: thick $accent; background: $surface; padding: 0 1;
}}
"""


class ConfirmScreen(ModalScreen[bool]):
    """Yes / no; `y` or the button confirms, `n` or Esc cancels."""

    DEFAULT_CSS = (
        DIALOG_CSS.format(name="ConfirmScreen")
        + """
    ConfirmScreen Horizontal { height: auto; align: center middle; margin-top: 1; }
    ConfirmScreen Button { margin: 0 1; }
    """
    )
    BINDINGS = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n", "answer(False)", "No"),
        Binding("escape", "answer(False)", "Cancel"),
    ]

    def __init__(self, question: str, yes: str = "Yes") -> None:
        super().__init__()
        self.question = question
        self.yes = yes

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Text(self.question, style="bold"), id="question")
            yield Static(Text("y: yes   n / Esc: no", style="dim"))
            with Horizontal():
                yield Button(self.yes, variant="error", id="yes")
                yield Button("No", id="no")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()  # the safe choice is the default

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class AppsScreen(ModalScreen[str | None]):
    """A session's apps (`f`): Enter forwards the one under the cursor to a local port (or, forwarded
    already, shows its URL again); Esc cancels. Dismissed with the app's name, or None."""

    DEFAULT_CSS = (
        DIALOG_CSS.format(name="AppsScreen")
        + """
    AppsScreen OptionList, AppsScreen OptionList:focus { height: auto; max-height: 16; border: none; padding: 0; }
    """
    )
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, session: str, apps: list[dict], forwarded: dict[str, str]) -> None:
        super().__init__()
        self.session = session
        self.apps = apps
        self.forwarded = forwarded  # app name -> its local URL

    def compose(self) -> ComposeResult:
        width = max(len(str(a.get("name"))) for a in self.apps)
        options = [
            Option(app_line(a, width, self.forwarded.get(str(a.get("name")))), id=str(a.get("name"))) for a in self.apps
        ]
        with Vertical():
            yield Static(Text(f"Apps of {self.session}", style="bold"))
            yield OptionList(*options, id="apps")
            yield Static(Text("Enter: forward it to 127.0.0.1   Esc: cancel", style="dim"))

    def on_mount(self) -> None:
        self.query_one(OptionList).focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)


class KernelScreen(ModalScreen[str | None]):
    """Which kernel of a session of several (as k9s's container picker): `what` (logs, a shell, describe)
    goes to the one chosen. The main kernel is highlighted first; Enter picks, Esc cancels. Dismissed with
    the kernel's name (main1, sub1 …) or None."""

    DEFAULT_CSS = (
        DIALOG_CSS.format(name="KernelScreen")
        + """
    KernelScreen OptionList, KernelScreen OptionList:focus { height: auto; max-height: 16; border: none; padding: 0; }
    """
    )
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, session: str, what: str, kernels: list[tuple[str, str]]) -> None:
        """`kernels`: (name, a line about it: its agent and status) of each kernel, in the session's order."""
        super().__init__()
        self.session = session
        self.what = what
        self.kernels = kernels

    def compose(self) -> ComposeResult:
        width = max(len(name) for name, _ in self.kernels)
        options = []
        for name, about in self.kernels:
            line = Text(f"{name:<{width}}  {about}")
            line.stylize("bold", 0, len(name))
            options.append(Option(line, id=name))
        with Vertical():
            yield Static(Text(f"{self.what.capitalize()} of which kernel of {self.session}?", style="bold"))
            yield OptionList(*options, id="kernels")
            yield Static(Text("Enter: this kernel   Esc: cancel", style="dim"))

    def on_mount(self) -> None:
        options = self.query_one(OptionList)
        names = [name for name, _ in self.kernels]
        options.highlighted = names.index("main1") if "main1" in names else 0
        options.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)


KEYS: list[tuple[str, list[tuple[str, str]]]] = [
    (
        "Views",
        [
            ("1  :agents", "agents, their slots and the cluster total"),
            ("2  :sessions", "pending, running and recently finished sessions"),
            ("3  :describe", "the chosen session in detail"),
            ("4  :logs", "the chosen session's kernel output, live"),
            ("Esc", "clear the sessions filter, else back to the previous view"),
            (":", "a view by name, start or alias (:ag, :se, :po, :no, :de, :lo), help, quit"),
        ],
    ),
    (
        "Tables",
        [
            ("j / k  ↓ / ↑", "next / previous row"),
            ("g Home / G End", "first / last row"),
            ("Shift+letter", "sort by the column of the underlined letter (▲▼); again: reversed; 3rd: as usual"),
            ("Enter on an agent", "exactly its sessions (filter agent:ID; Esc clears it)"),
        ],
    ),
    (
        "Sessions and details",
        [
            ("d / Enter / 3", "describe the session under the cursor (and one of its kernels, when several)"),
            ("r", "show / hide its whole reason (or outcome) under the table"),
            ("l", "open its logs (a session of several kernels: which kernel, main1 first)"),
            ("e", "its events: status transitions, then lifecycle events as they happen"),
            ("y", "its JSON, as GET /session/{id} returns it"),
            ("s", "a shell in it if running (which kernel, when several); back here when it exits"),
            ("f", "forward an app of it (Jupyter…) to a local port (hidden with --read-only)"),
            ("Ctrl-d", "terminate it (asks first; hidden with --read-only)"),
            ("/", "filter: words match anywhere; exactly: exit:3 agent:ID name:N image:I type:T"),
            ("", "project:P status:pending|running|finished|failed|ok|STATUS owner:KEY id:PREFIX; ! inverts"),
            ("p", "only the next project's sessions (all, then each in turn; as k9s's namespace)"),
            (":project NAME", "only that project's sessions (:project all: every project's)"),
            (":presets", "the resource presets, whether each would start now, and what you may still take"),
            (":rounds", "superadmins: the latest scheduling rounds (:replay N replays round N: the same again?)"),
            (":fairshare", "fair share: who used how much lately, and the factor it gives their waiting sessions"),
        ],
    ),
    (
        "Logs",
        [
            ("/", "filter lines (words must all occur; a leading ! inverts)"),
            ("t", "timestamps on / off"),
            ("w", "wrap long lines on / off"),
            ("G / g", "jump to the end (and follow) / to the start"),
            ("Ctrl-s", "save the log to ./SESSION-KERNEL.log (never over a file: -1, -2 … then)"),
            ("c", "copy the log (the lines shown) to the clipboard"),
            ("↑ PgUp …", "scrolling up pauses following; G resumes"),
        ],
    ),
    ("Anywhere", [("?", "this help"), ("q", "quit")]),
]


class PresetsScreen(ModalScreen[None]):
    """The resource presets, as check-presets answers for the dashboard's keypair: each one's resources and whether
    it would start now, and what the keypair may still take. Esc or q closes it."""

    DEFAULT_CSS = (
        DIALOG_CSS.format(name="PresetsScreen")
        + "PresetsScreen > Vertical { width: 90%; max-width: 100; overflow-y: auto; }\n"
    )
    BINDINGS = [Binding("escape", "close", "Close"), Binding("q", "close", "Close")]

    def __init__(self, answer: dict) -> None:
        super().__init__()
        self.answer = answer

    def compose(self) -> ComposeResult:
        from bai.common.present import preset_check_lines, size, slots_text

        table = Table(box=None, padding=(0, 2, 0, 0), header_style="bold", expand=True)
        for column in ("NAME", "FITS NOW", "RESOURCES", "SHM"):
            table.add_column(column, no_wrap=column != "RESOURCES", ratio=1 if column == "RESOURCES" else None)
        for p in self.answer.get("presets") or []:
            fits = Text("yes", style="green") if p.get("allocatable") else Text("no", style="red")
            shm = size(p["shared_memory"]) if p.get("shared_memory") else "-"
            table.add_row(str(p.get("name")), fits, slots_text(p.get("resource_slots") or {}) or "-", shm)
        with Vertical():
            yield Static(Text("Resource presets", style="bold"))
            if self.answer.get("presets"):
                yield Static(table)
            else:
                yield Static(Text("No resource presets (superadmins: bai preset add NAME --cpu … --mem …)"))
            for line in preset_check_lines(self.answer):
                yield Static(Text(line))
            yield Static(Text("Esc or q closes this", style="dim"))

    def action_close(self) -> None:
        self.dismiss(None)


class RoundsScreen(ModalScreen[None]):
    """Scheduling rounds (superadmins): the latest kept (`rounds`), or the replay of one (`replay`), as `bai
    scheduler rounds|replay` print them. Esc or q closes it."""

    DEFAULT_CSS = (
        DIALOG_CSS.format(name="RoundsScreen")
        + "RoundsScreen > Vertical { width: 96%; max-width: 140; overflow-y: auto; }\n"
    )
    BINDINGS = [Binding("escape", "close", "Close"), Binding("q", "close", "Close")]

    def __init__(self, rounds: list[dict] | None = None, replay: dict | None = None) -> None:
        super().__init__()
        self.rounds = rounds
        self.replay = replay

    def compose(self) -> ComposeResult:
        with Vertical():
            if self.replay is not None:
                r = self.replay
                yield Static(Text(f"Round {r['round']} at {r['at'][:19].replace('T', ' ')} UTC", style="bold"))
                yield Static(Text(f"{r['pending']} pending: {r['placed']} placed, {r['waiting']} waiting, "
                                  f"{r['cancelled']} cancelled, {r['preempted']} preempted; snapshot "
                                  f"{r['digest'][:16]}"))  # fmt: skip
                same = "the same decisions again" if r["reproduced"] else "today's scheduler decides differently:"
                sections = [
                    ("Decided then", r["decisions"] or ["(nothing)"]),
                    (f"Replayed: {same}", r["differences"]),
                    ("Changed in the cluster since", r["changes"] or ["nothing"]),
                    ("Decided now instead (not applied)", r["now"] or ["the same"]),
                ]
                for title, lines in sections:
                    yield Static(Text(title, style="bold"))
                    for line in lines:
                        yield Static(Text(f"  {line}"))
            else:
                table = Table(box=None, padding=(0, 2, 0, 0), header_style="bold", expand=True)
                for column in ("ROUND", "AT", "PENDING", "PLACED", "WAITING", "CANCELLED", "PREEMPTED"):
                    table.add_column(column, no_wrap=True)
                for r in self.rounds or []:
                    table.add_row(
                        str(r["round"]),
                        r["at"][:19].replace("T", " "),
                        *(str(r.get(k, 0)) for k in ("pending", "placed", "waiting", "cancelled", "preempted")),
                    )
                yield Static(Text("Scheduling rounds (newest first; :replay N replays one)", style="bold"))
                yield Static(table if self.rounds else Text("No round kept yet"))
            yield Static(Text("Esc or q closes this", style="dim"))

    def action_close(self) -> None:
        self.dismiss(None)


class FairShareScreen(ModalScreen[None]):
    """Fair share's standings (`GET /bai/scheduler/fair-share`: the keypairs and projects one may see), as `bai
    scheduler fair-share` prints them. Esc or q closes it."""

    DEFAULT_CSS = (
        DIALOG_CSS.format(name="FairShareScreen")
        + "FairShareScreen > Vertical { width: 96%; max-width: 140; overflow-y: auto; }\n"
    )
    BINDINGS = [Binding("escape", "close", "Close"), Binding("q", "close", "Close")]

    def __init__(self, answer: dict) -> None:
        super().__init__()
        self.answer = answer

    def compose(self) -> ComposeResult:
        answer = self.answer

        with Vertical():
            yield Static(Text("Fair share (as the next scheduling round ranks it; most used first)", style="bold"))
            yield Static(Text(fair_share_header(answer), style="dim"))
            yield Static(
                fair_share_table(answer["keypairs"], "ACCESS KEY", "USER", "accessKey", "user", expand=True)
                if answer["keypairs"]
                else Text("No keypair has usage or waiting sessions")
            )
            if answer["projects"]:
                yield Static(Text("Projects (their factor counts where two or more have usage)", style="bold"))
                yield Static(fair_share_table(answer["projects"], "PROJECT", "ID", "name", "projectId", expand=True))
            yield Static(Text("Esc or q closes this", style="dim"))

    def action_close(self) -> None:
        self.dismiss(None)


class HelpScreen(ModalScreen[None]):
    """Every key of the dashboard, one screen."""

    DEFAULT_CSS = DIALOG_CSS.format(name="HelpScreen") + "HelpScreen > Vertical { width: 96; overflow-y: auto; }\n"
    BINDINGS = [
        Binding("escape", "close", "Close"),
        Binding("question_mark", "close", "Close"),
        Binding("q", "close", "Close"),
    ]

    def __init__(self, read_only: bool = False) -> None:
        super().__init__()
        self.read_only = read_only

    def compose(self) -> ComposeResult:
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold cyan", no_wrap=True)
        table.add_column()
        for section, keys in KEYS:
            table.add_row(Text(section, style="bold underline"), "")
            for key, text in keys:
                if self.read_only and key in ("Ctrl-d", "s", "f"):
                    continue
                table.add_row(key, text)
        with Vertical():
            yield Static(table)
            yield Static(Text("Esc, ? or q closes this help", style="dim"))

    def action_close(self) -> None:
        self.dismiss(None)
