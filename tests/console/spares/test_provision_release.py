"""A provisioned host being released is out of use first: cordoned and marked before its
release command runs (a real ``sky down`` takes minutes), so no failover lands there, no job
takes it as a spare, and no run restarts there; an operator's cordon still lets a job restart
in place.

Real parts: the release command is a script that copies the console's state.json as it was
when the command began, then waits for a file before it removes the host's folder (the
machine going away); the jobs run real executors on local hosts; the evidence is the
executors' pid files and events under the host roots, state.json on disk and the journal.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
from chaos.observe import executor_events
from support.fleetbed import (
    EXECUTOR_ENV,
    add_provisioner,
    local_host,
    stdlib_job,
    until,
    write_inventory,
)

from console.controller import Controller
from console.fleet.hosts import Fleet
from console.fleet.monitor import HostMonitor
from console.inventory import Inventory, load
from console.records.journal import Journal, Kind, read
from console.records.state_store import StateStore
from console.spares.host_supply import HostSupply
from console.states import HostState, JobState
from console.supervise.policy import Policy
from executors.health.gpu import FAKE_NVML_ENV

ROOT = Path(__file__).resolve().parents[3]
LOCAL = ROOT / "examples" / "provision_local.py"

SLOW_RELEASE = r"""
import os, shutil, sys, time
from pathlib import Path

state_dir, out, root, host = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
seen = out / f".seen-{host}"
seen.write_bytes((state_dir / "state.json").read_bytes())
os.replace(seen, out / f"seen-{host}.json")  # the state persisted when the command began
deadline = time.monotonic() + 120
while not (out / "go").exists():  # a cloud's "down" takes minutes
    if time.monotonic() > deadline:
        sys.exit("release: no go within 120 s")
    time.sleep(0.05)
shutil.rmtree(root / host, ignore_errors=True)  # the machine is gone
"""


def slow_release(tmp: Path, state_dir: Path, hosts_root: Path) -> list[str]:
    script = tmp / "release.py"
    script.write_text(SLOW_RELEASE)
    (tmp / "out").mkdir(exist_ok=True)
    return [sys.executable, str(script), str(state_dir), str(tmp / "out"), str(hosts_root)]


def seen_at_release(tmp: Path, host: str) -> dict | None:
    """state.json as the release command found it when it began; None until it began."""
    try:
        return json.loads((tmp / "out" / f"seen-{host}.json").read_text())
    except FileNotFoundError:
        return None


def idle_provisioned(
    inventory: Path, state_dir: Path, alert: Callable[[str], None]
) -> tuple[Inventory, Journal, StateStore, Fleet, HostSupply]:
    """The console's side of provisioned host ``p``, made by an earlier console and idle since
    (no job uses or keeps it): its inventory, journal, state, fleet and host supply."""
    inv = load(inventory)
    assert inv.provisioner is not None
    journal = Journal(state_dir / "journal.jsonl")
    store = StateStore(state_dir)
    store.host("p").provisioned = True
    store.save()
    fleet = Fleet(inv, journal, store)
    supply = HostSupply(
        inv.provisioner,
        inv=inv,
        fleet=fleet,
        store=store,
        add_host=lambda _n, _t: None,
        reserved=set,
        busy=lambda _h: False,
        journal=journal,
        alert=lambda msg, **_: alert(msg),
    )
    return inv, journal, store, fleet, supply


async def test_a_host_chosen_for_release_is_out_of_use_before_its_command_runs(
    tmp_path: Path,
) -> None:
    hosts = tmp_path / "hosts"
    inventory = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(hosts / "a"), "p": local_host(hosts / "p")},
        jobs={},
    )
    state_dir = tmp_path / "state"
    add_provisioner(
        inventory,
        [sys.executable, "-c", "raise SystemExit('not asked to make one')"],
        slow_release(tmp_path, state_dir, hosts),
        idle_release_s=0.1,
    )
    (hosts / "p").mkdir(parents=True)
    alerts: list[str] = []
    _, journal, store, fleet, supply = idle_provisioned(inventory, state_dir, alerts.append)
    assert fleet.fit("p") and "p" in fleet.usable()
    keep = asyncio.create_task(supply.keep(lambda _h: asyncio.sleep(0)))
    try:
        seen = await until(lambda: seen_at_release(tmp_path, "p"), 30, "the release to begin")
        # while the command runs: out of use in the fleet, and so on disk when it began
        assert seen["hosts"]["p"]["cordoned"] is True, seen["hosts"]
        assert seen["hosts"]["p"].get("releasing") is True, seen["hosts"]
        assert fleet.hosts["p"].state is HostState.CORDONED
        assert not fleet.fit("p") and "p" not in fleet.usable()
        assert (hosts / "p").is_dir() and not store.host("p").released
        (tmp_path / "out" / "go").touch()
        await until(lambda: store.host("p").released, 30, "p released")
    finally:
        keep.cancel()
        await asyncio.gather(keep, return_exceptions=True)
        journal.close()
    assert not (hosts / "p").exists()
    assert set(tomllib.loads(inventory.read_text())["hosts"]) == {"a"}
    events = list(read(state_dir / "journal.jsonl"))
    order = [
        e.data.get("release") or e.data.get("to")
        for e in events
        if e.host == "p" and (e.kind is Kind.HOST_STATE or "release" in e.data)
    ]
    assert order == ["cordoned", "chosen", "done"], order
    assert not alerts


def executors_ran(root: Path, job: str) -> bool:
    """Did any executor of ``job`` run on the host rooted at ``root`` (its pid file, events)?"""
    workdir = root / "jobs" / job
    return (workdir / "executor.pid").exists() or bool(executor_events(workdir))


@pytest.mark.long  # the suite proves a host chosen for release is out of use (in this file)
async def test_a_failover_never_lands_on_a_host_being_released(tmp_path: Path) -> None:
    """j trains on a with spare b; p, provisioned and idle, is chosen for release and its
    release command hangs (a slow ``sky down``). a and b die: the failover finds p in the
    fleet but must not take it; a host is provisioned for j instead, and j trains there."""
    hosts = tmp_path / "hosts"
    made = tmp_path / "p"  # short: an executor socket under it fits in 107 bytes
    inventory = write_inventory(
        tmp_path / "inventory.toml",
        hosts={
            "a": local_host(hosts / "a"),
            "b": local_host(hosts / "b", role="spare"),
            "p": local_host(hosts / "p"),
        },
        jobs={"j": {"host": "a", "spares": ["b"], **stdlib_job(steps=100_000)}},
    )
    state_dir = tmp_path / "state"
    add_provisioner(
        inventory,
        [sys.executable, str(LOCAL), "--root", str(made), "--region", "r1"],
        slow_release(tmp_path, state_dir, hosts),
        retry_s=0.5,
        idle_release_s=0.5,
    )
    store = StateStore(state_dir)
    store.host("p").provisioned = True  # made by an earlier console, idle since
    store.save()
    env = {h: dict(EXECUTOR_ENV) for h in ("a", "b", "p", "prov-1", "prov-2")}
    ctl = Controller(load(inventory), Policy.AUTO, executor_env=env)
    sup = ctl.jobs["j"]
    task = asyncio.create_task(ctl.run(stay=True))
    try:
        await until(lambda: sup.step >= 20 or task.done(), 90, "j training on a")
        await until(
            lambda: seen_at_release(tmp_path, "p") or task.done(), 30, "p's release to begin"
        )
        assert not task.done(), task
        assert sup.host == "a" and sup.spares == ["b"]
        ctl.kill_host("b")
        ctl.kill_host("a")
        await until(
            lambda: (
                (
                    sup.host not in (None, "a")
                    and sup.state is JobState.RUNNING
                    and sup.step >= 20
                    and sup.epoch >= 2
                )
                or task.done()
            ),
            120,
            "j failed over and training again",
        )
        assert not task.done(), task
        moved_to = sup.host
        assert seen_at_release(tmp_path, "p") is not None
        assert not (tmp_path / "out" / "go").exists(), "p's release still running throughout"
        (tmp_path / "out" / "go").touch()
        await until(lambda: ctl.store.host("p").released or task.done(), 30, "p released")
    finally:
        ctl.stop_job("j")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await ctl.close()
    assert moved_to == "prov-1", moved_to
    assert not executors_ran(hosts / "p", "j"), "an executor of j ran on the host being released"
    assert executors_ran(made / "prov-1", "j")
    assert not (hosts / "p").exists(), "released: the machine is gone"
    journal = list(read(state_dir / "journal.jsonl"))
    on_p = [e for e in journal if e.kind is Kind.PLACEMENT and e.host == "p"]
    assert not on_p, [e.msg for e in on_p]
    assert "p" not in tomllib.loads(inventory.read_text())["hosts"]


def trained(root: Path, epoch: int) -> bool:
    """Did an executor of j on the host rooted at ``root`` report a step at ``epoch``?"""
    return any(
        e.get("kind") == "progress" and e.get("epoch") == epoch
        for e in executor_events(root / "jobs" / "j")
    )


async def test_a_crash_on_a_host_being_released_fails_over_an_operator_s_cordon_restarts(
    tmp_path: Path,
) -> None:
    """A run crashes on its host twice: first with the host cordoned by an operator (a
    restart in place: the same executor, the next epoch), then with the host chosen for
    release (a failover to the spare: no restart there)."""
    hosts = tmp_path / "hosts"
    inventory = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(hosts / "a"), "b": local_host(hosts / "b", role="spare")},
        jobs={"j": {"host": "a", "spares": ["b"], **stdlib_job(steps=100_000)}},
    )
    env = {h: dict(EXECUTOR_ENV) for h in ("a", "b")}
    ctl = Controller(load(inventory), Policy.AUTO, executor_env=env)
    sup = ctl.jobs["j"]
    a_pid = hosts / "a" / "jobs" / "j" / "executor.pid"
    task = asyncio.create_task(ctl.run(stay=True))
    try:
        await until(lambda: sup.step >= 20 or task.done(), 90, "j training on a")
        ctl.cordon("a")
        os.kill(int(a_pid.read_text()), signal.SIGKILL)
        await until(lambda: trained(hosts / "a", 2) or task.done(), 60, "j on a at epoch 2")
        assert sup.host == "a", "an operator's cordon keeps a running job's host"
        ctl.fleet.releasing("a")  # as if a release had chosen it under the job
        os.kill(int(a_pid.read_text()), signal.SIGKILL)
        await until(
            lambda: trained(hosts / "a", 3) or trained(hosts / "b", 3) or task.done(),
            60,
            "j trained at epoch 3",
        )
        assert not task.done(), task
    finally:
        ctl.stop_job("j")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await ctl.close()
    assert sup.host == "b", "not restarted on a host being released"
    assert not trained(hosts / "a", 3) and trained(hosts / "b", 3)
    journal = list(read(tmp_path / "state" / "journal.jsonl"))
    assert any(
        e.kind is Kind.ACTION and "not restarted on a: it is being released" in e.msg
        for e in journal
    )


FIFO_RELEASE = r"""
import errno, os, shutil, stat, sys
from pathlib import Path

fifo, out, root, host = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
probing = stat.S_ISFIFO(os.stat(fifo).st_mode)  # a plain file once the test let it go
try:  # a writer opens a FIFO without blocking only while a reader (the probe) waits on it
    if probing:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
except OSError as e:
    if e.errno != errno.ENXIO:
        raise
    probing = False
(out / f"probing-{host}").write_text(str(probing))
shutil.rmtree(root / host, ignore_errors=True)  # the machine is gone
"""


async def test_a_host_is_released_only_once_its_health_probe_in_flight_has_ended(
    tmp_path: Path,
) -> None:
    """A health probe of a provisioned host was still running when its release command ran,
    and the probe's deploy wrote the bundle folder back under the root just given back
    (``p/prov-2/bundles`` left by a long run). The probe here is held by its fake GPU, a FIFO
    nothing writes to yet; the release command records whether it still had a reader."""
    hosts, out = tmp_path / "hosts", tmp_path / "out"
    out.mkdir()
    fifo = tmp_path / "gpu.fifo"
    os.mkfifo(fifo)
    script = tmp_path / "release.py"
    script.write_text(FIFO_RELEASE)
    inventory = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(hosts / "a"), "p": local_host(hosts / "p")},
        jobs={},
    )
    add_provisioner(
        inventory,
        [sys.executable, "-c", "raise SystemExit('not asked to make one')"],
        [sys.executable, str(script), str(fifo), str(out), str(hosts)],
        idle_release_s=0.1,
    )
    (hosts / "p").mkdir(parents=True)
    inv, journal, store, fleet, supply = idle_provisioned(
        inventory, tmp_path / "state", lambda _msg: None
    )
    monitor = HostMonitor(
        fleet,
        inv,
        journal,
        alert=lambda *_a, **_k: None,
        spares=dict,
        executor_env={"p": {**EXECUTOR_ENV, FAKE_NVML_ENV: str(fifo)}},
    )
    quieted: list[str] = []

    async def quiet(host: str) -> None:
        quieted.append(host)
        await monitor.settle(host)

    def reader_waits() -> int | None:
        with contextlib.suppress(OSError):
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        return None

    watching = asyncio.create_task(monitor.run())
    keep: asyncio.Task[None] | None = None
    held: int | None = None
    try:
        # the probe has deployed and its fake GPU read waits; this writer keeps it waiting
        held = await until(reader_waits, 60, "p's health probe reading its fake GPU")
        keep = asyncio.create_task(supply.keep(quiet, every_s=0.05))
        await until(lambda: quieted or (out / "probing-p").exists(), 30, "p chosen for release")
        assert not (out / "probing-p").exists(), "released while its health probe ran"
        assert fleet.hosts["p"].releasing and fleet.hosts["p"].state is HostState.CORDONED
        state = json.dumps({"devices": [{"name": "Fake H100"}]}).encode()
        # a plain file in the FIFO's place first: the fake re-reads its file on each call
        (tmp_path / "gpu.json").write_bytes(state)
        os.replace(tmp_path / "gpu.json", fifo)
        os.write(held, state)
        os.close(held)
        held = None
        await until(
            lambda: store.host("p").released,
            30,
            "p released"
            + str([e.msg for e in read(tmp_path / "state" / "journal.jsonl")])
            + str(quieted)
            + str(list((out).iterdir())),
        )
    finally:
        if held is not None:
            os.close(held)
        for task in (keep, watching):
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in (keep, watching) if t), return_exceptions=True)
        journal.close()
    assert (out / "probing-p").read_text() == "False", "its probe still read when released"
    assert not (hosts / "p").exists(), "nothing written back under the root given back"
