"""The view bar, at 80x24 and 200x50: ``1 Fleet  2 Jobs  3 Incidents`` on every list view, the
one shown marked, and 1, 2, 3 (and Tab) switch between them as the bar says."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.uibed import SIZES, demo_app, screen_lines, view_bar

from console.ui.screens.fleet import FleetScreen
from console.ui.screens.incidents import IncidentsScreen
from console.ui.screens.jobs import JobsScreen


@pytest.mark.parametrize("size", SIZES)
async def test_the_view_bar_names_every_view_and_marks_the_one_shown(
    tmp_path: Path, size: tuple[int, int]
) -> None:
    app = demo_app(tmp_path)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        for key, screen, label in [
            ("2", JobsScreen, "2 Jobs"),
            ("3", IncidentsScreen, "3 Incidents"),
            ("1", FleetScreen, "1 Fleet"),
            ("tab", JobsScreen, "2 Jobs"),
        ]:
            await pilot.press(key)
            await pilot.pause()
            assert isinstance(app.screen, screen)
            bar = view_bar(app)
            assert bar.text.strip().startswith("1 Fleet  2 Jobs  3 Incidents")
            shown = [s.text.strip() for s in bar if s.style is not None and s.style.reverse]
            assert shown == [label], f"{key}: only the view shown is marked"
            lines = screen_lines(app)
            assert any("1 Fleet  2 Jobs  3 Incidents" in line for line in lines), "on screen"


async def test_the_view_bar_carries_the_filter_as_text_not_markup(tmp_path: Path) -> None:
    app = demo_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("3")
        assert "newest first" in view_bar(app).text
        await pilot.press("1", "slash", *"[b]x", "enter")
        await pilot.pause()
        bar = view_bar(app).text
        assert "1 Fleet  2 Jobs  3 Incidents" in bar and "/[b]x" in bar
