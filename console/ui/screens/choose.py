"""Pick a host from a list (fail over to a chosen host): Enter picks, Esc cancels."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option

from console.jobs.controller import Controller


def failover_targets(ctl: Controller, job: str) -> list[tuple[str, str]]:
    """Hosts ``job`` could move to now, best first: its spares (with their replica), then the
    same region, then the others; each with a one-line description."""
    sup = ctl.jobs[job]
    usable = ctl.fleet.usable(exclude={sup.host} if sup.host else None)
    reserved = ctl.reserved(job)
    region = ctl.inv.hosts[sup.host].region if sup.host else None

    def rank(name: str) -> tuple[int, int, str]:
        h = ctl.inv.hosts[name]
        spare = sup.spares.index(name) if name in sup.spares else len(sup.spares)
        return (spare, 0 if h.region == region else 1, name)

    out = []
    for name in sorted(usable, key=rank):
        h = ctl.inv.hosts[name]
        what = [h.region]
        if name in sup.spares:
            rep = ctl.replicator.replica(job, name).manifest
            what.append(f"its spare, replica @{rep.step}" if rep else "its spare, no replica yet")
        elif name in reserved:
            what.append(f"spare of {reserved[name]}")
        else:
            what.append(h.role)  # the inventory's: a free spare of no job, or a primary
        out.append((name, ", ".join(what)))
    return out


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
