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
from support.fleetbed import job_table, local_host, write_inventory

from console.controller import Controller
from console.inventory import load
from console.records.journal import Kind
from console.states import HostState, JobState
from console.supervise.policy import Policy
from console.ui.app import HotspareApp
from protocol.messages import GpuHealth, Health

SIZE = (120, 40)
T0 = 1_796_000_000.0  # a fixed wall time: 2026-11-30 00:53:20 UTC


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def health(util: float, temp: float, *, ecc: int = 0) -> Health:
    gpus = [
        GpuHealth(
            index=i,
            name="Fake H100",
            util_pct=util,
            mem_used_mb=40_960,
            mem_total_mb=81_920,
            temp_c=temp,
            power_w=350.0,
            ecc_corrected=0,
            ecc_uncorrected=ecc,
            pcie_replays=0,
        )
        for i in range(2)
    ]
    return Health(
        t=T0,
        cpu_pct=42.0,
        mem_used_pct=37.0,
        mem_available_mb=100_000.0,
        disk_free_mb=512_000.0,
        disk_total_mb=1_024_000.0,
        gpu_status="ok: 2 GPUs",
        containment="cgroup",
        gpus=tuple(gpus),
    )


def fixed_app(tmp_path: Path) -> HotspareApp:
    inventory = write_inventory(
        tmp_path / "inventory.toml",
        hosts={
            "gpu-a": local_host(tmp_path / "a"),
            "gpu-b": local_host(tmp_path / "b", role="spare"),
            "gpu-c": local_host(tmp_path / "c", region="r2", role="spare"),
        },
        jobs={"llm": {"host": "gpu-a", "spares": ["gpu-b"], **job_table(steps=800)}},
    )
    ctl = Controller(load(inventory), Policy.MANUAL)
    for i, util in enumerate([10, 35, 60, 85, 90, 95, 97, 99]):
        ctl.fleet.observe("gpu-a", health(util, 60 + i))
    ctl.fleet.observe("gpu-b", health(0, 35))
    ctl.fleet.observe("gpu-c", health(0, 91, ecc=3))
    ctl.fleet.hosts["gpu-a"].job = "llm"
    sup = ctl.jobs["llm"]
    sup.host, sup.spares, sup.step, sup.loss, sup.steps_per_s = "gpu-a", ["gpu-b"], 200, 2.5, 41.0
    sup.live.machine.move(JobState.DEPLOYING)
    sup.live.machine.move(JobState.RUNNING)  # a training job: its rate is current
    j = ctl.journal
    j.record(Kind.HOST_STATE, "gpu-c: up -> cordoned (operator)", at=T0, host="gpu-c")
    opened = {"class": "host_lost", "fault_at": T0, "last_step": 120, "planned": False}
    j.record(
        Kind.INCIDENT,
        "incident 1: llm on gpu-a: host_lost",
        at=T0 + 2.2,
        job="llm",
        host="gpu-a",
        incident=1,
        data={"phase": "detected", **opened},
    )
    for dt, phase, extra in [
        (2.4, "decided", {"action": "failover", "host": "gpu-b"}),
        (3.1, "transfer_done", {"host": "gpu-b", "replica_step": 118}),
        (3.4, "executor_up", {"host": "gpu-b"}),
        (3.6, "loaded", {"step": 118}),
        (3.8, "first_step", {"step": 119}),
    ]:
        j.record(
            Kind.INCIDENT,
            f"incident 1: {phase}",
            at=T0 + dt,
            job="llm",
            incident=1,
            data={"phase": phase, **extra},
        )
    hold_current(ctl)
    return HotspareApp(ctl, supervise=False)


HELD_S = 3600.0
"""Samples and heartbeats are held this far in the future for a snapshot, so what is current
stays current however slowly the snapshot is taken (a sample is old after two intervals)."""


def hold_current(ctl: Controller, *, except_host: str | None = None) -> None:
    later = time.monotonic() + HELD_S
    for name, rt in ctl.fleet.hosts.items():
        if name != except_host and rt.sampled_at:
            rt.sampled_at = later
    for sup in ctl.jobs.values():
        sup.last_seen = later
        if sup.steps_per_s and not sup.history:  # its newest step, as recent as its heartbeat
            sup.live.history.append((time.time() + HELD_S, sup.step, sup.loss, sup.steps_per_s))


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
