"""A finished job's notification shows its params sha256 shortened (the whole 64 hex digits
wrapped over three lines of the toast); the journal keeps the whole one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from support.fleetbed import job_table, local_host, write_inventory
from support.uibed import wait_for
from textual.widgets._toast import Toast

from console.controller import Controller
from console.inventory import load
from console.records.journal import Kind, read
from console.supervise.policy import Policy
from console.ui.app import HotspareApp

SHA = "0123456789abcdef" * 4


def shown(toast: Toast) -> str:
    rendered: Any = toast.render()
    return str(getattr(rendered, "plain", rendered))


async def test_the_finished_notification_shortens_the_sha(tmp_path: Path) -> None:
    inventory = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a")},
        jobs={"j": {"host": "a", **job_table(steps=100)}},
    )
    ctl = Controller(load(inventory), Policy.MANUAL)
    app = HotspareApp(ctl, supervise=False)
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        ctl.journal.record(  # as recovery records it
            Kind.FINISHED,
            f"j: finished at step 100, params sha256 {SHA}",
            job="j",
            host="a",
            data={"step": 100, "params_sha256": SHA},
        )
        (toast,) = await wait_for(
            pilot, lambda: list(app.screen.query(Toast)), 5, "the finished notification"
        )
        text = shown(toast)
        assert "j: finished at step 100, params sha256 0123456789ab…" in text
        assert SHA not in text and SHA[12:] not in text.replace("\n", "")
        await pilot.pause()
        assert toast.size.height <= 3, "title and one line of message, not the sha wrapped"
    (finished,) = [e for e in read(ctl.journal.path) if e.kind is Kind.FINISHED]
    assert SHA in finished.msg, "the journal keeps the whole sha"
