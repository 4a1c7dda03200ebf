"""A host's numbers have an age: an old sample is shown as old, never as live (issue 14 item 2).

The demo's killed host kept showing ``95% x2 120/160G 64C 824W`` while down. Here the numbers
come from a real executor's Health messages; the evidence is the text of the Fleet and Jobs rows
and of the host screen's labels, read at chosen moments.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from support.fleetbed import EXECUTOR_ENV, local_host, stdlib_job, until, write_inventory

from console.controller import Controller
from console.fleet.hosts import STALE_AFTER_SAMPLES
from console.fleet.monitor import REACH_EVERY_S
from console.inventory import load
from console.states import JOB_TRANSITIONS, JobState, Machine
from console.supervise.policy import Policy
from console.ui.view import FLEET_COLUMNS, JOB_COLUMNS, fleet_rows, job_rows
from console.ui.view_detail import sample_label
from protocol.messages import GpuHealth, Health

GPU = FLEET_COLUMNS.index("GPU")
LIVE = [FLEET_COLUMNS.index(c) for c in ("GPU mem", "temp/power", "CPU/mem", "disk", "util trend")]
RATE = JOB_COLUMNS.index("steps/s")


def inventory(tmp_path: Path) -> Path:
    return write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a"), "b": local_host(tmp_path / "b", role="spare")},
        # no warm standby: b runs no executor, so only the reachability probe hears it (with
        # one, b's seen cell follows its heartbeats, and a loaded run saw one 0.5 s late)
        # the command kind (a stdlib script): its executor's Health is the torch kind's
        jobs={"j": {"host": "a", "spares": ["b"], **stdlib_job(steps=100_000, warm_standby=False)}},
    )


def controller(path: Path) -> Controller:
    env = {h: dict(EXECUTOR_ENV) for h in ("a", "b")}
    return Controller(load(path), Policy.AUTO, executor_env=env)


def sample() -> Health:
    gpu = GpuHealth(index=0, name="H100", util_pct=95.0, mem_used_mb=61440.0, mem_total_mb=81920.0)
    return Health(
        t=0.0,
        cpu_pct=40.0,
        mem_used_pct=50.0,
        mem_available_mb=1024.0,
        disk_free_mb=10240.0,
        disk_total_mb=20480.0,
        gpus=(gpu,),
    )


def test_a_sample_is_shown_while_current_and_as_its_age_once_two_intervals_old(
    tmp_path: Path,
) -> None:
    ctl = controller(inventory(tmp_path))
    beat = ctl.inv.console.heartbeat_s
    ctl.fleet.observe("a", sample())
    at = ctl.fleet.hosts["a"].sampled_at
    fresh = fleet_rows(ctl, now=at + 0.1)["a"]
    assert fresh[GPU].startswith("95%"), fresh
    assert "%" in fresh[LIVE[2]] and fresh[LIVE[3]] == "10 GiB", fresh
    old_at = at + STALE_AFTER_SAMPLES * beat + 1.5
    old = fleet_rows(ctl, now=old_at)["a"]
    assert old[GPU] == f"({STALE_AFTER_SAMPLES * beat + 1.5:.1f}s old)", old
    assert all(old[i] in ("-", "") for i in LIVE), f"numbers shown as live: {old}"
    assert sample_label(ctl.fleet.hosts["a"], at + 0.1) == "now"
    assert sample_label(ctl.fleet.hosts["a"], old_at).endswith("ago, OLD")
    assert sample_label(ctl.fleet.hosts["b"], at) == "no sample yet"
    # A source that samples every 10 s (a spare's health probe): 3 s old is current.
    ctl.fleet.observe("b", sample(), every_s=10.0)
    at_b = ctl.fleet.hosts["b"].sampled_at
    assert fleet_rows(ctl, now=at_b + 3.0)["b"][GPU].startswith("95%")
    assert fleet_rows(ctl, now=at_b + 21.0)["b"][GPU] == "(21s old)"


async def test_a_killed_host_shows_its_last_numbers_as_old_and_its_job_no_rate(
    tmp_path: Path,
) -> None:
    ctl = controller(inventory(tmp_path))
    sup, a = ctl.jobs["j"], ctl.fleet.hosts["a"]
    task = asyncio.create_task(ctl.run())
    try:
        await until(
            lambda: (a.samples >= 2 and sup.step >= 20) or task.done(), 90, "samples from a"
        )
        assert not task.done(), task
        row = fleet_rows(ctl)["a"]
        assert "%" in row[LIVE[2]], f"a live sample shows its numbers: {row}"
        assert job_rows(ctl)["j"][RATE] != "-"
        ctl.kill_host("a")
        killed = time.monotonic()
        stale = await until(
            lambda: (r := fleet_rows(ctl)["a"])[GPU].endswith(" old)") and r, 30, "old numbers"
        )
        waited = time.monotonic() - killed
        assert waited <= STALE_AFTER_SAMPLES * ctl.inv.console.heartbeat_s + 1.0, waited
        assert all(stale[i] in ("-", "") for i in LIVE), stale
        await until(lambda: job_rows(ctl)["j"][RATE] == "-", 30, "no steps/s for a silent job")
        waited = time.monotonic() - killed
        assert waited <= STALE_AFTER_SAMPLES * ctl.inv.console.heartbeat_s + 1.0, waited
        assert sample_label(a, time.monotonic()).endswith("ago, OLD")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await ctl.close()


async def test_a_spare_heard_only_by_the_monitor_stays_ok_in_the_seen_column(
    tmp_path: Path,
) -> None:
    """Idle hosts are heard by the reachability probe every 2 s, not by heartbeats (0.25 s
    here): the seen cell of a healthy spare said 2.5s, 3.5s... between probes."""
    ctl = controller(inventory(tmp_path))
    seen_col = FLEET_COLUMNS.index("seen")
    task = asyncio.create_task(ctl.run())
    try:
        await until(lambda: fleet_rows(ctl)["b"][seen_col] == "ok" or task.done(), 30, "b seen")
        shown: set[str] = set()
        end = time.monotonic() + 3 * REACH_EVERY_S
        while time.monotonic() < end and not task.done():
            shown.add(fleet_rows(ctl)["b"][seen_col])
            await asyncio.sleep(0.05)
        assert not task.done(), task
        assert shown == {"ok"}, f"a healthy spare's seen cell showed {shown}"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await ctl.close()


async def test_steps_per_s_is_shown_only_while_the_newest_step_is_recent(tmp_path: Path) -> None:
    """An executor heard from but not training yet (just started after a move) shows no rate:
    the one it had was the old run's, and read as current for the 12-15 s the new one took to
    start. A step reported within two heartbeats plus three step times is current."""
    ctl = controller(inventory(tmp_path))
    try:
        sup = ctl.jobs["j"]
        live = sup.live
        live.machine = Machine(JobState.RUNNING, JOB_TRANSITIONS)
        mono, now = time.monotonic(), time.time()
        live.last_seen = mono  # the new executor's hello, just now
        beat = STALE_AFTER_SAMPLES * ctl.inv.console.heartbeat_s
        live.steps_per_s = 41.0  # as the watch sets it with each Progress
        live.history.append((now - beat - 1.0, 200, 2.5, 41.0))  # the old run's last step
        assert job_rows(ctl, now=now, mono=mono)["j"][RATE] == "-"
        live.history.append((now - 0.1, 201, 2.5, 41.0))
        assert job_rows(ctl, now=now, mono=mono)["j"][RATE] == "41.0"
        # a slow job (0.1 steps/s): its newest step 20 s ago is still current
        live.steps_per_s = 0.1
        live.history.append((now - 20.0, 202, 2.5, 0.1))
        assert job_rows(ctl, now=now, mono=mono)["j"][RATE] == "0.1"
    finally:
        await ctl.close()
