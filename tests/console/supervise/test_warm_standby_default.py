"""The warm standby (on by default for a job on one host; its takeover is
tests/console/test_controller_local.py's ``test_by_default_a_warm_standby_...``): a host lost
while its standby still starts; ``warm_standby = false`` starts nothing on a spare before a
failover. Real local executors of the command kind (a stdlib script: a standby's life is the
console's whatever the kind; a torch standby's takeover is test_controller_local's); the
evidence is the journal and the spare's workdir."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from support.fleetbed import (
    EXECUTOR_ENV,
    local_host,
    quit_mid,
    slow_python,
    stdlib_job,
    until,
    write_inventory,
)
from support.helpers import alive

from console.controller import Controller
from console.fleet.link import ExecutorLink
from console.inventory import load
from console.records.incidents import incidents
from console.records.journal import Event, Kind, read
from console.states import JobState
from console.supervise.launcher import Launcher
from console.supervise.policy import Policy
from console.supervise.probe import Probe
from protocol.faults import StopReason
from protocol.messages import ConsoleMessage, Stop


def controller(inventory: Path, hosts: tuple[str, ...]) -> Controller:
    env = {h: dict(EXECUTOR_ENV) for h in hosts}
    return Controller(load(inventory), Policy.AUTO, executor_env=env)


def slow_spare_fleet(tmp_path: Path) -> Path:
    """j on a with spare b, whose python starts 3 s late: b's standby is still starting for
    a while after the job trains."""
    python, slow = slow_python(tmp_path / "bin", delay_s=3.0)
    slow.touch()
    return write_inventory(
        tmp_path / "inventory.toml",
        hosts={
            "a": local_host(tmp_path / "a"),
            "b": local_host(tmp_path / "b", role="spare", python=str(python)),
        },
        jobs={"j": {"host": "a", "spares": ["b"], **stdlib_job(steps=100_000, warm_standby=None)}},
    )


def trained_in_the_standby(events: list[Event]) -> None:
    """Until the job's first step on b, its one executor there is the standby, and no
    executor was told 'not needed'. A restart on b after that (a lease lapsed on a loaded
    machine, say) starts another, rightly. The journal is printed whole when it fails: a
    fresh-clone run at e43cb70 counted two starts on b and kept nothing to tell why (the next
    one showed the standby's link taken as gone: ``Standby.pump``)."""
    story = "\n".join(f"{e.t:.3f} {e.kind.value} {e.host}: {e.msg}" for e in events)
    trained = next(i for i, e in enumerate(events) if e.data.get("phase") == "first_step")
    started = [
        e.msg for e in events[:trained] if e.kind is Kind.EXECUTOR and "started on b" in e.msg
    ]
    assert len(started) == 1 and "warm standby" in started[0], story
    assert not [e.msg for e in events if "not needed" in e.msg], story


async def test_warm_standby_false_starts_nothing_on_the_spare(tmp_path: Path) -> None:
    inv = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a"), "b": local_host(tmp_path / "b", role="spare")},
        jobs={"j": {"host": "a", "spares": ["b"], "warm_standby": False, **stdlib_job()}},
    )
    ctl = controller(inv, ("a", "b"))
    sup = ctl.jobs["j"]
    await asyncio.wait_for(ctl.run(), 120)
    await ctl.close()
    assert sup.state is JobState.FINISHED and sup.standby is None
    started = [
        e.host
        for e in read(inv.parent / "state" / "journal.jsonl")
        if e.kind is Kind.EXECUTOR and "started" in e.msg
    ]
    assert started == ["a"], started
    assert not (tmp_path / "b" / "jobs" / "j" / "events.jsonl").exists()


async def test_a_host_lost_while_its_standby_still_starts_fails_over_to_that_standby(
    tmp_path: Path,
) -> None:
    """a killed while b's standby (the default) is still starting: the failover waits for
    that standby and starts the job in it; it is never stopped as 'not needed' once it runs
    the job (found by the suite: the readying adopted the standby's process a second time,
    and the next standby round stopped it under the job)."""
    inv = slow_spare_fleet(tmp_path)
    ctl = controller(inv, ("a", "b"))
    sup = ctl.jobs["j"]
    journal = inv.parent / "state" / "journal.jsonl"

    def standby_starting() -> bool:
        return sup.standby is None and any(
            e.host == "b" and "started on b" in e.msg for e in read(journal)
        )

    task = asyncio.create_task(ctl.run())
    await until(lambda: standby_starting() or task.done(), 60, "b's standby starting")
    assert not task.done(), task
    ctl.kill_host("a")
    try:
        await until(
            lambda: (
                (sup.host == "b" and sup.state is JobState.RUNNING and sup.epoch >= 2)
                or task.done()
            ),
            120,
            "the job running on b",
        )
        on_b = sup.step
        await until(lambda: sup.step > on_b + 50 or task.done(), 60, "50 steps on b")
        assert not task.done(), task
        assert sup.host == "b" and sup.state is JobState.RUNNING
    finally:
        ctl.stop_job("j")
        await asyncio.wait_for(task, 60)
        await ctl.close()
    events = list(read(journal))
    trained_in_the_standby(events)
    # the standby was started for no fault: its coming up, though the failover waited for it,
    # is no phase of the incident (CI: it was, whenever it came up once the failover was
    # being prepared, and the incident's breakdown counted a start that was not the fault's)
    (inc,) = incidents(events)
    assert inc.fault_class == "host_lost"
    assert "executor_up" not in inc.times, inc.times


async def test_a_drain_while_the_standby_still_starts_moves_the_job_into_that_standby(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A planned move (a drain) to b while b's standby is still being started (its process
    not yet spawned: a slow connection): the move waits for that standby and starts the job
    in it. It started a second executor on b's workdir instead, one of the two was told 'not
    needed' under the job, and the job failed (the suite: test_a_fail_over_ordered_while_the_
    job_restarts..., at d31866b)."""
    inv = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a"), "b": local_host(tmp_path / "b", role="spare")},
        jobs={"j": {"host": "a", "spares": ["b"], **stdlib_job(steps=100_000, warm_standby=None)}},
    )
    held: list[str] = []
    detached = Launcher._detached

    async def slow_first_on_b(self: Launcher, host: str, bundle: str, *, twin: bool) -> int:
        if host == "b" and not twin and not held:  # the standby's spawn, held up 3 s
            held.append(host)
            await asyncio.sleep(3.0)
        return await detached(self, host, bundle, twin=twin)

    monkeypatch.setattr(Launcher, "_detached", slow_first_on_b)
    ctl = controller(inv, ("a", "b"))
    sup = ctl.jobs["j"]
    journal = inv.parent / "state" / "journal.jsonl"
    task = asyncio.create_task(ctl.run())
    await until(lambda: task.done() or (held and sup.step >= 20), 60, "b's standby held up")
    assert not task.done(), task
    readying = sup._standby._warm_task
    assert readying is not None and not readying.done(), "the standby is still being started"
    ctl.drain_host("a")
    try:
        await until(
            lambda: (
                (sup.host == "b" and sup.state is JobState.RUNNING and sup.step > 0) or task.done()
            ),
            120,
            "the job training on b",
        )
        on_b = sup.step
        await until(lambda: sup.step > on_b + 50 or task.done(), 60, "50 steps on b")
        assert not task.done(), task
    finally:
        ctl.stop_job("j")
        await asyncio.wait_for(task, 60)
        await ctl.close()
    events = list(read(journal))
    trained_in_the_standby(events)


async def test_a_console_closed_while_its_standby_starts_leaves_no_task_behind(
    tmp_path: Path,
) -> None:
    """The console is closed (its run cancelled, then closed) while b's standby still starts:
    the readying is called off with the job's supervision. It ran on and wrote 'warm standby
    ready' into the journal the console had closed ('I/O operation on closed file', a task
    exception nobody retrieved)."""
    inv = slow_spare_fleet(tmp_path)
    ctl = controller(inv, ("a", "b"))
    sup = ctl.jobs["j"]
    journal = inv.parent / "state" / "journal.jsonl"
    task = asyncio.create_task(ctl.run())
    await until(
        lambda: task.done() or any("started on b" in e.msg for e in read(journal)),
        60,
        "b's standby starting",
    )
    # b starts 3 s late: the readying (no other handle on it) is still under way
    await quit_mid(ctl, task, sup._standby._warm_task, journal)


@pytest.mark.parametrize("probe", ["answers", "unanswered"])
async def test_a_standby_that_never_hears_its_stop_is_killed_not_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, probe: str
) -> None:
    """The standby on b is stopped once b is cordoned; its 'not needed' Stop is lost on the
    way (a fresh-clone run: a standby on a spare whose GPU fell off sat there to its idle
    exit). It is ended by the pid holding its lock, and the journal says why. Also when the
    probe that should see it gone is not answered (a loaded fresh-clone run: the probe's
    answer is unknown, and the standby was left)."""
    inv = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a"), "b": local_host(tmp_path / "b", role="spare")},
        jobs={"j": {"host": "a", "spares": ["b"], **stdlib_job(steps=100_000, warm_standby=None)}},
    )
    send = ExecutorLink.send
    lost: list[str] = []

    async def losing(self: ExecutorLink, msg: ConsoleMessage) -> None:
        if isinstance(msg, Stop) and msg.reason is StopReason.NOT_NEEDED and not lost:
            lost.append(self.transport.name)
            return
        await send(self, msg)

    monkeypatch.setattr(ExecutorLink, "send", losing)
    if probe == "unanswered":

        async def unknown(self: Probe, host: str, probe_s: float = 3.0) -> bool | None:
            return None  # the host could not be asked in time: unreachable is not gone

        monkeypatch.setattr(Probe, "wait_gone", unknown)
    ctl = controller(inv, ("a", "b"))
    journal = inv.parent / "state" / "journal.jsonl"
    task = asyncio.create_task(ctl.run())
    try:
        await until(
            lambda: (
                task.done() or any(e.msg == "j: warm standby ready on b" for e in read(journal))
            ),
            90,
            "the standby on b",
        )
        assert not task.done(), task
        pid = int((tmp_path / "b" / "jobs" / "j" / "executor.pid").read_text())
        ctl.cordon("b")
        await until(lambda: not alive(pid), 45, "the standby on b ended")
        assert lost == ["b"], "the Stop was lost: the test tested"
        said = [e.msg for e in read(journal) if e.host == "b" and e.kind is Kind.EXECUTOR]
        seen = "did not stop" if probe == "answers" else "could not be seen to stop"
        assert f"j: the idle executor on b {seen} when told it is not needed; killing it" in said
    finally:
        ctl.stop_job("j")
        await asyncio.wait_for(task, 60)
        await ctl.close()
