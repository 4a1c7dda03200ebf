"""Spares are watched (issue 14 item 3): every host no executor reports on gets the light health
probe; one that fails a rule or the probe is not chosen as a failover target, and a job whose
spares are all unfit is an alert.

Real executors, real probes (``hotspare-executor health`` run through the local transport), a
fake GPU per host (its JSON file) and a real tmpfs for a full disk. Evidence is read from the
journal file, the hosts' folders and the Fleet view's rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.fleetbed import EXECUTOR_ENV, local_host, stdlib_job, until, write_inventory
from support.helpers import REPO, alive, env_with, serving, tmpfs

from console.controller import Controller
from console.inventory import load
from console.reach.deploy import deploy
from console.reach.health_probe import probe_health
from console.reach.transport.factory import open_transport
from console.reach.transport.local import LocalTransport
from console.records.journal import Event, Kind, read
from console.states import JobState
from console.supervise.policy import Policy
from console.ui.view import FLEET_COLUMNS, fleet_rows
from executors.testing.gpu_fake import write_state

HEALTHY = {"devices": [{"name": "Fake H100", "temp_c": 45}]}
GPU = FLEET_COLUMNS.index("GPU")


def journal(ctl: Controller) -> list[Event]:
    return list(read(ctl.journal.path))


def health_events(ctl: Controller, host: str, severity: str) -> list[Event]:
    return [
        e
        for e in journal(ctl)
        if e.kind is Kind.HEALTH and e.host == host and e.data["severity"] == severity
    ]


@contextlib.asynccontextmanager
async def running(ctl: Controller, *, stay: bool = False):  # type: ignore[no-untyped-def]
    task = asyncio.create_task(ctl.run(stay=stay))
    try:
        yield task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await ctl.close()


# --- the setting --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expect"),
    [
        ("0.1", "console.health_probe_s: Expected `float` >= 0.5, got 0.1"),
        ('"10s"', "console.health_probe_s: Expected `float`, got `str`"),
    ],
)
def test_a_bad_health_probe_s_is_one_line_and_exit_2(
    tmp_path: Path, value: str, expect: str
) -> None:
    path = tmp_path / "inventory.toml"
    path.write_text(f"[console]\nlease_s = 5\nhealth_probe_s = {value}\n")
    r = subprocess.run(
        [sys.executable, "-m", "console.cli", "--inventory", str(path), "check"],
        cwd=REPO,
        env=env_with(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr == f"hotspare: {path}:3: {expect}\n"


# --- a spare's GPU dies: not a target; none healthy: an alert -------------------------------


async def test_a_spare_with_a_dead_gpu_is_passed_over_for_the_healthy_one(tmp_path: Path) -> None:
    nvml = {h: tmp_path / f"nvml-{h}.json" for h in "abc"}
    for path in nvml.values():
        write_state(path, HEALTHY)
    inventory = write_inventory(
        tmp_path / "inventory.toml",
        hosts={
            "a": local_host(tmp_path / "a"),
            "b": local_host(tmp_path / "b", role="spare", priority=1),
            "c": local_host(tmp_path / "c", role="spare", priority=2),
        },
        jobs={
            "j": {"host": "a", "spares": ["b", "c"], **stdlib_job(steps=100_000, warm_standby=None)}
        },
        health_probe_s=0.5,
    )
    env = {h: {**EXECUTOR_ENV, "HOTSPARE_FAKE_NVML": str(nvml[h])} for h in "abc"}
    ctl = Controller(load(inventory), Policy.AUTO, executor_env=env)
    sup, hosts = ctl.jobs["j"], ctl.fleet.hosts
    async with running(ctl) as task:
        await until(
            lambda: (
                task.done()
                or (
                    sup.step >= 20
                    and all(hosts[s].samples and hosts[s].health[-1].gpus for s in "bc")
                    and any(e.msg == "j: warm standby ready on b" for e in journal(ctl))
                )
            ),
            90,
            "the job training, both spares probed and the standby on b",
        )
        assert not task.done(), task
        assert sup.spares == ["b", "c"]
        standby = int((tmp_path / "b" / "jobs" / "j" / "executor.pid").read_text())
        for spare in "bc":  # the Fleet view shows a spare's numbers, from its probe
            assert fleet_rows(ctl)[spare][GPU].startswith("0%"), fleet_rows(ctl)[spare]

        write_state(nvml["b"], {"devices": [{"name": "Fake H100", "lost": True}]})
        write_state(nvml["c"], {"devices": [{"name": "Fake H100", "ecc_uncorrected": 2}]})
        alert = await until(
            lambda: [e for e in journal(ctl) if e.kind is Kind.ALERT and "healthy spare" in e.msg],
            30,
            "the no-healthy-spare alert",
        )
        assert alert[0].msg.startswith("job j has no healthy spare left (b: GPU 0 fell off")
        assert "c: GPU 0: 2 uncorrectable ECC errors" in alert[0].msg
        assert {e.data["rule"] for e in health_events(ctl, "b", "fail")} == {"gpu_lost"}
        assert ctl.fleet.usable() == set()
        # the warm standby readied on b at the start is stopped: b can take no job
        # (its process gone, from /proc: one killed because it never heard its Stop, as on
        # a loaded fresh-clone run, leaves its pid file behind)
        await until(lambda: not alive(standby), 30, "the standby on b stopped")
        (stopped,) = [e for e in journal(ctl) if "warm standby on b stopped" in e.msg]
        assert stopped.msg.endswith("GPU 0 fell off the bus"), stopped.msg

        write_state(nvml["c"], HEALTHY)
        await until(
            lambda: any(e.msg == "job j: spare c is healthy again" for e in journal(ctl)),
            30,
            "c healthy again",
        )
        assert health_events(ctl, "c", "ok"), "the host's recovery is journalled"
        assert ctl.fleet.failing("b"), "b's GPU is still gone"
        await until(  # the standby follows the spares: to c, healthy again
            lambda: any(e.msg == "j: warm standby ready on c" for e in journal(ctl)),
            60,
            "a warm standby on c",
        )

        ctl.kill_host("a")
        await until(
            lambda: task.done() or (sup.host == "c" and sup.state is JobState.RUNNING),
            60,
            "the job running on c",
        )
        assert not task.done(), task
        # from /proc: the standby killed on b (it never heard its Stop, on a loaded run) left
        # its pid file behind, which a fresh-clone run at 8475a70 read as an executor on b
        assert not serving(tmp_path / "b" / "jobs" / "j"), "b runs an executor"
        assert serving(tmp_path / "c" / "jobs" / "j")
    decided = [
        e for e in journal(ctl) if e.kind is Kind.INCIDENT and e.data.get("phase") == "decided"
    ]
    assert [e.data.get("host") for e in decided] == ["c"], decided


# --- a spare's disk fills: unfit; a probe that fails: a finding, not a crash -----------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs, unmounted after the test."""
    with tmpfs(tmp_path / "disk", "16m") as where:
        yield where


def fill(disk: Path) -> Path:
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for size in (1 << 20, 4096):
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * size):
                    pass
    finally:
        os.close(fd)
    return filler


def fake_python(path: Path, health: str) -> str:
    """An interpreter that runs everything but the health probe, which does ``health``."""
    path.write_text(
        f'#!/bin/sh\nif [ "$3" = health ]; then {health}; fi\nexec {sys.executable} "$@"\n'
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


async def test_a_full_disk_or_a_failed_probe_makes_a_host_unfit(
    tmp_path: Path, small_disk: Path
) -> None:
    hosts: dict[str, dict[str, Any]] = {
        "full": local_host(small_disk / "root", role="spare"),
        "hangs": local_host(tmp_path / "h", python=fake_python(tmp_path / "py1", "exec sleep 30")),
        "babbles": local_host(
            tmp_path / "g", python=fake_python(tmp_path / "py2", "echo hi; exit 0")
        ),
        "dies": local_host(
            tmp_path / "d", python=fake_python(tmp_path / "py3", "echo no >&2; exit 3")
        ),
    }
    inventory = write_inventory(
        tmp_path / "inventory.toml",
        hosts=hosts,
        jobs={},
        health_probe_s=0.5,
        command_timeout_s=5.0,  # a sound probe answers in it on a loaded host (2 s did not once)
        min_free_disk_gb=8 / 1024,  # 8 MiB: the empty 16 MiB disk has room, a full one not
    )
    inv = load(inventory)
    for name in hosts:  # deployed beforehand: the 5 s command timeout is for the probe
        await deploy(LocalTransport(name), inv.host_root(name), sys.executable)
    ctl = Controller(inv, Policy.AUTO)
    fleet = ctl.fleet
    async with running(ctl, stay=True) as task:
        await until(
            lambda: task.done() or (fleet.hosts["full"].samples and len(fleet.usable()) == 1),
            30,
            "the full host probed",
        )
        assert fleet.usable() == {"full"}, "the three broken probes are unfit"
        why = {n: fleet.failing(n) for n in ("hangs", "babbles", "dies")}
        await until(lambda: task.done() or all(fleet.failing(n) for n in why), 30, "3 failures")
        why = {n: " ".join(f.message for f in fleet.failing(n)) for n in why}
        assert "timed out after 5s" in why["hangs"], why
        assert "printed no Health sample: 'hi'" in why["babbles"], why
        assert "exited with 3: no" in why["dies"], why
        assert not task.done(), "a failed probe is a finding, not a crash"

        filler = fill(small_disk)
        await until(lambda: fleet.failing("full"), 30, "the full disk found")
        assert [f.rule for f in fleet.failing("full")] == ["disk_min"]
        assert "full" not in fleet.usable()
        filler.unlink()
        await until(lambda: "full" in fleet.usable(), 30, "room again")
    journalled = {(e.host, e.data["rule"]) for e in journal(ctl) if e.kind is Kind.HEALTH}
    assert journalled >= {
        ("hangs", "probe"),
        ("babbles", "probe"),
        ("dies", "probe"),
        ("full", "disk_min"),
        ("full", "healthy"),
    }


# --- over ssh: an argv, never a shell string -------------------------------------------------


async def test_the_probe_runs_over_ssh_with_every_argument_quoted(
    ssh_hosts, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    (h,) = ssh_hosts(1)
    nvml = tmp_path / "nvml.json"
    write_state(nvml, {"devices": [{"name": "Fake H100", "temp_c": 52}]})
    root = h.root / "odd $(touch pwned) 'root'"
    inv = load(
        write_inventory(
            tmp_path / "inventory.toml", hosts={"h": h.inventory_table(root=str(root))}, jobs={}
        )
    )
    async with open_transport(inv, "h") as t:
        sample = await probe_health(
            t,
            root=inv.host_root("h"),
            python=inv.python("h"),
            timeout=30,
            env={"HOTSPARE_FAKE_NVML": str(nvml)},
        )
    assert [(g.name, g.temp_c) for g in sample.gpus] == [("Fake H100", 52.0)]
    assert (root / "bundles").is_dir(), "deployed under the root as named, spaces and all"
    assert not list(h.root.rglob("pwned")) and not (Path.home() / "pwned").exists()
