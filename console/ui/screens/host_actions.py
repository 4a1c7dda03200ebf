"""The host actions, shared by the Fleet list (cursor or tagged rows) and a host's screen."""

from __future__ import annotations

from textual.binding import Binding

from console.ui.actions import HOST_ACTIONS
from console.ui.screens.base import LiveScreen

HOST_BINDINGS = [
    Binding("d", "host('drain')", "drain", id="host.drain"),
    Binding("o", "cordon", "cordon/uncordon", id="host.cordon"),
    Binding("k", "host('kill')", "kill demo host", id="host.kill"),
    Binding("r", "host('revive')", "revive demo host", id="host.revive"),
]


class HostActions(LiveScreen):
    NOUN = "host"

    def hosts_for_action(self) -> list[str]:
        """The hosts an action applies to (empty, with a note, if none)."""
        raise NotImplementedError

    def action_host(self, name: str) -> None:
        self.perform(HOST_ACTIONS[name], self.hosts_for_action())

    def action_cordon(self) -> None:
        """Cordon, or uncordon where every one of them is cordoned already."""
        hosts = self.hosts_for_action()
        uncordon = hosts and all(HOST_ACTIONS["uncordon"].applies(self.ctl, h) for h in hosts)
        self.perform(HOST_ACTIONS["uncordon" if uncordon else "cordon"], hosts)
