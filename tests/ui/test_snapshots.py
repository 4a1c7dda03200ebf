"""Snapshots of the main screens at 120x40 (pytest-textual-snapshot): a fixed fleet state shown
without running the controller, so every cell is deterministic.

After an intended change of the look: ``pytest tests/ui/test_snapshots.py --snapshot-update``,
then review the SVGs in ``__snapshots__``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.uibed import HELD_S, T0, fixed_app

from console.records.journal import Kind
from console.states import HostState, JobState
from console.ui.app import HotspareApp

SIZE = (120, 40)


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def failed_over_app(tmp_path: Path) -> HotspareApp:
    """After the failover: gpu-a down, its last sample 2 minutes old; llm training on gpu-b at
    epoch 2 with no spare left; the incident resolved (its first step on gpu-b)."""
    app = fixed_app(tmp_path)
    ctl = app.ctl
    a = ctl.fleet.hosts["gpu-a"]
    a.machine.move(HostState.DOWN)  # journalled at a fixed time, as Fleet.set_state would
    ctl.journal.record(
        Kind.HOST_STATE, "gpu-a: up -> down (lease ended)", at=T0 + 2.2, host="gpu-a"
    )
    a.sampled_at, a.last_seen, a.job = time.monotonic() - 120.0, time.monotonic() - 125.0, None
    ctl.fleet.hosts["gpu-b"].job = "llm"
    sup = ctl.jobs["llm"]
    sup.host, sup.spares, sup.step, sup.steps_per_s = "gpu-b", [], 260, 39.0
    sup.live.rec.members = ["gpu-b"]  # its one member's rank moved there
    sup.rec.epoch, sup.rec.restarts = 2, 1
    for state in (JobState.FAILING_OVER, JobState.DEPLOYING, JobState.RUNNING):
        sup.live.machine.move(state)
    sup.live.history.clear()  # gpu-b's run: its newest step, as recent as its heartbeat
    sup.live.history.append((time.time() + HELD_S, 260, sup.loss, 39.0))
    return app


Compare = Callable[..., bool]


@pytest.mark.parametrize(
    ("name", "press"),
    [
        ("fleet", []),
        ("jobs", ["2"]),
        ("incidents", ["3"]),
        ("host_detail", ["enter"]),  # the cursor opens on the first host
        ("help", ["2", "question_mark"]),
        ("filter_and_tags", ["slash", "r", "2", "enter", "down", "space"]),
    ],
)
def test_screen(snap_compare: Compare, tmp_path: Path, name: str, press: list[Any]) -> None:
    assert snap_compare(fixed_app(tmp_path), press=press, terminal_size=SIZE)


@pytest.mark.parametrize(
    ("name", "press"),
    [
        ("fleet", []),
        ("jobs", ["2"]),
        ("incidents", ["3"]),
        ("dead_host_detail", ["enter"]),
        ("job_detail", ["2", "enter"]),
    ],
)
def test_screen_after_a_failover(
    snap_compare: Compare, tmp_path: Path, name: str, press: list[Any]
) -> None:
    assert snap_compare(failed_over_app(tmp_path), press=press, terminal_size=SIZE)
