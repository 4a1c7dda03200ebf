"""The operator console driven by keys against a real controller on local demo hosts."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support.uibed import console_app, fleet, notified, table, wait_for

from console.controller import Controller
from console.records.journal import Event, Kind, read
from console.states import HostState
from console.supervise.policy import Policy
from console.ui.app import HotspareApp
from console.ui.screens.confirm import ConfirmScreen
from console.ui.screens.fleet import FleetScreen
from console.ui.screens.help import HelpScreen
from console.ui.screens.incidents import IncidentsScreen
from console.ui.screens.jobs import JobsScreen
from console.ui.widgets.live_table import LiveTable

SIZE = (120, 40)
pytestmark = pytest.mark.usefixtures("reap_executors")  # conftest: its processes killed after


def step_shown(app: HotspareApp) -> int:
    """The step in the Jobs view's progress cell, e.g. '███░░ 120/3000  4%' -> 120."""
    return int(table(app).cell("j", "progress").split()[1].split("/")[0])


def replica_on_b(ctl: Controller) -> bool:
    return ctl.jobs["j"].step >= 40 and ctl.replicator.replica("j", "b").manifest is not None


def running_on_b(app: HotspareApp) -> bool:
    jobs = table(app)
    return (
        jobs.cell("j", "host -> spare").startswith("b ->") and jobs.cell("j", "state") == "running"
    )


def kinds_after(events: list[Event], action: str) -> list[Kind]:
    at = next(i for i, e in enumerate(events) if e.kind is Kind.ACTION and action in e.msg)
    return [e.kind for e in events[at + 1 :]]


async def test_the_views_show_the_fleet_by_region_and_the_job_training(tmp_path: Path) -> None:
    inventory = fleet(tmp_path, torch=True, steps=5000, checkpoint_every_steps=100_000)
    app, events = console_app(inventory)
    async with app.run_test(size=SIZE) as pilot:
        assert isinstance(app.screen, FleetScreen)
        hosts = table(app)
        assert list(hosts._shown) == ["region:r1", "a", "b", "region:r2", "c"]
        await wait_for(pilot, lambda: table(app).cell("a", "job") == "j", 60, "j shown on a")
        assert hosts.cell("a", "role") == "runs j"
        await wait_for(pilot, lambda: hosts.cell("b", "role") == "spare of j", 10, "b j's spare")
        assert hosts.cell("c", "role") == "spare", "a spare of no job"

        await pilot.press("2")
        assert isinstance(app.screen, JobsScreen)
        await wait_for(pilot, lambda: table(app).cell("j", "state") == "running", 60, "running")
        assert table(app).cell("j", "host -> spare") == "a -> b"
        first = await wait_for(pilot, lambda: step_shown(app), 60, "a step shown")
        await wait_for(pilot, lambda: step_shown(app) > first, 30, "the step to advance")

        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        assert "checkpoint now" in str(app.screen.query_one("#help-keys").render())
        await pilot.press("escape")
        assert isinstance(app.screen, JobsScreen)

        await pilot.press("c")
        await wait_for(
            pilot,
            lambda: Kind.CHECKPOINT in kinds_after(events, "checkpoint j now"),
            30,
            "a checkpoint after pressing c",
        )
        await pilot.press("tab")
        assert isinstance(app.screen, IncidentsScreen)
        await pilot.press("tab")
        assert isinstance(app.screen, FleetScreen)
    stopped = list(read(inventory.parent / "state" / "journal.jsonl"))[-1]
    assert stopped.kind is Kind.CONSOLE and stopped.msg == "console stopped", "closed on quit"


@pytest.mark.long  # the suite kills a host and sees the failover in the real console (test_tmux)
async def test_killing_the_primary_from_the_fleet_view_fails_the_job_over(tmp_path: Path) -> None:
    app, _ = console_app(fleet(tmp_path, steps=1500))
    ctl = app.ctl
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: replica_on_b(ctl), 90, "step 40 and a replica on b")
        hosts = table(app)
        hosts.move_cursor(row=hosts.get_row_index("a"))
        await pilot.press("K")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("y")
        assert isinstance(app.screen, FleetScreen)
        await wait_for(pilot, lambda: table(app).cell("a", "state") == "down", 30, "a down")
        await pilot.press("2")
        await wait_for(pilot, lambda: running_on_b(app), 60, "the job running on b")
        assert notified(app, "incident")
        await pilot.press("1")
        table(app).move_cursor(row=table(app).get_row_index("a"))
        await pilot.press("r")
        await wait_for(pilot, lambda: table(app).cell("a", "state") == "up", 15, "a revived")
        await pilot.press("2")
        await wait_for(
            pilot, lambda: table(app).cell("j", "state") == "finished", 120, "the job to finish"
        )
        assert table(app).cell("j", "host -> spare").startswith("b ->")


async def test_read_only_refuses_every_action(tmp_path: Path) -> None:
    app, events = console_app(fleet(tmp_path, steps=5000), read_only=True)
    async with app.run_test(size=SIZE) as pilot:
        assert "READ-ONLY" in app.sub_title
        hosts = table(app)
        hosts.move_cursor(row=hosts.get_row_index("a"))
        await pilot.press("K")
        assert not isinstance(app.screen, ConfirmScreen), "no confirmation: the action is off"
        assert notified(app, "read-only")
        await pilot.press("2", "c")
        await pilot.press("question_mark")
        assert "(off: read-only)" in str(app.screen.query_one("#help-keys").render())
    assert app.ctl.fleet.hosts["a"].state is not HostState.DOWN
    assert not [e for e in events if e.kind is Kind.ACTION]


@pytest.mark.long  # the suite approves a waiting failover (test_report_adds_up), denies one by keys (test_stop_is_not_failure), and `a` reaches approve (test_undo_actions)
async def test_under_manual_policy_a_failover_waits_for_the_operator_to_press_a(
    tmp_path: Path,
) -> None:
    app, events = console_app(fleet(tmp_path, steps=1500), Policy.MANUAL)
    ctl = app.ctl
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: replica_on_b(ctl), 90, "step 40 and a replica on b")
        ctl.kill_host("a")
        await pilot.press("2")
        await wait_for(
            pilot,
            lambda: "awaiting approval" in table(app).cell("j", "state"),
            30,
            "the failover to wait for approval",
        )
        await pilot.press("a")
        await wait_for(pilot, lambda: table(app).cell("j", "state") == "finished", 120, "finish")
        assert table(app).cell("j", "host -> spare").startswith("b ->")
    assert any(e.kind is Kind.ACTION and e.msg == "approve recovery of j" for e in events)


@pytest.mark.long  # the suite toggles o (test_screens), drains once confirmed (test_undo_actions) and answers n to a confirm (test_j_and_k, below)
async def test_o_toggles_cordon_and_d_drains_only_once_confirmed(tmp_path: Path) -> None:
    app, _ = console_app(fleet(tmp_path, steps=5000))
    async with app.run_test(size=SIZE) as pilot:
        hosts = table(app)
        hosts.move_cursor(row=hosts.get_row_index("c"))
        await pilot.press("o")
        await wait_for(pilot, lambda: table(app).cell("c", "state") == "cordoned", 5, "cordoned")
        await pilot.press("o")
        await wait_for(pilot, lambda: table(app).cell("c", "state") == "up", 5, "uncordoned")
        await pilot.press("d")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")
        assert app.ctl.fleet.hosts["c"].state is HostState.UP, "cancelled: nothing drained"
        await pilot.press("d", "y")
        await wait_for(pilot, lambda: table(app).cell("c", "state") == "drained", 5, "drained")


@pytest.mark.long  # the suite fails a job over by keys (test_screens' t), asks f's target (test_choose_targets), stops and starts by keys (test_stop_is_not_failure)
async def test_f_moves_the_job_to_its_spare_and_s_stops_it(tmp_path: Path) -> None:
    app, _ = console_app(fleet(tmp_path, steps=5000))
    ctl = app.ctl
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        await wait_for(pilot, lambda: replica_on_b(ctl), 90, "step 40 and a replica on b")
        await pilot.press("f")
        assert isinstance(app.screen, ConfirmScreen)
        assert app.screen.question.startswith("Fail j over to b (r1, its spare, replica @")
        await pilot.press("y")
        await wait_for(pilot, lambda: running_on_b(app), 60, "the job running on b")
        await pilot.press("s", "y")
        await wait_for(pilot, lambda: table(app).cell("j", "state") == "stopped", 30, "stopped")
        stopped_at = ctl.jobs["j"].step
        started = time.time()  # the curve is kept across the start: its points after this
        await pilot.press("g")
        await wait_for(
            pilot, lambda: table(app).cell("j", "state") == "running", 60, "started again"
        )

        def after_start() -> list[int]:
            return [step for t, step, _, _ in ctl.jobs["j"].history if t > started]

        await wait_for(pilot, after_start, 60, "progress after the start")
        first = after_start()[0]
        assert stopped_at - 10 <= first <= stopped_at + 10, "resumed where it stopped, not at 0"
        assert table(app).cell("j", "host -> spare").startswith("b ->")


async def test_a_redraw_tick_while_the_app_shuts_down_draws_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Textual removes a screen's widgets before its timers stop: a redraw tick in between
    found no table (NoMatches, once in CI). Here every table's unmount runs a tick."""
    ticks: list[str] = []

    def tick(self: LiveTable) -> None:
        ticks.append(type(self.screen).__name__)
        self.app.redraw()

    monkeypatch.setattr(LiveTable, "on_unmount", tick, raising=False)
    app, _ = console_app(fleet(tmp_path, steps=5000), read_only=True)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        await wait_for(pilot, lambda: isinstance(app.screen, JobsScreen), 10, "the Jobs view")
        await pilot.press("1")
    assert ticks, "no table was unmounted"
    assert app.return_code in (None, 0)


async def test_j_and_k_move_the_cursor_and_ctrl_c_quits_like_q(tmp_path: Path) -> None:
    """Keys users bring from k9s and vim: j/k move (k kills nothing: the kill is K), and
    Ctrl-C quits as q does, the controller closed first."""
    inventory = fleet(tmp_path, steps=5000)
    app, _ = console_app(inventory)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(
            pilot, lambda: {"a", "b", "c"} <= set(table(app).row_keys()), 30, "the hosts"
        )
        hosts = table(app)
        top = hosts.get_row_index("a")
        hosts.move_cursor(row=top)
        await pilot.press("j")
        assert hosts.cursor_row == top + 1 and hosts.selected != "a"
        await pilot.press("k")
        assert hosts.cursor_row == top and hosts.selected == "a"
        assert not isinstance(app.screen, ConfirmScreen), "k moves; it does not ask to kill"
        await pilot.press("K")
        assert isinstance(app.screen, ConfirmScreen), "K asks to kill the host at the cursor"
        await pilot.press("n")
        assert isinstance(app.screen, FleetScreen)
        await pilot.press("ctrl+c")
        await wait_for(pilot, lambda: not app.is_running, 30, "the app to quit")
    assert all(h.state is not HostState.DOWN for h in app.ctl.fleet.hosts.values())
    stopped = list(read(inventory.parent / "state" / "journal.jsonl"))[-1]
    assert stopped.kind is Kind.CONSOLE and stopped.msg == "console stopped", "closed on Ctrl-C"
