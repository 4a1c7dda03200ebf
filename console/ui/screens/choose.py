"""Pick a host from a list (fail over to a chosen host): Enter picks, Esc cancels."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option


class ChooseHostScreen(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "cancel", "cancel", id="choose.cancel")]

    def __init__(self, question: str, hosts: list[tuple[str, str]]) -> None:
        super().__init__()
        self.question = question
        self.hosts = hosts

    def compose(self) -> ComposeResult:
        with Vertical(id="choose"):
            yield Label(self.question, id="choose-question", markup=False)
            yield OptionList(*(Option(f"{n}  ({what})", id=n) for n, what in self.hosts))
            yield Label("Enter picks, Esc cancels", classes="hint")

    def on_mount(self) -> None:
        self.query_one(OptionList).focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)
