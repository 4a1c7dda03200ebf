"""The operator console in tests: apps on local demo hosts (one running its controller, one a
fixed fleet state shown without it), waiting on a running app, and reading what it draws."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rich.color import Color
from textual.pilot import Pilot
from textual.strip import Strip
from textual.widgets import Static

from console.controller import Controller
from console.inventory import load
from console.records.journal import Event, Kind
from console.states import JobState
from console.supervise.policy import Policy
from console.ui.app import HotspareApp
from console.ui.widgets.live_table import LiveTable
from protocol.messages import GpuHealth, Health
from protocol.spec import CheckpointManifest
from support.fleetbed import EXECUTOR_ENV, job_table, local_host, stdlib_job, write_inventory
from support.wait import until

SIZES = [pytest.param((80, 24), id="80x24"), pytest.param((200, 50), id="200x50")]

UI_LEASE_S = 10.0
"""The lease these apps' controllers hold: the shipped default, not the controller tests' 3 s.

Here the controller runs inside the Textual app, on the app's loop, an arrangement the product
no longer has (``hotspare`` is a view of a controller service in its own process; its copy is
read-only and holds no lease). A screen's mount and render runs on that loop too: under two
CPU burners it stalled the loop 2.5-2.9 s (the journal's lapse evidence, the loop watch's
measure, at 40f5ea5), and a 3 s lease lapsed under a healthy executor. The leases under a
stalled loop are the controller tests' and benchmarks/lease_under_load.py's subject, not the
screens'."""


def reap(tmp_path: Path) -> None:
    """SIGKILL every process named with ``tmp_path`` but this one and tmux's: the tmux server
    keeps the argv of the client that started it, and every test's sessions live in it."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError, ValueError):
            args = cmdline.read_bytes().split(b"\0")
            pid = int(cmdline.parent.name)
            if pid == os.getpid() or os.readlink(f"/proc/{pid}/exe").endswith("/tmux"):
                continue
            if any(str(tmp_path).encode() in a for a in args):
                os.kill(pid, signal.SIGKILL)


def fleet(tmp_path: Path, *, torch: bool = False, **job: Any) -> Path:
    """Hosts a, b (its spare) and c (r2), and job j: a script with no torch (``stdlib_job``:
    the screens show any job alike), or the torch kind (``torch``: a test of what only it
    does, a checkpoint on request, its own log lines)."""
    return write_inventory(
        tmp_path / "inventory.toml",
        hosts={
            "a": local_host(tmp_path / "a"),
            "b": local_host(tmp_path / "b", role="spare"),
            "c": local_host(tmp_path / "c", region="r2", role="spare"),
        },
        jobs={"j": {"host": "a", "spares": ["b"], **(job_table if torch else stdlib_job)(**job)}},
        lease_s=UI_LEASE_S,
    )


def console_app(
    inventory: Path, policy: Policy = Policy.AUTO, *, read_only: bool = False
) -> tuple[HotspareApp, list[Event]]:
    env = {h: dict(EXECUTOR_ENV) for h in ("a", "b", "c")}
    ctl = Controller(load(inventory), policy, executor_env=env, read_only=read_only)
    events: list[Event] = []
    ctl.journal.subscribe(events.append)
    return HotspareApp(ctl), events


def demo_app(tmp_path: Path, *, read_only: bool = False) -> HotspareApp:
    """The shipped demo's shape: local-a trains demo, local-b its spare, local-c elsewhere."""
    inventory = write_inventory(
        tmp_path / "inventory.toml",
        hosts={
            "local-a": local_host(tmp_path / "a"),
            "local-b": local_host(tmp_path / "b", role="spare"),
            "local-c": local_host(tmp_path / "c", region="r2", role="spare"),
        },
        jobs={"demo": {"host": "local-a", "spares": ["local-b"], **job_table()}},
    )
    ctl = Controller(load(inventory), Policy.AUTO, read_only=read_only)
    return HotspareApp(ctl, supervise=False)


async def wait_for(
    pilot: Pilot[Any], predicate: Callable[[], Any], timeout: float, what: str
) -> Any:
    """Let the app run until ``predicate`` holds, or fail after ``timeout`` seconds."""
    return await until(predicate, timeout, what, pause=pilot.pause)


def table(app: HotspareApp) -> LiveTable:
    return app.screen.query_one(LiveTable)


def notified(app: HotspareApp, text: str) -> bool:
    return any(text in str(n.message) for n in app._notifications)


def screen_lines(app: HotspareApp) -> list[str]:
    """The terminal's lines as a person sees them."""
    return [strip.text for strip in app.screen._compositor.render_strips()]


def view_bar(app: HotspareApp) -> Strip:
    return app.screen.query_one(".view-title", Static).render_line(0)


def colours(t: LiveTable, key: str) -> set[Color | None]:
    """The colours a row's text is drawn in."""
    line = t.render_line(t.get_row_index(key) + 1)
    return {seg.style.color for seg in line if seg.style and seg.text.strip()}


def colour_of(t: LiveTable, mark: str) -> Color | None:
    return t.get_component_rich_style(f"live-table--{mark}").color


def manifest(step: int, at: float) -> CheckpointManifest:
    return CheckpointManifest(
        job="demo",
        step=step,
        file=f"step-{step:010d}.pt",
        size=1,
        sha256=f"{step:064d}",
        epoch=1,
        spec_hash="x",
        code_version="y",
        created_at=at,
    )


T0 = 1_796_000_000.0  # a fixed wall time: 2026-11-30 00:53:20 UTC


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
