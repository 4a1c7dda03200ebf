"""``warm_twin = true``: the console keeps a warm twin beside the job's executor on its host. A
SIGKILLed executor is replaced by the twin's process (a Start, not a process start), bit-exact;
the demo's host kill takes the twin down too; a job that moves or ends leaves no twin behind."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

import pytest
from support.fleetbed import (
    EXECUTOR_ENV,
    baseline_sha,
    job_table,
    local_host,
    quit_mid,
    slow_python,
    stdlib_job,
    until,
    write_inventory,
)

from console.controller import Controller
from console.inventory import load
from console.records.incidents import incidents
from console.records.journal import Kind, read
from console.states import JobState
from console.supervise.policy import Policy


def alive(pid: int) -> bool:
    """A live process (not a zombie), from /proc."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return raw[raw.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


def pid_in(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def warm_twin(workdir: Path) -> int | None:
    """The pid of a twin that is up and warmed up in ``workdir`` (its own files say so)."""
    pid = pid_in(workdir / "twin.pid")
    return pid if pid is not None and pid_in(workdir / "twin.warm") == pid and alive(pid) else None


@pytest.mark.long  # warm_twin is opt-in; the suite proves the twin at the executor (test_serve_twin)
async def test_a_killed_executor_is_replaced_by_its_warm_twin_and_a_host_kill_takes_both(
    tmp_path: Path,
) -> None:
    inv = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a"), "b": local_host(tmp_path / "b", role="spare")},
        jobs={"j": {"host": "a", "spares": ["b"], "warm_twin": True, **job_table(steps=1600)}},
    )
    baseline = await asyncio.to_thread(baseline_sha, inv, "j", tmp_path / "baseline")
    env = {h: dict(EXECUTOR_ENV) for h in ("a", "b")}
    ctl = Controller(load(inv), Policy.AUTO, executor_env=env)
    sup = ctl.jobs["j"]
    work_a, work_b = tmp_path / "a" / "jobs" / "j", tmp_path / "b" / "jobs" / "j"
    task = asyncio.create_task(ctl.run())
    twin = await until(lambda: warm_twin(work_a) or task.done(), 90, "a warm twin on a")
    assert not task.done()
    primary = pid_in(work_a / "executor.pid")
    assert primary is not None and primary != twin and alive(twin)

    os.kill(primary, signal.SIGKILL)
    await until(
        lambda: (sup.epoch >= 2 and sup.state is JobState.RUNNING) or task.done(),
        30,
        "the restart at epoch 2",
    )
    assert not task.done(), task
    # the console counts the epoch as running once its Start is sent; the twin writes the pid
    # file as it takes over, a moment later (a loaded machine saw the dead primary's still)
    await until(
        lambda: pid_in(work_a / "executor.pid") == twin or task.done(), 30, "the twin took over"
    )
    assert sup.host == "a"
    second = await until(
        lambda: (
            (pid_in(work_a / "twin.pid") not in (None, twin) and pid_in(work_a / "twin.pid"))
            or task.done()
        ),
        60,
        "the next twin on a",
    )
    assert not task.done() and alive(second)
    ctl.kill_host("a")
    await until(lambda: not alive(twin) and not alive(second), 10, "a's executor and twin dead")
    await asyncio.wait_for(task, 120)
    assert (sup.state, sup.host, sup.sha256) == (JobState.FINISHED, "b", baseline)
    on_b = pid_in(work_b / "twin.pid")
    # a twin started on b just before the end may still be importing torch when told to stop
    # (CI, loaded: past 15 s); it must go, not sit on b
    await until(lambda: on_b is None or not alive(on_b), 60, "no twin left on b once finished")
    await ctl.close()

    entries = list(read(inv.parent / "state" / "journal.jsonl"))
    started_on_a = [
        e.data["pid"]
        for e in entries
        if e.kind is Kind.EXECUTOR and e.host == "a" and "executor pid" in e.msg
    ]
    assert started_on_a == [primary], "the restart started no new executor process"
    crash, lost = incidents(entries)
    assert crash.fault_class == "executor_crash" and crash.resolved
    assert lost.fault_class == "host_lost" and lost.resolved


def trainers_and_twins(workdir: Path) -> tuple[list[int], list[int]]:
    """Processes of this workdir (from /proc) with a training thread, and twins (``--twin``)."""
    trainers, twins = [], []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
            if str(workdir).encode() not in args:
                continue
            names = {(t / "comm").read_text().strip() for t in (proc / "task").iterdir()}
        except OSError:
            continue
        if "hotspare-train" in names:
            trainers.append(int(proc.name))
        if b"--twin" in args:
            twins.append(int(proc.name))
    return trainers, twins


async def test_a_console_restarted_beside_a_twin_reattaches_to_the_executor_not_the_twin(
    tmp_path: Path,
) -> None:
    """Two of anything at once: a console quits and the next starts while a twin waits beside
    the executor. The new console reattaches to the executor at the same epoch, one process
    trains, at most one twin exists, and a kill still goes to a warm twin."""
    inv = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a"), "b": local_host(tmp_path / "b", role="spare")},
        jobs={"j": {"host": "a", "spares": ["b"], "warm_twin": True, **job_table(steps=100_000)}},
    )
    env = {h: dict(EXECUTOR_ENV) for h in ("a", "b")}
    work_a = tmp_path / "a" / "jobs" / "j"
    first = Controller(load(inv), Policy.AUTO, executor_env=env)
    task = asyncio.create_task(first.run())
    old_twin = await until(lambda: warm_twin(work_a) or task.done(), 90, "a warm twin on a")
    assert not task.done()
    primary = pid_in(work_a / "executor.pid")
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await first.close()

    ctl = Controller(load(inv), Policy.AUTO, executor_env=env)
    sup = ctl.jobs["j"]
    ready: list[int] = []
    ctl.journal.subscribe(
        lambda e: ready.append(e.data["pid"]) if "warm twin ready" in e.msg else None
    )
    task = asyncio.create_task(ctl.run())
    try:
        await until(
            lambda: (sup.state is JobState.RUNNING and sup.link is not None) or task.done(),
            30,
            "the second console running j",
        )
        assert not task.done(), task
        assert sup.epoch == 1 and pid_in(work_a / "executor.pid") == primary, "reattached"
        await until(lambda: ready or task.done(), 60, "the second console's twin ready")
        assert not task.done()
        twin = ready[0]
        assert warm_twin(work_a) == twin
        trainers, twins = trainers_and_twins(work_a)
        assert trainers == [primary], f"one process trains: {trainers}"
        assert twins == [twin] and twin != primary, twins
        assert old_twin == twin or not alive(old_twin), "the old twin was taken or is gone"
        os.kill(primary, signal.SIGKILL)
        await until(
            lambda: (sup.epoch >= 2 and sup.state is JobState.RUNNING) or task.done(),
            30,
            "the restart at epoch 2",
        )
        assert not task.done(), task
        # running counts from the Start sent; the twin's pid file and training thread follow it
        await until(
            lambda: trainers_and_twins(work_a)[0] == [twin] or task.done(), 30, "the twin trains"
        )
        assert pid_in(work_a / "executor.pid") == twin, "the twin's process took over"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await ctl.close()
        for pid in trainers_and_twins(work_a)[1] + [p for p in (primary,) if p]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


async def test_a_console_quit_while_its_twin_starts_leaves_no_task_behind(tmp_path: Path) -> None:
    """The console quits (its run cancelled, then closed) while the twin beside the job's
    executor still starts (its ``serve`` 3 s late): the keeping ends with the supervision. It
    ran on and wrote 'warm twin ready' into the journal the console had closed ('I/O operation
    on closed file', a task exception nobody retrieved: a fresh-clone run), as the standby's
    readying once did. The job is the command kind (a stdlib script): the subject is the
    console's."""
    python, late = slow_python(tmp_path / "bin", 3.0, serve_only=True)
    inv = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a", python=str(python))},
        jobs={"j": {"host": "a", "warm_twin": True, **stdlib_job(steps=100_000)}},
    )
    ctl = Controller(load(inv), Policy.AUTO, executor_env={"a": dict(EXECUTOR_ENV)})
    sup = ctl.jobs["j"]
    journal = inv.parent / "state" / "journal.jsonl"
    task = asyncio.create_task(ctl.run())
    late.touch()  # from the job's own executor on: every serve on a starts late
    await until(
        lambda: task.done() or any("warm twin pid" in e.msg for e in read(journal)),
        90,
        "the twin starting",
    )
    await quit_mid(ctl, task, sup._twin._task, journal)  # the keeping (no other handle on it)
