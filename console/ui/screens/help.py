"""`?`: the keys of the view it was opened from."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,question_mark,q", "dismiss", "close", id="help.close")]

    def __init__(self, title: str, keys: list[tuple[str, str]], note: str = "") -> None:
        super().__init__()
        self.title_text = title
        self.keys = keys
        self.note = note

    def compose(self) -> ComposeResult:
        width = max((len(k) for k, _ in self.keys), default=1)
        lines = [f"{k:>{width}}  {what}" for k, what in self.keys]
        with Vertical(id="help"):
            yield Static(f"[b]{self.title_text}: keys[/b]", id="help-title")
            yield Static("\n".join(lines), id="help-keys", markup=False)
            if self.note:
                yield Static(self.note, id="help-note")
            yield Static("Esc or ? closes", id="help-close")

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(result)
