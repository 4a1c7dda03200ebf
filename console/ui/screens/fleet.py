"""Fleet: every host, grouped by region, with its health and its job."""

from __future__ import annotations

from textual.binding import Binding

from console.states import HostState
from console.ui.screens.base import ViewScreen
from console.ui.view import FLEET_COLUMNS, REGION_PREFIX, Row, fleet_rows


class FleetScreen(ViewScreen):
    TITLE_TEXT = "Fleet"
    COLUMNS = FLEET_COLUMNS
    BINDINGS = [
        Binding("d", "drain", "drain", id="fleet.drain"),
        Binding("o", "cordon", "cordon/uncordon", id="fleet.cordon"),
        Binding("k", "kill", "kill demo host", id="fleet.kill"),
        Binding("r", "revive", "revive demo host", id="fleet.revive"),
    ]

    def rows(self) -> dict[str, Row]:
        return fleet_rows(self.ctl)

    def _host(self) -> str | None:
        key = self.table.selected
        if key is None or key.startswith(REGION_PREFIX):
            self.notify("select a host first", severity="warning")
            return None
        return key

    def action_drain(self) -> None:
        if host := self._host():
            self.act(
                f"drain {host}",
                lambda: self.ctl.drain_host(host),
                confirm=f"Drain {host}? Its jobs move off with 0 lost steps.",
            )

    def action_cordon(self) -> None:
        if host := self._host():
            if self.ctl.fleet.hosts[host].state is HostState.CORDONED:
                self.act(f"uncordon {host}", lambda: self.ctl.uncordon(host))
            else:
                self.act(f"cordon {host}", lambda: self.ctl.cordon(host))

    def action_kill(self) -> None:
        if host := self._host():
            self.act(
                f"kill {host}",
                lambda: self.ctl.kill_host(host),
                confirm=f"Kill demo host {host}? Its executors get SIGKILL.",
            )

    def action_revive(self) -> None:
        if host := self._host():
            self.act(f"revive {host}", lambda: self.ctl.revive_host(host))
