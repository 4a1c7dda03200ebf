"""The Fleet view's role column says what a host does now, at 80x24 and 200x50: the host that
trains a job ``runs`` it, whatever the inventory called it (the spare a job failed over to);
a job's spare says whose; a host with nothing to do says ``spare`` or ``idle``."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.uibed import SIZES, demo_app, screen_lines

from console.states import HostState
from console.ui.app import HotspareApp
from console.ui.widgets.live_table import LiveTable


def roles(app: HotspareApp) -> dict[str, str]:
    table = app.screen.query_one(LiveTable)
    return {h: table.cell(h, "role") for h in ("local-a", "local-b", "local-c")}


def shown_line(app: HotspareApp, host: str) -> str:
    return next(line for line in screen_lines(app) if line.startswith(f"   {host} "))


@pytest.mark.parametrize("size", SIZES)
async def test_the_role_is_what_the_host_does_now(tmp_path: Path, size: tuple[int, int]) -> None:
    app = demo_app(tmp_path)
    ctl = app.ctl
    sup = ctl.jobs["demo"]
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        assert roles(app) == {"local-a": "idle", "local-b": "spare", "local-c": "spare"}

        ctl.fleet.hosts["local-a"].job, sup.spares = "demo", ["local-b"]
        app.screen.redraw()
        assert roles(app) == {
            "local-a": "runs demo",
            "local-b": "spare of demo",
            "local-c": "spare",
        }
        await pilot.pause()
        assert "spare of demo" in shown_line(app, "local-b")

        # demo failed over to local-b, a spare in the inventory: it runs demo now
        ctl.fleet.set_state("local-a", HostState.DOWN, "test")
        ctl.fleet.hosts["local-a"].job, ctl.fleet.hosts["local-b"].job = None, "demo"
        sup.spares = ["local-c"]
        app.screen.redraw()
        assert roles(app) == {
            "local-a": "idle",
            "local-b": "runs demo",
            "local-c": "spare of demo",
        }
        await pilot.pause()
        line = shown_line(app, "local-b")
        assert "runs demo" in line and " spare " not in line
