"""Fleet: every host, grouped by region, with its health and its job."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from textual.binding import Binding

from console.ui.hint import demo_hint
from console.ui.screens.add_host import AddHostScreen
from console.ui.screens.base import ViewScreen
from console.ui.screens.host_actions import HOST_BINDINGS, HostActions
from console.ui.screens.host_detail import HostDetailScreen
from console.ui.view import (
    FLEET_COLUMNS,
    FLEET_WIDTHS,
    REGION_PREFIX,
    Row,
    RowCache,
    fleet_rows,
    host_marks,
)


class FleetScreen(HostActions, ViewScreen):
    TITLE_TEXT = "Fleet"
    LABEL = "Fleet"
    COLUMNS = FLEET_COLUMNS
    WIDTHS = FLEET_WIDTHS
    NARROW_COLUMNS = ("host", "state", "role", "GPU", "seen", "alerts")
    BINDINGS = [
        Binding("enter", "open", "details", id="fleet.open", show=False),
        *HOST_BINDINGS,
        Binding("n", "add_host", "add host", id="fleet.add_host"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self._rows: RowCache = {}

    def rows(self) -> dict[str, Row]:
        return fleet_rows(self.ctl, cache=self._rows)

    def marks(self, keys: Iterable[str]) -> dict[str, str]:
        return host_marks(self.ctl, keys)

    def is_item(self, key: str) -> bool:
        return not key.startswith(REGION_PREFIX)

    def hint(self) -> str:
        if not self.hotspare.may_act:
            return ""
        keys = {b.id: self.app.get_key_display(b) for b in HOST_BINDINGS}
        return demo_hint(self.ctl, kill_key=keys["host.kill"], revive_key=keys["host.revive"])

    def open(self, key: str) -> None:
        self.app.push_screen(HostDetailScreen(key))

    def hosts_for_action(self) -> list[str]:
        return self.selected()

    def action_add_host(self) -> None:
        if not self.hotspare.may_act:
            self.hotspare.act("add host", lambda: None)
            return
        regions = sorted(self.ctl.inv.regions)

        def added(result: tuple[str, dict[str, Any]] | None) -> None:
            if result is not None:
                name, table = result
                self.act(f"add host {name}", lambda: self.hotspare.acts.add_host(name, table))

        self.app.push_screen(AddHostScreen(regions), added)
