"""At 80 columns each list view shows a chosen few columns, whole and readable, and every key
bar still ends in ``? keys  q quit`` (the keys that do not fit are cut whole, with ``…``); at
200 columns everything is shown."""

from __future__ import annotations

from pathlib import Path

from support.uibed import fixed_app, screen_lines

from console.ui.app import HotspareApp
from console.ui.screens.base import ViewScreen
from console.ui.view import FLEET_COLUMNS, JOB_COLUMNS
from console.ui.view_detail import INCIDENT_COLUMNS
from console.ui.widgets.live_table import LiveTable

VIEWS = [("1", "host"), ("2", "job"), ("3", "#")]
"""Each list view's key and its first column's name."""


def table(app: HotspareApp) -> LiveTable:
    return app.screen.query_one(LiveTable)


async def test_at_80_columns_a_chosen_few_columns_fit_and_the_key_bar_keeps_help_and_quit(
    tmp_path: Path,
) -> None:
    app = fixed_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        for key, first in VIEWS:
            await pilot.press(key)
            await pilot.pause()
            screen = app.screen
            assert isinstance(screen, ViewScreen)
            t = table(app)
            assert t.columns_shown == screen.NARROW_COLUMNS
            assert t.virtual_size.width <= 80, f"{screen.LABEL}: no column scrolled off"
            lines = screen_lines(app)
            header = next(line for line in lines if line.startswith(f" {first} "))
            assert all(name in header for name in screen.NARROW_COLUMNS), header
            assert lines[-1].rstrip().endswith("? keys  q quit"), lines[-1]
        await pilot.press("1")
        await pilot.pause()
        lines = screen_lines(app)
        assert any(line.startswith("   gpu-a  up     runs llm      99% x2") for line in lines)
        assert "…" in lines[-1], "the Fleet view's keys that do not fit are cut, and say so"
        for keys in (["enter"], ["escape", "2", "enter"]):  # a host's and a job's detail
            await pilot.press(*keys)
            await pilot.pause()
            assert screen_lines(app)[-1].rstrip().endswith("? keys  q quit")


async def test_at_200_columns_every_column_and_key_is_shown(tmp_path: Path) -> None:
    app = fixed_app(tmp_path)
    async with app.run_test(size=(200, 50)) as pilot:
        for (key, _), columns in zip(
            VIEWS, (FLEET_COLUMNS, JOB_COLUMNS, INCIDENT_COLUMNS), strict=True
        ):
            await pilot.press(key)
            await pilot.pause()
            assert table(app).columns_shown == columns
        await pilot.press("1")
        await pilot.pause()
        bar = screen_lines(app)[-1]
        assert "n add host" in bar and "…" not in bar and bar.rstrip().endswith("q quit")


async def test_a_terminal_made_narrow_and_wide_again_follows(tmp_path: Path) -> None:
    app = fixed_app(tmp_path)
    async with app.run_test(size=(200, 50)) as pilot:
        await pilot.pause()
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        assert table(app).columns_shown == app.views["fleet"].NARROW_COLUMNS
        await pilot.resize_terminal(200, 50)
        await pilot.pause()
        assert table(app).columns_shown == FLEET_COLUMNS
