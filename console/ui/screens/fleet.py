"""Fleet: every host, grouped by region, with its health and its job."""

from __future__ import annotations

from typing import Any

from textual.binding import Binding

from console.states import HostState
from console.ui.screens.add_host import AddHostScreen
from console.ui.screens.base import ViewScreen
from console.ui.screens.host_detail import HostDetailScreen
from console.ui.view import FLEET_COLUMNS, REGION_PREFIX, Row, fleet_rows


class FleetScreen(ViewScreen):
    TITLE_TEXT = "Fleet"
    COLUMNS = FLEET_COLUMNS
    NOUN = "host"
    BINDINGS = [
        Binding("enter", "open", "details", id="fleet.open", show=False),
        Binding("d", "drain", "drain", id="fleet.drain"),
        Binding("o", "cordon", "cordon/uncordon", id="fleet.cordon"),
        Binding("n", "add_host", "add host", id="fleet.add_host"),
        Binding("k", "kill", "kill demo host", id="fleet.kill"),
        Binding("r", "revive", "revive demo host", id="fleet.revive"),
    ]

    def rows(self) -> dict[str, Row]:
        return fleet_rows(self.ctl)

    def is_item(self, key: str) -> bool:
        return not key.startswith(REGION_PREFIX)

    def open(self, key: str) -> None:
        self.app.push_screen(HostDetailScreen(key))

    def action_open(self) -> None:
        if host := self.one():
            self.open(host)

    def action_drain(self) -> None:
        if hosts := self.selected():
            self.act_on_each(
                "drain",
                hosts,
                self.ctl.drain_host,
                confirm="Drain {}? Their jobs move off with 0 lost steps.",
            )

    def action_cordon(self) -> None:
        if hosts := self.selected():
            if all(self.ctl.fleet.hosts[h].state is HostState.CORDONED for h in hosts):
                self.act_on_each("uncordon", hosts, self.ctl.uncordon)
            else:
                self.act_on_each("cordon", hosts, self.ctl.cordon)

    def action_kill(self) -> None:
        if hosts := self.selected():
            self.act_on_each(
                "kill",
                hosts,
                self.ctl.kill_host,
                confirm="Kill demo host {}? Its executors get SIGKILL.",
            )

    def action_revive(self) -> None:
        if hosts := self.selected():
            self.act_on_each("revive", hosts, self.ctl.revive_host)

    def action_add_host(self) -> None:
        if self.ctl.read_only:
            self.hotspare.act("add host", lambda: None)
            return
        regions = sorted(self.ctl.inv.regions)

        def added(result: tuple[str, dict[str, Any]] | None) -> None:
            if result is not None:
                name, table = result
                self.act(f"add host {name}", lambda: self.ctl.add_host(name, table))

        self.app.push_screen(AddHostScreen(regions), added)
