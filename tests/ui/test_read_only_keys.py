"""A read-only console's key bar, at 80x24 and 200x50: navigation only (filter, keys, quit),
no key that would change the fleet, in every view and on the detail screens; a console that
acts shows them. A key pressed anyway still says it is off."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.uibed import SIZES, demo_app
from textual.pilot import Pilot

from console.ui.app import HotspareApp
from console.ui.widgets.key_bar import KeyBar

ACTION_WORDS = ("drain", "cordon", "kill", "revive", "add host", "fail over", "approve", "deny")
ACTION_WORDS += ("checkpoint now", "stop", "start")


def key_bar(app: HotspareApp) -> str:
    return app.screen.query_one(KeyBar).render().plain


async def bars(app: HotspareApp, pilot: Pilot[Any]) -> dict[str, str]:
    """The key bar of the Fleet, Jobs and Incidents views and of a host's and a job's detail."""
    out: dict[str, str] = {}
    for name, keys in [
        ("fleet", ["1"]),
        ("host", ["enter"]),
        ("jobs", ["escape", "2"]),
        ("job", ["enter"]),
        ("incidents", ["escape", "3"]),
    ]:
        await pilot.press(*keys)
        await pilot.pause()
        out[name] = key_bar(app)
    return out


@pytest.mark.parametrize("size", SIZES)
async def test_a_read_only_console_shows_no_action_key(
    tmp_path: Path, size: tuple[int, int]
) -> None:
    app = demo_app(tmp_path, read_only=True)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        for view, bar in (await bars(app, pilot)).items():
            assert not [w for w in ACTION_WORDS if w in bar], f"{view}: {bar!r}"
            assert "? keys" in bar and "q quit" in bar, f"{view}: {bar!r}"
        await pilot.press("1", "d")
        await pilot.pause()
        assert any("read-only console: drain" in str(n.message) for n in app._notifications)


async def test_a_console_that_acts_shows_its_action_keys(tmp_path: Path) -> None:
    app = demo_app(tmp_path)
    async with app.run_test(size=(200, 50)) as pilot:
        await pilot.pause()
        shown = await bars(app, pilot)
        assert "d drain" in shown["fleet"] and "n add host" in shown["fleet"]
        assert "f fail over" in shown["jobs"] and "s stop" in shown["job"]
