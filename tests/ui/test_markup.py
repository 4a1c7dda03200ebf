"""Text that comes from a host is shown as text, never read as markup: a command that writes
``[/]`` (a closing tag with nothing to close: an error as markup) and ``[bold red]x[/]`` to its
stderr and crashes; its executor's fault message carries them to the console. The app must
show them literally, in the notification, the last-event line and the job's log tail, and keep
running. Checked on what the widgets render, not on how they were called."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from support.fleetbed import EXECUTOR_ENV, local_host, write_inventory
from support.uibed import wait_for
from textual.widget import Widget
from textual.widgets import Static
from textual.widgets._toast import Toast

from console.controller import Controller
from console.inventory import load
from console.records.journal import Kind
from console.supervise.policy import Policy
from console.ui.app import HotspareApp
from console.ui.screens.job_detail import JobDetailScreen
from console.ui.screens.jobs import JobsScreen

pytestmark = pytest.mark.usefixtures("reap_executors")  # conftest: its processes killed after
HOSTILE = "[/] and [bold red]x[/]"
SCRIPT = f"import sys; print({HOSTILE!r}, file=sys.stderr); sys.exit(3)"


def shown(widget: Widget) -> str:
    """The plain text a widget draws."""
    rendered: Any = widget.render()
    return str(getattr(rendered, "plain", rendered))


def toasts(app: HotspareApp) -> list[str]:
    return [shown(t) for t in app.screen.query(Toast)]


async def test_a_hostile_fault_message_is_shown_literally(tmp_path: Path) -> None:
    inventory = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a"), "b": local_host(tmp_path / "b", role="spare")},
        jobs={
            "j": {
                "host": "a",
                "spares": ["b"],
                "executor": "command",
                "steps": 100,
                "command": {"argv": [sys.executable, "-c", SCRIPT]},
            }
        },
        restart_limit=1,
    )
    env = {h: dict(EXECUTOR_ENV) for h in ("a", "b")}
    ctl = Controller(load(inventory), Policy.AUTO, executor_env=env)
    faults: list[str] = []
    ctl.journal.subscribe(lambda e: faults.append(e.msg) if e.kind is Kind.FAULT else None)
    app = HotspareApp(ctl)
    async with app.run_test(size=(160, 40), notifications=True) as pilot:
        await wait_for(pilot, lambda: any(HOSTILE in m for m in faults), 90, "the fault")
        toast = await wait_for(
            pilot,
            lambda: [t for t in toasts(app) if HOSTILE in t],
            30,
            "the fault's notification, its brackets shown",
        )
        assert "fault" in toast[0]
        await pilot.press("2")
        assert isinstance(app.screen, JobsScreen)
        await pilot.press("enter")
        assert isinstance(app.screen, JobDetailScreen)
        await wait_for(
            pilot,
            lambda: HOSTILE in shown(app.screen.query_one("#log-tail", Static)),
            30,
            "the command's stderr in the log tail, as written",
        )
        await pilot.press("escape")
        assert isinstance(app.screen, JobsScreen)
        app.ctl.journal.record(Kind.ALERT, f"a: {HOSTILE}", host="a")
        await wait_for(
            pilot,
            lambda: HOSTILE in shown(app.screen.query_one(".last-event", Static)),
            30,
            "the last event line, as written",
        )
        await wait_for(
            pilot, lambda: sum(HOSTILE in t for t in toasts(app)) >= 2, 30, "the alert's toast"
        )
        await pilot.press("1")
        assert app.is_running and app.return_code is None, "the app kept running"
