"""The host actions, shared by the Fleet list (cursor or tagged rows) and a host's screen."""

from __future__ import annotations

from textual.binding import Binding

from console.ui.actions import HOST_ACTIONS
from console.ui.screens.base import LiveScreen

HOST_BINDINGS = [
    Binding("d", "drain", "drain", tooltip="drain; undrain a drained host", id="host.drain"),
    Binding("o", "cordon", "cordon/uncordon", id="host.cordon"),
    # not on a movement key (j/k move the cursor): a kill is typed on purpose
    Binding("K", "host('kill')", "kill demo host", id="host.kill"),
    Binding("r", "host('revive')", "revive demo host", id="host.revive"),
]


class HostActions(LiveScreen):
    NOUN = "host"

    def hosts_for_action(self) -> list[str]:
        """The hosts an action applies to (empty, with a note, if none)."""
        raise NotImplementedError

    def action_host(self, name: str) -> None:
        self.perform(HOST_ACTIONS[name], self.hosts_for_action())

    def action_drain(self) -> None:
        """Drain, or undrain where every one of them is drained."""
        self._toggle("drain", "undrain")

    def action_cordon(self) -> None:
        """Cordon, or uncordon where every one of them is cordoned already."""
        self._toggle("cordon", "uncordon")

    def _toggle(self, do: str, undo: str) -> None:
        hosts = self.hosts_for_action()
        undoing = hosts and all(HOST_ACTIONS[undo].applies(self.ctl, h) for h in hosts)
        self.perform(HOST_ACTIONS[undo if undoing else do], hosts)
