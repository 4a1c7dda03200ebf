"""A replica's lag in the Jobs view is counted from the job's newest checkpoint, not from the
step training has reached: a replica of the newest checkpoint reads ``lag 0`` (with its age)
while training goes on; it lags once a newer checkpoint is written and not yet copied."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from support.uibed import demo_app, manifest, screen_lines

from console.replication.replicator import ReplicaState
from console.ui.app import HotspareApp
from console.ui.widgets.live_table import LiveTable


def replica(app: HotspareApp) -> str:
    app.screen.redraw()
    return app.screen.query_one(LiveTable).cell("demo", "replica")


def lag_and_age(cell: str, since: float) -> str:
    """The cell without its age, once the age is checked against the clock: 12 s old when the
    test began, and no older than the time since (a fresh-clone run drew "13s old")."""
    m = re.fullmatch(r"(.*), (\d+)s old\)", cell)
    assert m is not None, cell
    assert 12 <= int(m.group(2)) <= 12 + (time.time() - since) + 1, cell
    return m.group(1) + ")"


@pytest.mark.parametrize("size", [pytest.param((200, 50), id="200x50")])
async def test_a_replica_of_the_newest_checkpoint_has_no_lag(
    tmp_path: Path, size: tuple[int, int]
) -> None:
    app = demo_app(tmp_path)
    ctl, now = app.ctl, time.time()
    sup = ctl.jobs["demo"]
    sup.host, sup.spares, sup.step = "local-a", ["local-b"], 250
    sup.checkpoint = manifest(200, now - 20)
    ctl.replicator.state[("demo", "local-b")] = ReplicaState(manifest(200, now - 20), at=now - 12)
    async with app.run_test(size=size) as pilot:
        await pilot.press("2")
        await pilot.pause()
        assert lag_and_age(replica(app), now) == "local-b @200 (lag 0)", "50 steps since: no lag"
        await pilot.pause()
        assert any("local-b @200 (lag 0, 1" in line for line in screen_lines(app))

        sup.step, sup.checkpoint = 320, manifest(300, now)  # written, not copied yet
        assert lag_and_age(replica(app), now) == "local-b @200 (lag 100)"

        ctl.replicator.state[("demo", "local-b")] = ReplicaState(manifest(300, now), at=now - 1)
        assert replica(app).startswith("local-b @300 (lag 0, ")


async def test_no_checkpoint_known_no_lag_claimed(tmp_path: Path) -> None:
    """A console that has not heard of a checkpoint yet (a read-only one just started) says
    which replica is there, not a lag against the step."""
    app = demo_app(tmp_path)
    ctl = app.ctl
    sup = ctl.jobs["demo"]
    sup.host, sup.spares, sup.step = "local-a", ["local-b"], 250
    ctl.replicator.state[("demo", "local-b")] = ReplicaState(manifest(200, 0.0))
    async with app.run_test(size=(200, 50)) as pilot:
        await pilot.press("2")
        await pilot.pause()
        assert replica(app) == "local-b @200"
