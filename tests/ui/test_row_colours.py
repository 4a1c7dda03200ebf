"""Rows coloured by state and health, at 80x24 and 200x50, not only down and suspect: a GPU
FAIL and a down host in the error colour, a draining host in the warning colour, drained and
cordoned hosts muted; in the Jobs view a failed job in the error colour, a failover awaiting
approval in the attention colour (bold), a stopped job muted, a finished one in the success
colour. Checked on the style each row is drawn with, off the cursor row."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from support.fleetbed import job_table, local_host, write_inventory
from support.uibed import SIZES, colour_of, colours

from console.controller import Controller
from console.fleet.health_rules import Finding, Severity
from console.inventory import load
from console.states import FailureKind, HostState, JobState
from console.supervise.policy import Policy
from console.ui.app import HotspareApp
from console.ui.widgets.live_table import LiveTable


def two_jobs(tmp_path: Path) -> HotspareApp:
    hosts = {h: local_host(tmp_path / h) for h in ("a", "b", "c", "d", "e")}
    inventory = write_inventory(
        tmp_path / "inventory.toml",
        hosts=hosts,
        jobs={
            "j1": {"host": "a", "spares": ["b"], **job_table()},
            "j2": {"host": "c", "spares": ["d"], **job_table()},
        },
    )
    return HotspareApp(Controller(load(inventory), Policy.MANUAL), supervise=False)


async def drawn(app: HotspareApp, off: str) -> LiveTable:
    """The table redrawn, its cursor on ``off`` (the cursor row keeps the cursor's colours)."""
    app.screen.redraw()
    t = app.screen.query_one(LiveTable)
    t.move_cursor(row=t.get_row_index(off))
    await asyncio.sleep(0)
    return t


def drawn_in(t: LiveTable, key: str, mark: str) -> bool:
    """Every cell of the row in the mark's colour, bold or dim where the mark is."""
    want = t.get_component_rich_style(f"live-table--{mark}", partial=True)
    line = t.render_line(t.get_row_index(key) + 1)
    styles = [s.style for s in line if s.style is not None and s.text.strip()]
    return t.mark(key) == mark and all(
        (want.color is None or style.color == want.color)
        and (not want.bold or style.bold)
        and (not want.dim or style.dim)
        for style in styles
    )


@pytest.mark.parametrize("size", SIZES)
async def test_hosts_are_coloured_by_state_and_health(
    tmp_path: Path, size: tuple[int, int]
) -> None:
    app = two_jobs(tmp_path)
    fleet = app.ctl.fleet
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        fleet.set_state("a", HostState.DRAINING, "operator")
        fleet.set_state("b", HostState.DRAINING, "operator")
        fleet.set_state("b", HostState.DRAINED, "operator")
        fleet.set_state("c", HostState.CORDONED, "operator")
        fleet.hosts["d"].findings = [Finding(Severity.FAIL, "gpu_lost", "GPU 0 fell off the bus")]
        t = await drawn(app, off="region:r1")
        await pilot.pause()
        assert drawn_in(t, "a", "warning")
        assert drawn_in(t, "b", "muted") and drawn_in(t, "c", "muted")
        assert drawn_in(t, "d", "error"), "GPU FAIL"
        assert t.mark("e") is None
        assert colour_of(t, "error") != colour_of(t, "warning")
        assert not {colour_of(t, "error"), colour_of(t, "warning")} & colours(t, "e")
        e = t.render_line(t.get_row_index("e") + 1)
        assert not any(s.style and s.style.dim for s in e if s.text.strip()), "e is not dim"

        fleet.hosts["d"].findings = [Finding(Severity.WARN, "gpu_hot", "GPU 0 at 91 C")]
        fleet.set_state("b", HostState.UP, "operator")
        t = await drawn(app, off="region:r1")
        await pilot.pause()
        assert drawn_in(t, "d", "warning"), "a WARN finding"
        assert t.mark("b") is None, "undrained: plain again"


@pytest.mark.parametrize("size", SIZES)
async def test_jobs_are_coloured_failed_awaiting_approval_stopped_finished(
    tmp_path: Path, size: tuple[int, int]
) -> None:
    app = two_jobs(tmp_path)
    j1, j2 = app.ctl.jobs["j1"], app.ctl.jobs["j2"]
    async with app.run_test(size=size) as pilot:
        await pilot.press("2")
        await pilot.pause()
        j1.approval = asyncio.get_running_loop().create_future()
        j2.failure = FailureKind.CRASH_LOOP
        j2.live.machine.move(JobState.FAILED)
        t = await drawn(app, off="j1")
        await pilot.pause()
        assert t.cell("j2", "state") == "failed (crash_loop)"
        assert drawn_in(t, "j2", "error")
        t = await drawn(app, off="j2")
        await pilot.pause()
        assert t.cell("j1", "state") == "pending (awaiting approval)"
        assert drawn_in(t, "j1", "attention")
        line = t.render_line(t.get_row_index("j1") + 1)
        assert all(s.style.bold for s in line if s.style and s.text.strip()), "bold"
        assert colour_of(t, "attention") not in (colour_of(t, "error"), colour_of(t, "warning"))

        j1.approval.set_result(False)
        j1.live.machine.move(JobState.STOPPED)
        t = await drawn(app, off="j2")
        await pilot.pause()
        assert drawn_in(t, "j1", "muted"), "stopped by the operator: no failure colour"
        for state in (JobState.PENDING, JobState.FINISHED):
            j1.live.machine.move(state)
        t = await drawn(app, off="j2")
        await pilot.pause()
        assert drawn_in(t, "j1", "success")
