"""Sorting, at 80x24 and 200x50: ``>`` sorts the Fleet and Jobs views by the next column shown
(``<`` the one before, ``I`` the other way round), within each region, the header and the
view bar saying by which; numbers sort as numbers, ``-`` last. Columns keep their place as
values grow and shrink back (no shifting on every redraw)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support.fleetbed import job_table, local_host, write_inventory
from support.uibed import SIZES, manifest, screen_lines, view_bar

from console.controller import Controller
from console.inventory import load
from console.states import HostState
from console.supervise.policy import Policy
from console.ui.app import HotspareApp
from console.ui.screens.base import ViewScreen
from console.ui.widgets.live_table import LiveTable


def fleet_app(tmp_path: Path) -> HotspareApp:
    hosts = {h: local_host(tmp_path / h) for h in ("a", "b", "d", "gpu-9", "gpu-10")}
    hosts |= {h: local_host(tmp_path / h, region="r2") for h in ("c", "e")}
    inventory = write_inventory(
        tmp_path / "inventory.toml",
        hosts=hosts,
        jobs={
            "j1": {"host": "a", "spares": ["b"], **job_table(steps=800)},
            "j2": {"host": "c", "spares": ["e"], **job_table(steps=800)},
            "j3": {"host": "d", "spares": ["e"], **job_table(steps=800)},
        },
    )
    return HotspareApp(Controller(load(inventory), Policy.MANUAL), supervise=False)


def table(app: HotspareApp) -> LiveTable:
    return app.screen.query_one(LiveTable)


def header(app: HotspareApp) -> str:
    return table(app).render_line(0).text


@pytest.mark.parametrize("size", SIZES)
async def test_the_fleet_sorts_by_any_column_within_each_region(
    tmp_path: Path, size: tuple[int, int]
) -> None:
    app = fleet_app(tmp_path)
    fleet = app.ctl.fleet
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        t = table(app)
        order = ["region:r1", "a", "b", "d", "gpu-10", "gpu-9", "region:r2", "c", "e"]
        assert t.row_keys() == order, "the view's own order: by name"
        fleet.set_state("b", HostState.DRAINING, "operator")
        fleet.set_state("b", HostState.DRAINED, "operator")
        fleet.set_state("d", HostState.CORDONED, "operator")
        fleet.set_state("e", HostState.CORDONED, "operator")
        t.move_cursor(row=t.get_row_index("gpu-9"))

        await pilot.press("greater_than_sign")  # the host column: names sort naturally
        assert t.row_keys()[4:6] == ["gpu-9", "gpu-10"]
        assert "host ▲" in header(app) and "sorted by host ▲" in view_bar(app).text
        await pilot.press("greater_than_sign")
        assert t.row_keys() == [
            "region:r1",
            "d",  # cordoned
            "b",  # drained
            "a",
            "gpu-10",
            "gpu-9",
            "region:r2",
            "e",
            "c",
        ], "by state, each region's hosts under their region"
        assert "state ▲" in header(app) and "host ▲" not in header(app)
        assert t.selected == "gpu-9", "the cursor stays on its host"
        await pilot.press("I")
        assert t.row_keys()[1:4] == ["a", "gpu-10", "gpu-9"] and t.row_keys()[-2:] == ["c", "e"]
        assert "state ▼" in header(app)
        await pilot.pause()
        assert any("sorted by state ▼" in line for line in screen_lines(app))

        await pilot.press("less_than_sign", "less_than_sign")
        assert t.row_keys() == order and "▲" not in header(app) and "▼" not in header(app)
        screen = app.screen
        assert isinstance(screen, ViewScreen)
        for _ in t.columns_shown:  # every column shown in turn, then the view's order again
            await pilot.press("greater_than_sign")
            assert screen.sort_by in t.columns_shown
        await pilot.press("greater_than_sign")
        assert screen.sort_by is None and t.row_keys() == order


@pytest.mark.parametrize("size", SIZES)
async def test_jobs_sort_numbers_as_numbers_and_unknowns_last(
    tmp_path: Path, size: tuple[int, int]
) -> None:
    app = fleet_app(tmp_path)
    jobs = app.ctl.jobs
    jobs["j1"].step, jobs["j2"].step, jobs["j3"].step = 100, 5, 20
    jobs["j1"].loss, jobs["j3"].loss = 2.5, 10.25  # j2: none yet, '-'
    async with app.run_test(size=size) as pilot:
        await pilot.press("2")
        screen = app.screen
        assert isinstance(screen, ViewScreen)
        for _ in range(len(screen.COLUMNS)):
            await pilot.press("greater_than_sign")
            if screen.sort_by == "progress":
                break
        t = table(app)
        assert "progress ▲" in header(app)
        assert t.row_keys() == ["j2", "j3", "j1"], "5, 20, 100: not as text"
        await pilot.press("I")
        assert t.row_keys() == ["j1", "j3", "j2"]
        await pilot.press("I", "greater_than_sign")
        assert "loss ▲" in header(app)
        assert t.row_keys() == ["j1", "j3", "j2"], "2.5, 10.25, then '-'"
        await pilot.press("I")
        assert t.row_keys() == ["j3", "j1", "j2"], "'-' last either way"


async def test_columns_keep_their_place_as_values_grow_and_shrink(tmp_path: Path) -> None:
    app = fleet_app(tmp_path)
    sup = app.ctl.jobs["j1"]
    async with app.run_test(size=(200, 50)) as pilot:
        await pilot.press("2")
        await pilot.pause()
        headers: set[str] = set()
        for step, ckpt_age in [(5, 9.5), (50, 12.0), (500, 180.0), (799, 9.8), (5, 2.0)]:
            sup.step = step
            sup.checkpoint = manifest(step, time.time() - ckpt_age)
            app.screen.redraw()
            await pilot.pause()
            assert table(app).cell("j1", "progress").split()[1] == f"{step}/800"
            headers.add(header(app))
        assert len(headers) == 1, f"the columns moved: {headers}"
