"""A host down shows in colour in the Fleet view (a suspect one in the warning colour), and the
colour goes when the host comes back: checked on the style each row is drawn with."""

from __future__ import annotations

from pathlib import Path

from support.fleetbed import job_table, local_host, write_inventory
from support.uibed import colour_of, colours, wait_for
from textual.app import App, ComposeResult

from console.controller import Controller
from console.inventory import load
from console.states import HostState
from console.supervise.policy import Policy
from console.ui.app import HotspareApp
from console.ui.screens.fleet import FleetScreen
from console.ui.widgets.live_table import LiveTable


class TableApp(App[None]):
    def compose(self) -> ComposeResult:
        yield LiveTable(("name", "state"))


async def test_marked_rows_are_drawn_in_their_colour_and_unmarked_again() -> None:
    app = TableApp()
    async with app.run_test(size=(60, 8)) as pilot:
        t = app.query_one(LiveTable)
        rows = {"a": ("a", "down"), "b": ("b", "up"), "c": ("c", "suspect")}
        t.sync(rows, {"a": "error", "c": "warning", "gone": "error"})
        t.move_cursor(row=1)  # the cursor row keeps the cursor's colours
        await pilot.pause()
        error, warning = colour_of(t, "error"), colour_of(t, "warning")
        assert error is not None and warning is not None and error != warning
        assert colours(t, "a") == {error}
        assert colours(t, "c") == {warning}
        assert error not in colours(t, "b") and warning not in colours(t, "b")
        assert (t.mark("a"), t.mark("b"), t.mark("gone")) == ("error", None, None)
        t.sync(rows, {"c": "warning"})
        await pilot.pause()
        assert error not in colours(t, "a"), "a row no longer marked loses its colour"
        assert colours(t, "c") == {warning}


async def test_a_down_host_is_red_in_the_fleet_view(tmp_path: Path) -> None:
    inventory = write_inventory(
        tmp_path / "inventory.toml",
        hosts={
            "a": local_host(tmp_path / "a"),
            "b": local_host(tmp_path / "b", role="spare"),
            "c": local_host(tmp_path / "c", role="spare"),
        },
        jobs={"j": {"host": "a", "spares": ["b"], **job_table(steps=100)}},
    )
    ctl = Controller(load(inventory), Policy.MANUAL)
    app = HotspareApp(ctl, supervise=False)
    async with app.run_test(size=(120, 40)) as pilot:
        assert isinstance(app.screen, FleetScreen)
        t = app.screen.query_one(LiveTable)
        ctl.fleet.set_state("a", HostState.DOWN, "killed")
        ctl.fleet.set_state("c", HostState.SUSPECT, "missed heartbeats")
        await wait_for(pilot, lambda: t.cell("a", "state") == "down", 5, "a shown down")
        await pilot.pause()
        t.move_cursor(row=t.get_row_index("b"))
        await pilot.pause()
        error, warning = colour_of(t, "error"), colour_of(t, "warning")
        assert colours(t, "a") == {error} and colours(t, "c") == {warning}
        assert error not in colours(t, "b") and warning not in colours(t, "b")
        assert (t.mark("a"), t.mark("c"), t.mark("region:r1")) == ("error", "warning", None)
        ctl.fleet.set_state("a", HostState.UP, "back")
        await wait_for(pilot, lambda: t.cell("a", "state") == "up", 5, "a shown up")
        assert t.mark("a") is None and error not in colours(t, "a")
