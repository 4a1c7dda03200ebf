"""The first minutes at the console, at 80x24 and 200x50: it opens on the first host with one
hint line naming the kill key and what to watch, and Tab in an open form moves between its
fields without switching the view behind it. Shown without running the controller, so
nothing but the screen is under test."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from support.uibed import SIZES, demo_app
from textual.widgets import Input, Label, Select, Static

from console.inventory import Host
from console.states import HostState
from console.ui.app import HotspareApp
from console.ui.screens.add_host import FIELDS, AddHostScreen
from console.ui.screens.fleet import FleetScreen
from console.ui.screens.jobs import JobsScreen
from console.ui.widgets.live_table import LiveTable


def hint(app: HotspareApp) -> str | None:
    """The hint line as shown, None when it is hidden."""
    box = app.screen.query_one(".hint", Static)
    return str(box.render()) if box.display and box.region.height == 1 else None


@pytest.mark.parametrize("size", SIZES)
async def test_the_console_opens_on_the_first_host_with_the_kill_hint(
    tmp_path: Path, size: tuple[int, int]
) -> None:
    app = demo_app(tmp_path)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        assert isinstance(app.screen, FleetScreen)
        table = app.screen.query_one(LiveTable)
        assert table.row_keys()[0] != "local-a", "a region header comes first"
        assert table.selected == "local-a", "the cursor starts on the first host"
        assert hint(app) == "K kills local-a: watch demo move to local-b"
        assert app.screen.query_one(".hint", Static).region.y < table.region.y, "above the table"

        await pilot.press("j")
        assert table.selected == "local-b", "the cursor moves on from there"
        app.screen.redraw()
        assert table.selected == "local-b", "and is not put back on the next draw"

        hosts = app.ctl.fleet
        hosts.set_state("local-a", HostState.SUSPECT, "test")
        hosts.set_state("local-a", HostState.DOWN, "test")
        app.screen.redraw()
        assert hint(app) == "r brings local-a back"
        hosts.set_state("local-a", HostState.UP, "test")
        app.screen.redraw()
        assert hint(app) == "K kills local-a: watch demo move to local-b"


@pytest.mark.parametrize("size", SIZES)
async def test_a_read_only_console_hints_no_key_it_has_turned_off(
    tmp_path: Path, size: tuple[int, int]
) -> None:
    app = demo_app(tmp_path, read_only=True)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        assert app.screen.query_one(LiveTable).selected == "local-a"
        assert hint(app) is None


@pytest.mark.parametrize("size", SIZES)
async def test_tab_moves_between_the_fields_of_an_open_form(
    tmp_path: Path, size: tuple[int, int]
) -> None:
    app = demo_app(tmp_path)
    async with app.run_test(size=size) as pilot:
        await pilot.press("n")
        form = app.screen
        assert isinstance(form, AddHostScreen)
        assert app.focused is not None and app.focused.id == "host-name"
        await pilot.press(*"gpu-9", "tab")
        assert app.screen is form and app.current_mode == "fleet", "the view stayed behind it"
        assert app.focused is not None and app.focused.id == "host-address"
        await pilot.press(*"10.0.0.9", "tab")
        assert app.focused is not None and app.focused.id == "host-user"
        await pilot.press("shift+tab", "shift+tab")
        assert app.focused is not None and app.focused.id == "host-name"
        assert form.query_one("#host-name", Input).value == "gpu-9"
        assert form.query_one("#host-address", Input).value == "10.0.0.9"
        await pilot.press("escape")
        assert isinstance(app.screen, FleetScreen)
        await pilot.press("tab")
        assert isinstance(app.screen, JobsScreen), "with no form open, Tab still switches views"


def test_the_form_marks_required_what_the_inventory_s_loader_requires() -> None:
    """The ssh host's root read ``(optional)``, yet an inventory without it does not load."""
    hints = dict(FIELDS)
    required = {f.name for f in msgspec.structs.fields(Host) if f.required}
    assert "root" in required
    for key in ("address", "user", "root"):
        marked = "(required" in hints[key]
        assert marked == (key in required or key == "address"), (key, hints[key])
    assert "(required)" in hints["name"]


async def test_an_ssh_host_without_a_root_is_refused_by_the_form(tmp_path: Path) -> None:
    app = demo_app(tmp_path)
    inventory = app.ctl.inv.path
    before = inventory.read_bytes()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("n")
        form = app.screen
        assert isinstance(form, AddHostScreen)
        form.query_one("#host-transport", Select).value = "ssh"
        await pilot.press(*"gpu-9", "tab", *"10.0.0.9", "enter")
        assert app.screen is form, "the form stays open"
        error = str(form.query_one("#add-host-error", Label).render())
        assert error == "a host needs a root folder (on the host)", error
    assert inventory.read_bytes() == before
