"""Detail screens, incidents, and the k9s conventions (filter, tags, palette) by keys against a
real controller on local demo hosts."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from support.helpers import cgroup_here
from support.uibed import console_app, fleet, notified, table, wait_for
from textual.widgets import Input, Markdown, OptionList, Sparkline, Static

from console.states import JobState
from console.ui.screens.add_host import AddHostScreen
from console.ui.screens.choose import ChooseHostScreen
from console.ui.screens.confirm import ConfirmScreen
from console.ui.screens.fleet import FleetScreen
from console.ui.screens.host_detail import HostDetailScreen
from console.ui.screens.incidents import IncidentReportScreen, IncidentsScreen
from console.ui.screens.job_detail import JobDetailScreen
from console.ui.screens.jobs import JobsScreen
from console.ui.widgets.live_table import LiveTable

SIZE = (120, 40)
pytestmark = pytest.mark.usefixtures("reap_executors")  # conftest: its processes killed after


def text(app: object, selector: str) -> str:
    return str(app.screen.query_one(selector, Static).render())  # type: ignore[attr-defined]


def rows(app: object, selector: str) -> dict[str, tuple[str, ...]]:
    return app.screen.query_one(selector, LiveTable)._shown  # type: ignore[attr-defined]


async def test_job_and_host_detail_then_the_incident_and_its_report(tmp_path: Path) -> None:
    from executors.testing.gpu_fake import write_state

    nvml = tmp_path / "nvml.json"
    write_state(nvml, {"devices": [{"name": "Fake H100", "util_pct": 87, "temp_c": 61}] * 2})
    # a run far longer than the test: on a loaded run at 47f87b7, 1500 steps had finished
    # before the kill, and no incident came
    app, _ = console_app(fleet(tmp_path, steps=1_000_000))
    ctl = app.ctl
    ctl.executor_env["a"]["HOTSPARE_FAKE_NVML"] = str(nvml)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(
            pilot,
            lambda: ctl.jobs["j"].step >= 60 and ctl.replicator.replica("j", "b").manifest,
            90,
            "step 60 and a replica on b",
        )
        await pilot.press("2", "enter")
        assert isinstance(app.screen, JobDetailScreen)
        assert "Job j" in text(app, "#job-summary") and "on a -> b" in text(app, "#job-summary")
        await wait_for(
            pilot,
            lambda: any("b (replica)" in r[-1] for r in rows(app, "#checkpoints").values()),
            30,
            "a checkpoint shown as verified on b",
        )
        newest = next(iter(rows(app, "#checkpoints").values()))
        assert newest[-1].startswith("a"), "the writer holds it"
        await wait_for(
            pilot,
            lambda: len(app.screen.query_one("#loss", Sparkline).data or []) >= 3,
            30,
            "a loss curve",
        )
        assert "now" in text(app, "#loss-label") and "steps/s" in text(app, "#speed-label")
        assert re.search(r"step \d+", text(app, "#log-tail")), "the log tail shows its output"
        await pilot.press("escape")
        assert isinstance(app.screen, JobsScreen)

        await pilot.press("1")
        hosts = table(app)
        hosts.move_cursor(row=hosts.get_row_index("a"))
        await pilot.press("enter")
        assert isinstance(app.screen, HostDetailScreen)
        await wait_for(pilot, lambda: len(rows(app, "#gpus")) == 2, 30, "both fake GPUs")
        assert rows(app, "#gpus")["1"][1:3] == ("Fake H100", "87%")
        assert text(app, "#gpus-title") == "GPUs (now)"
        contained = text(app, "#host-summary").splitlines()[-1]
        if cgroup_here() is None:  # made by hand here, beside the test's own cgroup
            assert contained == "runs contained by: a cgroup of its own (cgroup.kill)"
        else:
            assert contained.startswith("runs contained by: its fence only ("), contained
        assert app.screen.query_one("#host-summary").size.height == 2, "both lines shown"
        assert ": now 87%" in text(app, "#util-label")
        assert ctl.jobs["j"].state is JobState.RUNNING, "j still trains on a when a is killed"
        await pilot.press("K")
        assert isinstance(app.screen, ConfirmScreen)
        assert app.screen.question.startswith("Kill local host a?"), app.screen.question
        await pilot.press("y")
        await wait_for(pilot, lambda: "down" in text(app, "#host-summary"), 30, "a down")
        await wait_for(
            pilot, lambda: "a: up -> " in text(app, "#health-history"), 5, "a's state history"
        )
        await wait_for(pilot, lambda: "OLD" in text(app, "#gpus-title"), 5, "an old sample")
        assert "87% (" in text(app, "#util-label") and "now" not in text(app, "#util-label")
        await pilot.press("escape")
        assert isinstance(app.screen, FleetScreen)
        assert table(app).cell("a", "GPU").endswith(" old)"), "a's numbers shown as old"
        assert table(app).cell("a", "util trend") == "", "no live-looking sparkline"

        await pilot.press("3")
        assert isinstance(app.screen, IncidentsScreen)
        await wait_for(
            pilot,
            lambda: table(app).row_count and table(app).cell("1", "resolved") == "yes",
            60,
            "the incident resolved",
        )
        assert table(app).cell("1", "host") == "a"
        assert table(app).cell("1", "MTTR").endswith("s") and table(app).cell("1", "MTTR") != "-"
        await pilot.press("enter")
        assert isinstance(app.screen, IncidentReportScreen)
        report = app.screen.query_one("#report", Markdown)
        await wait_for(pilot, lambda: "MTTR" in report.source, 5, "the report")
        assert "lost steps" in report.source and "first_step" in report.source
        await pilot.press("escape")
        assert isinstance(app.screen, IncidentsScreen)


async def test_filter_tags_palette_chosen_target_and_add_host(tmp_path: Path) -> None:
    inventory = fleet(tmp_path, steps=5000)
    inventory.write_text("# operators' notes stay\n" + inventory.read_text())
    app, events = console_app(inventory)
    ctl = app.ctl
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("slash", *"r2")
        assert table(app).row_keys() == ["region:r2", "c"]
        await pilot.press("escape")
        assert table(app).row_keys() == ["region:r1", "a", "b", "region:r2", "c"]

        hosts = table(app)
        hosts.move_cursor(row=hosts.get_row_index("b"))
        await pilot.press("space", "space")  # b, then c: the cursor skips r2's header
        tagged = set(app.screen.tags)
        assert tagged == {"b", "c"}
        await pilot.press("o")
        await wait_for(
            pilot,
            lambda: all(ctl.fleet.hosts[h].state.value == "cordoned" for h in tagged),
            5,
            "every tagged host cordoned",
        )
        assert ctl.fleet.hosts["a"].state.value == "up", "untagged hosts untouched"
        assert table(app).cell("b", "host").startswith("●")
        await pilot.press("o")
        await wait_for(
            pilot, lambda: all(ctl.fleet.hosts[h].state.value == "up" for h in tagged), 5, "up"
        )
        await pilot.press("escape")
        assert not app.screen.tags

        await pilot.press("colon", *"cordon c")
        await wait_for(
            pilot, lambda: app.screen.query(OptionList) and True, 5, "the palette's results"
        )
        await wait_for(
            pilot,
            lambda: (
                "cordon c" in str(app.screen.query_one(OptionList).get_option_at_index(0).prompt)
            ),
            5,
            "cordon c first",
        )
        await pilot.press("enter")
        await wait_for(
            pilot, lambda: ctl.fleet.hosts["c"].state.value == "cordoned", 5, "c cordoned"
        )
        await pilot.press("colon", *"uncordon c", "enter")
        await wait_for(pilot, lambda: ctl.fleet.hosts["c"].state.value == "up", 5, "c up")

        await wait_for(pilot, lambda: ctl.jobs["j"].step >= 20, 90, "j training")
        await pilot.press("2", "t")
        assert isinstance(app.screen, ChooseHostScreen)
        options = app.screen.query_one(OptionList)
        assert [options.get_option_at_index(i).id for i in range(options.option_count)] == [
            "b",
            "c",
        ], "the spare first, then the other region"
        await pilot.press("down", "enter")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("y")
        await wait_for(
            pilot,
            lambda: ctl.jobs["j"].host == "c" and ctl.jobs["j"].state.value == "running",
            60,
            "j running on c",
        )
        assert any(e.msg == "fail over j to c" for e in events)

        await pilot.press("1", "n")
        assert isinstance(app.screen, AddHostScreen)
        await pilot.click("#host-name")
        await pilot.press(*"d")
        app.screen.query_one("#host-root", Input).value = str(tmp_path / "d")
        await pilot.press("enter")
        assert isinstance(app.screen, FleetScreen)
        await wait_for(pilot, lambda: "d" in table(app).row_keys(), 5, "d in the fleet")
        await wait_for(pilot, lambda: table(app).cell("d", "state") == "up", 10, "d up")
    saved = inventory.read_text()
    assert saved.startswith("# operators' notes stay\n"), "comments kept"
    assert tomllib.loads(saved)["hosts"]["d"]["root"] == str(tmp_path / "d")
    assert notified(app, "add host d: done")
